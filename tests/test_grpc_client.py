"""``GrpcSpider`` and the gRPC server (``docs/spider.md``, gRPC surface), on 127.0.0.1 only.

Against a scripted fake of Spider's storage server: every status code maps to the port error
Spider's Rust client raises, only UNAVAILABLE is retried (and never RegisterJob), the back-off is
Spider's, deadlines bound hanging calls, the 4 MiB limit is checked before sending. Against the
real ``EmbeddedSpider`` behind ``serve``: the port's behaviour survives the trip through gRPC, on
SQLite and on MariaDB.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from sqlalchemy import Engine

from coordinator.engine.embedded.engine import EmbeddedSpider
from coordinator.engine.embedded.faults import Fault
from coordinator.engine.embedded.protocol import in_task_failure
from coordinator.engine.grpc_server import SpiderServer, run_server, serve
from coordinator.spider.grpc.client import MAX_MESSAGE_BYTES, GrpcSpider
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
    cancel_if_safe,
    start_if_ready,
)
from coordinator.spider.wire import compress, encode_job_inputs, encode_job_outputs
from tests.engine_support import graph, policy, running_engine, submit, task, wait_for
from tests.grpc_support import (
    JOB_RPCS,
    RESOURCE_GROUP_RPCS,
    Abort,
    Hang,
    Reply,
    ScriptedSpider,
    grpc_server,
    scripted_server,
    unused_port,
)
from tests.timing import wait_until

LOCALHOST = "127.0.0.1"
PASSWORD = b"compression-coordinator"
DONE = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)
CODES = [code for code in grpc.StatusCode if code is not grpc.StatusCode.OK]

CALLS: dict[str, Callable[[GrpcSpider], Any]] = {
    "RegisterJob": lambda spider: spider.register_job(1, b"graph", b"inputs"),
    "StartJob": lambda spider: spider.start_job(1),
    "CancelJob": lambda spider: spider.cancel_job(1),
    "GetJobState": lambda spider: spider.get_job_state(1),
    "GetJobOutputs": lambda spider: spider.get_job_outputs(1),
    "GetJobError": lambda spider: spider.get_job_error(1),
    "AddResourceGroup": lambda spider: spider.add_resource_group("rg", b"rg"),
    "VerifyResourceGroup": lambda spider: spider.verify_resource_group(1, b"rg"),
}

# docs/spider.md, Client behaviour, written out independently of the client's own tables.
JOB_ERRORS: dict[grpc.StatusCode, type[SpiderError]] = {
    grpc.StatusCode.NOT_FOUND: JobNotFound,
    grpc.StatusCode.FAILED_PRECONDITION: InvalidJobState,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: Unavailable,
}
RESOURCE_GROUP_ERRORS: dict[grpc.StatusCode, type[SpiderError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: Unavailable,
    grpc.StatusCode.ALREADY_EXISTS: ResourceGroupExists,
}


def client(port: int, **settings: Any) -> GrpcSpider:
    """A client with a fast back-off (tests shrink Spider's 100 ms … 3 s schedule)."""
    options: dict[str, Any] = {
        "deadline_secs": 5.0,
        "initial_backoff_secs": 0.001,
        "max_backoff_secs": 0.005,
        "backoff_jitter_secs": 0.0,
        **settings,
    }
    return GrpcSpider(LOCALHOST, port, **options)


@pytest.fixture(scope="module")
def scripted() -> Iterator[tuple[ScriptedSpider, int]]:
    with scripted_server() as served:
        yield served


@pytest.fixture
def fake(scripted: tuple[ScriptedSpider, int]) -> ScriptedSpider:
    scripted[0].reset()
    return scripted[0]


@pytest.fixture
def spider(scripted: tuple[ScriptedSpider, int]) -> Iterator[GrpcSpider]:
    with client(scripted[1], max_retries=2) as grpc_spider:
        yield grpc_spider


# --- (a) status codes → port errors ------------------------------------------------------------


@pytest.mark.parametrize("code", CODES, ids=[code.name for code in CODES])
@pytest.mark.parametrize("rpc", [*JOB_RPCS, *RESOURCE_GROUP_RPCS])
def test_every_status_code_maps_to_spiders_client_error(
    fake: ScriptedSpider, spider: GrpcSpider, rpc: str, code: grpc.StatusCode
) -> None:
    table = JOB_ERRORS if rpc in JOB_RPCS else RESOURCE_GROUP_ERRORS
    expected = table.get(code, ServerError)
    fake.script(rpc, *[Abort(code, f"details of {code.name}")] * 3)
    with pytest.raises(SpiderError) as raised:
        CALLS[rpc](spider)
    assert type(raised.value) is expected
    assert f"details of {code.name}" in str(raised.value)  # the server's details are kept
    assert isinstance(raised.value.__cause__, grpc.RpcError)
    # Only UNAVAILABLE is retried (max_retries=2 here), and never RegisterJob.
    retried = code is grpc.StatusCode.UNAVAILABLE and rpc != "RegisterJob"
    assert fake.count(rpc) == (3 if retried else 1)


@pytest.mark.parametrize("rpc", ["StartJob", "CancelJob", "GetJobState"])
def test_an_unspecified_or_unknown_state_is_refused(
    fake: ScriptedSpider, spider: GrpcSpider, rpc: str
) -> None:
    fake.script(rpc, Reply(storage_pb2.JobStateResponse()))
    with pytest.raises(ServerError, match="JOB_STATE_UNSPECIFIED") as raised:
        CALLS[rpc](spider)
    assert type(raised.value) is ServerError
    fake.script(rpc, Reply(storage_pb2.JobStateResponse.FromString(bytes.fromhex("082a"))))
    with pytest.raises(Unavailable, match="unknown job state 42"):
        CALLS[rpc](spider)
    for state in JobState:
        if state is not JobState.UNSPECIFIED:
            fake.script(rpc, Reply(storage_pb2.JobStateResponse(state=int(state))))
            assert CALLS[rpc](spider) is state


def test_responses_are_decoded(fake: ScriptedSpider, spider: GrpcSpider) -> None:
    fake.script("RegisterJob", Reply(storage_pb2.RegisterJobResponse(job_id=2**64 - 1)))
    assert spider.register_job(2**63 + 1, b"g", b"in") == 2**64 - 1
    request = fake.calls["RegisterJob"][0]
    assert (
        request.SerializeToString()
        == storage_pb2.RegisterJobRequest(
            resource_group_id=2**63 + 1,
            compressed_serialized_task_graph=b"g",
            compressed_serialized_inputs=b"in",
        ).SerializeToString()
    )
    fake.script("AddResourceGroup", Reply(storage_pb2.ResourceGroupIdResponse(resource_group_id=9)))
    assert spider.add_resource_group("clp", b"clp") == 9
    assert fake.calls["AddResourceGroup"][0].external_resource_group_id == "clp"
    spider.verify_resource_group(9, b"clp")
    fake.script("GetJobError", Reply(storage_pb2.JobErrorResponse(error_message="in-task: é")))
    assert spider.get_job_error(3) == "in-task: é"
    assert fake.calls["GetJobError"][0].job_id == 3


@pytest.mark.parametrize(
    "outputs", [[], [b"a", b""], [bytes(range(256)) * 8]], ids=["none", "plain", "zstd"]
)
def test_outputs_are_decoded_from_spiders_frame(
    fake: ScriptedSpider, spider: GrpcSpider, outputs: list[bytes]
) -> None:
    encoded = encode_job_outputs(outputs)
    fake.script("GetJobOutputs", Reply(storage_pb2.JobOutputsResponse(serialized_outputs=encoded)))
    assert spider.get_job_outputs(7) == outputs


def test_undecodable_outputs_are_a_server_error(fake: ScriptedSpider, spider: GrpcSpider) -> None:
    fake.script("GetJobOutputs", Reply(storage_pb2.JobOutputsResponse(serialized_outputs=b"\x02")))
    with pytest.raises(ServerError, match="do not decode.*option byte 2"):
        spider.get_job_outputs(7)


# --- (b) retries -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "deadline_secs", "code"),
    [
        (Abort(grpc.StatusCode.UNAVAILABLE, "storage restarting"), 5.0, "UNAVAILABLE"),
        (Hang(30), 0.3, "DEADLINE_EXCEEDED"),
    ],
    ids=["unavailable", "past its deadline"],
)
def test_register_job_is_attempted_once(
    scripted: Any, fake: ScriptedSpider, answer: Abort | Hang, deadline_secs: float, code: str
) -> None:
    fake.script("RegisterJob", *[answer] * 5)
    pauses: list[float] = []
    with (
        client(
            scripted[1], max_retries=10, deadline_secs=deadline_secs, sleep=pauses.append
        ) as spider,
        pytest.raises(Unavailable, match=rf"{code}.*may or may not have been registered"),
    ):
        spider.register_job(1, b"g", b"in")
    assert pauses == []  # no back-off: no second attempt
    # The one attempt reached the server (a hanging one perhaps only after the client gave up).
    wait_until(lambda: fake.count("RegisterJob") >= 1, what="RegisterJob reaching the server")
    assert fake.count("RegisterJob") == 1


