"""Records of the archives compress tasks stored (``compression_stored_archives``).

A compress task records each archive right after storing it and before it reports success; a
failed attempt removes its archives and their records. Whatever is left for a Spider job that never
committed (or whose commit was rolled back) is what a rollback or clean-up must remove.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import cast

from sqlalchemy import Connection, Table, delete, insert, select

from coordinator.store.schema import StoredArchive

_stored = cast(Table, StoredArchive.__table__)


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
    rows = connection.execute(
        select(_stored).where(_stored.c.spider_job_id == spider_job_id).order_by(_stored.c.id)
    ).mappings()
    return [StoredArchiveRecord(**{k: v for k, v in row.items() if k != "id"}) for row in rows]


def forget_stored_archives(
    connection: Connection, spider_job_id: int, locations: Sequence[str]
) -> int:
    """Delete the records of ``locations`` (archives already removed); how many were deleted."""
    if not locations:
        return 0
    result = connection.execute(
        delete(_stored).where(
            _stored.c.spider_job_id == spider_job_id, _stored.c.location.in_(list(locations))
        )
    )
    return int(result.rowcount)
