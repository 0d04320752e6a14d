"""A terminal move settles the job's archive records in its own transaction (issue 14).

Finalising a Committed job reads the evidence of its publication; the same transaction marks the
published records ``published`` and claims the others for removal, so ending a job is one
transaction instead of three. The files are removed after the commit. A settlement that fails
without an outage never costs the job its move (the records are settled after it, as before); an
outage rolls the whole move back, to be retried.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import pytest
from sqlalchemy import Engine, event, select, update
from sqlalchemy.exc import OperationalError

from coordinator.archive_storage import FsArchiveOutput
from coordinator.config.clp import CompressionCoordinator
from coordinator.lifecycle import JobStatus, Outcome, reaction_to
from coordinator.service import cleanup as cleanup_module
from coordinator.service.cleanup import Ending
from coordinator.service.driven import DrivenJob, Loop
from coordinator.service.outcomes import Ended, OutcomeHandler
from coordinator.spider.port import JobState, SpiderPort
from coordinator.store.archives import publish_archives
from coordinator.store.datasets import archives_table
from coordinator.store.jobs import JobStore
from coordinator.store.schema import compression_jobs as _jobs
from coordinator.store.schema import job_transitions as _history
from coordinator.store.stored_archives import record_stored_archive, stored_archives_of_job
from coordinator.task_io import ArchiveMetadata
from tests.paths import SPIDER_ID, new_job_in, stored_record
from tests.sql_capture import one_line, statements_sent

DATASET = "web"
OWNER = "settling-test"
EPOCH = 3


class _NoSpider:
    """The moves under test never call Spider."""


def _committed_job(
    store: JobStore, directory: Path, spider_id: int = SPIDER_ID
) -> tuple[int, Path, Path]:
    """A Committed job of Spider job ``spider_id`` leased to ``OWNER`` with one published archive
    and a duplicate instance's unpublished one, both recorded ``stored`` with their files; the
    job and the two files."""
    job_id = new_job_in(store, JobStatus.RUNNING, spider_id=spider_id)
    files = []
    for name, instance in (("published", 1), ("duplicate", 2)):
        archive_id = f"{name}-archive-{spider_id}"
        path = directory / DATASET / archive_id
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"archive")
        record = stored_record(
            DATASET, archive_id, job_id, instance_id=instance, location=str(path), size=7
        )
        with store.engine.begin() as connection:
            record_stored_archive(connection, replace(record, spider_job_id=spider_id))
        files.append(path)
    publish_archives(
        store,
        spider_job_id=spider_id,
        dataset=DATASET,
        archive_storage_directory=str(directory / DATASET),
        archives=[
            ArchiveMetadata(
                id=f"published-archive-{spider_id}",
                begin_timestamp=1,
                end_timestamp=2,
                size=7,
                uncompressed_size=9,
            )
        ],
    )
    with store.engine.begin() as connection:
        connection.execute(
            update(_jobs).where(_jobs.c.id == job_id).values(lease_owner=OWNER, lease_epoch=EPOCH)
        )
    assert store.state(job_id) is JobStatus.COMMITTED
    return job_id, files[0], files[1]


def _loop(store: JobStore) -> Loop:
    return Loop(
        store=store,
        spider=cast(SpiderPort, _NoSpider()),
        settings=CompressionCoordinator(),
        instance_id=OWNER,
        cleanup_task=True,
        monotonic=lambda: 0.0,
    )


def _driven(job_id: int, spider_id: int = SPIDER_ID) -> DrivenJob:
    return DrivenJob(job_id, EPOCH, JobStatus.COMMITTED, spider_id, DATASET, b"", backoff_ms=100)


def _states(engine: Engine, job_id: int) -> dict[str, str]:
    with engine.connect() as connection:
        return {r.archive_id: r.state for r in stored_archives_of_job(connection, job_id)}


@pytest.fixture
def commits(migrated_engine: Engine) -> Iterator[list[int]]:
    counted: list[int] = []

    def count(_: object) -> None:
        counted.append(1)

    event.listen(migrated_engine, "commit", count)
    yield counted
    event.remove(migrated_engine, "commit", count)


def test_finalising_settles_the_records_in_the_moves_own_transaction(
    store: JobStore, migrated_engine: Engine, tmp_path: Path, commits: list[int]
) -> None:
    output = FsArchiveOutput(directory=tmp_path / "archives")
    job_id, published, duplicate = _committed_job(store, output.directory)
    loop, job = _loop(store), _driven(job_id)
    commits.clear()

    loop.react(job, reaction_to(Outcome.SUCCEEDED, JobStatus.COMMITTED))

    assert store.state(job_id) is JobStatus.SUCCEEDED
    assert len(commits) == 1  # the move (its lease ended in it) and the settlement together
    assert _states(migrated_engine, job_id) == {
        f"published-archive-{SPIDER_ID}": "published",
        f"duplicate-archive-{SPIDER_ID}": "removing",  # claimed before its file is touched
    }
    assert job.settled is not None
    assert duplicate.is_file()  # files only after the commit

    OutcomeHandler(loop, archive_output=output).clean_up(job)

    assert not duplicate.exists() and published.is_file()
    assert _states(migrated_engine, job_id) == {f"published-archive-{SPIDER_ID}": "published"}


@pytest.mark.parametrize("outcome", [Outcome.SUCCEEDED, Outcome.FAILED], ids=["final", "rollback"])
def test_a_terminal_move_ends_its_lease_in_its_guarded_statement(
    store: JobStore, migrated_engine: Engine, tmp_path: Path, outcome: Outcome
) -> None:
    job_id, _, _ = _committed_job(store, tmp_path / "archives")
    with migrated_engine.begin() as connection:
        connection.execute(
            update(_jobs)
            .where(_jobs.c.id == job_id)
            .values(lease_expires_at=store.clock() + timedelta(hours=1))
        )
    with statements_sent(migrated_engine) as sent:
        reaction = reaction_to(outcome, JobStatus.COMMITTED)
        _loop(store).react(_driven(job_id), reaction, error="a task failed")
    statements = [one_line(s) for s in sent]

    assert store.state(job_id) in (JobStatus.SUCCEEDED, JobStatus.FAILED)
    (move,) = [s for s in statements if s.startswith("update compression_jobs ")]
    assert "lease_expires_at" in move and "lease_epoch =" in move
    with migrated_engine.connect() as connection:
        row = connection.execute(select(_jobs).where(_jobs.c.id == job_id)).one()
        at = connection.execute(
            select(_history.c.at)
            .where(_history.c.job_id == job_id)
            .order_by(_history.c.id.desc())
            .limit(1)
        ).scalar_one()
    assert row.lease_expires_at == at  # expired at the move's instant: no one drives the job
    assert (row.lease_owner, row.lease_epoch) == (OWNER, EPOCH)


def test_finalising_attributes_nothing_when_every_record_names_the_job(
    store: JobStore, migrated_engine: Engine, tmp_path: Path
) -> None:
    job_id, _, _ = _committed_job(store, tmp_path / "archives")
    reaction = reaction_to(Outcome.SUCCEEDED, JobStatus.COMMITTED)

    with statements_sent(migrated_engine) as sent:
        _loop(store).react(_driven(job_id), reaction)
    statements = [one_line(s) for s in sent]

    assert store.state(job_id) is JobStatus.SUCCEEDED
    assert not [
        s for s in statements if s.startswith("update compression_stored_archives set job_id")
    ]
    assert set(_states(migrated_engine, job_id).values()) == {"published", "removing"}


def test_finalising_attributes_and_settles_a_record_its_spider_job_left_unattributed(
    store: JobStore, migrated_engine: Engine, tmp_path: Path
) -> None:
    output = FsArchiveOutput(directory=tmp_path / "archives")
    job_id, published, _ = _committed_job(store, output.directory)
    late = output.directory / DATASET / "late-archive"
    late.write_bytes(b"archive")
    record = stored_record(DATASET, "late-archive", None, instance_id=3, location=str(late))
    with migrated_engine.begin() as connection:
        record_stored_archive(connection, record)
    loop, job = _loop(store), _driven(job_id)

    loop.react(job, reaction_to(Outcome.SUCCEEDED, JobStatus.COMMITTED))

    assert _states(migrated_engine, job_id)["late-archive"] == "removing"  # now the job's
    OutcomeHandler(loop, archive_output=output).clean_up(job)
    assert not late.exists() and published.is_file()


def test_a_failed_settlement_never_costs_the_job_its_move(
    store: JobStore, migrated_engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    output = FsArchiveOutput(directory=tmp_path / "archives")
    job_id, published, duplicate = _committed_job(store, output.directory)
    loop, job = _loop(store), _driven(job_id)

    def broken(*_: object) -> None:
        raise RuntimeError("a bug in the settlement")

    monkeypatch.setattr("coordinator.service.driven.settle_all_within", broken)
    loop.react(job, reaction_to(Outcome.SUCCEEDED, JobStatus.COMMITTED))

    assert store.state(job_id) is JobStatus.SUCCEEDED
    assert job.settled is None
    assert _states(migrated_engine, job_id) == {
        f"published-archive-{SPIDER_ID}": "stored",
        f"duplicate-archive-{SPIDER_ID}": "stored",
    }
    OutcomeHandler(loop, archive_output=output).clean_up(job)  # settled after the move instead
    assert _states(migrated_engine, job_id) == {f"published-archive-{SPIDER_ID}": "published"}
    assert not duplicate.exists() and published.is_file()


def test_an_outage_in_the_settlement_rolls_the_whole_move_back(
    store: JobStore, migrated_engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    output = FsArchiveOutput(directory=tmp_path / "archives")
    job_id, _, _ = _committed_job(store, output.directory)
    loop, job = _loop(store), _driven(job_id)
    outage = OperationalError("UPDATE", None, sqlite3.OperationalError("database is locked"))

    def locked(*_: object) -> None:
        raise outage

    monkeypatch.setattr("coordinator.service.driven.settle_all_within", locked)
    with pytest.raises(OperationalError):
        loop.react(job, reaction_to(Outcome.SUCCEEDED, JobStatus.COMMITTED))

    assert store.state(job_id) is JobStatus.COMMITTED
    with migrated_engine.connect() as connection:
        row = connection.execute(
            select(_jobs.c.lease_owner, _jobs.c.lease_epoch).where(_jobs.c.id == job_id)
        ).one()
        finalised = connection.execute(
            select(_history.c.id).where(
                _history.c.job_id == job_id, _history.c.trigger == "finalised"
            )
        ).all()
    assert (row.lease_owner, row.lease_epoch) == (OWNER, EPOCH)  # still held: retried next tick
    assert finalised == []
    assert _states(migrated_engine, job_id) == {
        f"published-archive-{SPIDER_ID}": "stored",
        f"duplicate-archive-{SPIDER_ID}": "stored",
    }


def test_a_dataset_whose_archives_table_is_missing_has_nothing_published(
    store: JobStore, migrated_engine: Engine
) -> None:
    """The published rows are read without looking the table up first: a missing table is told
    apart from other errors, and the transaction goes on (the job ends by ``unpublished``)."""
    job_id = new_job_in(store, JobStatus.COMMITTED)
    with migrated_engine.begin() as connection:
        record_stored_archive(connection, stored_record("ghost_dataset", "lost-archive", job_id))
        connection.execute(
            update(_jobs).where(_jobs.c.id == job_id).values(lease_owner=OWNER, lease_epoch=EPOCH)
        )
    loop, job = _loop(store), _driven(job_id)

    loop.react(job, reaction_to(Outcome.SUCCEEDED, JobStatus.COMMITTED))

    assert store.state(job_id) is JobStatus.FAILED
    with migrated_engine.connect() as connection:
        message = connection.execute(select(_jobs.c.status_msg).where(_jobs.c.id == job_id))
        assert "none of its archives is published" in message.scalar_one()


def test_the_jobs_spider_ended_together_are_finalised_in_one_transaction(
    store: JobStore, migrated_engine: Engine, tmp_path: Path, commits: list[int]
) -> None:
    """Each finalisation stays its own guarded move: one job's gap or lost race leaves the
    others' moves alone, and the job with a gap ends by ``unpublished``."""
    output = FsArchiveOutput(directory=tmp_path / "archives")
    first, second, gap, raced = (
        _committed_job(store, output.directory, spider_id)[0] for spider_id in (11, 12, 13, 14)
    )
    with migrated_engine.begin() as connection:
        archives = archives_table(DATASET)
        connection.execute(archives.delete().where(archives.c.creator_id == "13"))
        connection.execute(update(_jobs).where(_jobs.c.id == raced).values(lease_epoch=EPOCH + 1))
    loop = _loop(store)
    jobs = {
        job_id: _driven(job_id, spider_id)
        for job_id, spider_id in ((first, 11), (second, 12), (gap, 13), (raced, 14))
    }
    loop.driven.update(jobs)
    reaction = reaction_to(Outcome.SUCCEEDED, JobStatus.COMMITTED)
    commits.clear()

    with statements_sent(migrated_engine) as sent:
        gaps = loop.finalise([(job, reaction) for job in jobs.values()])
    statements = [one_line(s) for s in sent]

    assert len(commits) == 1
    assert [(job.job_id, text) for job, text in gaps] == [
        (gap, "none of its archives is published")
    ]
    # The evidence of the four is read together: before, three reads for each job.
    reads = [s.split(" from ", 1)[1].split()[0] for s in statements if s.startswith("select ")]
    assert reads.count("compression_stored_archives") == 1
    assert reads.count(f"clp_{DATASET}_archives") == 1
    assert (
        sum(
            1
            for s in statements
            if s.startswith("select compression_jobs.id, compression_jobs.compressed_size")
        )
        == 1
    )
    assert store.state(first) is store.state(second) is JobStatus.SUCCEEDED
    assert store.state(gap) is store.state(raced) is JobStatus.COMMITTED
    assert set(loop.driven) == {gap}  # the raced job is another coordinator's now
    for job_id, spider_id in ((first, 11), (second, 12)):
        assert _states(migrated_engine, job_id)[f"published-archive-{spider_id}"] == "published"

    OutcomeHandler(loop, archive_output=output).conclude([Ended(jobs[gap], JobState.SUCCEEDED)])
    assert store.state(gap) is JobStatus.FAILED


