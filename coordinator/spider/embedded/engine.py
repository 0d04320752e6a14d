"""``EmbeddedSpider``: Spider's job semantics in-process (``spider-contract.md`` §2–§9).

What it reproduces:

* **RegisterJob** decodes and checks the payloads exactly as Spider's server does (a bad graph or
  input count is ``InvalidArgument``; an unknown resource group ``Unauthenticated``) and stores the
  job ``Ready``. **StartJob** moves ``Ready`` → ``Running``; anything else is a ``ServerError``.
* **Tasks** become runnable when their inputs are ready (input tasks at once, others when every
  parent succeeded). Each instance runs in an executor process under the task's hard timeout.
  A failure report uses up a retry; the (``max_num_retry`` + 1)-th fails the task and with it the
  whole job, with that failure's message. At most ``max_num_instances`` instances run at once; an
  instance past its soft timeout gets one duplicate when the limit allows.
* **Commit**: when every regular task has succeeded, the graph outputs are persisted with the state
  ``CommitReady`` and the commit task runs (before any regular task); its success makes the job
  ``Succeeded``, its failures retry and then fail the job.
* **Cancel** follows Spider's table (§8): ``Ready`` and ``Running`` → ``Cancelled`` (or
  ``CleanupReady`` when the graph has a cleanup task); ``CommitReady`` → ``CleanupReady`` with a
  cleanup task, and **refused** (``ServerError``, state unchanged) without one, where a real Spider
  would shut its storage server down; a terminal job still retained answers ``ServerError``, an
  older one answers its state. Running instances are never stopped; their reports are ignored.
* **Terminal states are final.** Late reports are rejected as stale.
* **Restart**: jobs live in ``spider_engine_jobs``; task states and retry counters only in memory.
  On start, ``Running`` jobs run again from the start, ``CommitReady`` jobs run their commit again,
  ``CleanupReady`` jobs their cleanup, ``Ready`` jobs wait for StartJob.
* **Job ids are never reused**, not even across a reset of the engine's tables or a database where
  CLP's Rust coordinator (or a Spider cluster since reset) already recorded Spider job ids: a new
  id is above the engine's own largest id *and* every Spider job id ``compression_jobs.spider_id``
  and ``compression_stored_archives.spider_job_id`` hold. It is written explicitly; two engines
  sharing a database that pick the same id collide on the primary key and the loser picks again
  (``register_job``).
* **Resource groups** live in ``spider_engine_resource_groups`` (``external_id`` unique), never in
  CLP's ``spider_resource_groups``. Besides Spider's two calls, the engine offers what Spider
  lacks, a get-or-create by name (``resource_group_by_name``), which the coordinator uses instead
  of keeping the id in CLP's table (``coordinator.service.resource_group``).

Deliberate differences: in-task failure messages are plain text, not Spider's lossy msgpack; the
fatal storage shutdowns of §7.3/§8 are refusals instead.
"""

from __future__ import annotations

import itertools
import logging
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from types import TracebackType
from typing import Any, Self, cast

from sqlalchemy import Connection, Engine, Table, func, insert, select, update
from sqlalchemy.exc import IntegrityError, OperationalError

from coordinator.spider.embedded.faults import Fault
from coordinator.spider.embedded.manager import Assignment, ExecutionManager
from coordinator.spider.embedded.protocol import Reply, Request
from coordinator.spider.policy import ExecutionPolicy
from coordinator.spider.port import (
    InvalidArgument,
    InvalidJobState,
    JobNotFound,
    JobState,
    ResourceGroupExists,
    ServerError,
    Unauthenticated,
)
from coordinator.spider.task_graph import (
    InvalidTaskGraph,
    TaskGraph,
    TerminationTask,
    decode_job_submission,
)
from coordinator.spider.wire import decode_job_outputs, encode_job_outputs
from coordinator.store.clock import utc_now
from coordinator.store.schema import CompressionJob, EngineJob, EngineResourceGroup, StoredArchive
from coordinator.tasks.context import WorkerSettings

