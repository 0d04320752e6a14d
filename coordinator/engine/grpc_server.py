"""Any Spider port served as Spider's storage server serves it (``docs/spider.md``).

``serve`` puts a ``SpiderPort`` (in practice the ``EmbeddedSpider``) behind Spider's
``storage.JobOrchestrationService`` and ``storage.ResourceGroupManagementService``, in
plaintext, so that ``GrpcSpider`` (or Spider's own Rust client) can drive it over the network.

* The servicers decode exactly what Spider's server decodes: RegisterJob's compressed task graph
  and inputs are handed to the port unchanged (the port checks them), and GetJobOutputs encodes
  the port's outputs with the option byte and wire frame (``encode_job_outputs``).
* The port's errors become the status codes Spider's server returns for the same situations
  (``docs/spider.md``, Status codes): ``JobNotFound`` → NOT_FOUND, ``InvalidJobState`` →
  FAILED_PRECONDITION, ``InvalidArgument`` → INVALID_ARGUMENT, ``Unauthenticated`` →
  UNAUTHENTICATED, ``ResourceGroupExists`` → ALREADY_EXISTS, ``Unavailable`` → UNAVAILABLE, any
  other ``ServerError`` (a refused cancel, a start of a started job, the outputs of a retained job
  that has not succeeded) → INTERNAL. An unexpected exception is logged and answered INTERNAL, as
  Spider answers "other" failures.
* The status details are Spider's (``spider-storage/src/grpc.rs``): NOT_FOUND is always
  "job not found" (grpc.rs:112, :134), UNAUTHENTICATED "invalid resource group" (:102, :272),
  INTERNAL "storage service internal error" (:420, whatever the cause: the port's explanation is
  logged here, as Spider logs its own); FAILED_PRECONDITION, INVALID_ARGUMENT and ALREADY_EXISTS
  carry the error's text, as Spider's carry ``error.to_string()`` (:124, :144, :282).
* Unlike Spider's, this server never shuts itself down: where Spider's storage service meets a
  fatal internal error (grpc.rs:380-398), the embedded engine refuses with INTERNAL and carries on
  (``coordinator.engine.embedded.engine``; README, "Spider's answers", lists the differences).
* Like Spider's (tonic's defaults, ``docs/spider.md``, Limits), the server refuses a request whose
  message is over 4 MiB and does not limit what it sends. The refusal is tonic's: OUT_OF_RANGE
  "Error, decoded message length too large: found N bytes, the limit is: 4194304 bytes", N the
  request message's protobuf length (``_limited``: grpcio itself is let receive up to
  ``RECEIVE_LIMIT_FACTOR`` times the limit, and each method's deserializer refuses the excess). A
  request past that bound still gets grpcio's own RESOURCE_EXHAUSTED: tonic refuses any size from
  the length prefix alone, while grpcio reads a whole message before a method sees it, so an
  unbounded receive limit would let a client make the server buffer any amount. No client of the
  coordinator's sends one (``GrpcSpider`` refuses a request over 4 MiB before sending it).

Spider's internal services are not served: executors are the embedded engine's business.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent import futures
from typing import Any, TypeVar, cast

import grpc

from coordinator.spider.grpc.client import MAX_MESSAGE_BYTES
from coordinator.spider.grpc.generated.common import common_pb2
from coordinator.spider.grpc.generated.storage import storage_pb2, storage_pb2_grpc
from coordinator.spider.port import (
    InvalidArgument,
    InvalidJobState,
    JobNotFound,
    JobState,
    ResourceGroupExists,
    ServerError,
    SpiderError,
    SpiderPort,
    Unauthenticated,
    Unavailable,
)
from coordinator.spider.wire import encode_job_outputs

_log = logging.getLogger(__name__)

_stubs: Any = storage_pb2_grpc
"""The generated service registration functions, untyped (grpc ships no type information)."""

T = TypeVar("T")

STATUS_OF_ERROR: tuple[tuple[type[SpiderError], grpc.StatusCode], ...] = (
    (JobNotFound, grpc.StatusCode.NOT_FOUND),
    (InvalidJobState, grpc.StatusCode.FAILED_PRECONDITION),
    (InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT),
    (Unauthenticated, grpc.StatusCode.UNAUTHENTICATED),
    (ResourceGroupExists, grpc.StatusCode.ALREADY_EXISTS),
    (Unavailable, grpc.StatusCode.UNAVAILABLE),
    (ServerError, grpc.StatusCode.INTERNAL),
)
"""The port's errors → Spider's status codes; the first match wins, else INTERNAL."""

INTERNAL_ERROR = "storage service internal error"

SPIDER_DETAILS: dict[grpc.StatusCode, str] = {
    grpc.StatusCode.NOT_FOUND: "job not found",  # grpc.rs:112, :134
    grpc.StatusCode.UNAUTHENTICATED: "invalid resource group",  # grpc.rs:102, :272
    grpc.StatusCode.INTERNAL: INTERNAL_ERROR,  # grpc.rs:420, default_error_handler
}
"""The codes Spider's server answers with a fixed text whatever the error (module docstring)."""


