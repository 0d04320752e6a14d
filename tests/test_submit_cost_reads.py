"""What a submission no longer reads or builds again (issue 14): the letter-case check of a
dataset seen registered under its name, a small job config's decoding, the guarded move's
statement. Each saving keeps its check: an unregistered dataset is checked at every submission, a
move still compares the row it names with that job's own values."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

from coordinator.config.clp import CompressionCoordinator
from coordinator.config.loader import CoordinatorConfig
from coordinator.job_config import (
    DECODED_CACHE_BLOB_BYTES,
    ClpIoConfig,
    OutputConfig,
    S3ObjectMetadataInputConfig,
    UndecodableJobConfig,
    decode_clp_io_config,
    encode_clp_io_config,
)
from coordinator.lifecycle import Actor, JobStatus, Trigger, plan_transition
from coordinator.runtime import open_runtime
from coordinator.service.ingest import list_objects
from coordinator.service.prepare import JobRejected, prepare
from coordinator.spider import task_graph
from coordinator.spider.task_graph import TaskGraph, decode_task_graph
from coordinator.store import guarded
from coordinator.store.datasets import register_dataset
from coordinator.store.guarded import Applied, LostRace, TransitionRequest
from coordinator.store.ingestion import S3ScannerJob, ingest_and_submit
from coordinator.store.jobs import JobStore
from coordinator.task_io import DefaultAuthentication
from tests.service_support import BUCKET as SERVICE_BUCKET
from tests.service_support import PREFIX as SERVICE_PREFIX
from tests.service_support import compress_blob, put_logs, valid_named_config
from tests.sql_capture import one_line, statements_sent

BUCKET = "logs"
PREFIX = "in/"


def _blob(ingestion_job_id: int, ids: list[int], dataset: str, bucket: str = BUCKET) -> bytes:
    return encode_clp_io_config(
        ClpIoConfig(
            input=S3ObjectMetadataInputConfig(
                bucket=bucket,
                key_prefix=PREFIX,
                aws_authentication=DefaultAuthentication(),
                ingestion_job_id=ingestion_job_id,
                s3_object_metadata_ids=ids,
                dataset=dataset,
                unstructured=False,
            ),
            output=OutputConfig(
                target_archive_size=256 * 1024 * 1024,
                target_dictionaries_size=32 * 1024 * 1024,
                target_encoded_file_size=256 * 1024 * 1024,
                target_segment_size=256 * 1024 * 1024,
                compression_level=3,
            ),
        )
    )


def _job_blob(engine: Engine, dataset: str) -> bytes:
    """A job config naming one ingested object, as log-ingestor leaves it."""
    written = ingest_and_submit(
        engine,
        S3ScannerJob(bucket=BUCKET, key_prefix=PREFIX, dataset=dataset),
        [(BUCKET, f"{PREFIX}a.jsonl", 100)],
        lambda ingestion_job, ids: _blob(ingestion_job, ids, dataset),
    )
    return _blob(written.ingestion_job_id, written.object_ids, dataset)


def _letter_case_reads(statements: list[str]) -> list[str]:
    """The statements that read ``clp_datasets`` by ``lower(name)``."""
    return [s for s in statements if "lower(" in s.lower() and "clp_datasets" in s]


def test_a_dataset_seen_registered_under_its_name_is_not_checked_again(
    migrated_engine: Engine,
) -> None:
    with migrated_engine.begin() as connection:
        register_dataset(connection, "web", "/archives/web")
    remembered: set[str] = set()
    blob = _job_blob(migrated_engine, "web")
    settings = CompressionCoordinator()
    with statements_sent(migrated_engine) as sent:
        prepare(migrated_engine, blob, settings, registered_as_named=remembered)
    assert len(_letter_case_reads(sent)) == 1
    assert remembered == {"web"}
    with statements_sent(migrated_engine) as sent:
        prepared = prepare(migrated_engine, blob, settings, registered_as_named=remembered)
    assert _letter_case_reads(sent) == []
    assert prepared.dataset == "web"


def test_an_unregistered_dataset_is_checked_at_every_submission(migrated_engine: Engine) -> None:
    remembered: set[str] = set()
    settings = CompressionCoordinator()
    blob = _job_blob(migrated_engine, "web")
    prepare(migrated_engine, blob, settings, registered_as_named=remembered)
    assert remembered == set()  # no row yet: nothing is known about other cases
    with migrated_engine.begin() as connection:  # CLP registers another case meanwhile
        connection.execute(text("INSERT INTO clp_datasets VALUES ('Web', '/archives/Web')"))
    with pytest.raises(JobRejected, match="registered dataset 'Web' differs only in letter case"):
        prepare(migrated_engine, blob, settings, registered_as_named=remembered)
    assert remembered == set()


def test_a_prepared_graph_and_its_inputs_are_compressed_once(
    migrated_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The submitter weighs a job's payloads when it prepares it (Spider's message limit), then
    registers them: both read the same bytes, made once (issue 14)."""
    made: list[str] = []
    graph_compressed, encode_inputs = TaskGraph.compressed, task_graph._encode_job_inputs

    def counted_graph(graph: TaskGraph) -> bytes:
        made.append("graph")
        return graph_compressed(graph)

    def counted_inputs(inputs: Any) -> bytes:
        made.append("inputs")
        return encode_inputs(inputs)

    monkeypatch.setattr(TaskGraph, "compressed", counted_graph)
    monkeypatch.setattr(task_graph, "_encode_job_inputs", counted_inputs)
    blob = _job_blob(migrated_engine, "web")
    submission = prepare(migrated_engine, blob, CompressionCoordinator()).submission
    payloads = (submission.compressed_task_graph(), submission.compressed_inputs())
    assert payloads == (submission.compressed_task_graph(), submission.compressed_inputs())
    assert sorted(made) == ["graph", "inputs"]
    assert decode_task_graph(payloads[0]) == submission.task_graph