def test_unavailable_is_retried_until_it_succeeds(scripted: Any, fake: ScriptedSpider) -> None:
    fake.script(
        "GetJobState",
        Abort(grpc.StatusCode.UNAVAILABLE, "not yet"),
        Abort(grpc.StatusCode.UNAVAILABLE, "not yet"),
        Reply(storage_pb2.JobStateResponse(state=storage_pb2.READY)),
    )
    pauses: list[float] = []
    with client(scripted[1], max_retries=10, sleep=pauses.append) as spider:
        assert spider.get_job_state(5) is JobState.READY
    assert fake.count("GetJobState") == 3
    assert len(pauses) == 2  # a pause before each retry


def test_retries_give_up_after_the_cap(scripted: Any, fake: ScriptedSpider) -> None:
    fake.script("GetJobState", *[Abort(grpc.StatusCode.UNAVAILABLE, "down")] * 20)
    with (
        client(scripted[1], max_retries=3) as spider,
        pytest.raises(Unavailable, match="after 4 attempts"),
    ):
        spider.get_job_state(5)
    assert fake.count("GetJobState") == 4


def test_the_back_off_is_spiders(scripted: Any, fake: ScriptedSpider) -> None:
    with GrpcSpider(LOCALHOST, scripted[1]) as spider:
        assert (spider.deadline_secs, spider.max_retries) == (10.0, 10)
        pauses = [spider._backoff(attempt) for attempt in range(1, 11)]
    expected = [0.1, 0.2, 0.4, 0.8, 1.6, 3.0, 3.0, 3.0, 3.0, 3.0]  # 100 ms doubling, 3 s cap
    for pause, base in zip(pauses, expected, strict=True):
        assert base <= pause <= base + 0.02  # ≤ 20 ms jitter
    # The client waits those pauses between its attempts (recorded here, not waited).
    fake.script("GetJobState", *[Abort(grpc.StatusCode.UNAVAILABLE, "down")] * 3)
    waited: list[float] = []
    with GrpcSpider(LOCALHOST, scripted[1], sleep=waited.append) as spider:
        assert spider.get_job_state(5) is JobState.READY
    assert fake.count("GetJobState") == 4
    for pause, base in zip(waited, expected[:3], strict=True):
        assert base <= pause <= base + 0.02


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (CALLS["GetJobState"], "after 3 attempts"),
        (CALLS["RegisterJob"], "may or may not have been registered"),
    ],
    ids=["GetJobState", "RegisterJob"],
)
def test_an_unreachable_server_is_unavailable_after_the_retries(
    call: Callable[[GrpcSpider], Any], message: str
) -> None:
    with client(unused_port(), max_retries=2) as spider, pytest.raises(Unavailable, match=message):
        call(spider)


