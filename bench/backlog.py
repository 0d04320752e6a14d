"""P3, the backlog: many Pending jobs, up to ``max_concurrent_jobs`` in flight, Spider never done.

Inserts ``--pending`` one-object jobs as log-ingestor does (one finished ingestion job, its
objects, one compression job per object, the config blob from ``encode_clp_io_config``), in bulk,
then runs the coordinator in-process against ``NeverDone``, an in-memory Spider port whose jobs
run forever. It measures:

* the fill: how long until ``max_concurrent_jobs`` jobs are in flight (claims and submissions);
* the steady state (``--seconds``): ticks per second with the loop's own pauses (``run``'s
  cadence) and the mean cost of a tick, and Spider calls per second (``GetJobState`` is bounded
  by the polling back-off: at most in-flight / ``max_backoff`` per second);
* the peak RSS of the process (``resource.getrusage``), the insert included.

A tick's cost must not grow with the backlog: compare ``--pending 1000`` with ``--pending 10000``.

    .venv/bin/python -m bench.backlog [--pending 10000] [--in-flight 1000] [--seconds 10]
    .venv/bin/python -m bench.backlog --database mysql+pymysql://user:pass@127.0.0.1:3306/
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from sqlalchemy import Engine, bindparam, insert, select, text, update
from sqlalchemy.engine import make_url

from coordinator import metrics
from coordinator.archive_storage import FsArchiveOutput
from coordinator.config.clp import ArchiveOutput, CompressionCoordinator, PollingBackoff
from coordinator.job_config import (
    ClpIoConfig,
    S3ObjectMetadataInputConfig,
    encode_clp_io_config,
)
from coordinator.service.coordinator import Coordinator
from coordinator.service.ingest import output_config_of
from coordinator.spider.measured import MeasuredSpider
from coordinator.spider.port import JobNotFound, JobState, ServerError
from coordinator.store import migrate
from coordinator.store.database import create_database_engine
from coordinator.store.schema import compression_jobs as _jobs
from coordinator.store.schema import ingested_s3_object_metadata as _objects
from coordinator.store.schema import ingestion_jobs as _ingestion_jobs
from coordinator.task_io import DefaultAuthentication

BUCKET = "logs"
PREFIX = "ingest/"
INSERT_BATCH = 1000


class NeverDone:
    """An in-memory Spider port whose jobs, once started, run forever (thread-safe).

    With ``lifetime`` (seconds), a started job fails that long after its start instead: a churn
    that frees places, so that the coordinator claims on every tick.
    """

    def __init__(self, lifetime: float | None = None) -> None:
        self._lock = threading.Lock()
        self._states: dict[int, JobState] = {}
        self._ends: dict[int, float] = {}
        self.lifetime = lifetime
        self._groups = 0
        self.polled: dict[int, float] = {}
        """When each job was first asked for its state (``GetJobState``)."""

    def add_resource_group(self, external_id: str, password: bytes) -> int:
        with self._lock:
            self._groups += 1
            return self._groups

    def verify_resource_group(self, resource_group_id: int, password: bytes) -> None:
        return None

    def register_job(
        self, resource_group_id: int, compressed_task_graph: bytes, compressed_inputs: bytes
    ) -> int:
        with self._lock:
            job_id = len(self._states) + 1
            self._states[job_id] = JobState.READY
            return job_id

    def adopt(self, job_ids: list[int]) -> None:
        """Jobs registered and started by an earlier process (a restart's Spider)."""
        with self._lock:
            for job_id in job_ids:
                self._states[job_id] = JobState.RUNNING

    def start_job(self, job_id: int) -> JobState:
        with self._lock:
            state = self._state(job_id)
            if state is not JobState.READY:
                raise ServerError(f"job {job_id} is {state.name}")
            self._states[job_id] = JobState.RUNNING
            if self.lifetime is not None:
                self._ends[job_id] = time.monotonic() + self.lifetime
            return JobState.RUNNING

    def cancel_job(self, job_id: int) -> JobState:
        with self._lock:
            self._state(job_id)
            self._states[job_id] = JobState.CANCELLED
            return JobState.CANCELLED

    def get_job_state(self, job_id: int) -> JobState:
        with self._lock:
            self.polled.setdefault(job_id, time.monotonic())
            return self._state(job_id)

    def get_job_outputs(self, job_id: int) -> list[bytes]:
        raise ServerError("never done")

    def get_job_error(self, job_id: int) -> str:
        with self._lock:
            if self._state(job_id) is not JobState.FAILED:
                raise ServerError("not failed")
            return "bench: the job's lifetime is over"

    def _state(self, job_id: int) -> JobState:
        state = self._states.get(job_id)
        if state is None:
            raise JobNotFound(f"no job {job_id}")
        end = self._ends.get(job_id)
        if end is not None and state is JobState.RUNNING and time.monotonic() >= end:
            state = self._states[job_id] = JobState.FAILED
        return state


def job_blob(ingestion_job_id: int, object_id: int) -> bytes:
    """A one-object job's ``clp_config`` as log-ingestor writes it."""
    return encode_clp_io_config(
        ClpIoConfig(
            input=S3ObjectMetadataInputConfig(
                bucket=BUCKET,
                region_code=None,
                key_prefix=PREFIX,
                endpoint_url="http://127.0.0.1:9/",
                aws_authentication=DefaultAuthentication(),
                ingestion_job_id=ingestion_job_id,
                s3_object_metadata_ids=[object_id],
                dataset=None,
                timestamp_key=None,
                unstructured=False,
            ),
            output=output_config_of(ArchiveOutput()),  # CLP's defaults
        )
    )


def insert_pending(engine: Engine, count: int) -> float:
    """``count`` Pending one-object jobs, in bulk; the seconds it took."""
    started = time.perf_counter()
    with engine.begin() as connection:
        key = connection.execute(
            insert(_ingestion_jobs).values(config="{}", status="finished")
        ).inserted_primary_key
        assert key is not None
        ingestion_job_id = int(key[0])
    for start in range(0, count, INSERT_BATCH):
        size = min(INSERT_BATCH, count - start)
        with engine.begin() as connection:
            keys = [f"{PREFIX}bench-{uuid.uuid4().hex}.jsonl" for _ in range(size)]
            connection.execute(
                insert(_objects),
                [
                    {
                        "bucket": BUCKET,
                        "key": key,
                        "size": 4096,
                        "ingestion_job_id": ingestion_job_id,
                    }
                    for key in keys
                ],
            )
            object_ids = list(
                connection.execute(
                    select(_objects.c.id).where(_objects.c.key.in_(keys)).order_by(_objects.c.id)
                ).scalars()
            )
            blobs = [job_blob(ingestion_job_id, object_id) for object_id in object_ids]
            connection.execute(insert(_jobs), [{"clp_config": blob} for blob in blobs])
            job_ids = list(
                connection.execute(
                    select(_jobs.c.id).order_by(_jobs.c.id.desc()).limit(size)
                ).scalars()
            )
            job_ids.reverse()
            connection.execute(
                update(_objects)
                .where(_objects.c.id == bindparam("object_id"))
                .values(compression_job_id=bindparam("job_id"), status="submitted"),
                [
                    {"object_id": object_id, "job_id": job_id}
                    for object_id, job_id in zip(object_ids, job_ids, strict=True)
                ],
            )
    return time.perf_counter() - started


@contextmanager
def database(server_url: str | None) -> Iterator[Engine]:
    """A fresh database at head: a SQLite file, or a new database on the MariaDB server."""
    with tempfile.TemporaryDirectory() as directory:
        if server_url is None:
            engine = create_database_engine(f"sqlite:///{directory}/bench.db")
            name = None
        else:
            name = f"bench_{uuid.uuid4().hex[:8]}"
            server = create_database_engine(server_url)
            with server.begin() as connection:
                connection.execute(text(f"CREATE DATABASE {name}"))
            engine = create_database_engine(
                make_url(server_url).set(database=name).render_as_string(hide_password=False)
            )
        try:
            migrate.upgrade(engine)
            yield engine
        finally:
            engine.dispose()
            if name is not None:
                with server.begin() as connection:
                    connection.execute(text(f"DROP DATABASE {name}"))
                server.dispose()


def spider_calls() -> dict[str, float]:
    """Spider calls made so far in this process, by RPC name (``MeasuredSpider``'s histogram)."""
    calls: dict[str, float] = {}
    for family in metrics.SPIDER_CALL_DURATION.collect():
        for sample in family.samples:
            if sample.name.endswith("_count"):
                calls[sample.labels["method"]] = sample.value
    return calls


@dataclass(frozen=True)
class BacklogFigures:
    backend: str
    pending: int
    in_flight: int
    insert_secs: float
    fill_secs: float
    fill_ticks: int
    steady_ticks_per_sec: float
    steady_tick_ms: float
    state_calls_per_sec: float
    calls_per_sec: float
    peak_rss_mb: float
    concluded_per_sec: float
    claim_ms_per_tick: float
    """The lease keeper's claim (the part of a tick that reads the backlog), in the steady state."""

    def lines(self) -> list[str]:
        return [
            f"backend {self.backend}: {self.pending} Pending, {self.in_flight} in flight",
            f"insert: {self.insert_secs:.1f} s",
            f"fill to {self.in_flight} in flight: {self.fill_secs:.1f} s "
            f"in {self.fill_ticks} tick(s)",
            f"steady: {self.steady_ticks_per_sec:.1f} ticks/s, {self.steady_tick_ms:.1f} ms/tick, "
            f"claiming {self.claim_ms_per_tick:.1f} ms/tick",
            f"Spider: {self.state_calls_per_sec:.0f} GetJobState/s, "
            f"{self.calls_per_sec:.0f} calls/s",
            f"concluded (churn): {self.concluded_per_sec:.1f} jobs/s",
            f"peak RSS: {self.peak_rss_mb:.0f} MB",
        ]


def measure(
    server_url: str | None = None,
    *,
    pending: int = 10_000,
    in_flight: int = 1000,
    seconds: float = 10.0,
    job_lifetime: float | None = None,
    directory: Path | None = None,
) -> BacklogFigures:
    """Run the case once; its figures. ``job_lifetime``: started jobs fail after it (churn)."""
    with database(server_url) as engine, tempfile.TemporaryDirectory() as scratch:
        insert_secs = insert_pending(engine, pending)
        settings = CompressionCoordinator(
            max_concurrent_jobs=in_flight,
            result_polling=PollingBackoff(init_backoff_millisecs=100, max_backoff_millisecs=1000),
        )
        spider = NeverDone(job_lifetime)
        coordinator = Coordinator(
            engine=engine,
            spider=MeasuredSpider(spider),
            settings=settings,
            archive_output=FsArchiveOutput(directory=directory or Path(scratch)),
            instance_id="bench-backlog",
            lease_duration=timedelta(seconds=30),
        )
        interval = settings.job_polling_interval_millisecs / 1000
        target = min(in_flight, pending)
        started = time.perf_counter()
        fill_ticks = 0
        while sum(1 for job in coordinator.driven.values() if job.spider_id is not None) < target:
            coordinator.tick()
            fill_ticks += 1
        fill_secs = time.perf_counter() - started
        before = spider_calls()
        claiming = [0.0]
        claim = coordinator.leases.claim

        def timed_claim() -> int:
            claim_started = time.perf_counter()
            try:
                return claim()
            finally:
                claiming[0] += time.perf_counter() - claim_started

        coordinator.leases.claim = timed_claim  # type: ignore[method-assign]
        ticks = 0
        concluded = 0
        busy = 0.0
        started = time.perf_counter()
        deadline = started + seconds
        while time.perf_counter() < deadline:
            tick_started = time.perf_counter()
            concluded += len(coordinator.tick().concluded)
            busy += time.perf_counter() - tick_started
            ticks += 1
            coordinator.stopping.wait(coordinator._pause(interval))
        elapsed = time.perf_counter() - started
        after = spider_calls()
        coordinator.release_leases()
        calls = {method: after.get(method, 0) - before.get(method, 0) for method in after}
        return BacklogFigures(
            backend=engine.dialect.name,
            pending=pending,
            in_flight=target,
            insert_secs=insert_secs,
            fill_secs=fill_secs,
            fill_ticks=fill_ticks,
            steady_ticks_per_sec=ticks / elapsed,
            steady_tick_ms=1000 * busy / ticks,
            state_calls_per_sec=calls.get("GetJobState", 0) / elapsed,
            calls_per_sec=sum(calls.values()) / elapsed,
            peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            concluded_per_sec=concluded / elapsed,
            claim_ms_per_tick=1000 * claiming[0] / ticks,
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.backlog", description=__doc__)
    parser.add_argument("--database", help="a MariaDB server URL (default: SQLite)")
    parser.add_argument("--pending", type=int, default=10_000)
    parser.add_argument("--in-flight", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument(
        "--job-lifetime", type=float, help="started jobs fail after this many seconds (churn)"
    )
    args = parser.parse_args(argv)
    figures = measure(
        args.database,
        pending=args.pending,
        in_flight=args.in_flight,
        seconds=args.seconds,
        job_lifetime=args.job_lifetime,
    )
    for line in figures.lines():
        print(line)


if __name__ == "__main__":
    main()
