from coordinator.spider.grpc.generated.common import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class JobState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JOB_STATE_UNSPECIFIED: _ClassVar[JobState]
    READY: _ClassVar[JobState]
    RUNNING: _ClassVar[JobState]
    COMMIT_READY: _ClassVar[JobState]
    CLEANUP_READY: _ClassVar[JobState]
    SUCCEEDED: _ClassVar[JobState]
    FAILED: _ClassVar[JobState]
    CANCELLED: _ClassVar[JobState]
JOB_STATE_UNSPECIFIED: JobState
READY: JobState
RUNNING: JobState
COMMIT_READY: JobState
CLEANUP_READY: JobState
SUCCEEDED: JobState
FAILED: JobState
CANCELLED: JobState

class RegisterJobRequest(_message.Message):
    __slots__ = ("resource_group_id", "compressed_serialized_task_graph", "compressed_serialized_inputs")
    RESOURCE_GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    COMPRESSED_SERIALIZED_TASK_GRAPH_FIELD_NUMBER: _ClassVar[int]
    COMPRESSED_SERIALIZED_INPUTS_FIELD_NUMBER: _ClassVar[int]
    resource_group_id: int
    compressed_serialized_task_graph: bytes
    compressed_serialized_inputs: bytes
    def __init__(self, resource_group_id: _Optional[int] = ..., compressed_serialized_task_graph: _Optional[bytes] = ..., compressed_serialized_inputs: _Optional[bytes] = ...) -> None: ...

