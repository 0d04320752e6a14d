"""Driving the coordinator service in-process: configurations, jobs, Spider wrappers, reads."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any, NamedTuple

import zstandard
from sqlalchemy import Engine, delete, func, inspect, select, update

from coordinator.config.clp import CompressionCoordinator
from coordinator.config.loader import CoordinatorConfig
from coordinator.config.locations import local_store_endpoint
from coordinator.engine.embedded.engine import STATE_NAMES, EmbeddedSpider
from coordinator.engine.grpc_server import serve
from coordinator.job_config import (
    ClpIoConfig,
    S3ObjectMetadataInputConfig,
)
from coordinator.lifecycle import JobStatus
from coordinator.runtime import Runtime, archive_output_of, open_runtime
from coordinator.serde import pack
from coordinator.service.coordinator import Coordinator
from coordinator.service.ingest import list_objects, output_config_of, put_files
from coordinator.service.resource_group import lookup_by_name
from coordinator.spider.grpc.client import GrpcSpider
from coordinator.spider.port import JobState, SpiderPort
from coordinator.store.clock import utc_now
from coordinator.store.datasets import archives_table
from coordinator.store.ingestion import S3ScannerJob, ingest_and_submit
from coordinator.store.jobs import JobRow
from coordinator.store.schema import compression_jobs as _jobs
from coordinator.store.schema import engine_jobs as _engine_jobs
from coordinator.store.stored_archives import StoredArchiveRecord, stored_archives
from coordinator.task_io import DefaultAuthentication
from tests.sample_logs import write_json_logs

BUCKET = "logs"
PREFIX = "ingest/"
EVENTS_PER_FILE = 2000

_SPIDER_TERMINAL = [name for state, name in STATE_NAMES.items() if state.is_terminal]


# --- configuration and input ------------------------------------------------------------------


def with_target_archive_size(config: CoordinatorConfig, size: int) -> CoordinatorConfig:
    """``config`` whose jobs ask for archives of ``size`` bytes (1: one partition per object)."""
    output = config.clp.archive_output.model_copy(update={"target_archive_size": size})
    return dataclasses.replace(config, clp=config.clp.model_copy(update={"archive_output": output}))


def put_logs(config: CoordinatorConfig, scratch: Path, services: Sequence[str]) -> list[str]:
    """One small JSON-lines file per service under ``logs/ingest/``; the object keys."""
    paths = []
    for service in services:
        path = scratch / "input" / f"{service}.jsonl"
        write_json_logs(path, EVENTS_PER_FILE, service=service)
        paths.append(path)
    return put_files(config, paths, bucket=BUCKET, prefix=PREFIX)


def valid_named_config(
    config: CoordinatorConfig, ingestion_job_id: int, ids: Sequence[int]
) -> dict[str, Any]:
    """The named form of the ``clp_config`` log-ingestor writes for ``ids`` (as ``submit_job``),
    for objects in the local object store of ``config`` (which the job names as its endpoint)."""
    output = config.clp.archive_output
    return ClpIoConfig(
        input=S3ObjectMetadataInputConfig(
            bucket=BUCKET,
            key_prefix=PREFIX,
            endpoint_url=local_store_endpoint(config.object_store_directory),
            aws_authentication=DefaultAuthentication(),
            ingestion_job_id=ingestion_job_id,
            s3_object_metadata_ids=list(ids),
            dataset="default",
            timestamp_key="timestamp",
            unstructured=False,
        ),
        output=output_config_of(output),
    ).to_named()


def compress_blob(named: dict[str, Any]) -> bytes:
    """A ``clp_config`` blob (zstd over named msgpack) of any map, valid or not."""
    return zstandard.ZstdCompressor(level=3).compress(pack(named))


def submit_edited_job(
    config: CoordinatorConfig, engine: Engine, edit: Callable[[dict[str, Any], list[int]], None]
) -> tuple[int, int, list[int]]:
    """Register the objects under the prefix and insert a job whose named config ``edit`` changed.

    ``edit(config, ids)`` changes the named config in place. Returns the job id, the ingestion job
    id and the registered object ids.
    """
    scanner = S3ScannerJob(
        bucket=BUCKET,
        key_prefix=PREFIX,
        endpoint_url=local_store_endpoint(config.object_store_directory),
        dataset="default",
    )

    def edited(ingestion_job: int, ids: list[int]) -> bytes:
        named = valid_named_config(config, ingestion_job, ids)
        edit(named, ids)
        return compress_blob(named)

    objects = list_objects(config, bucket=BUCKET, prefix=PREFIX)
    written = ingest_and_submit(engine, scanner, objects, edited)
    return written.compression_job_id, written.ingestion_job_id, written.object_ids


# --- running the loop ---------------------------------------------------------------------------


def tick_until(
    coordinator: Coordinator,
    done: Callable[[], bool],
    *,
    timeout: float = 30.0,
    after_tick: Callable[[], None] | None = None,
) -> None:
    """Tick until ``done()`` holds; fails the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        coordinator.tick()
        if after_tick is not None:
            after_tick()
        if done():
            return
        assert time.monotonic() < deadline, f"not done after {timeout} s"
        time.sleep(0.02)


