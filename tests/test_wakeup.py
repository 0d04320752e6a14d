"""The loop is woken when the embedded engine ends a job, instead of waiting for the next poll.

No timing bound is asserted: the coordinator's clock is frozen, so a back-off never falls due, and
a job that is polled at all was polled because the engine woke the loop.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from coordinator.config.loader import CoordinatorConfig, load_config
from coordinator.config.locations import DATA_DIR_ENV, DATABASE_URL_ENV
from coordinator.lifecycle import JobStatus
from coordinator.runtime import open_runtime
from coordinator.service import coordinator as coordinator_module
from coordinator.service.coordinator import (
    ADVANCE_CONCURRENCY,
    ENDINGS_SPACING_SECS,
    WOKEN_TICK_SPACING_SECS,
    Coordinator,
)
from coordinator.service.driven import DrivenJob
from coordinator.service.ingest import submit_job
from coordinator.service.outcomes import Ended
from coordinator.spider.port import JobState, SpiderError
from coordinator.store.jobs import job_state
from tests.engine_support import wait_for
from tests.service_support import coordinator_with, embedded, job_row, put_logs, triggers


@pytest.fixture
def config(database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> CoordinatorConfig:
    """The embedded default under ``tmp_path/var`` with one log file ingested, two workers."""
    if database_url.startswith("sqlite"):
        monkeypatch.delenv(DATABASE_URL_ENV, raising=False)
    else:
        monkeypatch.setenv(DATABASE_URL_ENV, database_url)
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    loaded = dataclasses.replace(load_config(None, data_dir=tmp_path / "var"), embedded_workers=2)
    put_logs(loaded, tmp_path, ["svc0"])
    return loaded


@pytest.mark.slow
@pytest.mark.parametrize("woken", [True, False])
def test_a_job_the_engine_ended_is_polled_at_once_only_when_the_engine_wakes_the_loop(
    config: CoordinatorConfig, woken: bool
) -> None:
    with open_runtime(config, lease_secs=30) as rt:
        coordinator = coordinator_with(rt, clock=lambda: 0.0)  # no back-off ever falls due
        if woken:
            embedded(rt).on_job_ended(coordinator.wake)
        job_id = submit_job(config, rt.engine, timestamp_key="timestamp")
        coordinator.tick()  # claims and submits: the first poll is due after the back-off
        spider_id = job_row(rt, job_id).spider_id
        assert spider_id is not None
        assert job_state(job_row(rt, job_id)) is JobStatus.RUNNING
        wait_for(rt.spider, spider_id, JobState.SUCCEEDED)
        report = coordinator.tick()
        if woken:
            assert report.concluded == [job_id]
            assert job_state(job_row(rt, job_id)) is JobStatus.SUCCEEDED
            assert triggers(rt, job_id) == ["submitted", "committed", "finalised"]
            assert job_id not in coordinator.driven
        else:
            assert report.concluded == []
            assert job_state(job_row(rt, job_id)) is JobStatus.COMMITTED
            assert job_id in coordinator.driven


@pytest.mark.slow
def test_open_runtime_wires_the_engine_to_wake_its_coordinator(config: CoordinatorConfig) -> None:
    with open_runtime(config, lease_secs=30) as rt:
        job_id = submit_job(config, rt.engine, timestamp_key="timestamp")
        rt.coordinator.tick()
        spider_id = job_row(rt, job_id).spider_id
        assert spider_id is not None
        wait_for(rt.spider, spider_id, JobState.SUCCEEDED)
        assert list(rt.coordinator._woken) == [spider_id]  # noted for the next tick


@pytest.mark.parametrize("how", ["wake", "stop", "wake_before"])
def test_the_pause_ends_when_the_loop_is_woken_or_stopped(
    config: CoordinatorConfig, how: str
) -> None:
    with open_runtime(config, lease_secs=30) as rt:
        coordinator = rt.coordinator
        if how == "wake_before":
            coordinator.wake(7)  # a wake between two pauses is not lost
        pause = threading.Thread(target=coordinator._sleep, args=(3600.0,), daemon=True)
        pause.start()
        if how == "wake":
            coordinator.wake(7)
        elif how == "stop":
            coordinator.stopping.set()
        pause.join(timeout=60)  # a guard against hanging for an hour, not a timing bound
        assert not pause.is_alive()


@pytest.mark.parametrize("since_last_tick", [0.0, 1.0])
def test_a_wake_soon_after_a_tick_waits_out_the_spacing_and_a_later_one_does_not(
    config: CoordinatorConfig, monkeypatch: pytest.MonkeyPatch, since_last_tick: float
) -> None:
    """While Pending jobs may wait for places (the last claim filled them), woken ticks are
    spaced by ``WOKEN_TICK_SPACING_SECS`` from the last tick's start: jobs that end one after
    another are concluded together, and the places they free are claimed soon. The wait is read,
    not timed."""
    with open_runtime(config, lease_secs=30) as rt:
        coordinator = rt.coordinator
        waits = _recorded_waits(coordinator, monkeypatch)
        coordinator.tick()
        coordinator.wake(7)
        coordinator.leases.filled_capacity = True
        now = _frozen_monotonic(monkeypatch)
        coordinator._last_tick_started = now - since_last_tick
        coordinator._last_ending_tick_started = now
        coordinator._sleep(3600.0)
        if since_last_tick:
            assert waits == []  # served at once
        else:
            assert waits == [pytest.approx(WOKEN_TICK_SPACING_SECS)]


@pytest.mark.parametrize("since_last_ending", [0.0, 1.0])
def test_with_places_free_a_wake_is_spaced_from_the_last_tick_that_concluded_a_job(
    config: CoordinatorConfig, monkeypatch: pytest.MonkeyPatch, since_last_ending: float
) -> None:
    """With no Pending job waiting for a place, a wake waits until ``ENDINGS_SPACING_SECS``
    after the last tick that concluded a job (endings in a stream are concluded several at a
    time), and the loop's own ticks in between do not delay it: a job ending after a quiet spell
    is concluded at once, even right after a tick that concluded nothing."""
    with open_runtime(config, lease_secs=30) as rt:
        coordinator = rt.coordinator
        waits = _recorded_waits(coordinator, monkeypatch)
        report = coordinator.tick()  # claims nothing: places are free
        assert not report.concluded and not coordinator.leases.filled_capacity
        now = _frozen_monotonic(monkeypatch)
        coordinator._last_tick_started = now  # a tick (that concluded nothing) just started
        coordinator._last_ending_tick_started = now - since_last_ending
        coordinator.wake(7)
        coordinator._sleep(3600.0)
        if since_last_ending:
            assert waits == []  # served at once, though a tick started just now
        else:
            assert waits == [pytest.approx(ENDINGS_SPACING_SECS)]
            assert ENDINGS_SPACING_SECS > WOKEN_TICK_SPACING_SECS


@pytest.mark.slow
def test_a_tick_that_concludes_a_job_starts_the_spacing_of_endings(
    config: CoordinatorConfig,
) -> None:
    """The spacing of endings runs from the start of the tick that concluded a job; ticks that
    conclude none leave it."""
    with open_runtime(config, lease_secs=30) as rt:
        coordinator = rt.coordinator
        job_id = submit_job(config, rt.engine, timestamp_key="timestamp")
        coordinator.tick()  # claims and submits it
        spider_id = job_row(rt, job_id).spider_id
        assert spider_id is not None
        never = coordinator._last_ending_tick_started
        wait_for(rt.spider, spider_id, JobState.SUCCEEDED)
        started = time.monotonic()
        report = coordinator.tick()  # woken by the engine
        assert report.concluded == [job_id]
        assert coordinator._last_ending_tick_started >= started > never
        concluding = coordinator._last_ending_tick_started
        assert not coordinator.tick().concluded
        assert coordinator._last_ending_tick_started == concluding
        assert coordinator._last_tick_started > concluding


def _frozen_monotonic(monkeypatch: pytest.MonkeyPatch) -> float:
    """Freeze the real-time clock the loop's pauses read (``time.monotonic`` in the coordinator
    module); the instant it is frozen at."""
    now = time.monotonic()
    clock = types.SimpleNamespace(monotonic=lambda: now, perf_counter=time.perf_counter)
    monkeypatch.setattr(coordinator_module, "time", clock)
    return now


def _recorded_waits(
    coordinator: Coordinator, monkeypatch: pytest.MonkeyPatch
) -> list[float | None]:
    """The timeouts the loop's pauses on ``stopping`` ask for (each returns at once)."""
    waits: list[float | None] = []

    def wait(timeout: float | None = None) -> bool:
        waits.append(timeout)
        return False

    monkeypatch.setattr(coordinator.stopping, "wait", wait)
    return waits


