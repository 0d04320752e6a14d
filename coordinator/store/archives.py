"""Publishing a job's archives (the commit) and withdrawing them (the rollback).

Publication is the durable decision of a compression job (``docs/clp.md``, The commit task, done
better): in **one** transaction, the one in-flight job row that records the Spider job id is locked
(a terminal row with the same id never matches, several are refused), the dataset is registered,
every archive is inserted into ``clp_{dataset}_archives`` with ``creator_id`` = the Spider job id
and ``creation_ix`` = its index, and the job moves Running → Committed through the guarded
transition with its sizes and duration. It is idempotent: a job already Committed or Succeeded is
left as it is and the call succeeds, so Spider may run the commit twice, even at once.

Each process remembers, per engine, the datasets a publication of its own found ready (their three
tables exist and their ``clp_datasets`` row is registered under the exact name), and skips both
checks for them: nothing in the coordinator drops a dataset's tables or its row. Should a dataset
disappear all the same (an operator's or CLP's deletion), the publication that fails on it forgets
the dataset and runs once more with both checks, which recreate what is missing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from functools import lru_cache, partial
from weakref import WeakKeyDictionary

from sqlalchemy import Connection, Engine, Insert, delete, insert, inspect, select
from sqlalchemy.exc import SQLAlchemyError

from coordinator.errors import CoordinatorError
from coordinator.lifecycle import Actor, JobStatus, Trigger
from coordinator.store.datasets import (
    archives_table,
    ensure_dataset_tables,
    files_table,
    register_dataset,
)
from coordinator.store.guarded import Applied, TransitionRequest
from coordinator.store.jobs import JobStore, SpiderJobUnmatched, lock_in_flight_job
from coordinator.store.stored_archives import attribute_stored_archives, stored_archives_of_job
from coordinator.task_io import ArchiveMetadata

INSERT_BATCH_SIZE = 1000

_ready_datasets: WeakKeyDictionary[Engine, set[str]] = WeakKeyDictionary()
"""Per engine, the datasets this process published to (tables there, row registered)."""


class CommitRefused(CoordinatorError):
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

    Raises ``CommitRefused`` (no in-flight job records the Spider job id, e.g. it was killed by
    CLP's legacy scheduler, or several do), ``ValueError`` for an empty archive list,
    ``InvalidDatasetName``, or the driver's errors (nothing is then published). A lost race with a
    concurrent writer surfaces as ``CommitRefused`` too, after the rollback.
    """
    if not archives:
        raise ValueError("commit received no archives to publish")
    publish = partial(
        _publish,
        store,
        spider_job_id=spider_job_id,
        dataset=dataset,
        archive_storage_directory=archive_storage_directory,
        archives=archives,
        actor_id=actor_id,
    )
    ready = _ready_datasets.setdefault(store.engine, set())
    if dataset in ready:
        try:
            return publish(dataset_ready=True)
        except SQLAlchemyError:
            # Perhaps the dataset was deleted since (its tables are gone): check it again. The
            # failed attempt was rolled back whole, so running it again publishes nothing twice.
            ready.discard(dataset)
    ensure_dataset_tables(store.engine, dataset)
    result = publish(dataset_ready=False)
    if result.publication is Publication.PUBLISHED:  # the registration was checked, and committed
        ready.add(dataset)
    return result


