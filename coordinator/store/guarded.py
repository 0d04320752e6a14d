"""Guarded transitions: the only code that writes ``compression_jobs.status``.

A transition is one compare-and-set inside the caller's database transaction::

    UPDATE compression_jobs SET status = :dest, update_time = :now, <what the edge records>
     WHERE id = :id AND <the source state's stored form> <AND the edge's row guards>
       [AND lease_epoch = :fence]

A fenced move into a terminal state also ends its lease in that statement (``lease_expires_at =
:now``): no coordinator is to drive an ended job, and another may claim nothing of it anyway.

The stored forms come from ``coordinator.lifecycle.storage``: Running is ``status = 1 AND
committed_at IS NULL``, Committed is ``status IN (1, 5) AND committed_at IS NOT NULL``, and a move
into Committed writes ``committed_at`` with the status its ``CommittedStorage`` setting selects.

The compare-and-set is followed by a check of the matched row count and, when it matched, the
history row (the rows of moves applied together, ``apply_transitions``, in one statement after
them). Fenced moves of one edge that write the same values, such as a tick's finalisations, are
made together: one locking read of the rows that still hold what each request expects (``(id,
spider_id, lease_epoch) IN (…)`` and the shared guards), then one ``UPDATE`` that repeats every
guard, its row count checked against the rows read.

The edge comes from ``coordinator.lifecycle`` (``plan_transition``), so an illegal move is
refused before any SQL runs. Zero matched rows is a normal outcome: the job moved on (or another
writer, such as CLP's legacy scheduler, got there first) and the caller receives a ``LostRace``
saying what the row holds now, or ``NotFound``. Nothing is overwritten. Each lost race is
counted, by trigger (``clp_coordinator_lost_races_total``, ``coordinator.metrics``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import Any

from sqlalchemy import (
    Column,
    ColumnElement,
    Connection,
    Insert,
    Select,
    Update,
    bindparam,
    case,
    func,
    insert,
    select,
    tuple_,
    update,
)

from coordinator import metrics
from coordinator.errors import CoordinatorError
from coordinator.lifecycle import (
    DEFAULT_COMMITTED_STORAGE,
    STORED_FORMS,
    Actor,
    CommittedStorage,
    Edge,
    JobStatus,
    Record,
    RowGuard,
    Trigger,
    describe_stored,
    plan_transition,
    state_of,
    stored_status,
)
from coordinator.store.expressions import in_constants
from coordinator.store.messages import fit_status_msg
from coordinator.store.schema import compression_jobs as _jobs
from coordinator.store.schema import job_transitions as _history

INT32_MAX = 2**31 - 1
"""``num_tasks`` is CLP's ``INT`` column."""


class InvalidTransitionRequest(CoordinatorError, ValueError):
    """A request that lacks what its edge must record, or carries impossible values.

    Raised before any SQL runs; it is a bug in the caller, not a race.
    """


@dataclass(frozen=True)
class TransitionRequest:
    """A request to move job ``job_id`` from ``source`` to ``target`` by ``trigger``.

    ``source`` is the status the caller last saw: the CAS fails if the row holds another.
    ``reason`` goes to the history and, for edges into Failed or Killed, to ``status_msg``.
    ``fence`` is the ``lease_epoch`` the caller holds: when given, the write only applies while the
    row still carries it (a coordinator whose job was taken over cannot write).
    """

    job_id: int
    trigger: Trigger
    source: JobStatus
    target: JobStatus
    actor: Actor
    reason: str = ""
    actor_id: str = ""
    spider_id: int | None = None
    num_tasks: int | None = None
    uncompressed_size: int | None = None
    compressed_size: int | None = None
    fence: int | None = None
    unless_cancel_requested: bool = False
    """When set, the write only applies while no operator has asked to cancel the job
    (``cancel_requested_at IS NULL``): a submission never wins over a cancel request."""


