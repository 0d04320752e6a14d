"""The Spider jobs of a tick's submissions are started together (issue 14), state first.

The submitter records the ``submitted`` moves of a tick in one transaction, then starts the
recorded Spider jobs in one call when the engine offers it (``start_ready_jobs``: the embedded
engine writes the starts in one transaction). When that call fails for a reason that is not an
outage, each job is started alone, so a job's own fault counts against that job only.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from coordinator.config.loader import CoordinatorConfig
from coordinator.lifecycle import JobStatus
from coordinator.runtime import open_runtime
from coordinator.service.ingest import submit_job
from coordinator.spider.port import JobState, SpiderError, SpiderPort, start_all_if_ready
from coordinator.store.jobs import job_state
from tests.service_support import SpiderProxy, coordinator_with, job_row, put_logs, run_until_idle


class _StartsTogether(SpiderProxy):
    """Passes ``start_ready_jobs`` on, keeping each call's jobs; ``broken`` calls raise."""

    def __init__(self, inner: SpiderPort, *, broken: int = 0) -> None:
        super().__init__(inner)
        self.batches: list[list[int]] = []
        self.started_alone: list[int] = []
        self.broken = broken

    def start_ready_jobs(self, job_ids: Sequence[int]) -> list[JobState | SpiderError]:
        self.batches.append(list(job_ids))
        if self.broken:
            self.broken -= 1
            raise RuntimeError("injected: the batch start is broken")
        return start_all_if_ready(self.inner, job_ids)

    def start_job(self, job_id: int) -> JobState:
        self.started_alone.append(job_id)
        return super().start_job(job_id)


def test_the_recorded_submissions_of_a_tick_are_started_in_one_call(
    config: CoordinatorConfig, tmp_path: Path
) -> None:
    put_logs(config, tmp_path, ["svc0"])
    with open_runtime(config, lease_secs=5) as rt:
        jobs = [submit_job(config, rt.engine, timestamp_key="timestamp") for _ in range(3)]
        spider = _StartsTogether(rt.spider)
        coordinator = coordinator_with(rt, spider=spider)
        coordinator.tick()
        spider_ids = [job_row(rt, job_id).spider_id for job_id in jobs]
        assert spider.batches == [spider_ids]  # in claim order, after the moves were recorded
        assert spider.started_alone == []
        run_until_idle(coordinator)
        assert [job_state(job_row(rt, job_id)) for job_id in jobs] == [JobStatus.SUCCEEDED] * 3


def test_when_starting_together_fails_each_job_is_started_alone(
    config: CoordinatorConfig, tmp_path: Path
) -> None:
    put_logs(config, tmp_path, ["svc0"])
    with open_runtime(config, lease_secs=5) as rt:
        jobs = [submit_job(config, rt.engine, timestamp_key="timestamp") for _ in range(2)]
        spider = _StartsTogether(rt.spider, broken=1)
        coordinator = coordinator_with(rt, spider=spider)
        coordinator.tick()
        spider_ids = [job_row(rt, job_id).spider_id for job_id in jobs]
        assert spider.batches == [spider_ids]
        assert spider.started_alone == spider_ids
        assert [coordinator.driven[job_id].failed_attempts for job_id in jobs] == [0, 0]
        run_until_idle(coordinator)
        assert [job_state(job_row(rt, job_id)) for job_id in jobs] == [JobStatus.SUCCEEDED] * 2
