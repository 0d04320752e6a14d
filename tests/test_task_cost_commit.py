"""What one commit costs (issue 14): a dataset the process published to before is not checked again.

The commit task publishes and moves the job Running → Committed in one transaction; before it, each
call ensured the dataset's three tables (three transactions, one table inspection each) and looked
up its ``clp_datasets`` row. A process now remembers the datasets its publications found ready, and
a dataset deleted since is created again by the publication that fails on it. SQLite and MariaDB.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

from sqlalchemy import Engine, delete, event, inspect, select, text, update

from coordinator.lifecycle import JobStatus
from coordinator.store.archives import Publication, publish_archives
from coordinator.store.datasets import archives_table, dataset_tables
from coordinator.store.jobs import JobStore, job_state
from coordinator.store.schema import compression_jobs as jobs_table
from coordinator.store.schema import datasets
from coordinator.store.stored_archives import record_stored_archive, stored_archives
from coordinator.task_io import ArchiveMetadata
from tests.paths import SPIDER_ID, new_job_in, stored_record

DATASET = "web"


def _running_job(store: JobStore, spider_id: int) -> int:
    return new_job_in(store, JobStatus.RUNNING, spider_id=spider_id)


def _publish(store: JobStore, spider_id: int, archive_id: str) -> Publication:
    archive = ArchiveMetadata(
        id=archive_id, begin_timestamp=1, end_timestamp=2, size=10, uncompressed_size=100
    )
    return publish_archives(
        store,
        spider_job_id=spider_id,
        dataset=DATASET,
        archive_storage_directory=f"/archives/{DATASET}",
        archives=[archive],
    ).publication


@contextmanager
def _statements(engine: Engine) -> Iterator[tuple[list[str], list[str]]]:
    """The statements the engine runs meanwhile, and its transactions' ends (``commit``...)."""
    statements: list[str] = []
    ends: list[str] = []

    def executed(*args: object) -> None:
        statements.append(str(args[2]))

    def committed(_: object) -> None:
        ends.append("commit")

    def rolled_back(_: object) -> None:
        ends.append("rollback")

    event.listen(engine, "before_cursor_execute", executed)
    event.listen(engine, "commit", committed)
    event.listen(engine, "rollback", rolled_back)
    try:
        yield statements, ends
    finally:
        event.remove(engine, "before_cursor_execute", executed)
        event.remove(engine, "commit", committed)
        event.remove(engine, "rollback", rolled_back)


def _checks(statements: list[str]) -> list[str]:
    """The statements that inspect tables or look at ``clp_datasets``."""
    words = ("table_info", "information_schema", "describe", "show ", "clp_datasets", "create")
    return [s for s in statements if any(word in s.lower() for word in words)]


def test_a_second_publication_to_a_dataset_runs_one_transaction_without_its_checks(
    store: JobStore, migrated_engine: Engine
) -> None:
    first, second = _running_job(store, SPIDER_ID), _running_job(store, SPIDER_ID + 1)
    with _statements(migrated_engine) as (statements, ends):
        assert _publish(store, SPIDER_ID, "a0") is Publication.PUBLISHED
    assert _checks(statements), "the first publication checks the dataset"
    with _statements(migrated_engine) as (statements, ends):
        assert _publish(store, SPIDER_ID + 1, "b0") is Publication.PUBLISHED
    assert _checks(statements) == []
    assert ends == ["commit"]
    for job_id in (first, second):
        job = store.get(job_id)
        assert job is not None and job_state(job) is JobStatus.COMMITTED


def test_a_repeated_commit_is_still_a_no_op_once_the_dataset_is_known(
    store: JobStore, migrated_engine: Engine
) -> None:
    job_id = _running_job(store, SPIDER_ID)
    assert _publish(store, SPIDER_ID, "a0") is Publication.PUBLISHED
    assert _publish(store, SPIDER_ID, "a0") is Publication.ALREADY_COMMITTED
    assert [h.trigger for h in store.history(job_id)] == ["submitted", "committed"]


