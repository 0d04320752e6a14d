"""CLP's task graph on the embedded engine: real clp-s, real commit, on SQLite and MariaDB.

The job is driven by hand here (register, record ``submitted``, start, wait); the service loop that
does this for every job comes with the coordinator service.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Engine, select
from yscope_clp_core import KqlQuery, search_archive

from coordinator.archive_storage import FsArchiveOutput
from coordinator.config.locations import local_store_endpoint
from coordinator.engine.embedded.engine import EmbeddedSpider
from coordinator.engine.embedded.faults import Fault
from coordinator.engine.embedded.protocol import in_task_failure
from coordinator.engine.tasks.context import WorkerSettings
from coordinator.lifecycle import Actor, JobStatus
from coordinator.spider.policy import commit_task_policy
from coordinator.spider.port import JobState, start_if_ready
from coordinator.spider.task_graph import build_compression_job
from coordinator.store.datasets import archives_table
from coordinator.store.guarded import Applied, TransitionRequest
from coordinator.store.jobs import JobStore, job_state
from coordinator.store.stored_archives import STORED, StoredArchiveRecord, stored_archives
from coordinator.task_io import ClpSCompressionOption, DefaultAuthentication, S3InputSource
from tests.engine_support import wait_for
from tests.sample_logs import write_json_logs
from tests.timing import wait_until

pytestmark = pytest.mark.slow  # real clp-s on the engine

BUCKET = "ingest"
EVENTS_PER_FILE = 400


def _engine(migrated_engine: Engine, data: Path) -> EmbeddedSpider:
    settings = WorkerSettings(
        database_url=migrated_engine.url.render_as_string(hide_password=False),
        archive_output=FsArchiveOutput(directory=data / "archives"),
        staging_directory=data / "staging",
        object_store_directory=data / "objects",
    )
    return EmbeddedSpider(migrated_engine, settings, workers=2)


def _submit_clp_job(
    store: JobStore, spider: EmbeddedSpider, data: Path, dataset: str
) -> tuple[int, int]:
    keys = []
    for index in range(3):
        key = f"logs/app-{index}.jsonl"
        write_json_logs(data / "objects" / BUCKET / key, EVENTS_PER_FILE, service=f"svc{index}")
        keys.append(key)
    partitions = [keys[:2], keys[2:]]
    sources = [
        S3InputSource(
            endpoint_url=local_store_endpoint(data / "objects"),
            bucket=BUCKET,
            aws_authentication=DefaultAuthentication(),
            object_keys=part,
        )
        for part in partitions
    ]
    option = ClpSCompressionOption(
        target_encoded_size=256 * 1024 * 1024,
        compression_level=3,
        timestamp_key="timestamp",
        unstructured=False,
    )
    submission = build_compression_job(
        sources,
        option,
        dataset,
        compression_task_max_retry=1,
        commit_policy=commit_task_policy(1, 45, 60),
    )
    job_id = store.create_job(b"clp-config")
    group = spider.add_resource_group("compression-coordinator", b"compression-coordinator")
    spider_job = spider.register_job(
        group, submission.compressed_task_graph(), submission.compressed_inputs()
    )
    submitted = store.transition(
        TransitionRequest(
            job_id,
            "submitted",
            JobStatus.PENDING,
            JobStatus.RUNNING,
            Actor.COORDINATOR,
            spider_id=spider_job,
            num_tasks=len(sources),
        )
    )
    assert isinstance(submitted, Applied)
    assert start_if_ready(spider, spider_job) is JobState.RUNNING
    return job_id, spider_job


def test_a_clp_job_compresses_and_commits(migrated_engine: Engine, tmp_path: Path) -> None:
    store = JobStore(migrated_engine)
    with _engine(migrated_engine, tmp_path) as spider:
        job_id, spider_job = _submit_clp_job(store, spider, tmp_path, "web")
        assert (
            wait_for(spider, spider_job, JobState.SUCCEEDED, JobState.FAILED) is JobState.SUCCEEDED
        )

    job = store.get(job_id)
    assert job is not None
    assert job_state(job) == JobStatus.COMMITTED  # the coordinator finalises it, once Spider agrees
    assert job.uncompressed_size > job.compressed_size > 0
    table = archives_table("web")
    with migrated_engine.connect() as connection:
        published = connection.execute(
            select(table.c.id, table.c.creator_id, table.c.size).order_by(table.c.creation_ix)
        ).all()
        records = stored_archives(connection, spider_job)
    assert len(published) == 2  # one archive per partition
    assert {row.creator_id for row in published} == {str(spider_job)}
    assert sum(row.size for row in published) == job.compressed_size
    assert sorted(r.archive_id for r in records) == sorted(row.id for row in published)

    hits = []
    for record in records:
        path = Path(record.location)
        assert path == tmp_path / "archives" / "web" / record.archive_id and path.is_file()
        with search_archive(path, KqlQuery('request_id: "svc2-000123"')) as results:
            hits += [event.get_kv_pairs() for event in results]
    assert len(hits) == 1 and hits[0]["service"] == "svc2"


def test_a_failing_compress_task_fails_the_job_and_publishes_nothing(
    migrated_engine: Engine, tmp_path: Path
) -> None:
    store = JobStore(migrated_engine)
    with _engine(migrated_engine, tmp_path) as spider:
        spider.inject(Fault("fail", task=1, times=2, message="object store unreachable"))
        job_id, spider_job = _submit_clp_job(store, spider, tmp_path, "web")
        assert wait_for(spider, spider_job, JobState.SUCCEEDED, JobState.FAILED) is JobState.FAILED
        assert spider.get_job_error(spider_job) == in_task_failure("object store unreachable")

        def stored_by_task_0() -> list[StoredArchiveRecord]:
            with migrated_engine.connect() as connection:
                records = stored_archives(connection, spider_job)
            return [r for r in records if r.task_id == "0" and r.state == STORED]

        # Task 0 (the other partition) runs on after the job failed: its archive is stored and
        # stays recorded.
        wait_until(stored_by_task_0, what="task 0's archive stored")
    job = store.get(job_id)
    assert job is not None and job.status == JobStatus.RUNNING  # the coordinator decides next
    with migrated_engine.connect() as connection:
        records = stored_archives(connection, spider_job)
    assert [r.task_id for r in records] == ["0"]
    for record in records:  # what a clean-up must remove is known
        assert Path(record.location).is_file()