def run_until_idle(
    coordinator: Coordinator,
    *,
    timeout: float = 30.0,
    after_tick: Callable[[], None] | None = None,
) -> None:
    """Tick until a tick that starts with nothing driven claims nothing either.

    (A tick claims before it concludes, so the tick that ends the last driven job cannot tell
    whether Pending jobs are left; ``Coordinator.run(until_idle=True)`` stops there, see
    ``test_run_until_idle_leaves_no_claimable_job``.)
    """
    deadline = time.monotonic() + timeout
    while True:
        started_idle = not coordinator.driven
        report = coordinator.tick()
        if after_tick is not None:
            after_tick()
        if started_idle and not coordinator.driven and report.claimed == 0:
            return
        assert time.monotonic() < deadline, f"still driving {list(coordinator.driven)}"
        time.sleep(0.02)


def coordinator_with(
    rt: Runtime,
    *,
    spider: SpiderPort | None = None,
    settings: CompressionCoordinator | None = None,
    instance_id: str = "test-coordinator",
    clock: Callable[[], float] = time.monotonic,
    cleanup_task: bool = True,
) -> Coordinator:
    """A coordinator over the runtime's database and archive output, as ``open_runtime`` builds."""
    return Coordinator(
        engine=rt.engine,
        spider=spider if spider is not None else rt.spider,
        settings=settings if settings is not None else rt.config.compression_coordinator,
        archive_output=archive_output_of(rt.config),
        instance_id=instance_id,
        lease_duration=timedelta(seconds=5),
        owns_undecodable_jobs=True,
        clock=clock,
        cleanup_task=cleanup_task,
    )


# --- Spider wrappers ----------------------------------------------------------------------------


class SpiderProxy:
    """A ``SpiderPort`` that passes every call to ``inner``; subclasses change some calls."""

    def __init__(self, inner: SpiderPort) -> None:
        self.inner = inner

    @property
    def resource_group_by_name(self) -> Callable[[str, bytes], int]:
        """The wrapped engine's lookup by name, when it has one (the embedded engine does)."""
        lookup = lookup_by_name(self.inner)
        if lookup is None:
            raise AttributeError("resource_group_by_name")
        return lookup

    def add_resource_group(self, external_id: str, password: bytes) -> int:
        return self.inner.add_resource_group(external_id, password)

    def verify_resource_group(self, resource_group_id: int, password: bytes) -> None:
        self.inner.verify_resource_group(resource_group_id, password)

    def register_job(
        self, resource_group_id: int, compressed_task_graph: bytes, compressed_inputs: bytes
    ) -> int:
        return self.inner.register_job(resource_group_id, compressed_task_graph, compressed_inputs)

    def start_job(self, job_id: int) -> JobState:
        return self.inner.start_job(job_id)

    def cancel_job(self, job_id: int) -> JobState:
        return self.inner.cancel_job(job_id)

    def get_job_state(self, job_id: int) -> JobState:
        return self.inner.get_job_state(job_id)

    def get_job_outputs(self, job_id: int) -> list[bytes]:
        return self.inner.get_job_outputs(job_id)

    def get_job_error(self, job_id: int) -> str:
        return self.inner.get_job_error(job_id)


# --- reading the outcome ------------------------------------------------------------------------


class CountingRegistrations(SpiderProxy):
    """Passes every call on (RegisterJob one job at a time, as for a Spider cluster), and keeps
    the ids of the Spider jobs registered."""

    def __init__(self, inner: SpiderPort) -> None:
        super().__init__(inner)
        self.registered: list[int] = []

    def register_job(
        self, resource_group_id: int, compressed_task_graph: bytes, compressed_inputs: bytes
    ) -> int:
        spider_id = super().register_job(
            resource_group_id, compressed_task_graph, compressed_inputs
        )
        self.registered.append(spider_id)
        return spider_id


def embedded(rt: Runtime) -> EmbeddedSpider:
    """The runtime's embedded engine (the embedded default always has one)."""
    assert rt.embedded is not None
    return rt.embedded


def engine_jobs(engine: Engine) -> int:
    """How many jobs were ever registered with the embedded engine."""
    with engine.connect() as connection:
        return int(connection.execute(select(func.count()).select_from(_engine_jobs)).scalar_one())


def reset_spider_storage(engine: Engine) -> int:
    """Forget every job of the embedded engine (run it while the engine is closed); how many."""
    with engine.begin() as connection:
        return int(connection.execute(delete(_engine_jobs)).rowcount)


