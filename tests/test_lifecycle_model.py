"""A stateful model of the coordinator: replicas, crashes, pauses, cancels and Spider's outcomes.

``hypothesis`` writes programs of steps against the real store (a SQLite file, migrated), real
``Coordinator`` replicas sharing it, and ``SimSpider``: a Spider that follows Spider's job states
and call rules (``docs/spider.md``), whose task effects are the real ones — a compress instance
writes an archive file and records it as the compress task does, a commit instance runs the real
``publish_archives`` — but whose timing the program chooses: which task instance runs when, a lost
success report, a late duplicate instance, Spider failing or cancelling a job, a reset of Spider's
storage that reuses job ids.

The database can go away in the middle of a tick, at any statement (a commit that applied but
whose reply was lost included), for one or more ticks, and the replica may die during it.

After every step: a Succeeded job never changes; an outage never ends a job; a Failed or Killed
job keeps nothing published; every Succeeded job's archives are published exactly once and exist;
every published row is one a task recorded; the history matches the status; CancelJob never
reaches a job on which Spider would shut down (a Ready one: the coordinator's graphs carry a
cleanup task, so CommitReady is cancellable). At the end the program drives everything to
quiescence and checks that every job is terminal, no Spider job is left unrecorded and alive, and
every archive file is exactly a published archive.

Profiles (``COORDINATOR_MODEL_PROFILE``): ``ci`` (default, a bounded number of programs) and
``long`` (1,000 programs: ``COORDINATOR_MODEL_PROFILE=long .venv/bin/pytest
tests/test_lifecycle_model.py``).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import sqlite3
import tempfile
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import event as statistic
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)
from sqlalchemy import Engine, event, func, inspect, select
from sqlalchemy.exc import SQLAlchemyError

from coordinator.config.loader import CoordinatorConfig, load_config
from coordinator.engine.tasks.commit import archive_storage_directory
from coordinator.lifecycle import JobStatus, state_of
from coordinator.runtime import archive_output_of
from coordinator.service.coordinator import Coordinator
from coordinator.service.ingest import put_files, submit_job
from coordinator.service.operator_cancel import request_cancel
from coordinator.spider.port import (
    InvalidJobState,
    JobNotFound,
    JobState,
    ResourceGroupExists,
    ServerError,
    SpiderPort,
    Unauthenticated,
)
from coordinator.store import migrate
from coordinator.store.archives import CommitRefused, publish_archives, published_archives_of_job
from coordinator.store.database import create_database_engine, is_transient
from coordinator.store.datasets import archives_table
from coordinator.store.jobs import JobStore
from coordinator.store.schema import compression_jobs as _jobs
from coordinator.store.schema import job_transitions as _history
from coordinator.store.schema import stored_archives as _stored
from coordinator.store.stored_archives import (
    StoredArchiveRecord,
    begin_storing_attributed,
    mark_stored,
)
from coordinator.task_io import ArchiveMetadata
from tests.one_thread import on_one_thread, reconciliation_on_one_thread

DATASET = "web"
MAX_JOBS = 5

LONG_PROFILE = os.environ.get("COORDINATOR_MODEL_PROFILE", "ci") == "long"
"""``COORDINATOR_MODEL_PROFILE=long``: 1,000 programs per model instead of CI's few."""


def model_settings(*, ci_examples: int, ci_steps: int, long_steps: int) -> settings:
    """A stateful model's Hypothesis settings for the profile in use (CI's examples can be set
    with ``$COORDINATOR_MODEL_EXAMPLES``)."""
    examples = int(os.environ.get("COORDINATOR_MODEL_EXAMPLES", str(ci_examples)))
    return settings(
        max_examples=1000 if LONG_PROFILE else examples,
        stateful_step_count=long_steps if LONG_PROFILE else ci_steps,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )


_template: dict[str, Path] = {}


def _template_database() -> Path:
    """A migrated SQLite file, made once per test process, copied for every program and removed
    when the process exits."""
    if "path" not in _template:
        directory = Path(tempfile.mkdtemp(prefix="coordinator-model-template-"))
        atexit.register(shutil.rmtree, directory, ignore_errors=True)
        path = directory / "coordinator.db"
        engine = create_database_engine(f"sqlite:///{path}")
        migrate.upgrade(engine)
        engine.dispose()
        _template["path"] = path
    return _template["path"]


