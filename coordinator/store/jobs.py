"""``JobStore``: the coordinator's access to compression jobs and their history."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property

from sqlalchemy import Connection, Engine, bindparam, func, insert, select, text

from coordinator import metrics
from coordinator.errors import CoordinatorError
from coordinator.lifecycle import (
    DEFAULT_COMMITTED_STORAGE,
    EDGES,
    Actor,
    CommittedStorage,
    JobStatus,
    state_of,
)
from coordinator.store import names
from coordinator.store.clock import Clock, utc_now
from coordinator.store.database import is_mysql, reading, retrying_deadlocks
from coordinator.store.expressions import in_flight_recording, unattributed_records
from coordinator.store.guarded import (
    Applied,
    LockedRow,
    TransitionRequest,
    TransitionResult,
    apply_transition,
    apply_transitions,
    validate_request,
)
from coordinator.store.messages import fit_status_msg
from coordinator.store.schema import compression_jobs as _jobs
from coordinator.store.schema import job_transitions as _history

_STATE = select(_jobs.c.status, _jobs.c.committed_at).where(_jobs.c.id == bindparam("job_id"))
"""Built once: SQLAlchemy reuses its cache key and compiled form (``JobStore.state``)."""

_ROW = select(_jobs).where(_jobs.c.id == bindparam("job_id"))
"""Every column of one job (``JobStore.get``)."""

_HISTORY = select(_history).where(_history.c.job_id == bindparam("job_id")).order_by(_history.c.id)
"""The job's history rows, oldest first (``JobStore.history``)."""

_STATES = select(_jobs.c.id, _jobs.c.status, _jobs.c.committed_at).where(
    _jobs.c.id.in_(bindparam("job_ids", expanding=True))
)

Effects = Callable[[Connection, Applied], None]
"""Statements that must commit with a move, or not at all (publish or withdraw archives...)."""


@dataclass(frozen=True)
class JobRow:
    """A snapshot of one ``compression_jobs`` row, every column (``JobStore.get``)."""

    id: int
    status: int
    status_msg: str
    creation_time: datetime
    start_time: datetime | None
    update_time: datetime
    duration: float | None
    original_size: int
    uncompressed_size: int
    compressed_size: int
    num_tasks: int
    num_tasks_completed: int
    clp_binary_version: int | None
    spider_id: int | None
    dispatch_time: datetime | None
    clp_config: bytes
    lease_owner: str | None
    lease_expires_at: datetime | None
    lease_epoch: int
    cancel_requested_at: datetime | None
    committed_at: datetime | None


@dataclass(frozen=True)
class TransitionRow:
    """One row of ``compression_job_transitions``, every column (``JobStore.history``)."""

    id: int
    job_id: int
    from_status: int
    to_status: int
    trigger: str
    actor: str
    actor_id: str
    reason: str
    spider_id: int | None
    lease_epoch: int
    at: datetime


for _edge in EDGES:  # the loop's moves are exported from the start, at zero
    if Actor.COORDINATOR in _edge.actors:
        metrics.TRANSITIONS.labels(_edge.trigger.value, Actor.COORDINATOR.value)
        metrics.LOST_RACES.labels(_edge.trigger.value)


def count_committed(request: TransitionRequest, result: TransitionResult) -> None:
    """Count a move whose transaction committed (``clp_coordinator_transitions_total``)."""
    if isinstance(result, Applied):
        metrics.TRANSITIONS.labels(result.edge.trigger.value, request.actor.value).inc()


