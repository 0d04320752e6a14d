"""The settlement's statements are built once (issue 14) and keep their effects.

Profiled in P1, a terminal move's settlement spent half its time building its four statements
(the attribution, the job's records, the ``published`` marks, the claims for removal) anew for
every job. They are now module constants with bound parameters; these tests check that two
jobs' settlements run the very same statement objects, each with its own values.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, delete, event, update
from sqlalchemy.sql import Executable

from coordinator.archive_storage import ArchiveOutputSettings
from coordinator.config.loader import CoordinatorConfig
from coordinator.lifecycle import JobStatus
from coordinator.runtime import open_runtime
from coordinator.service import outcomes
from coordinator.service.ingest import submit_job
from coordinator.spider.port import JobState
from coordinator.store.jobs import JobStore
from coordinator.store.schema import compression_jobs, stored_archives
from coordinator.store.stored_archives import (
    PUBLISHED,
    REMOVING,
    STORED,
    StoredArchiveRecord,
    attribute_unambiguous_records,
    claim_for_removal,
    mark_published,
    record_stored_archive,
    stored_archives_of_job,
)
from tests.engine_support import wait_for
from tests.service_support import (
    job_row,
    put_logs,
    tick_until,
)


def _record(spider_id: int, archive_id: str) -> StoredArchiveRecord:
    return StoredArchiveRecord(
        spider_job_id=spider_id,
        task_id="0",
        instance_id=1,
        dataset="default",
        archive_id=archive_id,
        location=f"/archives/default/{archive_id}",
        size=10,
        stored_at=datetime(2026, 12, 1, tzinfo=UTC),
        job_id=None,
        state=STORED,
    )


def _executed(engine: Engine) -> list[Executable]:
    """Every statement ``engine`` runs from now on (the objects, not their SQL)."""
    statements: list[Executable] = []

    @event.listens_for(engine, "before_execute")
    def _seen(_: Connection, statement: Any, *args: Any) -> None:
        statements.append(statement)

    return statements


def _settle_like_a_success(connection: Connection, job_id: int, spider_id: int) -> list[str]:
    """What ``settle_within`` runs for a Succeeded job with one kept and one extra archive."""
    attribute_unambiguous_records(connection, spider_id)
    records = stored_archives_of_job(connection, job_id)
    kept, extra = records[0], records[1]
    assert kept.id is not None and extra.id is not None
    mark_published(connection, [kept.id])
    claim_for_removal(connection, [extra.id])
    return [r.state for r in stored_archives_of_job(connection, job_id)]


def test_two_settlements_run_the_same_statements_each_with_its_own_values(
    store: JobStore, migrated_engine: Engine
) -> None:
    jobs = _jobs_with_records(store, migrated_engine, {71: ["a1", "a2"], 72: ["b1", "b2"]})
    statements = _executed(migrated_engine)
    with migrated_engine.begin() as connection:
        first = _settle_like_a_success(connection, jobs[71], 71)
    first_statements = list(statements)
    statements.clear()
    with migrated_engine.begin() as connection:
        second = _settle_like_a_success(connection, jobs[72], 72)
    assert first == second == [PUBLISHED, REMOVING]
    assert len(first_statements) == len(statements) == 5
    assert all(a is b for a, b in zip(first_statements, statements, strict=True))
    with migrated_engine.connect() as connection:
        # Each job's records only: the other job's were attributed and settled by its own call.
        assert [r.archive_id for r in stored_archives_of_job(connection, jobs[71])] == ["a1", "a2"]
        assert [r.archive_id for r in stored_archives_of_job(connection, jobs[72])] == ["b1", "b2"]


def test_an_ambiguous_spider_id_stays_unattributed(
    store: JobStore, migrated_engine: Engine
) -> None:
    jobs = _jobs_with_records(store, migrated_engine, {73: ["c1"]})
    twin = store.create_job(b"x")
    with migrated_engine.begin() as connection:
        connection.execute(
            update(compression_jobs).where(compression_jobs.c.id == twin).values(spider_id=73)
        )
        assert attribute_unambiguous_records(connection, 73) == 0
        assert stored_archives_of_job(connection, jobs[73]) == []
        assert attribute_unambiguous_records(connection) == 0  # all of them: still none


def _jobs_with_records(
    store: JobStore, engine: Engine, archives: dict[int, list[str]]
) -> dict[int, int]:
    """A job per Spider id, recording it, with unattributed records of ``archives``; the job ids."""
    jobs = {spider_id: store.create_job(b"x") for spider_id in archives}
    with engine.begin() as connection:
        for spider_id, archive_ids in archives.items():
            connection.execute(
                update(compression_jobs)
                .where(compression_jobs.c.id == jobs[spider_id])
                .values(spider_id=spider_id)
            )
            for archive_id in archive_ids:
                record_stored_archive(connection, _record(spider_id, archive_id))
    return jobs


def test_a_job_another_writer_ended_without_records_costs_no_settlement(
    config: CoordinatorConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CLP's own commit writes SUCCEEDED itself and CLP's compress task records nothing: such a
    job has nothing to settle, and one read of the tick's ended jobs' records shows it (five
    statements per job before). A job with records is still settled when it ends."""
    put_logs(config, tmp_path, ["svc0", "svc1"])
    settled: list[int] = []
    real = outcomes.settle_archives

    def counting(engine: Engine, job_id: int, output: ArchiveOutputSettings) -> Any:
        settled.append(job_id)
        return real(engine, job_id, output)

    monkeypatch.setattr(outcomes, "settle_archives", counting)
    with open_runtime(config, lease_secs=30) as rt:
        first = submit_job(config, rt.engine, prefix="ingest/svc0", timestamp_key="timestamp")
        second = submit_job(config, rt.engine, prefix="ingest/svc1", timestamp_key="timestamp")
        tick_until(rt.coordinator, lambda: all(job_row(rt, j).spider_id for j in (first, second)))
        for job_id in (first, second):  # Spider finishes both; the loop has not seen it yet
            spider_id = job_row(rt, job_id).spider_id
            assert spider_id is not None
            wait_for(rt.spider, spider_id, JobState.SUCCEEDED)
        # As CLP's commit leaves a job: SUCCEEDED, and no record of this coordinator's.
        with rt.engine.begin() as connection:
            connection.execute(delete(stored_archives).where(stored_archives.c.job_id == first))
        with rt.engine.begin() as connection:
            connection.execute(
                update(compression_jobs)
                .where(compression_jobs.c.id.in_([first, second]))
                .values(status=int(JobStatus.SUCCEEDED), committed_at=None)
            )
        tick_until(rt.coordinator, lambda: not rt.coordinator.driven)
    assert settled == [second]