RECEIVE_LIMIT_FACTOR = 4
"""grpcio receives requests up to this many times the limit, so that those between the limit and
this bound get Spider's OUT_OF_RANGE (module docstring); larger ones get grpcio's refusal."""


def too_large(found: int, limit: int) -> str:
    """tonic's details for a request message of ``found`` bytes over ``limit`` (Spider's text,
    ``tonic::codec::decode``, measured against Spider's storage binary)."""
    return (
        f"Error, decoded message length too large: found {found} bytes, the limit is: {limit} bytes"
    )


class _Oversized:
    """What a limited deserializer yields for a request message over the limit."""

    __slots__ = ("size",)

    def __init__(self, size: int) -> None:
        self.size = size


def _limited(handler: Any, limit: int) -> Any:
    """``handler`` (a unary-unary ``grpc.RpcMethodHandler``) refusing a request message over
    ``limit`` bytes as tonic does: OUT_OF_RANGE with ``too_large``'s text, the servicer not called.
    The size is the received message's (what the deserializer is given), not a re-encoding."""
    deserialize = handler.request_deserializer
    behave = handler.unary_unary

    def request_deserializer(data: bytes) -> Any:
        return _Oversized(len(data)) if len(data) > limit else deserialize(data)

    def unary_unary(request: Any, context: Any) -> Any:
        if isinstance(request, _Oversized):
            _log.debug("request of %d bytes refused (over %d)", request.size, limit)
            context.abort(grpc.StatusCode.OUT_OF_RANGE, too_large(request.size, limit))
        return behave(request, context)

    return handler._replace(request_deserializer=request_deserializer, unary_unary=unary_unary)


class _Registrations:
    """Stands in for the server when a generated ``add_…_to_server`` registers a service: keeps the
    method handlers, to be wrapped (``_limited``) before the real server gets them."""

    def __init__(self) -> None:
        self.services: dict[str, dict[str, Any]] = {}

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        """Ignored: built again from the wrapped handlers."""

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        self.services[service] = handlers


def status_of(error: SpiderError) -> grpc.StatusCode:
    """The status Spider's server answers for the situation ``error`` describes."""
    for error_type, code in STATUS_OF_ERROR:
        if isinstance(error, error_type):
            return code
    return grpc.StatusCode.INTERNAL


def details_of(error: SpiderError, code: grpc.StatusCode) -> str:
    """The status details Spider's server sends with ``code`` for ``error``."""
    return SPIDER_DETAILS.get(code) or str(error) or INTERNAL_ERROR


def _answer(rpc: str, context: Any, call: Callable[[], T]) -> T:
    """``call()``, or the call aborted with the status of the error it raised."""
    try:
        return call()
    except SpiderError as error:
        code = status_of(error)
        log = _log.warning if code is grpc.StatusCode.INTERNAL else _log.debug
        log("%s: %s: %s", rpc, code.name, error)
        context.abort(code, details_of(error, code))
        raise  # not reached: abort raises
    except Exception:
        _log.exception("%s failed unexpectedly", rpc)
        context.abort(grpc.StatusCode.INTERNAL, INTERNAL_ERROR)
        raise  # not reached: abort raises


