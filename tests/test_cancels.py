"""Cancels are exact, CancelJob never reaches a job Spider cannot cancel, finalising needs evidence.

Real clp-s on the embedded engine, in-process and over Spider's gRPC protocol, on SQLite and
MariaDB. Each scenario reproduces an attack on the coordinator of before:

* a coordinator paused past its lease while a cancel was requested: the new owner logged "cancel
  requested" (the job was CommitReady, so nothing was sent) and the job ended Succeeded;
* the job reaching CommitReady between the coordinator's state read and its CancelJob: CancelJob
  reached a CommitReady job without a cleanup task (a real Spider shuts its storage down);
* a Committed job finalised Succeeded although none (or only some) of its archives were published.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, delete, event, update

from coordinator.config.loader import CoordinatorConfig, load_config
from coordinator.engine.embedded.faults import Fault
from coordinator.lifecycle import JobStatus
from coordinator.lifecycle.reactions import CANCELLED_BY_FENCE
from coordinator.runtime import Runtime, cleanup_task_of
from coordinator.service.ingest import submit_job
from coordinator.service.submitter import CANCELLED_BEFORE_SUBMISSION
from coordinator.spider.port import JobState, ServerError, SpiderPort, Unavailable
from coordinator.store.clock import utc_now
from coordinator.store.datasets import archives_table, files_table
from coordinator.store.jobs import job_state
from coordinator.store.leases import request_cancel
from coordinator.store.schema import compression_jobs as _jobs
from tests.engine_support import wait_for
from tests.service_support import (
    TRANSPORTS,
    SpiderProxy,
    archive_files,
    coordinator_with,
    embedded,
    job_row,
    published,
    put_logs,
    records,
    runtime_over,
    tick_until,
    triggers,
    with_target_archive_size,
)

pytestmark = pytest.mark.slow  # jobs through the loop on a real engine

DATASET = "web"
SPIDER_CANCELLED = "The Spider compression job was cancelled."
WITHDRAWN = " The published archives were withdrawn."
REMAINDER_WITHDRAWN = " Whatever of them was still published was withdrawn."
UNPUBLISHED_TEXT = "Spider reports success but the job's archives are not published: "
FATAL = "would shut down"
"""What the embedded engine says when it refuses a CancelJob on which a real Spider's storage
server would shut down (CommitReady without a cleanup task, Ready with one)."""
TERMINAL = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


@pytest.fixture(params=TRANSPORTS)
def transport(request: pytest.FixtureRequest) -> str:
    """Every scenario runs twice: engine in-process, and over Spider's gRPC protocol."""
    return str(request.param)


@pytest.fixture
def two_objects(config: CoordinatorConfig, tmp_path: Path) -> CoordinatorConfig:
    """Two log files, one task each, and a commit that Spider kills after 4 s when it hangs."""
    put_logs(config, tmp_path, ["svc0", "svc1"])
    settings = config.compression_coordinator.model_copy(
        update={"commit_task_soft_timeout_secs": 2, "commit_task_hard_timeout_secs": 4}
    )
    config = with_target_archive_size(config, 1)
    return dataclasses.replace(
        config, clp=config.clp.model_copy(update={"compression_coordinator": settings})
    )


def _spider_id(rt: Runtime, job_id: int) -> int:
    spider_id = job_row(rt, job_id).spider_id
    assert spider_id is not None
    return spider_id


def _status(rt: Runtime, job_id: int) -> JobStatus:
    return job_state(job_row(rt, job_id))


def _ended(rt: Runtime, job_id: int) -> bool:
    return _status(rt, job_id).is_terminal


class _RefusalRecorder(SpiderProxy):
    """Records every CancelJob a real Spider would have answered by shutting its storage down."""

    def __init__(self, inner: SpiderPort) -> None:
        super().__init__(inner)
        self.fatal: list[str] = []
        self.cancelled_in: list[JobState] = []

    def cancel_job(self, job_id: int) -> JobState:
        self.cancelled_in.append(self.inner.get_job_state(job_id))
        try:
            return self.inner.cancel_job(job_id)
        except ServerError as error:
            if FATAL in str(error):
                self.fatal.append(str(error))
            raise


