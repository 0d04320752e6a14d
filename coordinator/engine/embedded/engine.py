"""``EmbeddedSpider``: Spider's job semantics in-process (``docs/spider.md``).

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
* **Cancel** follows Spider's table (Cancellation): ``Ready`` and ``Running`` → ``Cancelled`` (or
  ``CleanupReady`` when the graph has a cleanup task); ``CommitReady`` → ``CleanupReady`` with a
  cleanup task, and **refused** (``ServerError``, state unchanged) without one, where a real Spider
  would shut its storage server down; a terminal job still retained answers ``ServerError``, an
  older one answers its state. Running instances are never stopped; their reports are ignored.
* **Terminal states are final.** Late reports are rejected as stale.
* **Restart**: jobs live in ``spider_engine_jobs``; task states and retry counters only in memory.
  On start, ``Running`` jobs run again from the start, ``CommitReady`` jobs run their commit again,
  ``CleanupReady`` jobs their cleanup, ``Ready`` jobs wait for StartJob.
* **Ownership** (several engines on one database, one per coordinator replica): every job row has
  an ``owner``, the token of the engine's ``Presence`` (``coordinator.store.instances``: a row with
  a heartbeat). An engine runs only the jobs it owns, and writes a job's state only while it owns
  it and the stored state is the one it knows (``WHERE id = ? AND owner = ? AND state = ?``), so a
  stale engine cannot overwrite, and a terminal state is never rewritten; a write that finds the job
  gone drops it from memory. An engine *adopts* (compare-and-set of the owner) an unfinished job
  whose owner is gone, as after a restart (the restart above is the same adoption): at start, every
  ``sweep_interval_secs`` after, and whenever a caller asks about the job. An owner is gone when its
  token has no row (closed, or replaced by a restart of the same coordinator: adopted at once), or
  its row expired and this engine has itself been in touch with the database for a whole expiry
  period. The sweep leaves a job alone while an in-flight compression job that names it is leased to
  another coordinator: the coordinator that takes that lease over adopts it when it asks about it.
  A ``Ready`` job is handed to whichever engine starts it, and Ready/Running jobs (without a cleanup
  task) of another live engine are cancelled in the database, which that engine notices.
* **Outages**: writes made for task reports that meet an outage (``is_transient``) are retried with
  a bounded back-off until they succeed (logged once, then summarised when the database is back:
  ``coordinator.store.outage``); any other database error (a missing privilege, …) would repeat
  and is raised at once. Memory changes only after the write succeeded, and no thread dies of a
  database error. Calls made by the coordinator are not
  retried: they raise the database's error with nothing changed, or, when the database went away
  during the commit (its reply lost), with the write applied. Such a write is recognised: a retry
  whose compare-and-set finds the row already ours in the new state counts as done, and a row of
  this engine's in another unfinished state than memory knows (found by a write or the sweep), or
  one memory does not know at all (an adoption's, found by the sweep), is run from the row, as
  after a restart, instead of being dropped as if another engine had it or left alone for good.
* **Job ids are never reused**, not even across a reset of the engine's tables or a database where
  CLP's Rust coordinator (or a Spider cluster since reset) already recorded Spider job ids: a new
  id is above the engine's own largest id *and* every Spider job id ``compression_jobs.spider_id``
  and ``compression_stored_archives.spider_job_id`` hold. It is written explicitly; two engines
  sharing a database that pick the same id collide on the primary key and the loser picks again
  (``register_job``). CLP's two columns are read at the engine's first registration, not at every
  one (``_IdChooser``): an id they receive later is one a RegisterJob answered (the ``submitted``
  move records it, a compress instance of that job its archives), so an engine sharing the
  database chose it, and its row in ``spider_engine_jobs``, which no engine deletes, keeps the
  engine table's largest id at or above it. Two cases escape that argument. A reset of the
  engine's table while the engine runs deletes such rows: the engine notices it at its next
  registration (the table's smallest id changed, or its largest is below an id this engine
  stored) and reads CLP's columns again. An id another engine chose before the reset and that is
  recorded only after that read can still be reused (reading the columns at every registration
  narrowed that window without closing it). And a coordinator on another footing (a Spider
  cluster) recording ids in the same database at the same time chooses them without reading
  this engine's, so no reading on this side could keep the two apart.
* **Scratch directories** of killed instances (``coordinator.engine.tasks.scratch``): an instance
  holds a lock on its scratch directory in the staging directory while it runs. When an execution
  manager has reaped the executor of an instance it killed (hard timeout, ``close``) or that
  crashed, that instance's directories are removed, before its failure is reported; the whole
  staging directory is swept at start (the executors of a coordinator that was SIGKILLed died with
  it), every ``scratch_sweep_interval_secs`` (another engine sharing the staging directory may have
  died) and at close. A sweep removes only directories whose lock it can take: never a live
  instance's, whichever process or engine runs it.
* **Resource groups** live in ``spider_engine_resource_groups`` (``external_id`` unique), never in
  CLP's ``spider_resource_groups``. Besides Spider's two calls, the engine offers what Spider
  lacks, a get-or-create by name (``resource_group_by_name``), which the coordinator uses instead
  of keeping the id in CLP's table (``coordinator.service.resource_group``).

**Answers per call and state**, as Spider's storage service gives them (``spider-storage/src/
grpc.rs`` maps the errors of ``cache/job.rs``; "retained" is Spider's job cache: unfinished jobs,
and terminal ones for ``terminated_job_retention_secs``): an unknown id is ``JobNotFound`` for every
call. StartJob of a retained job that is not ``Ready`` is ``ServerError`` (``ensure_ready``,
cache/job.rs:1227, a stale state: INTERNAL, grpc.rs:420), of a terminal job no longer retained
``JobNotFound``. GetJobOutputs of a job that has not succeeded is ``ServerError`` while it is
retained (``ensure_succeeded``, cache/job.rs:1172, an internal error: INTERNAL) and
``InvalidJobState`` once it is not (read from the database: FAILED_PRECONDITION, grpc.rs:124).
GetJobError of a job that has not failed is ``InvalidJobState`` either way (always read from the
database). CancelJob: see above. A failed instance's message is rendered as Spider's execution
manager renders it (``protocol.in_task_failure``: ``in-task failure: `` and the lossy UTF-8 of the
msgpack error, runtime.rs:554).

One deliberate difference: where Spider's storage service meets an internal error and shuts itself
down (grpc.rs:380-398: CancelJob of a ``CommitReady`` job without a cleanup task or of a ``Ready``
job with one; GetJobOutputs of a retained job that has not succeeded), the engine answers the
same ``ServerError`` (INTERNAL) and carries on, the state unchanged. The port's helpers
(``start_if_ready``, ``cancel_if_safe``, outputs only after ``Succeeded``) never provoke them.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from enum import Enum
from types import TracebackType
from typing import Any, Self

from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    Row,
    and_,
    bindparam,
    exists,
    func,
    insert,
    or_,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError, OperationalError, SQLAlchemyError
from sqlalchemy.sql.dml import Update

from coordinator.engine.embedded.faults import Fault
from coordinator.engine.embedded.forkserver import ForkServer
from coordinator.engine.embedded.manager import TERMINATION_TASKS, Assignment, ExecutionManager
from coordinator.engine.embedded.protocol import Reply, Request
from coordinator.engine.tasks.context import WorkerSettings
from coordinator.engine.tasks.scratch import sweep_scratch
from coordinator.lifecycle import IN_FLIGHT_STATUS_VALUES
from coordinator.spider.policy import ExecutionPolicy
from coordinator.spider.port import (
    InvalidArgument,
    InvalidJobState,
    JobNotFound,
    JobState,
    ResourceGroupExists,
    ServerError,
    SpiderError,
    Unauthenticated,
    start_if_ready,
)
from coordinator.spider.task_graph import (
    InvalidTaskGraph,
    JobSubmission,
    TaskGraph,
    TerminationTask,
    decode_job_submission,
)
from coordinator.spider.wire import InvalidFrame, decode_job_outputs, encode_job_outputs
from coordinator.store.clock import utc_now
from coordinator.store.database import AutocommitWrites, is_deadlock, is_transient
from coordinator.store.instances import (
    DEFAULT_STALE_AFTER_SECS,
    ENGINE,
    Presence,
    known_tokens,
    live_tokens,
)
from coordinator.store.outage import Outage, OutageLines, backoff
from coordinator.store.schema import compression_jobs as _compression_jobs
from coordinator.store.schema import engine_jobs as _jobs_table
from coordinator.store.schema import engine_resource_groups as _groups_table
from coordinator.store.schema import stored_archives as _stored_archives

_log = logging.getLogger(__name__)

CLP_PACKAGES: Mapping[str, str] = {"clp": "coordinator.engine.tasks.registry:clp_package"}
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
COMMIT, CLEANUP = TERMINATION_TASKS
INTERNAL_ERROR = "storage service internal error"


_UNFINISHED = [STATE_NAMES[s] for s in STATE_NAMES if not s.is_terminal]

# The per-job statements, built once: SQLAlchemy memoizes a statement's cache key on the object, so
# executing these skips both building the expression and computing its key (building the UPDATE at
# every call was a quarter of ``_set_state``'s CPU).
_SET_STATE = update(_jobs_table).where(
    _jobs_table.c.id == bindparam("w_id"),
    _jobs_table.c.owner == bindparam("w_owner"),
    _jobs_table.c.state == bindparam("w_state"),
)
"""``_set_state``'s compare-and-set; the SET clause is the columns its parameters name."""
_START_ALL = (
    update(_jobs_table)
    .where(
        _jobs_table.c.id.in_(bindparam("w_ids", expanding=True)),
        _jobs_table.c.owner == bindparam("w_owner"),
        _jobs_table.c.state == STATE_NAMES[JobState.READY],
    )
    .values(state=STATE_NAMES[JobState.RUNNING], updated_at=bindparam("updated_at"))
)
"""StartJob's Ready → Running of several jobs: ``_SET_STATE`` for each, in one statement."""
_STARTED_AT = select(_jobs_table.c.id).where(
    _jobs_table.c.id.in_(bindparam("w_ids", expanding=True)),
    _jobs_table.c.owner == bindparam("w_owner"),
    _jobs_table.c.state == STATE_NAMES[JobState.RUNNING],
    _jobs_table.c.updated_at == bindparam("w_at"),
)
_INSERT_JOB = insert(_jobs_table)
_GROUP_AND_IDS = select(
    select(_groups_table.c.id)
    .where(_groups_table.c.id == bindparam("group_id"))
    .scalar_subquery()
    .label("group_id"),
    select(func.min(_jobs_table.c.id)).scalar_subquery().label("lowest"),
    select(func.max(_jobs_table.c.id)).scalar_subquery().label("highest"),
)
"""RegisterJob's read: whether the resource group exists, and the engine table's id range."""
_CLP_HIGHEST_IDS = select(
    select(func.max(_compression_jobs.c.spider_id)).scalar_subquery().label("jobs"),
    select(func.max(_stored_archives.c.spider_job_id)).scalar_subquery().label("archives"),
)
"""The largest Spider job ids CLP's tables record (``_IdChooser``)."""
_FIRST_BACKOFF_SECS = 0.1
_MAX_BACKOFF_SECS = 5.0
"""A write that meets an outage (``is_transient``) is tried again after these pauses, doubling."""
_OUTAGE_LINES = OutageLines(
    started="embedded engine: database unavailable while %(doing)s (%(error)s); retrying with "
    "back-off up to %(max_pause).0f s, nothing changes until it is back",
    ended="embedded engine: database available again after %(seconds).1f s (%(failures)d failed "
    "attempts)",
)
"""One line when an outage starts and one when it ends, for all the engine's threads together."""
_ADOPT_BATCH = 100

