"""What the compress task's outbox records cost (issue 14), and that a repeat still finds its own.

``record_storing`` is one transaction of inserts, each resolving the owning job in its own statement
(no read of the job before). A first attempt does not read the Spider job's earlier records either
(instance ids are never reused, so the instance has none yet); an attempt after an ambiguous
failure still does, and finds what the failed one inserted. With one record (one archive per
task), each step is one statement that commits itself on MariaDB (no ``COMMIT`` sent). SQLite and
MariaDB.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr
from sqlalchemy import Engine, event
from sqlalchemy.exc import DisconnectionError

from bench.noop import executor_transactions, instant_package
from coordinator.archive_storage import FsArchiveOutput
from coordinator.engine.tasks import records
from coordinator.engine.tasks.context import TaskContext, WorkerSettings
from coordinator.engine.tasks.registry import COMPRESS
from coordinator.lifecycle import JobStatus
from coordinator.store.database import AutocommitWrites
from coordinator.store.jobs import JobStore
from coordinator.store.stored_archives import STORED, STORING, stored_archives
from coordinator.task_io import encode_dataset
from tests.paths import SPIDER_ID, new_job_in, stored_record

DATASET = "web"


@contextmanager
def _statements(engine: Engine) -> Iterator[tuple[list[str], list[str]]]:
    """The statements the engine runs meanwhile, and its commits."""
    statements: list[str] = []
    commits: list[str] = []

    def executed(*args: object) -> None:
        statements.append(str(args[2]))

    def committed(_: object) -> None:
        commits.append("commit")

    event.listen(engine, "before_cursor_execute", executed)
    event.listen(engine, "commit", committed)
    try:
        yield statements, commits
    finally:
        event.remove(engine, "before_cursor_execute", executed)
        event.remove(engine, "commit", committed)


def _reads_of_records(statements: list[str]) -> list[str]:
    return [
        s for s in statements if s.lstrip().upper().startswith("SELECT") and "stored_archives" in s
    ]


def test_a_first_attempt_records_storing_in_one_transaction_without_reading_records(
    store: JobStore, migrated_engine: Engine
) -> None:
    job_id = new_job_in(store, JobStatus.RUNNING)
    batch = [stored_record(DATASET, "a0", None), stored_record(DATASET, "a1", None)]

    with _statements(migrated_engine) as (statements, commits):
        ids = records.record_storing(AutocommitWrites(migrated_engine), batch, doing="recording")

    assert [s for s in statements if s.lstrip().upper().startswith("SELECT")] == []
    inserts = [s for s in statements if s.lstrip().upper().startswith("INSERT")]
    assert len(inserts) == len(batch)  # one per record, the owner resolved in it
    assert commits == ["commit"]
    with migrated_engine.connect() as connection:
        found = stored_archives(connection, SPIDER_ID)
    assert [(r.id, r.archive_id, r.state, r.job_id) for r in found] == [
        (ids[0], "a0", STORING, job_id),
        (ids[1], "a1", STORING, job_id),
    ]

    with _statements(migrated_engine) as (statements, commits):
        claimed = records.record_stored(
            AutocommitWrites(migrated_engine), batch, ids, doing="marking"
        )
    assert (claimed, _reads_of_records(statements), commits) == ([], [], ["commit"])
    with migrated_engine.connect() as connection:
        assert {r.state for r in stored_archives(connection, SPIDER_ID)} == {STORED}


def test_an_attempt_after_an_ambiguous_failure_finds_the_records_the_first_inserted(
    store: JobStore, migrated_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first attempt committed, then its connection was lost before it could tell."""
    new_job_in(store, JobStatus.RUNNING)
    batch = [stored_record(DATASET, "a0", None), stored_record(DATASET, "a1", None)]
    real = records._begin_storing_once
    repeats: list[bool] = []

    def committed_then_lost(*args: Any, repeat: bool) -> list[int]:
        repeats.append(repeat)
        ids = real(*args, repeat=repeat)
        if len(repeats) == 1:
            raise DisconnectionError("connection lost after the commit")
        return ids

    monkeypatch.setattr(records, "_begin_storing_once", committed_then_lost)
    ids = records.record_storing(AutocommitWrites(migrated_engine), batch, doing="recording")

    assert repeats == [False, True]
    with migrated_engine.connect() as connection:
        found = stored_archives(connection, SPIDER_ID)
    assert [(r.id, r.archive_id) for r in found] == [(ids[0], "a0"), (ids[1], "a1")]


def test_the_instant_compress_task_of_the_benchmarks_records_as_the_real_one(
    store: JobStore, migrated_engine: Engine, tmp_path: Path
) -> None:
    """``bench.noop`` runs the same record steps, so P1b measures the real task's database work;
    its executors' transaction counts are rewritten in place after every task."""
    job_id = new_job_in(store, JobStatus.RUNNING)
    settings = WorkerSettings(
        database_url=SecretStr(migrated_engine.url.render_as_string(hide_password=False)),
        archive_output=FsArchiveOutput(directory=tmp_path / "archives"),
        staging_directory=tmp_path / "staging",
    )
    compress = instant_package().function(COMPRESS)
    before = executor_transactions(settings.staging_directory)
    for instance in (1, 2):
        context = TaskContext(SPIDER_ID, "0", instance, settings)
        compress(context, [b"", encode_dataset(DATASET), b""])
        commits, _ = executor_transactions(settings.staging_directory)
        assert commits >= before[0] + 2 * instance  # storing, then stored, per task

    with migrated_engine.connect() as connection:
        found = stored_archives(connection, SPIDER_ID)
    assert [(r.instance_id, r.state, r.job_id) for r in found] == [
        (1, STORED, job_id),
        (2, STORED, job_id),
    ]


def _storing_owner(engine: Engine, spider_id: int) -> int | None:
    record = replace(stored_record(DATASET, f"archive-{spider_id}", 999), spider_job_id=spider_id)
    writes = AutocommitWrites(engine)
    try:
        ids = records.record_storing(writes, [record], doing="test")
    finally:
        writes.dispose()
    with engine.connect() as connection:
        found = {r.id: r for r in stored_archives(connection, spider_id)}
    return found[ids[0]].job_id


def test_the_insert_attributes_a_record_to_the_one_job_in_flight_with_its_spider_job(
    store: JobStore, migrated_engine: Engine
) -> None:
    """As the look-up it replaces: the one Running or Committed job recording the Spider job id
    owns the record (the caller's ``job_id`` is ignored); terminal and Pending rows never do;
    none, or several in flight, leave it unattributed for the commit or the sweep."""
    assert _storing_owner(migrated_engine, 100) is None
    for status in (JobStatus.PENDING, JobStatus.SUCCEEDED, JobStatus.FAILED):
        new_job_in(store, status, spider_id=101)
    assert _storing_owner(migrated_engine, 101) is None
    running = new_job_in(store, JobStatus.RUNNING, spider_id=102)
    new_job_in(store, JobStatus.RUNNING, spider_id=1102)
    assert _storing_owner(migrated_engine, 102) == running
    new_job_in(store, JobStatus.SUCCEEDED, spider_id=103)
    committed = new_job_in(store, JobStatus.COMMITTED, spider_id=103)
    assert _storing_owner(migrated_engine, 103) == committed
    new_job_in(store, JobStatus.RUNNING, spider_id=104)
    new_job_in(store, JobStatus.COMMITTED, spider_id=104)
    assert _storing_owner(migrated_engine, 104) is None
