"""``start_all_registered``: StartJob first for jobs the coordinator registered and has not
started, GetJobState only when StartJob fails, so a job started meanwhile, evicted, or whose answer
was lost is answered as ``start_if_ready`` answers it (``docs/spider.md``, Guarded calls)."""

from __future__ import annotations

from typing import cast

from coordinator.spider.port import (
    JobNotFound,
    JobState,
    ServerError,
    SpiderPort,
    Unavailable,
    start_all_registered,
)


class ClusterLike:
    """Spider's storage service as it answers StartJob and GetJobState (``docs/spider.md``,
    Status codes); no ``start_ready_jobs``, as a cluster has none. Records every call."""

    def __init__(
        self, states: dict[int, JobState], lost_answers: frozenset[int] = frozenset()
    ) -> None:
        self.states = states
        self.lost_answers = set(lost_answers)
        self.calls: list[tuple[str, int]] = []

    def start_job(self, job_id: int) -> JobState:
        self.calls.append(("start", job_id))
        if job_id not in self.states:
            raise JobNotFound(f"job {job_id}")
        if self.states[job_id] is not JobState.READY:
            raise ServerError("storage service internal error")
        self.states[job_id] = JobState.RUNNING
        if job_id in self.lost_answers:
            raise Unavailable("deadline exceeded")
        return JobState.RUNNING

    def get_job_state(self, job_id: int) -> JobState:
        self.calls.append(("state", job_id))
        if job_id not in self.states:
            raise JobNotFound(f"job {job_id}")
        return self.states[job_id]


def test_a_ready_job_costs_one_call() -> None:
    spider = ClusterLike({1: JobState.READY, 2: JobState.READY})
    assert start_all_registered(cast(SpiderPort, spider), [1, 2]) == [JobState.RUNNING] * 2
    assert spider.calls == [("start", 1), ("start", 2)]


def test_a_job_that_is_not_ready_is_answered_by_its_state() -> None:
    spider = ClusterLike(
        {1: JobState.RUNNING, 2: JobState.SUCCEEDED, 3: JobState.READY}, frozenset({3})
    )
    answers = start_all_registered(cast(SpiderPort, spider), [1, 2, 3, 4])
    assert answers[:3] == [JobState.RUNNING, JobState.SUCCEEDED, JobState.RUNNING]
    assert isinstance(answers[3], JobNotFound)  # unknown: Spider's error in its place
    assert spider.calls == [
        ("start", 1),
        ("state", 1),
        ("start", 2),
        ("state", 2),
        ("start", 3),  # started, its answer lost: the state says so, no second StartJob
        ("state", 3),
        ("start", 4),
        ("state", 4),
    ]