# --- (c) the 4 MiB limit -----------------------------------------------------------------------


def _register_request_of(size: int) -> tuple[bytes, bytes]:
    """A task graph and inputs whose RegisterJobRequest (group 5) serializes to ``size`` bytes."""
    inputs = b"in"
    graph_size = size - 20
    while True:
        graph_bytes = b"g" * graph_size
        request = storage_pb2.RegisterJobRequest(
            resource_group_id=5,
            compressed_serialized_task_graph=graph_bytes,
            compressed_serialized_inputs=inputs,
        )
        if request.ByteSize() == size:
            return graph_bytes, inputs
        graph_size += size - request.ByteSize()


def test_a_register_job_over_4_mib_is_refused_before_sending(
    scripted: Any, fake: ScriptedSpider
) -> None:
    graph_bytes, inputs = _register_request_of(MAX_MESSAGE_BYTES + 1)
    with client(scripted[1]) as spider:
        with pytest.raises(InvalidArgument) as raised:
            spider.register_job(5, graph_bytes, inputs)
        message = str(raised.value)
        assert "too large" in message
        assert f"{MAX_MESSAGE_BYTES + 1} bytes, 1 bytes over" in message
        assert "4 MiB" in message
        assert fake.count("RegisterJob") == 0
        # Exactly 4 MiB is within the limit (grpc's own receive limit agrees).
        graph_bytes, inputs = _register_request_of(MAX_MESSAGE_BYTES)
        assert spider.register_job(5, graph_bytes, inputs) == 1
    assert fake.count("RegisterJob") == 1


