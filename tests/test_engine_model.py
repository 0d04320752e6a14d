"""A stateful model of coordinator replicas that each host a real embedded engine.

The companion of ``test_lifecycle_model.py``, whose Spider is simulated: here every coordinator
replica hosts a real ``EmbeddedSpider`` on the shared SQLite database, as the embedded default
does (``coordinator.runtime``: one engine per replica, its jobs owned by the replica's
presence token), but no thread runs it. The program plays the execution managers: it pulls
assignments (``_next_assignment``), decides which instance runs when and how it ends (succeeds,
fails and uses a retry, its executor crashes before or after the task's effects, it is killed at
its hard timeout after them), and reports each outcome (``_report``) as a manager would; it injects
the engine's own faults (a lost report, a duplicate instance, a cancel arriving while an instance
runs) and runs the engine's sweep (adoption of the jobs of owners that are gone).

Task effects are the real ones: a compress instance stores an archive file and records it (as the
SimSpider model's do) and returns real ``CompressionTaskOutput`` bytes, which the engine hands to
the commit instance, which runs the real commit task function (``coordinator.engine.tasks.commit``);
the cleanup instance runs the real cleanup task.

Replicas die with their engine: a crash at a crash point of a tick, in the middle of a database
outage, or between ticks (with the instances they were running, whose effects may have happened);
a replica restarts with a new presence (taking its instance id's row over, so its engine's jobs are
adoptable at once), or stays down until its heartbeat row expires (deleted here: the engine's
"expired and seen by a healthy observer" is real time, which the model keeps out) or for good.
The database goes away at a chosen statement of a tick (the engine's calls included) or of an
engine's report, where the engine waits it out (its back-off wait ends the outage after the
attempts the program chose, no real time passes).

After every step, the invariants of ``test_lifecycle_model.py`` (``PublicationInvariants``) and:
an engine hands out an instance only of a job whose row it owns and that has not ended; every
running instance belongs to a job its host's engine owns (one engine runs a Spider job). At the end
the program drains everything (every assignment run to success, sweeps, ticks) and checks: every
compression job is terminal, no replica drives anything, every engine job is terminal or Ready and
unrecorded, every archive file is exactly a published archive; then every replica restarts and
every engine job is terminal (the unrecorded Ready ones cancelled).

Real time is kept out: the presence rows never expire by themselves (a long expiry, no heartbeat
thread), the unrecorded-registration grace is 0, soft timeouts never fire (no monitor thread), the
coordinators' clocks are the model's.

Profiles (``COORDINATOR_MODEL_PROFILE``): ``ci`` (default; ``COORDINATOR_MODEL_EXAMPLES`` programs,
20 unless set) and ``long`` (1,000 programs: ``COORDINATOR_MODEL_PROFILE=long .venv/bin/pytest
tests/test_engine_model.py``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import tempfile
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast
from unittest import mock

import pytest
from hypothesis import event as statistic
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)
from sqlalchemy import delete, select
from sqlalchemy.exc import SQLAlchemyError

import coordinator.service.crashpoints as crashpoints_module
import coordinator.store.instances as instances_module
from coordinator.config.loader import CoordinatorConfig, load_config
from coordinator.engine.embedded.engine import COMMIT, STATE_NAMES, EmbeddedSpider
from coordinator.engine.embedded.faults import Fault, FaultKind
from coordinator.engine.embedded.manager import Assignment
from coordinator.engine.embedded.protocol import (
    Reply,
    executor_crashed,
    hard_timeout_exceeded,
    in_task_failure,
)
from coordinator.engine.tasks import database as task_database
from coordinator.engine.tasks.cleanup import cleanup
from coordinator.engine.tasks.commit import commit
from coordinator.engine.tasks.context import TaskContext, TaskError, WorkerSettings
from coordinator.engine.tasks.registry import CLEANUP, CLP_PACKAGE, COMPRESS
from coordinator.engine.tasks.registry import COMMIT as COMMIT_FUNCTION
from coordinator.lifecycle import state_of
from coordinator.runtime import worker_settings
from coordinator.service.crashpoints import POINTS
from coordinator.service.ingest import put_files
from coordinator.service.operator_cancel import request_cancel
from coordinator.store.database import create_database_engine, is_transient
from coordinator.store.instances import COORDINATOR, Presence
from coordinator.store.jobs import JobStore
from coordinator.store.schema import coordinator_instances as _instances
from coordinator.store.schema import engine_jobs as _engine_jobs
from coordinator.task_io import CompressionTaskOutput
from tests.one_thread import reconciliation_on_one_thread
from tests.test_lifecycle_model import (
    DATASET,
    LONG_PROFILE,
    DatabaseOutage,
    ModelClock,
    OperatorRules,
    PublicationInvariants,
    _template_database,
    model_coordinator,
    model_settings,
    store_archive,
)

MAX_JOBS = 4
NAMES = ("a", "b")
STALE_AFTER_SECS = 10 * 24 * 3600.0
"""The replicas' presence rows never expire during a program (no heartbeat thread runs)."""