def _publish(
    store: JobStore,
    *,
    spider_job_id: int,
    dataset: str,
    archive_storage_directory: str,
    archives: Sequence[ArchiveMetadata],
    actor_id: str,
    dataset_ready: bool,
) -> PublishResult:
    """``publish_archives``' transaction; ``dataset_ready`` skips the dataset's registration."""
    with store.engine.begin() as connection:
        try:
            in_flight = lock_in_flight_job(connection, spider_job_id)
        except SpiderJobUnmatched as error:
            raise CommitRefused(f"{error}; refusing to commit") from error
        locked = in_flight.locked
        job_id = locked.job_id
        if in_flight.state is JobStatus.COMMITTED:
            return PublishResult(job_id, Publication.ALREADY_COMMITTED, 0)
        if not dataset_ready:
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
            connection.execute(_insert_archives(dataset), rows[start : start + INSERT_BATCH_SIZE])
        if in_flight.unattributed:
            # The compress tasks' records are committed before the commit runs, each attributed
            # by its own insert unless no single in-flight job recorded the Spider job then.
            attribute_stored_archives(
                connection, job_id, spider_job_id, [archive.id for archive in archives]
            )
        result = store.apply(
            connection,
            TransitionRequest(
                job_id,
                Trigger.COMMITTED,
                JobStatus.RUNNING,
                JobStatus.COMMITTED,
                Actor.COMMIT_TASK,
                reason=f"published {len(archives)} archive(s) to dataset {dataset}",
                actor_id=actor_id,
                spider_id=spider_job_id,
                uncompressed_size=sum(a.uncompressed_size for a in archives),
                compressed_size=sum(a.size for a in archives),
            ),
            locked,
        )
        if not isinstance(result, Applied):
            # The row was locked above, so only a foreign writer ignoring the lock gets here; the
            # exception rolls the archive rows back.
            raise CommitRefused(f"job {job_id}: the commit lost its compare-and-set: {result}")
    return PublishResult(job_id, Publication.PUBLISHED, len(archives))


@lru_cache(maxsize=64)
def _insert_archives(dataset: str) -> Insert:
    """The insert of ``clp_{dataset}_archives`` rows, built once per dataset (as in
    ``coordinator.store.stored_archives``)."""
    return insert(archives_table(dataset))


def published_archives_of_job(
    connection: Connection, job_id: int, spider_job_id: int | None
) -> dict[str, list[str]]:
    """The job's archives that are published, as ``{dataset: [archive id, ...]}``.

    An archive row is the job's when its ``creator_id`` is the job's Spider job id **and** its id
    is among the archives recorded for the job (``compression_stored_archives``), in that record's
    dataset: another job that shares the Spider id (before a reset of Spider) is never counted.
    Raises ``InvalidDatasetName`` (a record with an unsafe dataset) or the driver's errors.
    """
    if spider_job_id is None:
        return {}
    recorded: dict[str, list[str]] = {}
    for record in stored_archives_of_job(connection, job_id):
        recorded.setdefault(record.dataset, []).append(record.archive_id)
    published: dict[str, list[str]] = {}
    for dataset, archive_ids in recorded.items():
        table = archives_table(dataset)
        if not inspect(connection).has_table(table.name):
            continue
        for start in range(0, len(archive_ids), INSERT_BATCH_SIZE):
            ids = connection.execute(
                select(table.c.id).where(
                    table.c.creator_id == str(spider_job_id),
                    table.c.id.in_(archive_ids[start : start + INSERT_BATCH_SIZE]),
                )
            ).scalars()
            published.setdefault(dataset, []).extend(ids)
    return {dataset: ids for dataset, ids in published.items() if ids}


def withdraw_archives(connection: Connection, job_id: int, spider_job_id: int) -> list[str]:
    """Delete, in the caller's transaction, the archive rows the job published; their ids.

    Which rows are the job's: see ``published_archives_of_job``. The rollback runs this in the
    same transaction as Committed → Failed/Killed, so a job is never left half-published; it is
    idempotent. Raises ``InvalidDatasetName`` or the driver's errors.
    """
    withdrawn: list[str] = []
    for dataset, ids in published_archives_of_job(connection, job_id, spider_job_id).items():
        archives, files = archives_table(dataset), files_table(dataset)
        has_files = inspect(connection).has_table(files.name)
        for start in range(0, len(ids), INSERT_BATCH_SIZE):
            batch = ids[start : start + INSERT_BATCH_SIZE]
            # CLP's own deletion order (delete_archives_from_metadata_db): files, then archives.
            if has_files:
                connection.execute(delete(files).where(files.c.archive_id.in_(batch)))
            connection.execute(delete(archives).where(archives.c.id.in_(batch)))
        withdrawn += ids
    return withdrawn