class ModelClock:
    """The coordinators' two clocks: monotonic seconds and the database's UTC time."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.start = datetime(2026, 12, 1, 12, 0, 0)

    def monotonic(self) -> float:
        return self.seconds

    def utc(self) -> datetime:
        return self.start + timedelta(seconds=self.seconds)

    def advance(self, seconds: float) -> None:
        self.seconds += seconds


OUTAGE_TEXT = "disk I/O error (the model's database outage)"


class DatabaseOutage:
    """The database going away in the middle of a coordinator's tick, at a statement the program
    chooses: that statement and every one after it fail as an unreachable server's would, until
    the outage ends. With ``reply_lost`` the first failure is a COMMIT that the database applied
    but whose answer never arrived (a connection lost during the commit).

    Only the coordinators' ticks see it: the task instances' effects (``SimSpider``) and the
    invariants' reads run between ticks.
    """

    def __init__(self, engine: Engine) -> None:
        self.armed = False
        self.down = False
        self.reply_lost = False
        self.statements_left = 0
        self.failures = 0
        event.listen(engine, "before_cursor_execute", self._before_execute)
        real_commit = engine.dialect.do_commit

        def do_commit(dbapi_connection: Any) -> None:
            if self._fails_now(commit=True) and self.reply_lost:
                real_commit(dbapi_connection)
                raise sqlite3.OperationalError(f"{OUTAGE_TEXT}: the commit's reply was lost")
            if self.down:
                raise sqlite3.OperationalError(OUTAGE_TEXT)
            real_commit(dbapi_connection)

        engine.dialect.do_commit = do_commit  # type: ignore[method-assign]

    def arm(self, *, after_statements: int, reply_lost: bool) -> None:
        self.armed, self.down = True, False
        self.statements_left, self.reply_lost = after_statements, reply_lost

    def end(self) -> None:
        self.armed = self.down = False

    def _fails_now(self, *, commit: bool) -> bool:
        if not self.armed or self.down:
            return False
        if self.statements_left > 0:
            self.statements_left -= 1
            return False
        if commit != self.reply_lost:
            return False
        self.down = True
        self.failures += 1
        return True

    def _before_execute(self, *args: Any) -> None:
        if self._fails_now(commit=False) or self.down:
            raise sqlite3.OperationalError(OUTAGE_TEXT)


# --- a Spider with Spider's rules and the task package's real effects ---------------------------


def store_archive(
    engine: Engine,
    config: CoordinatorConfig,
    clock: ModelClock,
    *,
    spider_job_id: int,
    task_id: str,
    instance_id: int,
) -> ArchiveMetadata:
    """A compress task instance's effects: it stores one archive file and records it for the
    compression job in flight that records ``spider_job_id`` (unattributed when none or several
    do), as compress.py does; the archive's metadata, as its ``CompressionTaskOutput`` says."""
    archive_id = str(uuid.uuid4())
    directory = Path(config.archive_directory) / DATASET
    directory.mkdir(parents=True, exist_ok=True)
    location = directory / archive_id
    location.write_bytes(b"archive")
    with engine.begin() as connection:
        record_id = begin_storing_attributed(
            connection,
            StoredArchiveRecord(
                spider_job_id=spider_job_id,
                task_id=task_id,
                instance_id=instance_id,
                dataset=DATASET,
                archive_id=archive_id,
                location=str(location),
                size=7,
                stored_at=clock.utc(),
            ),
        )
        mark_stored(connection, record_id, str(location), clock.utc())
    return ArchiveMetadata(
        id=archive_id, begin_timestamp=1, end_timestamp=2, size=7, uncompressed_size=70
    )


@dataclass
class SimJob:
    state: JobState = JobState.READY
    error: str = ""
    archives: list[ArchiveMetadata] = field(default_factory=list)
    committed: bool = False
    """The commit instance's effects ran (its report may still have been lost)."""