_UNFINISHED = {STATE_NAMES[state] for state in STATE_NAMES if not state.is_terminal}
OUTCOMES = st.just("succeeds") | st.sampled_from(
    ["fails", "crashes", "crashes-after-effects", "times-out-after-effects"]
)
"""How an instance ends (half of them succeed)."""
REPORT_OUTAGES = st.none() | st.tuples(
    st.integers(min_value=0, max_value=3), st.booleans(), st.integers(min_value=1, max_value=3)
)
"""The database is away during a report: after so many statements, possibly a commit whose reply
is lost, for so many attempts of the engine's write."""
_TERMINATION_TASKS = (COMMIT, "cleanup")


class Crash(BaseException):
    """The process dies here (a crash point reached): nothing after it runs, as with SIGKILL."""


class OutageWait(threading.Event):
    """The engine's back-off between two attempts of a write while the database is away.

    Instead of sleeping, each wait is one failed attempt: after the number of attempts the program
    chose, the database is back. A wait without an outage is a failure of the model's check (the
    engine retried a write for another reason).
    """

    def __init__(self, outage: DatabaseOutage) -> None:
        super().__init__()
        self.outage = outage
        self.attempts_left = 0

    def wait(self, timeout: float | None = None) -> bool:
        assert self.outage.down, "the engine waited for the database although it was there"
        self.attempts_left -= 1
        if self.attempts_left <= 0:
            self.outage.end()
        return False


@dataclass
class Instance:
    """A task instance an execution manager of ``host`` took and runs."""

    host: str
    assignment: Assignment

    @property
    def label(self) -> str:
        request = self.assignment.request
        return f"{request.job_id}/{request.task_id}#{request.instance_id}@{self.host}"


class Replica:
    """One coordinator process: its presence row, its embedded engine (started as ``start()``
    does, without the execution managers and the monitor thread), and its coordinator."""

    def __init__(self, model: EngineModel, name: str) -> None:
        self.name = name
        self.presence = Presence(
            model.engine, COORDINATOR, name, stale_after_secs=STALE_AFTER_SECS
        ).register(wait_secs=0)
        self.spider = EmbeddedSpider(
            model.engine,
            model.worker_settings,
            workers=1,
            presence=self.presence,
            coordinator_name=name,
            unrecorded_grace_secs=0.0,
        )
        self.waits = OutageWait(model.outage)
        self.spider._stopping = self.waits
        self.spider._sweep()  # start()'s adoption of the jobs of owners that are gone
        self.coordinator = model_coordinator(
            model.engine, model.config, model.clock, model.store, self.spider, name
        )

    def tick(self) -> None:
        self.coordinator.tick()

    def die(self) -> None:
        """The process is gone: its token is no longer this process's (a restart on this host
        takes the row over at once); its executors died with it."""
        with instances_module._tokens_lock:
            instances_module._tokens_of_this_process.discard(self.presence.token)

    @property
    def has_work_queued(self) -> bool:
        return bool(self.spider._regular_lane or self.spider._termination_lane)