_ID_ATTEMPTS = 50
"""How often ``register_job`` picks a new id after losing it to another engine (or a deadlock)."""


class _JobLost(Exception):
    """The job's row is no longer this engine's (another engine adopted or cancelled it)."""


class _Stopping(Exception):
    """The engine closes while a write waits for the database."""


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


UNRECORDED_GRACE_SECS = 60.0
"""How long a gone owner's Ready job may wait for a compression job to record it."""
SCRATCH_SWEEP_INTERVAL_SECS = 60.0
"""How often the staging directory is swept for scratch directories of instances that are gone."""
UNDECODABLE_STORED_JOB = "the stored task graph, inputs or outputs cannot be decoded"
UNRECORDED_REGISTRATION = (
    "registered by a coordinator that stopped before recording it, and never started"
)


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
        presence: Presence | None = None,
        coordinator_name: str | None = None,
        stale_after_secs: float = DEFAULT_STALE_AFTER_SECS,
        sweep_interval_secs: float = 1.0,
        unrecorded_grace_secs: float = UNRECORDED_GRACE_SECS,
        scratch_sweep_interval_secs: float = SCRATCH_SWEEP_INTERVAL_SECS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``presence``: the hosting coordinator's registration, whose token owns this engine's
        jobs (its owner keeps it beating and closes it); without one the engine registers its own
        (kind ``engine``, expiring after ``stale_after_secs``). ``coordinator_name``: the hosting
        coordinator's ``instance_id`` (the sweep adopts jobs of compression jobs it leases).
        ``clock``: the monotonic seconds that soft timeouts and the retention of terminal jobs are
        measured in (a test moves its own instead of waiting)."""
        self._db = database
        self._single_writes = AutocommitWrites(database)
        self._presence = presence
        self._own_presence = presence is None
        self._coordinator_name = coordinator_name
        self._stale_after = stale_after_secs
        self._sweep_interval = sweep_interval_secs
        self._unrecorded_grace = timedelta(seconds=unrecorded_grace_secs)
        self._staging = settings.staging_directory
        self._scratch_sweep_interval = scratch_sweep_interval_secs
        self._stopping = threading.Event()
        self._outage = Outage(
            "the database", _log, lines=_OUTAGE_LINES, max_pause=_MAX_BACKOFF_SECS
        )
        self._condition = threading.Condition()
        # Held by RegisterJob from its insert until the job is in memory, and by the sweep while it
        # compares memory with this engine's rows: the sweep never sees a row of ours that memory
        # does not know yet, and the insert does not hold the condition, so execution managers
        # take assignments and report while a registration waits for the database.
        self._registering = threading.Lock()
        self._ids = _IdChooser()
        self._jobs: dict[int, _Job] = {}
        self._terminated: deque[_Job] = deque()
        """The jobs that ended in memory, in the order they ended (``_evict_terminated``)."""
        self._running: dict[int, tuple[_Job, _Task]] = {}
        """Instance id → its job and task, for every instance in a task's ``instances`` (and a few
        that ended since the last tick): ``_duplicate_overdue``."""
        self._regular_lane: deque[tuple[int, str, bool]] = deque()
        self._termination_lane: deque[tuple[int, str, bool]] = deque()
        self._faults: list[Fault] = []
        self._ended_listeners: list[Callable[[int], None]] = []
        # Instance ids stay unique across restarts (tasks name scratch space after them).
        self._instance_ids = itertools.count(time.time_ns() // 1000)
        self._retention = terminated_job_retention_secs
        self._clock = clock
        self._closed = False
        package_args: list[str] = []
        for name, factory in packages.items():
            package_args += ["--package", f"{name}={factory}"]
        environment = {**os.environ, **settings.to_environment(), **(executor_environment or {})}
        self._fork_server = ForkServer(package_args, environment)
        self._managers = [
            ExecutionManager(
                f"spider-em-{index}",
                self._fork_server.spawn,
                self._next_assignment,
                self._report,
                instance_gone=self._instance_gone,
                work_waiting=self._work_waiting,
            )
            for index in range(workers or os.cpu_count() or 1)
        ]
        self._monitor = threading.Thread(target=self._watch, name="spider-monitor", daemon=True)

    # --- life cycle -------------------------------------------------------------------------

    @property
    def token(self) -> str:
        """This engine's owner token (``spider_engine_jobs.owner`` of the jobs it runs)."""
        assert self._presence is not None, "start the engine first"
        return self._presence.token

    def start(self) -> Self:
        """Register, adopt the jobs of owners that are gone, and start the execution managers."""
        if self._presence is None:
            self._presence = Presence(
                self._db, ENGINE, stale_after_secs=self._stale_after
            ).register()
            self._presence.start()
        try:
            self._sweep()
        except BaseException:
            if self._own_presence:
                self._presence.close()
            raise
        sweep_scratch(self._staging)  # no executor of this engine runs yet
        for manager in self._managers:
            manager.start()
        self._monitor.start()
        return self

    def close(self) -> None:
        """Stop: running instances are killed, nothing more is recorded (as if the host died).

        An engine's own registration is deleted: its unfinished jobs are free for adoption at once.
        """
        self._stopping.set()
        with self._condition:
            self._closed = True
            self._condition.notify_all()
        for manager in self._managers:
            manager.stop()
        self._fork_server.close()  # every executor is gone with it, and no new one is forked
        for manager in self._managers:
            manager.join(timeout=30)
        if self._monitor.is_alive():
            self._monitor.join(timeout=5)
        sweep_scratch(self._staging)  # the instances that ran are gone with their executors
        if self._own_presence and self._presence is not None:
            self._presence.close()
        self._single_writes.dispose()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def on_job_ended(self, listener: Callable[[int], None]) -> None:
        """Call ``listener(job_id)`` whenever this engine records a job's terminal state (after the
        write, from the engine's threads or a caller's, holding the engine's lock: it must only
        take note, as ``Coordinator.wake`` does). Not a Spider call: the hosting coordinator polls
        the job at once instead of after its back-off."""
        with self._condition:
            self._ended_listeners.append(listener)

    def inject(self, fault: Fault) -> None:
        """Make the next ``fault.times`` matching task instances misbehave (tests only)."""
        with self._condition:
            self._faults.append(fault)

    # --- resource groups --------------------------------------------------------------------

    def add_resource_group(self, external_id: str, password: bytes) -> int:
        """A new resource group's id; ``ResourceGroupExists`` if the name is taken, also when a
        concurrent call took it between this one's look and its insert (the name is unique)."""
        try:
            with self._db.begin() as connection:
                taken = connection.execute(
                    select(_groups_table.c.id).where(_groups_table.c.external_id == external_id)
                ).first()
                if taken is not None:
                    raise ResourceGroupExists.named(external_id)
                key = connection.execute(
                    insert(_groups_table).values(external_id=external_id, password=password)
                ).inserted_primary_key
        except IntegrityError as error:
            raise ResourceGroupExists.named(external_id) from error
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
                if not is_deadlock(error):
                    raise
        raise ServerError(f"{INTERNAL_ERROR}: cannot resolve resource group {external_id!r}")

    # --- jobs -------------------------------------------------------------------------------

    def register_job(
        self, resource_group_id: int, compressed_task_graph: bytes, compressed_inputs: bytes
    ) -> int:
        """Store a ``Ready`` job; see the port. Raises ``InvalidArgument``/``Unauthenticated``."""
        [answer] = self.register_jobs(
            resource_group_id, [(compressed_task_graph, compressed_inputs)]
        )
        if isinstance(answer, SpiderError):
            raise answer
        return answer

    def register_jobs(
        self, resource_group_id: int, submissions: Sequence[tuple[bytes, bytes]]
    ) -> list[int | SpiderError]:
        """RegisterJob of each ``(compressed task graph, compressed inputs)`` of ``submissions``,
        in order: the new ``Ready`` job's id, or the ``SpiderError`` RegisterJob would raise in
        its place (``InvalidArgument`` for that payload; ``Unauthenticated`` or ``ServerError``
        for all of them). Every job is stored in one transaction (a tick's submissions cost one
        commit, not one each). Raises the database's errors (nothing stored, unless the database
        went away during the commit)."""
        answers: dict[int, int | SpiderError] = {}
        decoded: list[tuple[int, JobSubmission, bytes, bytes]] = []
        for position, (graph, inputs) in enumerate(submissions):
            try:
                decoded.append((position, decode_job_submission(graph, inputs), graph, inputs))
            except InvalidTaskGraph as error:
                answers[position] = InvalidArgument(str(error))
        if decoded:
            # The sweep never sees a row of ours without its job in memory (``_registering``);
            # the condition is held only to add them, not while the database is written.
            with self._registering:
                try:
                    job_ids = self._insert_jobs(
                        resource_group_id, [(graph, inputs) for _, _, graph, inputs in decoded]
                    )
                except (Unauthenticated, ServerError) as error:
                    answers.update((position, error) for position, *_ in decoded)
                else:
                    with self._condition:
                        for (position, submission, _, _), job_id in zip(
                            decoded, job_ids, strict=True
                        ):
                            self._jobs[job_id] = _build_job(
                                job_id,
                                submission.task_graph,
                                list(submission.inputs),
                                JobState.READY,
                            )
                            answers[position] = job_id
        return [answers[position] for position in range(len(submissions))]

    def _insert_jobs(
        self, resource_group_id: int, payloads: Sequence[tuple[bytes, bytes]]
    ) -> list[int]:
        """Store a ``Ready`` job of each ``(task graph, inputs)`` of ``payloads`` under fresh,
        consecutive ids (module docstring), all in one transaction; the ids.

        The ids are chosen, not left to the table's auto-increment (which restarts after a reset
        and knows nothing of the ids CLP's Rust coordinator recorded). Two engines choosing the
        same id at once collide on the primary key (MariaDB blocks the second insert until the
        first commits, then refuses it; SQLite's ``BEGIN IMMEDIATE`` serialises them anyway): the
        loser chooses again in a new transaction, which sees the winner's rows. Raises
        ``Unauthenticated`` for an unknown resource group, ``ServerError`` when every attempt
        collided, and the database's other errors (nothing stored, unless the database went away
        during the commit).
        """
        for _ in range(_ID_ATTEMPTS):
            now = utc_now()
            try:
                with self._db.begin() as connection:
                    found = connection.execute(
                        _GROUP_AND_IDS, {"group_id": resource_group_id}
                    ).one()
                    if found.group_id is None:
                        raise Unauthenticated("invalid resource group")
                    first = self._ids.choose(connection, found.lowest, found.highest)
                    job_ids = list(range(first, first + len(payloads)))
                    connection.execute(
                        _INSERT_JOB,
                        [
                            {
                                "id": job_id,
                                "resource_group_id": resource_group_id,
                                "state": STATE_NAMES[JobState.READY],
                                "task_graph": graph,
                                "inputs": inputs,
                                "created_at": now,
                                "updated_at": now,
                                "owner": self.token,
                            }
                            for job_id, (graph, inputs) in zip(job_ids, payloads, strict=True)
                        ],
                    )
                self._ids.stored(job_ids[0])  # first the smallest: it may be the table's first
                self._ids.stored(job_ids[-1])
                return job_ids
            except IntegrityError:
                _log.debug("job id taken by another engine meanwhile; choosing again")
            except OperationalError as error:
                if not is_deadlock(error):
                    raise
                _log.debug("deadlock while choosing a job id; choosing again")
        raise ServerError(f"{INTERNAL_ERROR}: no free job id after {_ID_ATTEMPTS} attempts")

    def start_job(self, job_id: int) -> JobState:
        """``Ready`` → ``Running``; ``JobNotFound`` if unknown or evicted, else ``ServerError``."""
        with self._condition:
            job = self._local(job_id) or self._take_ready(job_id)
            if job is None:
                try:
                    stored = self._stored_state(job_id)
                except JobNotFound:
                    raise
                if stored.is_terminal:
                    raise JobNotFound(f"job {job_id} not found")  # evicted, as Spider forgets
                raise ServerError(f"{INTERNAL_ERROR}: job {job_id} is {STATE_NAMES[stored]}")
            if job.state is not JobState.READY:
                raise ServerError(INTERNAL_ERROR)
            try:
                self._set_state(job, JobState.RUNNING, retry=False)
            except _JobLost:
                self._drop(job)
                raise ServerError(f"{INTERNAL_ERROR}: job {job_id} changed meanwhile") from None
            self._release_input_tasks(job)
            return job.state

    def start_ready_jobs(self, job_ids: Sequence[int]) -> list[JobState | SpiderError]:
        """``start_if_ready`` of each of ``job_ids``, in order: the state each is in afterwards,
        or its ``SpiderError`` in its place. The Ready → Running writes of the jobs this engine
        holds Ready are one transaction (a tick's submissions cost one commit, not one each);
        every other job, and one whose guarded write matched no row, is answered by
        ``start_if_ready`` alone, with ``start_job``'s rules. Raises the database's errors (none
        of the batch is started in memory then; a StartJob later finds what the commit did)."""
        with self._condition:
            ready = {
                job.id: job
                for job_id in job_ids
                if (job := self._jobs.get(job_id)) is not None and job.state is JobState.READY
            }
            written: set[int] = set()
            if ready:
                with self._db.begin() as connection:
                    written = _start_all(connection, self.token, list(ready))
                self._outage.recovered()
            answers: list[JobState | SpiderError] = []
            for job_id in job_ids:
                if job_id in written:
                    written.discard(job_id)  # a repeated id is answered as started below
                    job = ready[job_id]
                    job.state = JobState.RUNNING
                    self._release_input_tasks(job)
                    answers.append(job.state)
                    continue
                try:
                    answers.append(start_if_ready(self, job_id))
                except SpiderError as error:
                    answers.append(error)
            return answers

    def cancel_job(self, job_id: int) -> JobState:
        """Cancel per Spider's table (module docstring)."""
        with self._condition:
            job = self._local(job_id)
            if job is not None:
                try:
                    return self._cancel_here(job)
                except _JobLost:
                    self._drop(job)
        return self._cancel_elsewhere(job_id)

    def _cancel_here(self, job: _Job) -> JobState:
        _check_cancellable(job.state, has_cleanup=job.cleanup is not None)
        if job.cleanup is not None and job.state is not JobState.READY:
            self._set_state(job, JobState.CLEANUP_READY, retry=False)
            self._cancel_tasks(job)
            job.cleanup.state = _TaskState.READY
            self._enqueue(job.id, CLEANUP, termination=True)
        else:
            self._set_state(job, JobState.CANCELLED, retry=False)
            self._cancel_tasks(job)
        return job.state

    def _cancel_elsewhere(self, job_id: int) -> JobState:
        """Cancel a job another live engine runs (or that left memory): in the database.

        Only ``Ready`` and ``Running`` jobs without a cleanup task can be cancelled so (the owner
        notices at its next sweep or write and stops them); the rest follow Spider's table.
        """
        for _ in range(_ID_ATTEMPTS):
            with self._db.connect() as connection:
                row = connection.execute(
                    select(
                        _jobs_table.c.state, _jobs_table.c.task_graph, _jobs_table.c.inputs
                    ).where(_jobs_table.c.id == job_id)
                ).first()
            if row is None:
                raise JobNotFound(f"job {job_id} not found")
            state = _STATES_BY_NAME[row.state]
            if state.is_terminal:
                return state  # terminal and evicted: Spider answers its state
            try:
                graph = decode_job_submission(bytes(row.task_graph), bytes(row.inputs)).task_graph
            except (InvalidTaskGraph, InvalidFrame) as error:
                raise ServerError(
                    f"{INTERNAL_ERROR}: {UNDECODABLE_STORED_JOB} (job {job_id}): {error}"
                ) from error
            _check_cancellable(state, has_cleanup=graph.cleanup_task is not None)
            if graph.cleanup_task is not None:
                raise ServerError(
                    f"{INTERNAL_ERROR}: job {job_id} is run by another engine; its cleanup task "
                    "cannot be started from here"
                )
            with self._db.begin() as connection:
                cancelled = connection.execute(
                    update(_jobs_table)
                    .where(_jobs_table.c.id == job_id, _jobs_table.c.state == row.state)
                    .values(state=STATE_NAMES[JobState.CANCELLED], updated_at=utc_now())
                ).rowcount
            if cancelled == 1:
                _log.info("spider job %d: Cancelled (run by another engine)", job_id)
                return JobState.CANCELLED
        raise ServerError(f"{INTERNAL_ERROR}: job {job_id} keeps changing")

    def _cancel_tasks(self, job: _Job) -> None:
        for task in (*job.tasks, job.commit):
            if task is not None and task.state in (_TaskState.PENDING, _TaskState.READY):
                task.state = _TaskState.CANCELLED

    def get_job_state(self, job_id: int) -> JobState:
        """The job's state; ``JobNotFound`` if there is no such job."""
        with self._condition:
            job = self._local(job_id)
            if job is not None:
                return job.state
        return self._stored_state(job_id)

    def get_job_outputs(self, job_id: int) -> list[bytes]:
        """Graph outputs of a ``Succeeded`` job; otherwise ``ServerError`` while the job is
        retained, ``InvalidJobState`` once it is not (module docstring)."""
        with self._condition:
            job = self._local(job_id)
            if job is not None and job.state is not JobState.SUCCEEDED:
                # cache/job.rs:226-229: a retained job's outputs come from the cache, whose
                # ensure_succeeded (:1172) raises an internal error: INTERNAL, and Spider's storage
                # service shuts down (grpc.rs:380-387). Only the answer is copied.
                raise ServerError(
                    f"{INTERNAL_ERROR}: job {job_id} is {STATE_NAMES[job.state]}, not Succeeded "
                    "(Spider's storage server would shut down)"
                )
        outputs = self._stored_result(job_id, JobState.SUCCEEDED, _jobs_table.c.outputs)
        return decode_job_outputs(bytes(outputs)) if outputs is not None else []

    def get_job_error(self, job_id: int) -> str:
        """The failure message of a ``Failed`` job; ``InvalidJobState`` otherwise."""
        return str(self._stored_result(job_id, JobState.FAILED, _jobs_table.c.error_message) or "")

    def _stored_result(self, job_id: int, required: JobState, column: Any) -> Any:
        state = self.get_job_state(job_id)
        if state is not required:
            # Spider's text: its database error's, which grpc.rs:124 sends as the details.
            raise InvalidJobState(
                f"job in state {STATE_NAMES[state]}, expect state {STATE_NAMES[required]}"
            )
        with self._db.connect() as connection:
            return connection.execute(select(column).where(_jobs_table.c.id == job_id)).scalar_one()

    # --- scheduling (called by execution managers) ------------------------------------------

    def _work_waiting(self, timeout: float) -> bool:
        """Whether an assignment waits (after waiting at most ``timeout`` seconds for one), without
        taking it: an execution manager starts its executor only then (``manager``)."""
        with self._condition:
            self._wait_for_work(timeout)
            return not self._closed and bool(self._termination_lane or self._regular_lane)

    def _wait_for_work(self, timeout: float) -> None:
        """Wait at most ``timeout`` seconds for a lane to fill, unless one holds work or the
        engine is closed. Holds the condition."""
        if not self._termination_lane and not self._regular_lane and not self._closed:
            self._condition.wait(timeout)

    def _next_assignment(self, timeout: float) -> Assignment | None:
        with self._condition:
            self._wait_for_work(timeout)
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
        task.instances[instance] = self._clock() + timeouts.soft_timeout_ms / 1000
        self._running[instance] = (job, task)
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
            try:
                if assignment.cancelled_meanwhile:
                    self._set_state(job, JobState.CANCELLED)  # the report arrives too late
                elif assignment.lose_report:
                    # The report never arrives; Spider re-queues the task when the manager is
                    # declared dead, without using a retry.
                    self._enqueue(job.id, task.key, termination=task.key in (COMMIT, CLEANUP))
                elif reply.error is None:
                    self._task_succeeded(job, task, reply.outputs or [])
                else:
                    self._task_failed(job, task, reply.error)
            except _JobLost:
                self._drop(job)
            except _Stopping:
                return
            self._condition.notify_all()

    def _task_succeeded(self, job: _Job, task: _Task, outputs: list[bytes]) -> None:
        if task.key == COMMIT:
            self._set_state(job, JobState.SUCCEEDED)
            task.state = _TaskState.SUCCEEDED
            return
        if task.key == CLEANUP:
            self._set_state(job, JobState.CANCELLED)
            task.state = _TaskState.SUCCEEDED
            return
        if all(t.state is _TaskState.SUCCEEDED for t in job.tasks if t is not task):
            # The last task: the job's state changes first, then memory.
            graph_outputs = [
                output
                for i in job.graph.output_tasks
                for output in (outputs if job.tasks[i] is task else job.tasks[i].outputs or [])
            ]
            if job.commit is None:
                self._set_state(job, JobState.SUCCEEDED, outputs=graph_outputs)
            else:
                self._set_state(job, JobState.COMMIT_READY, outputs=graph_outputs)
            job.graph_outputs = graph_outputs
        task.state = _TaskState.SUCCEEDED
        task.outputs = outputs
        if job.state is JobState.COMMIT_READY and job.commit is not None:
            job.commit.state = _TaskState.READY
            self._enqueue(job.id, COMMIT, termination=True)
            return
        if job.state is not JobState.RUNNING:
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

    def _task_failed(self, job: _Job, task: _Task, message: str) -> None:
        if task.failures + 1 <= task.policy.max_num_retry:
            task.failures += 1
            self._enqueue(job.id, task.key, termination=task.key in (COMMIT, CLEANUP))
            return
        self._set_state(job, JobState.FAILED, error=message)
        task.failures += 1
        task.state = _TaskState.FAILED

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
        retry: bool = True,
    ) -> None:
        """Write the new state (guarded: still ours, still in the state memory knows), then change
        memory. ``retry``: wait out an outage (report paths), else raise its error (callers' paths).
        Raises ``_JobLost`` when the guard fails (unless an earlier attempt of this write applied:
        ``_written_before``), ``_Stopping`` when closed while waiting."""
        parameters: dict[str, object] = {
            "w_id": job.id,
            "w_owner": self.token,
            "w_state": STATE_NAMES[job.state],
            "state": STATE_NAMES[state],
            "updated_at": utc_now(),
        }
        if outputs is not None:
            parameters["outputs"] = encode_job_outputs(outputs)
        if error is not None:
            parameters["error_message"] = error
        written = self._write(
            _SET_STATE,
            parameters,
            retry=retry,
            doing=f"recording job {job.id} {STATE_NAMES[state]}",
        )
        if written != 1 and not self._written_before(job, state):
            raise _JobLost(job.id)
        job.state = state
        if state.is_terminal:
            job.terminated_at = self._clock()
            self._terminated.append(job)
            _log.info(
                "spider job %d: %s%s", job.id, STATE_NAMES[state], f" ({error})" if error else ""
            )
            for listener in self._ended_listeners:
                try:
                    listener(job.id)
                except Exception:
                    _log.exception("embedded engine: a job-ended listener failed")

    def _written_before(self, job: _Job, state: JobState) -> bool:
        """Whether the row already holds ``state``, ours, although the guarded write of it matched
        no row: an earlier attempt applied it and only its reply was lost (the database went away
        during its commit), so the write is done. A row still ours and unfinished in a third state
        is such a write of another move (a StartJob or CancelJob whose caller saw the error):
        memory catches up with it (``_catch_up``) and the move is lost. Holds the condition;
        raises the database's errors."""
        with self._db.connect() as connection:
            row = connection.execute(select(_jobs_table).where(_jobs_table.c.id == job.id)).first()
        if row is None or row.owner != self.token:
            return False
        if row.state == STATE_NAMES[state]:
            return True
        self._catch_up(job, row)
        return False

    def _catch_up(self, job: _Job | None, row: Row[Any]) -> None:
        """Memory knows ``job`` in another state than its row, or does not know it (``None``),
        although the row is this engine's: a write or an adoption of this engine applied although
        its reply was lost. An unfinished job is run from its row, as after a restart (``_adopt``:
        the compare-and-set keeps this engine the owner); a terminal one is dropped (reads go to
        the row). Holds the condition; raises the database's errors."""
        if row.state not in _UNFINISHED:
            if job is not None:
                self._drop(job)
            return
        _log.warning(
            "spider job %d is %s in the database, %s in memory (a write whose reply was lost "
            "applied); continuing from the database",
            row.id,
            row.state,
            "unknown" if job is None else STATE_NAMES[job.state],
        )
        self._adopt(row)

    def _catch_up_with(self, job_id: int, job: _Job | None) -> None:
        """``_catch_up`` with the row of ``job_id`` as it is now (dropping ``job`` when the row is
        gone or another engine's). Holds the condition; raises the database's errors."""
        with self._db.connect() as connection:
            row = connection.execute(select(_jobs_table).where(_jobs_table.c.id == job_id)).first()
        if row is not None and row.owner == self.token:
            self._catch_up(job, row)
        elif job is not None:
            self._drop(job)

    def _stored_state(self, job_id: int) -> JobState:
        with self._db.connect() as connection:
            name = connection.execute(
                select(_jobs_table.c.state).where(_jobs_table.c.id == job_id)
            ).scalar_one_or_none()
        if name is None:
            raise JobNotFound(f"job {job_id} not found")
        return _STATES_BY_NAME[name]

    # --- background ---------------------------------------------------------------------------

    def _write_each(self, statements: list[Update], *, doing: str) -> list[int]:
        """Execute ``statements`` in one transaction (``doing`` says what for); their row counts.
        Not retried: raises the database's errors (nothing written, or, when the commit's reply
        was lost, all of it)."""
        with self._db.begin() as connection:
            counts = [int(connection.execute(statement).rowcount) for statement in statements]
        self._outage.recovered()
        _log.debug("%s: %d row(s) written", doing, sum(counts))
        return counts

    def _write(
        self,
        statement: Update,
        parameters: Mapping[str, object] | None = None,
        *,
        retry: bool,
        doing: str,
    ) -> int:
        """Execute ``statement`` (with ``parameters``) as a transaction of its own (one request on
        MariaDB: ``AutocommitWrites``); its row count. With ``retry``, an unavailable database
        (``is_transient``) is waited out with a bounded back-off (``_Stopping`` if closed); any
        other error is raised at once, as it would repeat."""
        attempt = 0
        while True:
            try:
                with self._single_writes.connection() as connection:
                    count = connection.execute(statement, parameters).rowcount
                self._outage.recovered()
                return int(count)
            except SQLAlchemyError as error:
                if not retry or not is_transient(error):
                    raise
                self._outage.failed(error, doing=doing)
            attempt += 1
            if self._stopping.wait(backoff(attempt, _FIRST_BACKOFF_SECS, _MAX_BACKOFF_SECS)):
                raise _Stopping

    def _watch(self) -> None:
        """Soft-timeout duplicates, eviction of terminal jobs from memory, and the sweep."""
        next_sweep = time.monotonic() + self._sweep_interval
        next_scratch_sweep = time.monotonic() + self._scratch_sweep_interval
        while not self._stopping.is_set():
            with self._condition:
                if self._closed:
                    return
                now = self._clock()
                self._evict_terminated(now)
                self._duplicate_overdue(now)
            if time.monotonic() >= next_sweep:
                self._sweep_logged()
                next_sweep = time.monotonic() + self._sweep_interval
            if time.monotonic() >= next_scratch_sweep:
                sweep_scratch(self._staging)
                next_scratch_sweep = time.monotonic() + self._scratch_sweep_interval
            self._stopping.wait(0.1)

    def _duplicate_overdue(self, now: float) -> None:
        """Give each running instance past its soft deadline one duplicate (``_enqueue``; the
        instance limit is applied when it is assigned). Looks only at the instances in
        ``_running``, not at every task of every job in memory, and forgets those that ended or
        whose job or task moved on (their reports are stale). Holds the condition."""
        for instance, (job, task) in list(self._running.items()):
            soft_deadline = task.instances.get(instance)
            if (
                soft_deadline is None
                or self._jobs.get(job.id) is not job
                or not _runnable(job, task)
            ):
                del self._running[instance]
                continue
            if now >= soft_deadline and instance not in task.duplicated:
                task.duplicated.add(instance)
                self._enqueue(job.id, task.key, termination=task.key in (COMMIT, CLEANUP))

    def _evict_terminated(self, now: float) -> None:
        """Forget the terminal jobs retained for ``terminated_job_retention_secs`` (reads go to
        their rows from then on), oldest first: only those due are looked at, not every job
        retained. Holds the condition."""
        while self._terminated:
            job = self._terminated[0]
            assert job.terminated_at is not None
            if now - job.terminated_at < self._retention:
                return
            self._terminated.popleft()
            if self._jobs.get(job.id) is job:
                del self._jobs[job.id]

    def _sweep_logged(self) -> None:
        """``_sweep``, its errors logged: an outage as one (``_outage``), any other error with its
        traceback. Never raises (the next sweep tries again)."""
        try:
            self._sweep()
        except Exception as error:
            if isinstance(error, SQLAlchemyError) and is_transient(error):
                self._outage.failed(error, doing="looking for jobs to adopt")
            else:
                _log.exception("embedded engine: the sweep failed; trying again")
        else:
            self._outage.recovered()

    def _instance_gone(self, request: Request) -> None:
        """An execution manager reaped the executor of an instance that was running: its scratch
        directories are removed (their lock died with it)."""
        sweep_scratch(
            self._staging, instance=(request.job_id, request.task_id, request.instance_id)
        )

    # --- ownership ----------------------------------------------------------------------------

    def _sweep(self) -> None:
        """Make memory agree with this engine's rows, then adopt the jobs whose owner is gone.

        A job in memory whose row is gone or another engine's is dropped. A row of this engine's
        in another state than memory knows, or unknown to memory, is one that a write or an
        adoption of this engine changed although its reply was lost: it is caught up with
        (``_catch_up``)."""
        with self._registering:
            self._sweep_own_rows()
        after = 0
        while not self._closed:
            orphans = self._orphans(after)
            if not orphans:
                return
            after = orphans[-1].id
            adoptable = [orphan for orphan in orphans if not self._forget_unrecorded(orphan)]
            with self._condition:
                if not self._closed:
                    self._adopt_all([row for row in adoptable if row.id not in self._jobs])
            if len(orphans) < _ADOPT_BATCH:
                return

    def _sweep_own_rows(self) -> None:
        """The first part of ``_sweep``: memory against this engine's rows (holds
        ``_registering``, so no registered job is between its row and memory)."""
        with self._condition:
            mine = {
                job_id: (job, job.state)
                for job_id, job in self._jobs.items()
                if not job.state.is_terminal
            }
        with self._db.connect() as connection:
            stored = {
                row.id: row
                for row in connection.execute(
                    select(_jobs_table.c.id, _jobs_table.c.owner, _jobs_table.c.state).where(
                        or_(
                            _jobs_table.c.id.in_(list(mine)),
                            and_(
                                _jobs_table.c.owner == self.token,
                                _jobs_table.c.state.in_(_UNFINISHED),
                            ),
                        )
                    )
                )
            }
        with self._condition:
            for job_id, (job, state) in mine.items():
                row = stored.get(job_id)
                if self._jobs.get(job_id) is not job or job.state is not state:
                    continue  # changed meanwhile (by this engine): looked at next time
                if row is None or row.owner != self.token:
                    self._drop(job)
                elif row.state != STATE_NAMES[state]:
                    self._catch_up_with(job_id, job)
            for job_id in stored.keys() - mine.keys():
                if job_id not in self._jobs and not self._closed:
                    self._catch_up_with(job_id, None)

    def _forget_unrecorded(self, row: Row[Any]) -> bool:
        """Whether ``row`` is a gone owner's Ready job that no compression job records.

        Its coordinator registered it and died before recording it (the window between
        RegisterJob and the guarded ``submitted`` move): nothing will start it, and its compression
        job is registered anew. Such a job is never adopted (adopted, it would stay Ready for
        ever, owned by a live engine): it is left alone for the grace, in case the record is only
        late, then cancelled. Raises the database's errors (nothing changed).
        """
        if row.state != STATE_NAMES[JobState.READY]:
            return False
        now = utc_now()
        with self._db.begin() as connection:
            recorded = connection.execute(
                select(_compression_jobs.c.id).where(_compression_jobs.c.spider_id == row.id)
            ).first()
            if recorded is not None:
                return False
            if row.created_at > now - self._unrecorded_grace:
                return True  # not adopted yet; cancelled once the grace is over
            cancelled = connection.execute(
                self._end_unadopted(row, JobState.CANCELLED, UNRECORDED_REGISTRATION, now)
            ).rowcount
        if cancelled == 1:
            _log.warning("spider job %d: %s; cancelled", row.id, UNRECORDED_REGISTRATION)
        return True

    def _gone_owner(self, now: Any) -> Any:
        """SQL: the job's owner is gone (module docstring)."""
        assert self._presence is not None
        owners = live_tokens(now) if self._presence.sees_the_living() else known_tokens()
        return or_(_jobs_table.c.owner.is_(None), _jobs_table.c.owner.not_in(owners))

    def _orphans(self, after: int = 0) -> list[Row[Any]]:
        """Unfinished jobs of gone owners that no other coordinator's live compression job names:
        the first ``_ADOPT_BATCH`` of them whose id is above ``after``."""
        now = utc_now()
        leased_elsewhere = exists().where(
            _compression_jobs.c.spider_id == _jobs_table.c.id,
            _compression_jobs.c.status.in_(list(IN_FLIGHT_STATUS_VALUES)),
            _compression_jobs.c.lease_owner.is_not(None),
            *(
                [_compression_jobs.c.lease_owner != self._coordinator_name]
                if self._coordinator_name is not None
                else []
            ),
        )
        with self._db.connect() as connection:
            return list(
                connection.execute(
                    select(_jobs_table)
                    .where(
                        _jobs_table.c.id > after,
                        _jobs_table.c.state.in_(_UNFINISHED),
                        or_(_jobs_table.c.owner.is_(None), _jobs_table.c.owner != self.token),
                        self._gone_owner(now),
                        ~leased_elsewhere,
                    )
                    .order_by(_jobs_table.c.id)
                    .limit(_ADOPT_BATCH)
                ).all()
            )

    def _local(self, job_id: int) -> _Job | None:
        """The job in memory, or adopted now when its owner is gone; ``None`` otherwise.

        Holds the condition. Raises the database's errors (nothing changed).
        """
        job = self._jobs.get(job_id)
        if job is not None or self._closed:
            return job
        with self._db.connect() as connection:
            row = connection.execute(
                select(_jobs_table).where(
                    _jobs_table.c.id == job_id,
                    _jobs_table.c.state.in_(_UNFINISHED),
                    self._gone_owner(utc_now()),
                )
            ).first()
        if row is None or self._forget_unrecorded(row):
            return None
        return self._adopt(row)

    def _take_ready(self, job_id: int) -> _Job | None:
        """A ``Ready`` job of another engine, handed over to this one (it runs nothing yet)."""
        with self._db.begin() as connection:
            row = connection.execute(
                select(_jobs_table).where(
                    _jobs_table.c.id == job_id,
                    _jobs_table.c.state == STATE_NAMES[JobState.READY],
                )
            ).first()
        return self._adopt(row) if row is not None else None

    def _adopt(self, row: Row[Any]) -> _Job | None:
        """Take the job of ``row`` over and run it as after a restart (``_adopt_all``); ``None``
        when another engine was faster or the row cannot be decoded. Holds the condition."""
        return self._adopt_all([row]).get(row.id)

    def _adopt_all(self, rows: list[Row[Any]]) -> dict[int, _Job]:
        """Take the jobs of ``rows`` over (a compare-and-set of each one's owner, all in one
        transaction) and run them as after a restart; the jobs taken, by id. A job another engine
        took first is left to it. One whose row cannot be decoded any more (a graph an earlier
        version accepted that Spider's rules refuse) is failed, saying so, rather than owned and
        never run. Holds the condition; raises the database's errors (nothing taken)."""
        decoded = []
        for row in rows:
            state = _STATES_BY_NAME[row.state]
            try:
                submission = decode_job_submission(bytes(row.task_graph), bytes(row.inputs))
                outputs = (
                    decode_job_outputs(bytes(row.outputs or b""))
                    if state is JobState.COMMIT_READY
                    else []
                )
            except (InvalidTaskGraph, InvalidFrame) as error:
                self._fail_undecodable(row, f"{UNDECODABLE_STORED_JOB}: {error}")
                continue
            decoded.append((row, state, submission, outputs))
        if not decoded:
            return {}
        counts = self._write_each(
            [
                update(_jobs_table).where(*_unchanged_since(row)).values(owner=self.token)
                for row, *_ in decoded
            ],
            doing=f"adopting {len(decoded)} job(s)",
        )
        taken = [item for item, count in zip(decoded, counts, strict=True) if count == 1]
        adopted = {}
        for row, state, submission, outputs in taken:
            adopted[row.id] = self._run_adopted(row, state, submission, outputs)
        return adopted

    def _run_adopted(
        self, row: Row[Any], state: JobState, submission: JobSubmission, outputs: list[bytes]
    ) -> _Job:
        """An adopted job in memory, its tasks queued as after a restart. Holds the condition."""
        job = _build_job(row.id, submission.task_graph, list(submission.inputs), state)
        self._jobs[job.id] = job
        if state is JobState.RUNNING:
            self._release_input_tasks(job)  # from the start, as Spider does
        elif state is JobState.COMMIT_READY and job.commit is not None:
            job.graph_outputs = outputs
            job.commit.state = _TaskState.READY
            self._enqueue(job.id, COMMIT, termination=True)
        elif state is JobState.CLEANUP_READY and job.cleanup is not None:
            job.cleanup.state = _TaskState.READY
            self._enqueue(job.id, CLEANUP, termination=True)
        _log.info(
            "spider job %d adopted in %s (owner was %s)",
            job.id,
            row.state,
            row.owner or "none",
        )
        return job

    def _fail_undecodable(self, row: Row[Any], message: str) -> None:
        """End the unfinished job of ``row`` Failed with ``message`` (compare-and-set, as
        adoption); raises the database's errors."""
        failed = self._write(
            self._end_unadopted(row, JobState.FAILED, message, utc_now()),
            retry=False,
            doing=f"failing job {row.id}",
        )
        if failed == 1:
            _log.warning("spider job %d: Failed (%s)", row.id, message)

    def _end_unadopted(self, row: Row[Any], state: JobState, message: str, now: Any) -> Update:
        """The compare-and-set that ends a gone owner's job of ``row`` in ``state`` without running
        it, this engine recorded as the one that ended it."""
        return (
            update(_jobs_table)
            .where(*_unchanged_since(row))
            .values(
                state=STATE_NAMES[state], owner=self.token, error_message=message, updated_at=now
            )
        )

    def _drop(self, job: _Job) -> None:
        """Forget a job that is no longer this engine's (holds the condition)."""
        if self._jobs.get(job.id) is job:
            del self._jobs[job.id]
            _log.warning(
                "spider job %d is no longer this engine's (adopted or cancelled elsewhere); "
                "dropped",
                job.id,
            )


