"""A scripted fake of Spider's storage server, for gRPC client tests (127.0.0.1, port 0 only).

``ScriptedSpider`` serves every RPC of ``JobOrchestrationService`` and
``ResourceGroupManagementService``. Each call takes the next scripted action for its RPC (abort
with a status, hang, reply) or, with none left, replies with the RPC's default response; every
request is recorded, so tests can count what reached the server.
"""

from __future__ import annotations

import socket
import threading
from collections import defaultdict, deque
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import grpc

from coordinator.spider.grpc.generated.common import common_pb2
from coordinator.spider.grpc.generated.storage import storage_pb2, storage_pb2_grpc

JOB_RPCS = ("RegisterJob", "StartJob", "CancelJob", "GetJobState", "GetJobOutputs", "GetJobError")
RESOURCE_GROUP_RPCS = ("AddResourceGroup", "VerifyResourceGroup")

DEFAULT_RESPONSES: dict[str, Any] = {
    "RegisterJob": storage_pb2.RegisterJobResponse(job_id=1),
    "StartJob": storage_pb2.JobStateResponse(state=storage_pb2.RUNNING),
    "CancelJob": storage_pb2.JobStateResponse(state=storage_pb2.CANCELLED),
    "GetJobState": storage_pb2.JobStateResponse(state=storage_pb2.READY),
    "GetJobOutputs": storage_pb2.JobOutputsResponse(serialized_outputs=b"\x00\x00\x00\x00\x00"),
    "GetJobError": storage_pb2.JobErrorResponse(error_message="boom"),
    "AddResourceGroup": storage_pb2.ResourceGroupIdResponse(resource_group_id=1),
    "VerifyResourceGroup": common_pb2.Void(),
}


@dataclass(frozen=True)
class Abort:
    code: grpc.StatusCode
    details: str = ""


@dataclass(frozen=True)
class Hang:
    """Wait this long (or until the server is torn down), then reply with the default."""

    seconds: float


@dataclass(frozen=True)
class Reply:
    response: Any


Action = Abort | Hang | Reply


class ScriptedSpider:
    """A servicer for both services; ``script(rpc, *actions)`` queues what the next calls do."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._scripts: dict[str, deque[Action]] = defaultdict(deque)
        self.calls: dict[str, list[Any]] = defaultdict(list)
        self.released = threading.Event()

    def script(self, rpc: str, *actions: Action) -> None:
        with self._lock:
            self._scripts[rpc].extend(actions)

    def reset(self) -> None:
        with self._lock:
            self._scripts.clear()
            self.calls.clear()

    def count(self, rpc: str) -> int:
        with self._lock:
            return len(self.calls[rpc])

    def _handle(self, rpc: str, request: Any, context: grpc.ServicerContext) -> Any:
        with self._lock:
            self.calls[rpc].append(request)
            script = self._scripts[rpc]
            action = script.popleft() if script else None
        if isinstance(action, Abort):
            context.abort(action.code, action.details)
        if isinstance(action, Hang):
            self.released.wait(action.seconds)
        if isinstance(action, Reply):
            return action.response
        return DEFAULT_RESPONSES[rpc]

    def __getattr__(self, name: str) -> Any:
        if name in JOB_RPCS or name in RESOURCE_GROUP_RPCS:
            return lambda request, context: self._handle(name, request, context)
        raise AttributeError(name)


@contextmanager
def grpc_server(*servicers: tuple[Any, Any]) -> Iterator[int]:
    """A started server on 127.0.0.1 with ``(add_function, servicer)`` pairs; yields its port."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    for add, servicer in servicers:
        add(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield port
    finally:
        server.stop(0).wait()


@contextmanager
def scripted_server() -> Iterator[tuple[ScriptedSpider, int]]:
    """A ``ScriptedSpider`` served on 127.0.0.1; yields it and its port."""
    fake = ScriptedSpider()
    with grpc_server(
        (storage_pb2_grpc.add_JobOrchestrationServiceServicer_to_server, fake),
        (storage_pb2_grpc.add_ResourceGroupManagementServiceServicer_to_server, fake),
    ) as port:
        try:
            yield fake, port
        finally:
            fake.released.set()


def unused_port() -> int:
    """A port of 127.0.0.1 nothing listens on (free a moment ago)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