class EngineModel(PublicationInvariants, OperatorRules, RuleBasedStateMachine):
    """Two coordinator replicas, each with its embedded engine, up to ``MAX_JOBS`` jobs."""

    max_jobs = MAX_JOBS

    def __init__(self) -> None:
        super().__init__()
        self.one_thread = contextlib.ExitStack()
        self.one_thread.enter_context(reconciliation_on_one_thread())
        self.directory = Path(tempfile.mkdtemp(prefix="coordinator-engine-model-"))
        database = self.directory / "coordinator.db"
        shutil.copy(_template_database(), database)
        os.environ.pop("COORDINATOR_DATABASE_URL", None)
        base = load_config(None, data_dir=self.directory)
        # A target of 1 byte: each of the two objects is a partition, so graphs have two tasks.
        output = base.clp.archive_output.model_copy(update={"target_archive_size": 1})
        self.config: CoordinatorConfig = dataclasses.replace(
            base, clp=base.clp.model_copy(update={"archive_output": output})
        )
        url = f"sqlite:///{database}"
        self.engine = create_database_engine(url)
        self.worker_settings: WorkerSettings = worker_settings(self.config, url)
        self.clock = ModelClock()
        self.outage = DatabaseOutage(self.engine)
        self.store = JobStore(self.engine, clock=self.clock.utc)
        self.replicas: dict[str, Replica] = {}
        self.expired: set[str] = set()
        """Replicas down whose presence row is gone (expired)."""
        self.running: list[Instance] = []
        self.succeeded: dict[int, set[str]] = {}
        self.jobs: list[int] = []
        logs = []
        for name in ("alpha.jsonl", "zulu-2.jsonl"):
            log = self.directory / name
            log.write_text('{"timestamp": 1, "message": "m"}\n', encoding="utf-8")
            logs.append(log)
        put_files(self.config, logs, bucket="logs", prefix="ingest/")

    @initialize(jobs=st.integers(min_value=1, max_value=2))
    def start(self, jobs: int) -> None:
        self.replicas = {name: Replica(self, name) for name in NAMES}
        for _ in range(jobs):
            self.submit()

    def teardown(self) -> None:
        try:
            self._drain()
        finally:
            for replica in self.replicas.values():
                replica.die()
            task_database.task_engine(self.worker_settings).dispose()
            self.engine.dispose()
            shutil.rmtree(self.directory, ignore_errors=True)
            self.one_thread.close()

    # --- coordinators -----------------------------------------------------------------------------

    def _up(self) -> list[str]:
        return [name for name in NAMES if name in self.replicas]

    def _down(self) -> list[str]:
        return [name for name in NAMES if name not in self.replicas]

    @precondition(lambda self: bool(self._up()))
    @rule(
        data=st.data(),
        seconds=st.sampled_from([0.2, 1.0, 5.0]),
        actions=st.integers(min_value=0, max_value=3),
    )
    def tick(self, data: st.DataObject, seconds: float, actions: int) -> None:
        """A replica's coordinator ticks, and meanwhile its execution managers act."""
        name = data.draw(st.sampled_from(self._up()))
        self.clock.advance(seconds)
        self.replicas[name].tick()
        self._managers_act(data, actions, [name])

    @precondition(lambda self: bool(self._up()))
    @rule(
        data=st.data(),
        after_statements=st.integers(min_value=0, max_value=40),
        reply_lost=st.booleans(),
        ticks_down=st.sampled_from([1, 3]),
        then=st.sampled_from(["carries-on", "crashes"]),
    )
    def a_database_outage_mid_tick(
        self,
        data: st.DataObject,
        after_statements: int,
        reply_lost: bool,
        ticks_down: int,
        then: str,
    ) -> None:
        """The database goes away at a chosen statement of a tick (the engine's statements made
        for the coordinator's calls included), possibly a commit that applied but whose reply was
        lost, for some ticks; the replica rides it out as ``run`` does, or dies during it."""
        name = data.draw(st.sampled_from(self._up()))
        self.outage.arm(after_statements=after_statements, reply_lost=reply_lost)
        try:
            for _ in range(ticks_down):
                self.clock.advance(1.0)
                try:
                    self.replicas[name].tick()
                except SQLAlchemyError as error:
                    assert self.outage.down and is_transient(error), f"a tick failed: {error!r}"
        finally:
            hit = self.outage.down
            self.outage.end()
        statistic(f"database outage mid-tick: {'hit' if hit else 'missed'} the tick")
        if then == "crashes":
            self._crash(name, data, restart=True)

    @precondition(lambda self: bool(self._up()))
    @rule(data=st.data(), point=st.sampled_from(POINTS))
    def a_replica_dies_at_a_crash_point(self, data: st.DataObject, point: str) -> None:
        """``COORDINATOR_CRASH_AT=<point>``: the replica dies (engine included) there, if its
        tick reaches it."""
        name = data.draw(st.sampled_from(self._up()))

        def crashpoint(at: str) -> None:
            if at == point:
                raise Crash(at)

        self.clock.advance(1.0)
        with mock.patch.object(crashpoints_module, "crashpoint", crashpoint):
            try:
                self.replicas[name].tick()
            except Crash:
                statistic(f"crash point {point}: reached")
                self._crash(name, data, restart=True)
                return
        statistic(f"crash point {point}: not reached")

    @precondition(lambda self: bool(self._up()))
    @rule(data=st.data(), then=st.sampled_from(["restarts", "stays-down", "stays-down-expired"]))
    def a_replica_crashes(self, data: st.DataObject, then: str) -> None:
        """SIGKILL between ticks: the coordinator and its engine die together, with the instances
        its executors ran; it restarts at once, or stays down (its row still there, or expired)."""
        up = self._up()
        if then != "restarts" and len(up) < 2:
            then = "restarts"  # one replica stays up
        name = data.draw(st.sampled_from(up))
        self._crash(name, data, restart=then == "restarts")
        if then == "stays-down-expired":
            self._expire(name)

    @precondition(lambda self: bool(self._down()))
    @rule(data=st.data())
    def a_replica_restarts(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(self._down()))
        self.replicas[name] = Replica(self, name)
        self.expired.discard(name)

    @precondition(lambda self: any(name not in self.expired for name in self._down()))
    @rule(data=st.data())
    def a_down_replicas_heartbeat_expires(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from([n for n in self._down() if n not in self.expired]))
        self._expire(name)

    @rule()
    def pause_past_the_leases(self) -> None:
        """Every coordinator stalls longer than a lease; whoever ticks next may take jobs over."""
        self.clock.advance(65)

    def _crash(self, name: str, data: st.DataObject | None, *, restart: bool) -> None:
        """The replica dies with its engine; the instances its executors ran die too, after their
        effects or before (``data`` chooses; ``None``: before)."""
        replica = self.replicas.pop(name)
        replica.die()
        for instance in [i for i in self.running if i.host == name]:
            self.running.remove(instance)
            if data is not None and data.draw(st.booleans(), label=f"{instance.label} effects"):
                self._effects(instance)
        if data is not None:
            statistic(f"replica crash: {'restarts' if restart else 'stays down'}")
        if restart:
            self.replicas[name] = Replica(self, name)

    def _expire(self, name: str) -> None:
        """A down replica's heartbeat row expires (deleted: the engines see its owner gone)."""
        with self.engine.begin() as connection:
            connection.execute(
                delete(_instances).where(
                    _instances.c.kind == COORDINATOR, _instances.c.name == name
                )
            )
        self.expired.add(name)

    # --- the engines' execution managers, played by the program -------------------------------

    def _can_work(self) -> bool:
        return bool(self.running) or any(r.has_work_queued for r in self.replicas.values())

    @precondition(_can_work)
    @rule(data=st.data(), actions=st.integers(min_value=1, max_value=4))
    def execution_managers_work(self, data: st.DataObject, actions: int) -> None:
        """A few actions of the engines' execution managers, one after the other."""
        self._managers_act(data, actions, list(NAMES))

    def _managers_act(self, data: st.DataObject, actions: int, hosts: list[str]) -> None:
        """Actions of the execution managers of ``hosts``: a manager takes an instance to run
        (``_next_assignment``), or an instance that runs ends (succeeds, fails, its executor
        crashes before or after its effects, it is killed at its hard timeout after them) and its
        manager reports it (``_report``), possibly while the database is away."""
        for _ in range(actions):
            queued = [n for n in hosts if n in self.replicas and self.replicas[n].has_work_queued]
            running = [i for i in self.running if i.host in hosts]
            if queued and (not running or data.draw(st.booleans(), label="take one")):
                taken = self._take(data.draw(st.sampled_from(queued), label="manager of"))
                statistic(f"an execution manager took {'an instance' if taken else 'nothing'}")
            elif running:
                instance = data.draw(st.sampled_from(running), label="instance")
                self.running.remove(instance)
                outcome = data.draw(OUTCOMES, label="outcome")
                outage = data.draw(REPORT_OUTAGES, label="outage during the report")
                statistic(f"instance of {self._task_kind(instance)}: {outcome}")
                hit = self._end(instance, outcome, outage)
                if outage is not None:
                    statistic(f"database outage during a report: {'hit' if hit else 'missed'}")

    def _take(self, name: str) -> Instance | None:
        assignment = self.replicas[name].spider._next_assignment(0)
        if assignment is None:
            return None
        request = assignment.request
        row = self._engine_job(request.job_id)
        assert row is not None, f"engine {name} runs job {request.job_id}, which has no row"
        assert row.owner == self.replicas[name].spider.token, (
            f"engine {name} hands out {request.task_id} of job {request.job_id}, owned by "
            f"{self._owner_name(row.owner)}"
        )
        assert row.state in _UNFINISHED, (
            f"engine {name} hands out task {request.task_id} of job {request.job_id}, which is "
            f"{row.state} in the database"
        )
        instance = Instance(name, assignment)
        self.running.append(instance)
        return instance

    def _end(self, instance: Instance, outcome: str, outage: tuple[int, bool, int] | None) -> bool:
        """Play the end of ``instance``; whether the outage (if any) hit the report."""
        replica = self.replicas[instance.host]
        assignment, request = instance.assignment, instance.assignment.request
        if outcome == "succeeds":
            reply = self._effects(instance)
        elif outcome == "fails":
            reply = Reply(error=in_task_failure("clp-s exited with 1 (the model's failure)"))
        elif outcome == "times-out-after-effects":
            self._effects(instance)
            replica.spider._instance_gone(request)
            reply = Reply(error=hard_timeout_exceeded(assignment.hard_timeout_ms))
        else:
            if outcome == "crashes-after-effects":
                self._effects(instance)
            replica.spider._instance_gone(request)
            reply = Reply(error=executor_crashed(None))
        if outage is None:
            replica.spider._report(assignment, reply)
            return False
        after_statements, reply_lost, attempts = outage
        replica.waits.attempts_left = attempts
        self.outage.arm(after_statements=after_statements, reply_lost=reply_lost)
        failures = self.outage.failures
        try:
            replica.spider._report(assignment, reply)
        finally:
            hit = self.outage.failures > failures
            self.outage.end()
        return hit

    def _effects(self, instance: Instance) -> Reply:
        """What the task does, for real; the reply its executor would send."""
        request = instance.assignment.request
        assert request.package == CLP_PACKAGE
        context = TaskContext(
            job_id=request.job_id,
            task_id=request.task_id,
            instance_id=request.instance_id,
            settings=self.worker_settings,
            graph_outputs=tuple(request.graph_outputs),
        )
        try:
            if request.task_func == COMMIT_FUNCTION:
                return Reply(outputs=commit(context, request.inputs))
            if request.task_func == CLEANUP:
                return Reply(outputs=cleanup(context, request.inputs))
        except TaskError as error:
            return Reply(error=in_task_failure(str(error)))
        assert request.task_func == COMPRESS, request.task_func
        archive = store_archive(
            self.engine,
            self.config,
            self.clock,
            spider_job_id=request.job_id,
            task_id=request.task_id,
            instance_id=request.instance_id,
        )
        output = CompressionTaskOutput(dataset=DATASET, archives=[archive])
        return Reply(outputs=[output.to_msgpack()])

    @precondition(lambda self: bool(self._up()))
    @rule(
        data=st.data(),
        kind=st.sampled_from(["lose_report", "duplicate", "cancelled"]),
        task=st.sampled_from([None, 0, 1, "commit", "cleanup"]),
    )
    def an_engine_fault_is_injected(
        self, data: st.DataObject, kind: FaultKind, task: int | str | None
    ) -> None:
        """The next matching instance of one engine loses its report (re-queued without using a
        retry), gets a duplicate running at once, or sees a cancel arrive while it runs."""
        name = data.draw(st.sampled_from(self._up()))
        spiders = self._engine_job_ids()
        job_id = data.draw(st.sampled_from([None, *spiders])) if spiders else None
        self.replicas[name].spider.inject(Fault(kind, task=cast(Any, task), job_id=job_id))

    @precondition(lambda self: bool(self._up()))
    @rule(data=st.data())
    def an_engine_sweeps(self, data: st.DataObject) -> None:
        """The monitor's periodic sweep: adopt the jobs of owners that are gone, drop lost ones."""
        self.replicas[data.draw(st.sampled_from(self._up()))].spider._sweep()

    @precondition(lambda self: bool(self._up()))
    @rule(data=st.data())
    def an_engine_forgets_its_terminal_jobs(self, data: st.DataObject) -> None:
        """The monitor's eviction of terminal jobs once their retention is over."""
        spider = self.replicas[data.draw(st.sampled_from(self._up()))].spider
        with spider._condition:
            for job in list(spider._jobs.values()):
                if job.state.is_terminal:
                    del spider._jobs[job.id]

    # --- invariants -----------------------------------------------------------------------------

    def _engine_rows(self) -> list[Any]:
        with self.engine.connect() as connection:
            return list(
                connection.execute(
                    select(_engine_jobs.c.id, _engine_jobs.c.owner, _engine_jobs.c.state)
                ).all()
            )

    def _engine_job(self, job_id: int) -> Any:
        with self.engine.connect() as connection:
            return connection.execute(
                select(_engine_jobs.c.owner, _engine_jobs.c.state).where(
                    _engine_jobs.c.id == job_id
                )
            ).first()

    def _engine_job_ids(self) -> list[int]:
        return sorted(row.id for row in self._engine_rows())

    def _owner_name(self, token: str | None) -> str:
        for name, replica in self.replicas.items():
            if replica.spider.token == token:
                return f"engine {name}"
        return f"a gone engine ({token})"

    def _task_kind(self, instance: Instance) -> str:
        task = instance.assignment.request.task_id
        return task if task in _TERMINATION_TASKS else "compress"

    @invariant()
    def one_engine_runs_a_spider_job(self) -> None:
        """Every instance that runs belongs to a job that its host's engine owns."""
        owners = {row.id: row.owner for row in self._engine_rows()}
        hosts: dict[int, set[str]] = {}
        for instance in self.running:
            job_id = instance.assignment.request.job_id
            hosts.setdefault(job_id, set()).add(instance.host)
            token = self.replicas[instance.host].spider.token
            assert owners.get(job_id) == token, (
                f"instance {instance.label} runs, but its job is owned by "
                f"{self._owner_name(owners.get(job_id))}"
            )
        shared = {job: names for job, names in hosts.items() if len(names) > 1}
        assert not shared, f"Spider jobs run on several engines: {shared}"

    # --- quiescence -------------------------------------------------------------------------------

    def _drain(self) -> None:
        """Run everything to completion, then check what is left."""
        for name in self._down():
            if name not in self.expired:
                self._expire(name)  # the replicas still down are gone for good
        for _ in range(100):
            while self.running:
                self._end(self.running.pop(0), "succeeds", None)
            for name in self._up():
                while (instance := self._take(name)) is not None:
                    self.running.remove(instance)
                    self._end(instance, "succeeds", None)
            for replica in self.replicas.values():
                replica.spider._sweep()
            self.clock.advance(40)
            for replica in self.replicas.values():
                replica.tick()
            rows = self._rows()
            if (
                all(state_of(r.status, r.committed_at).is_terminal for r in rows)
                and not any(r.coordinator.driven for r in self.replicas.values())
                and not any(r.has_work_queued for r in self.replicas.values())
            ):
                break
        # One more sweep, past its interval and grace, by each replica.
        self.clock.advance(200)
        for replica in self.replicas.values():
            replica.tick()
        rows = self._rows()
        unfinished = [r.id for r in rows if not state_of(r.status, r.committed_at).is_terminal]
        assert unfinished == [], f"jobs never ended: {unfinished}"
        driven = {n: sorted(r.coordinator.driven) for n, r in self.replicas.items()}
        assert not any(driven.values()), f"still driven: {driven}"
        self.a_succeeded_job_never_changes()
        self.a_job_that_ended_badly_keeps_nothing_published()
        self.the_history_matches_the_status()
        recorded = {r.spider_id for r in rows if r.spider_id is not None}
        left = [
            (row.id, row.state, self._owner_name(row.owner))
            for row in self._engine_rows()
            if row.state in _UNFINISHED and (row.state != "Ready" or row.id in recorded)
        ]
        assert left == [], f"engine jobs left unfinished: {left}"
        self.check_archive_files_are_published()
        # Every replica restarts: the unrecorded Ready jobs of their previous engines are
        # cancelled, and nothing else is left to adopt.
        for name in self._up():
            self._crash(name, None, restart=True)
        states = Counter(row.state for row in self._engine_rows())
        assert not set(states) & _UNFINISHED, f"engine jobs after a restart: {dict(states)}"


