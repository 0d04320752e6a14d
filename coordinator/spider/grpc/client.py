"""``GrpcSpider``: the Spider port over gRPC, for a real Spider cluster (``docs/spider.md``).

It speaks Spider's ``storage.JobOrchestrationService`` and ``ResourceGroupManagementService``
(gRPC surface) in plaintext to the storage server (``host:port``, default port 50051) and types
failures as Spider's Rust client does (Client behaviour), with the guards every RPC needs that
Rust's client lacks (Guarded calls; the sections are ``docs/spider.md``'s):

* **A deadline on every call** (``deadline_secs``, per attempt). ``DEADLINE_EXCEEDED`` is
  ambiguous (the server may have acted) and is raised as ``Unavailable``; it is not retried.
* **Retries only on ``UNAVAILABLE``**, with Spider's back-off (100 ms doubling to a 3 s cap
  plus ≤ 20 ms jitter, at most 10 retries). **RegisterJob is never retried** (it is not
  idempotent and there is no lookup): one attempt, and an ``UNAVAILABLE`` or a deadline raises
  ``Unavailable`` at once; the job may or may not have been registered.
* **Errors** (Client behaviour). Job RPCs: NOT_FOUND → ``JobNotFound``, FAILED_PRECONDITION →
  ``InvalidJobState``, INVALID_ARGUMENT → ``InvalidArgument``, UNAUTHENTICATED →
  ``Unauthenticated``, UNAVAILABLE (and DEADLINE_EXCEEDED) → ``Unavailable``, anything else →
  ``ServerError``. Resource-group RPCs: INVALID_ARGUMENT, UNAUTHENTICATED, UNAVAILABLE and
  DEADLINE_EXCEEDED the same, ALREADY_EXISTS → ``ResourceGroupExists`` (a ``ServerError``, as Rust's
  ``Server``), anything else → ``ServerError``. A response state ``JOB_STATE_UNSPECIFIED`` →
  ``ServerError`` (Rust: ``UnspecifiedJobState``); a state number this client does not know →
  ``Unavailable`` (Rust: ``Transport``); undecodable outputs → ``ServerError`` (Rust:
  ``Deserialization``). Typed errors carry the server's details as their message; ``Unavailable``
  and ``ServerError`` also name the call and the status code. The ``grpc.RpcError`` is the cause.
* **The 4 MiB message limit** (Limits) is checked before RegisterJob is sent (its serialized size),
  raising ``InvalidArgument``; the channel's send and receive limits are set to 4 MiB, so a larger
  GetJobOutputs response fails as ``ServerError`` (RESOURCE_EXHAUSTED).

The rules about *when* to call (Guarded calls: state first, never cancel in CommitReady, outputs
only after Succeeded) are the port's helpers' business (``coordinator.spider.port``); this client
only makes the calls.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

import grpc

from coordinator.spider.grpc.generated.storage import storage_pb2, storage_pb2_grpc
from coordinator.spider.port import (
    InvalidArgument,
    InvalidJobState,
    JobNotFound,
    JobState,
    ResourceGroupExists,
    ServerError,
    SpiderError,
    Unauthenticated,
    Unavailable,
)
from coordinator.spider.wire import InvalidFrame, decode_job_outputs

if TYPE_CHECKING:
    from coordinator.spider.port import SpiderPort

_stubs: Any = storage_pb2_grpc
"""The generated service stubs, untyped (grpc ships no type information)."""

DEFAULT_PORT = 50051
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
"""tonic's default decode limit, which Spider's storage server keeps (``docs/spider.md``)."""
DEFAULT_DEADLINE_SECS = 10.0
INITIAL_BACKOFF_SECS = 0.1
MAX_BACKOFF_SECS = 3.0
MAX_RETRIES = 10
BACKOFF_JITTER_SECS = 0.02

ErrorFactory = Callable[[str], SpiderError]

_JOB_ERRORS: Mapping[grpc.StatusCode, ErrorFactory] = {
    grpc.StatusCode.NOT_FOUND: JobNotFound,
    grpc.StatusCode.FAILED_PRECONDITION: InvalidJobState,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
}
"""Job RPCs (Client behaviour); UNAVAILABLE and DEADLINE_EXCEEDED are ``Unavailable``."""

_RESOURCE_GROUP_ERRORS: Mapping[grpc.StatusCode, ErrorFactory] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.ALREADY_EXISTS: ResourceGroupExists,
}
"""Resource-group RPCs: NOT_FOUND and FAILED_PRECONDITION are plain ``ServerError``s."""

_TRANSPORT_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


class GrpcSpider:
    """The Spider port over gRPC (module docstring: deadlines, retries, errors, limits).

    Thread-safe: a channel per calling thread (``_connection``). Use it as a context manager or
    ``close()`` it.
    """

    def __init__(
        self,
        host: str,
        port: int = DEFAULT_PORT,
        *,
        deadline_secs: float = DEFAULT_DEADLINE_SECS,
        max_retries: int = MAX_RETRIES,
        initial_backoff_secs: float = INITIAL_BACKOFF_SECS,
        max_backoff_secs: float = MAX_BACKOFF_SECS,
        backoff_jitter_secs: float = BACKOFF_JITTER_SECS,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        """Open a plaintext channel to Spider's storage server at ``host:port`` (connected lazily).

        ``deadline_secs`` bounds each attempt; an ``UNAVAILABLE`` call other than RegisterJob is
        retried up to ``max_retries`` times, waiting ``initial_backoff_secs`` doubling up to
        ``max_backoff_secs``, plus up to ``backoff_jitter_secs``; ``sleep`` waits out a pause (a
        test passes its own, to see the pauses without waiting them). Raises ``ValueError`` for
        nonsensical settings.
        """
        if deadline_secs <= 0:
            raise ValueError(f"deadline_secs must be positive, got {deadline_secs}")
        if max_retries < 0:
            raise ValueError(f"max_retries must not be negative, got {max_retries}")
        if initial_backoff_secs < 0 or max_backoff_secs < initial_backoff_secs:
            raise ValueError(
                "the back-off must satisfy 0 <= initial_backoff_secs <= max_backoff_secs, got "
                f"{initial_backoff_secs} and {max_backoff_secs}"
            )
        if backoff_jitter_secs < 0:
            raise ValueError(f"backoff_jitter_secs must not be negative, got {backoff_jitter_secs}")
        self.target = _target(host, port)
        self.deadline_secs = deadline_secs
        self.max_retries = max_retries
        self.initial_backoff_secs = initial_backoff_secs
        self.max_backoff_secs = max_backoff_secs
        self.backoff_jitter_secs = backoff_jitter_secs
        self.max_message_bytes = max_message_bytes
        self._sleep = sleep
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._channels: list[Any] = []
        """Every thread's channel (``_connection``), closed together by ``close``."""
        self._local = threading.local()

    def _connection(self) -> tuple[Any, Any]:
        """The calling thread's channel's job and resource-group stubs, its channel opened (and
        connected lazily) at the thread's first call.

        A channel of its own per thread, on a connection of its own (a local subchannel pool:
        gRPC otherwise shares one connection between channels to the same target): Spider's
        storage service answers calls that overlap on one HTTP/2 connection 40-50 ms late
        (measured on ``../shared/spider-cluster``, GetJobState from 4 threads: p50 43-46 ms on
        one connection, whether through one channel or one each; 4 ms on a connection each), so
        the loop's polls, submissions and a monitor's checks, each on its own thread, never
        overlap on one. A connection per thread costs one TCP connection each (the loop's
        handful of threads); a thread's calls are one after another, as on one channel.
        """
        stubs: tuple[Any, Any] | None = getattr(self._local, "stubs", None)
        if stubs is not None:
            return stubs
        channel: Any = grpc.insecure_channel(
            self.target,
            options=[
                ("grpc.max_send_message_length", self.max_message_bytes),
                ("grpc.max_receive_message_length", self.max_message_bytes),
                ("grpc.use_local_subchannel_pool", 1),
            ],
        )
        stubs = (
            _stubs.JobOrchestrationServiceStub(channel),
            _stubs.ResourceGroupManagementServiceStub(channel),
        )
        with self._lock:
            if self._closed.is_set():  # its calls fail as a closed channel's (``_call``)
                channel.close()
                return stubs
            self._channels.append(channel)
        self._local.stubs = stubs
        return stubs

    @property
    def _jobs(self) -> Any:
        return self._connection()[0]

    @property
    def _groups(self) -> Any:
        return self._connection()[1]

    # --- life cycle -------------------------------------------------------------------------

    def close(self) -> None:
        """Close the channel; calls in flight fail (as ``Unavailable``). Idempotent."""
        with self._lock:
            if self._closed.is_set():
                return
            self._closed.set()
            channels, self._channels = self._channels, []
        for channel in channels:
            channel.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"GrpcSpider({self.target!r}, deadline_secs={self.deadline_secs})"

    # --- resource groups --------------------------------------------------------------------

    def add_resource_group(self, external_id: str, password: bytes) -> int:
        """AddResourceGroup: the new group's id.

        Raises ``ResourceGroupExists`` (ALREADY_EXISTS: the name is taken, and its id cannot be
        looked up), ``InvalidArgument``, ``Unauthenticated``, ``Unavailable`` (after the retries,
        or on a deadline: the group may then exist), ``ServerError``.
        """
        request = storage_pb2.AddResourceGroupRequest(
            external_resource_group_id=external_id, password=password
        )
        response: storage_pb2.ResourceGroupIdResponse = self._call(
            "AddResourceGroup", self._groups.AddResourceGroup, request, _RESOURCE_GROUP_ERRORS
        )
        return response.resource_group_id

    def verify_resource_group(self, resource_group_id: int, password: bytes) -> None:
        """VerifyResourceGroup. Raises ``Unauthenticated`` for an unknown id or a wrong password,
        ``InvalidArgument``, ``Unavailable`` (after the retries, or on a deadline),
        ``ServerError``."""
        request = storage_pb2.VerifyResourceGroupRequest(
            resource_group_id=resource_group_id, password=password
        )
        self._call(
            "VerifyResourceGroup", self._groups.VerifyResourceGroup, request, _RESOURCE_GROUP_ERRORS
        )

    # --- jobs -------------------------------------------------------------------------------

    def register_job(
        self, resource_group_id: int, compressed_task_graph: bytes, compressed_inputs: bytes
    ) -> int:
        """RegisterJob: the id of the new ``READY`` job. **One attempt, never retried.**

        Raises ``InvalidArgument`` when the request exceeds Spider's 4 MiB message limit (checked
        before anything is sent) or Spider refuses the graph or inputs ("bad request: …"),
        ``Unauthenticated`` for an unknown resource group, ``ServerError`` for other statuses, and
        ``Unavailable`` on UNAVAILABLE or a deadline: **the job may or may not have been
        registered** (Spider has no lookup; the caller must not retry blindly: ``docs/spider.md``,
        Guarded calls).
        """
        request = storage_pb2.RegisterJobRequest(
            resource_group_id=resource_group_id,
            compressed_serialized_task_graph=compressed_task_graph,
            compressed_serialized_inputs=compressed_inputs,
        )
        size = request.ByteSize()
        if size > self.max_message_bytes:
            raise InvalidArgument(
                f"the job is too large for Spider: its RegisterJob request is {size} bytes, "
                f"{size - self.max_message_bytes} bytes over Spider's "
                f"{_mebibytes(self.max_message_bytes)} message limit ({self.max_message_bytes} "
                f"bytes; compressed task graph {len(compressed_task_graph)} bytes, compressed "
                f"inputs {len(compressed_inputs)} bytes)"
            )
        response: storage_pb2.RegisterJobResponse = self._call(
            "RegisterJob", self._jobs.RegisterJob, request, _JOB_ERRORS, retry=False
        )
        return response.job_id

    def start_job(self, job_id: int) -> JobState:
        """StartJob: ``READY`` → ``RUNNING``; the new state.

        Raises ``JobNotFound`` (unknown, or terminal and evicted from Spider's cache: confirm
        with ``get_job_state``), ``ServerError`` (INTERNAL: the job is cached but not ``READY``),
        ``Unavailable`` (after the retries, or on a deadline: the job may then have started). Ask
        ``get_job_state`` first (``start_if_ready``).
        """
        return self._job_state_call("StartJob", self._jobs.StartJob, job_id)

    def cancel_job(self, job_id: int) -> JobState:
        """CancelJob: the resulting state (``docs/spider.md``, Cancellation). Never call it in
        ``COMMIT_READY`` for a graph without a cleanup task (use ``cancel_if_safe``).

        Raises ``JobNotFound``, ``ServerError`` (INTERNAL: cached terminal or ``CLEANUP_READY``
        job, or a fatal storage error), ``Unavailable`` (after the retries, or on a deadline).
        """
        return self._job_state_call("CancelJob", self._jobs.CancelJob, job_id)

    def get_job_state(self, job_id: int) -> JobState:
        """GetJobState. Raises ``JobNotFound``, ``Unavailable`` (after the retries, or on a
        deadline), ``ServerError``."""
        return self._job_state_call("GetJobState", self._jobs.GetJobState, job_id)

    def get_job_outputs(self, job_id: int) -> list[bytes]:
        """GetJobOutputs: the graph outputs of a ``SUCCEEDED`` job, decoded from Spider's
        ``serialized_outputs`` (option byte + wire frame). Call it only after ``SUCCEEDED``
        (``docs/spider.md``, Guarded calls).

        Raises ``InvalidJobState`` (FAILED_PRECONDITION: not ``SUCCEEDED``, no longer cached),
        ``JobNotFound``, ``Unavailable`` (after the retries, or on a deadline), ``ServerError``
        (INTERNAL: not ``SUCCEEDED`` and still cached, on which a real Spider's storage server
        shuts down; other statuses, a response over 4 MiB, or outputs that do not decode).
        """
        response: storage_pb2.JobOutputsResponse = self._call(
            "GetJobOutputs", self._jobs.GetJobOutputs, _job_id(job_id), _JOB_ERRORS
        )
        try:
            return decode_job_outputs(response.serialized_outputs)
        except InvalidFrame as error:
            raise ServerError(
                f"GetJobOutputs(job {job_id}): Spider's outputs do not decode: {error}"
            ) from error

    def get_job_error(self, job_id: int) -> str:
        """GetJobError: the failure message of a ``FAILED`` job.

        Raises ``InvalidJobState`` (FAILED_PRECONDITION: not ``FAILED``), ``JobNotFound``,
        ``Unavailable`` (after the retries, or on a deadline), ``ServerError``.
        """
        response: storage_pb2.JobErrorResponse = self._call(
            "GetJobError", self._jobs.GetJobError, _job_id(job_id), _JOB_ERRORS
        )
        return response.error_message

    # --- calls ------------------------------------------------------------------------------

    def _job_state_call(self, rpc: str, method: Any, job_id: int) -> JobState:
        response: storage_pb2.JobStateResponse = self._call(
            rpc, method, _job_id(job_id), _JOB_ERRORS
        )
        number = int(response.state)
        if number == JobState.UNSPECIFIED:
            raise ServerError(f"{rpc}(job {job_id}): Spider answered JOB_STATE_UNSPECIFIED")
        try:
            return JobState(number)
        except ValueError:
            raise Unavailable(
                f"{rpc}(job {job_id}): Spider answered an unknown job state {number}"
            ) from None

    def _call(
        self,
        rpc: str,
        method: Any,
        request: Any,
        errors: Mapping[grpc.StatusCode, ErrorFactory],
        *,
        retry: bool = True,
    ) -> Any:
        """The response of ``method(request)``, with the deadline, retries and error mapping."""
        retries = self.max_retries if retry else 0
        attempt = 0
        while True:
            attempt += 1
            try:
                return method(request, timeout=self.deadline_secs)
            except grpc.RpcError as error:
                code: grpc.StatusCode = error.code()
                if code is grpc.StatusCode.CANCELLED and self._closed.is_set():
                    raise Unavailable(f"{rpc}: the client was closed during the call") from error
                if code is grpc.StatusCode.UNAVAILABLE and attempt <= retries:
                    self._sleep(self._backoff(attempt))
                    continue
                raise _error(
                    rpc, code, error.details() or "", errors, attempts=attempt, retried=retry
                ) from error
            except ValueError as error:  # the channel was closed
                if not self._closed.is_set():
                    raise
                raise Unavailable(f"{rpc}: the client is closed") from error

    def _backoff(self, attempt: int) -> float:
        """The pause after failed attempt number ``attempt`` (1-based)."""
        doubling = 2.0 ** min(attempt - 1, 64)  # bounded: no overflow for huge retry counts
        base = min(self.initial_backoff_secs * doubling, self.max_backoff_secs)
        return base + random.uniform(0, self.backoff_jitter_secs)


