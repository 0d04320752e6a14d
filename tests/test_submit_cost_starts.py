"""The Spider jobs of a tick's submissions are registered and started together (issue 14).

The submitter registers a tick's prepared jobs in one call when the engine offers it
(``register_jobs``: the embedded engine stores them in one transaction), records the ``submitted``
moves in one transaction, then starts the recorded Spider jobs in one call (``start_ready_jobs``),
state first. When a call fails for a reason that is not an outage, each job is registered or
started alone, so a job's own fault counts against that job only.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from coordinator.config.loader import CoordinatorConfig
from coordinator.lifecycle import JobStatus
from coordinator.runtime import Runtime, open_runtime
from coordinator.service.coordinator import Coordinator
from coordinator.service.ingest import submit_job
from coordinator.spider.port import (
    JobState,
    SpiderError,
    SpiderPort,
    register_all_jobs,
    start_all_if_ready,
)
from coordinator.store.jobs import job_state
from tests.service_support import (
    SpiderProxy,
    coordinator_with,
    job_row,
    put_logs,
    run_until_idle,
)


class _StartsTogether(SpiderProxy):
    """Passes ``register_jobs`` and ``start_ready_jobs`` on, keeping each call's size or jobs;
    the first ``broken`` starts and ``broken_registrations`` registrations raise."""

    def __init__(
        self, inner: SpiderPort, *, broken: int = 0, broken_registrations: int = 0
    ) -> None:
        super().__init__(inner)
        self.batches: list[list[int]] = []
        self.started_alone: list[int] = []
        self.broken = broken
        self.registrations: list[int] = []
        self.broken_registrations = broken_registrations

    def register_jobs(
        self, resource_group_id: int, submissions: Sequence[tuple[bytes, bytes]]
    ) -> list[int | SpiderError]:
        self.registrations.append(len(submissions))
        if self.broken_registrations:
            self.broken_registrations -= 1
            raise RuntimeError("injected: the batch registration is broken")
        return register_all_jobs(self.inner, resource_group_id, submissions)

    def start_ready_jobs(self, job_ids: Sequence[int]) -> list[JobState | SpiderError]:
        self.batches.append(list(job_ids))
        if self.broken:
            self.broken -= 1
            raise RuntimeError("injected: the batch start is broken")
        return start_all_if_ready(self.inner, job_ids)

    def start_job(self, job_id: int) -> JobState:
        self.started_alone.append(job_id)
        return super().start_job(job_id)


@contextmanager
def _after_one_tick(
    config: CoordinatorConfig, tmp_path: Path, jobs: int, **broken: int
) -> Iterator[tuple[Runtime, list[int], _StartsTogether, Coordinator]]:
    """``jobs`` jobs submitted and one tick run over ``_StartsTogether``; after the block, every
    job must end Succeeded."""
    put_logs(config, tmp_path, ["svc0"])
    with open_runtime(config, lease_secs=5) as rt:
        job_ids = [submit_job(config, rt.engine, timestamp_key="timestamp") for _ in range(jobs)]
        spider = _StartsTogether(rt.spider, **broken)
        coordinator = coordinator_with(rt, spider=spider)
        coordinator.tick()
        yield rt, job_ids, spider, coordinator
        run_until_idle(coordinator)
        assert [job_state(job_row(rt, job_id)) for job_id in job_ids] == [
            JobStatus.SUCCEEDED
        ] * jobs


def test_the_recorded_submissions_of_a_tick_are_started_in_one_call(
    config: CoordinatorConfig, tmp_path: Path
) -> None:
    with _after_one_tick(config, tmp_path, 3) as (rt, jobs, spider, _):
        spider_ids = [job_row(rt, job_id).spider_id for job_id in jobs]
        assert spider.registrations == [3]
        assert spider.batches == [spider_ids]  # in claim order, after the moves were recorded
        assert spider_ids == sorted(spider_ids)  # Spider ids follow the claims
        assert spider.started_alone == []


def test_when_starting_together_fails_each_job_is_started_alone(
    config: CoordinatorConfig, tmp_path: Path
) -> None:
    with _after_one_tick(config, tmp_path, 2, broken=1) as (rt, jobs, spider, coordinator):
        spider_ids = [job_row(rt, job_id).spider_id for job_id in jobs]
        assert spider.batches == [spider_ids]
        assert spider.started_alone == spider_ids
        assert [coordinator.driven[job_id].failed_attempts for job_id in jobs] == [0, 0]


def test_when_registering_together_fails_each_job_is_registered_alone(
    config: CoordinatorConfig, tmp_path: Path
) -> None:
    with _after_one_tick(config, tmp_path, 2, broken_registrations=1) as (
        rt,
        jobs,
        spider,
        coordinator,
    ):
        assert spider.registrations == [2, 1, 1]
        assert [coordinator.driven[job_id].failed_attempts for job_id in jobs] == [0, 0]
        assert [job_state(job_row(rt, job_id)) for job_id in jobs] == [JobStatus.RUNNING] * 2