def triggers(rt: Runtime, job_id: int) -> list[str]:
    """The job's applied moves, oldest first."""
    return [move.trigger for move in rt.store.history(job_id)]


def job_row(rt: Runtime, job_id: int) -> JobRow:
    """The job's row; fails when there is none."""
    row = rt.store.get(job_id)
    assert row is not None, f"job {job_id} does not exist"
    return row


def raw_rows(engine: Engine, job_ids: Sequence[int]) -> list[dict[str, Any]]:
    """Every column of the jobs' rows, by id."""
    with engine.connect() as connection:
        rows = connection.execute(
            select(_jobs).where(_jobs.c.id.in_(list(job_ids))).order_by(_jobs.c.id)
        ).mappings()
        return [dict(row) for row in rows]


class PublishedArchive(NamedTuple):
    """A row of ``clp_{dataset}_archives`` (the columns the tests check)."""

    id: str
    creator_id: str
    creation_ix: int
    size: int


def published(engine: Engine, dataset: str, spider_id: int) -> list[PublishedArchive]:
    """The archive rows the Spider job published in the dataset, by ``creation_ix``."""
    table = archives_table(dataset)
    with engine.connect() as connection:
        if not inspect(connection).has_table(table.name):
            return []
        rows = connection.execute(
            select(table.c.id, table.c.creator_id, table.c.creation_ix, table.c.size)
            .where(table.c.creator_id == str(spider_id))
            .order_by(table.c.creation_ix)
        )
        return [PublishedArchive(*row) for row in rows]


def records(engine: Engine, spider_id: int) -> list[StoredArchiveRecord]:
    """The stored-archive records of the Spider job."""
    with engine.connect() as connection:
        return stored_archives(connection, spider_id)


def archive_files(config: CoordinatorConfig, dataset: str) -> set[str]:
    """The names of the archive files in the dataset's directory."""
    directory = config.data_dir / "archives" / dataset
    return {path.name for path in directory.iterdir()} if directory.is_dir() else set()


def live_leases(engine: Engine) -> int:
    """Unfinished jobs whose lease is held now (an owner, not yet expired)."""
    unfinished = [int(JobStatus.PENDING), int(JobStatus.RUNNING), int(JobStatus.COMMITTED)]
    with engine.connect() as connection:
        return int(
            connection.execute(
                select(func.count())
                .select_from(_jobs)
                .where(
                    _jobs.c.status.in_(unfinished),
                    _jobs.c.lease_owner.is_not(None),
                    _jobs.c.lease_expires_at > utc_now(),
                )
            ).scalar_one()
        )


def unfinished_spider_jobs(engine: Engine) -> int:
    """Spider jobs of the embedded engine that are not terminal."""
    with engine.connect() as connection:
        return int(
            connection.execute(
                select(func.count())
                .select_from(_engine_jobs)
                .where(_engine_jobs.c.state.not_in(_SPIDER_TERMINAL))
            ).scalar_one()
        )


def set_status_behind_the_coordinator(engine: Engine, source: int, target: int, msg: str) -> int:
    """What another writer of ``compression_jobs`` does (CLP's legacy scheduler, its old commit):
    ``UPDATE … SET status = target WHERE status = source``; the number of rows it changed."""
    with engine.begin() as connection:
        return int(
            connection.execute(
                update(_jobs).where(_jobs.c.status == source).values(status=target, status_msg=msg)
            ).rowcount
        )


# --- transports -------------------------------------------------------------------------------

TRANSPORTS = ("embedded", "grpc")
"""The coordinator talks to the engine in-process, or over Spider's gRPC protocol to the same
engine served by ``coordinator.engine.grpc_server`` (what ``coordinator spider serve`` runs)."""


@contextmanager
def runtime_over(transport: str, config: CoordinatorConfig, lease_secs: float) -> Iterator[Runtime]:
    """``open_runtime``'s runtime; over gRPC its coordinator reaches the engine via a server."""
    with open_runtime(config, lease_secs=lease_secs) as runtime:
        if transport == "embedded":
            yield runtime
            return
        assert runtime.embedded is not None
        server = serve(runtime.embedded, "127.0.0.1", 0)
        client = GrpcSpider("127.0.0.1", server.port, initial_backoff_secs=0.01, deadline_secs=30)
        inner = runtime.coordinator
        runtime.spider = client
        runtime.coordinator = Coordinator(
            engine=inner.engine,
            spider=client,
            settings=inner.settings,
            archive_output=inner.archive_output,
            instance_id=inner.instance_id,
            lease_duration=inner.leases.lease_duration,
            owns_undecodable_jobs=inner.leases.owns_undecodable_jobs,
            leaves_job=inner.leases.leaves_job,
        )
        try:
            yield runtime
        finally:
            client.close()
            server.stop(0)
