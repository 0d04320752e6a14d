"""Removing archives that were stored but are not (or no longer) published.

Compress tasks record every archive they store. Once a job is terminal, the archives of its Spider
job that ``clp_{dataset}_archives`` does not list are garbage: a job that failed or was cancelled
before its commit, a rolled-back commit, an instance whose report arrived too late. Instances of a
cancelled Spider job may still be running and storing, so a periodic sweep repeats the clean-up for
Failed and Killed jobs (none of whose archives is published, so once swept they drop out). A
Succeeded job is cleaned once, when it is finalised: a duplicate instance still running then may
leave one more archive recorded, which ``compression_stored_archives`` keeps visible.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import cast

from sqlalchemy import Engine, Table, inspect, select

from coordinator.lifecycle import JobStatus
from coordinator.store.datasets import archives_table
from coordinator.store.schema import CompressionJob, StoredArchive
from coordinator.store.stored_archives import forget_stored_archives, stored_archives
from coordinator.tasks.archive_storage import remove_archive
from coordinator.tasks.context import ArchiveOutputSettings

_log = logging.getLogger(__name__)
_jobs = cast(Table, CompressionJob.__table__)
_stored = cast(Table, StoredArchive.__table__)


def remove_unpublished_archives(
    engine: Engine, spider_job_id: int, dataset: str, output: ArchiveOutputSettings
) -> int:
    """Remove the Spider job's stored archives that are not published; how many were removed.

    An archive that cannot be removed is logged and keeps its record, so a later sweep retries.
    """
    table = archives_table(dataset)
    with engine.connect() as connection:
        records = stored_archives(connection, spider_job_id)
        published: set[str] = set()
        if records and inspect(connection).has_table(table.name):
            published = set(
                connection.execute(
                    select(table.c.id).where(table.c.creator_id == str(spider_job_id))
                ).scalars()
            )
    removed = []
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
            forget_stored_archives(connection, spider_job_id, removed)
    return len(removed)


def failed_jobs_with_stored_archives(
    engine: Engine, stored_before: datetime
) -> list[tuple[int, int, bytes]]:
    """``(job id, Spider job id, clp_config)`` of Failed/Killed jobs with archives still stored."""
    with engine.connect() as connection:
        rows = connection.execute(
            select(_jobs.c.id, _jobs.c.spider_id, _jobs.c.clp_config).where(
                _jobs.c.status.in_([int(JobStatus.FAILED), int(JobStatus.KILLED)]),
                _jobs.c.spider_id.in_(
                    select(_stored.c.spider_job_id).where(_stored.c.stored_at < stored_before)
                ),
            )
        ).all()
    return [(row.id, int(row.spider_id), bytes(row.clp_config)) for row in rows]
