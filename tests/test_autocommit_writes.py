"""One-statement writes that commit themselves (``coordinator.store.database.AutocommitWrites``,
issue 14): on MariaDB one request each, no ``COMMIT`` or ``ROLLBACK`` sent; on SQLite an ordinary
``BEGIN IMMEDIATE`` transaction. Their users: the embedded engine's state records and the
compress task's ``storing``/``stored`` records.

The MariaDB checks read the server's own per-session counters on the pooled connection itself
(``Com_commit``, ``Com_rollback``), as ``tests/test_pool_round_trips.py`` does.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, event, select, text

from bench.noop import self_committed
from coordinator.engine.tasks import records
from coordinator.lifecycle import JobStatus
from coordinator.spider.port import JobState
from coordinator.store.database import AutocommitWrites, is_mysql
from coordinator.store.jobs import JobStore
from coordinator.store.schema import engine_jobs
from coordinator.store.stored_archives import STORED, STORING, stored_archives
from tests.engine_support import graph, running_engine, submit, task, wait_for
from tests.paths import SPIDER_ID, new_job_in, stored_record
from tests.sql_capture import session_counter

PASSWORD = b"compression-coordinator"


@pytest.fixture
def writes(migrated_engine: Engine) -> Iterator[AutocommitWrites]:
    writes = AutocommitWrites(migrated_engine, pool_size=1)
    yield writes
    writes.dispose()


def _stored_state(engine: Engine, archive_id: str) -> str | None:
    with engine.connect() as connection:
        found = [r for r in stored_archives(connection, SPIDER_ID) if r.archive_id == archive_id]
    return found[0].state if found else None


def test_a_write_is_committed_by_itself_with_no_commit_or_rollback_sent(
    store: JobStore, migrated_engine: Engine, writes: AutocommitWrites
) -> None:
    new_job_in(store, JobStatus.RUNNING)
    commits: list[str] = []
    listener = lambda _connection: commits.append("commit")  # noqa: E731
    event.listen(migrated_engine, "commit", listener)
    try:
        [record_id] = records.record_storing(writes, [stored_record("web", "a0", None)], doing="r")
        assert _stored_state(migrated_engine, "a0") == STORING  # seen by another connection
        records.record_stored(writes, [stored_record("web", "a0", None)], [record_id], doing="m")
        assert _stored_state(migrated_engine, "a0") == STORED
    finally:
        event.remove(migrated_engine, "commit", listener)
    if not is_mysql(migrated_engine):
        assert commits == ["commit", "commit"]  # SQLite: a transaction each, as before
        return
    assert commits == []  # neither went through the engine's transactions
    with writes.connection() as connection:  # the pool's one connection, which wrote both
        assert (
            session_counter(connection, "Com_commit"),
            session_counter(connection, "Com_rollback"),
        ) == (0, 0)
        assert session_counter(connection, "Com_insert") == 1
        assert session_counter(connection, "Com_update") == 1


def test_a_session_reads_committed_as_every_other_session(
    migrated_engine: Engine, writes: AutocommitWrites
) -> None:
    """Under the server's default (REPEATABLE READ) the ``storing`` insert's read of the job
    would lock the job's row; the coordinator's sessions are all READ COMMITTED."""
    if not is_mysql(migrated_engine):
        pytest.skip("SQLite has no isolation levels to choose")
    with writes.connection() as connection:
        level = connection.execute(text("SELECT @@SESSION.tx_isolation")).scalar_one()
    assert level == "READ-COMMITTED"


def test_a_block_that_fails_after_its_write_keeps_it_on_mariadb_only(
    store: JobStore, migrated_engine: Engine, writes: AutocommitWrites
) -> None:
    """What the class says of its users: the write is the block's last statement that matters."""
    job_id = new_job_in(store, JobStatus.RUNNING)
    with pytest.raises(RuntimeError), writes.connection() as connection:
        connection.execute(
            text("UPDATE compression_jobs SET status_msg = 'written' WHERE id = :id"),
            {"id": job_id},
        )
        raise RuntimeError("after the write")
    assert store.get(job_id).status_msg == ("written" if is_mysql(migrated_engine) else "")


def test_dispose_closes_the_sibling_connections(
    migrated_engine: Engine, writes: AutocommitWrites
) -> None:
    if not is_mysql(migrated_engine):
        pytest.skip("SQLite uses the engine's own connections")

    def sessions() -> int:
        with migrated_engine.connect() as connection:
            return int(
                connection.execute(
                    text(
                        "SELECT count(*) FROM information_schema.processlist "
                        "WHERE db = DATABASE() AND id <> CONNECTION_ID()"
                    )
                ).scalar_one()
            )

    before = sessions()
    with writes.connection() as connection:
        connection.execute(text("SELECT 1"))
    assert sessions() == before + 1
    writes.dispose()
    deadline = time.monotonic() + 10  # the server ends a closed session's thread just after
    while sessions() != before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sessions() == before


def test_the_embedded_engine_records_its_states_in_one_statement_each(
    migrated_engine: Engine, tmp_path: Path
) -> None:
    """A job's state records (Running at the start, Succeeded at the end) are each one statement
    that commits itself on MariaDB; on SQLite a transaction each, as before."""
    seen: list[tuple[str, bool]] = []

    def record(connection: Connection, _cursor: Any, statement: str, *_: Any) -> None:
        if statement.lstrip().upper().startswith("UPDATE SPIDER_ENGINE_JOBS"):
            seen.append((statement, self_committed(connection)))

    event.listen(Engine, "before_cursor_execute", record)
    try:
        with running_engine(migrated_engine, tmp_path, workers=1) as spider:
            group = spider.add_resource_group("rg", PASSWORD)
            job_id = submit(spider, group, graph(task("echo")), [b"x"])
            spider.start_job(job_id)
            assert wait_for(spider, job_id, JobState.SUCCEEDED) is JobState.SUCCEEDED
    finally:
        event.remove(Engine, "before_cursor_execute", record)
    with migrated_engine.connect() as connection:
        stored = connection.execute(
            select(engine_jobs.c.state).where(engine_jobs.c.id == job_id)
        ).scalar_one()
    assert stored == "Succeeded"
    state_records = [autocommit for statement, autocommit in seen if "outputs" in statement]
    assert state_records, "the job's ending was recorded"
    assert all(state_records) == is_mysql(migrated_engine)