def test_a_dataset_deleted_after_a_publication_is_created_and_registered_again(
    store: JobStore, migrated_engine: Engine
) -> None:
    _running_job(store, SPIDER_ID)
    assert _publish(store, SPIDER_ID, "a0") is Publication.PUBLISHED
    with migrated_engine.begin() as connection:  # as a deletion of the dataset would
        for table in dataset_tables(DATASET, migrated_engine.dialect.name):
            connection.execute(text(f"DROP TABLE {table.name}"))
        connection.execute(delete(datasets).where(datasets.c.name == DATASET))
    second = _running_job(store, SPIDER_ID + 1)

    assert _publish(store, SPIDER_ID + 1, "b0") is Publication.PUBLISHED

    tables = set(inspect(migrated_engine).get_table_names())
    assert {table.name for table in dataset_tables(DATASET)} <= tables
    archives = archives_table(DATASET)
    with migrated_engine.connect() as connection:
        assert connection.execute(select(archives.c.id)).scalars().all() == ["b0"]
        registered = connection.execute(select(datasets.c.name)).scalars().all()
    assert registered == [DATASET]
    job = store.get(second)
    assert job is not None and job_state(job) is JobStatus.COMMITTED


def test_a_commit_reads_its_job_row_once_and_moves_it_under_that_lock(
    store: JobStore, migrated_engine: Engine
) -> None:
    """The commit locks its job's row to find it (by its Spider job); the move then takes its
    start time and epoch from that read (``LockedRow``) instead of reading the row again."""
    job_id = _running_job(store, SPIDER_ID)
    with migrated_engine.begin() as connection:
        connection.execute(
            update(jobs_table).where(jobs_table.c.id == job_id).values(lease_epoch=5)
        )
    assert _publish(store, SPIDER_ID, "w0") is Publication.PUBLISHED  # the dataset, checked
    second = _running_job(store, SPIDER_ID + 1)
    with _statements(migrated_engine) as (statements, ends):
        assert _publish(store, SPIDER_ID + 1, "w1") is Publication.PUBLISHED
    reads = [s for s in statements if s.lstrip().upper().startswith("SELECT")]
    assert len(reads) == 1 and "compression_jobs" in reads[0]
    if migrated_engine.dialect.name != "sqlite":
        assert reads[0].rstrip().upper().endswith("FOR UPDATE")
    assert ends == ["commit"]
    for job, epoch in ((job_id, 5), (second, 0)):
        committed = store.history(job)[-1]
        assert (committed.trigger, committed.lease_epoch) == ("committed", epoch)
        row = store.get(job)
        assert row is not None and row.duration is not None  # from the start time read


def test_a_commit_attributes_records_only_when_its_spider_job_left_some_unattributed(
    store: JobStore, migrated_engine: Engine
) -> None:
    """The compress task's insert attributes its record to the one in-flight job; the commit's
    locked read tells whether any record of the Spider job names no job, and only then does it
    send the attribution (before: an UPDATE with every archive id on every commit)."""
    attributed_job = _running_job(store, SPIDER_ID)
    with migrated_engine.begin() as connection:
        record_stored_archive(connection, stored_record(DATASET, "w0", attributed_job))
    with _statements(migrated_engine) as (statements, _):
        assert _publish(store, SPIDER_ID, "w0") is Publication.PUBLISHED
    assert [s for s in statements if "UPDATE compression_stored_archives" in s] == []

    unattributed_job = _running_job(store, SPIDER_ID + 1)
    unattributed = replace(stored_record(DATASET, "w1", None), spider_job_id=SPIDER_ID + 1)
    with migrated_engine.begin() as connection:
        record_stored_archive(connection, unattributed)
    with _statements(migrated_engine) as (statements, _):
        assert _publish(store, SPIDER_ID + 1, "w1") is Publication.PUBLISHED
    assert len([s for s in statements if "UPDATE compression_stored_archives" in s]) == 1
    with migrated_engine.connect() as connection:
        owners = {
            record.archive_id: record.job_id
            for spider_id in (SPIDER_ID, SPIDER_ID + 1)
            for record in stored_archives(connection, spider_id)
        }
    assert owners == {"w0": attributed_job, "w1": unattributed_job}