class _CommitReadyBeforeCancel(_RefusalRecorder):
    """Forces the interleaving: between the coordinator's state read and its CancelJob, the job's
    last task succeeds and the job becomes CommitReady (the commit then hangs)."""

    def cancel_job(self, job_id: int) -> JobState:
        wait_for(self.inner, job_id, JobState.COMMIT_READY, *TERMINAL, timeout=30)
        return super().cancel_job(job_id)


class _HeldStart(_RefusalRecorder):
    """StartJob is unavailable until ``release`` is set (the job stays Ready meanwhile)."""

    def __init__(self, inner: SpiderPort) -> None:
        super().__init__(inner)
        self.release = threading.Event()

    def start_job(self, job_id: int) -> JobState:
        if not self.release.is_set():
            raise Unavailable("injected: StartJob unavailable")
        return self.inner.start_job(job_id)


@pytest.fixture
def rt(two_objects: CoordinatorConfig, transport: str) -> Iterator[Runtime]:
    """The runtime, its coordinator holding leases of 0.5 s (a pause soon outlives them)."""
    with runtime_over(transport, two_objects, 0.5) as runtime:
        yield runtime


# --- 1. cancels are exact ------------------------------------------------------------------------


def test_a_cancel_after_the_commit_survives_a_takeover_and_rolls_the_job_back(
    rt: Runtime, two_objects: CoordinatorConfig
) -> None:
    config = two_objects
    job_id = submit_job(config, rt.engine, dataset=DATASET, timestamp_key="timestamp")
    # The commit publishes, then hangs: the job is Committed and Spider still CommitReady.
    embedded(rt).inject(Fault("hard_timeout", task="commit", after_effects=True))
    paused = rt.coordinator
    tick_until(paused, lambda: _status(rt, job_id) is JobStatus.COMMITTED)
    spider_id = _spider_id(rt, job_id)
    assert rt.spider.get_job_state(spider_id) is JobState.COMMIT_READY
    assert len(published(rt.engine, DATASET, spider_id)) == 2

    # The coordinator pauses past its lease; an operator asks to cancel; another one takes over.
    assert request_cancel(rt.engine, job_id, rt.store.clock())
    spider = _RefusalRecorder(rt.spider)
    successor = coordinator_with(rt, spider=spider, instance_id="coordinator-b")
    tick_until(successor, lambda: _ended(rt, job_id), timeout=20)

    row = job_row(rt, job_id)
    assert (row.status, row.status_msg) == (JobStatus.KILLED, SPIDER_CANCELLED + WITHDRAWN)
    history = rt.store.history(job_id)
    assert [m.trigger for m in history] == ["submitted", "committed", "rolled_back"]
    assert history[-1].actor_id == "coordinator-b"
    assert spider.cancelled_in == [JobState.COMMIT_READY] and spider.fatal == []
    assert rt.spider.get_job_state(spider_id) is JobState.CANCELLED
    assert published(rt.engine, DATASET, spider_id) == []
    assert records(rt.engine, spider_id) == [] and archive_files(config, DATASET) == set()

    # The paused coordinator wakes up: its lease is gone, it writes nothing.
    paused.tick()
    assert job_id not in paused.driven
    assert triggers(rt, job_id) == ["submitted", "committed", "rolled_back"]


def test_a_cancel_of_a_recorded_job_spider_has_not_started_is_delivered(
    rt: Runtime, two_objects: CoordinatorConfig
) -> None:
    """Guards the one state a cleanup task makes fatal: the Ready job is started, then cancelled."""
    job_id = submit_job(two_objects, rt.engine, dataset=DATASET, timestamp_key="timestamp")
    spider = _HeldStart(rt.spider)
    coordinator = coordinator_with(rt, spider=spider)
    tick_until(coordinator, lambda: _status(rt, job_id) is JobStatus.RUNNING)
    spider_id = _spider_id(rt, job_id)
    assert rt.spider.get_job_state(spider_id) is JobState.READY
    assert request_cancel(rt.engine, job_id, rt.store.clock())
    coordinator.tick()  # StartJob still unavailable: nothing is cancelled in Ready
    assert spider.cancelled_in == [] and not _ended(rt, job_id)

    spider.release.set()
    tick_until(coordinator, lambda: _ended(rt, job_id), timeout=20)
    row = job_row(rt, job_id)
    assert (row.status, row.status_msg) == (JobStatus.KILLED, SPIDER_CANCELLED)
    assert spider.fatal == [] and JobState.READY not in spider.cancelled_in
    assert rt.spider.get_job_state(spider_id) is JobState.CANCELLED


