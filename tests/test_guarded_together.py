"""Fenced moves of one edge that write the same values are made together (issue 14).

``apply_transitions`` moves a tick's finalisations with one locking read and one ``UPDATE``
(repeating every guard), instead of one ``UPDATE`` per job; a batch's submissions too, each job's
own Spider job and task count written by a ``CASE`` on its id. What each job ends as must not
change: every test here runs the same requests one by one (``TOGETHER_AT_LEAST`` out of reach)
and together, and compares the results, the rows and the history. SQLite and MariaDB.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import Engine, event, select

from coordinator.lifecycle import Actor, JobStatus, state_of
from coordinator.store import guarded
from coordinator.store.guarded import (
    Applied,
    GuardedWriteMismatch,
    LostRace,
    NotFound,
    TransitionRequest,
    TransitionResult,
    apply_transitions,
)
from coordinator.store.jobs import JobStore
from coordinator.store.schema import compression_jobs as jobs_table
from coordinator.store.schema import job_transitions as history_table
from tests.paths import new_job_in, request

NOW = datetime(2026, 12, 2, 12, 0, 0, tzinfo=UTC)
MISSING = 10**9


def _finalise(job_id: int, spider_id: int, *, fence: int = 0) -> TransitionRequest:
    return request(
        job_id,
        "finalised",
        JobStatus.COMMITTED,
        JobStatus.SUCCEEDED,
        Actor.COORDINATOR,
        spider_id=spider_id,
        fence=fence,
    )


def _scenario(store: JobStore, base: int) -> list[TransitionRequest]:
    """Seven finalisations: three that hold, and one each fenced out, of a job that moved on, of
    a job that does not exist, and naming another Spider job than the row's."""
    holds = [new_job_in(store, JobStatus.COMMITTED, spider_id=base + i) for i in range(3)]
    fenced_out = new_job_in(store, JobStatus.COMMITTED, spider_id=base + 3)
    moved_on = new_job_in(store, JobStatus.SUCCEEDED, spider_id=base + 4)
    other_spider_job = new_job_in(store, JobStatus.COMMITTED, spider_id=base + 5)
    return [
        _finalise(holds[0], base),
        _finalise(fenced_out, base + 3, fence=7),
        _finalise(holds[1], base + 1),
        _finalise(moved_on, base + 4),
        _finalise(MISSING + base, base + 6),
        _finalise(other_spider_job, base + 99),
        _finalise(holds[2], base + 2),
    ]


@contextmanager
def _statements(engine: Engine) -> Iterator[list[str]]:
    seen: list[str] = []

    def executed(*args: Any) -> None:
        seen.append(" ".join(str(args[2]).split()))

    event.listen(engine, "before_cursor_execute", executed)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", executed)


def _apply(engine: Engine, requests: list[TransitionRequest]) -> list[TransitionResult]:
    with engine.begin() as connection:
        return apply_transitions(connection, requests, now=NOW)