_log = logging.getLogger(__name__)

CLP_PACKAGES: Mapping[str, str] = {"clp": "coordinator.tasks.registry:clp_package"}
STATE_NAMES = {
    JobState.READY: "Ready",
    JobState.RUNNING: "Running",
    JobState.COMMIT_READY: "CommitReady",
    JobState.CLEANUP_READY: "CleanupReady",
    JobState.SUCCEEDED: "Succeeded",
    JobState.FAILED: "Failed",
    JobState.CANCELLED: "Cancelled",
}
_STATES_BY_NAME = {name: state for state, name in STATE_NAMES.items()}
COMMIT, CLEANUP = "commit", "cleanup"
INTERNAL_ERROR = "storage service internal error"

_jobs_table = cast(Table, EngineJob.__table__)
_groups_table = cast(Table, EngineResourceGroup.__table__)
_compression_jobs = cast(Table, CompressionJob.__table__)
_stored_archives = cast(Table, StoredArchive.__table__)

_ID_ATTEMPTS = 50
"""How often ``register_job`` picks a new id after losing it to another engine (or a deadlock)."""
_MYSQL_DEADLOCK = 1213


class _TaskState(Enum):
    PENDING = "pending"
    READY = "ready"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


@dataclass
class _Task:
    key: str
    package: str
    task_func: str
    policy: ExecutionPolicy
    parents: frozenset[int] = frozenset()
    state: _TaskState = _TaskState.PENDING
    failures: int = 0
    instances: dict[int, float] = field(default_factory=dict)
    """Running instance id → its soft deadline (monotonic)."""
    duplicated: set[int] = field(default_factory=set)
    outputs: list[bytes] | None = None


@dataclass
class _Job:
    id: int
    graph: TaskGraph
    inputs: list[bytes]
    state: JobState
    tasks: list[_Task]
    commit: _Task | None
    cleanup: _Task | None
    graph_outputs: list[bytes] = field(default_factory=list)
    terminated_at: float | None = None

    def task(self, key: str) -> _Task | None:
        if key == COMMIT:
            return self.commit
        if key == CLEANUP:
            return self.cleanup
        return self.tasks[int(key)]