class JobStore:
    """Guarded transitions and reads over one database."""

    def __init__(
        self,
        engine: Engine,
        *,
        clock: Clock = utc_now,
        committed_storage: CommittedStorage = DEFAULT_COMMITTED_STORAGE,
    ) -> None:
        self.engine = engine
        self.clock = clock
        self.committed_storage = committed_storage

    def transition(
        self, request: TransitionRequest, *, effects: Effects | None = None
    ) -> TransitionResult:
        """Apply ``request`` in its own transaction, with ``effects`` if (and only if) it applied.

        If ``effects`` raises, nothing of the move is kept (the transaction rolls back) and the
        exception propagates. Raises ``IllegalTransition``/``InvalidTransitionRequest`` before any
        SQL, and SQLAlchemy's ``DBAPIError`` family when the database fails. A move is counted
        (``clp_coordinator_transitions_total``) once its transaction committed.
        """
        validate_request(request)  # before BEGIN: a refused request must not take any lock
        with self.engine.begin() as connection:
            result = self.apply(connection, request)
            if isinstance(result, Applied) and effects is not None:
                effects(connection, result)
        count_committed(request, result)
        return result

    def transition_all(self, requests: Sequence[TransitionRequest]) -> list[TransitionResult]:
        """Apply each of ``requests`` in one transaction; their results, in order.

        Each is its own guarded move with its own history row, so one that loses its race leaves
        the others applied. A transaction MariaDB picks as a deadlock's victim runs again
        (``retrying_deadlocks``: the rows of a batch are locked one by one, so two writers can
        meet in opposite orders). Raises as ``transition`` does: a refused request before any SQL,
        and the database's errors, after which no move of the batch is kept.
        """
        for request in requests:
            validate_request(request)  # before BEGIN: a refused request must not take any lock

        def apply_all() -> list[TransitionResult]:
            with self.engine.begin() as connection:
                return self.apply_together(connection, requests)

        results = retrying_deadlocks(apply_all)
        for request, result in zip(requests, results, strict=True):
            count_committed(request, result)
        return results

    def apply(
        self, connection: Connection, request: TransitionRequest, locked: LockedRow | None = None
    ) -> TransitionResult:
        """Apply ``request`` inside the caller's transaction (see ``apply_transition``)."""
        return apply_transition(
            connection,
            request,
            now=self.clock(),
            fit_message=self.fit_status_msg,
            committed_storage=self.committed_storage,
            locked=locked,
        )

    def apply_together(
        self, connection: Connection, requests: Sequence[TransitionRequest]
    ) -> list[TransitionResult]:
        """Apply each of ``requests`` inside the caller's transaction, their history rows in one
        statement (see ``apply_transitions``); their results, in order."""
        return apply_transitions(
            connection,
            requests,
            now=self.clock(),
            fit_message=self.fit_status_msg,
            committed_storage=self.committed_storage,
        )

    def fit_status_msg(self, text_: str) -> str:
        """``text_`` fitted to this database's ``status_msg`` column (length and charset)."""
        return fit_status_msg(text_, charset=self._status_msg_charset)

    @cached_property
    def _status_msg_charset(self) -> str:
        # An adopted CLP table may use the server's default charset rather than utf8mb4.
        if not is_mysql(self.engine):
            return "utf8mb4"
        with reading(self.engine) as connection:
            charset = connection.execute(
                text(
                    "SELECT CHARACTER_SET_NAME FROM information_schema.COLUMNS "
                    "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = :table "
                    "AND COLUMN_NAME = 'status_msg'"
                ),
                {"table": names.COMPRESSION_JOBS},
            ).scalar_one_or_none()
        return str(charset or "utf8mb4")

    def create_job(self, clp_config: bytes) -> int:
        """Insert a PENDING job the way CLP's log-ingestor does (only ``clp_config``); its id."""
        with self.engine.begin() as connection:
            key = connection.execute(
                insert(_jobs).values(clp_config=clp_config)
            ).inserted_primary_key
        assert key is not None
        return int(key[0])

    def get(self, job_id: int) -> JobRow | None:
        """A snapshot of the job's row, or ``None``."""
        with reading(self.engine) as connection:
            row = connection.execute(_ROW, {"job_id": job_id}).mappings().one_or_none()
        return None if row is None else JobRow(**row)

    def state(self, job_id: int) -> JobStatus | None:
        """The lifecycle state of the job, ``None`` when there is no such job.

        Raises ``ValueError`` for a status no one defines.
        """
        with reading(self.engine) as connection:
            row = connection.execute(_STATE, {"job_id": job_id}).one_or_none()
        return None if row is None else state_of(row.status, row.committed_at)

    def states(self, job_ids: Sequence[int]) -> dict[int, JobStatus | None]:
        """The lifecycle states of ``job_ids``, read in one query.

        A job that does not exist is absent; one whose status no one defines maps to ``None``.
        """
        if not job_ids:
            return {}
        with reading(self.engine) as connection:
            rows = connection.execute(_STATES, {"job_ids": list(job_ids)}).all()
        states: dict[int, JobStatus | None] = {}
        for row in rows:
            try:
                states[int(row.id)] = state_of(row.status, row.committed_at)
            except ValueError:
                states[int(row.id)] = None
        return states

    def history(self, job_id: int) -> list[TransitionRow]:
        """The job's applied moves, oldest first."""
        with reading(self.engine) as connection:
            rows = connection.execute(_HISTORY, {"job_id": job_id}).mappings().all()
        return [TransitionRow(**row) for row in rows]


