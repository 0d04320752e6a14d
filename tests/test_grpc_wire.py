"""Spider's gRPC protocol on the wire (``docs/spider.md``, gRPC surface and Wire formats).

Every request and response type is pinned to bytes computed by hand from protobuf's encoding (tag
= field number << 3 | wire type; varints little-endian in 7-bit groups; length-delimited fields as
tag, varint length, bytes), and the service, method, message and enum names to the reference. The
committed stubs must be exactly what the generator produces from the ``.proto`` files now.
"""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf import descriptor as _descriptor
from google.protobuf import descriptor_pb2

from coordinator.spider.grpc import generate
from coordinator.spider.grpc.generated.common import common_pb2
from coordinator.spider.grpc.generated.storage import storage_pb2, storage_pb2_grpc
from coordinator.spider.port import JobState

U64_ABOVE_2_63 = 2**63 + 1
"""Varint: groups 1, 0 × 8, 1 → ``81 80 80 80 80 80 80 80 80 01``."""
U64_MAX = 2**64 - 1
OUTPUTS_EXAMPLE = bytes.fromhex(
    "00" "01000000" "13000000" "92a764656661756c749195a36162630a142864"
)  # fmt: skip
"""``docs/spider.md``'s one-output example: option byte 0, a frame of one 19-byte payload."""

VECTORS: list[tuple[str, Any, str]] = [
    (
        "RegisterJobRequest",
        storage_pb2.RegisterJobRequest(
            resource_group_id=5,
            compressed_serialized_task_graph=b"g",
            compressed_serialized_inputs=b"in",
        ),
        "08 05  12 01 67  1a 02 69 6e",
    ),
    (
        "RegisterJobRequest, uint64 resource group above 2**63",
        storage_pb2.RegisterJobRequest(resource_group_id=U64_ABOVE_2_63),
        "08 81 80 80 80 80 80 80 80 80 01",
    ),
    ("RegisterJobRequest, defaults", storage_pb2.RegisterJobRequest(), ""),
    (
        "RegisterJobResponse, job id above 2**63",
        storage_pb2.RegisterJobResponse(job_id=U64_ABOVE_2_63),
        "08 81 80 80 80 80 80 80 80 80 01",
    ),
    (
        "RegisterJobResponse, the largest job id",
        storage_pb2.RegisterJobResponse(job_id=U64_MAX),
        "08 ff ff ff ff ff ff ff ff ff 01",
    ),
    ("JobIdRequest, 300", storage_pb2.JobIdRequest(job_id=300), "08 ac 02"),
    (
        "JobIdRequest, job id above 2**63",
        storage_pb2.JobIdRequest(job_id=U64_ABOVE_2_63),
        "08 81 80 80 80 80 80 80 80 80 01",
    ),
    ("JobStateResponse, READY", storage_pb2.JobStateResponse(state=storage_pb2.READY), "08 01"),
    (
        "JobStateResponse, COMMIT_READY",
        storage_pb2.JobStateResponse(state=storage_pb2.COMMIT_READY),
        "08 03",
    ),
    (
        "JobStateResponse, CANCELLED",
        storage_pb2.JobStateResponse(state=storage_pb2.CANCELLED),
        "08 07",
    ),
    (
        "JobStateResponse, JOB_STATE_UNSPECIFIED (the default, not written)",
        storage_pb2.JobStateResponse(state=storage_pb2.JOB_STATE_UNSPECIFIED),
        "",
    ),
    (
        "JobOutputsResponse, the one-output example",
        storage_pb2.JobOutputsResponse(serialized_outputs=OUTPUTS_EXAMPLE),
        "0a 1c  00 01000000 13000000 92a764656661756c749195a36162630a142864",
    ),
    (
        "JobErrorResponse",
        storage_pb2.JobErrorResponse(error_message="in-task failure: é"),
        "0a 13" + b"in-task failure: ".hex() + "c3 a9",
    ),
    (
        "AddResourceGroupRequest",
        storage_pb2.AddResourceGroupRequest(external_resource_group_id="clp", password=b"\x00pw"),
        "0a 03 63 6c 70  12 03 00 70 77",
    ),
    (
        "ResourceGroupIdResponse",
        storage_pb2.ResourceGroupIdResponse(resource_group_id=128),
        "08 80 01",
    ),
    (
        "VerifyResourceGroupRequest",
        storage_pb2.VerifyResourceGroupRequest(resource_group_id=7, password=b"clp"),
        "08 07  12 03 63 6c 70",
    ),
    ("Void", common_pb2.Void(), ""),
    ("TaskId, index 0 (a oneof member is written even at 0)", common_pb2.TaskId(index=0), "08 00"),
    ("TaskId, commit", common_pb2.TaskId(commit=common_pb2.Void()), "12 00"),
    ("TaskId, cleanup", common_pb2.TaskId(cleanup=common_pb2.Void()), "1a 00"),
]


