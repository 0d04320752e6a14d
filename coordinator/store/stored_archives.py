"""Records of the archives compress tasks stored (``compression_stored_archives``).

A compress task records each archive right after storing it and before it reports success; a
failed attempt removes its archives and their records. Whatever is left for a job that never
committed (or whose commit was rolled back) is what a rollback or clean-up must remove.

A record names the compression job it was stored for (``job_id``): the compress task resolves it
from its Spider job id when exactly one in-flight job records that id, and the commit attributes
the archives it publishes. Clean-up and rollback work by ``job_id`` only, so they never touch
another job's archives, even one that shares a Spider job id after a reset of Spider.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Connection, Table, delete, func, insert, select, update

from coordinator.store.schema import CompressionJob, StoredArchive

_stored = cast(Table, StoredArchive.__table__)
_jobs = cast(Table, CompressionJob.__table__)


@dataclass(frozen=True)
class StoredArchiveRecord:
    """One stored archive: which task instance stored what, where."""

    spider_job_id: int
    task_id: str
    instance_id: int
    dataset: str
    archive_id: str
    location: str
    size: int
    stored_at: datetime
    job_id: int | None = None
    """The compression job it was stored for; ``None`` only on records older than migration 0004."""


def record_stored_archive(connection: Connection, record: StoredArchiveRecord) -> None:
    """Insert ``record`` in the caller's transaction; raises the driver's errors."""
    connection.execute(insert(_stored).values(**record.__dict__))


def stored_archives(connection: Connection, spider_job_id: int) -> list[StoredArchiveRecord]:
    """Every archive recorded for the Spider job, oldest first."""
    return _records(connection, _stored.c.spider_job_id == spider_job_id)


def stored_archives_of_job(connection: Connection, job_id: int) -> list[StoredArchiveRecord]:
    """Every archive recorded for the compression job, oldest first."""
    return _records(connection, _stored.c.job_id == job_id)


def _records(connection: Connection, condition: Any) -> list[StoredArchiveRecord]:
    rows = connection.execute(select(_stored).where(condition).order_by(_stored.c.id)).mappings()
    return [StoredArchiveRecord(**{k: v for k, v in row.items() if k != "id"}) for row in rows]


def attribute_stored_archives(
    connection: Connection, job_id: int, spider_job_id: int, archive_ids: Sequence[str]
) -> None:
    """Name ``job_id`` on the unattributed records of ``archive_ids`` the Spider job stored."""
    for start in range(0, len(archive_ids), 1000):
        connection.execute(
            update(_stored)
            .where(
                _stored.c.spider_job_id == spider_job_id,
                _stored.c.job_id.is_(None),
                _stored.c.archive_id.in_(list(archive_ids[start : start + 1000])),
            )
            .values(job_id=job_id)
        )


def attribute_unambiguous_records(
    connection: Connection, spider_job_id: int | None = None
) -> None:
    """Name the job on unattributed records whose Spider job id exactly one job records.

    Records the compress task could not attribute (no single in-flight job at the time, e.g. a
    foreign writer had already finished the job) become attributable once the job row is known;
    an id several jobs share stays unattributed. ``spider_job_id`` limits this to one Spider job.
    """
    jobs_with_id = select(func.count()).where(_jobs.c.spider_id == _stored.c.spider_job_id)
    only = [] if spider_job_id is None else [_stored.c.spider_job_id == spider_job_id]
    connection.execute(
        update(_stored)
        .where(*only, _stored.c.job_id.is_(None), jobs_with_id.scalar_subquery() == 1)
        .values(
            job_id=select(_jobs.c.id)
            .where(_jobs.c.spider_id == _stored.c.spider_job_id)
            .scalar_subquery()
        )
    )


def forget_stored_archives(
    connection: Connection, spider_job_id: int, locations: Sequence[str]
) -> int:
    """Delete the records of ``locations`` (archives already removed); how many were deleted."""
    return _forget(connection, _stored.c.spider_job_id == spider_job_id, locations)


def forget_job_archives(connection: Connection, job_id: int, locations: Sequence[str]) -> int:
    """Delete the job's records of ``locations`` (removed, or CLP's now); how many were deleted."""
    return _forget(connection, _stored.c.job_id == job_id, locations)


def _forget(connection: Connection, owner: Any, locations: Sequence[str]) -> int:
    deleted = 0
    for start in range(0, len(locations), 1000):
        batch = list(locations[start : start + 1000])
        result = connection.execute(delete(_stored).where(owner, _stored.c.location.in_(batch)))
        deleted += int(result.rowcount)
    return deleted