@pytest.mark.slow
def test_a_tick_polls_in_flight_jobs_while_it_submits(
    config: CoordinatorConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One job's round trips do not wait for another's: the poll of an ended job and the
    registration of a new one meet at a barrier (which a tick doing one after the other would
    never pass), and the tick both concludes the first job and starts the second."""
    with open_runtime(config, lease_secs=30) as rt:
        now = [0.0]
        coordinator = coordinator_with(rt, clock=lambda: now[0])  # polled only when woken
        spider = embedded(rt)
        first = submit_job(config, rt.engine, timestamp_key="timestamp")
        coordinator.tick()
        first_spider_id = job_row(rt, first).spider_id
        assert first_spider_id is not None
        wait_for(rt.spider, first_spider_id, JobState.SUCCEEDED)
        coordinator.wake(first_spider_id)
        both = threading.Barrier(2, timeout=60)
        register_jobs, get_job_state = spider.register_jobs, spider.get_job_state
        met: list[int] = []

        def register_meeting_the_poll(
            group: int, submissions: Sequence[tuple[bytes, bytes]]
        ) -> list[int | SpiderError]:
            both.wait()
            return register_jobs(group, submissions)

        def state_meeting_the_registration(job_id: int) -> JobState:
            if job_id == first_spider_id and not met:
                met.append(job_id)
                both.wait()
            return get_job_state(job_id)

        monkeypatch.setattr(spider, "register_jobs", register_meeting_the_poll)
        monkeypatch.setattr(spider, "get_job_state", state_meeting_the_registration)
        second = submit_job(config, rt.engine, timestamp_key="timestamp")
        # A woken tick claims once the polling interval passed (``Coordinator._reads_due``).
        now[0] += coordinator.settings.job_polling_interval_millisecs / 1000
        report = coordinator.tick()
        assert not both.broken
        assert report.concluded == [first]
        assert job_state(job_row(rt, first)) is JobStatus.SUCCEEDED
        # Submitted and started: the engine may already have run it further.
        assert job_row(rt, second).spider_id is not None
        assert job_state(job_row(rt, second)) in (
            JobStatus.RUNNING,
            JobStatus.COMMITTED,
            JobStatus.SUCCEEDED,
        )


def test_a_tick_hands_only_the_jobs_due_to_the_pool(
    config: CoordinatorConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tick woken by one job's end polls that job only. Before, every job in flight was handed
    to the pool at every tick, where all but the due ones returned at once (a future each)."""
    with open_runtime(config, lease_secs=30) as rt:
        coordinator = coordinator_with(rt, clock=lambda: 0.0)  # polled only when woken
        job_ids = [submit_job(config, rt.engine, timestamp_key="timestamp") for _ in range(3)]
        coordinator.tick()
        spider_ids = [job_row(rt, job_id).spider_id for job_id in job_ids]
        assert None not in spider_ids
        polled: list[int] = []
        poll = coordinator._poll_guarded

        def counted(job: DrivenJob) -> Ended | None:
            polled.append(job.job_id)
            return poll(job)

        monkeypatch.setattr(coordinator, "_poll_guarded", counted)
        coordinator.tick()
        assert polled == []  # none is due: the clock is frozen and none was woken
        assert spider_ids[0] is not None
        wait_for(rt.spider, spider_ids[0], JobState.SUCCEEDED)
        coordinator.wake(spider_ids[0])
        report = coordinator.tick()
        assert polled == [job_ids[0]]
        assert report.concluded == [job_ids[0]]


def test_the_due_jobs_are_taken_by_as_many_threads_as_poll_at_once(
    config: CoordinatorConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tick hands the pool one task per thread (``ADVANCE_CONCURRENCY``), not a future per due
    job; each thread takes the next due job when its poll is done, so a slow poll holds up no
    other job: here the first job's poll waits until every other due job was polled."""
    now = [0.0]
    with open_runtime(config, lease_secs=30) as rt:
        coordinator = coordinator_with(rt, clock=lambda: now[0])
        job_ids = [submit_job(config, rt.engine, timestamp_key="timestamp") for _ in range(7)]
        coordinator.tick()  # claims and submits them all
        assert all(job_row(rt, job_id).spider_id is not None for job_id in job_ids)
        polled: list[int] = []
        others_polled = threading.Event()
        poll, poll_each = coordinator._poll_guarded, coordinator._poll_each
        tasks: list[int] = []

        def slow_first(job: DrivenJob) -> Ended | None:
            if job.job_id == job_ids[0]:
                assert others_polled.wait(timeout=60), "the other jobs waited for the slow poll"
            polled.append(job.job_id)
            if len(polled) == len(job_ids) - 1:
                others_polled.set()
            return poll(job)

        def counted(due: Any) -> Any:
            tasks.append(1)
            return poll_each(due)

        monkeypatch.setattr(coordinator, "_poll_guarded", slow_first)
        monkeypatch.setattr(coordinator, "_poll_each", counted)
        now[0] = 3600.0  # every job's back-off has passed
        coordinator.tick()
        assert sorted(polled) == sorted(job_ids) and polled[-1] == job_ids[0]
        assert len(tasks) == ADVANCE_CONCURRENCY < len(job_ids)
