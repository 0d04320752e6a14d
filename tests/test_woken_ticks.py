"""Ticks the engine's ``wake`` causes (issue 14): one per Spider job that ends, so they skip the
reads every tick would otherwise repeat, the cancel requests and the claims, unless
``job_polling_interval_millisecs`` has passed since those last ran or the last claim filled every
free place. A cancel request or a new job therefore waits no longer than between ordinary ticks.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import cast

from sqlalchemy import update

from coordinator.archive_storage import FsArchiveOutput
from coordinator.config.clp import CompressionCoordinator
from coordinator.lifecycle import JobStatus
from coordinator.service.coordinator import Coordinator
from coordinator.spider.port import JobState, SpiderPort
from coordinator.store.jobs import JobStore
from coordinator.store.schema import compression_jobs as _jobs
from tests.sql_capture import statements_sent
from tests.test_submit_cost_reads import _blob

INTERVAL_MS = 100


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class _StillRunning:
    """A Spider whose jobs run on; it counts the cancels it is sent."""

    def __init__(self) -> None:
        self.cancelled: list[int] = []

    def get_job_state(self, job_id: int) -> JobState:
        return JobState.RUNNING

    def cancel_job(self, job_id: int) -> JobState:
        self.cancelled.append(job_id)
        return JobState.CLEANUP_READY


@contextmanager
def _sent(coordinator: Coordinator) -> Iterator[list[str]]:
    """The statements the block sends through the store's engine, and one line for each read of
    the cancel requests on the loop's kept connection (``PollingReads``), which SQLAlchemy's
    events do not see."""
    reads = coordinator.loop.reads
    real = reads.cancel_requests
    with statements_sent(coordinator.loop.engine) as statements:

        def recorded(job_ids: Collection[int]) -> set[int]:
            statements.append("SELECT id (kept connection) WHERE cancel_requested_at IS NOT NULL")
            return real(job_ids)

        reads.cancel_requests = recorded  # type: ignore[method-assign]
        try:
            yield statements
        finally:
            del reads.cancel_requests


def _reads(statements: list[str]) -> tuple[bool, bool]:
    """Whether ``statements`` read the cancel requests, and whether they claimed."""
    selects = [s for s in statements if s.lstrip().upper().startswith("SELECT")]
    cancels = sum(1 for s in selects if "cancel_requested_at IS NOT NULL" in s)
    claims = sum(1 for s in selects if "lease_expires_at" in s and "status" in s)
    return cancels > 0, claims > 0


def _in_flight(store: JobStore, count: int) -> list[int]:
    """``count`` Running jobs, each recording Spider job 100 + its index, whose lease lapsed (a
    coordinator takes them over at its first claim)."""
    job_ids = [store.create_job(_blob(1, [1], "web")) for _ in range(count)]
    with store.engine.begin() as connection:
        for index, job_id in enumerate(job_ids):
            connection.execute(
                update(_jobs)
                .where(_jobs.c.id == job_id)
                .values(
                    status=int(JobStatus.RUNNING),
                    spider_id=100 + index,
                    lease_owner="gone",
                    lease_expires_at=store.clock() - timedelta(minutes=1),
                )
            )
    return job_ids


def _coordinator(
    store: JobStore, spider: _StillRunning, clock: _Clock, max_concurrent_jobs: int = 1000
) -> Coordinator:
    return Coordinator(
        engine=store.engine,
        spider=cast(SpiderPort, spider),
        settings=CompressionCoordinator(
            max_concurrent_jobs=max_concurrent_jobs, job_polling_interval_millisecs=INTERVAL_MS
        ),
        archive_output=FsArchiveOutput(directory=Path("/nonexistent/archives")),
        instance_id="woken",
        clock=clock,
        store=store,
    )


def test_a_woken_tick_skips_the_reads_until_the_polling_interval_passed(store: JobStore) -> None:
    job_ids = _in_flight(store, 2)
    clock = _Clock()
    coordinator = _coordinator(store, _StillRunning(), clock)
    assert coordinator.tick().claimed == 2
    pending = store.create_job(_blob(1, [1], "web"))

    with _sent(coordinator) as statements:
        coordinator.wake(100)
        coordinator.tick()
    assert _reads(statements) == (False, False)
    assert pending not in coordinator.driven

    clock.now += INTERVAL_MS / 1000
    with _sent(coordinator) as statements:
        coordinator.wake(101)
        report = coordinator.tick()
    assert _reads(statements) == (True, True)
    assert report.claimed == 1  # the job created after the last claim
    assert set(job_ids) <= set(coordinator.driven)


def test_a_tick_not_woken_reads_whatever_the_clock(store: JobStore) -> None:
    _in_flight(store, 1)
    clock = _Clock()  # never advances
    coordinator = _coordinator(store, _StillRunning(), clock)
    coordinator.tick()
    store.create_job(_blob(1, [1], "web"))
    with _sent(coordinator) as statements:
        report = coordinator.tick()
    assert _reads(statements) == (True, True)
    assert report.claimed == 1  # the job created after the last claim


def test_a_woken_tick_claims_when_the_last_claim_filled_every_place(store: JobStore) -> None:
    _in_flight(store, 1)
    # The job that waits for a place is a Pending one: take-overs are looked for once a second,
    # not at every tick (lease_keeper.TAKE_OVER_SCANS_PER_LEASE).
    store.create_job(_blob(1, [1], "web"))
    clock = _Clock()
    coordinator = _coordinator(store, _StillRunning(), clock, max_concurrent_jobs=1)
    assert coordinator.tick().claimed == 1
    (driven,) = coordinator.driven.values()
    # The driven job ends elsewhere and leaves: its place is free for the job still waiting.
    del coordinator.driven[driven.job_id]
    coordinator.driven[-1] = driven  # any driven job keeps the tick a woken one
    with _sent(coordinator) as statements:
        coordinator.wake(999)
        assert coordinator.tick().claimed == 0  # no place: max_concurrent_jobs is 1
    assert _reads(statements) == (False, False)
    del coordinator.driven[-1]
    with _sent(coordinator) as statements:
        coordinator.wake(999)
        assert coordinator.tick().claimed == 1
    assert _reads(statements)[1]


def test_a_cancel_request_waits_at_most_the_polling_interval(store: JobStore) -> None:
    (job_id, _) = _in_flight(store, 2)
    clock = _Clock()
    spider = _StillRunning()
    coordinator = _coordinator(store, spider, clock)
    coordinator.tick()
    with store.engine.begin() as connection:
        connection.execute(
            update(_jobs).where(_jobs.c.id == job_id).values(cancel_requested_at=store.clock())
        )
    coordinator.wake(101)
    coordinator.tick()
    assert spider.cancelled == []
    clock.now += INTERVAL_MS / 1000
    coordinator.wake(101)
    coordinator.tick()
    assert spider.cancelled == [100]