def test_an_outputs_response_over_4_mib_is_a_server_error(
    fake: ScriptedSpider, spider: GrpcSpider
) -> None:
    huge = storage_pb2.JobOutputsResponse(serialized_outputs=b"\x00" * (MAX_MESSAGE_BYTES + 10))
    fake.script("GetJobOutputs", Reply(huge))
    with pytest.raises(ServerError, match="RESOURCE_EXHAUSTED"):
        spider.get_job_outputs(1)


# --- (d) deadlines, closing --------------------------------------------------------------------


def test_a_deadline_bounds_a_hanging_call(scripted: Any, fake: ScriptedSpider) -> None:
    fake.script("GetJobState", Hang(30))
    started = time.monotonic()
    with (
        client(scripted[1], deadline_secs=0.5, max_retries=10) as spider,
        pytest.raises(Unavailable, match="DEADLINE_EXCEEDED.*may or may not have taken effect"),
    ):
        spider.get_job_state(1)
    assert 0.4 <= time.monotonic() - started < 3
    assert fake.count("GetJobState") == 1  # a deadline is not retried


def test_a_closed_client_is_unavailable(scripted: Any, fake: ScriptedSpider) -> None:
    spider = client(scripted[1])
    assert spider.get_job_state(1) is JobState.READY
    spider.close()
    spider.close()
    with pytest.raises(Unavailable, match="closed"):
        spider.get_job_state(1)