# --- 2. CancelJob never reaches a job Spider cannot cancel ----------------------------------------


def test_cancel_job_is_safe_when_the_job_reaches_commit_ready_after_the_state_read(
    rt: Runtime, two_objects: CoordinatorConfig
) -> None:
    config = two_objects
    job_id = submit_job(config, rt.engine, dataset=DATASET, timestamp_key="timestamp")
    embedded(rt).inject(Fault("hard_timeout", task="commit"))  # the job stays CommitReady
    spider = _CommitReadyBeforeCancel(rt.spider)
    coordinator = coordinator_with(rt, spider=spider)
    tick_until(coordinator, lambda: _status(rt, job_id) is JobStatus.RUNNING)
    assert request_cancel(rt.engine, job_id, rt.store.clock())
    tick_until(coordinator, lambda: _ended(rt, job_id), timeout=20)

    assert spider.fatal == [], "CancelJob reached a job Spider cannot cancel"
    assert spider.cancelled_in == [JobState.COMMIT_READY]  # the interleaving was forced
    row = job_row(rt, job_id)
    assert (row.status, row.status_msg) == (JobStatus.KILLED, SPIDER_CANCELLED)
    assert triggers(rt, job_id) == ["submitted", "killed"]
    spider_id = _spider_id(rt, job_id)
    assert rt.spider.get_job_state(spider_id) is JobState.CANCELLED
    assert published(rt.engine, DATASET, spider_id) == []
    assert records(rt.engine, spider_id) == [] and archive_files(config, DATASET) == set()


def test_without_a_cleanup_task_a_running_job_is_fenced_and_its_commit_refuses(
    rt: Runtime, two_objects: CoordinatorConfig
) -> None:
    """CLP's own graphs (no cleanup task): a started job may reach CommitReady between any state
    read and CancelJob, where a real Spider shuts its storage down, so it is never sent CancelJob.
    Before, the cancel waited for Spider's outcome (and with CLP's commit, which writes SUCCEEDED
    itself, it was lost). Now the row is fenced at once: Running → Killed, after which the
    commit, run when the job is CommitReady, refuses and publishes nothing."""
    config = two_objects
    job_id = submit_job(config, rt.engine, dataset=DATASET, timestamp_key="timestamp")
    embedded(rt).inject(Fault("hard_timeout", task="commit"))  # CommitReady until the retry
    spider = _RefusalRecorder(rt.spider)
    coordinator = coordinator_with(rt, spider=spider, cleanup_task=False)
    tick_until(coordinator, lambda: _status(rt, job_id) is JobStatus.RUNNING)
    spider_id = _spider_id(rt, job_id)
    assert wait_for(rt.spider, spider_id, JobState.COMMIT_READY) is JobState.COMMIT_READY
    assert request_cancel(rt.engine, job_id, rt.store.clock())
    tick_until(coordinator, lambda: _ended(rt, job_id), timeout=20)

    row = job_row(rt, job_id)
    assert (row.status, row.status_msg) == (JobStatus.KILLED, CANCELLED_BY_FENCE)
    assert triggers(rt, job_id) == ["submitted", "fenced"]
    assert spider.cancelled_in == [] and spider.fatal == []
    # The commit's retry finds the row Killed and refuses: Spider fails the job, the row stays.
    assert wait_for(rt.spider, spider_id, *TERMINAL, timeout=30) is JobState.FAILED
    assert "refusing to commit" in rt.spider.get_job_error(spider_id)
    coordinator.tick()
    assert (job_row(rt, job_id).status, triggers(rt, job_id)) == (
        JobStatus.KILLED,
        ["submitted", "fenced"],
    )
    assert published(rt.engine, DATASET, spider_id) == []
    assert records(rt.engine, spider_id) == [] and archive_files(config, DATASET) == set()