EngineModel.TestCase.settings = model_settings(ci_examples=20, ci_steps=40, long_steps=45)
TestEngineModel = pytest.mark.slow(EngineModel.TestCase)
pytestmark = [pytest.mark.timeout(0)] if LONG_PROFILE else []
"""The long profile runs for longer than the suite's per-test timeout (all programs are one test;
a timeout in the middle of one would look like a flaky failure)."""


# --- what the model found, kept as explicit programs ---------------------------------------------


def _run(program: Callable[[EngineModel], None]) -> None:
    """Run ``program`` on a fresh model, then drain it and check quiescence (its teardown)."""
    model = EngineModel()
    try:
        model.start(jobs=1)
        program(model)
    finally:
        model.teardown()


def _instance(model: EngineModel, host: str) -> Instance:
    instance = model._take(host)
    assert instance is not None
    model.running.remove(instance)
    return instance


def test_a_report_whose_write_lost_its_reply_does_not_strand_the_job() -> None:
    """The last compress task's success is recorded (Running → CommitReady) by a commit whose
    reply is lost; the engine's retry then found the row no longer Running and dropped the job as
    "no longer this engine's": it stayed CommitReady for good, owned by a live engine that ran
    nothing (the model's first finding)."""

    def program(model: EngineModel) -> None:
        model.replicas["a"].tick()
        first, last = _instance(model, "a"), _instance(model, "a")
        model._end(first, "succeeds", None)
        assert model._end(last, "succeeds", (2, True, 3))

    _run(program)