@dataclass(frozen=True)
class Applied:
    """The move happened; the history row ``history_id`` records it (``None`` for a move applied
    with others, ``apply_transitions``, whose history rows were written in one statement)."""

    job_id: int
    edge: Edge
    at: datetime
    history_id: int | None


@dataclass(frozen=True)
class LostRace:
    """The row no longer matched the request: it holds ``actual_status`` (and the rest) now.

    ``actual_status`` is the raw ``status`` column and ``committed_at`` the commit marker; ``state``
    reads them as the lifecycle does.
    """

    job_id: int
    expected: JobStatus
    actual_status: int
    spider_id: int | None
    lease_epoch: int
    committed_at: datetime | None = None

    @property
    def state(self) -> JobStatus | None:
        """The lifecycle state the row holds, ``None`` for a status no one defines."""
        try:
            return state_of(self.actual_status, self.committed_at)
        except ValueError:
            return None

    def describe(self) -> str:
        """One sentence for logs: what was expected and what the row holds."""
        return (
            f"job {self.job_id} was expected {self.expected.label} but is "
            f"{describe_stored(self.actual_status, self.committed_at)} "
            f"(spider_id={self.spider_id}, lease_epoch={self.lease_epoch})"
        )


@dataclass(frozen=True)
class NotFound:
    """No job has this id."""

    job_id: int


TransitionResult = Applied | LostRace | NotFound


@dataclass(frozen=True)
class LockedRow:
    """What a move needs from its job's row before the compare-and-set (``_read_ahead``), read
    by the caller under the row's lock (``FOR UPDATE``; on SQLite the transaction's write lock)
    in the transaction the move is then made in: the move reads nothing more. Only a read that
    locks the row may make one (``coordinator.store.jobs.lock_in_flight_job``), so the epoch is
    the one the move is made under."""

    job_id: int
    start_time: datetime | None
    lease_epoch: int


def apply_transition(
    connection: Connection,
    request: TransitionRequest,
    *,
    now: datetime,
    fit_message: Callable[[str], str] = fit_status_msg,
    committed_storage: CommittedStorage = DEFAULT_COMMITTED_STORAGE,
    locked: LockedRow | None = None,
) -> TransitionResult:
    """Apply ``request`` inside the transaction already open on ``connection``.

    ``now`` is the instant the move and its history row record (the store never reads the clock
    itself: ``JobStore`` passes its injected clock). ``committed_storage`` selects the ``status`` a
    move into Committed writes. The caller commits (and runs any statements that must be atomic
    with the move, after an ``Applied``). Raises
    ``IllegalTransition`` or ``InvalidTransitionRequest`` before any SQL, and the driver's errors
    as they come (the caller's transaction is then to be rolled back). ``locked``: the row as the
    caller read it under its lock in this transaction (``LockedRow``), which spares the move's own
    read.
    """
    moved = _compare_and_set(
        connection, request, now, fit_message, committed_storage, locked=locked
    )
    if not isinstance(moved, _Moved):
        return moved
    history_id = connection.execute(
        _HISTORY_INSERT, _history_row(request, moved, now)
    ).inserted_primary_key
    assert history_id is not None
    return Applied(request.job_id, moved.edge, now, int(history_id[0]))


