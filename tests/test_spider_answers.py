"""Spider's storage service's answer to each call in each job state, from the embedded engine and
from ``coordinator spider serve`` (issue 11).

Every rule names the upstream file and line it comes from (``spider-upstream/components/``:
``spider-storage/src/grpc.rs`` maps the errors of ``spider-storage/src/cache/job.rs`` to status
codes; ``spider-execution-manager/src/runtime.rs`` writes a failed instance's message). Each test
runs twice: on the engine in-process (the port's exceptions) and on the engine served over gRPC,
where ``GrpcSpider`` must raise the same exceptions and the raw answer must carry Spider's status
code and details. Spider's real storage service (``../shared/spider-storage``, commit 8174d9a0)
answers these very codes and texts.

"Retained" is Spider's job cache: unfinished jobs, and terminal ones for
``terminated_job_retention_sec`` (300 s, as Spider's default); a terminal job past it is "evicted"
and answered from the database. The tests evict on demand (``_evict``) instead of waiting. The one
deliberate difference: where Spider's storage service meets a fatal internal error and shuts itself
down, the engine answers the same INTERNAL and carries on.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from sqlalchemy import Engine

from coordinator.engine.embedded.engine import EmbeddedSpider
from coordinator.engine.embedded.faults import Fault
from coordinator.engine.embedded.protocol import in_task_failure
from coordinator.engine.grpc_server import serve
from coordinator.spider.grpc.client import GrpcSpider
from coordinator.spider.grpc.generated.storage import storage_pb2, storage_pb2_grpc
from coordinator.spider.port import (
    InvalidJobState,
    JobNotFound,
    JobState,
    ServerError,
    SpiderError,
    SpiderPort,
)
from tests.engine_support import graph, running_engine, submit, task, wait_for, wait_for_journal

pytestmark = pytest.mark.slow  # every test runs jobs on a real engine, in-process and over gRPC

LOCALHOST = "127.0.0.1"
PASSWORD = b"compression-coordinator"
DONE = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)
UNKNOWN = 424242
INTERNAL = "storage service internal error"
"""grpc.rs:420: every INTERNAL, whatever the cause."""
NOT_FOUND = "job not found"
"""grpc.rs:112, :134."""
SLEEP = b"30"
"""How long a ``sleep`` task runs: past every test (the engine kills it when it closes)."""

CALLS: dict[str, Callable[[SpiderPort, int], Any]] = {
    "GetJobState": lambda spider, job: spider.get_job_state(job),
    "StartJob": lambda spider, job: spider.start_job(job),
    "CancelJob": lambda spider, job: spider.cancel_job(job),
    "GetJobOutputs": lambda spider, job: spider.get_job_outputs(job),
    "GetJobError": lambda spider, job: spider.get_job_error(job),
}


@dataclass
class Answering:
    """The engine, the port the test calls (the engine, or ``GrpcSpider`` on it), and a raw stub
    on the served engine (``None`` in-process)."""

    engine: EmbeddedSpider
    port: SpiderPort
    stub: Any
    directory: Path

    def submit(self, *tasks: Any, cleanup: bool = False, input: bytes = b"in") -> int:
        """A new Ready job of the ``tasks`` (one ``input`` each)."""
        group = self.engine.resource_group_by_name("rg", PASSWORD)
        return submit(self.port, group, graph(*tasks, cleanup=cleanup), [input] * len(tasks))

    def run(
        self,
        *tasks: Any,
        cleanup: bool = False,
        input: bytes = b"in",
        faults: tuple[Fault, ...] = (),
    ) -> int:
        """A new job of the ``tasks``, its ``faults`` injected, started."""
        job_id = self.submit(*tasks, cleanup=cleanup, input=input)
        for fault in faults:
            fault.job_id = job_id
            self.engine.inject(fault)
        assert self.port.start_job(job_id) is JobState.RUNNING
        return job_id

    def refuses(
        self,
        rpc: str,
        job_id: int,
        error: type[SpiderError],
        code: grpc.StatusCode,
        details: str | None = None,
    ) -> None:
        """``rpc`` raises exactly ``error``; the raw answer is ``code`` with ``details`` (when
        given). A refusal changes nothing, so asking twice is harmless."""
        with pytest.raises(error) as raised:
            CALLS[rpc](self.port, job_id)
        assert type(raised.value) is error, raised.value
        if self.stub is None:
            return
        with pytest.raises(grpc.RpcError) as status:
            getattr(self.stub, rpc)(storage_pb2.JobIdRequest(job_id=job_id), timeout=20)
        assert status.value.code() is code
        if details is not None:
            assert status.value.details() == details


@pytest.fixture(params=["in-process", "grpc"])
def answering(
    request: pytest.FixtureRequest, migrated_engine: Engine, tmp_path: Path
) -> Iterator[Answering]:
    directory = tmp_path / "worker"
    # Three workers: a test holds up to two with instances that hang (the engine kills them).
    with running_engine(migrated_engine, directory, workers=3) as engine:
        if request.param == "in-process":
            yield Answering(engine, engine, None, directory)
            return
        server = serve(engine, LOCALHOST, 0)
        try:
            with (
                GrpcSpider(LOCALHOST, server.port, deadline_secs=20) as remote,
                grpc.insecure_channel(server.address) as channel,
            ):
                stub = storage_pb2_grpc.JobOrchestrationServiceStub(channel)
                yield Answering(engine, remote, stub, directory)
        finally:
            server.stop(None)


def _evict(answering: Answering, *job_ids: int) -> None:
    """Let the terminal jobs ``job_ids`` pass the retention now: the engine's monitor forgets them
    (a test seam: the retention is the engine's private setting)."""
    engine = answering.engine
    retention = engine._retention
    engine._retention = 0.0
    try:
        deadline = time.monotonic() + 10
        while any(job_id in engine._jobs for job_id in job_ids):
            assert time.monotonic() < deadline, f"jobs {job_ids} stay retained"
            time.sleep(0.02)
    finally:
        engine._retention = retention


def test_an_unknown_job_is_not_found_by_every_call(answering: Answering) -> None:
    # grpc.rs:105-113 (the database's JobNotFound) and :127-135 (not in the cache): NOT_FOUND,
    # "job not found", for every job call.
    for rpc in CALLS:
        answering.refuses(rpc, UNKNOWN, JobNotFound, grpc.StatusCode.NOT_FOUND, NOT_FOUND)


def test_start_job_starts_only_a_ready_job(answering: Answering) -> None:
    port = answering.port
    # grpc.rs:491-500: a started job is answered RUNNING.
    job_id = answering.run(task("echo"))
    # cache/job.rs:1227-1231, ensure_ready: any other state is a stale state (JobAlreadyStarted),
    # which the default handler answers INTERNAL (grpc.rs:147, :420), not FAILED_PRECONDITION.
    answering.refuses("StartJob", job_id, ServerError, grpc.StatusCode.INTERNAL, INTERNAL)
    assert wait_for(port, job_id, *DONE) is JobState.SUCCEEDED
    answering.refuses("StartJob", job_id, ServerError, grpc.StatusCode.INTERNAL, INTERNAL)
    cancelled = answering.submit(task("echo"))
    assert port.cancel_job(cancelled) is JobState.CANCELLED
    answering.refuses("StartJob", cancelled, ServerError, grpc.StatusCode.INTERNAL, INTERNAL)
    # A terminal job no longer retained is not in the cache, the only place StartJob looks:
    # NOT_FOUND (grpc.rs:127-135), though GetJobState still answers it from the database.
    _evict(answering, job_id, cancelled)
    for evicted, state in ((job_id, JobState.SUCCEEDED), (cancelled, JobState.CANCELLED)):
        answering.refuses("StartJob", evicted, JobNotFound, grpc.StatusCode.NOT_FOUND, NOT_FOUND)
        assert port.get_job_state(evicted) is state


def test_cancel_job_answers_spiders_table_in_each_state(answering: Answering) -> None:
    port = answering.port
    # cache/job.rs:624-646, cancel: Ready and Running without a cleanup task → Cancelled; with one
    # (Running, CommitReady) → CleanupReady, the cleanup task queued. cache/job.rs:1193-1204,
    # ensure_cancellable: CleanupReady, Cancelled and the other terminal states are stale states,
    # answered INTERNAL (grpc.rs:420), the state unchanged.
    hang = Fault("hard_timeout", task="commit"), Fault("hard_timeout", task="cleanup")
    committing = answering.run(task("echo"), cleanup=True, faults=hang)
    wait_for(port, committing, JobState.COMMIT_READY)
    assert port.cancel_job(committing) is JobState.CLEANUP_READY
    answering.refuses("CancelJob", committing, ServerError, grpc.StatusCode.INTERNAL, INTERNAL)
    assert port.get_job_state(committing) is JobState.CLEANUP_READY
    ready = answering.submit(task("echo"))
    assert port.cancel_job(ready) is JobState.CANCELLED
    answering.refuses("CancelJob", ready, ServerError, grpc.StatusCode.INTERNAL, INTERNAL)
    succeeded = answering.run(task("echo"))
    assert wait_for(port, succeeded, *DONE) is JobState.SUCCEEDED
    answering.refuses("CancelJob", succeeded, ServerError, grpc.StatusCode.INTERNAL, INTERNAL)
    running = answering.run(task("sleep"), input=SLEEP)
    wait_for_journal(answering.directory, running, "start")
    assert port.cancel_job(running) is JobState.CANCELLED
    answering.refuses("CancelJob", running, ServerError, grpc.StatusCode.INTERNAL, INTERNAL)
    # A terminal job no longer retained: its state, read from the database, as a success.
    _evict(answering, ready, running, succeeded)
    assert port.cancel_job(ready) is JobState.CANCELLED
    assert port.cancel_job(running) is JobState.CANCELLED
    assert port.cancel_job(succeeded) is JobState.SUCCEEDED


def test_where_spider_would_shut_down_the_engine_answers_internal_and_carries_on(
    answering: Answering,
) -> None:
    port = answering.port
    # grpc.rs:380-387: a cache-layer internal error is answered INTERNAL, then Spider's storage
    # service cancels itself. The engine answers the same and changes nothing.
    # docs/spider.md, Cancellation: CancelJob of a Ready job with a cleanup task (the database
    # refuses Ready → CleanupReady).
    ready = answering.submit(task("echo"), cleanup=True)
    answering.refuses("CancelJob", ready, ServerError, grpc.StatusCode.INTERNAL, INTERNAL)
    assert port.get_job_state(ready) is JobState.READY
    # Cancellation: CancelJob of a CommitReady job without a cleanup task (→ Cancelled refused).
    committing = answering.run(task("echo"), faults=(Fault("hard_timeout", task="commit"),))
    wait_for(port, committing, JobState.COMMIT_READY)
    answering.refuses("CancelJob", committing, ServerError, grpc.StatusCode.INTERNAL, INTERNAL)
    assert port.get_job_state(committing) is JobState.COMMIT_READY
    # cache/job.rs:226-229 and :1172, ensure_succeeded: the outputs of a retained job that has not
    # succeeded.
    answering.refuses("GetJobOutputs", committing, ServerError, grpc.StatusCode.INTERNAL, INTERNAL)
    # Still serving: the Ready job runs to its end.
    assert port.start_job(ready) is JobState.RUNNING
    assert wait_for(port, ready, *DONE) is JobState.SUCCEEDED


def test_get_job_outputs_answers_only_for_a_succeeded_job(answering: Answering) -> None:
    port = answering.port
    # A retained job's outputs are read from the cache, whose ensure_succeeded
    # (cache/job.rs:226-229, :1172-1178) raises an internal error: INTERNAL (on Spider a fatal
    # one).
    running = answering.run(task("sleep"), input=SLEEP)
    answering.refuses("GetJobOutputs", running, ServerError, grpc.StatusCode.INTERNAL, INTERNAL)
    failed = answering.run(task("fail"))
    assert wait_for(port, failed, *DONE) is JobState.FAILED
    answering.refuses("GetJobOutputs", failed, ServerError, grpc.StatusCode.INTERNAL, INTERNAL)
    succeeded = answering.run(task("echo"), task("echo"))
    assert wait_for(port, succeeded, *DONE) is JobState.SUCCEEDED
    assert port.get_job_outputs(succeeded) == [b"in", b"in"]
    # No longer retained: read from the database, which refuses a state other than Succeeded with
    # an UnexpectedJobState: FAILED_PRECONDITION carrying its text (grpc.rs:115-125).
    _evict(answering, failed, succeeded)
    answering.refuses(
        "GetJobOutputs",
        failed,
        InvalidJobState,
        grpc.StatusCode.FAILED_PRECONDITION,
        "job in state Failed, expect state Succeeded",
    )
    assert port.get_job_outputs(succeeded) == [b"in", b"in"]


def test_get_job_error_answers_only_for_a_failed_job(answering: Answering) -> None:
    port = answering.port
    # GetJobError always reads the database: any state but Failed is its UnexpectedJobState,
    # FAILED_PRECONDITION with its text (grpc.rs:115-125), retained or not; nothing is stored for
    # a cancelled job.
    ready = answering.submit(task("echo"))
    running = answering.run(task("sleep"), input=SLEEP)
    succeeded = answering.run(task("echo"))
    failed = answering.run(task("fail"))
    cancelled = answering.submit(task("echo"))
    assert port.cancel_job(cancelled) is JobState.CANCELLED
    assert wait_for(port, succeeded, *DONE) is JobState.SUCCEEDED
    assert wait_for(port, failed, *DONE) is JobState.FAILED
    expected = {
        ready: "Ready",
        running: "Running",
        succeeded: "Succeeded",
        cancelled: "Cancelled",
    }

    def check() -> None:
        for job_id, state in expected.items():
            answering.refuses(
                "GetJobError",
                job_id,
                InvalidJobState,
                grpc.StatusCode.FAILED_PRECONDITION,
                f"job in state {state}, expect state Failed",
            )
        assert port.get_job_error(failed) == in_task_failure("boom: the input is unusable")

    check()
    _evict(answering, succeeded, failed, cancelled)
    check()


def test_an_in_task_failure_reads_as_spiders_execution_manager_writes_it() -> None:
    # runtime.rs:554-555: "in-task failure: " + String::from_utf8_lossy(rmp_serde(ExecutorError)),
    # a task's error being TaskError(ExecutionError(message)) (docs/spider.md, Job error messages):
    # 81 a9 "TaskError" 81 ae "ExecutionError" a9 "disk full", each byte that is no valid UTF-8
    # becoming U+FFFD ("��TaskError��ExecutionError�disk full").
    assert in_task_failure("disk full") == (
        "in-task failure: \ufffd\ufffdTaskError\ufffd\ufffdExecutionError\ufffddisk full"
    )
    # 32 bytes or more: str8 (d9 <length>), whose length byte leaks (45 bytes → "-").
    message = "clp-s exited with exit status 2: input is bad"
    assert len(message.encode()) == 45
    assert in_task_failure(message) == (
        f"in-task failure: \ufffd\ufffdTaskError\ufffd\ufffdExecutionError\ufffd-{message}"
    )
    # 256 bytes or more: str16 (da <length, 2 bytes>): 300 = 01 2c.
    long = "x" * 300
    assert in_task_failure(long) == (
        f"in-task failure: \ufffd\ufffdTaskError\ufffd\ufffdExecutionError\ufffd\x01,{long}"
    )
    # Valid UTF-8 in the message stays as it is.
    assert in_task_failure("é").endswith("\ufffdé")


def test_a_failed_task_reports_spiders_in_task_failure(answering: Answering) -> None:
    port = answering.port
    failed = answering.run(task("fail"))
    assert wait_for(port, failed, *DONE) is JobState.FAILED
    assert port.get_job_error(failed) == (
        "in-task failure: \ufffd\ufffdTaskError\ufffd\ufffdExecutionError\ufffd"
        "boom: the input is unusable"
    )
