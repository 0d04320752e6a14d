"""Two jobs that share a Spider job id (a reset Spider, or CLP's Rust coordinator before this one).

Before records named their job, a failed job's clean-up (keyed by Spider id only) deleted the
published archive file of an earlier Succeeded job with the same Spider id.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from sqlalchemy import Engine

from coordinator.archive_storage import FsArchiveOutput
from coordinator.lifecycle import Actor, JobStatus
from coordinator.service.cleanup import settle_archives, settle_unattributed_archives
from coordinator.store.archives import publish_archives, published_archives_of_job
from coordinator.store.clock import utc_now
from coordinator.store.guarded import Applied
from coordinator.store.jobs import JobStore
from coordinator.store.stored_archives import (
    record_stored_archive,
    stored_archives,
)
from coordinator.task_io import ArchiveMetadata
from tests.paths import SPIDER_ID, new_job_in, request, stored_record


def _store(engine: Engine, directory: Path, job_id: int | None, archive_id: str) -> Path:
    """What a compress instance of Spider job SPIDER_ID leaves: a file and its record."""
    path = directory / "web" / archive_id
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"archive")
    with engine.begin() as connection:
        record_stored_archive(
            connection, stored_record("web", archive_id, job_id, location=str(path), size=7)
        )
    return path


def test_clean_up_of_a_failed_job_never_touches_an_earlier_job_with_the_same_spider_id(
    store: JobStore, migrated_engine: Engine, tmp_path: Path
) -> None:
    output = FsArchiveOutput(directory=tmp_path / "archives")
    earlier = new_job_in(store, JobStatus.RUNNING)
    earlier_file = _store(migrated_engine, output.directory, earlier, "earlier-archive")
    publish_archives(
        store,
        spider_job_id=SPIDER_ID,
        dataset="web",
        archive_storage_directory=str(output.directory / "web"),
        archives=[
            ArchiveMetadata(
                id="earlier-archive",
                begin_timestamp=1,
                end_timestamp=2,
                size=7,
                uncompressed_size=9,
            )
        ],
    )
    finalised = store.transition(
        request(earlier, "finalised", JobStatus.COMMITTED, JobStatus.SUCCEEDED, Actor.COORDINATOR)
    )
    assert isinstance(finalised, Applied)

    later = new_job_in(store, JobStatus.RUNNING)  # Spider reused the id
    later_file = _store(migrated_engine, output.directory, later, "later-archive")
    failed = store.transition(
        request(later, "failed", JobStatus.RUNNING, JobStatus.FAILED, Actor.COORDINATOR)
    )
    assert isinstance(failed, Applied)

    settled = settle_archives(migrated_engine, later, output)
    assert settled.removed == 1
    assert not later_file.exists()
    assert earlier_file.is_file()
    with migrated_engine.connect() as connection:
        assert published_archives_of_job(connection, earlier, SPIDER_ID) == {
            "web": ["earlier-archive"]
        }
    settle_archives(migrated_engine, earlier, output)
    assert earlier_file.is_file()


def test_an_archive_no_job_can_publish_any_more_is_removed(
    store: JobStore, migrated_engine: Engine, tmp_path: Path
) -> None:
    """Found by the lifecycle model: a reset Spider gave a new job the id of one still in flight,
    so the archive's record could name neither; once both ended, nothing removed the file."""
    output = FsArchiveOutput(directory=tmp_path / "archives")
    jobs = [new_job_in(store, JobStatus.RUNNING) for _ in range(2)]  # both record SPIDER_ID
    orphan = _store(migrated_engine, output.directory, None, "unattributed")
    later = utc_now() + timedelta(minutes=5)
    assert settle_unattributed_archives(migrated_engine, output, later) == 0  # still in flight
    assert orphan.is_file()
    for job_id in jobs:
        failed = store.transition(
            request(job_id, "failed", JobStatus.RUNNING, JobStatus.FAILED, Actor.COORDINATOR)
        )
        assert isinstance(failed, Applied)
    earlier = utc_now() - timedelta(minutes=5)  # stored after it: within the grace
    assert settle_unattributed_archives(migrated_engine, output, earlier) == 0
    assert settle_unattributed_archives(migrated_engine, output, later) == 1
    assert not orphan.exists()
    with migrated_engine.connect() as connection:
        assert stored_archives(connection, SPIDER_ID) == []
