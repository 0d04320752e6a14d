"""On SQLite a read waits for no writer (``store.database.reading``, issue 14).

Every transaction of the coordinator begins ``BEGIN IMMEDIATE`` on SQLite, the stand-in for ``FOR
UPDATE``: it takes the database's one write lock, held by each writer through its fsync. The reads
that write nothing (a tick's prepares and states, an operator's ``jobs`` and ``show``) begin
deferred instead: under WAL a reader takes no lock, so it neither waits for an executor's commit
nor holds up the writers. Before, each of them waited for the lock like a writer.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from coordinator.config.clp import CompressionCoordinator
from coordinator.lifecycle import JobStatus
from coordinator.service.prepare import prepare
from coordinator.store import migrate
from coordinator.store.database import create_database_engine, reading
from coordinator.store.jobs import JobStore, jobs_by_status
from coordinator.store.leases import cancel_requests
from tests.test_submit_cost_reads import _job_blob

WAIT_SECS = 5.0
"""How long a read may take here; SQLite's busy timeout, which a waiting read would sit out, is
30 s."""


def _reads(store: JobStore, job_id: int, blob: bytes) -> dict[str, Callable[[], Any]]:
    engine = store.engine
    return {
        "states": lambda: store.states([job_id]),
        "get": lambda: store.get(job_id) is not None,
        "history": lambda: store.history(job_id),
        "cancel_requests": lambda: cancel_requests(engine, [job_id]),
        "jobs_by_status": lambda: jobs_by_status(engine)["pending"],
        "prepare": lambda: prepare(engine, blob, CompressionCoordinator()).num_objects,
    }


@pytest.mark.parametrize(
    "read", ["states", "get", "history", "cancel_requests", "jobs_by_status", "prepare"]
)
def test_a_read_does_not_wait_for_a_writer_holding_the_lock(tmp_path: Path, read: str) -> None:
    path = tmp_path / "coordinator.db"
    engine = create_database_engine(f"sqlite:///{path}")
    migrate.upgrade(engine)
    store = JobStore(engine)
    blob = _job_blob(engine, "web")
    job_id = store.create_job(blob)
    expected = {
        "states": {job_id: JobStatus.PENDING},
        "get": True,
        "history": [],
        "cancel_requests": set(),
        "jobs_by_status": 2,  # the job log-ingestor submitted and its clone
        "prepare": 1,
    }[read]
    writer = sqlite3.connect(path, isolation_level=None)  # another process's writer, mid-commit
    writer.execute("BEGIN IMMEDIATE")
    writer.execute("UPDATE compression_jobs SET update_time = update_time")
    answers: list[Any] = []
    reader = threading.Thread(target=lambda: answers.append(_reads(store, job_id, blob)[read]()))
    try:
        reader.start()
        reader.join(WAIT_SECS)
        waited = reader.is_alive()
    finally:
        writer.execute("ROLLBACK")
        writer.close()
        reader.join()
        engine.dispose()
    assert not waited, f"{read} waited for the writer's lock"
    assert answers == [expected]


def test_a_reading_block_keeps_nothing_written_on_it(tmp_path: Path) -> None:
    """``reading`` is for reads only: its transaction is rolled back at the end of the block."""
    engine = create_database_engine(f"sqlite:///{tmp_path / 'c.db'}")
    migrate.upgrade(engine)
    store = JobStore(engine)
    job_id = store.create_job(b"x")
    with reading(engine) as connection:
        connection.exec_driver_sql(f"UPDATE compression_jobs SET status = 3 WHERE id = {job_id}")
    assert store.state(job_id) is JobStatus.PENDING
    engine.dispose()