def test_a_small_config_is_decoded_once_and_a_large_one_every_time() -> None:
    small = _blob(7, [1, 2, 3], "web")
    assert len(small) <= DECODED_CACHE_BLOB_BYTES
    assert decode_clp_io_config(small) is decode_clp_io_config(bytes(bytearray(small)))
    large = _blob(7, random.Random(0).sample(range(2**40), 1000), "web")  # ids zstd cannot shrink
    assert len(large) > DECODED_CACHE_BLOB_BYTES
    first, second = decode_clp_io_config(large), decode_clp_io_config(large)
    assert first == second and first is not second


def test_an_undecodable_config_fails_at_every_decoding() -> None:
    for _ in range(2):
        with pytest.raises(UndecodableJobConfig):
            decode_clp_io_config(b"not a zstd frame")


def _submitted(job_id: int, spider_id: int, fence: int) -> TransitionRequest:
    return TransitionRequest(
        job_id,
        Trigger.SUBMITTED,
        JobStatus.PENDING,
        JobStatus.RUNNING,
        Actor.COORDINATOR,
        reason="test",
        spider_id=spider_id,
        num_tasks=1,
        fence=fence,
        unless_cancel_requested=True,
    )


def test_moves_of_two_jobs_share_one_statement_and_each_keeps_its_own_values(
    store: JobStore,
) -> None:
    edge = plan_transition(
        Trigger.SUBMITTED, JobStatus.PENDING, JobStatus.RUNNING, Actor.COORDINATOR
    )
    assert guarded._guarded_update(edge, True, True) is guarded._guarded_update(edge, True, True)
    first, second, third = (store.create_job(b"x") for _ in range(3))
    assert isinstance(store.transition(_submitted(first, 71, fence=0)), Applied)
    assert isinstance(store.transition(_submitted(second, 72, fence=0)), Applied)
    lost = store.transition(_submitted(third, 73, fence=5))  # the row's epoch is 0
    assert isinstance(lost, LostRace) and lost.lease_epoch == 0
    rows = {job_id: store.get(job_id) for job_id in (first, second, third)}
    assert {job_id: (row.status, row.spider_id) for job_id, row in rows.items() if row} == {
        first: (int(JobStatus.RUNNING), 71),
        second: (int(JobStatus.RUNNING), 72),
        third: (int(JobStatus.PENDING), None),
    }
    assert [(h.job_id, h.spider_id) for h in store.history(second)] == [(second, 72)]


def _ingested(config: CoordinatorConfig, engine: Engine, dataset: str) -> bytes:
    """The ``clp_config`` of a job over every object in ``config``'s local store, as
    log-ingestor writes it, in an ingestion job of its own, writing to ``dataset``."""
    blobs: list[bytes] = []

    def blob(ingestion_job_id: int, ids: list[int]) -> bytes:
        named = valid_named_config(config, ingestion_job_id, ids)
        blobs.append(compress_blob({**named, "input": {**named["input"], "dataset": dataset}}))
        return blobs[-1]

    objects = list_objects(config, bucket=SERVICE_BUCKET, prefix=SERVICE_PREFIX)
    ingest_and_submit(engine, S3ScannerJob(SERVICE_BUCKET, SERVICE_PREFIX), objects, blob)
    return blobs[0]


def test_a_batch_of_jobs_reads_its_objects_and_datasets_once(
    config: CoordinatorConfig, tmp_path: Path
) -> None:
    """Before: each job of a tick opened a read of its own (a transaction, and on SQLite the write
    lock) for its objects and its dataset's letter case. Now the batch is read together: the
    objects of every ingestion job in one fetch (log-ingestor makes an ingestion job per
    compression job, so one fetch per ingestion job was one per job), each dataset's letter case
    once."""
    put_logs(config, tmp_path, ["svc0", "svc1"])
    with open_runtime(config, lease_secs=5) as rt:
        web, logs = _ingested(config, rt.engine, "web"), _ingested(config, rt.engine, "logs")
        job_ids = [rt.store.create_job(blob) for blob in [web] * 4 + [logs] * 3]
        with statements_sent(rt.engine) as sent:
            rt.coordinator.tick()
        assert rt.store.states(job_ids) == {job_id: JobStatus.RUNNING for job_id in job_ids}
    fetches = [s for s in sent if "from ingested_s3_object_metadata" in one_line(s)]
    assert len(fetches) == 1  # both ingestion jobs' objects, each job's among them
    assert len(_letter_case_reads(sent)) == 2  # one per dataset, neither registered yet


def test_when_the_batch_read_fails_each_job_reads_alone(
    config: CoordinatorConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch read that fails for a reason that is not an outage (a bug, a row no job can read)
    costs no job an attempt: each job then reads on its own, as before the batch read."""
    put_logs(config, tmp_path, ["svc0"])

    def broken(*_: object) -> object:
        raise RuntimeError("a bug in the batch read")

    monkeypatch.setattr("coordinator.service.submitter.read_requests", broken)
    with open_runtime(config, lease_secs=5) as rt:
        blob = _ingested(config, rt.engine, "web")
        job_ids = [rt.store.create_job(blob) for _ in range(3)]
        with statements_sent(rt.engine) as sent:
            rt.coordinator.tick()
        assert rt.store.states(job_ids) == {job_id: JobStatus.RUNNING for job_id in job_ids}
        assert all(job.failed_attempts == 0 for job in rt.coordinator.driven.values())
    fetches = [s for s in sent if "from ingested_s3_object_metadata" in one_line(s)]
    assert len(fetches) == 4  # one read each: these three and the job log-ingestor submitted
