"""CLP's own readers of ``compression_jobs.status`` against the coordinator's rows.

Before the Committed state was stored as RUNNING plus the ``committed_at`` marker, a job held
status 5 between its commit and Spider's confirmation, and every reader below failed on it:
log-ingestor's wait returned "Invalid compression job status: 5" (and abandoned the ingestion job's
objects), ``compress.py``'s ``handle_job_update`` raised ``NotImplementedError``.

The readers are transcribed from CLP's sources (commit e00317e3), their SQL verbatim:

* log-ingestor, ``wait_for_compression_result``:
  ``components/log-ingestor/src/ingestion_job_manager/clp_ingestion.rs`` (``POLLING_QUERY``, then
  ``CompressionJobStatus::try_from`` of ``components/clp-rust-utils/src/job_config/compression.rs``)
* ``compress.py``'s ``handle_job_update``:
  ``components/clp-package-utils/clp_package_utils/scripts/native/compress.py``, with the
  ``CompressionJobStatus`` of
  ``components/job-orchestration/job_orchestration/scheduler/constants.py``
* the legacy scheduler's start-up kill (``scheduler/utils.py::kill_hanging_jobs``, described in
  ``docs/clp.md``, The legacy scheduler: every RUNNING compression job becomes KILLED,
  ``duration = 0``).
"""

from __future__ import annotations

import threading
from enum import IntEnum, auto
from pathlib import Path

import pytest
from sqlalchemy import Connection, Engine, text

from coordinator.config.clp import PollingBackoff
from coordinator.config.loader import CoordinatorConfig, load_config
from coordinator.lifecycle import Actor, CommittedStorage, JobStatus
from coordinator.runtime import open_runtime, worker_settings
from coordinator.service.ingest import submit_job
from coordinator.spider.port import JobState, SpiderPort
from coordinator.store.archives import publish_archives
from coordinator.store.guarded import Applied, TransitionRequest
from coordinator.store.jobs import JobStore, job_state
from coordinator.task_io import ArchiveMetadata
from tests.paths import SPIDER_ID, new_job_in
from tests.service_support import (
    SpiderProxy,
    archive_files,
    coordinator_with,
    job_row,
    published,
    put_logs,
    run_until_idle,
    tick_until,
)


class CompressionJobStatus(IntEnum):
    """``job_orchestration/scheduler/constants.py`` (verbatim values; Rust mirrors them)."""

    PENDING = 0
    RUNNING = auto()
    SUCCEEDED = auto()
    FAILED = auto()
    KILLED = auto()


class InvalidStatus(Exception):
    """log-ingestor's ``anyhow!("Invalid compression job status: {status}")``."""


# clp_ingestion.rs, wait_for_compression_result: POLLING_QUERY (backquotes as formatcp! renders).
LOG_INGESTOR_POLLING_QUERY = (
    "SELECT `status`, `status_msg` FROM `compression_jobs` WHERE `id` = :id"
)


def log_ingestor_poll(connection: Connection, job_id: int) -> CompressionJobStatus | None:
    """One round of log-ingestor's wait: the final status, or ``None`` to keep waiting."""
    status, _ = connection.execute(text(LOG_INGESTOR_POLLING_QUERY), {"id": job_id}).one()
    try:
        parsed = CompressionJobStatus(status)  # CompressionJobStatus::try_from(status)
    except ValueError:
        raise InvalidStatus(f"Invalid compression job status: {status}") from None
    if parsed in (
        CompressionJobStatus.SUCCEEDED,
        CompressionJobStatus.FAILED,
        CompressionJobStatus.KILLED,
    ):
        return parsed
    return None


def compress_py_poll(connection: Connection, job_id: int) -> str | None:
    """One round of ``handle_job_update`` (progress reporting on): ``None`` to keep waiting."""
    polling_query = (
        f"SELECT start_time, status, status_msg, uncompressed_size, compressed_size, duration "
        f"FROM compression_jobs WHERE id={job_id}"
    )
    job_row = connection.execute(text(polling_query)).mappings().one()
    job_status = job_row["status"]
    if job_status == CompressionJobStatus.SUCCEEDED:
        return "Compression finished."
    if job_status == CompressionJobStatus.FAILED:
        return f"Compression failed. {job_row['status_msg']}"
    if job_status == CompressionJobStatus.KILLED:
        return f"Compression killed. {job_row['status_msg']}"
    if job_status == CompressionJobStatus.RUNNING:
        assert job_row["uncompressed_size"] >= 0  # progress reporting reads it
    elif job_status == CompressionJobStatus.PENDING:
        pass
    else:
        error_msg = f"Unhandled CompressionJobStatus: {job_status}"
        raise NotImplementedError(error_msg)
    return None