def apply_transitions(
    connection: Connection,
    requests: Sequence[TransitionRequest],
    *,
    now: datetime,
    fit_message: Callable[[str], str] = fit_status_msg,
    committed_storage: CommittedStorage = DEFAULT_COMMITTED_STORAGE,
) -> list[TransitionResult]:
    """``apply_transition`` of each of ``requests`` inside the transaction open on
    ``connection``; their results, in order.

    One request's lost race leaves the others applied. Fenced moves of one edge that write the
    same values (``TOGETHER_AT_LEAST`` or more, such as a tick's finalisations) are made together
    (``_compare_and_set_together``): one locking read finds the rows that still match each one's
    guards, one ``UPDATE`` with the same guards moves them, its row count checked against them;
    the others each make their own compare-and-set. The history rows of the applied ones are
    written after the last move, in one statement, in the same transaction. Their
    ``Applied.history_id`` is ``None``: a multi-row INSERT does not give each row's id on every
    backend (MySQL has no ``RETURNING``). Raises as ``apply_transition`` (and
    ``GuardedWriteMismatch``); after a database error the caller's transaction is to be rolled
    back, history rows and all.
    """
    outcomes: dict[int, _Moved | LostRace | NotFound] = {}
    for group in _groups(requests, now, fit_message, committed_storage):
        together = _compare_and_set_together(
            connection, [requests[index] for index in group.indices], group
        )
        outcomes.update(zip(group.indices, together, strict=True))
    results: list[TransitionResult] = []
    rows: list[dict[str, object]] = []
    for index, request in enumerate(requests):
        moved = outcomes.get(index)
        if moved is None:
            moved = _compare_and_set(connection, request, now, fit_message, committed_storage)
        if isinstance(moved, _Moved):
            rows.append(_history_row(request, moved, now))
            results.append(Applied(request.job_id, moved.edge, now, None))
        else:
            results.append(moved)
    if rows:
        connection.execute(_HISTORY_INSERT, rows)
    return results


TOGETHER_AT_LEAST = 3
"""Fewer moves of a kind are made one by one: together costs two statements."""


class GuardedWriteMismatch(CoordinatorError, RuntimeError):
    """Moves made together changed another number of rows than their locking read matched.

    Only a broken lock could cause it; the caller's transaction is to be rolled back."""


PER_JOB_VALUES = ("v_spider_id", "v_num_tasks")
"""What moves made together may write differently for each job (a submission's Spider job and
its task count): a ``CASE`` on the job's id writes each its own."""


@dataclass(frozen=True)
class _Group:
    """Moves of one edge, fenced, with the same values to write but ``PER_JOB_VALUES`` (``per_job``:
    each job's own, by id): made together."""

    indices: tuple[int, ...]
    edge: Edge
    unless_cancel_requested: bool
    values: dict[str, object]
    per_job: dict[int, dict[str, object]]


def _groups(
    requests: Sequence[TransitionRequest],
    now: datetime,
    fit_message: Callable[[str], str],
    committed_storage: CommittedStorage,
) -> list[_Group]:
    """The moves of ``requests`` to make together: fenced ones whose compare-and-set reads nothing
    first (no duration to compute), of jobs asked to move once, grouped by edge, statement and
    values written (``PER_JOB_VALUES`` apart); ``TOGETHER_AT_LEAST`` of a kind or more."""
    kinds: dict[tuple[Any, ...], list[int]] = {}
    per_job: dict[int, dict[str, object]] = {}
    for index, request in enumerate(requests):
        edge = validate_request(request)
        if request.fence is None or Record.DURATION in edge.records:
            continue
        values = _set_values(
            edge, request, now, fit_message, start_time=None, committed_storage=committed_storage
        )
        per_job[index] = {name: values.pop(name) for name in PER_JOB_VALUES if name in values}
        kind = (edge, request.unless_cancel_requested, tuple(sorted(values.items())))
        kinds.setdefault(kind, []).append(index)
    # A job asked to move twice is left to the one-by-one moves, which apply the first only.
    requests_of_job = Counter(request.job_id for request in requests)
    return [
        _Group(
            tuple(indices),
            kind[0],
            kind[1],
            dict(kind[2]),
            {requests[index].job_id: per_job[index] for index in indices},
        )
        for kind, indices in kinds.items()
        if len(indices) >= TOGETHER_AT_LEAST
        and all(requests_of_job[requests[index].job_id] == 1 for index in indices)
    ]


