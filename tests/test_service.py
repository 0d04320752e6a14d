"""The coordinator service end to end: real clp-s on the embedded engine, on SQLite and MariaDB.

Each test drives ``open_runtime``'s coordinator (or one built the same way) in-process, tick by
tick, and checks what the durable design promises: the row's status and message, the transition
history, the published archive rows, the archive files on disk and the stored-archive records.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from yscope_clp_core import KqlQuery, search_archive

from coordinator.config.clp import CompressionCoordinator
from coordinator.config.loader import CoordinatorConfig, database_url, load_config
from coordinator.config.locations import DATA_DIR_ENV, DATABASE_URL_ENV
from coordinator.engine.embedded.faults import Fault
from coordinator.job_config import (
    OutputConfig,
    UndecodableJobConfig,
    decode_clp_io_config,
    peek_input_type,
)
from coordinator.lifecycle import JobStatus
from coordinator.runtime import Runtime
from coordinator.service.ingest import submit_job
from coordinator.spider.port import InvalidArgument, JobState, SpiderPort, Unavailable
from coordinator.store.database import create_database_engine
from coordinator.store.jobs import job_state
from coordinator.store.leases import request_cancel
from tests.engine_support import wait_for
from tests.service_support import (
    TRANSPORTS,
    SpiderProxy,
    archive_files,
    compress_blob,
    coordinator_with,
    embedded,
    engine_jobs,
    job_row,
    live_leases,
    published,
    put_logs,
    raw_rows,
    records,
    reset_spider_storage,
    run_until_idle,
    runtime_over,
    set_status_behind_the_coordinator,
    submit_edited_job,
    tick_until,
    triggers,
    unfinished_spider_jobs,
    with_target_archive_size,
)

pytestmark = pytest.mark.slow  # every test runs jobs through the loop on a real engine

DATASET = "web"
SPIDER_CANCELLED = "The Spider compression job was cancelled."
WITHDRAWN = " The published archives were withdrawn."


_current = {"transport": TRANSPORTS[0]}


@pytest.fixture(params=TRANSPORTS, autouse=True)
def transport(request: pytest.FixtureRequest) -> Iterator[str]:
    """Every scenario runs twice: engine in-process, and over Spider's gRPC protocol."""
    _current["transport"] = request.param
    yield request.param
    _current["transport"] = TRANSPORTS[0]


def open_runtime(
    config: CoordinatorConfig, *, lease_secs: float
) -> AbstractContextManager[Runtime]:
    """The runtime of this test's transport (see ``runtime_over``)."""
    return runtime_over(_current["transport"], config, lease_secs)