def kill_hanging_jobs(connection: Connection) -> int:
    """The legacy scheduler's start-up kill of every RUNNING compression job."""
    return int(
        connection.execute(
            text(
                "UPDATE compression_jobs SET status = :killed, duration = 0, "
                "update_time = CURRENT_TIMESTAMP WHERE status = :running"
            ),
            {
                "killed": int(CompressionJobStatus.KILLED),
                "running": int(CompressionJobStatus.RUNNING),
            },
        ).rowcount
    )


def _archive(name: str) -> ArchiveMetadata:
    return ArchiveMetadata(
        id=name, begin_timestamp=1, end_timestamp=2, size=5, uncompressed_size=50
    )


def _commit(store: JobStore) -> None:
    publish_archives(
        store,
        spider_job_id=SPIDER_ID,
        dataset="web",
        archive_storage_directory="/archives/web",
        archives=[_archive("a0")],
    )


def _finalise(store: JobStore, job_id: int) -> None:
    result = store.transition(
        TransitionRequest(
            job_id,
            "finalised",
            JobStatus.COMMITTED,
            JobStatus.SUCCEEDED,
            Actor.COORDINATOR,
            spider_id=SPIDER_ID,
        )
    )
    assert isinstance(result, Applied)


def test_a_committed_job_reads_as_running_to_clps_readers(store: JobStore) -> None:
    job_id = new_job_in(store, JobStatus.RUNNING)
    _commit(store)
    assert store.state(job_id) is JobStatus.COMMITTED
    with store.engine.connect() as connection:
        assert log_ingestor_poll(connection, job_id) is None  # still waiting, no error
        assert compress_py_poll(connection, job_id) is None
    _finalise(store, job_id)
    with store.engine.connect() as connection:
        assert log_ingestor_poll(connection, job_id) is CompressionJobStatus.SUCCEEDED
        assert compress_py_poll(connection, job_id) == "Compression finished."


def test_the_distinct_setting_stores_committed_as_5_for_a_clp_that_knows_it(
    migrated_engine: Engine,
) -> None:
    """The opt-in form: CLP's current readers cannot read it (which is why it is not the default),
    and every guarded move treats it as Committed."""
    store = JobStore(migrated_engine, committed_storage=CommittedStorage.DISTINCT)
    job_id = new_job_in(store, JobStatus.RUNNING)
    _commit(store)
    row = store.get(job_id)
    assert row is not None and (row.status, job_state(row)) == (5, JobStatus.COMMITTED)
    with migrated_engine.connect() as connection:
        with pytest.raises(InvalidStatus, match="Invalid compression job status: 5"):
            log_ingestor_poll(connection, job_id)
        with pytest.raises(NotImplementedError, match="Unhandled CompressionJobStatus: 5"):
            compress_py_poll(connection, job_id)
    # The default store (another process, another setting) still reads and moves it.
    default = JobStore(migrated_engine)
    assert default.state(job_id) is JobStatus.COMMITTED
    _finalise(default, job_id)


def test_a_running_edge_never_matches_a_committed_row(store: JobStore) -> None:
    """The marker is part of every guard: Running → Failed cannot overwrite a publication."""
    job_id = new_job_in(store, JobStatus.RUNNING)
    _commit(store)
    result = store.transition(
        TransitionRequest(
            job_id,
            "failed",
            JobStatus.RUNNING,
            JobStatus.FAILED,
            Actor.COORDINATOR,
            reason="late failure report",
            spider_id=SPIDER_ID,
        )
    )
    assert not isinstance(result, Applied)
    assert store.state(job_id) is JobStatus.COMMITTED


_HOLD_SECS = 10.0
"""How long the proxy holds back a success that no sample has seen Committed."""


class _SucceededOnceSampled(SpiderProxy):
    """Tells the coordinator a job Spider finished is Succeeded only once ``sampled`` is set (or
    ``_HOLD_SECS`` have passed), so the Committed window is open while the sampler looks."""

    def __init__(self, inner: SpiderPort, sampled: threading.Event) -> None:
        super().__init__(inner)
        self.sampled = sampled

    def get_job_state(self, job_id: int) -> JobState:
        state = self.inner.get_job_state(job_id)
        if state is JobState.SUCCEEDED:
            self.sampled.wait(_HOLD_SECS)
        return state