def test_the_jobs_finalised_together_are_settled_in_one_savepoint(
    store: JobStore, migrated_engine: Engine, tmp_path: Path
) -> None:
    """Before, each job's settlement had a savepoint of its own: two statements per job."""
    output = FsArchiveOutput(directory=tmp_path / "archives")
    job_ids = [_committed_job(store, output.directory, spider_id)[0] for spider_id in (21, 22, 23)]
    loop = _loop(store)
    jobs = {
        job_id: _driven(job_id, spider_id)
        for job_id, spider_id in zip(job_ids, (21, 22, 23), strict=True)
    }
    loop.driven.update(jobs)
    savepoints: list[str] = []

    def count(_c: object, _cursor: object, statement: str, *_: object) -> None:
        if statement.upper().startswith("SAVEPOINT"):
            savepoints.append(statement)

    event.listen(migrated_engine, "before_cursor_execute", count)
    try:
        reaction = reaction_to(Outcome.SUCCEEDED, JobStatus.COMMITTED)
        assert loop.finalise([(job, reaction) for job in jobs.values()]) == []
    finally:
        event.remove(migrated_engine, "before_cursor_execute", count)
    assert len(savepoints) == 1
    for job_id, spider_id in zip(job_ids, (21, 22, 23), strict=True):
        assert store.state(job_id) is JobStatus.SUCCEEDED
        assert jobs[job_id].settled is not None
        assert _states(migrated_engine, job_id) == {
            f"published-archive-{spider_id}": "published",
            f"duplicate-archive-{spider_id}": "removing",  # its file goes after the commit
        }


