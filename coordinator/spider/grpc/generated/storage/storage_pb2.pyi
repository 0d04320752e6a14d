from coordinator.spider.grpc.generated.common import common_pb2 as _common_pb2
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
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