class SimSpider:
    """``SpiderPort`` over an in-memory job table; the program moves jobs through their tasks."""

    def __init__(self, engine: Engine, clock: ModelClock, config: CoordinatorConfig) -> None:
        self.engine = engine
        self.clock = clock
        self.config = config
        self.jobs: dict[int, SimJob] = {}
        self.next_id = 1
        self.groups: dict[str, int] = {}
        self.passwords: dict[int, bytes] = {}
        self.fatal_cancels: list[int] = []

    # SpiderPort
    def add_resource_group(self, external_id: str, password: bytes) -> int:
        if external_id in self.groups:
            raise ResourceGroupExists(external_id)
        group_id = self.groups[external_id] = len(self.groups) + 1
        self.passwords[group_id] = password
        return group_id

    def verify_resource_group(self, resource_group_id: int, password: bytes) -> None:
        if self.passwords.get(resource_group_id) != password:
            raise Unauthenticated(f"no resource group {resource_group_id} with this password")

    def register_job(
        self, resource_group_id: int, compressed_task_graph: bytes, compressed_inputs: bytes
    ) -> int:
        if resource_group_id not in self.passwords:  # RegisterJob checks no password
            raise Unauthenticated("invalid resource group")
        job_id = self.next_id
        self.next_id += 1
        self.jobs[job_id] = SimJob()
        return job_id

    def start_job(self, job_id: int) -> JobState:
        job = self._job(job_id)
        if job.state is not JobState.READY:
            raise ServerError(f"job {job_id} is {job.state.name}, not READY")
        job.state = JobState.RUNNING
        return job.state

    def cancel_job(self, job_id: int) -> JobState:
        job = self._job(job_id)
        if job.state is JobState.READY:
            # The coordinator's graphs carry a cleanup task: a real Spider shuts its storage
            # service down here (CommitReady is cancellable, the cleanup then ends it Cancelled).
            self.fatal_cancels.append(job_id)
        if job.state.is_terminal:
            raise InvalidJobState(f"job {job_id} is {job.state.name}")
        job.state = JobState.CANCELLED
        return job.state

    def get_job_state(self, job_id: int) -> JobState:
        return self._job(job_id).state

    def get_job_outputs(self, job_id: int) -> list[bytes]:
        if self._job(job_id).state is not JobState.SUCCEEDED:
            raise InvalidJobState(f"job {job_id} has not succeeded")
        return []

    def get_job_error(self, job_id: int) -> str:
        job = self._job(job_id)
        if job.state is not JobState.FAILED:
            raise InvalidJobState(f"job {job_id} has not failed")
        return job.error

    def _job(self, job_id: int) -> SimJob:
        try:
            return self.jobs[job_id]
        except KeyError:
            raise JobNotFound(f"no job {job_id}") from None

    # What the program makes the tasks do
    def store_archive(self, spider_id: int) -> None:
        """A compress task instance stores one archive and records it, as compress.py does."""
        self.jobs[spider_id].archives.append(
            store_archive(
                self.engine,
                self.config,
                self.clock,
                spider_job_id=spider_id,
                task_id="0",
                instance_id=len(self.jobs[spider_id].archives),
            )
        )

    def commit(self, spider_id: int) -> bool:
        """The commit instance's effects (the real publication); whether it succeeded."""
        job = self.jobs[spider_id]
        store = JobStore(self.engine, clock=self.clock.utc)
        try:
            publish_archives(
                store,
                spider_job_id=spider_id,
                dataset=DATASET,
                archive_storage_directory=archive_storage_directory(
                    archive_output_of(self.config), DATASET
                ),
                archives=job.archives[:1],
            )
        except CommitRefused as error:
            job.error = f"in-task failure: {error}"
            return False
        job.committed = True
        return True


# --- the invariants (shared with the model on the embedded engine, test_engine_model.py) -------