@pytest.mark.slow
def test_status_sampled_through_real_runs_never_leaves_clps_values(
    config: CoordinatorConfig, tmp_path: Path
) -> None:
    """A sampler runs both readers on every job while the coordinator works: no reader fails,
    and the samples include committed rows (seen by CLP as RUNNING).

    The Committed window (the commit task's move to the coordinator's finalisation) lasts until
    the coordinator next polls; a sampler slowed by a loaded machine could miss every one, so the
    coordinator learns of Spider's success only once a Committed row was sampled (or after
    ``_HOLD_SECS``: a commit that never shows as Committed still fails the test)."""
    put_logs(config, tmp_path, ["svc0", "svc1"])
    samples: list[tuple[int, bool]] = []
    errors: list[BaseException] = []
    stop = threading.Event()
    committed_sampled = threading.Event()
    with open_runtime(config, lease_secs=5) as rt:
        jobs = [submit_job(config, rt.engine, timestamp_key="timestamp") for _ in range(3)]
        slow = rt.config.compression_coordinator.model_copy(
            update={
                "result_polling": PollingBackoff(
                    init_backoff_millisecs=300, max_backoff_millisecs=300
                )
            }
        )
        coordinator = coordinator_with(
            rt, spider=_SucceededOnceSampled(rt.spider, committed_sampled), settings=slow
        )

        def sample() -> None:
            try:
                while not stop.is_set():
                    with rt.engine.connect() as connection:
                        for job_id in jobs:
                            log_ingestor_poll(connection, job_id)
                            compress_py_poll(connection, job_id)
                        rows = connection.execute(
                            text("SELECT status, committed_at FROM compression_jobs")
                        ).all()
                    found = [(row.status, row.committed_at is not None) for row in rows]
                    samples.extend(found)
                    if (1, True) in found:
                        committed_sampled.set()
                    stop.wait(0.005)
            except BaseException as error:
                errors.append(error)

        sampler = threading.Thread(target=sample)
        sampler.start()
        try:
            run_until_idle(coordinator, timeout=120)
        finally:
            stop.set()
            sampler.join()
        assert errors == []
        assert {status for status, _ in samples} <= {0, 1, 2, 3, 4}
        assert (1, True) in samples, "no sample caught a job in its Committed window"
        with rt.engine.connect() as connection:
            assert [log_ingestor_poll(connection, job_id) for job_id in jobs] == [
                CompressionJobStatus.SUCCEEDED
            ] * 3


@pytest.mark.slow
def test_a_committed_job_killed_by_the_legacy_scheduler_keeps_nothing_published(
    config: CoordinatorConfig, tmp_path: Path
) -> None:
    """The start-up kill matches Committed rows too (stored as RUNNING): the coordinator then
    withdraws the published archives, as a rollback does, and removes the files."""
    put_logs(config, tmp_path, ["svc0"])
    with open_runtime(config, lease_secs=5) as rt:
        job_id = submit_job(config, rt.engine, dataset="web", timestamp_key="timestamp")
        never = rt.config.compression_coordinator.model_copy(
            update={
                "result_polling": PollingBackoff(
                    init_backoff_millisecs=3_600_000, max_backoff_millisecs=3_600_000
                )
            }
        )
        coordinator = coordinator_with(rt, settings=never)
        tick_until(coordinator, lambda: job_state(job_row(rt, job_id)) is JobStatus.COMMITTED)
        spider_id = job_row(rt, job_id).spider_id
        assert spider_id is not None and published(rt.engine, "web", spider_id)
        with rt.engine.begin() as connection:
            assert kill_hanging_jobs(connection) == 1
        # The coordinator sees the foreign terminal row when it next looks at the job.
        for job in coordinator.driven.values():
            job.next_poll = 0.0
        run_until_idle(coordinator)
        row = job_row(rt, job_id)
        assert row.status == JobStatus.KILLED  # the foreign write stands
        assert published(rt.engine, "web", spider_id) == []
        assert archive_files(config, "web") == set()


def test_the_setting_reaches_the_commit_task(tmp_path: Path) -> None:
    """``coordinator.committed_status`` is read from the file and handed to the task workers."""
    path = tmp_path / "clp-config.yaml"
    path.write_text(
        "spider: {}\ncompression_coordinator: {}\n"
        "coordinator:\n  engine: embedded\n  committed_status: distinct\n",
        encoding="utf-8",
    )
    loaded = load_config(path, data_dir=tmp_path / "var")
    assert loaded.extras.committed_status is CommittedStorage.DISTINCT
    settings = worker_settings(loaded, f"sqlite:///{tmp_path}/c.db")
    assert settings.committed_storage is CommittedStorage.DISTINCT
    assert load_config(None, data_dir=tmp_path / "var").extras.committed_status is (
        CommittedStorage.RUNNING
    )