class RegisterJobResponse(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: int
    def __init__(self, job_id: _Optional[int] = ...) -> None: ...

class JobIdRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: int
    def __init__(self, job_id: _Optional[int] = ...) -> None: ...

class JobStateResponse(_message.Message):
    __slots__ = ("state",)
    STATE_FIELD_NUMBER: _ClassVar[int]
    state: JobState
    def __init__(self, state: _Optional[_Union[JobState, str]] = ...) -> None: ...

class JobOutputsResponse(_message.Message):
    __slots__ = ("serialized_outputs",)
    SERIALIZED_OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    serialized_outputs: bytes
    def __init__(self, serialized_outputs: _Optional[bytes] = ...) -> None: ...

class JobErrorResponse(_message.Message):
    __slots__ = ("error_message",)
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    error_message: str
    def __init__(self, error_message: _Optional[str] = ...) -> None: ...

class PollReadyTasksRequest(_message.Message):
    __slots__ = ("max_items", "wait_ms")
    MAX_ITEMS_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    max_items: int
    wait_ms: int
    def __init__(self, max_items: _Optional[int] = ..., wait_ms: _Optional[int] = ...) -> None: ...

class PollReadyTasksResponse(_message.Message):
    __slots__ = ("tasks",)
    TASKS_FIELD_NUMBER: _ClassVar[int]
    tasks: ReadyTasks
    def __init__(self, tasks: _Optional[_Union[ReadyTasks, _Mapping]] = ...) -> None: ...

class ReadyTasks(_message.Message):
    __slots__ = ("session_id", "tasks")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    tasks: _containers.RepeatedCompositeFieldContainer[ReadyTask]
    def __init__(self, session_id: _Optional[int] = ..., tasks: _Optional[_Iterable[_Union[ReadyTask, _Mapping]]] = ...) -> None: ...

class ReadyTask(_message.Message):
    __slots__ = ("resource_group_id", "job_id", "task_id")
    RESOURCE_GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    resource_group_id: int
    job_id: int
    task_id: _common_pb2.TaskId
    def __init__(self, resource_group_id: _Optional[int] = ..., job_id: _Optional[int] = ..., task_id: _Optional[_Union[_common_pb2.TaskId, _Mapping]] = ...) -> None: ...

class RegisterTaskInstanceRequest(_message.Message):
    __slots__ = ("job_id", "task_id", "execution_manager_id", "session_id")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    EXECUTION_MANAGER_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: int
    task_id: _common_pb2.TaskId
    execution_manager_id: int
    session_id: int
    def __init__(self, job_id: _Optional[int] = ..., task_id: _Optional[_Union[_common_pb2.TaskId, _Mapping]] = ..., execution_manager_id: _Optional[int] = ..., session_id: _Optional[int] = ...) -> None: ...

class RegisterTaskInstanceResponse(_message.Message):
    __slots__ = ("execution_context",)
    EXECUTION_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    execution_context: ExecutionContext
    def __init__(self, execution_context: _Optional[_Union[ExecutionContext, _Mapping]] = ...) -> None: ...

class ExecutionContext(_message.Message):
    __slots__ = ("task_instance_id", "tdl_context", "timeout_policy", "serialized_task_io")
    TASK_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    TDL_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_POLICY_FIELD_NUMBER: _ClassVar[int]
    SERIALIZED_TASK_IO_FIELD_NUMBER: _ClassVar[int]
    task_instance_id: int
    tdl_context: TdlContext
    timeout_policy: TimeoutPolicy
    serialized_task_io: bytes
    def __init__(self, task_instance_id: _Optional[int] = ..., tdl_context: _Optional[_Union[TdlContext, _Mapping]] = ..., timeout_policy: _Optional[_Union[TimeoutPolicy, _Mapping]] = ..., serialized_task_io: _Optional[bytes] = ...) -> None: ...

class TdlContext(_message.Message):
    __slots__ = ("package", "task_func")
    PACKAGE_FIELD_NUMBER: _ClassVar[int]
    TASK_FUNC_FIELD_NUMBER: _ClassVar[int]
    package: str
    task_func: str
    def __init__(self, package: _Optional[str] = ..., task_func: _Optional[str] = ...) -> None: ...

class TimeoutPolicy(_message.Message):
    __slots__ = ("soft_timeout_ms", "hard_timeout_ms")
    SOFT_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    HARD_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    soft_timeout_ms: int
    hard_timeout_ms: int
    def __init__(self, soft_timeout_ms: _Optional[int] = ..., hard_timeout_ms: _Optional[int] = ...) -> None: ...

class ReportTaskSuccessRequest(_message.Message):
    __slots__ = ("job_id", "task_id", "task_instance_id", "execution_manager_id", "session_id", "serialized_outputs")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    EXECUTION_MANAGER_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SERIALIZED_OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    job_id: int
    task_id: _common_pb2.TaskId
    task_instance_id: int
    execution_manager_id: int
    session_id: int
    serialized_outputs: bytes
    def __init__(self, job_id: _Optional[int] = ..., task_id: _Optional[_Union[_common_pb2.TaskId, _Mapping]] = ..., task_instance_id: _Optional[int] = ..., execution_manager_id: _Optional[int] = ..., session_id: _Optional[int] = ..., serialized_outputs: _Optional[bytes] = ...) -> None: ...

class ReportTaskFailureRequest(_message.Message):
    __slots__ = ("job_id", "task_id", "task_instance_id", "execution_manager_id", "session_id", "error_message")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    EXECUTION_MANAGER_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    job_id: int
    task_id: _common_pb2.TaskId
    task_instance_id: int
    execution_manager_id: int
    session_id: int
    error_message: str
    def __init__(self, job_id: _Optional[int] = ..., task_id: _Optional[_Union[_common_pb2.TaskId, _Mapping]] = ..., task_instance_id: _Optional[int] = ..., execution_manager_id: _Optional[int] = ..., session_id: _Optional[int] = ..., error_message: _Optional[str] = ...) -> None: ...

class AddResourceGroupRequest(_message.Message):
    __slots__ = ("external_resource_group_id", "password")
    EXTERNAL_RESOURCE_GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    PASSWORD_FIELD_NUMBER: _ClassVar[int]
    external_resource_group_id: str
    password: bytes
    def __init__(self, external_resource_group_id: _Optional[str] = ..., password: _Optional[bytes] = ...) -> None: ...

class ResourceGroupIdResponse(_message.Message):
    __slots__ = ("resource_group_id",)
    RESOURCE_GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    resource_group_id: int
    def __init__(self, resource_group_id: _Optional[int] = ...) -> None: ...

class VerifyResourceGroupRequest(_message.Message):
    __slots__ = ("resource_group_id", "password")
    RESOURCE_GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    PASSWORD_FIELD_NUMBER: _ClassVar[int]
    resource_group_id: int
    password: bytes
    def __init__(self, resource_group_id: _Optional[int] = ..., password: _Optional[bytes] = ...) -> None: ...

class RegisterExecutionManagerRequest(_message.Message):
    __slots__ = ("ip_address",)
    IP_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    ip_address: str
    def __init__(self, ip_address: _Optional[str] = ...) -> None: ...

class ExecutionManagerIdRequest(_message.Message):
    __slots__ = ("execution_manager_id",)
    EXECUTION_MANAGER_ID_FIELD_NUMBER: _ClassVar[int]
    execution_manager_id: int
    def __init__(self, execution_manager_id: _Optional[int] = ...) -> None: ...

class ExecutionManagerRegistration(_message.Message):
    __slots__ = ("execution_manager_id", "session_id")
    EXECUTION_MANAGER_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    execution_manager_id: int
    session_id: int
    def __init__(self, execution_manager_id: _Optional[int] = ..., session_id: _Optional[int] = ...) -> None: ...

class RegisterExecutionManagerResponse(_message.Message):
    __slots__ = ("registration",)
    REGISTRATION_FIELD_NUMBER: _ClassVar[int]
    registration: ExecutionManagerRegistration
    def __init__(self, registration: _Optional[_Union[ExecutionManagerRegistration, _Mapping]] = ...) -> None: ...

class UpdateExecutionManagerHeartbeatResponse(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    def __init__(self, session_id: _Optional[int] = ...) -> None: ...

class RegisterSchedulerRequest(_message.Message):
    __slots__ = ("host", "port")
    HOST_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    host: str
    port: int
    def __init__(self, host: _Optional[str] = ..., port: _Optional[int] = ...) -> None: ...

class SchedulerRegistration(_message.Message):
    __slots__ = ("scheduler_id", "session_id")
    SCHEDULER_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    scheduler_id: int
    session_id: int
    def __init__(self, scheduler_id: _Optional[int] = ..., session_id: _Optional[int] = ...) -> None: ...

class RegisterSchedulerResponse(_message.Message):
    __slots__ = ("registration",)
    REGISTRATION_FIELD_NUMBER: _ClassVar[int]
    registration: SchedulerRegistration
    def __init__(self, registration: _Optional[_Union[SchedulerRegistration, _Mapping]] = ...) -> None: ...

class Scheduler(_message.Message):
    __slots__ = ("scheduler_id", "host", "port")
    SCHEDULER_ID_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    scheduler_id: int
    host: str
    port: int
    def __init__(self, scheduler_id: _Optional[int] = ..., host: _Optional[str] = ..., port: _Optional[int] = ...) -> None: ...

class SchedulerRegistrations(_message.Message):
    __slots__ = ("schedulers",)
    SCHEDULERS_FIELD_NUMBER: _ClassVar[int]
    schedulers: _containers.RepeatedCompositeFieldContainer[Scheduler]
    def __init__(self, schedulers: _Optional[_Iterable[_Union[Scheduler, _Mapping]]] = ...) -> None: ...

class GetSchedulersResponse(_message.Message):
    __slots__ = ("schedulers",)
    SCHEDULERS_FIELD_NUMBER: _ClassVar[int]
    schedulers: SchedulerRegistrations
    def __init__(self, schedulers: _Optional[_Union[SchedulerRegistrations, _Mapping]] = ...) -> None: ...

class GetSessionResponse(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    def __init__(self, session_id: _Optional[int] = ...) -> None: ...
