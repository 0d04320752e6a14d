"""The commit task on SQLite and MariaDB: publication, idempotency, refusals, double commits."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from sqlalchemy import Engine, select, text

from coordinator.archive_storage import FsArchiveOutput
from coordinator.engine.tasks.commit import commit
from coordinator.engine.tasks.context import TaskContext, TaskError, WorkerSettings
from coordinator.lifecycle import Actor, JobStatus
from coordinator.store.archives import withdraw_archives
from coordinator.store.datasets import archives_table, ensure_dataset_tables
from coordinator.store.jobs import JobStore, job_state
from coordinator.store.schema import datasets
from coordinator.store.stored_archives import (
    record_stored_archive,
    stored_archives_of_job,
)
from coordinator.task_io import ArchiveMetadata, CompressionTaskOutput
from tests.paths import SPIDER_ID, new_job_in, stored_record


def _context(
    engine: Engine, tmp_path: Path, outputs: list[CompressionTaskOutput], instance: int = 1
) -> TaskContext:
    settings = WorkerSettings(
        database_url=engine.url.render_as_string(hide_password=False),
        archive_output=FsArchiveOutput(directory=tmp_path / "archives"),
        staging_directory=tmp_path / "staging",
    )
    return TaskContext(
        job_id=SPIDER_ID,
        task_id="commit",
        instance_id=instance,
        settings=settings,
        graph_outputs=tuple(output.to_msgpack() for output in outputs),
    )


def _archive(name: str, size: int = 10) -> ArchiveMetadata:
    return ArchiveMetadata(
        id=name, begin_timestamp=1, end_timestamp=2, size=size, uncompressed_size=size * 10
    )


OUTPUTS = [
    CompressionTaskOutput(dataset="web", archives=[_archive("a0"), _archive("a1", 20)]),
    CompressionTaskOutput(dataset="web", archives=[_archive("b0", 30)]),
]


def _published(engine: Engine, dataset: str = "web") -> list[tuple[str, str, int]]:
    table = archives_table(dataset)
    with engine.connect() as connection:
        rows = connection.execute(
            select(table.c.id, table.c.creator_id, table.c.creation_ix).order_by(table.c.id)
        ).all()
    return [tuple(row) for row in rows]  # type: ignore[misc]


def test_the_commit_publishes_and_moves_the_job_to_committed(
    store: JobStore, migrated_engine: Engine, tmp_path: Path
) -> None:
    job_id = new_job_in(store, JobStatus.RUNNING)
    assert commit(_context(migrated_engine, tmp_path, OUTPUTS), []) == []

    job = store.get(job_id)
    assert job is not None
    assert (job_state(job), job.uncompressed_size, job.compressed_size) == (
        JobStatus.COMMITTED,
        600,
        60,
    )
    # CLP's readers see a job still running (the default stored form of Committed).
    assert (job.status, job.committed_at is not None) == (JobStatus.RUNNING, True)
    assert job.duration is not None and job.duration >= 0
    creator = str(SPIDER_ID)
    assert _published(migrated_engine) == [
        ("a0", creator, 0),
        ("a1", creator, 1),
        ("b0", creator, 2),
    ]
    with migrated_engine.connect() as connection:
        registered = connection.execute(
            select(datasets.c.name, datasets.c.archive_storage_directory)
        ).all()
    assert registered == [("web", str(tmp_path / "archives" / "web"))]
    last = store.history(job_id)[-1]
    assert (last.trigger, last.actor, last.to_status) == ("committed", Actor.COMMIT_TASK.value, 5)


def test_a_second_commit_is_a_no_op(
    store: JobStore, migrated_engine: Engine, tmp_path: Path
) -> None:
    job_id = new_job_in(store, JobStatus.RUNNING)
    commit(_context(migrated_engine, tmp_path, OUTPUTS), [])
    commit(_context(migrated_engine, tmp_path, OUTPUTS, instance=2), [])
    assert len(_published(migrated_engine)) == 3
    assert [h.trigger for h in store.history(job_id)] == ["submitted", "committed"]


def test_a_succeeded_job_is_left_alone(
    store: JobStore, migrated_engine: Engine, tmp_path: Path
) -> None:
    """A terminal row never matches a commit: its Spider job is over."""
    job_id = new_job_in(store, JobStatus.SUCCEEDED)
    with pytest.raises(TaskError, match="no running CLP compression job records Spider job"):
        commit(_context(migrated_engine, tmp_path, OUTPUTS), [])
    job = store.get(job_id)
    assert job is not None and job.status == JobStatus.SUCCEEDED
    assert _published(migrated_engine) == []


def test_concurrent_commits_publish_exactly_one_set(
    store: JobStore, migrated_engine: Engine, tmp_path: Path
) -> None:
    job_id = new_job_in(store, JobStatus.RUNNING)
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def run(instance: int) -> None:
        try:
            barrier.wait(timeout=30)
            commit(_context(migrated_engine, tmp_path, OUTPUTS, instance), [])
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(_published(migrated_engine)) == 3
    job = store.get(job_id)
    assert job is not None and job_state(job) == JobStatus.COMMITTED
    assert [h.trigger for h in store.history(job_id)].count("committed") == 1


def test_a_job_killed_meanwhile_is_refused(
    store: JobStore, migrated_engine: Engine, tmp_path: Path
) -> None:
    """CLP's legacy scheduler kills RUNNING jobs on start-up (H2); the commit must not publish."""
    job_id = new_job_in(store, JobStatus.RUNNING)
    with migrated_engine.begin() as connection:
        connection.execute(text("UPDATE compression_jobs SET status = 4 WHERE status = 1"))
    with pytest.raises(
        TaskError, match=f"no running CLP compression job records Spider job {SPIDER_ID}; refusing"
    ):
        commit(_context(migrated_engine, tmp_path, OUTPUTS), [])
    assert _published(migrated_engine) == []
    assert store.get(job_id) is not None