class PublicationInvariants:
    """The invariants on the jobs and their archives that hold after every step, whatever runs
    the Spider jobs. The model provides ``engine`` (the shared database), ``config`` and
    ``succeeded`` (the jobs seen Succeeded, with what they published)."""

    engine: Engine
    config: CoordinatorConfig
    succeeded: dict[int, set[str]]

    def _rows(self) -> list[Any]:
        with self.engine.connect() as connection:
            return list(
                connection.execute(
                    select(_jobs.c.id, _jobs.c.status, _jobs.c.committed_at, _jobs.c.spider_id)
                ).all()
            )

    def _published(self, job_id: int, spider_id: int | None) -> set[str]:
        with self.engine.connect() as connection:
            found = published_archives_of_job(connection, job_id, spider_id)
        return {archive for ids in found.values() for archive in ids}

    def _all_published(self) -> list[str]:
        table = archives_table(DATASET)
        with self.engine.connect() as connection:
            if not inspect(connection).has_table(table.name):
                return []
            return list(connection.execute(select(table.c.id)).scalars())

    @invariant()
    def a_succeeded_job_never_changes(self) -> None:
        for row in self._rows():
            state = state_of(row.status, row.committed_at)
            published = self._published(row.id, row.spider_id)
            if row.id in self.succeeded:
                assert state is JobStatus.SUCCEEDED, f"job {row.id} left Succeeded: {state}"
                assert published == self.succeeded[row.id], f"job {row.id}'s archives changed"
            elif state is JobStatus.SUCCEEDED:
                assert published, f"job {row.id} Succeeded with nothing published"
                self.succeeded[row.id] = published

    @invariant()
    def a_job_that_ended_badly_keeps_nothing_published(self) -> None:
        for row in self._rows():
            if state_of(row.status, row.committed_at) in (JobStatus.FAILED, JobStatus.KILLED):
                assert not self._published(row.id, row.spider_id), f"job {row.id} half-published"

    @invariant()
    def every_published_archive_was_recorded_and_exists_once(self) -> None:
        published = self._all_published()
        assert len(published) == len(set(published)), "an archive is published twice"
        with self.engine.connect() as connection:
            recorded = dict(
                connection.execute(select(_stored.c.archive_id, _stored.c.location)).all()
            )
        for archive in published:
            assert archive in recorded, f"archive {archive} is published but was never stored"
            assert Path(recorded[archive]).is_file(), f"published archive {archive} is gone"

    @invariant()
    def the_history_matches_the_status(self) -> None:
        with self.engine.connect() as connection:
            last = dict(
                connection.execute(
                    select(_history.c.job_id, _history.c.to_status).where(
                        _history.c.id.in_(
                            select(func.max(_history.c.id)).group_by(_history.c.job_id)
                        )
                    )
                ).all()
            )
        for row in self._rows():
            state = state_of(row.status, row.committed_at)
            assert last.get(row.id, int(JobStatus.PENDING)) == int(state), f"job {row.id}"

    @invariant()
    def an_outage_never_ends_a_job(self) -> None:
        with self.engine.connect() as connection:
            messages = connection.execute(
                select(_jobs.c.id, _jobs.c.status_msg).where(
                    _jobs.c.status_msg.contains("model's database outage")
                )
            ).all()
        assert not messages, f"an outage ended jobs: {[tuple(row) for row in messages]}"

    def check_archive_files_are_published(self) -> None:
        """At quiescence: every archive file is exactly a published archive."""
        files = {path.name for path in (Path(self.config.archive_directory) / DATASET).glob("*")}
        published = set(self._all_published())
        assert files == published, (
            f"files without a publication: {sorted(files - published)}; "
            f"publications without a file: {sorted(published - files)}"
        )


# --- the model ---------------------------------------------------------------------------------


class OperatorRules:
    """The rules of jobs and operators both models share: submit up to ``max_jobs``, cancel any.

    Needs ``jobs``, ``config``, ``engine`` and ``store`` from the model."""

    max_jobs = MAX_JOBS
    jobs: list[int]
    config: CoordinatorConfig
    engine: Engine
    store: JobStore

    @precondition(lambda self: len(self.jobs) < self.max_jobs)
    @rule()
    def submit(self) -> None:
        self.jobs.append(
            submit_job(
                self.config,
                self.engine,
                bucket="logs",
                prefix="ingest/",
                dataset=DATASET,
                timestamp_key="timestamp",
            )
        )

    @precondition(lambda self: bool(self.jobs))
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        job_id = data.draw(st.sampled_from(self.jobs))
        request_cancel(self.store, job_id, "model")


def model_coordinator(
    engine: Engine,
    config: CoordinatorConfig,
    clock: ModelClock,
    store: JobStore,
    spider: SpiderPort,
    name: str,
) -> Coordinator:
    """Replica ``name``'s coordinator as both models run it: the model's database, store and
    clock, 30 s leases, undecodable jobs owned, its tick on one thread."""
    return on_one_thread(
        Coordinator(
            engine=engine,
            spider=spider,
            settings=config.compression_coordinator,
            archive_output=archive_output_of(config),
            instance_id=name,
            lease_duration=timedelta(seconds=30),
            owns_undecodable_jobs=True,
            clock=clock.monotonic,
            store=store,
        )
    )