def test_a_failed_settlement_of_jobs_finalised_together_settles_each_after_its_move(
    store: JobStore, migrated_engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One job's settlement fails (a bug): the savepoint of all of them is rolled back, every
    move stays, and each job's records are settled after its move instead."""
    output = FsArchiveOutput(directory=tmp_path / "archives")
    made = [_committed_job(store, output.directory, spider_id) for spider_id in (31, 32)]
    loop = _loop(store)
    jobs = [
        _driven(job_id, spider_id) for (job_id, _, _), spider_id in zip(made, (31, 32), strict=True)
    ]
    loop.driven.update({job.job_id: job for job in jobs})
    real = cleanup_module._settlement

    def broken_for_the_second(connection: Any, ending: Ending) -> Any:
        if ending.job_id == jobs[1].job_id:
            raise RuntimeError("a bug in the settlement")
        return real(connection, ending)

    monkeypatch.setattr(cleanup_module, "_settlement", broken_for_the_second)
    reaction = reaction_to(Outcome.SUCCEEDED, JobStatus.COMMITTED)
    assert loop.finalise([(job, reaction) for job in jobs]) == []
    monkeypatch.setattr(cleanup_module, "_settlement", real)

    assert [store.state(job.job_id) for job in jobs] == [JobStatus.SUCCEEDED] * 2
    assert [job.settled for job in jobs] == [None, None]
    handler = OutcomeHandler(loop, archive_output=output)
    for job, (job_id, published, duplicate), spider_id in zip(jobs, made, (31, 32), strict=True):
        assert _states(migrated_engine, job_id)[f"published-archive-{spider_id}"] == "stored"
        handler.clean_up(job)  # settled after the move instead
        assert _states(migrated_engine, job_id) == {f"published-archive-{spider_id}": "published"}
        assert not duplicate.exists() and published.is_file()


def test_jobs_finalised_together_write_their_history_rows_and_settlements_together(
    store: JobStore, migrated_engine: Engine, tmp_path: Path
) -> None:
    """Each finalising move is its own fenced compare-and-set; the applied ones' history rows are
    written in one INSERT (``JobStore.apply_together``), their records' ``published`` marks in one
    UPDATE and their claims for removal in another (``settle_all_within``); before, one of each
    per job."""
    output = FsArchiveOutput(directory=tmp_path / "archives")
    made = [_committed_job(store, output.directory, spider_id) for spider_id in (41, 42, 43)]
    loop = _loop(store)
    spider_ids = (41, 42, 43)
    jobs = [
        _driven(job_id, spider) for (job_id, _, _), spider in zip(made, spider_ids, strict=True)
    ]
    lost = jobs[1]
    with migrated_engine.begin() as connection:  # another coordinator took this one over
        connection.execute(update(_jobs).where(_jobs.c.id == lost.job_id).values(lease_epoch=9))
    loop.driven.update({job.job_id: job for job in jobs})
    reaction = reaction_to(Outcome.SUCCEEDED, JobStatus.COMMITTED)
    with statements_sent(migrated_engine) as sent:
        assert loop.finalise([(job, reaction) for job in jobs]) == []
    inserts = [s for s in sent if one_line(s).startswith("insert into compression_job_transitions")]
    assert len(inserts) == 1
    settling = [s for s in sent if one_line(s).startswith("update compression_stored_archives")]
    assert len(settling) == 2  # the marks, the claims
    for job, (job_id, _, _) in zip(jobs, made, strict=True):
        spider = job.spider_id
        if job is lost:
            assert _states(migrated_engine, job_id) == {
                f"published-archive-{spider}": "stored",
                f"duplicate-archive-{spider}": "stored",
            }
        else:
            assert _states(migrated_engine, job_id) == {
                f"published-archive-{spider}": "published",
                f"duplicate-archive-{spider}": "removing",
            }
    assert [store.state(job.job_id) for job in jobs] == [
        JobStatus.SUCCEEDED,
        JobStatus.COMMITTED,
        JobStatus.SUCCEEDED,
    ]
    with migrated_engine.connect() as connection:
        finalised = connection.execute(
            select(_history.c.job_id, _history.c.lease_epoch, _history.c.actor_id)
            .where(_history.c.trigger == "finalised")
            .order_by(_history.c.job_id)
        ).all()
    assert [tuple(row) for row in finalised] == [
        (jobs[0].job_id, EPOCH, OWNER),
        (jobs[2].job_id, EPOCH, OWNER),
    ]