def _both_ways(
    engine: Engine,
    alone: list[TransitionRequest],
    together: list[TransitionRequest],
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[list[TransitionResult], list[str], list[str]]:
    """``alone`` applied one by one (``TOGETHER_AT_LEAST`` out of reach), then ``together`` as
    usual; their outcomes must be alike. ``together``'s results, and each way's statements."""
    with monkeypatch.context() as patch:
        patch.setattr(guarded, "TOGETHER_AT_LEAST", 10**6)
        with _statements(engine) as one_by_one:
            alone_results = _apply(engine, alone)
    with _statements(engine) as batched:
        together_results = _apply(engine, together)
    assert [_outcome(r) for r in together_results] == [_outcome(r) for r in alone_results]
    return together_results, one_by_one, batched


def _moves(statements: list[str]) -> list[str]:
    """The compare-and-sets among ``statements``."""
    return [s for s in statements if s.startswith("UPDATE compression_jobs")]


def _outcome(result: TransitionResult) -> tuple[object, ...]:
    """A result without what differs between two runs (the job's id)."""
    if isinstance(result, Applied):
        return ("applied", result.edge.trigger, result.at, result.history_id)
    if isinstance(result, LostRace):
        return ("lost", result.expected, result.actual_status, result.lease_epoch, result.state)
    assert isinstance(result, NotFound)
    return ("not found",)


def _row(engine: Engine, job_id: int) -> tuple[object, ...]:
    with engine.connect() as connection:
        row = connection.execute(select(jobs_table).where(jobs_table.c.id == job_id)).one_or_none()
        history = connection.execute(
            select(history_table.c.trigger, history_table.c.lease_epoch, history_table.c.reason)
            .where(history_table.c.job_id == job_id, history_table.c.trigger == "finalised")
            .order_by(history_table.c.id)
        ).all()
    if row is None:
        return ("no row",)
    ended_lease = row.lease_expires_at is not None
    return (state_of(row.status, row.committed_at), row.lease_epoch, ended_lease, tuple(history))


def test_finalisations_together_end_as_one_by_one(
    store: JobStore, migrated_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    alone = _scenario(store, 100)
    together = _scenario(store, 200)
    together_results, one_by_one, batched = _both_ways(
        migrated_engine, alone, together, monkeypatch
    )
    assert [type(r).__name__ for r in together_results] == [
        "Applied",
        "LostRace",
        "Applied",
        "LostRace",
        "NotFound",
        "LostRace",
        "Applied",
    ]
    for one, other in zip(alone, together, strict=True):
        if one.job_id < MISSING:
            assert _row(migrated_engine, other.job_id) == _row(migrated_engine, one.job_id)

    assert len(_moves(one_by_one)) == 7  # one compare-and-set per request
    assert len(_moves(batched)) == 1  # one for the whole kind
    locking_reads = [s for s in batched if s.startswith("SELECT compression_jobs.id FROM")]
    assert len(locking_reads) == 1
    assert "IN" in _moves(batched)[0] and "lease_epoch" in _moves(batched)[0]


def test_a_job_asked_to_move_twice_is_moved_once(store: JobStore, migrated_engine: Engine) -> None:
    jobs = [new_job_in(store, JobStatus.COMMITTED, spider_id=300 + i) for i in range(3)]
    requests = [_finalise(job, 300 + i) for i, job in enumerate(jobs)]
    requests.append(_finalise(jobs[0], 300))

    results = _apply(migrated_engine, requests)

    assert [type(r).__name__ for r in results] == ["Applied", "Applied", "Applied", "LostRace"]
    assert _row(migrated_engine, jobs[0])[3] == (("finalised", 0, "test: finalised"),)


def test_fewer_than_the_threshold_move_one_by_one(store: JobStore, migrated_engine: Engine) -> None:
    jobs = [new_job_in(store, JobStatus.COMMITTED, spider_id=400 + i) for i in range(2)]
    with _statements(migrated_engine) as statements:
        results = _apply(migrated_engine, [_finalise(j, 400 + i) for i, j in enumerate(jobs)])
    assert all(isinstance(r, Applied) for r in results)
    assert not [s for s in statements if s.startswith("SELECT compression_jobs.id FROM")]


def test_an_update_that_disagrees_with_its_locked_read_moves_nothing(
    store: JobStore, migrated_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only a broken lock could make the UPDATE match other rows than the read: the whole
    transaction is refused and rolled back, no job moved, no history row left."""
    jobs = [new_job_in(store, JobStatus.COMMITTED, spider_id=500 + i) for i in range(3)]
    real = guarded._together_update

    def matching_nothing(edge: Any, unless: bool, jobs_written: int = 0) -> Any:
        return real(edge, unless, jobs_written).where(jobs_table.c.id < 0)

    monkeypatch.setattr(guarded, "_together_update", matching_nothing)
    with pytest.raises(GuardedWriteMismatch, match="3 locked jobs changed 0 rows"):
        _apply(migrated_engine, [_finalise(j, 500 + i) for i, j in enumerate(jobs)])
    for job in jobs:
        state, _, _, history = _row(migrated_engine, job)
        assert (state, history) == (JobStatus.COMMITTED, ())


def _submit(job_id: int, spider_id: int, num_tasks: int, *, fence: int = 0) -> TransitionRequest:
    return request(
        job_id,
        "submitted",
        JobStatus.PENDING,
        JobStatus.RUNNING,
        Actor.COORDINATOR,
        spider_id=spider_id,
        num_tasks=num_tasks,
        fence=fence,
        unless_cancel_requested=True,
    )


def _submissions(store: JobStore, base: int) -> list[TransitionRequest]:
    """Six submissions, each with its own Spider job and task count: four that hold, one fenced
    out, one of a job already submitted."""
    pending = [new_job_in(store, JobStatus.PENDING) for _ in range(5)]
    running = new_job_in(store, JobStatus.RUNNING, spider_id=base + 50)
    return [
        _submit(pending[0], base, 1),
        _submit(pending[1], base + 1, 4),
        _submit(pending[2], base + 2, 2, fence=7),
        _submit(running, base + 3, 3),
        _submit(pending[3], base + 4, 9),
        _submit(pending[4], base + 5, 5),
    ]


def _submitted_row(engine: Engine, job_id: int) -> tuple[object, ...]:
    with engine.connect() as connection:
        row = connection.execute(select(jobs_table).where(jobs_table.c.id == job_id)).one()
        history = connection.execute(
            select(history_table.c.trigger, history_table.c.spider_id, history_table.c.lease_epoch)
            .where(history_table.c.job_id == job_id, history_table.c.trigger == "submitted")
            .order_by(history_table.c.id)
        ).all()
    return (
        JobStatus(row.status),
        row.spider_id,
        row.num_tasks,
        row.start_time is not None,
        row.dispatch_time is not None,
        tuple(history),
    )


def test_submissions_together_write_each_job_its_own_spider_job_and_task_count(
    store: JobStore, migrated_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    alone = _submissions(store, 1000)
    together = _submissions(store, 2000)
    together_results, one_by_one, batched = _both_ways(
        migrated_engine, alone, together, monkeypatch
    )
    assert [type(r).__name__ for r in together_results] == [
        "Applied",
        "Applied",
        "LostRace",
        "LostRace",
        "Applied",
        "Applied",
    ]
    for one, other, result in zip(alone, together, together_results, strict=True):
        alone_row = _submitted_row(migrated_engine, one.job_id)
        together_row = _submitted_row(migrated_engine, other.job_id)
        if isinstance(result, Applied):
            # Each job its own Spider job and task count, as the one-by-one move wrote them.
            assert together_row[1:3] == (other.spider_id, other.num_tasks)
            assert alone_row[1:3] == (one.spider_id, one.num_tasks)
            assert together_row[5] == (("submitted", other.spider_id, 0),)
        # Everything else alike (a lost race leaves its row as it was).
        assert (together_row[0], *together_row[2:5]) == (alone_row[0], *alone_row[2:5])
        assert len(together_row[5]) == len(alone_row[5])

    assert len(_moves(one_by_one)) == 6
    [update] = _moves(batched)  # one for the four that hold
    assert "CASE" in update and "spider_id" in update and "num_tasks" in update


def _outcome_of(results: list[TransitionResult], request: TransitionRequest) -> TransitionResult:
    [result] = [r for r in results if r.job_id == request.job_id]
    return result