class CoordinatorModel(PublicationInvariants, OperatorRules, RuleBasedStateMachine):
    """Two coordinator replicas, one Spider, up to ``MAX_JOBS`` jobs."""

    def __init__(self) -> None:
        super().__init__()
        self.one_thread = contextlib.ExitStack()
        self.one_thread.enter_context(reconciliation_on_one_thread())
        self.directory = Path(tempfile.mkdtemp(prefix="coordinator-model-"))
        database = self.directory / "coordinator.db"
        shutil.copy(_template_database(), database)
        os.environ.pop("COORDINATOR_DATABASE_URL", None)
        self.config = load_config(None, data_dir=self.directory)
        self.engine = create_database_engine(f"sqlite:///{database}")
        self.clock = ModelClock()
        self.outage = DatabaseOutage(self.engine)
        self.store = JobStore(self.engine, clock=self.clock.utc)
        self.spider = SimSpider(self.engine, self.clock, self.config)
        self.replicas: dict[str, Coordinator] = {}
        self.succeeded: dict[int, set[str]] = {}
        self.jobs: list[int] = []
        log = self.directory / "input.jsonl"
        log.write_text('{"timestamp": 1, "message": "m"}\n', encoding="utf-8")
        put_files(self.config, [log], bucket="logs", prefix="ingest/")

    def _replica(self, name: str) -> Coordinator:
        return model_coordinator(
            self.engine, self.config, self.clock, self.store, self.spider, name
        )

    @initialize()
    def start(self) -> None:
        self.replicas = {name: self._replica(name) for name in ("a", "b")}

    def teardown(self) -> None:
        try:
            self._drain()
        finally:
            self.engine.dispose()
            shutil.rmtree(self.directory, ignore_errors=True)
            self.one_thread.close()

    # --- coordinators -----------------------------------------------------------------------------

    @rule(name=st.sampled_from(["a", "b"]), seconds=st.sampled_from([0.2, 1.0, 5.0]))
    def tick(self, name: str, seconds: float) -> None:
        self.clock.advance(seconds)
        self.replicas[name].tick()

    @rule(
        name=st.sampled_from(["a", "b"]),
        after_statements=st.integers(min_value=0, max_value=40),
        reply_lost=st.booleans(),
        ticks_down=st.sampled_from([1, 3]),
        then=st.sampled_from(["carries-on", "crashes"]),
    )
    def a_database_outage_mid_tick(
        self, name: str, after_statements: int, reply_lost: bool, ticks_down: int, then: str
    ) -> None:
        """The database goes away at a chosen statement of a tick (possibly a commit that applied
        but whose reply was lost) and stays away for some ticks; the replica rides it out as
        ``run`` does (the tick's error is an outage, the loop waits) or dies during it."""
        self.outage.arm(after_statements=after_statements, reply_lost=reply_lost)
        try:
            for _ in range(ticks_down):
                self.clock.advance(1.0)
                self._tick_as_run_does(name)
        finally:
            hit = self.outage.down
            self.outage.end()
        statistic(f"database outage: {'hit' if hit else 'missed'} the tick")
        if then == "crashes":
            self.replicas[name] = self._replica(name)

    def _tick_as_run_does(self, name: str) -> None:
        """``Coordinator.run``'s handling of one tick: an outage makes the tick wait, and only
        an outage may escape a tick."""
        try:
            self.replicas[name].tick()
        except SQLAlchemyError as error:
            assert self.outage.down and is_transient(error), f"a tick failed: {error!r}"

    @rule(name=st.sampled_from(["a", "b"]))
    def crash_and_restart(self, name: str) -> None:
        """SIGKILL and start again with the same instance id: memory is lost, leases are not."""
        self.replicas[name] = self._replica(name)

    @rule()
    def pause_past_the_leases(self) -> None:
        """Every coordinator stalls longer than a lease; whoever ticks next may take jobs over."""
        self.clock.advance(65)

    # --- Spider and the task instances ------------------------------------------------------------

    def _in(self, *states: JobState) -> list[int]:
        return sorted(job for job, sim in self.spider.jobs.items() if sim.state in states)

    @precondition(lambda self: bool(self._in(JobState.RUNNING)))
    @rule(data=st.data())
    def compress_tasks_finish(self, data: st.DataObject) -> None:
        spider_id = data.draw(st.sampled_from(self._in(JobState.RUNNING)))
        self.spider.store_archive(spider_id)
        self.spider.jobs[spider_id].state = JobState.COMMIT_READY

    @precondition(lambda self: bool(self._in(JobState.RUNNING)))
    @rule(data=st.data())
    def a_compress_task_fails(self, data: st.DataObject) -> None:
        spider_id = data.draw(st.sampled_from(self._in(JobState.RUNNING)))
        if data.draw(st.booleans()):
            self.spider.store_archive(spider_id)  # stored, then failed: the file stays recorded
        job = self.spider.jobs[spider_id]
        job.state, job.error = JobState.FAILED, "in-task failure: clp-s exited with 1"

    @precondition(lambda self: bool(self.spider.jobs))
    @rule(data=st.data())
    def a_late_duplicate_instance_stores(self, data: st.DataObject) -> None:
        spider_id = data.draw(st.sampled_from(sorted(self.spider.jobs)))
        if self.spider.jobs[spider_id].state is not JobState.READY:
            self.spider.store_archive(spider_id)

    @precondition(lambda self: bool(self._in(JobState.COMMIT_READY)))
    @rule(data=st.data(), report=st.sampled_from(["delivered", "lost", "crashed-before"]))
    def the_commit_runs(self, data: st.DataObject, report: str) -> None:
        spider_id = data.draw(st.sampled_from(self._in(JobState.COMMIT_READY)))
        job = self.spider.jobs[spider_id]
        if report == "crashed-before":
            job.state, job.error = JobState.FAILED, "executor crashed (exit_status = None)"
            return
        published = self.spider.commit(spider_id)
        if published and report == "delivered":
            job.state = JobState.SUCCEEDED
        else:
            job.state = JobState.FAILED
            job.error = job.error or "hard timeout (60000 ms) exceeded"

    @precondition(lambda self: any(job.committed for job in self.spider.jobs.values()))
    @rule(data=st.data())
    def a_second_commit_instance_runs(self, data: st.DataObject) -> None:
        """Spider may run the commit twice: the second is a no-op, or refused once the job ended."""
        committed = sorted(job for job, sim in self.spider.jobs.items() if sim.committed)
        self.spider.commit(data.draw(st.sampled_from(committed)))

    @precondition(lambda self: bool(self.spider.jobs))
    @rule()
    def spiders_storage_is_reset(self) -> None:
        """Spider forgets every job and numbers new ones from 1 again (H11)."""
        self.spider.jobs.clear()
        self.spider.groups.clear()
        self.spider.passwords.clear()
        self.spider.next_id = 1

    @precondition(lambda self: bool(self._in(JobState.READY, JobState.RUNNING)))
    @rule(data=st.data())
    def spider_cancels(self, data: st.DataObject) -> None:
        spider_id = data.draw(st.sampled_from(self._in(JobState.READY, JobState.RUNNING)))
        self.spider.jobs[spider_id].state = JobState.CANCELLED

    # --- invariants -----------------------------------------------------------------------------

    @invariant()
    def cancel_never_shuts_spider_down(self) -> None:
        assert self.spider.fatal_cancels == []

    # --- quiescence -------------------------------------------------------------------------------

    def _drain(self) -> None:
        """Let Spider finish every job and the coordinators conclude; then check what is left."""
        for _ in range(200):
            for spider_id in self._in(JobState.RUNNING):
                self.spider.store_archive(spider_id)
                self.spider.jobs[spider_id].state = JobState.COMMIT_READY
            for spider_id in self._in(JobState.COMMIT_READY):
                job = self.spider.jobs[spider_id]
                if self.spider.commit(spider_id):
                    job.state = JobState.SUCCEEDED
                else:
                    job.state = JobState.FAILED
            self.clock.advance(40)
            for coordinator in self.replicas.values():
                coordinator.tick()
            rows = self._rows()
            if all(state_of(r.status, r.committed_at).is_terminal for r in rows) and not any(
                c.driven for c in self.replicas.values()
            ):
                break
        # One more sweep, past its interval and grace, by each replica.
        self.clock.advance(200)
        for coordinator in self.replicas.values():
            coordinator.tick()
        rows = self._rows()
        unfinished = [r.id for r in rows if not state_of(r.status, r.committed_at).is_terminal]
        assert unfinished == [], f"jobs never ended: {unfinished}"
        self.a_succeeded_job_never_changes()
        self.a_job_that_ended_badly_keeps_nothing_published()
        recorded_ids = {r.spider_id for r in rows if r.spider_id is not None}
        for spider_id, job in self.spider.jobs.items():
            alive = not job.state.is_terminal and job.state is not JobState.READY
            assert not alive or spider_id in recorded_ids, f"Spider job {spider_id} is orphaned"
        self.check_archive_files_are_published()


CoordinatorModel.TestCase.settings = model_settings(ci_examples=30, ci_steps=25, long_steps=40)
TestCoordinatorModel = pytest.mark.slow(CoordinatorModel.TestCase)
pytestmark = [pytest.mark.timeout(0)] if LONG_PROFILE else []
"""The long profile runs for longer than the suite's per-test timeout (all programs are one test;
a timeout in the middle of one would look like a flaky failure)."""
