"""Publishing a job's archives (the commit) and withdrawing them (the rollback).

Publication is the durable decision of a compression job (``clp-contract.md`` §10, done better):
in **one** transaction, the job row is locked by its Spider job id, the dataset is registered,
every archive is inserted into ``clp_{dataset}_archives`` with ``creator_id`` = the Spider job id
and ``creation_ix`` = its index, and the job moves Running → Committed through the guarded
transition with its sizes and duration. It is idempotent: a job already Committed or Succeeded is
left as it is and the call succeeds, so Spider may run the commit twice, even at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import cast

from sqlalchemy import Connection, Table, delete, insert, select

from coordinator.lifecycle import Actor, JobStatus, describe_status
from coordinator.store.datasets import archives_table, ensure_dataset_tables, register_dataset
from coordinator.store.guarded import Applied, TransitionRequest
from coordinator.store.jobs import JobStore
from coordinator.store.schema import CompressionJob
from coordinator.task_io import ArchiveMetadata

INSERT_BATCH_SIZE = 1000


class CommitRefused(Exception):
    """The commit must not publish: no job has this Spider id, or the job is not Running."""


class Publication(Enum):
    """What ``publish_archives`` did."""

    PUBLISHED = "published"
    ALREADY_COMMITTED = "already committed"


@dataclass(frozen=True)
class PublishResult:
    """The outcome of a commit, for the task's log."""

    job_id: int
    publication: Publication
    archives: int


def publish_archives(
    store: JobStore,
    *,
    spider_job_id: int,
    dataset: str,
    archive_storage_directory: str,
    archives: Sequence[ArchiveMetadata],
    actor_id: str = "",
) -> PublishResult:
    """Publish ``archives`` of the job Spider knows as ``spider_job_id`` and mark it Committed.

    Raises ``CommitRefused`` (no such job; the job is neither Running nor already committed, e.g.
    killed by CLP's legacy scheduler), ``ValueError`` for an empty archive list,
    ``InvalidDatasetName``, or the driver's errors (nothing is then published). A lost race with a
    concurrent writer surfaces as ``CommitRefused`` too, after the rollback.
    """
    if not archives:
        raise ValueError("commit received no archives to publish")
    ensure_dataset_tables(store.engine, dataset)
    table = archives_table(dataset)
    jobs = cast(Table, CompressionJob.__table__)
    with store.engine.begin() as connection:
        row = connection.execute(
            select(jobs.c.id, jobs.c.status)
            .where(jobs.c.spider_id == spider_job_id)
            .with_for_update()
        ).one_or_none()
        if row is None:
            raise CommitRefused(f"no CLP compression job found for spider job {spider_job_id}")
        if row.status in (JobStatus.COMMITTED, JobStatus.SUCCEEDED):
            return PublishResult(row.id, Publication.ALREADY_COMMITTED, 0)
        if row.status != JobStatus.RUNNING:
            raise CommitRefused(
                f"CLP compression job {row.id} is no longer running "
                f"({describe_status(row.status)}); refusing to commit"
            )
        register_dataset(connection, dataset, archive_storage_directory)
        rows = [
            {
                "id": archive.id,
                "begin_timestamp": archive.begin_timestamp,
                "end_timestamp": archive.end_timestamp,
                "uncompressed_size": archive.uncompressed_size,
                "size": archive.size,
                "creator_id": str(spider_job_id),
                "creation_ix": index,
            }
            for index, archive in enumerate(archives)
        ]
        for start in range(0, len(rows), INSERT_BATCH_SIZE):
            connection.execute(insert(table), rows[start : start + INSERT_BATCH_SIZE])
        result = store.apply(
            connection,
            TransitionRequest(
                row.id,
                "committed",
                JobStatus.RUNNING,
                JobStatus.COMMITTED,
                Actor.COMMIT_TASK,
                reason=f"published {len(archives)} archive(s) to dataset {dataset}",
                actor_id=actor_id,
                spider_id=spider_job_id,
                uncompressed_size=sum(a.uncompressed_size for a in archives),
                compressed_size=sum(a.size for a in archives),
            ),
        )
        if not isinstance(result, Applied):
            # The row was locked above, so only a foreign writer ignoring the lock gets here; the
            # exception rolls the archive rows back.
            raise CommitRefused(f"job {row.id}: the commit lost its compare-and-set: {result}")
    return PublishResult(row.id, Publication.PUBLISHED, len(archives))


def withdraw_archives(connection: Connection, dataset: str, spider_job_id: int) -> list[str]:
    """Delete, in the caller's transaction, the archive rows the Spider job published; their ids.

    The rollback runs this in the same transaction as Committed → Failed/Killed, so a job is never
    left half-published. Raises ``InvalidDatasetName`` or the driver's errors.
    """
    table = archives_table(dataset)
    published_by_job = table.c.creator_id == str(spider_job_id)
    ids = list(connection.execute(select(table.c.id).where(published_by_job)).scalars())
    connection.execute(delete(table).where(published_by_job))
    return ids
