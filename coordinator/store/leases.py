"""Job leases: which coordinator drives which job, fenced by an epoch.

Several coordinators may share one database. A coordinator *claims* a job by writing its name
into ``lease_owner``, an expiry into ``lease_expires_at`` and ``lease_epoch + 1``; every later write
it makes for the job (renewals, transitions) carries ``lease_epoch = <the epoch it claimed>``, so a
coordinator that paused past its lease and resumed cannot write once another took the job over
(the epoch moved on). Candidate rows are read with ``FOR UPDATE SKIP LOCKED`` on MariaDB/MySQL so
coordinators do not queue behind each other; the claim itself is a compare-and-set on the epoch,
which is what guarantees that one coordinator wins. On SQLite ``BEGIN IMMEDIATE`` serialises claims.

What can be claimed:

* Pending jobs whose input is ``s3_object_metadata`` and that no live lease holds. Other Pending
  jobs belong to CLP's legacy scheduler (hazard H1, ``docs/hazards.md``) and are never written: the
  caller decides ownership from the config blob before claiming. ``dispatch_time`` is set only on
  claimed jobs (H8). Only a row without a Spider id is claimed for submission; one that already
  records a Spider id (CLP never leaves a Pending row so) is claimed separately, only to be ended
  (``recorded_spider_id``), never submitted: submitting would have to overwrite that id, and the
  ``submitted`` edge, guarded by ``spider_id IS NULL``, would lose its race on every attempt.
* Running or Committed jobs with a Spider job id whose lease expired (their coordinator died), or
  that a coordinator of the same name held before a restart.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import cast

from sqlalchemy import ColumnElement, Connection, Engine, Table, and_, func, or_, select, update

from coordinator.lifecycle import IN_FLIGHT_STATUS_VALUES, JobStatus, state_of
from coordinator.store.schema import CompressionJob

_jobs = cast(Table, CompressionJob.__table__)


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


def _claimable_by(owner: str, now: datetime) -> ColumnElement[bool]:
    return or_(
        _jobs.c.lease_owner.is_(None),
        _jobs.c.lease_expires_at < now,
        _jobs.c.lease_owner == owner,
    )


def claim_pending(
    engine: Engine,
    *,
    owner: str,
    lease: timedelta,
    now: datetime,
    limit: int,
    is_ours: Callable[[int, bytes], bool],
    skip: Collection[int] = (),
    recorded_spider_id: bool = False,
) -> list[Lease]:
    """Claim up to ``limit`` Pending jobs that ``is_ours(id, clp_config)`` accepts, oldest first.

    By default only rows without a Spider id: the jobs to submit. With ``recorded_spider_id``,
    only rows that already record one (``Lease.spider_id``): jobs to end, never to submit.
    ``skip`` lists ids not to consider: known not to be ours (so their blobs are not decoded every
    tick) or already driven by the caller.
    Jobs ``is_ours`` refuses are not written. Raises the driver's errors, and whatever ``is_ours``
    raises (nothing is claimed then).
    """
    if limit <= 0:
        return []
    claimed: list[Lease] = []
    with engine.begin() as connection:
        candidates = connection.execute(
            select(_jobs.c.id, _jobs.c.lease_epoch, _jobs.c.spider_id, _jobs.c.clp_config)
            .where(
                _jobs.c.status == int(JobStatus.PENDING),
                _jobs.c.spider_id.is_not(None)
                if recorded_spider_id
                else _jobs.c.spider_id.is_(None),
                _claimable_by(owner, now),
                *([_jobs.c.id.not_in(list(skip))] if skip else []),
            )
            .order_by(_jobs.c.id)
            .limit(limit * 4 + 16)
            .with_for_update(skip_locked=True)
        ).all()
        for row in candidates:
            if len(claimed) >= limit:
                break
            blob = bytes(row.clp_config)
            if not is_ours(row.id, blob):
                continue
            if _take(connection, row.id, row.lease_epoch, owner, now + lease, dispatch_at=now):
                claimed.append(
                    Lease(row.id, row.lease_epoch + 1, JobStatus.PENDING, row.spider_id, blob)
                )
    return claimed


def take_over_in_flight(
    engine: Engine,
    *,
    owner: str,
    lease: timedelta,
    now: datetime,
    limit: int,
    skip: Collection[int] = (),
) -> list[Lease]:
    """Take up to ``limit`` Running/Committed jobs whose lease expired (or was ours before).

    ``skip`` lists the jobs the caller already drives. Raises the driver's errors.
    """
    if limit <= 0:
        return []
    taken: list[Lease] = []
    with engine.begin() as connection:
        candidates = connection.execute(
            select(
                _jobs.c.id,
                _jobs.c.lease_epoch,
                _jobs.c.status,
                _jobs.c.spider_id,
                _jobs.c.clp_config,
                _jobs.c.committed_at,
            )
            .where(
                _jobs.c.status.in_(IN_FLIGHT_STATUS_VALUES),
                _jobs.c.spider_id.is_not(None),
                _claimable_by(owner, now),
                *([_jobs.c.id.not_in(list(skip))] if skip else []),
            )
            .order_by(_jobs.c.id)
            .limit(limit)
            .with_for_update(skip_locked=True)
        ).all()
        for row in candidates:
            if _take(connection, row.id, row.lease_epoch, owner, now + lease, dispatch_at=None):
                taken.append(
                    Lease(
                        row.id,
                        row.lease_epoch + 1,
                        state_of(row.status, row.committed_at),
                        row.spider_id,
                        bytes(row.clp_config),
                    )
                )
    return taken


def _take(
    connection: Connection,
    job_id: int,
    seen_epoch: int,
    owner: str,
    expires: datetime,
    *,
    dispatch_at: datetime | None,
) -> bool:
    values: dict[str, object] = {
        "lease_owner": owner,
        "lease_expires_at": expires,
        "lease_epoch": _jobs.c.lease_epoch + 1,
        "update_time": _jobs.c.update_time,  # bookkeeping, not a change of the job
    }
    if dispatch_at is not None:
        values["dispatch_time"] = func.coalesce(_jobs.c.dispatch_time, dispatch_at)
        values["update_time"] = dispatch_at
    matched = connection.execute(
        update(_jobs)
        .where(_jobs.c.id == job_id, _jobs.c.lease_epoch == seen_epoch)
        .values(**values)
    ).rowcount
    return matched == 1


def renew(engine: Engine, leases: dict[int, int], *, owner: str, expires: datetime) -> set[int]:
    """Extend the leases ``{job id: epoch}``; the ids whose lease is no longer ours.

    Raises the driver's errors.
    """
    lost: set[int] = set()
    with engine.begin() as connection:
        for job_id, epoch in leases.items():
            matched = connection.execute(
                update(_jobs)
                .where(
                    _jobs.c.id == job_id,
                    _jobs.c.lease_epoch == epoch,
                    _jobs.c.lease_owner == owner,
                )
                .values(lease_expires_at=expires, update_time=_jobs.c.update_time)
            ).rowcount
            if matched != 1:
                lost.add(job_id)
    return lost


def release(engine: Engine, leases: dict[int, int], *, owner: str, now: datetime) -> None:
    """Let the leases ``{job id: epoch}`` expire now: another coordinator may continue at once."""
    with engine.begin() as connection:
        for job_id, epoch in leases.items():
            connection.execute(
                update(_jobs)
                .where(
                    and_(
                        _jobs.c.id == job_id,
                        _jobs.c.lease_epoch == epoch,
                        _jobs.c.lease_owner == owner,
                    )
                )
                .values(lease_expires_at=now, update_time=_jobs.c.update_time)
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
    """Which of ``job_ids`` an operator asked to cancel."""
    if not job_ids:
        return set()
    with engine.connect() as connection:
        rows = connection.execute(
            select(_jobs.c.id).where(
                _jobs.c.id.in_(list(job_ids)), _jobs.c.cancel_requested_at.is_not(None)
            )
        )
        return {row.id for row in rows}


def still_pending(engine: Engine, job_ids: Collection[int]) -> set[int]:
    """Which of ``job_ids`` are still Pending."""
    if not job_ids:
        return set()
    pending: set[int] = set()
    ids = sorted(job_ids)
    with engine.connect() as connection:
        for start in range(0, len(ids), 1000):
            rows = connection.execute(
                select(_jobs.c.id).where(
                    _jobs.c.id.in_(ids[start : start + 1000]),
                    _jobs.c.status == int(JobStatus.PENDING),
                )
            )
            pending.update(row.id for row in rows)
    return pending