@pytest.fixture
def config(database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> CoordinatorConfig:
    """The embedded default under ``tmp_path/var``, on the test's database, two task workers."""
    if database_url.startswith("sqlite"):
        monkeypatch.delenv(DATABASE_URL_ENV, raising=False)  # the data directory's SQLite file
    else:
        monkeypatch.setenv(DATABASE_URL_ENV, database_url)
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    loaded = load_config(None, data_dir=tmp_path / "var")
    assert loaded.compression_coordinator.compression_task_max_retry == 1
    assert loaded.compression_coordinator.commit_task_max_retry == 1
    return dataclasses.replace(loaded, embedded_workers=2)


@pytest.fixture
def two_objects(config: CoordinatorConfig, tmp_path: Path) -> CoordinatorConfig:
    """``config`` with two log files ingested and a target size that gives one task per file."""
    put_logs(config, tmp_path, ["svc0", "svc1"])
    return with_target_archive_size(config, 1)


def _spider_id(rt: Runtime, job_id: int) -> int:
    spider_id = job_row(rt, job_id).spider_id
    assert spider_id is not None, f"job {job_id} was never submitted"
    return spider_id


def _search(location: str, query: str) -> list[dict[str, Any]]:
    hits: list[dict[str, Any]] = []
    with search_archive(Path(location), KqlQuery(query)) as results:
        hits += [event.get_kv_pairs() for event in results]
    return hits


def _is_running(rt: Runtime, job_id: int) -> Callable[[], bool]:
    return lambda: job_state(job_row(rt, job_id)) is JobStatus.RUNNING


# --- 1. the four scenarios of the durable design ------------------------------------------------


def test_a_job_succeeds_and_its_archives_are_published(two_objects: CoordinatorConfig) -> None:
    config = two_objects
    with open_runtime(config, lease_secs=5) as rt:
        job_id = submit_job(config, rt.engine, dataset=DATASET, timestamp_key="timestamp")
        run_until_idle(rt.coordinator)

        row = job_row(rt, job_id)
        assert (row.status, row.status_msg) == (JobStatus.SUCCEEDED, "")
        assert triggers(rt, job_id) == ["submitted", "committed", "finalised"]
        assert [m.to_status for m in rt.store.history(job_id)] == [1, 5, 2]
        spider_id = _spider_id(rt, job_id)
        assert row.num_tasks == 2 and row.dispatch_time is not None
        assert rt.spider.get_job_state(spider_id) is JobState.SUCCEEDED

        rows = published(rt.engine, DATASET, spider_id)
        assert [r.creation_ix for r in rows] == [0, 1]  # one archive per task
        assert {r.creator_id for r in rows} == {str(spider_id)}
        assert sum(r.size for r in rows) == row.compressed_size > 0
        assert row.uncompressed_size > row.compressed_size
        stored = records(rt.engine, spider_id)
        assert sorted(s.archive_id for s in stored) == sorted(r.id for r in rows)
        assert archive_files(config, DATASET) == {r.id for r in rows}
        for record in stored:
            assert (
                Path(record.location) == config.data_dir / "archives" / DATASET / record.archive_id
            )

        hits = [hit for s in stored for hit in _search(s.location, 'request_id: "svc1-001234"')]
        assert len(hits) == 1
        assert hits[0]["service"] == "svc1" and hits[0]["level"] == "INFO"


def test_a_compress_task_failing_past_its_retries_fails_the_job_and_leaves_nothing(
    two_objects: CoordinatorConfig, caplog: pytest.LogCaptureFixture
) -> None:
    # One worker: task 0 compresses and stores its archive before task 1 fails twice.
    config = dataclasses.replace(two_objects, embedded_workers=1)
    caplog.set_level(logging.INFO, logger="coordinator.service.coordinator")
    with open_runtime(config, lease_secs=5) as rt:
        job_id = submit_job(config, rt.engine, dataset=DATASET, timestamp_key="timestamp")
        embedded(rt).inject(Fault("fail", task=1, times=2, message="object store unreachable"))
        run_until_idle(rt.coordinator)

        row = job_row(rt, job_id)
        assert row.status == JobStatus.FAILED
        # Spider's execution manager's rendering (runtime.rs:554), as a Spider cluster's reads.
        assert row.status_msg == (
            "The Spider compression job failed: in-task failure: "
            "\ufffd\ufffdTaskError\ufffd\ufffdExecutionError\ufffdobject store unreachable"
        )
        assert triggers(rt, job_id) == ["submitted", "failed"]
        assert row.duration is not None and row.duration >= 0
        spider_id = _spider_id(rt, job_id)
        assert rt.spider.get_job_state(spider_id) is JobState.FAILED
        assert published(rt.engine, DATASET, spider_id) == []
        assert records(rt.engine, spider_id) == []
        assert archive_files(config, DATASET) == set()
        # Task 0's archive was stored, then removed by the clean-up (not merely never made).
        assert (config.data_dir / "archives" / DATASET).is_dir()
        assert "removed 1 unpublished archive(s)" in caplog.messages


def test_an_operator_cancel_before_the_commit_kills_the_job(
    two_objects: CoordinatorConfig,
) -> None:
    config = two_objects
    with open_runtime(config, lease_secs=5) as rt:
        job_id = submit_job(config, rt.engine, dataset=DATASET, timestamp_key="timestamp")
        embedded(rt).inject(Fault("hard_timeout", task=0))  # hangs for minutes

        def task_1_stored() -> bool:
            spider_id = job_row(rt, job_id).spider_id
            return spider_id is not None and len(records(rt.engine, spider_id)) == 1

        tick_until(rt.coordinator, task_1_stored)
        assert job_state(job_row(rt, job_id)) is JobStatus.RUNNING
        assert request_cancel(rt.engine, job_id, rt.store.clock())
        run_until_idle(rt.coordinator, timeout=20)

        row = job_row(rt, job_id)
        assert (row.status, row.status_msg) == (JobStatus.KILLED, SPIDER_CANCELLED)
        assert triggers(rt, job_id) == ["submitted", "killed"]
        assert row.cancel_requested_at is not None
        spider_id = _spider_id(rt, job_id)
        assert rt.spider.get_job_state(spider_id) is JobState.CANCELLED
        assert published(rt.engine, DATASET, spider_id) == []
        assert records(rt.engine, spider_id) == []  # task 1's archive is removed
        assert archive_files(config, DATASET) == set()


@pytest.mark.parametrize(
    ("fault", "status", "message"),
    [
        pytest.param(
            Fault("crash", task="commit", after_effects=True, times=2),
            JobStatus.FAILED,
            "The Spider compression job failed: executor crashed (exit_status = Some(70))"
            + WITHDRAWN,
            id="failed",
        ),
        pytest.param(
            Fault("cancelled", task="commit"),
            JobStatus.KILLED,
            SPIDER_CANCELLED + WITHDRAWN,
            id="cancelled",
        ),
    ],
)
def test_spider_ending_badly_after_the_commit_rolls_the_publication_back(
    two_objects: CoordinatorConfig, fault: Fault, status: JobStatus, message: str
) -> None:
    config = two_objects
    with open_runtime(config, lease_secs=5) as rt:
        job_id = submit_job(config, rt.engine, dataset=DATASET, timestamp_key="timestamp")
        embedded(rt).inject(dataclasses.replace(fault))
        run_until_idle(rt.coordinator)

        row = job_row(rt, job_id)
        assert (row.status, row.status_msg) == (status, message)
        history = rt.store.history(job_id)
        assert [m.trigger for m in history] == ["submitted", "committed", "rolled_back"]
        assert [m.to_status for m in history] == [1, 5, int(status)]  # through Committed
        assert history[1].reason == f"published 2 archive(s) to dataset {DATASET}"
        spider_id = _spider_id(rt, job_id)
        expected_state = JobState.FAILED if status is JobStatus.FAILED else JobState.CANCELLED
        assert rt.spider.get_job_state(spider_id) is expected_state
        assert published(rt.engine, DATASET, spider_id) == []  # withdrawn
        assert records(rt.engine, spider_id) == []
        assert archive_files(config, DATASET) == set()  # removed


# --- 2. invalid jobs ------------------------------------------------------------------------------


def test_invalid_jobs_fail_with_a_precise_message_and_the_loop_carries_on(
    config: CoordinatorConfig, tmp_path: Path
) -> None:
    put_logs(config, tmp_path, ["svc0"])
    expected: dict[int, str] = {}
    with open_runtime(config, lease_secs=5) as rt:
        not_zstd = b"compression job config, not a zstd frame"
        with pytest.raises(UndecodableJobConfig) as undecodable:
            decode_clp_io_config(not_zstd)
        assert str(undecodable.value).startswith("the job config is not a zstd frame: ")
        expected[rt.store.create_job(not_zstd)] = (
            f"Failed to deserialize CLP I/O config: {undecodable.value}"
        )

        def empty_prefix(named: dict[str, Any], ids: list[int]) -> None:
            named["input"]["key_prefix"] = ""

        job, _, _ = submit_edited_job(config, rt.engine, empty_prefix)
        expected[job] = (
            "Failed to deserialize CLP I/O config: ClpIoConfig.input.s3_object_metadata."
            'key_prefix: invalid value: string "", expected a string with a length of more than 0'
        )

        def missing_id(named: dict[str, Any], ids: list[int]) -> None:
            named["input"]["s3_object_metadata_ids"] = [*ids, 987_654]

        job, ingestion, _ = submit_edited_job(config, rt.engine, missing_id)
        expected[job] = (
            "Compression job failed: missing S3 object metadata 987654 for ingestion job "
            f"{ingestion}"
        )

        def duplicate_ids(named: dict[str, Any], ids: list[int]) -> None:
            named["input"]["s3_object_metadata_ids"] = [ids[0], ids[0], ids[0]]

        job, ingestion, ids = submit_edited_job(config, rt.engine, duplicate_ids)
        expected[job] = (
            f"Compression job failed: duplicate S3 object metadata IDs [{ids[0]}] requested for "
            f"ingestion job {ingestion}"
        )

        def invalid_dataset(named: dict[str, Any], ids: list[int]) -> None:
            named["input"]["dataset"] = "web-logs"

        job, _, _ = submit_edited_job(config, rt.engine, invalid_dataset)
        expected[job] = (
            "Compression job failed: invalid dataset: web-logs (invalid dataset name 'web-logs': "
            "use only ASCII letters, digits and '_' (at least one))"
        )

        def other_bucket(named: dict[str, Any], ids: list[int]) -> None:
            named["input"]["bucket"] = "archive-bucket"

        job, _, _ = submit_edited_job(config, rt.engine, other_bucket)
        expected[job] = (
            "Compression job failed: S3 bucket mismatch: expected `archive-bucket`, but got `logs`"
        )

        with rt.engine.begin() as connection:  # registered by CLP with another letter case
            connection.execute(
                text("INSERT INTO clp_datasets VALUES ('Billing', '/var/clp/archives/Billing')")
            )

        def other_case(named: dict[str, Any], ids: list[int]) -> None:
            named["input"]["dataset"] = "billing"

        job, _, _ = submit_edited_job(config, rt.engine, other_case)
        expected[job] = (
            "Compression job failed: invalid dataset: billing (the registered dataset 'Billing' "
            "differs only in letter case; use 'Billing')"
        )

        good = submit_job(config, rt.engine, dataset=DATASET, timestamp_key="timestamp")
        run_until_idle(rt.coordinator)

        outcomes = {job: (job_row(rt, job).status, job_row(rt, job).status_msg) for job in expected}
        assert outcomes == {job: (JobStatus.FAILED, msg) for job, msg in expected.items()}
        for job in expected:
            row = job_row(rt, job)
            assert triggers(rt, job) == ["rejected"]
            assert row.spider_id is None and row.dispatch_time is not None
        assert job_row(rt, good).status == JobStatus.SUCCEEDED
        assert triggers(rt, good) == ["submitted", "committed", "finalised"]
        assert engine_jobs(rt.engine) == 1  # only the good job reached Spider


class RejectingSpider(SpiderProxy):
    """Spider refusing the first task graph it is sent with INVALID_ARGUMENT."""

    def __init__(self, inner: SpiderPort) -> None:
        super().__init__(inner)
        self.rejections = 1

    def register_job(
        self, resource_group_id: int, compressed_task_graph: bytes, compressed_inputs: bytes
    ) -> int:
        if self.rejections > 0:
            self.rejections -= 1
            raise InvalidArgument("bad request: the task graph has a cycle")
        return super().register_job(resource_group_id, compressed_task_graph, compressed_inputs)


def test_a_task_graph_spider_rejects_fails_the_job_and_the_loop_carries_on(
    config: CoordinatorConfig, tmp_path: Path
) -> None:
    put_logs(config, tmp_path, ["svc0"])
    with open_runtime(config, lease_secs=5) as rt:
        spider = RejectingSpider(rt.spider)
        coordinator = coordinator_with(rt, spider=spider)
        rejected = submit_job(config, rt.engine, dataset=DATASET, timestamp_key="timestamp")
        good = submit_job(config, rt.engine, dataset=DATASET, timestamp_key="timestamp")
        run_until_idle(coordinator)

        row = job_row(rt, rejected)
        assert row.status == JobStatus.FAILED
        assert row.status_msg == (
            "Compression job failed: Spider rejected the task graph: "
            "bad request: the task graph has a cycle"
        )
        assert triggers(rt, rejected) == ["rejected"] and row.spider_id is None
        assert spider.rejections == 0
        assert job_row(rt, good).status == JobStatus.SUCCEEDED
        assert triggers(rt, good) == ["submitted", "committed", "finalised"]


# --- 3. jobs that are not the coordinator's -------------------------------------------------------


def test_jobs_of_other_input_types_are_never_touched(
    config: CoordinatorConfig, tmp_path: Path
) -> None:
    put_logs(config, tmp_path, ["svc0"])
    output = config.clp.archive_output
    named_output = OutputConfig(
        target_archive_size=output.target_archive_size,
        target_dictionaries_size=output.target_dictionaries_size,
        target_encoded_file_size=output.target_encoded_file_size,
        target_segment_size=output.target_segment_size,
        compression_level=output.compression_level,
    ).to_named()
    webui_fs = {  # the WebUI: `type: fs` with nulls
        "input": {
            "type": "fs",
            "paths_to_compress": ["/mnt/logs/app.log"],
            "path_prefix_to_remove": None,
            "dataset": None,
            "timestamp_key": None,
            "unstructured": False,
        },
        "output": named_output,
    }
    cli_fs = {  # CLP's Python CLI: no `type` (exclude_unset)
        "input": {"paths_to_compress": ["/mnt/logs/app.log"], "timestamp_key": "timestamp"},
        "output": named_output,
    }
    cli_s3 = {
        "input": {
            "bucket": "logs",
            "key_prefix": "ingest/",
            "aws_authentication": {"type": "default"},
            "dataset": DATASET,
        },
        "output": named_output,
    }
    blobs = [compress_blob(named) for named in (webui_fs, cli_fs, cli_s3)]
    # Valid CLP configs, of the legacy scheduler's input types (CLP's Python models read them;
    # its Rust decoder refuses them: no `fs` variant, `type` required).
    assert [peek_input_type(blob) for blob in blobs] == ["fs", None, None]
    for blob in blobs:
        with pytest.raises(UndecodableJobConfig):
            decode_clp_io_config(blob)
    with open_runtime(config, lease_secs=5) as rt:
        foreign = [rt.store.create_job(blob) for blob in blobs]

        before = raw_rows(rt.engine, foreign)
        good = submit_job(config, rt.engine, dataset=DATASET, timestamp_key="timestamp")
        run_until_idle(rt.coordinator)
        for _ in range(5):
            rt.coordinator.tick()

        assert job_row(rt, good).status == JobStatus.SUCCEEDED  # the loop did run
        assert raw_rows(rt.engine, foreign) == before
        for row in before:
            assert row["status"] == 0 and row["dispatch_time"] is None
            assert row["lease_owner"] is None and row["lease_epoch"] == 0
        for job in foreign:
            assert triggers(rt, job) == []


# --- 4. Spider no longer knows the job ------------------------------------------------------------


def test_jobs_spider_no_longer_knows_end_by_what_the_row_says(
    config: CoordinatorConfig, tmp_path: Path
) -> None:
    put_logs(config, tmp_path, ["svc0"])
    with open_runtime(config, lease_secs=5) as rt:
        running = submit_job(config, rt.engine, dataset=DATASET, timestamp_key="timestamp")
        committed = submit_job(config, rt.engine, dataset=DATASET, timestamp_key="timestamp")
        embedded(rt).inject(Fault("hard_timeout", task=0, job_id=1))
        embedded(rt).inject(Fault("hard_timeout", task="commit", after_effects=True, job_id=2))
        tick_until(
            rt.coordinator,
            lambda: (
                (job_state(job_row(rt, running)), job_state(job_row(rt, committed)))
                == (JobStatus.RUNNING, JobStatus.COMMITTED)
            ),
        )
        assert (_spider_id(rt, running), _spider_id(rt, committed)) == (1, 2)
    # Spider's storage is reset while everything is down.
    engine = create_database_engine(database_url(config))
    try:
        assert reset_spider_storage(engine) == 2
    finally:
        engine.dispose()

    with open_runtime(config, lease_secs=5) as rt:
        run_until_idle(rt.coordinator)

        row = job_row(rt, running)
        assert row.status == JobStatus.FAILED
        assert row.status_msg == (
            "Spider no longer knows job 1 (its storage may have been reset); nothing was published"
        )
        assert triggers(rt, running) == ["submitted", "failed"]

        row = job_row(rt, committed)
        assert (row.status, row.status_msg) == (JobStatus.SUCCEEDED, "")
        history = rt.store.history(committed)
        assert [m.trigger for m in history] == ["submitted", "committed", "finalised"]
        assert history[-1].reason == "Spider no longer knows job 2; the published commit stands."
        rows = published(rt.engine, DATASET, 2)  # the publication stands
        assert len(rows) == 1 and rows[0].size == row.compressed_size
        assert [r.archive_id for r in records(rt.engine, 2)] == [rows[0].id]
        assert archive_files(config, DATASET) == {rows[0].id}
        assert published(rt.engine, DATASET, 1) == []


# --- 5. terminal rows are final -------------------------------------------------------------------


def test_a_succeeded_job_is_never_overwritten(config: CoordinatorConfig, tmp_path: Path) -> None:
    put_logs(config, tmp_path, ["svc0"])
    with open_runtime(config, lease_secs=5) as rt:
        job_id = submit_job(config, rt.engine, dataset=DATASET, timestamp_key="timestamp")
        embedded(rt).inject(Fault("hard_timeout", task=0))
        tick_until(rt.coordinator, _is_running(rt, job_id))
        # CLP's own commit task (still deployed) writes SUCCEEDED directly.
        assert set_status_behind_the_coordinator(rt.engine, 1, 2, "") == 1
        before = job_row(rt, job_id)
        # Then the Spider job is cancelled: the coordinator must not turn Succeeded into Killed.
        assert request_cancel(rt.engine, job_id, rt.store.clock())
        spider_id = _spider_id(rt, job_id)
        tick_until(rt.coordinator, lambda: not rt.coordinator.driven, timeout=20)
        for _ in range(3):
            rt.coordinator.tick()

        assert rt.spider.get_job_state(spider_id) is JobState.CANCELLED
        row = job_row(rt, job_id)
        assert (row.status, row.status_msg) == (JobStatus.SUCCEEDED, "")
        assert row.update_time == before.update_time
        assert triggers(rt, job_id) == ["submitted"]


def test_a_kill_by_clps_legacy_scheduler_stays(config: CoordinatorConfig, tmp_path: Path) -> None:
    legacy_message = "Job was killed by the compression scheduler's restart."
    put_logs(config, tmp_path, ["svc0"])
    with open_runtime(config, lease_secs=5) as rt:
        job_id = submit_job(config, rt.engine, dataset=DATASET, timestamp_key="timestamp")
        tick_until(rt.coordinator, _is_running(rt, job_id))
        # kill_hanging_jobs at the legacy scheduler's start-up, while the tasks run.
        assert set_status_behind_the_coordinator(rt.engine, 1, 4, legacy_message) == 1
        run_until_idle(rt.coordinator)

        row = job_row(rt, job_id)
        assert (row.status, row.status_msg) == (JobStatus.KILLED, legacy_message)
        assert triggers(rt, job_id) == ["submitted"]
        spider_id = _spider_id(rt, job_id)
        # The commit refused to publish for a job that is no longer running.
        assert rt.spider.get_job_state(spider_id) is JobState.FAILED
        assert "no running CLP compression job records Spider job" in rt.spider.get_job_error(
            spider_id
        )
        assert published(rt.engine, DATASET, spider_id) == []
        # Another writer finished the job: what its tasks stored is removed all the same.
        assert archive_files(config, DATASET) == set()
        assert records(rt.engine, spider_id) == []


# --- 6. max_concurrent_jobs -----------------------------------------------------------------------


def test_max_concurrent_jobs_bounds_every_driven_job(
    config: CoordinatorConfig, tmp_path: Path
) -> None:
    put_logs(config, tmp_path, ["svc0"])
    with open_runtime(config, lease_secs=5) as rt:
        jobs = [
            submit_job(config, rt.engine, dataset=DATASET, timestamp_key="timestamp")
            for _ in range(5)
        ]
        coordinator = coordinator_with(rt, settings=CompressionCoordinator(max_concurrent_jobs=2))
        peak = {"driven": 0, "leases": 0, "spider": 0}

        def within_limit() -> None:
            seen = {
                "driven": len(coordinator.driven),
                "leases": live_leases(rt.engine),
                "spider": unfinished_spider_jobs(rt.engine),
            }
            assert max(seen.values()) <= 2, seen
            for key, value in seen.items():
                peak[key] = max(peak[key], value)

        run_until_idle(coordinator, after_tick=within_limit, timeout=60)

        assert peak == {"driven": 2, "leases": 2, "spider": 2}
        assert [job_row(rt, job).status for job in jobs] == [JobStatus.SUCCEEDED] * 5
        for job in jobs:
            assert triggers(rt, job) == ["submitted", "committed", "finalised"]


def test_a_place_is_refilled_in_the_tick_that_concludes_its_job(
    config: CoordinatorConfig, tmp_path: Path
) -> None:
    """The place a job frees goes to a waiting Pending job in the same tick (claimed, submitted,
    started), not a polling interval later in the next tick's claim."""
    put_logs(config, tmp_path, ["svc0"])
    with open_runtime(config, lease_secs=5) as rt:
        first, second = [
            submit_job(config, rt.engine, dataset=DATASET, timestamp_key="timestamp")
            for _ in range(2)
        ]
        coordinator = coordinator_with(rt, settings=CompressionCoordinator(max_concurrent_jobs=1))
        try:
            assert coordinator.tick().claimed == 1
            assert job_row(rt, second).status == JobStatus.PENDING
            spider_id = coordinator.driven[first].spider_id
            assert spider_id is not None
            wait_for(rt.spider, spider_id, JobState.SUCCEEDED)
            for job in coordinator.driven.values():
                job.next_poll = 0.0  # due now, whatever its back-off
            report = coordinator.tick()
        finally:
            coordinator.shut_down_pool()
        assert report.concluded == [first] and report.claimed == 1
        assert job_row(rt, first).status == JobStatus.SUCCEEDED
        assert job_row(rt, second).status == JobStatus.RUNNING
        assert list(coordinator.driven) == [second]


def test_run_until_idle_leaves_no_claimable_job(config: CoordinatorConfig, tmp_path: Path) -> None:
    put_logs(config, tmp_path, ["svc0"])
    with open_runtime(config, lease_secs=5) as rt:
        jobs = [
            submit_job(config, rt.engine, dataset=DATASET, timestamp_key="timestamp")
            for _ in range(2)
        ]
        coordinator = coordinator_with(rt, settings=CompressionCoordinator(max_concurrent_jobs=1))
        guard = threading.Timer(30, coordinator.stopping.set)  # never hang the suite
        guard.start()
        try:
            coordinator.run(until_idle=True)
        finally:
            guard.cancel()
        assert not coordinator.stopping.is_set(), "run(until_idle=True) did not finish in 30 s"
        assert [job_row(rt, job).status for job in jobs] == [JobStatus.SUCCEEDED] * 2


# --- 7. a Spider outage ---------------------------------------------------------------------------


class FlakySpider(SpiderProxy):
    """Spider unreachable for the first calls of ``register_job`` and ``get_job_state``."""

    def __init__(self, inner: SpiderPort, *, registrations: int, states: int) -> None:
        super().__init__(inner)
        self.failing = {"register_job": registrations, "get_job_state": states}
        self.starts = 0

    def _outage(self, call: str) -> None:
        if self.failing[call] > 0:
            self.failing[call] -= 1
            raise Unavailable(f"{call}: transport error: connection refused")

    def register_job(
        self, resource_group_id: int, compressed_task_graph: bytes, compressed_inputs: bytes
    ) -> int:
        self._outage("register_job")
        return super().register_job(resource_group_id, compressed_task_graph, compressed_inputs)

    def get_job_state(self, job_id: int) -> JobState:
        self._outage("get_job_state")
        return super().get_job_state(job_id)

    def start_job(self, job_id: int) -> JobState:
        self.starts += 1
        return super().start_job(job_id)


def test_a_spider_outage_pauses_the_job_without_losing_it(
    config: CoordinatorConfig, tmp_path: Path
) -> None:
    put_logs(config, tmp_path, ["svc0"])
    with open_runtime(config, lease_secs=5) as rt:
        job_id = submit_job(config, rt.engine, dataset=DATASET, timestamp_key="timestamp")
        spider = FlakySpider(rt.spider, registrations=2, states=3)
        coordinator = coordinator_with(rt, spider=spider)
        seen: list[tuple[int, int, int]] = []

        def while_unavailable() -> None:
            row = job_row(rt, job_id)
            if spider.failing["register_job"] or spider.failing["get_job_state"]:
                seen.append((row.status, spider.failing["register_job"], len(triggers(rt, job_id))))
                assert row.status in (JobStatus.PENDING, JobStatus.RUNNING)
                assert (row.spider_id is None) == (row.status == JobStatus.PENDING)

        run_until_idle(coordinator, after_tick=while_unavailable, timeout=30)

        assert spider.failing == {"register_job": 0, "get_job_state": 0}
        assert (JobStatus.PENDING, 1, 0) in seen and (JobStatus.RUNNING, 0, 1) in seen
        assert spider.starts == 1
        row = job_row(rt, job_id)
        assert (row.status, row.status_msg) == (JobStatus.SUCCEEDED, "")
        assert triggers(rt, job_id) == ["submitted", "committed", "finalised"]
        assert engine_jobs(rt.engine) == 1
        assert len(published(rt.engine, DATASET, _spider_id(rt, job_id))) == 1


def test_a_cancel_request_kills_a_pending_job_the_coordinator_holds(
    config: CoordinatorConfig, tmp_path: Path
) -> None:
    put_logs(config, tmp_path, ["svc0"])
    with open_runtime(config, lease_secs=5) as rt:
        job_id = submit_job(config, rt.engine, dataset=DATASET, timestamp_key="timestamp")
        spider = FlakySpider(rt.spider, registrations=1, states=0)
        coordinator = coordinator_with(rt, spider=spider)
        coordinator.tick()  # claimed; RegisterJob fails, so the job stays Pending and held
        assert job_row(rt, job_id).status == JobStatus.PENDING
        assert list(coordinator.driven) == [job_id]
        assert request_cancel(rt.engine, job_id, rt.store.clock())
        coordinator.tick()

        row = job_row(rt, job_id)
        assert (row.status, row.status_msg) == (
            JobStatus.KILLED,
            "Cancelled by an operator before submission.",
        )
        assert triggers(rt, job_id) == ["cancelled"] and row.spider_id is None
        assert not coordinator.driven
        assert engine_jobs(rt.engine) == 0


def test_a_cancel_requested_before_the_claim_is_honoured_before_submission(
    config: CoordinatorConfig, tmp_path: Path
) -> None:
    put_logs(config, tmp_path, ["svc0"])
    with open_runtime(config, lease_secs=5) as rt:
        job_id = submit_job(config, rt.engine, dataset=DATASET, timestamp_key="timestamp")
        assert request_cancel(rt.engine, job_id, rt.store.clock())
        rt.coordinator.tick()  # the claim
        spider_id = job_row(rt, job_id).spider_id
        if spider_id is not None:  # submitted anyway: a slow next tick lets it finish
            wait_for(rt.spider, spider_id, JobState.SUCCEEDED, JobState.FAILED, timeout=20)
        run_until_idle(rt.coordinator, timeout=20)

        row = job_row(rt, job_id)
        assert (row.status, row.status_msg, row.spider_id) == (
            JobStatus.KILLED,
            "Cancelled by an operator before submission.",
            None,
        )
        assert triggers(rt, job_id) == ["cancelled"]


class AmbiguousSpider(SpiderProxy):
    """The first RegisterJob reaches Spider, but its answer is lost (UNAVAILABLE)."""

    def __init__(self, inner: SpiderPort) -> None:
        super().__init__(inner)
        self.lost: list[int] = []

    def register_job(
        self, resource_group_id: int, compressed_task_graph: bytes, compressed_inputs: bytes
    ) -> int:
        spider_id = super().register_job(
            resource_group_id, compressed_task_graph, compressed_inputs
        )
        if not self.lost:
            self.lost.append(spider_id)
            raise Unavailable("register_job: transport error: connection reset")
        return spider_id


def test_an_ambiguous_registration_failure_runs_the_job_once(
    config: CoordinatorConfig, tmp_path: Path
) -> None:
    put_logs(config, tmp_path, ["svc0"])
    with open_runtime(config, lease_secs=5) as rt:
        job_id = submit_job(config, rt.engine, dataset=DATASET, timestamp_key="timestamp")
        spider = AmbiguousSpider(rt.spider)
        coordinator = coordinator_with(rt, spider=spider)
        run_until_idle(coordinator, timeout=30)

        row = job_row(rt, job_id)
        assert (row.status, row.status_msg) == (JobStatus.SUCCEEDED, "")
        assert triggers(rt, job_id) == ["submitted", "committed", "finalised"]
        [orphan] = spider.lost
        assert row.spider_id != orphan
        # The registration whose answer was lost is never started: nothing runs untracked.
        assert rt.spider.get_job_state(orphan) is JobState.READY
        assert records(rt.engine, orphan) == [] and published(rt.engine, DATASET, orphan) == []
        assert len(published(rt.engine, DATASET, _spider_id(rt, job_id))) == 1
