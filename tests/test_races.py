"""Concurrent writers: exactly one wins each race; the history shows exactly the applied moves.

Run on MariaDB (row locks; the guarded UPDATE re-evaluates against the committed row) and on SQLite
(one writer at a time, BEGIN IMMEDIATE).
"""

from __future__ import annotations

import threading
from collections import Counter

import pytest
from sqlalchemy import func, select

from coordinator.lifecycle import Actor, JobStatus
from coordinator.store.guarded import Applied, LostRace, TransitionRequest, TransitionResult
from coordinator.store.jobs import JobStore, job_state
from coordinator.store.schema import job_transitions
from tests.paths import new_job_in

pytestmark = pytest.mark.slow  # real engines racing

RACES = 150


def _race(
    store: JobStore, requests_for: list[list[TransitionRequest]]
) -> list[list[TransitionResult]]:
    """Each thread fires its request for race i together with the others, race after race."""
    threads = len(requests_for[0])
    barrier = threading.Barrier(threads)
    results: list[list[TransitionResult | None]] = [[None] * threads for _ in requests_for]
    errors: list[BaseException] = []

    def run(thread: int) -> None:
        try:
            for race, requests in enumerate(requests_for):
                barrier.wait(timeout=30)
                results[race][thread] = store.transition(requests[thread])
        except BaseException as error:  # surfaced below, on the main thread
            errors.append(error)
            barrier.abort()

    workers = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert not errors, errors
    return [[r for r in race if r is not None] for race in results]


def test_two_coordinators_racing_to_submit_one_wins_each_time(store: JobStore) -> None:
    jobs = [new_job_in(store, JobStatus.PENDING) for _ in range(RACES)]
    requests = [
        [
            TransitionRequest(
                job,
                "submitted",
                JobStatus.PENDING,
                JobStatus.RUNNING,
                Actor.COORDINATOR,
                actor_id=f"coordinator-{thread}",
                spider_id=1000 * (thread + 1) + job,
                num_tasks=1,
            )
            for thread in range(2)
        ]
        for job in jobs
    ]
    outcomes = _race(store, requests)

    winners = Counter()
    for job, results in zip(jobs, outcomes, strict=True):
        applied = [r for r in results if isinstance(r, Applied)]
        lost = [r for r in results if isinstance(r, LostRace)]
        assert len(applied) == 1 and len(lost) == 1, results
        assert lost[0].actual_status == JobStatus.RUNNING
        row = store.get(job)
        assert row is not None
        history = store.history(job)
        assert len(history) == 1
        assert history[0].spider_id == row.spider_id == lost[0].spider_id
        winners[history[0].actor_id] += 1
    assert sum(winners.values()) == RACES
    with store.engine.connect() as connection:
        total = connection.execute(select(func.count()).select_from(job_transitions)).scalar_one()
    assert total == RACES


def test_the_commit_task_and_a_failure_report_race_one_outcome_each_time(store: JobStore) -> None:
    jobs = [new_job_in(store, JobStatus.RUNNING) for _ in range(RACES)]
    requests = [
        [
            TransitionRequest(
                job,
                "committed",
                JobStatus.RUNNING,
                JobStatus.COMMITTED,
                Actor.COMMIT_TASK,
                spider_id=4242,
                uncompressed_size=10,
                compressed_size=1,
            ),
            TransitionRequest(
                job,
                "failed",
                JobStatus.RUNNING,
                JobStatus.FAILED,
                Actor.COORDINATOR,
                spider_id=4242,
                reason="Spider reported Failed",
            ),
            TransitionRequest(
                job,
                "committed",
                JobStatus.RUNNING,
                JobStatus.COMMITTED,
                Actor.COMMIT_TASK,
                spider_id=4242,
                uncompressed_size=10,
                compressed_size=1,
            ),
        ]
        for job in jobs
    ]
    outcomes = _race(store, requests)
    for job, results in zip(jobs, outcomes, strict=True):
        applied = [r for r in results if isinstance(r, Applied)]
        assert len(applied) == 1, results
        row = store.get(job)
        assert row is not None
        assert job_state(row) == applied[0].edge.dest
        moves = [(h.from_status, h.to_status) for h in store.history(job)]
        assert moves == [(0, 1), (1, int(applied[0].edge.dest))]
        for result in results:
            if isinstance(result, LostRace):
                assert result.actual_status == row.status
                assert result.state == job_state(row)