def test_without_a_cleanup_task_a_committed_job_is_rolled_back_at_once(
    rt: Runtime, two_objects: CoordinatorConfig
) -> None:
    """The coordinator's own commit made the row Committed while the coordinator still saw it
    Running: the fence loses that race, and the same tick rolls the Committed job back (before
    Spider's success could finalise it)."""
    config = two_objects
    job_id = submit_job(config, rt.engine, dataset=DATASET, timestamp_key="timestamp")
    spider = _RefusalRecorder(rt.spider)
    coordinator = coordinator_with(rt, spider=spider, cleanup_task=False)
    tick_until(coordinator, lambda: _status(rt, job_id) is not JobStatus.PENDING)
    spider_id = _spider_id(rt, job_id)
    # The coordinator is not ticked: Spider finishes, the commit publishes.
    assert wait_for(rt.spider, spider_id, *TERMINAL) is JobState.SUCCEEDED
    assert _status(rt, job_id) is JobStatus.COMMITTED
    assert len(published(rt.engine, DATASET, spider_id)) == 2
    assert request_cancel(rt.engine, job_id, rt.store.clock())
    coordinator.tick()

    row = job_row(rt, job_id)
    assert (row.status, row.status_msg) == (JobStatus.KILLED, CANCELLED_BY_FENCE + WITHDRAWN)
    assert triggers(rt, job_id) == ["submitted", "committed", "rolled_back"]
    assert spider.cancelled_in == [] and spider.fatal == []
    assert published(rt.engine, DATASET, spider_id) == []
    assert records(rt.engine, spider_id) == [] and archive_files(config, DATASET) == set()


def test_without_a_cleanup_task_a_recorded_job_spider_has_not_started_is_cancelled_in_ready(
    rt: Runtime, two_objects: CoordinatorConfig
) -> None:
    """Ready is the one state only StartJob moves on: without a cleanup task, Spider cancels it
    (→ Cancelled) and nothing races, so the job is not started first; the row is fenced first."""
    job_id = submit_job(two_objects, rt.engine, dataset=DATASET, timestamp_key="timestamp")
    spider = _HeldStart(rt.spider)
    coordinator = coordinator_with(rt, spider=spider, cleanup_task=False)
    tick_until(coordinator, lambda: _status(rt, job_id) is JobStatus.RUNNING)
    spider_id = _spider_id(rt, job_id)
    assert rt.spider.get_job_state(spider_id) is JobState.READY
    assert request_cancel(rt.engine, job_id, rt.store.clock())
    tick_until(coordinator, lambda: _ended(rt, job_id), timeout=20)

    assert spider.cancelled_in == [JobState.READY] and spider.fatal == []
    row = job_row(rt, job_id)
    assert (row.status, row.status_msg) == (JobStatus.KILLED, CANCELLED_BY_FENCE)
    assert triggers(rt, job_id) == ["submitted", "fenced"]
    assert rt.spider.get_job_state(spider_id) is JobState.CANCELLED


# --- 3. finalising needs evidence -----------------------------------------------------------------


@pytest.mark.parametrize("removed", ["all", "one"])
def test_a_committed_job_whose_published_archives_were_deleted_ends_failed(
    rt: Runtime, two_objects: CoordinatorConfig, removed: str
) -> None:
    config = two_objects
    job_id = submit_job(config, rt.engine, dataset=DATASET, timestamp_key="timestamp")
    tick_until(rt.coordinator, lambda: _status(rt, job_id) is not JobStatus.PENDING)
    spider_id = _spider_id(rt, job_id)
    # The coordinator is not ticked: Spider finishes; the rows are deleted before the next poll.
    assert wait_for(rt.spider, spider_id, *TERMINAL) is JobState.SUCCEEDED
    assert _status(rt, job_id) is JobStatus.COMMITTED
    rows = published(rt.engine, DATASET, spider_id)
    assert len(rows) == 2
    gone = [r.id for r in rows] if removed == "all" else [rows[0].id]
    with rt.engine.begin() as connection:
        connection.execute(
            delete(files_table(DATASET)).where(files_table(DATASET).c.archive_id.in_(gone))
        )
        connection.execute(
            delete(archives_table(DATASET)).where(archives_table(DATASET).c.id.in_(gone))
        )
    tick_until(rt.coordinator, lambda: _ended(rt, job_id), timeout=20)

    row = job_row(rt, job_id)
    if removed == "all":
        gap = "none of its archives is published"
    else:
        kept = rows[1]
        gap = (
            f"its 1 published archive(s) total {kept.size} bytes but the commit published "
            f"{row.compressed_size} bytes (some were removed)"
        )
    assert (row.status, row.status_msg) == (
        JobStatus.FAILED,
        f"{UNPUBLISHED_TEXT}{gap}." + REMAINDER_WITHDRAWN,
    )
    assert triggers(rt, job_id) == ["submitted", "committed", "rolled_back"]
    assert published(rt.engine, DATASET, spider_id) == []
    assert records(rt.engine, spider_id) == [] and archive_files(config, DATASET) == set()