def _state(state: JobState) -> storage_pb2.JobStateResponse:
    return storage_pb2.JobStateResponse(state=cast(storage_pb2.JobState, int(state)))


class JobOrchestrationServicer:
    """``storage.JobOrchestrationService`` over a Spider port."""

    def __init__(self, spider: SpiderPort) -> None:
        self._spider = spider

    def RegisterJob(  # noqa: N802 (gRPC method names)
        self, request: storage_pb2.RegisterJobRequest, context: Any
    ) -> storage_pb2.RegisterJobResponse:
        """The port's ``register_job`` with the payloads as received."""
        job_id = _answer(
            "RegisterJob",
            context,
            lambda: self._spider.register_job(
                request.resource_group_id,
                request.compressed_serialized_task_graph,
                request.compressed_serialized_inputs,
            ),
        )
        return storage_pb2.RegisterJobResponse(job_id=job_id)

    def StartJob(  # noqa: N802
        self, request: storage_pb2.JobIdRequest, context: Any
    ) -> storage_pb2.JobStateResponse:
        """The port's ``start_job``."""
        return _state(_answer("StartJob", context, lambda: self._spider.start_job(request.job_id)))

    def CancelJob(  # noqa: N802
        self, request: storage_pb2.JobIdRequest, context: Any
    ) -> storage_pb2.JobStateResponse:
        """The port's ``cancel_job``."""
        return _state(
            _answer("CancelJob", context, lambda: self._spider.cancel_job(request.job_id))
        )

    def GetJobState(  # noqa: N802
        self, request: storage_pb2.JobIdRequest, context: Any
    ) -> storage_pb2.JobStateResponse:
        """The port's ``get_job_state``."""
        return _state(
            _answer("GetJobState", context, lambda: self._spider.get_job_state(request.job_id))
        )

    def GetJobOutputs(  # noqa: N802
        self, request: storage_pb2.JobIdRequest, context: Any
    ) -> storage_pb2.JobOutputsResponse:
        """The port's ``get_job_outputs``, encoded as Spider's ``serialized_outputs``."""
        outputs = _answer(
            "GetJobOutputs", context, lambda: self._spider.get_job_outputs(request.job_id)
        )
        return storage_pb2.JobOutputsResponse(serialized_outputs=encode_job_outputs(outputs))

    def GetJobError(  # noqa: N802
        self, request: storage_pb2.JobIdRequest, context: Any
    ) -> storage_pb2.JobErrorResponse:
        """The port's ``get_job_error``."""
        message = _answer(
            "GetJobError", context, lambda: self._spider.get_job_error(request.job_id)
        )
        return storage_pb2.JobErrorResponse(error_message=message)


class ResourceGroupManagementServicer:
    """``storage.ResourceGroupManagementService`` over a Spider port."""

    def __init__(self, spider: SpiderPort) -> None:
        self._spider = spider

    def AddResourceGroup(  # noqa: N802
        self, request: storage_pb2.AddResourceGroupRequest, context: Any
    ) -> storage_pb2.ResourceGroupIdResponse:
        """The port's ``add_resource_group``."""
        group = _answer(
            "AddResourceGroup",
            context,
            lambda: self._spider.add_resource_group(
                request.external_resource_group_id, request.password
            ),
        )
        return storage_pb2.ResourceGroupIdResponse(resource_group_id=group)

    def VerifyResourceGroup(  # noqa: N802
        self, request: storage_pb2.VerifyResourceGroupRequest, context: Any
    ) -> common_pb2.Void:
        """The port's ``verify_resource_group``."""
        _answer(
            "VerifyResourceGroup",
            context,
            lambda: self._spider.verify_resource_group(request.resource_group_id, request.password),
        )
        return common_pb2.Void()