def _unchanged_since(row: Row[Any]) -> tuple[ColumnElement[bool], ...]:
    """The compare-and-set of a job row: same id, state and owner as when ``row`` was read."""
    owner = row.owner
    same_owner = _jobs_table.c.owner.is_(None) if owner is None else _jobs_table.c.owner == owner
    return (_jobs_table.c.id == row.id, _jobs_table.c.state == row.state, same_owner)


def _check_cancellable(state: JobState, *, has_cleanup: bool) -> None:
    """Spider's refusals of a cancel (module docstring)."""
    if state.is_terminal or state is JobState.CLEANUP_READY:
        raise ServerError(INTERNAL_ERROR)
    if state is JobState.COMMIT_READY and not has_cleanup:
        raise ServerError(
            f"{INTERNAL_ERROR}: a CommitReady job without a cleanup task cannot be "
            "cancelled (Spider's storage server would shut down)"
        )
    if state is JobState.READY and has_cleanup:
        raise ServerError(
            f"{INTERNAL_ERROR}: a Ready job with a cleanup task cannot be cancelled "
            "(Spider's storage server would shut down)"
        )


class _IdChooser:
    """RegisterJob's choice of a new job id (module docstring, "Job ids are never reused"): one
    above the engine table's largest id, the largest id CLP's tables recorded when they were last
    read, and the largest id this engine stored. CLP's tables are read at the first registration
    and again only when the engine's table was reset meanwhile: its smallest id changed, or its
    largest is below one this engine stored (rows are never deleted otherwise). Used under the
    engine's ``_registering`` lock; the caller's transaction is used for the reads."""

    def __init__(self) -> None:
        self._clp_highest: int | None = None
        self._lowest: int | None = None
        """The engine table's smallest id when CLP's tables were read (``None``: it was empty)."""
        self._stored = 0

    def choose(self, connection: Connection, lowest: int | None, highest: int | None) -> int:
        """The id to insert, given the engine table's smallest and largest ids as the
        registration's transaction reads them; raises the database's errors."""
        if self._clp_highest is None or lowest != self._lowest or (highest or 0) < self._stored:
            recorded = connection.execute(_CLP_HIGHEST_IDS).one()
            self._clp_highest = max(int(recorded.jobs or 0), int(recorded.archives or 0))
            self._lowest = lowest
        return max(int(highest or 0), self._clp_highest, self._stored) + 1

    def stored(self, job_id: int) -> None:
        """``job_id``'s row was committed."""
        self._stored = max(self._stored, job_id)
        if self._lowest is None:
            self._lowest = job_id  # the table's first row: not a reset


def _start_all(connection: Connection, owner: str, job_ids: list[int]) -> set[int]:
    """Which of ``job_ids`` (held Ready by engine ``owner``) this transaction moved Ready →
    Running: one compare-and-set statement for them all. When it matched fewer rows than jobs
    (another engine took some over), the rows it wrote are read back by their new ``updated_at``.
    Raises the driver's errors."""
    now = utc_now()
    matched = connection.execute(
        _START_ALL, {"w_ids": job_ids, "w_owner": owner, "updated_at": now}
    ).rowcount
    if matched == len(job_ids):
        return set(job_ids)
    rows = connection.execute(_STARTED_AT, {"w_ids": job_ids, "w_owner": owner, "w_at": now})
    return {int(row.id) for row in rows}


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