def _compare_and_set_together(
    connection: Connection, requests: Sequence[TransitionRequest], group: _Group
) -> list[_Moved | LostRace | NotFound]:
    """The moves of ``group`` (``requests``, in its order): each row that still holds what its
    request expects, guards and fence included, is read ``FOR UPDATE`` (on SQLite the transaction
    holds the write lock), then moved by one ``UPDATE`` that repeats every guard; every other
    request is explained as ``_compare_and_set`` explains it. Raises ``GuardedWriteMismatch`` when
    the ``UPDATE`` matched another number of rows than the locked read, and the driver's errors.
    """
    edge, unless = group.edge, group.unless_cancel_requested
    keyed, _ = _guard_parts(edge, True, unless)
    keys = {
        r.job_id: tuple(_where_parameters(edge, r)[name] for _, name in keyed) for r in requests
    }
    read = _together_read(edge, unless)
    matched = set(
        connection.execute(read, {"w_ids": list(keys), "w_keys": list(keys.values())}).scalars()
    )
    if matched:
        moving = sorted(matched)
        parameters = {
            **group.values,
            "w_ids": moving,
            "w_keys": [keys[job_id] for job_id in moving],
        }
        jobs_written = 0
        if any(group.per_job.values()):
            jobs_written = len(moving)
            for position, job_id in enumerate(moving):
                parameters[f"r{position}_id"] = job_id
                for name, value in group.per_job[job_id].items():
                    parameters[f"r{position}_{name}"] = value
        statement = _together_update(edge, unless, jobs_written)
        count = connection.execute(statement, parameters).rowcount
        if count != len(matched):
            raise GuardedWriteMismatch(
                f"'{edge.trigger}' of {len(matched)} locked jobs changed {count} rows"
            )
    outcomes: list[_Moved | LostRace | NotFound] = []
    for request in requests:
        if request.job_id in matched:
            assert request.fence is not None
            outcomes.append(_Moved(edge, request.fence))
        else:
            outcomes.append(_no_match(connection, request, edge))
    return outcomes


@dataclass(frozen=True)
class _Moved:
    """A compare-and-set that matched its row: the edge, and the epoch the move was made under."""

    edge: Edge
    lease_epoch: int


def _compare_and_set(
    connection: Connection,
    request: TransitionRequest,
    now: datetime,
    fit_message: Callable[[str], str],
    committed_storage: CommittedStorage,
    *,
    locked: LockedRow | None = None,
) -> _Moved | LostRace | NotFound:
    """The move's compare-and-set and its row-count check, without its history row."""
    edge = validate_request(request)
    read = _read_ahead(connection, edge, request, locked)
    if read is None:
        return NotFound(request.job_id)
    start_time, lease_epoch = read
    values = _set_values(
        edge, request, now, fit_message, start_time=start_time, committed_storage=committed_storage
    )
    statement = _guarded_update(edge, request.fence is not None, request.unless_cancel_requested)
    matched = connection.execute(statement, {**values, **_where_parameters(edge, request)})
    if matched.rowcount != 1:
        return _no_match(connection, request, edge)
    return _Moved(edge, lease_epoch)


def _no_match(
    connection: Connection, request: TransitionRequest, edge: Edge
) -> LostRace | NotFound:
    """Why ``request``'s compare-and-set matched no row (a lost race is counted)."""
    outcome = _explain_no_match(connection, request)
    if isinstance(outcome, LostRace):
        metrics.LOST_RACES.labels(edge.trigger.value).inc()
    return outcome


def _set_values(
    edge: Edge,
    request: TransitionRequest,
    now: datetime,
    fit_message: Callable[[str], str],
    *,
    start_time: datetime | None,
    committed_storage: CommittedStorage,
) -> dict[str, object]:
    """The parameters of what ``edge``'s compare-and-set writes (``v_<column>``)."""
    values = _recorded_values(edge, request, now, fit_message, start_time)
    values["v_status"] = stored_status(edge.dest, committed_storage)
    return values


def _where_parameters(edge: Edge, request: TransitionRequest) -> dict[str, object]:
    """The parameters of ``request``'s own guards (``_guard_parts``' keyed conditions)."""
    parameters: dict[str, object] = {"w_id": request.job_id}
    if RowGuard.SPIDER_ID_MATCHES in edge.guards:
        parameters["w_spider_id"] = request.spider_id
    if request.fence is not None:
        parameters["w_fence"] = request.fence
    return parameters


