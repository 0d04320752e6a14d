"""The coordinator's protocol definition is Spider's, descriptor for descriptor (issue 11).

Spider's own ``.proto`` files (``shared/reference/spider-upstream/components/spider-proto``, beside
the checkout) are compiled at test time with ``grpc_tools.protoc``, exactly as Spider's Python
stubs are generated (``-I components/spider-proto``; ``docs/spider.md``, gRPC surface).
The ``FileDescriptorProto`` each generated ``_pb2`` module registers is compared, file by file,
message by message and service by service, with the coordinator's; then both sets of stubs are
loaded into one process.

Why identity matters: protobuf's default descriptor pool (the upb backend protobuf 7 ships) accepts
a second registration of a file name only when the serialized ``FileDescriptorProto`` is the same;
anything else, even a reordered message, raises ``TypeError: Couldn't build proto file into
descriptor pool: duplicate file name …`` at import (the last test shows it on the installed
protobuf). So a process that imports both the coordinator's stubs and stubs generated from Spider's
files (a tool, a test double, Spider's own Python bits) works only if every shared file is
byte-identical, including the parts the coordinator does not use.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import descriptor_pb2

from coordinator.config.locations import PROJECT_ROOT
from coordinator.spider.grpc import generate
from coordinator.spider.grpc.generated.common import common_pb2
from coordinator.spider.grpc.generated.storage import storage_pb2

SPIDER_PROTO = (
    Path(__file__).resolve().parents[2]
    / "shared"
    / "reference"
    / "spider-upstream"
    / "components"
    / "spider-proto"
)
"""Spider's protocol sources (commit 8174d9a0), as its repository lays them out."""