@pytest.mark.parametrize(
    ("message", "expected"), [(m, e) for _, m, e in VECTORS], ids=[n for n, _, _ in VECTORS]
)
def test_messages_serialize_to_spiders_bytes(message: Any, expected: str) -> None:
    wire = bytes.fromhex(expected.replace(" ", ""))
    assert message.SerializeToString(deterministic=True) == wire
    assert type(message).FromString(wire) == message


def test_a_job_id_above_2_63_survives_the_round_trip() -> None:
    response = storage_pb2.RegisterJobResponse.FromString(
        bytes.fromhex("08 81 80 80 80 80 80 80 80 80 01".replace(" ", ""))
    )
    assert response.job_id == U64_ABOVE_2_63


def test_an_unknown_job_state_number_is_kept() -> None:
    response = storage_pb2.JobStateResponse.FromString(bytes.fromhex("082a"))
    assert int(response.state) == 42  # proto3 enums are open; the client decides what 42 means


SERVICES = {
    "storage.JobOrchestrationService": {
        "RegisterJob": ("storage.RegisterJobRequest", "storage.RegisterJobResponse"),
        "StartJob": ("storage.JobIdRequest", "storage.JobStateResponse"),
        "CancelJob": ("storage.JobIdRequest", "storage.JobStateResponse"),
        "GetJobState": ("storage.JobIdRequest", "storage.JobStateResponse"),
        "GetJobOutputs": ("storage.JobIdRequest", "storage.JobOutputsResponse"),
        "GetJobError": ("storage.JobIdRequest", "storage.JobErrorResponse"),
    },
    "storage.ResourceGroupManagementService": {
        "AddResourceGroup": ("storage.AddResourceGroupRequest", "storage.ResourceGroupIdResponse"),
        "VerifyResourceGroup": ("storage.VerifyResourceGroupRequest", "common.Void"),
    },
}

_F = _descriptor.FieldDescriptor
MESSAGES: dict[str, list[tuple[str, int, int, str | None]]] = {
    # full name: [(field, number, type, message or enum type)]
    "storage.RegisterJobRequest": [
        ("resource_group_id", 1, _F.TYPE_UINT64, None),
        ("compressed_serialized_task_graph", 2, _F.TYPE_BYTES, None),
        ("compressed_serialized_inputs", 3, _F.TYPE_BYTES, None),
    ],
    "storage.RegisterJobResponse": [("job_id", 1, _F.TYPE_UINT64, None)],
    "storage.JobIdRequest": [("job_id", 1, _F.TYPE_UINT64, None)],
    "storage.JobStateResponse": [("state", 1, _F.TYPE_ENUM, "storage.JobState")],
    "storage.JobOutputsResponse": [("serialized_outputs", 1, _F.TYPE_BYTES, None)],
    "storage.JobErrorResponse": [("error_message", 1, _F.TYPE_STRING, None)],
    "storage.AddResourceGroupRequest": [
        ("external_resource_group_id", 1, _F.TYPE_STRING, None),
        ("password", 2, _F.TYPE_BYTES, None),
    ],
    "storage.ResourceGroupIdResponse": [("resource_group_id", 1, _F.TYPE_UINT64, None)],
    "storage.VerifyResourceGroupRequest": [
        ("resource_group_id", 1, _F.TYPE_UINT64, None),
        ("password", 2, _F.TYPE_BYTES, None),
    ],
    "common.Void": [],
    "common.TaskId": [
        ("index", 1, _F.TYPE_UINT64, None),
        ("commit", 2, _F.TYPE_MESSAGE, "common.Void"),
        ("cleanup", 3, _F.TYPE_MESSAGE, "common.Void"),
    ],
}
JOB_STATES = [
    ("JOB_STATE_UNSPECIFIED", 0),
    ("READY", 1),
    ("RUNNING", 2),
    ("COMMIT_READY", 3),
    ("CLEANUP_READY", 4),
    ("SUCCEEDED", 5),
    ("FAILED", 6),
    ("CANCELLED", 7),
]


def test_the_files_are_spiders() -> None:
    storage, common = storage_pb2.DESCRIPTOR, common_pb2.DESCRIPTOR
    assert (storage.name, storage.package) == ("storage/storage.proto", "storage")
    assert (common.name, common.package) == ("common/common.proto", "common")
    for file in (storage, common):
        assert descriptor_pb2.FileDescriptorProto.FromString(file.serialized_pb).syntax == "proto3"
    assert [dependency.name for dependency in storage.dependencies] == ["common/common.proto"]