def test_a_commit_marker_without_archives_is_not_finalised(
    rt: Runtime, two_objects: CoordinatorConfig
) -> None:
    config = two_objects
    job_id = submit_job(config, rt.engine, dataset=DATASET, timestamp_key="timestamp")
    spider = _HeldStart(rt.spider)
    coordinator = coordinator_with(rt, spider=spider)
    tick_until(coordinator, lambda: _status(rt, job_id) is JobStatus.RUNNING)
    # Before any task runs, another writer marks the row Committed (no archive is published).
    with rt.engine.begin() as connection:
        connection.execute(update(_jobs).where(_jobs.c.id == job_id).values(committed_at=utc_now()))
    assert _status(rt, job_id) is JobStatus.COMMITTED
    spider.release.set()
    tick_until(coordinator, lambda: _ended(rt, job_id), timeout=20)

    spider_id = _spider_id(rt, job_id)
    assert rt.spider.get_job_state(spider_id) is JobState.SUCCEEDED  # its commit did nothing
    row = job_row(rt, job_id)
    assert (row.status, row.status_msg) == (
        JobStatus.FAILED,
        f"{UNPUBLISHED_TEXT}none of its archives is published." + REMAINDER_WITHDRAWN,
    )
    assert triggers(rt, job_id) == ["submitted", "rolled_back"]
    assert published(rt.engine, DATASET, spider_id) == []
    assert records(rt.engine, spider_id) == [] and archive_files(config, DATASET) == set()


def test_the_cleanup_task_follows_the_engine_unless_configured(tmp_path: Path) -> None:
    """CLP's own task package (on a Spider cluster) has no compression::cleanup: graphs for a
    cluster are CLP's exactly unless ``coordinator.cleanup_task`` says the workers run ours."""
    embedded = load_config(None, data_dir=tmp_path / "var")
    cluster = dataclasses.replace(embedded, engine="spider")
    ours = dataclasses.replace(
        cluster, extras=cluster.extras.model_copy(update={"cleanup_task": True})
    )
    plain = dataclasses.replace(
        embedded, extras=embedded.extras.model_copy(update={"cleanup_task": False})
    )
    assert [cleanup_task_of(c) for c in (embedded, cluster, ours, plain)] == [
        True,
        False,
        True,
        False,
    ]


# --- 3. a submission never wins over a cancel request --------------------------------------------


class _CancelledWhileRegistering(_RefusalRecorder):
    """An operator asks to cancel job ``job_id`` while its RegisterJob is under way."""

    def __init__(self, inner: SpiderPort, rt: Runtime, job_id: int) -> None:
        super().__init__(inner)
        self.rt, self.job_id = rt, job_id
        self.registered: list[int] = []
        self.started: list[int] = []
        self.cancel_at = 1
        """The registration (counted from 1) during which the cancel is requested."""

    def register_job(self, *args: object, **kwargs: object) -> int:
        spider_id = self.inner.register_job(*args, **kwargs)  # type: ignore[arg-type]
        self.registered.append(spider_id)
        if len(self.registered) == self.cancel_at:
            assert request_cancel(self.rt.engine, self.job_id, self.rt.store.clock())
        return spider_id

    def start_job(self, job_id: int) -> JobState:
        self.started.append(job_id)
        return self.inner.start_job(job_id)