if TYPE_CHECKING:

    def _implements_the_port(spider: GrpcSpider) -> SpiderPort:
        return spider


def _error(
    rpc: str,
    code: grpc.StatusCode,
    details: str,
    errors: Mapping[grpc.StatusCode, ErrorFactory],
    *,
    attempts: int,
    retried: bool,
) -> SpiderError:
    if code in _TRANSPORT_CODES:
        what = f"{rpc}: Spider is unavailable ({code.name}: {details})"
        if rpc == "RegisterJob":
            what += "; the job may or may not have been registered"
        elif code is grpc.StatusCode.DEADLINE_EXCEEDED:
            what += "; the call may or may not have taken effect"
        elif retried:
            what += f" after {attempts} attempt{'s' if attempts > 1 else ''}"
        return Unavailable(what)
    factory = errors.get(code)
    if factory is None:
        return ServerError(f"{rpc}: {code.name}: {details}")
    return factory(details or f"{rpc}: {code.name}")


def _job_id(job_id: int) -> storage_pb2.JobIdRequest:
    return storage_pb2.JobIdRequest(job_id=job_id)


def _target(host: str, port: int) -> str:
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # an IPv6 literal
    return f"{host}:{port}"


def _mebibytes(size: int) -> str:
    return f"{size / (1024 * 1024):g} MiB"