def _lose_the_reply(model: EngineModel, name: str, call: str) -> Any:
    """Make the next ``call`` (``start_ready_jobs``, ``cancel_job``) of engine ``name`` apply its
    write and then see the database go away: its commit's reply is lost (BEGIN and UPDATE pass)."""
    spider = model.replicas[name].spider
    real = getattr(spider, call)

    def lost(argument: Any) -> Any:
        model.outage.arm(after_statements=2, reply_lost=True)
        return real(argument)

    return mock.patch.object(spider, call, lost)


@pytest.mark.parametrize("then", ["the engine sweeps", "the coordinator ticks"])
def test_a_start_whose_reply_was_lost_does_not_strand_the_job(then: str) -> None:
    """StartJob's write (the tick's start of its submissions, ``start_ready_jobs``) applied but
    its reply was lost: the tick fails (an outage), the row is Running while memory still says
    Ready. Before, the engine's sweep dropped the job as "no longer
    this engine's", and a StartJob of the next tick failed its compare-and-set and dropped it too:
    Running for good, owned by a live engine that ran nothing."""

    def program(model: EngineModel) -> None:
        with _lose_the_reply(model, "a", "start_ready_jobs"), pytest.raises(SQLAlchemyError):
            model.replicas["a"].tick()
        model.outage.end()
        if then == "the engine sweeps":
            model.replicas["a"].spider._sweep()
        model.clock.advance(1.0)
        model.replicas["a"].tick()

    _run(program)