def test_a_cancel_request_made_during_the_submission_refuses_the_submitted_move(
    rt: Runtime, two_objects: CoordinatorConfig
) -> None:
    """The ``submitted`` move is guarded by ``cancel_requested_at IS NULL``: the registered Spider
    job is abandoned Ready, never started, and the job is killed when claimed again."""
    job_id = submit_job(two_objects, rt.engine, dataset=DATASET, timestamp_key="timestamp")
    spider = _CancelledWhileRegistering(rt.spider, rt, job_id)
    coordinator = coordinator_with(rt, spider=spider)
    tick_until(coordinator, lambda: _ended(rt, job_id))
    row = job_row(rt, job_id)
    assert (row.status, row.status_msg) == (JobStatus.KILLED, CANCELLED_BEFORE_SUBMISSION)
    assert row.spider_id is None and triggers(rt, job_id) == ["cancelled"]
    assert len(spider.registered) == 1 and spider.started == []
    assert rt.spider.get_job_state(spider.registered[0]) is JobState.READY


class _SubmittedCommits:
    """Counts the transactions that committed at least one ``submitted`` history row."""

    def __init__(self, engine: Engine) -> None:
        self.engine, self.count, self._pending = engine, 0, set[int]()
        event.listen(engine, "before_cursor_execute", self._statement)
        event.listen(engine, "commit", self._commit)

    def _statement(
        self, connection: Connection, _: object, sql: str, params: Any, *__: Any
    ) -> None:
        if "compression_job_transitions" in sql and "submitted" in repr(params):
            self._pending.add(id(connection))

    def _commit(self, connection: Connection) -> None:
        if id(connection) in self._pending:
            self._pending.discard(id(connection))
            self.count += 1

    def close(self) -> None:
        event.remove(self.engine, "before_cursor_execute", self._statement)
        event.remove(self.engine, "commit", self._commit)


def test_the_submissions_of_one_tick_are_recorded_together_each_under_its_own_guard(
    rt: Runtime, two_objects: CoordinatorConfig
) -> None:
    """Three jobs claimed by one tick: their ``submitted`` moves share one transaction, and the
    cancel request made while the second registered refuses only that job's move."""
    jobs = [
        submit_job(two_objects, rt.engine, dataset=DATASET, timestamp_key="timestamp")
        for _ in range(3)
    ]
    spider = _CancelledWhileRegistering(rt.spider, rt, jobs[1])
    spider.cancel_at = 2  # jobs are registered in claim order
    coordinator = coordinator_with(rt, spider=spider)
    counted = _SubmittedCommits(rt.engine)
    try:
        tick_until(coordinator, lambda: all(_ended(rt, job_id) for job_id in jobs))
    finally:
        counted.close()
    assert counted.count == 1
    assert [_status(rt, job_id) for job_id in jobs] == [
        JobStatus.SUCCEEDED,
        JobStatus.KILLED,
        JobStatus.SUCCEEDED,
    ]
    assert triggers(rt, jobs[1]) == ["cancelled"]
    assert len(spider.registered) == 3 and len(spider.started) == 2
    assert rt.spider.get_job_state(spider.registered[1]) is JobState.READY


def test_a_job_claimed_with_a_cancel_request_is_killed_without_registering(
    rt: Runtime, two_objects: CoordinatorConfig
) -> None:
    """The claim reads the request with the row: no separate read, no RegisterJob."""
    job_id = submit_job(two_objects, rt.engine, dataset=DATASET, timestamp_key="timestamp")
    with rt.engine.begin() as connection:  # held by no one, so `coordinator cancel` would kill it
        connection.execute(
            update(_jobs).where(_jobs.c.id == job_id).values(cancel_requested_at=utc_now())
        )
    spider = _CancelledWhileRegistering(rt.spider, rt, job_id)
    coordinator = coordinator_with(rt, spider=spider)
    tick_until(coordinator, lambda: _ended(rt, job_id))
    row = job_row(rt, job_id)
    assert (row.status, row.status_msg) == (JobStatus.KILLED, CANCELLED_BEFORE_SUBMISSION)
    assert spider.registered == [] and triggers(rt, job_id) == ["cancelled"]