@pytest.mark.parametrize(
    "settings",
    [
        {"deadline_secs": 0},
        {"max_retries": -1},
        {"initial_backoff_secs": 2.0, "max_backoff_secs": 1.0},
        {"backoff_jitter_secs": -0.1},
    ],
    ids=["deadline", "retries", "back-off", "jitter"],
)
def test_nonsensical_settings_are_refused(settings: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        GrpcSpider(LOCALHOST, 1, **settings)


def test_an_ipv6_host_is_bracketed() -> None:
    assert GrpcSpider("::1", 50051).target == "[::1]:50051"


# --- the server: port errors → Spider's status codes ------------------------------------------


class _FailingPort:
    """A port whose every call raises ``error``."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def __getattr__(self, name: str) -> Any:
        def fail(*_: Any) -> Any:
            raise self.error

        return fail


INTERNAL = "storage service internal error"
SERVER_STATUS = [
    # The details are Spider's: fixed texts for NOT_FOUND (spider-storage/src/grpc.rs:112, :134),
    # UNAUTHENTICATED (:102, :272) and INTERNAL (:420); the error's own text otherwise (:124, :144,
    # :282). The port's explanation of an INTERNAL is logged by the server, not sent.
    (JobNotFound("job 4 not found"), grpc.StatusCode.NOT_FOUND, "job not found"),
    (
        InvalidJobState("job in state Running, expect state Succeeded"),
        grpc.StatusCode.FAILED_PRECONDITION,
        "job in state Running, expect state Succeeded",
    ),
    (InvalidArgument("bad request: no"), grpc.StatusCode.INVALID_ARGUMENT, "bad request: no"),
    (
        Unauthenticated("resource group 'x' exists with another password"),
        grpc.StatusCode.UNAUTHENTICATED,
        "invalid resource group",
    ),
    (
        ResourceGroupExists("resource group 'x' already exists"),
        grpc.StatusCode.ALREADY_EXISTS,
        "resource group 'x' already exists",
    ),
    (Unavailable("down"), grpc.StatusCode.UNAVAILABLE, "down"),
    (ServerError(f"{INTERNAL}: a CommitReady job …"), grpc.StatusCode.INTERNAL, INTERNAL),
    (SpiderError("something else"), grpc.StatusCode.INTERNAL, INTERNAL),
    (RuntimeError("a bug"), grpc.StatusCode.INTERNAL, INTERNAL),
]


@pytest.mark.parametrize(
    ("error", "code", "details"),
    SERVER_STATUS,
    ids=[type(e).__name__ for e, _, _ in SERVER_STATUS],
)
def test_the_server_answers_spiders_status_codes(
    error: Exception, code: grpc.StatusCode, details: str
) -> None:
    server = serve(_FailingPort(error), LOCALHOST, 0)
    try:
        with grpc.insecure_channel(server.address) as channel:
            jobs = storage_pb2_grpc.JobOrchestrationServiceStub(channel)
            groups = storage_pb2_grpc.ResourceGroupManagementServiceStub(channel)
            calls = [
                lambda: jobs.GetJobState(storage_pb2.JobIdRequest(job_id=4), timeout=5),
                lambda: groups.AddResourceGroup(
                    storage_pb2.AddResourceGroupRequest(external_resource_group_id="x"), timeout=5
                ),
            ]
            for call in calls:
                with pytest.raises(grpc.RpcError) as raised:
                    call()
                assert raised.value.code() is code
                assert raised.value.details() == details
    finally:
        server.stop(None)


def test_run_server_serves_until_stopped(tmp_path: Path) -> None:
    stop = threading.Event()
    listening: list[SpiderServer] = []
    thread = threading.Thread(
        target=run_server,
        args=(_FailingPort(JobNotFound("job 1 not found")), LOCALHOST, 0),
        kwargs={"stop": stop, "grace_secs": 1.0, "on_listening": listening.append},
    )
    thread.start()
    try:
        wait_until(lambda: bool(listening))
        assert isinstance(listening[0], grpc.Server)
        assert listening[0].port > 0
        with client(listening[0].port) as spider, pytest.raises(JobNotFound, match="job not found"):
            spider.get_job_state(1)
    finally:
        stop.set()
        thread.join(timeout=10)
    assert not thread.is_alive()
    with client(listening[0].port, max_retries=0) as spider, pytest.raises(Unavailable):
        spider.get_job_state(1)


def test_a_taken_port_is_an_error() -> None:
    with grpc_server() as taken, pytest.raises(OSError, match="cannot listen"):
        serve(_FailingPort(RuntimeError()), LOCALHOST, taken)


def test_spiders_internal_services_are_declared_but_not_served() -> None:
    # The stubs are Spider's whole storage.proto (test_grpc_upstream.py); the server serves only
    # the two services the coordinator calls.
    server = serve(_FailingPort(RuntimeError()), LOCALHOST, 0)
    try:
        with grpc.insecure_channel(server.address) as channel:
            queue = storage_pb2_grpc.InboundQueueServiceStub(channel)
            with pytest.raises(grpc.RpcError) as raised:
                queue.PollReadyTasks(storage_pb2.PollReadyTasksRequest(max_items=1), timeout=5)
            assert raised.value.code() is grpc.StatusCode.UNIMPLEMENTED
    finally:
        server.stop(None)


# --- (e) the embedded engine behind the server --------------------------------------------------


@pytest.fixture
def served(migrated_engine: Engine, tmp_path: Path) -> Iterator[tuple[EmbeddedSpider, GrpcSpider]]:
    """The embedded engine served on 127.0.0.1, and a gRPC client of it."""
    with running_engine(migrated_engine, tmp_path / "worker") as engine:
        server = serve(engine, LOCALHOST, 0)
        try:
            with GrpcSpider(LOCALHOST, server.port, deadline_secs=20) as remote:
                yield engine, remote
        finally:
            server.stop(None)


def test_resource_groups_through_grpc(served: tuple[EmbeddedSpider, GrpcSpider]) -> None:
    _, remote = served
    group = remote.add_resource_group("clp", b"clp")
    with pytest.raises(ResourceGroupExists, match="already exists"):
        remote.add_resource_group("clp", b"clp")
    remote.verify_resource_group(group, b"clp")
    with pytest.raises(Unauthenticated, match="invalid resource group"):
        remote.verify_resource_group(group, b"wrong")
    with pytest.raises(Unauthenticated):
        remote.verify_resource_group(group + 100, b"clp")


@pytest.mark.slow
def test_a_job_runs_to_success_through_grpc(served: tuple[EmbeddedSpider, GrpcSpider]) -> None:
    engine, remote = served
    group = remote.add_resource_group("rg", PASSWORD)
    chained = graph(task("echo"), task("echo"), task("join", inputs=2, sources=[(0, 0), (1, 0)]))
    job_id = submit(remote, group, chained, [b"left", b"right"])
    assert engine.get_job_state(job_id) is JobState.READY  # registered, not started
    assert start_if_ready(remote, job_id) is JobState.RUNNING
    assert wait_for(remote, job_id, *DONE) is JobState.SUCCEEDED
    assert remote.get_job_outputs(job_id) == [b"left+right"]
    with pytest.raises(InvalidJobState, match="job in state Succeeded, expect state Failed"):
        remote.get_job_error(job_id)
    with pytest.raises(ServerError, match="storage service internal error"):
        remote.start_job(job_id)  # not idempotent: INTERNAL for a started job still cached
    assert start_if_ready(remote, job_id) is JobState.SUCCEEDED
    # Outputs over 1 KiB travel zstd-compressed (docs/spider.md, Wire formats).
    large = bytes(range(256)) * 16
    job_id = submit(remote, group, graph(task("echo"), commit=False), [large])
    remote.start_job(job_id)
    assert wait_for(remote, job_id, *DONE) is JobState.SUCCEEDED
    assert remote.get_job_outputs(job_id) == [large]


def test_bad_registrations_and_unknown_jobs_through_grpc(
    served: tuple[EmbeddedSpider, GrpcSpider],
) -> None:
    _, remote = served
    group = remote.add_resource_group("rg", PASSWORD)
    with pytest.raises(InvalidArgument, match="bad request"):
        remote.register_job(group, compress(b'{"tasks": []}'), encode_job_inputs([]))
    with pytest.raises(InvalidArgument, match="input size mismatch"):
        submit(remote, group, graph(task("echo")), [b"a", b"b"])
    with pytest.raises(InvalidArgument, match="bad request"):
        remote.register_job(group, b"not zstd", encode_job_inputs([b"a"]))
    with pytest.raises(Unauthenticated, match="invalid resource group"):
        submit(remote, group + 100, graph(task("echo")), [b"a"])
    unknown = 424242
    for call in (
        remote.get_job_state,
        remote.start_job,
        remote.cancel_job,
        remote.get_job_outputs,
        remote.get_job_error,
    ):
        with pytest.raises(JobNotFound, match="^job not found$"):
            call(unknown)


@pytest.mark.slow
def test_cancel_in_commit_ready_is_refused_through_grpc(
    served: tuple[EmbeddedSpider, GrpcSpider],
) -> None:
    engine, remote = served
    group = remote.add_resource_group("rg", PASSWORD)
    job_id = submit(
        remote, group, graph(task("echo"), commit=policy(soft_ms=1_000, hard_ms=2_000)), [b"a"]
    )
    engine.inject(Fault("hard_timeout", task="commit", job_id=job_id))
    assert start_if_ready(remote, job_id) is JobState.RUNNING
    wait_for(remote, job_id, JobState.COMMIT_READY)
    with pytest.raises(ServerError, match=f"INTERNAL: {INTERNAL}$"):  # fatal on Spider
        remote.cancel_job(job_id)
    assert cancel_if_safe(remote, job_id) is JobState.COMMIT_READY
    assert wait_for(remote, job_id, *DONE) is JobState.FAILED
    assert remote.get_job_error(job_id) == "hard timeout (2000 ms) exceeded"
    with pytest.raises(ServerError, match=f"INTERNAL: {INTERNAL}$"):  # still retained
        remote.get_job_outputs(job_id)


@pytest.mark.slow
def test_failures_and_cancellations_through_grpc(
    served: tuple[EmbeddedSpider, GrpcSpider],
) -> None:
    _, remote = served
    group = remote.add_resource_group("rg", PASSWORD)
    failing = submit(remote, group, graph(task("echo"), task("fail")), [b"a", b"b"])
    remote.start_job(failing)
    assert wait_for(remote, failing, *DONE) is JobState.FAILED
    assert remote.get_job_error(failing) == in_task_failure("boom: the input is unusable")
    ready = submit(remote, group, graph(task("echo")), [b"a"])
    assert remote.cancel_job(ready) is JobState.CANCELLED
    running = submit(remote, group, graph(task("sleep")), [b"30"])
    remote.start_job(running)
    assert remote.cancel_job(running) is JobState.CANCELLED
    with pytest.raises(ServerError, match="storage service internal error"):
        remote.cancel_job(running)  # terminal and still cached: INTERNAL
    with pytest.raises(InvalidJobState, match="job in state Cancelled, expect state Failed"):
        remote.get_job_error(running)  # nothing is stored for Cancelled