class SpiderServer(grpc.Server):  # type: ignore[misc]  # grpc ships no type information
    """A started gRPC server (``grpc.Server``) that knows the address it is bound to."""

    def __init__(self, server: Any, host: str, port: int) -> None:
        self._server = server
        self.host = host
        self.port = port
        """The bound port (the one the system picked when 0 was asked for)."""

    @property
    def address(self) -> str:
        """``host:port`` for a client (an IPv6 host in brackets)."""
        host = f"[{self.host}]" if ":" in self.host and not self.host.startswith("[") else self.host
        return f"{host}:{self.port}"

    def add_generic_rpc_handlers(self, generic_rpc_handlers: Any) -> None:
        self._server.add_generic_rpc_handlers(generic_rpc_handlers)

    def add_registered_method_handlers(self, service_name: str, method_handlers: Any) -> None:
        self._server.add_registered_method_handlers(service_name, method_handlers)

    def add_insecure_port(self, address: str) -> int:
        return int(self._server.add_insecure_port(address))

    def add_secure_port(self, address: str, server_credentials: Any) -> int:
        return int(self._server.add_secure_port(address, server_credentials))

    def start(self) -> None:
        self._server.start()

    def stop(self, grace: float | None) -> threading.Event:
        event: threading.Event = self._server.stop(grace)
        return event

    def wait_for_termination(self, timeout: float | None = None) -> bool:
        return bool(self._server.wait_for_termination(timeout))


def serve(
    port: SpiderPort,
    host: str,
    port_number: int,
    *,
    max_workers: int = 16,
    max_message_bytes: int = MAX_MESSAGE_BYTES,
) -> SpiderServer:
    """Serve ``port`` on ``host:port_number`` (0: a free port, see ``SpiderServer.port``); started.

    ``max_workers`` calls are handled at once (each holds a thread while the port works). A request
    message over ``max_message_bytes`` is refused as Spider refuses it (module docstring). Stop it
    with ``stop(grace)``. Raises ``OSError`` when the address cannot be bound.
    """
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="spider-grpc"),
        options=[
            ("grpc.so_reuseport", 0),  # a taken port is an error, not a shared one
            ("grpc.max_receive_message_length", RECEIVE_LIMIT_FACTOR * max_message_bytes),
        ],
    )
    registrations = _Registrations()
    _stubs.add_JobOrchestrationServiceServicer_to_server(
        JobOrchestrationServicer(port), registrations
    )
    _stubs.add_ResourceGroupManagementServiceServicer_to_server(
        ResourceGroupManagementServicer(port), registrations
    )
    for service, handlers in registrations.services.items():
        limited = {
            method: _limited(handler, max_message_bytes) for method, handler in handlers.items()
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, limited),))
        server.add_registered_method_handlers(service, limited)
    bracketed = f"[{host}]" if ":" in host and not host.startswith("[") else host
    try:
        bound = int(server.add_insecure_port(f"{bracketed}:{port_number}"))
    except RuntimeError as error:
        server.stop(None)
        raise OSError(f"cannot listen on {bracketed}:{port_number}: {error}") from error
    if bound == 0:
        server.stop(None)
        raise OSError(f"cannot listen on {bracketed}:{port_number}")
    spider_server = SpiderServer(server, host, bound)
    spider_server.start()
    _log.info("serving Spider's storage API on %s", spider_server.address)
    return spider_server


def run_server(
    port: SpiderPort,
    host: str,
    port_number: int,
    *,
    stop: threading.Event | None = None,
    grace_secs: float = 5.0,
    on_listening: Callable[[SpiderServer], None] | None = None,
) -> None:
    """Serve ``port`` until ``stop`` is set (or, without one, until ``KeyboardInterrupt``), then
    let calls in flight finish for up to ``grace_secs``. Blocks; for a CLI.

    ``on_listening`` is called once the server is bound and started (to print its address, say).
    A CLI that wants SIGTERM to stop the server sets ``stop`` from its signal handler.
    Raises ``OSError`` when the address cannot be bound.
    """
    server = serve(port, host, port_number)
    try:
        if on_listening is not None:
            on_listening(server)
        (stop if stop is not None else threading.Event()).wait()
    except KeyboardInterrupt:
        _log.info("interrupted: stopping the Spider gRPC server")
    finally:
        server.stop(grace_secs).wait()
