"""Job leases: which coordinator drives which job, fenced by an epoch.

Several coordinators may share one database. A coordinator *claims* a job by writing its name
into ``lease_owner``, an expiry into ``lease_expires_at`` and ``lease_epoch + 1``; every later write
it makes for the job (renewals, transitions) carries ``lease_epoch = <the epoch it claimed>``, so a
coordinator that paused past its lease and resumed cannot write once another took the job over
(the epoch moved on). Candidate rows are read with ``FOR UPDATE SKIP LOCKED`` on MariaDB/MySQL so
coordinators do not queue behind each other; the claim itself is a compare-and-set on the epoch,
which is what guarantees that one coordinator wins. On SQLite ``BEGIN IMMEDIATE`` serialises claims.
Claims and renewals are batched: one ``UPDATE … WHERE id IN (…) AND lease_epoch = :seen`` per
distinct epoch seen (``BATCH`` ids at most), each row still compared and set on its own epoch;
when a batch changes fewer rows than it names (which the row locks make impossible, but is not
assumed), the rows are read back to tell which ones are this claim's.

What can be claimed:

* Pending jobs whose input is ``s3_object_metadata`` and that no live lease holds. Other Pending
  jobs belong to CLP's legacy scheduler (hazard H1, ``docs/hazards.md``) and are never written: the
  caller decides ownership from the config blob before claiming. ``dispatch_time`` is set only on
  claimed jobs (H8). Only a row without a Spider id is claimed for submission; one that already
  records a Spider id (CLP never leaves a Pending row so) is claimed only to be ended (its
  ``Lease.spider_id`` is set), never submitted: submitting would have to overwrite that id, and
  the ``submitted`` edge, guarded by ``spider_id IS NULL``, would lose its race on every attempt.
* Running or Committed jobs with a Spider job id whose lease expired (their coordinator died), or
  that a coordinator of the same name held before a restart.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cache
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    Select,
    Update,
    and_,
    bindparam,
    func,
    or_,
    select,
    update,
)

from coordinator.lifecycle import IN_FLIGHT_STATUS_VALUES, JobStatus, state_of
from coordinator.store.database import reading
from coordinator.store.expressions import in_constants
from coordinator.store.schema import compression_jobs as _jobs

BATCH = 500
"""Ids per batched statement (an ``IN`` list well within every backend's limits)."""


@dataclass(frozen=True)
class Lease:
    """A job this coordinator now drives, and the epoch every write for it must carry.

    A Pending lease with a ``spider_id`` is a row that already records a Spider job: it is to be
    ended, never submitted.
    """

    job_id: int
    epoch: int
    status: JobStatus
    spider_id: int | None
    clp_config: bytes
    cancel_requested: bool = False
    """An operator asked to cancel the job before it was claimed (``cancel_requested_at`` was
    set): a Pending job is then killed, never submitted."""


# The statements are built once (per shape) with named parameters, so that SQLAlchemy reuses their
# cache keys and compiled forms: claims and renewals run every tick, releases with every job's end.
# No parameter is named after a column (no parameter can add itself to an UPDATE's SET clause).


def claimable_lease() -> ColumnElement[bool]:
    """Rows no live lease holds, or held by ``:owner`` (a restart of the same coordinator)."""
    return or_(
        _jobs.c.lease_owner.is_(None),
        _jobs.c.lease_expires_at < bindparam("now"),
        _jobs.c.lease_owner == bindparam("owner"),
    )


def _candidates(
    columns: list[ColumnElement[Any]], conditions: list[ColumnElement[bool]], skipping: bool
) -> Select[Any]:
    """Rows meeting ``conditions`` that are claimable, oldest first, locked unless another claim
    holds them: parameters ``now``, ``owner``, ``limit`` (and ``skip``, the ids not to consider,
    when ``skipping``)."""
    if skipping:
        conditions = [*conditions, _jobs.c.id.not_in(bindparam("skip", expanding=True))]
    return (
        select(*columns)
        .where(*conditions, claimable_lease())
        .order_by(_jobs.c.id)
        .limit(bindparam("limit"))
        .with_for_update(skip_locked=True)
    )


@cache
def _pending_candidates(skipping: bool) -> Select[Any]:
    """``claim_pending``'s candidates (``_candidates``)."""
    c = _jobs.c
    return _candidates(
        [c.id, c.lease_epoch, c.spider_id, c.clp_config, c.cancel_requested_at],
        [c.status == int(JobStatus.PENDING)],
        skipping,
    )


@cache
def _in_flight_candidates(skipping: bool) -> Select[Any]:
    """``take_over_in_flight``'s candidates (``_candidates``)."""
    c = _jobs.c
    return _candidates(
        [c.id, c.lease_epoch, c.status, c.spider_id, c.clp_config, c.committed_at],
        [in_constants(c.status, IN_FLIGHT_STATUS_VALUES), c.spider_id.is_not(None)],
        skipping,
    )


def _candidate_parameters(
    owner: str, now: datetime, limit: int, skip: Collection[int]
) -> dict[str, object]:
    parameters: dict[str, object] = {"owner": owner, "now": now, "limit": limit}
    if skip:
        parameters["skip"] = list(skip)
    return parameters


@cache
def _take(dispatching: bool) -> Update:
    """``_take_all``'s compare-and-set of one epoch's batch: parameters ``w_ids``, ``w_seen``,
    ``v_owner``, ``v_expires`` (and ``v_dispatch`` when ``dispatching``)."""
    values: dict[str, object] = {
        "lease_owner": bindparam("v_owner"),
        "lease_expires_at": bindparam("v_expires"),
        "lease_epoch": _jobs.c.lease_epoch + 1,
        "update_time": _jobs.c.update_time,  # bookkeeping, not a change of the job
    }
    if dispatching:
        dispatch = bindparam("v_dispatch", type_=_jobs.c.dispatch_time.type)
        values["dispatch_time"] = func.coalesce(_jobs.c.dispatch_time, dispatch)
        values["update_time"] = bindparam("v_dispatch_update", type_=_jobs.c.update_time.type)
    return (
        update(_jobs)
        .where(
            _jobs.c.id.in_(bindparam("w_ids", expanding=True)),
            _jobs.c.lease_epoch == bindparam("w_seen"),
        )
        .values(values)
    )


_TAKEN_BY = select(_jobs.c.id).where(
    _jobs.c.id.in_(bindparam("w_ids", expanding=True)),
    _jobs.c.lease_epoch == bindparam("w_epoch"),
    _jobs.c.lease_owner == bindparam("w_owner"),
    _jobs.c.lease_expires_at == bindparam("w_expires"),
)
"""Which of ``w_ids`` this claim took (``_take_all`` after a short batch)."""

_HELD = and_(
    _jobs.c.id.in_(bindparam("w_ids", expanding=True)),
    _jobs.c.lease_epoch == bindparam("w_epoch"),
    _jobs.c.lease_owner == bindparam("w_owner"),
)
_RENEW = (
    update(_jobs)
    .where(_HELD)
    .values(lease_expires_at=bindparam("v_expires"), update_time=_jobs.c.update_time)
)
_STILL_HELD = select(_jobs.c.id).where(_HELD)
_RELEASE = (
    update(_jobs)
    .where(
        _jobs.c.id == bindparam("w_id"),
        _jobs.c.lease_epoch == bindparam("w_epoch"),
        _jobs.c.lease_owner == bindparam("w_owner"),
    )
    .values(lease_expires_at=bindparam("v_now"), update_time=_jobs.c.update_time)
)
_CANCEL_REQUESTED = select(_jobs.c.id).where(
    _jobs.c.id.in_(bindparam("w_ids", expanding=True)), _jobs.c.cancel_requested_at.is_not(None)
)
CANCEL_REQUESTED_BETWEEN = select(_jobs.c.id).where(
    _jobs.c.id.between(bindparam("w_first"), bindparam("w_last")),
    _jobs.c.cancel_requested_at.is_not(None),
)
"""The cancel requests in a range of ids: parameters ``w_first`` and ``w_last``."""
DENSE_IDS_SPAN = 4
"""The cancel read reads the range of the ids asked about when it is at most this many times as
long as their number (``cancel_requests``)."""
_STILL_PENDING = select(_jobs.c.id).where(
    _jobs.c.id.in_(bindparam("w_ids", expanding=True)),
    _jobs.c.status == int(JobStatus.PENDING),
)


def claim_pending(
    connection: Connection,
    *,
    owner: str,
    lease: timedelta,
    now: datetime,
    limit: int,
    is_ours: Callable[[int, bytes], bool],
    skip: Collection[int] = (),
) -> list[Lease]:
    """Claim up to ``limit`` Pending jobs that ``is_ours(id, clp_config)`` accepts, oldest first.

    A row without a Spider id is a job to submit; one that already records one
    (``Lease.spider_id``) a job to end, never to submit (one read finds both: while jobs wait, a
    claim is one read and one write per tick). ``skip`` lists ids not to consider: known not to
    be ours (so their blobs are not decoded every tick) or already driven by the caller. Jobs
    ``is_ours`` refuses are not written. Runs in the caller's transaction, which then commits the
    claims (or not). Raises the driver's errors, and whatever ``is_ours`` raises (nothing is
    claimed then).
    """
    if limit <= 0:
        return []
    candidates = connection.execute(
        _pending_candidates(bool(skip)),
        _candidate_parameters(owner, now, limit * 4 + 16, skip),
    ).all()
    ours: list[Any] = []  # the candidate rows accepted
    for row in candidates:
        if len(ours) >= limit:
            break
        if is_ours(row.id, bytes(row.clp_config)):
            ours.append(row)
    taken = _take_all(connection, ours, owner, now + lease, dispatch_at=now)
    return [
        Lease(
            row.id,
            row.lease_epoch + 1,
            JobStatus.PENDING,
            row.spider_id,
            bytes(row.clp_config),
            cancel_requested=row.cancel_requested_at is not None,
        )
        for row in ours
        if row.id in taken
    ]


def take_over_in_flight(
    connection: Connection,
    *,
    owner: str,
    lease: timedelta,
    now: datetime,
    limit: int,
    skip: Collection[int] = (),
) -> list[Lease]:
    """Take up to ``limit`` Running/Committed jobs whose lease expired (or was ours before).

    ``skip`` lists the jobs the caller already drives. Runs in the caller's transaction, which
    then commits the take-overs. Raises the driver's errors.
    """
    if limit <= 0:
        return []
    candidates = connection.execute(
        _in_flight_candidates(bool(skip)), _candidate_parameters(owner, now, limit, skip)
    ).all()
    taken = _take_all(connection, candidates, owner, now + lease, dispatch_at=None)
    return [
        Lease(
            row.id,
            row.lease_epoch + 1,
            state_of(row.status, row.committed_at),
            row.spider_id,
            bytes(row.clp_config),
        )
        for row in candidates
        if row.id in taken
    ]


def _by_epoch(leases: Iterable[tuple[int, int]]) -> Iterator[tuple[int, list[int]]]:
    """``(epoch, ids)`` groups of ``(id, epoch)`` pairs, at most ``BATCH`` ids each."""
    groups: dict[int, list[int]] = {}
    for job_id, epoch in leases:
        groups.setdefault(epoch, []).append(job_id)
    for epoch, ids in groups.items():
        for start in range(0, len(ids), BATCH):
            yield epoch, ids[start : start + BATCH]


def _take_all(
    connection: Connection,
    rows: Sequence[Any],
    owner: str,
    expires: datetime,
    *,
    dispatch_at: datetime | None,
) -> set[int]:
    """Take the leases of ``rows`` (each with the ``id`` and ``lease_epoch`` read): each row is
    compared and set on the epoch it was read with; the ids taken."""
    statement = _take(dispatch_at is not None)
    values: dict[str, object] = {"v_owner": owner, "v_expires": expires}
    if dispatch_at is not None:
        values["v_dispatch"] = values["v_dispatch_update"] = dispatch_at
    taken: set[int] = set()
    for seen, ids in _by_epoch((row.id, row.lease_epoch) for row in rows):
        matched = connection.execute(statement, {**values, "w_ids": ids, "w_seen": seen}).rowcount
        if matched == len(ids):
            taken.update(ids)
            continue
        # Some row moved on since it was read: this statement's rows are those now at the next
        # epoch under this owner with this expiry (epochs only grow; the owner is exclusive).
        taken.update(
            connection.execute(
                _TAKEN_BY,
                {"w_ids": ids, "w_epoch": seen + 1, "w_owner": owner, "w_expires": expires},
            ).scalars()
        )
    return taken


def renew(engine: Engine, leases: dict[int, int], *, owner: str, expires: datetime) -> set[int]:
    """Extend the leases ``{job id: epoch}``; the ids whose lease is no longer ours.

    One statement per epoch and batch; when it changes fewer rows than it names, the batch's rows
    still held (this owner, the same epoch) are read back, and the others are lost. Raises the
    driver's errors.
    """
    lost: set[int] = set()
    with engine.begin() as connection:
        for epoch, ids in _by_epoch(leases.items()):
            held = {"w_ids": ids, "w_epoch": epoch, "w_owner": owner}
            matched = connection.execute(_RENEW, {**held, "v_expires": expires}).rowcount
            if matched != len(ids):
                still = set(connection.execute(_STILL_HELD, held).scalars())
                lost.update(job_id for job_id in ids if job_id not in still)
    return lost


def release(engine: Engine, leases: dict[int, int], *, owner: str, now: datetime) -> None:
    """Let the leases ``{job id: epoch}`` expire now: another coordinator may continue at once."""
    with engine.begin() as connection:
        for job_id, epoch in leases.items():
            connection.execute(
                _RELEASE, {"w_id": job_id, "w_epoch": epoch, "w_owner": owner, "v_now": now}
            )


def request_cancel(engine: Engine, job_id: int, now: datetime) -> bool:
    """Persist an operator's cancel request; ``False`` when the job does not exist."""
    with engine.begin() as connection:
        matched = connection.execute(
            update(_jobs)
            .where(_jobs.c.id == job_id)
            .values(
                cancel_requested_at=func.coalesce(_jobs.c.cancel_requested_at, now),
                update_time=_jobs.c.update_time,
            )
        ).rowcount
    return matched == 1


def cancel_requests(engine: Engine, job_ids: Collection[int]) -> set[int]:
    """Which of ``job_ids`` an operator asked to cancel. Raises the driver's errors.

    Jobs are claimed oldest first, so the ids of the jobs in flight are usually dense: their
    range (``DENSE_IDS_SPAN``) is then read by primary key, at most that many rows whatever the
    backlog, instead of one lookup per id sent in a list (the loop reads every job it drives
    each ``job_polling_interval_millisecs``: with 1,000 in flight on MariaDB the list took
    1.5-2.3 ms a read and grew with the table, the range 0.3-0.4 ms: docs/performance.md, P3).
    Requests of other jobs in the range are left out.
    """
    if not job_ids:
        return set()
    dense = dense_range(job_ids)
    with reading(engine) as connection:
        if dense is not None:
            asked = set(job_ids)
            rows = connection.execute(CANCEL_REQUESTED_BETWEEN, dense)
            return {row.id for row in rows if row.id in asked}
        rows = connection.execute(_CANCEL_REQUESTED, {"w_ids": list(job_ids)})
        return {row.id for row in rows}


def dense_range(job_ids: Collection[int]) -> dict[str, int] | None:
    """``CANCEL_REQUESTED_BETWEEN``'s parameters for non-empty ``job_ids`` when their range is
    at most ``DENSE_IDS_SPAN`` times as long as their number (``cancel_requests``), else
    ``None``."""
    first, last = min(job_ids), max(job_ids)
    if last - first >= DENSE_IDS_SPAN * len(job_ids):
        return None
    return {"w_first": first, "w_last": last}


def still_pending(engine: Engine, job_ids: Collection[int]) -> set[int]:
    """Which of ``job_ids`` are still Pending."""
    if not job_ids:
        return set()
    pending: set[int] = set()
    ids = sorted(job_ids)
    with reading(engine) as connection:
        for start in range(0, len(ids), 1000):
            rows = connection.execute(_STILL_PENDING, {"w_ids": ids[start : start + 1000]})
            pending.update(row.id for row in rows)
    return pending