def test_an_unknown_spider_job_is_refused(migrated_engine: Engine, tmp_path: Path) -> None:
    with pytest.raises(
        TaskError, match=f"no running CLP compression job records Spider job {SPIDER_ID}"
    ):
        commit(_context(migrated_engine, tmp_path, OUTPUTS), [])


@pytest.mark.parametrize(
    ("outputs", "message"),
    [
        ([CompressionTaskOutput(dataset="web", archives=[])], "no archives to publish"),
        ([], "no archives to publish"),
        (
            [
                CompressionTaskOutput(dataset="a", archives=[_archive("x")]),
                CompressionTaskOutput(dataset="b", archives=[_archive("y")]),
            ],
            "more than one dataset",
        ),
        ([CompressionTaskOutput(dataset="bad-name", archives=[_archive("x")])], "invalid dataset"),
    ],
)
def test_bad_outputs_are_refused_without_publishing(
    store: JobStore,
    migrated_engine: Engine,
    tmp_path: Path,
    outputs: list[CompressionTaskOutput],
    message: str,
) -> None:
    job_id = new_job_in(store, JobStatus.RUNNING)
    with pytest.raises(TaskError, match=message):
        commit(_context(migrated_engine, tmp_path, outputs), [])
    job = store.get(job_id)
    assert job is not None and job.status == JobStatus.RUNNING


def test_undecodable_outputs_are_refused(migrated_engine: Engine, tmp_path: Path) -> None:
    context = _context(migrated_engine, tmp_path, [])
    broken = TaskContext(context.job_id, "commit", 1, context.settings, (b"\x93\x01",))
    with pytest.raises(TaskError, match="graph output 0 is not a CompressionTaskOutput"):
        commit(broken, [])


def _record_stored(engine: Engine, archives: list[tuple[str, str]], job_id: int | None) -> None:
    """Records as the compress task writes them: ``(dataset, archive id)`` of SPIDER_ID."""
    with engine.begin() as connection:
        for dataset, archive_id in archives:
            record_stored_archive(connection, stored_record(dataset, archive_id, job_id))


STORED = [("web", "a0"), ("web", "a1"), ("web", "b0")]


def test_the_commit_finds_its_job_among_older_rows_with_the_same_spider_id(
    store: JobStore, migrated_engine: Engine, tmp_path: Path
) -> None:
    """CLP's Rust coordinator or a reset Spider used the id before: terminal rows never match.

    Before the lookup took in-flight rows only, this failed with ``MultipleResultsFound``.
    """
    older = [new_job_in(store, JobStatus.SUCCEEDED) for _ in range(2)]
    job_id = new_job_in(store, JobStatus.RUNNING)
    _record_stored(migrated_engine, STORED, None)
    commit(_context(migrated_engine, tmp_path, OUTPUTS), [])
    assert store.state(job_id) is JobStatus.COMMITTED
    assert [store.state(old) for old in older] == [JobStatus.SUCCEEDED] * 2
    with migrated_engine.connect() as connection:
        attributed = stored_archives_of_job(connection, job_id)
    assert sorted(record.archive_id for record in attributed) == ["a0", "a1", "b0"]


def test_two_in_flight_jobs_with_one_spider_id_are_refused(
    store: JobStore, migrated_engine: Engine, tmp_path: Path
) -> None:
    """An ambiguous match is a clear failure, never a guess."""
    first, second = new_job_in(store, JobStatus.RUNNING), new_job_in(store, JobStatus.RUNNING)
    with pytest.raises(
        TaskError, match=f"jobs {first}, {second} all record Spider job {SPIDER_ID}"
    ):
        commit(_context(migrated_engine, tmp_path, OUTPUTS), [])
    assert _published(migrated_engine) == []
    assert [store.state(first), store.state(second)] == [JobStatus.RUNNING] * 2


def test_withdrawal_removes_exactly_the_jobs_archives(
    store: JobStore, migrated_engine: Engine, tmp_path: Path
) -> None:
    """Not an older job's with the same Spider id, nor another Spider job's."""
    older = new_job_in(store, JobStatus.SUCCEEDED)
    table = archives_table("web")
    ensure_dataset_tables(migrated_engine, "web")
    with migrated_engine.begin() as connection:
        for archive_id, creator in (("old0", str(SPIDER_ID)), ("other", "99")):
            connection.execute(
                table.insert().values(
                    id=archive_id,
                    begin_timestamp=0,
                    end_timestamp=0,
                    uncompressed_size=1,
                    size=1,
                    creator_id=creator,
                    creation_ix=0,
                )
            )
    _record_stored(migrated_engine, [("web", "old0")], older)
    job_id = new_job_in(store, JobStatus.RUNNING)
    _record_stored(migrated_engine, STORED, None)
    commit(_context(migrated_engine, tmp_path, OUTPUTS), [])
    with migrated_engine.begin() as connection:
        assert sorted(withdraw_archives(connection, job_id, SPIDER_ID)) == ["a0", "a1", "b0"]
        assert withdraw_archives(connection, job_id, SPIDER_ID) == []  # idempotent
    assert _published(migrated_engine) == [("old0", str(SPIDER_ID), 0), ("other", "99", 0)]