def _history_row(request: TransitionRequest, moved: _Moved, now: datetime) -> dict[str, object]:
    """The parameters of the history row that records ``moved``."""
    edge = moved.edge
    return {
        "job_id": request.job_id,
        "from_status": int(edge.source),
        "to_status": int(edge.dest),
        "trigger": edge.trigger,
        "actor": request.actor.value,
        "actor_id": request.actor_id,
        "reason": request.reason,
        "spider_id": request.spider_id,
        "lease_epoch": moved.lease_epoch,
        "at": now,
    }


def validate_request(request: TransitionRequest) -> Edge:
    """The edge ``request`` asks for, once it is known to be legal and complete.

    Pure: no SQL. Raises ``IllegalTransition`` (the lifecycle forbids the move, or this actor may
    not make it) or ``InvalidTransitionRequest`` (the edge must record a value the request lacks).
    """
    edge = _planned(request.trigger, request.source, request.target, request.actor)
    _check_request(edge, request)
    return edge


@cache
def _planned(trigger: Trigger, source: JobStatus, target: JobStatus, actor: Actor) -> Edge:
    # The lifecycle is fixed at import, so each legal move's edge is looked up once (an illegal
    # one raises every time: exceptions are not cached).
    return plan_transition(trigger, source, target, actor)


def _check_request(edge: Edge, request: TransitionRequest) -> None:
    def require(condition: bool, what: str) -> None:
        if not condition:
            raise InvalidTransitionRequest(f"'{edge.trigger}' of job {request.job_id} {what}")

    if RowGuard.SPIDER_ID_MATCHES in edge.guards or Record.SUBMISSION in edge.records:
        require(request.spider_id is not None, "needs the Spider job id")
    if request.spider_id is not None:
        require(0 <= request.spider_id < 2**64, "needs a Spider job id within 64 unsigned bits")
    if Record.SUBMISSION in edge.records:
        num_tasks = request.num_tasks
        require(
            num_tasks is not None and 1 <= num_tasks <= INT32_MAX,
            f"needs a task count from 1 to {INT32_MAX}",
        )
    if Record.SIZES in edge.records:
        for size in (request.uncompressed_size, request.compressed_size):
            require(size is not None and size >= 0, "needs non-negative archive sizes")


def _read_ahead(
    connection: Connection, edge: Edge, request: TransitionRequest, locked: LockedRow | None
) -> tuple[datetime | None, int] | None:
    """What the move needs from the row before its compare-and-set, in at most one read: its
    ``start_time`` (for an edge that records the duration) and its ``lease_epoch`` (for the
    history row of an unfenced move; a fenced one records its fence). ``None`` when the job does
    not exist. With ``locked`` (the caller read the row under its lock), nothing is read; one of
    another job raises ``InvalidTransitionRequest`` before any SQL.

    The read locks the row (``FOR UPDATE``; on SQLite the transaction holds the write lock), so
    the epoch read is the one the move is made under, as the compare-and-set would lock it next.
    ``start_time`` is written once, by 'submitted', so it cannot change meanwhile either.
    """
    if locked is not None and locked.job_id != request.job_id:
        raise InvalidTransitionRequest(
            f"'{edge.trigger}' of job {request.job_id} given job {locked.job_id}'s row"
        )
    if request.fence is not None and Record.DURATION not in edge.records:
        return None, request.fence
    if locked is None:
        row = connection.execute(_READ_AHEAD, {"w_id": request.job_id}).one_or_none()
        if row is None:
            return None
        locked = LockedRow(request.job_id, row.start_time, int(row.lease_epoch))
    return locked.start_time, request.fence if request.fence is not None else locked.lease_epoch


