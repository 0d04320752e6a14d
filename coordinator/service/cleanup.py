"""Settling a finished job's archives: withdraw what must not stay published, remove the rest.

Compress tasks record every archive they store, with the compression job it was stored for. Once
a job is terminal, whoever finished it (this coordinator, another one, or a foreign writer such as
CLP's legacy scheduler), its archives are settled by ``settle_archives``:

* **Failed or Killed**: nothing of the job may stay published. A job this coordinator rolled back
  has already withdrawn its archive rows in the rollback's transaction; a Committed job that a
  foreign writer finished (CLP's legacy scheduler kills every RUNNING row at its start-up, and a
  Committed job is stored as RUNNING by default) still has them, so they are withdrawn here, as a
  rollback does. Then every stored archive file is removed and its record forgotten.
* **Succeeded**: the published archives stay (CLP's retention owns them now; their records keep
  their locations for ``coordinator show``). Archives that are not published (a retried or
  duplicate task instance's) are removed.

Instances of a finished Spider job may still be running and storing, so a periodic sweep settles,
once their records are older than a grace period, every Failed or Killed job that still has
records (settling removes them all, so the job drops out) and every Succeeded job with records
stored after its commit (the commit publishes only what was stored before it, so these are
unpublished). A file that cannot be removed keeps its record and is retried.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import cast

from sqlalchemy import Engine, Table, and_, or_, select

from coordinator.lifecycle import TERMINAL_STATUSES, JobStatus, state_of
from coordinator.store.archives import published_archives_of_job, withdraw_archives
from coordinator.store.schema import CompressionJob, StoredArchive
from coordinator.store.stored_archives import (
    attribute_unambiguous_records,
    forget_job_archives,
    stored_archives_of_job,
)
from coordinator.tasks.archive_storage import remove_archive
from coordinator.tasks.context import ArchiveOutputSettings

_log = logging.getLogger(__name__)
_jobs = cast(Table, CompressionJob.__table__)
_stored = cast(Table, StoredArchive.__table__)
_TERMINAL_VALUES = sorted(int(status) for status in TERMINAL_STATUSES)


@dataclass(frozen=True)
class Settled:
    """What ``settle_archives`` did for one job."""

    withdrawn: int = 0
    """Published archive rows withdrawn (a foreign writer failed or killed a Committed job)."""
    removed: int = 0
    """Stored archive files removed."""


def settle_archives(engine: Engine, job_id: int, output: ArchiveOutputSettings) -> Settled:
    """Settle the archives of job ``job_id`` if it is terminal (see the module); else nothing.

    Raises the driver's errors (the sweep retries); a file that cannot be removed is logged and
    keeps its record.
    """
    with engine.begin() as connection:
        row = connection.execute(
            select(_jobs.c.status, _jobs.c.committed_at, _jobs.c.spider_id).where(
                _jobs.c.id == job_id
            )
        ).one_or_none()
        if row is None or row.status not in _TERMINAL_VALUES:
            return Settled()
        state = state_of(row.status, row.committed_at)
        if row.spider_id is not None:
            attribute_unambiguous_records(connection, int(row.spider_id))
        withdrawn: list[str] = []
        if state is not JobStatus.SUCCEEDED and row.spider_id is not None:
            withdrawn = withdraw_archives(connection, job_id, int(row.spider_id))
        records = stored_archives_of_job(connection, job_id)
        published = {
            archive_id
            for ids in published_archives_of_job(connection, job_id, row.spider_id).values()
            for archive_id in ids
        }
    if withdrawn:
        _log.warning(
            "job %d ended %s by another writer after its commit: withdrew %d published archive(s)",
            job_id,
            state.label,
            len(withdrawn),
        )
    removed: list[str] = []
    for record in records:
        if record.archive_id in published:
            continue
        try:
            remove_archive(output, record.location)
        except Exception:
            _log.exception("cannot remove archive %s; it stays recorded", record.location)
            continue
        removed.append(record.location)
    if removed:
        with engine.begin() as connection:
            forget_job_archives(connection, job_id, removed)
    return Settled(withdrawn=len(withdrawn), removed=len(removed))


def terminal_jobs_with_stored_archives(engine: Engine, stored_before: datetime) -> list[int]:
    """Terminal jobs with archive records to settle, stored before ``stored_before``.

    Failed or Killed jobs with any record, Succeeded jobs with records stored after their commit.
    Records the compress task could not attribute are attributed first, where exactly one job
    records their Spider job id.
    """
    ended_badly = [int(JobStatus.FAILED), int(JobStatus.KILLED)]
    with engine.begin() as connection:
        attribute_unambiguous_records(connection)
        rows = connection.execute(
            select(_jobs.c.id)
            .distinct()
            .join(_stored, _stored.c.job_id == _jobs.c.id)
            .where(
                _stored.c.stored_at < stored_before,
                or_(
                    _jobs.c.status.in_(ended_badly),
                    and_(
                        _jobs.c.status == int(JobStatus.SUCCEEDED),
                        _jobs.c.committed_at.is_not(None),
                        _stored.c.stored_at > _jobs.c.committed_at,
                    ),
                ),
            )
            .order_by(_jobs.c.id)
        ).scalars()
        return list(rows)