COORDINATOR_MODULES = {
    "common/common.proto": common_pb2,
    "storage/storage.proto": storage_pb2,
}
"""The files the coordinator shares with Spider: every file it declares."""


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Python stubs generated from every one of Spider's ``.proto`` files, as Spider generates them
    (top-level ``common``, ``storage``, ``scheduler`` packages); the output directory."""
    assert SPIDER_PROTO.is_dir(), f"Spider's protocol sources {SPIDER_PROTO} are missing"
    output = tmp_path_factory.mktemp("spider-stubs")
    protos = sorted(
        path.relative_to(SPIDER_PROTO).as_posix() for path in SPIDER_PROTO.rglob("*.proto")
    )
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{SPIDER_PROTO}",
            f"--python_out={output}",
            f"--grpc_python_out={output}",
            *protos,
        ],
        cwd=SPIDER_PROTO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    return output


def _registered_bytes(module: Path) -> bytes:
    """The serialized ``FileDescriptorProto`` a generated ``_pb2`` module registers in the default
    pool: the literal argument of its ``AddSerializedFile`` call (read without importing it)."""
    for node in ast.walk(ast.parse(module.read_text(encoding="utf-8"))):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "AddSerializedFile"
        ):
            value = ast.literal_eval(node.args[0])
            assert isinstance(value, bytes)
            return value
    raise AssertionError(f"{module} registers no file")


def _upstream_files(upstream: Path) -> dict[str, bytes]:
    return {
        path.relative_to(upstream).as_posix().removesuffix("_pb2.py") + ".proto": _registered_bytes(
            path
        )
        for path in sorted(upstream.rglob("*_pb2.py"))
    }


def _proto(serialized: bytes) -> descriptor_pb2.FileDescriptorProto:
    return descriptor_pb2.FileDescriptorProto.FromString(serialized)


def _coordinator(name: str) -> descriptor_pb2.FileDescriptorProto:
    return _proto(COORDINATOR_MODULES[name].DESCRIPTOR.serialized_pb)


def test_the_coordinator_declares_spiders_files_by_their_import_paths(upstream: Path) -> None:
    spiders = _upstream_files(upstream)
    assert set(spiders) == {
        "common/common.proto",
        "storage/storage.proto",
        "scheduler/scheduler.proto",
    }
    assert set(COORDINATOR_MODULES) <= set(spiders)
    assert [p.as_posix() for p in generate.proto_files()] == sorted(COORDINATOR_MODULES)
    for name in COORDINATOR_MODULES:
        ours, theirs = _coordinator(name), _proto(spiders[name])
        assert (ours.name, ours.package, ours.syntax) == (
            theirs.name,
            theirs.package,
            theirs.syntax,
        )
        assert list(ours.dependency) == list(theirs.dependency)
        assert ours.options == theirs.options


@pytest.mark.parametrize("name", sorted(COORDINATOR_MODULES))
def test_messages_and_enums_are_spiders_in_spiders_order(upstream: Path, name: str) -> None:
    ours, theirs = _coordinator(name), _proto(_upstream_files(upstream)[name])
    assert [m.name for m in ours.message_type] == [m.name for m in theirs.message_type]
    for mine, spiders in zip(ours.message_type, theirs.message_type, strict=True):
        assert mine == spiders, f"message {mine.name} differs:\n{mine}\n---\n{spiders}"
    assert [e.name for e in ours.enum_type] == [e.name for e in theirs.enum_type]
    for mine_enum, spiders_enum in zip(ours.enum_type, theirs.enum_type, strict=True):
        assert mine_enum == spiders_enum, f"enum {mine_enum.name} differs"


@pytest.mark.parametrize("name", sorted(COORDINATOR_MODULES))
def test_services_and_methods_are_spiders_in_spiders_order(upstream: Path, name: str) -> None:
    ours, theirs = _coordinator(name), _proto(_upstream_files(upstream)[name])
    assert [s.name for s in ours.service] == [s.name for s in theirs.service]
    for mine, spiders in zip(ours.service, theirs.service, strict=True):
        assert mine == spiders, f"service {mine.name} differs:\n{mine}\n---\n{spiders}"


@pytest.mark.parametrize("name", sorted(COORDINATOR_MODULES))
def test_the_registered_file_descriptors_are_byte_identical(upstream: Path, name: str) -> None:
    spiders = _upstream_files(upstream)[name]
    assert COORDINATOR_MODULES[name].DESCRIPTOR.serialized_pb == spiders
    committed = generate.GENERATED / (name.removesuffix(".proto") + "_pb2.py")
    assert _registered_bytes(committed) == spiders


_BOTH_STUBS = textwrap.dedent(
    """
    import importlib, json, sys

    order = sys.argv[1:]
    modules = {}
    for name in order:
        modules[name] = importlib.import_module(name)
    ours = modules["coordinator.spider.grpc.generated.storage.storage_pb2"]
    theirs = modules["storage.storage_pb2"]
    wire = ours.JobIdRequest(job_id=2**64 - 1).SerializeToString()
    task = modules["scheduler.scheduler_pb2"]  # Spider's other file, on top of the shared ones
    print(json.dumps({
        "same_descriptor": ours.DESCRIPTOR is theirs.DESCRIPTOR,
        "same_bytes": ours.DESCRIPTOR.serialized_pb == theirs.DESCRIPTOR.serialized_pb,
        "decoded": theirs.JobIdRequest.FromString(wire).job_id,
        "scheduler_package": task.DESCRIPTOR.package,
        "their_services": sorted(theirs.DESCRIPTOR.services_by_name),
    }))
    """
)

_COORDINATOR_STUBS = [
    "coordinator.spider.grpc.generated.common.common_pb2",
    "coordinator.spider.grpc.generated.storage.storage_pb2",
    "coordinator.spider.grpc.generated.storage.storage_pb2_grpc",
]
_SPIDER_STUBS = [
    "common.common_pb2",
    "storage.storage_pb2",
    "storage.storage_pb2_grpc",
    "scheduler.scheduler_pb2",
    "scheduler.scheduler_pb2_grpc",
]


def _in_a_fresh_process(
    upstream: Path, script: str, *argv: str
) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(upstream), str(PROJECT_ROOT)])}
    return subprocess.run(
        [sys.executable, "-c", script, *argv],
        env=environment,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


@pytest.mark.parametrize(
    "order",
    [_COORDINATOR_STUBS + _SPIDER_STUBS, _SPIDER_STUBS + _COORDINATOR_STUBS],
    ids=["coordinator-first", "spider-first"],
)
def test_both_sets_of_stubs_load_in_one_process(upstream: Path, order: list[str]) -> None:
    completed = _in_a_fresh_process(upstream, _BOTH_STUBS, *order)
    assert completed.returncode == 0, completed.stderr
    result: dict[str, Any] = json.loads(completed.stdout)
    assert result == {
        "same_descriptor": True,  # one file in the default pool, whoever registered it first
        "same_bytes": True,
        "decoded": 2**64 - 1,
        "scheduler_package": "scheduler",
        "their_services": sorted(storage_pb2.DESCRIPTOR.services_by_name),
    }


_DIFFERENT_FILE = textwrap.dedent(
    """
    from google.protobuf import descriptor_pb2, descriptor_pool
    from coordinator.spider.grpc.generated.common import common_pb2

    pool = descriptor_pool.Default()
    pool.AddSerializedFile(common_pb2.DESCRIPTOR.serialized_pb)  # the same bytes: accepted
    changed = descriptor_pb2.FileDescriptorProto.FromString(common_pb2.DESCRIPTOR.serialized_pb)
    changed.message_type.add().CopyFrom(changed.message_type[0])
    del changed.message_type[0]  # the same messages, Void before TaskId
    try:
        pool.AddSerializedFile(changed.SerializeToString())
    except TypeError as error:
        print(error)
    """
)


def test_the_default_pool_accepts_a_file_twice_only_when_identical(upstream: Path) -> None:
    completed = _in_a_fresh_process(upstream, _DIFFERENT_FILE)
    assert completed.returncode == 0, completed.stderr
    assert "duplicate file name common/common.proto" in completed.stdout