def _recorded_values(
    edge: Edge,
    request: TransitionRequest,
    now: datetime,
    fit_message: Callable[[str], str],
    start_time: datetime | None,
) -> dict[str, object]:
    """The parameters of the edge's ``_guarded_update`` besides the status and the guards'
    (``v_<column>``)."""
    values: dict[str, object] = {"v_update_time": now}
    if Record.SUBMISSION in edge.records:
        values.update(
            v_spider_id=request.spider_id,
            v_num_tasks=request.num_tasks,
            v_start_time=now,
            v_dispatch_time=now,
        )
    if Record.SIZES in edge.records:
        values.update(
            v_uncompressed_size=request.uncompressed_size,
            v_compressed_size=request.compressed_size,
        )
    if Record.STATUS_MSG in edge.records:
        values["v_status_msg"] = fit_message(request.reason)
    if Record.DURATION in edge.records:
        # Computed here, not in SQL, so that the arithmetic is identical on SQLite and MariaDB.
        values["v_duration"] = (now - start_time).total_seconds() if start_time else None
    if edge.dest is JobStatus.COMMITTED:
        values["v_committed_at"] = now
    if request.fence is not None and edge.dest.is_terminal:
        values["v_lease_expires_at"] = now
    return values


# The statements are built once (per edge and guard shape) with named parameters: SQLAlchemy then
# reuses the statement's cache key and compiled form instead of building them on every move. The
# parameter names never match a column's (``w_`` for the WHERE clause, ``v_`` for SET), so no
# parameter can add itself to the SET clause.


@cache
def _guarded_update(edge: Edge, fenced: bool, unless_cancel_requested: bool) -> Update:
    """The compare-and-set of ``edge`` (module docstring); its parameters are ``w_id``,
    ``w_spider_id`` (``SPIDER_ID_MATCHES``), ``w_fence`` (``fenced``), ``v_status`` and what
    ``_recorded_values`` gives (``v_lease_expires_at`` for a fenced terminal move)."""
    keyed, shared = _guard_parts(edge, fenced, unless_cancel_requested)
    guards = [column == bindparam(name) for column, name in keyed]
    return update(_jobs).where(*guards, *shared).values(_written(edge, fenced))


@cache
def _guard_parts(
    edge: Edge, fenced: bool, unless_cancel_requested: bool
) -> tuple[tuple[tuple[Column[Any], str], ...], tuple[ColumnElement[bool], ...]]:
    """The conditions of ``edge``'s compare-and-set: the columns each request gives its own value
    for, with the parameter's name (the id; the Spider job id for ``SPIDER_ID_MATCHES``; the
    epoch when ``fenced``), and the conditions every request of the edge shares (the source
    state's stored forms, ``SPIDER_ID_UNSET``, no cancel request)."""
    keyed: list[tuple[Column[Any], str]] = [(_jobs.c.id, "w_id")]
    shared: list[ColumnElement[bool]] = list(in_state(edge.source))
    for guard in edge.guards:
        if guard is RowGuard.SPIDER_ID_UNSET:
            shared.append(_jobs.c.spider_id.is_(None))
        elif guard is RowGuard.SPIDER_ID_MATCHES:
            keyed.append((_jobs.c.spider_id, "w_spider_id"))
    if fenced:
        keyed.append((_jobs.c.lease_epoch, "w_fence"))
    if unless_cancel_requested:
        shared.append(_jobs.c.cancel_requested_at.is_(None))
    return tuple(keyed), tuple(shared)


def _together_guards(edge: Edge, unless_cancel_requested: bool) -> list[ColumnElement[bool]]:
    """``_guard_parts`` of fenced moves made together: ``w_ids`` the jobs' ids, ``w_keys`` each
    one's keyed values (a tuple per job, in ``keyed``'s order), and the shared conditions."""
    keyed, shared = _guard_parts(edge, True, unless_cancel_requested)
    columns = [column for column, _ in keyed]
    return [
        _jobs.c.id.in_(bindparam("w_ids", expanding=True)),
        tuple_(*columns).in_(bindparam("w_keys", expanding=True)),
        *shared,
    ]