class EmbeddedSpider:
    """A Spider-compatible engine hosted in this process; use it as a context manager."""

    def __init__(
        self,
        database: Engine,
        settings: WorkerSettings,
        *,
        packages: Mapping[str, str] = CLP_PACKAGES,
        workers: int | None = None,
        executor_environment: Mapping[str, str] | None = None,
        terminated_job_retention_secs: float = 300.0,
    ) -> None:
        self._db = database
        self._condition = threading.Condition()
        self._jobs: dict[int, _Job] = {}
        self._regular_lane: deque[tuple[int, str, bool]] = deque()
        self._termination_lane: deque[tuple[int, str, bool]] = deque()
        self._faults: list[Fault] = []
        # Instance ids stay unique across restarts (tasks name scratch space after them).
        self._instance_ids = itertools.count(time.time_ns() // 1000)
        self._retention = terminated_job_retention_secs
        self._closed = False
        command = [sys.executable, "-m", "coordinator.spider.embedded.executor"]
        for name, factory in packages.items():
            command += ["--package", f"{name}={factory}"]
        environment = {**os.environ, **settings.to_environment(), **(executor_environment or {})}
        self._managers = [
            ExecutionManager(
                f"spider-em-{index}", command, environment, self._next_assignment, self._report
            )
            for index in range(workers or os.cpu_count() or 1)
        ]
        self._monitor = threading.Thread(target=self._watch, name="spider-monitor", daemon=True)

    # --- life cycle -------------------------------------------------------------------------

    def start(self) -> Self:
        """Recover unfinished jobs from the database and start the execution managers."""
        self._recover()
        for manager in self._managers:
            manager.start()
        self._monitor.start()
        return self

    def close(self) -> None:
        """Stop: running instances are killed, nothing more is recorded (as if the host died)."""
        with self._condition:
            self._closed = True
            self._condition.notify_all()
        for manager in self._managers:
            manager.stop()
        for manager in self._managers:
            manager.join(timeout=30)
        self._monitor.join(timeout=5)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def inject(self, fault: Fault) -> None:
        """Make the next ``fault.times`` matching task instances misbehave (tests only)."""
        with self._condition:
            self._faults.append(fault)

    # --- resource groups --------------------------------------------------------------------

    def add_resource_group(self, external_id: str, password: bytes) -> int:
        """A new resource group's id; ``ResourceGroupExists`` if the name is taken."""
        with self._db.begin() as connection:
            taken = connection.execute(
                select(_groups_table.c.id).where(_groups_table.c.external_id == external_id)
            ).first()
            if taken is not None:
                raise ResourceGroupExists(f"resource group {external_id!r} already exists")
            key = connection.execute(
                insert(_groups_table).values(external_id=external_id, password=password)
            ).inserted_primary_key
        assert key is not None
        return int(key[0])

    def verify_resource_group(self, resource_group_id: int, password: bytes) -> None:
        """``Unauthenticated`` unless the id exists with this password."""
        with self._db.connect() as connection:
            stored = connection.execute(
                select(_groups_table.c.password).where(_groups_table.c.id == resource_group_id)
            ).scalar_one_or_none()
        if stored is None or bytes(stored) != password:
            raise Unauthenticated("invalid resource group")

    def resource_group_by_name(self, external_id: str, password: bytes) -> int:
        """The id of the group ``external_id``, created with ``password`` when there is none.

        Not a Spider call (Spider has no lookup by name): the embedded engine's own records are the
        only place the id lives, so the coordinator asks them instead of keeping the id in CLP's
        ``spider_resource_groups``. Race-safe between engines sharing a database: the loser of
        two concurrent inserts hits the unique ``external_id`` and reads the winner's row. Raises
        ``Unauthenticated`` when the group exists with another password.
        """
        for _ in range(_ID_ATTEMPTS):
            with self._db.connect() as connection:
                row = connection.execute(
                    select(_groups_table.c.id, _groups_table.c.password).where(
                        _groups_table.c.external_id == external_id
                    )
                ).first()
            if row is not None:
                if bytes(row.password) != password:
                    raise Unauthenticated(
                        f"resource group {external_id!r} exists with another password"
                    )
                return int(row.id)
            try:
                return self.add_resource_group(external_id, password)
            except (ResourceGroupExists, IntegrityError):
                continue  # another engine created it meanwhile: read its row
            except OperationalError as error:
                if not _is_deadlock(error):
                    raise
        raise ServerError(f"{INTERNAL_ERROR}: cannot resolve resource group {external_id!r}")

    # --- jobs -------------------------------------------------------------------------------

    def register_job(
        self, resource_group_id: int, compressed_task_graph: bytes, compressed_inputs: bytes
    ) -> int:
        """Store a ``Ready`` job; see the port. Raises ``InvalidArgument``/``Unauthenticated``."""
        try:
            submission = decode_job_submission(compressed_task_graph, compressed_inputs)
        except InvalidTaskGraph as error:
            raise InvalidArgument(str(error)) from error
        job_id = self._insert_job(resource_group_id, compressed_task_graph, compressed_inputs)
        with self._condition:
            self._jobs[job_id] = _build_job(
                job_id, submission.task_graph, list(submission.inputs), JobState.READY
            )
        return job_id

    def _insert_job(
        self, resource_group_id: int, compressed_task_graph: bytes, compressed_inputs: bytes
    ) -> int:
        """Store the job ``Ready`` under a fresh id (module docstring); the id.

        The id is chosen, not left to the table's auto-increment (which restarts after a reset and
        knows nothing of the ids CLP's Rust coordinator recorded). Two engines choosing the same id
        at once collide on the primary key (MariaDB blocks the second insert until the first
        commits, then refuses it; SQLite's ``BEGIN IMMEDIATE`` serialises them anyway): the loser
        chooses again in a new transaction, which sees the winner's row.
        """
        for _ in range(_ID_ATTEMPTS):
            now = utc_now()
            try:
                with self._db.begin() as connection:
                    group = connection.execute(
                        select(_groups_table.c.id).where(_groups_table.c.id == resource_group_id)
                    ).first()
                    if group is None:
                        raise Unauthenticated("invalid resource group")
                    job_id = _next_job_id(connection)
                    connection.execute(
                        insert(_jobs_table).values(
                            id=job_id,
                            resource_group_id=resource_group_id,
                            state=STATE_NAMES[JobState.READY],
                            task_graph=compressed_task_graph,
                            inputs=compressed_inputs,
                            created_at=now,
                            updated_at=now,
                        )
                    )
                return job_id
            except IntegrityError:
                _log.debug("job id taken by another engine meanwhile; choosing again")
            except OperationalError as error:
                if not _is_deadlock(error):
                    raise
                _log.debug("deadlock while choosing a job id; choosing again")
        raise ServerError(f"{INTERNAL_ERROR}: no free job id after {_ID_ATTEMPTS} attempts")

    def start_job(self, job_id: int) -> JobState:
        """``Ready`` → ``Running``; ``JobNotFound`` if unknown or evicted, else ``ServerError``."""
        with self._condition:
            job = self._jobs.get(job_id)
            if job is None:
                raise JobNotFound(f"job {job_id} not found")
            if job.state is not JobState.READY:
                raise ServerError(INTERNAL_ERROR)
            self._set_state(job, JobState.RUNNING)
            self._release_input_tasks(job)
            return job.state

    def cancel_job(self, job_id: int) -> JobState:
        """Cancel per Spider's table (module docstring)."""
        with self._condition:
            job = self._jobs.get(job_id)
            if job is None:
                return self._stored_state(job_id)  # terminal and evicted: Spider answers its state
            if job.state.is_terminal or job.state is JobState.CLEANUP_READY:
                raise ServerError(INTERNAL_ERROR)
            if job.state is JobState.COMMIT_READY and job.cleanup is None:
                raise ServerError(
                    f"{INTERNAL_ERROR}: a CommitReady job without a cleanup task cannot be "
                    "cancelled (Spider's storage server would shut down)"
                )
            if job.state is JobState.READY and job.cleanup is not None:
                raise ServerError(
                    f"{INTERNAL_ERROR}: a Ready job with a cleanup task cannot be cancelled "
                    "(Spider's storage server would shut down)"
                )
            for task in (*job.tasks, job.commit):
                if task is not None and task.state in (_TaskState.PENDING, _TaskState.READY):
                    task.state = _TaskState.CANCELLED
            if job.cleanup is not None and job.state is not JobState.READY:
                self._set_state(job, JobState.CLEANUP_READY)
                job.cleanup.state = _TaskState.READY
                self._enqueue(job.id, CLEANUP, termination=True)
            else:
                self._set_state(job, JobState.CANCELLED)
            return job.state

    def get_job_state(self, job_id: int) -> JobState:
        """The job's state; ``JobNotFound`` if there is no such job."""
        with self._condition:
            job = self._jobs.get(job_id)
            if job is not None:
                return job.state
        return self._stored_state(job_id)

    def get_job_outputs(self, job_id: int) -> list[bytes]:
        """Graph outputs of a ``Succeeded`` job; ``InvalidJobState`` otherwise."""
        outputs = self._stored_result(job_id, JobState.SUCCEEDED, _jobs_table.c.outputs)
        return decode_job_outputs(bytes(outputs)) if outputs is not None else []

    def get_job_error(self, job_id: int) -> str:
        """The failure message of a ``Failed`` job; ``InvalidJobState`` otherwise."""
        return str(self._stored_result(job_id, JobState.FAILED, _jobs_table.c.error_message) or "")

    def _stored_result(self, job_id: int, required: JobState, column: Any) -> Any:
        state = self.get_job_state(job_id)
        if state is not required:
            raise InvalidJobState(
                f"job {job_id} is {STATE_NAMES[state]}, not {STATE_NAMES[required]}"
            )
        with self._db.connect() as connection:
            return connection.execute(select(column).where(_jobs_table.c.id == job_id)).scalar_one()

    # --- scheduling (called by execution managers) ------------------------------------------

    def _next_assignment(self, timeout: float) -> Assignment | None:
        with self._condition:
            if not self._termination_lane and not self._regular_lane and not self._closed:
                self._condition.wait(timeout)
            while not self._closed:
                lane = self._termination_lane or self._regular_lane
                if not lane:
                    return None
                job_id, key, forced = lane.popleft()
                assignment = self._assign(job_id, key, forced)
                if assignment is not None:
                    return assignment
            return None

    def _assign(self, job_id: int, key: str, forced: bool) -> Assignment | None:
        job = self._jobs.get(job_id)
        task = job.task(key) if job is not None else None
        if job is None or task is None or not _runnable(job, task):
            return None  # a stale queue entry: the job or task moved on
        if len(task.instances) >= task.policy.max_num_instances and not forced:
            return None  # Spider refuses the registration (TaskInstanceLimitExceeded)
        instance = next(self._instance_ids)
        timeouts = task.policy.timeout_policy
        task.instances[instance] = time.monotonic() + timeouts.soft_timeout_ms / 1000
        fault = self._take_fault(job_id, key)
        if fault is not None and fault.kind == "duplicate":
            self._enqueue(job_id, key, termination=key in (COMMIT, CLEANUP), forced=True)
        request = Request(
            package=task.package,
            task_func=task.task_func,
            job_id=job_id,
            task_id=key,
            instance_id=instance,
            inputs=self._inputs_of(job, task),
            graph_outputs=job.graph_outputs if key == COMMIT else [],
            fault=fault.for_executor() if fault is not None else None,
        )
        kind = fault.kind if fault is not None else None
        return Assignment(
            request,
            timeouts.hard_timeout_ms,
            lose_report=kind == "lose_report",
            cancelled_meanwhile=kind == "cancelled",
        )

    def _report(self, assignment: Assignment, reply: Reply) -> None:
        request = assignment.request
        with self._condition:
            job = self._jobs.get(request.job_id)
            task = job.task(request.task_id) if job is not None else None
            if self._closed or job is None or task is None:
                return
            if task.instances.pop(request.instance_id, None) is None or not _runnable(job, task):
                return  # stale: the job or task moved on while the instance ran
            if assignment.cancelled_meanwhile:
                self._set_state(job, JobState.CANCELLED)  # the report arrives too late
            elif assignment.lose_report:
                # The report never arrives; Spider re-queues the task when the manager is declared
                # dead, without using a retry.
                self._enqueue(job.id, task.key, termination=task.key in (COMMIT, CLEANUP))
            elif reply.error is None:
                self._task_succeeded(job, task, reply.outputs or [])
            else:
                self._task_failed(job, task, reply.error)
            self._condition.notify_all()

    def _task_succeeded(self, job: _Job, task: _Task, outputs: list[bytes]) -> None:
        task.state = _TaskState.SUCCEEDED
        task.outputs = outputs
        if task.key == COMMIT:
            self._set_state(job, JobState.SUCCEEDED)
            return
        if task.key == CLEANUP:
            self._set_state(job, JobState.CANCELLED)
            return
        index = int(task.key)
        for child in job.tasks:
            if (
                child.state is _TaskState.PENDING
                and index in child.parents
                and all(job.tasks[p].state is _TaskState.SUCCEEDED for p in child.parents)
            ):
                child.state = _TaskState.READY
                self._enqueue(job.id, child.key)
        if all(t.state is _TaskState.SUCCEEDED for t in job.tasks):
            job.graph_outputs = [
                output for i in job.graph.output_tasks for output in job.tasks[i].outputs or []
            ]
            if job.commit is None:
                self._set_state(job, JobState.SUCCEEDED, outputs=job.graph_outputs)
            else:
                self._set_state(job, JobState.COMMIT_READY, outputs=job.graph_outputs)
                job.commit.state = _TaskState.READY
                self._enqueue(job.id, COMMIT, termination=True)

    def _task_failed(self, job: _Job, task: _Task, message: str) -> None:
        task.failures += 1
        if task.failures <= task.policy.max_num_retry:
            self._enqueue(job.id, task.key, termination=task.key in (COMMIT, CLEANUP))
            return
        task.state = _TaskState.FAILED
        self._set_state(job, JobState.FAILED, error=message)

    # --- helpers (hold the condition) -------------------------------------------------------

    def _enqueue(
        self, job_id: int, key: str, *, termination: bool = False, forced: bool = False
    ) -> None:
        lane = self._termination_lane if termination else self._regular_lane
        if forced:
            lane.appendleft((job_id, key, True))
        else:
            lane.append((job_id, key, False))
        self._condition.notify_all()

    def _release_input_tasks(self, job: _Job) -> None:
        for task in job.tasks:
            if not task.parents and task.state is _TaskState.PENDING:
                task.state = _TaskState.READY
                self._enqueue(job.id, task.key)

    def _inputs_of(self, job: _Job, task: _Task) -> list[bytes]:
        if task.key in (COMMIT, CLEANUP):
            return []
        index = int(task.key)
        descriptor = job.graph.tasks[index]
        if descriptor.input_sources is None:
            offset = sum(len(job.graph.tasks[i].inputs) for i in job.graph.input_tasks if i < index)
            return job.inputs[offset : offset + len(descriptor.inputs)]
        return [
            (job.tasks[source.task_idx].outputs or [])[source.position]
            for source in descriptor.input_sources
        ]

    def _take_fault(self, job_id: int, key: str) -> Fault | None:
        for fault in self._faults:
            if fault.matches(job_id, key):
                fault.times -= 1
                return fault
        return None

    def _set_state(
        self,
        job: _Job,
        state: JobState,
        *,
        outputs: list[bytes] | None = None,
        error: str | None = None,
    ) -> None:
        values: dict[str, object] = {"state": STATE_NAMES[state], "updated_at": utc_now()}
        if outputs is not None:
            values["outputs"] = encode_job_outputs(outputs)
        if error is not None:
            values["error_message"] = error
        with self._db.begin() as connection:
            connection.execute(
                update(_jobs_table).where(_jobs_table.c.id == job.id).values(**values)
            )
        job.state = state
        if state.is_terminal:
            job.terminated_at = time.monotonic()
            _log.info(
                "spider job %d: %s%s", job.id, STATE_NAMES[state], f" ({error})" if error else ""
            )

    def _stored_state(self, job_id: int) -> JobState:
        with self._db.connect() as connection:
            name = connection.execute(
                select(_jobs_table.c.state).where(_jobs_table.c.id == job_id)
            ).scalar_one_or_none()
        if name is None:
            raise JobNotFound(f"job {job_id} not found")
        return _STATES_BY_NAME[name]

    # --- background ---------------------------------------------------------------------------

    def _watch(self) -> None:
        """Soft-timeout duplicates and eviction of terminal jobs from memory."""
        while True:
            with self._condition:
                if self._closed:
                    return
                now = time.monotonic()
                for job in list(self._jobs.values()):
                    if job.terminated_at is not None and now - job.terminated_at >= self._retention:
                        del self._jobs[job.id]
                        continue
                    for task in (*job.tasks, job.commit, job.cleanup):
                        if task is None or not _runnable(job, task):
                            continue
                        for instance, soft_deadline in task.instances.items():
                            if now >= soft_deadline and instance not in task.duplicated:
                                task.duplicated.add(instance)
                                self._enqueue(
                                    job.id, task.key, termination=task.key in (COMMIT, CLEANUP)
                                )
                self._condition.wait(0.1)

    def _recover(self) -> None:
        unfinished = [STATE_NAMES[s] for s in STATE_NAMES if not s.is_terminal]
        with self._db.connect() as connection:
            rows = connection.execute(
                select(_jobs_table).where(_jobs_table.c.state.in_(unfinished))
            ).all()
        with self._condition:
            for row in rows:
                submission = decode_job_submission(bytes(row.task_graph), bytes(row.inputs))
                state = _STATES_BY_NAME[row.state]
                job = _build_job(row.id, submission.task_graph, list(submission.inputs), state)
                self._jobs[job.id] = job
                if state is JobState.RUNNING:
                    self._release_input_tasks(job)  # from the start, as Spider does
                elif state is JobState.COMMIT_READY and job.commit is not None:
                    job.graph_outputs = decode_job_outputs(bytes(row.outputs))
                    job.commit.state = _TaskState.READY
                    self._enqueue(job.id, COMMIT, termination=True)
                elif state is JobState.CLEANUP_READY and job.cleanup is not None:
                    job.cleanup.state = _TaskState.READY
                    self._enqueue(job.id, CLEANUP, termination=True)
                _log.info("spider job %d recovered in %s", job.id, row.state)


def _next_job_id(connection: Connection) -> int:
    """One above every Spider job id the database knows of (the engine's, CLP's, the tasks')."""
    highest = 0
    for column in (
        _jobs_table.c.id,
        _compression_jobs.c.spider_id,
        _stored_archives.c.spider_job_id,
    ):
        value = connection.execute(select(func.max(column))).scalar_one_or_none()
        if value is not None:
            highest = max(highest, int(value))
    return highest + 1


def _is_deadlock(error: OperationalError) -> bool:
    """MariaDB's deadlock (1213), which concurrent inserts of one key can cause: retry."""
    args: tuple[object, ...] = tuple(getattr(error.orig, "args", ()))
    return len(args) > 0 and args[0] == _MYSQL_DEADLOCK


def _runnable(job: _Job, task: _Task) -> bool:
    if task.state is not _TaskState.READY:
        return False
    if task.key == COMMIT:
        return job.state is JobState.COMMIT_READY
    if task.key == CLEANUP:
        return job.state is JobState.CLEANUP_READY
    return job.state is JobState.RUNNING


def _termination_task(key: str, descriptor: TerminationTask | None) -> _Task | None:
    if descriptor is None:
        return None
    return _Task(
        key=key,
        package=descriptor.tdl_context.package,
        task_func=descriptor.tdl_context.task_func,
        policy=descriptor.execution_policy or ExecutionPolicy(),
    )


def _build_job(job_id: int, graph: TaskGraph, inputs: list[bytes], state: JobState) -> _Job:
    tasks = [
        _Task(
            key=str(index),
            package=descriptor.tdl_context.package,
            task_func=descriptor.tdl_context.task_func,
            policy=descriptor.execution_policy,
            parents=frozenset(s.task_idx for s in descriptor.input_sources or ()),
        )
        for index, descriptor in enumerate(graph.tasks)
    ]
    return _Job(
        id=job_id,
        graph=graph,
        inputs=inputs,
        state=state,
        tasks=tasks,
        commit=_termination_task(COMMIT, graph.commit_task),
        cleanup=_termination_task(CLEANUP, graph.cleanup_task),
    )