def test_a_cancel_whose_reply_was_lost_does_not_strand_the_job() -> None:
    """CancelJob's write (Running → CleanupReady) applied but its reply was lost: memory still
    says Running and the engine hands out the compress tasks. Before, the last one's success found
    the row CleanupReady, the job was dropped, and the cancel could never be delivered again (the
    job is run by a live engine, which no longer knew it)."""

    def program(model: EngineModel) -> None:
        model.replicas["a"].tick()
        request_cancel(model.store, model.jobs[0], "model")
        model.clock.advance(1.0)
        with _lose_the_reply(model, "a", "cancel_job"), pytest.raises(SQLAlchemyError):
            model.replicas["a"].tick()
        model.outage.end()
        first, last = _instance(model, "a"), _instance(model, "a")
        model._end(first, "succeeds", None)
        model._end(last, "succeeds", None)

    _run(program)


def test_an_adoption_whose_reply_was_lost_does_not_strand_the_job() -> None:
    """Replica b dies for good with its job Running on its engine; a takes the compression job
    over and asks its engine about the Spider job, which adopts it: the compare-and-set of the
    owner applied but its reply was lost. Before, the row was then a's while a's engine did not
    know the job, and nothing ever looked at it again (the sweep adopts only other owners' jobs):
    Running for good."""

    def program(model: EngineModel) -> None:
        model.replicas["b"].tick()  # b submits and starts the job on its engine
        model._crash("b", None, restart=False)
        model._expire("b")
        model.clock.advance(65)
        spider = model.replicas["a"].spider
        real = spider._write_each

        def write_each(statements: list[Any], *, doing: str) -> list[int]:
            if doing.startswith("adopting"):  # BEGIN and the UPDATE pass, the commit's reply lost
                model.outage.arm(after_statements=2, reply_lost=True)
            return real(statements, doing=doing)

        with mock.patch.object(spider, "_write_each", write_each), pytest.raises(SQLAlchemyError):
            model.replicas["a"].tick()
        model.outage.end()

    _run(program)