@cache
def _together_read(edge: Edge, unless_cancel_requested: bool) -> Select[Any]:
    """The ids of the rows that fenced moves of ``edge`` made together would move, locked."""
    guards = _together_guards(edge, unless_cancel_requested)
    return select(_jobs.c.id).where(*guards).with_for_update()


@cache
def _together_update(edge: Edge, unless_cancel_requested: bool, jobs_written: int = 0) -> Update:
    """The compare-and-set of fenced moves of ``edge`` made together, every guard repeated.

    With ``jobs_written``, the columns of ``PER_JOB_VALUES`` are written per job: ``CASE id WHEN
    :r<i>_id THEN :r<i>_v_<column> … END`` for that many jobs (a statement per batch size)."""
    guards = _together_guards(edge, unless_cancel_requested)
    written = _written(edge, True)
    for name in PER_JOB_VALUES if jobs_written else ():
        column = name.removeprefix("v_")
        if column in written:
            whens: list[tuple[ColumnElement[Any], ColumnElement[Any]]] = [
                (bindparam(f"r{i}_id"), bindparam(f"r{i}_{name}", type_=_jobs.c[column].type))
                for i in range(jobs_written)
            ]
            written[column] = case(*whens, value=_jobs.c.id, else_=_jobs.c[column])
    return update(_jobs).where(*guards).values(written)


def _written(edge: Edge, fenced: bool) -> dict[str, object]:
    """What ``edge``'s compare-and-set writes: each column from its ``v_<column>`` parameter."""
    columns = ["status", "update_time"]
    if Record.SUBMISSION in edge.records:
        columns += ["spider_id", "num_tasks", "start_time"]
    if Record.SIZES in edge.records:
        columns += ["uncompressed_size", "compressed_size"]
    if Record.STATUS_MSG in edge.records:
        columns.append("status_msg")
    if Record.DURATION in edge.records:
        columns.append("duration")
    if edge.dest is JobStatus.COMMITTED:
        columns.append("committed_at")
    if fenced and edge.dest.is_terminal:
        columns.append("lease_expires_at")
    values: dict[str, object] = {column: bindparam(f"v_{column}") for column in columns}
    if Record.SUBMISSION in edge.records:
        # A restart may find the claim's dispatch_time unwritten; keep CLP's invariant that a
        # RUNNING row has one (#2462).
        values["dispatch_time"] = func.coalesce(
            _jobs.c.dispatch_time,
            bindparam("v_dispatch_time", type_=_jobs.c.dispatch_time.type),
        )
    return values


_HISTORY_INSERT: Insert = insert(_history)
"""The history row, every column given as a parameter."""

_READ_AHEAD = (
    select(_jobs.c.start_time, _jobs.c.lease_epoch)
    .where(_jobs.c.id == bindparam("w_id"))
    .with_for_update()
)
_ROW_NOW = select(
    _jobs.c.status, _jobs.c.spider_id, _jobs.c.lease_epoch, _jobs.c.committed_at
).where(_jobs.c.id == bindparam("w_id"))


def in_state(state: JobStatus) -> list[ColumnElement[bool]]:
    """The conditions that select the rows holding ``state`` (its stored forms)."""
    form = STORED_FORMS[state]
    conditions: list[ColumnElement[bool]] = [
        _jobs.c.status == form.statuses[0]
        if len(form.statuses) == 1
        else in_constants(_jobs.c.status, form.statuses)
    ]
    if form.committed is True:
        conditions.append(_jobs.c.committed_at.is_not(None))
    elif form.committed is False:
        conditions.append(_jobs.c.committed_at.is_(None))
    return conditions


def _explain_no_match(connection: Connection, request: TransitionRequest) -> LostRace | NotFound:
    row = connection.execute(_ROW_NOW, {"w_id": request.job_id}).one_or_none()
    if row is None:
        return NotFound(request.job_id)
    return LostRace(
        request.job_id,
        request.source,
        row.status,
        row.spider_id,
        row.lease_epoch,
        row.committed_at,
    )