UNKNOWN_STATUS = "unknown"
"""The label of rows whose status no one defines, in ``jobs_by_status``."""


def jobs_by_status(engine: Engine) -> dict[str, int]:
    """How many rows of ``compression_jobs`` hold each lifecycle state, by lower-case name
    (``pending`` … ``killed``, every one present, zero included), plus ``unknown`` when rows
    hold a status no one defines. One ``GROUP BY`` query. Raises the driver's errors."""
    committed = _jobs.c.committed_at.is_not(None).label("committed")
    query = select(_jobs.c.status, committed, func.count()).group_by(_jobs.c.status, committed)
    counts = {status.name.lower(): 0 for status in JobStatus}
    with reading(engine) as connection:
        for status, is_committed, count in connection.execute(query):
            try:
                name = state_of(int(status), datetime.min if is_committed else None).name.lower()
            except ValueError:
                name = UNKNOWN_STATUS
            counts[name] = counts.get(name, 0) + int(count)
    return counts


def job_state(job: JobRow) -> JobStatus:
    """The lifecycle state of a row; raises ``ValueError`` for a status no one defines."""
    return state_of(job.status, job.committed_at)


class NoSuchJob(CoordinatorError, LookupError):
    """No compression job has this id."""


class SpiderJobUnmatched(CoordinatorError, LookupError):
    """No in-flight compression job records the Spider job id, or several do."""


_IN_FLIGHT_LOCKED = (
    select(
        _jobs.c.id,
        _jobs.c.status,
        _jobs.c.committed_at,
        _jobs.c.start_time,
        _jobs.c.lease_epoch,
        unattributed_records(bindparam("spider_id")).label("unattributed"),
    )
    .where(in_flight_recording(bindparam("spider_id")))
    .with_for_update()
)


@dataclass(frozen=True)
class InFlightJob:
    """The one in-flight job of a Spider job, as ``lock_in_flight_job`` read it under its lock."""

    state: JobStatus
    locked: LockedRow
    """What a move of it needs, so that the move reads the row no more."""
    unattributed: bool
    """Its Spider job stored archive records that name no job (a non-locking read, in the same
    statement): when ``False``, none of the records committed before this read needs the commit's
    attribution."""


def lock_in_flight_job(connection: Connection, spider_job_id: int) -> InFlightJob:
    """The one Running or Committed job that records ``spider_job_id``: its state, its row read
    ``FOR UPDATE`` (on SQLite, under the transaction's write lock), what a move of it needs
    (``LockedRow``), so that the move, made next in this transaction, reads the row no more, and
    whether the Spider job left records unattributed.

    A Spider job id alone is not an identity: CLP's Rust coordinator, an earlier engine or a reset
    Spider may have used it before, so terminal rows never match (their Spider job is over) and
    several in-flight rows are an ambiguity reported rather than guessed. Raises
    ``SpiderJobUnmatched`` saying which case it is, or the driver's errors.
    """
    rows = connection.execute(_IN_FLIGHT_LOCKED, {"spider_id": spider_job_id}).all()
    if not rows:
        raise SpiderJobUnmatched(
            f"no running CLP compression job records Spider job {spider_job_id}"
        )
    if len(rows) > 1:
        listed = ", ".join(str(row.id) for row in sorted(rows, key=lambda row: row.id))
        raise SpiderJobUnmatched(
            f"CLP compression jobs {listed} all record Spider job {spider_job_id} and are in "
            "flight; refusing to guess which one this Spider job belongs to"
        )
    (row,) = rows
    locked = LockedRow(int(row.id), row.start_time, int(row.lease_epoch))
    return InFlightJob(state_of(row.status, row.committed_at), locked, bool(row.unattributed))