SPIDER_SERVICES = [
    "JobOrchestrationService",
    "TaskInstanceManagementService",
    "InboundQueueService",
    "ResourceGroupManagementService",
    "ExecutionManagerLivenessService",
    "SchedulerRegistrationService",
    "SessionManagementService",
]
"""Every service of Spider's ``storage.proto``, in its order: the file is Spider's whole file
(test_grpc_upstream.py compares it with Spider's), the internal services included."""


def test_services_and_methods_match_the_reference() -> None:
    services = {
        service.full_name: {
            method.name: (method.input_type.full_name, method.output_type.full_name)
            for method in service.methods
        }
        for service in storage_pb2.DESCRIPTOR.services_by_name.values()
    }
    assert {name: services[name] for name in SERVICES} == SERVICES
    assert [service.name for service in storage_pb2.DESCRIPTOR.services_by_name.values()] == (
        SPIDER_SERVICES
    )
    assert not common_pb2.DESCRIPTOR.services_by_name
    for service in storage_pb2.DESCRIPTOR.services_by_name.values():
        for method in service.methods:
            assert not method.client_streaming
            assert not method.server_streaming


def test_messages_match_the_reference() -> None:
    files = (storage_pb2.DESCRIPTOR, common_pb2.DESCRIPTOR)
    found = {
        message.full_name: [
            (
                field.name,
                field.number,
                field.type,
                (field.message_type or field.enum_type).full_name
                if field.message_type or field.enum_type
                else None,
            )
            for field in message.fields
        ]
        for file in files
        for message in file.message_types_by_name.values()
    }
    assert {name: found[name] for name in MESSAGES} == MESSAGES
    for file in files:  # the messages the coordinator sends or receives have no repeated field
        for message in file.message_types_by_name.values():
            if message.full_name in MESSAGES:
                assert all(not field.is_repeated for field in message.fields), message.full_name
    task_id = common_pb2.TaskId.DESCRIPTOR
    assert [o.name for o in task_id.oneofs] == ["kind"]
    assert [f.name for f in task_id.oneofs_by_name["kind"].fields] == ["index", "commit", "cleanup"]


def test_the_job_state_enum_matches_the_reference_and_the_port() -> None:
    enum = storage_pb2.DESCRIPTOR.enum_types_by_name["JobState"]
    assert enum.full_name == "storage.JobState"
    assert [(value.name, value.number) for value in enum.values] == JOB_STATES
    for name, number in JOB_STATES[1:]:
        assert JobState[name] == number
    assert JobState.UNSPECIFIED == 0


class _RecordingChannel:
    def __init__(self) -> None:
        self.paths: list[str] = []

    def unary_unary(self, path: str, **_: Any) -> None:
        self.paths.append(path)


def test_the_stubs_call_spiders_method_paths() -> None:
    channel = _RecordingChannel()
    storage_pb2_grpc.JobOrchestrationServiceStub(channel)
    storage_pb2_grpc.ResourceGroupManagementServiceStub(channel)
    assert channel.paths == [
        "/storage.JobOrchestrationService/RegisterJob",
        "/storage.JobOrchestrationService/StartJob",
        "/storage.JobOrchestrationService/CancelJob",
        "/storage.JobOrchestrationService/GetJobState",
        "/storage.JobOrchestrationService/GetJobOutputs",
        "/storage.JobOrchestrationService/GetJobError",
        "/storage.ResourceGroupManagementService/AddResourceGroup",
        "/storage.ResourceGroupManagementService/VerifyResourceGroup",
    ]


def test_the_committed_stubs_are_what_the_generator_produces() -> None:
    assert generate.stale_files() == [], "run: python -m coordinator.spider.grpc.generate"


def test_the_generated_stubs_use_package_imports_only() -> None:
    for name, text in generate.tree(generate.GENERATED).items():
        if name.endswith((".py", ".pyi")):
            for line in text.decode().splitlines():
                assert not line.startswith(("from common ", "from storage ", "import common")), (
                    name,
                    line,
                )
    assert {
        name for name in generate.tree(generate.GENERATED) if not name.endswith("__init__.py")
    } == {
        "common/common_pb2.py",
        "common/common_pb2.pyi",
        "common/common_pb2_grpc.py",
        "storage/storage_pb2.py",
        "storage/storage_pb2.pyi",
        "storage/storage_pb2_grpc.py",
    }


def test_the_generator_detects_drift(tmp_path: Any) -> None:
    stale = tmp_path / "generated"
    generate.regenerate(stale)
    assert generate.stale_files(stale) == []
    pb2 = stale / "storage" / "storage_pb2.py"
    pb2.write_bytes(pb2.read_bytes() + b"# edited\n")
    (stale / "extra.py").write_text("")
    assert generate.stale_files(stale) == ["extra.py", "storage/storage_pb2.py"]
    assert generate.main(["--check", "--output", str(stale)]) == 1
    assert generate.main(["--output", str(stale)]) == 0
    assert generate.main(["--check", "--output", str(stale)]) == 0
