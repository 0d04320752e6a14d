"""A tick's claims in one transaction (issue 14): the in-flight take-overs, the Pending rows that
record a Spider job and the Pending jobs to submit are claimed together, each row still compared
and set on its own epoch; nothing is claimed when the transaction fails."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, cast

import pytest
from sqlalchemy import Engine, event, select, update

from coordinator.config.clp import CompressionCoordinator
from coordinator.lifecycle import EDGES, JobStatus
from coordinator.service.driven import Loop
from coordinator.service.lease_keeper import TAKE_OVER_SCANS_PER_LEASE, LeaseKeeper
from coordinator.spider.port import SpiderPort
from coordinator.store import leases
from coordinator.store.jobs import JobStore
from coordinator.store.schema import compression_jobs as _jobs
from tests.test_submit_cost_reads import _blob

LEASE = timedelta(seconds=30)


def _keeper(
    store: JobStore,
    max_concurrent_jobs: int = 1000,
    monotonic: Callable[[], float] = time.monotonic,
) -> LeaseKeeper:
    loop = Loop(
        store=store,
        spider=cast(SpiderPort, object()),  # a claim never calls the engine
        settings=CompressionCoordinator(max_concurrent_jobs=max_concurrent_jobs),
        instance_id="a",
        cleanup_task=True,
        monotonic=monotonic,
    )
    return LeaseKeeper(loop, lease_duration=LEASE, owns_undecodable_jobs=False, leaves_job=None)


@contextmanager
def _commits(engine: Engine) -> Iterator[list[int]]:
    seen: list[int] = []

    def record(_: Any) -> None:
        seen.append(1)

    event.listen(engine, "commit", record)
    try:
        yield seen
    finally:
        event.remove(engine, "commit", record)


def _three_kinds(store: JobStore) -> tuple[int, int, int]:
    """A job to submit, a Pending row recording Spider job 9, a Running job whose lease lapsed."""
    pending, recorded, running = (store.create_job(_blob(1, [1], "web")) for _ in range(3))
    with store.engine.begin() as connection:
        connection.execute(update(_jobs).where(_jobs.c.id == recorded).values(spider_id=9))
        connection.execute(
            update(_jobs)
            .where(_jobs.c.id == running)
            .values(
                status=int(JobStatus.RUNNING),
                spider_id=5,
                lease_owner="dead",
                lease_epoch=2,
                lease_expires_at=store.clock() - timedelta(minutes=1),
            )
        )
    return pending, recorded, running


def test_a_tick_claims_every_kind_of_job_in_one_transaction(store: JobStore) -> None:
    pending, recorded, running = _three_kinds(store)
    keeper = _keeper(store)
    with _commits(store.engine) as commits:
        assert keeper.claim() == 3
    assert len(commits) == 1
    driven = keeper.loop.driven
    assert {job_id: (job.status, job.epoch, job.spider_id) for job_id, job in driven.items()} == {
        pending: (JobStatus.PENDING, 1, None),
        recorded: (JobStatus.PENDING, 1, 9),
        running: (JobStatus.RUNNING, 3, 5),
    }
    with store.engine.connect() as connection:
        owners = dict(connection.execute(select(_jobs.c.id, _jobs.c.lease_owner)).all())
    assert owners == {pending: "a", recorded: "a", running: "a"}
    with _commits(store.engine) as commits:  # nothing left: still one transaction, no claim
        assert keeper.claim() == 0
    assert len(commits) == 1


def test_a_claim_at_capacity_opens_no_transaction(store: JobStore) -> None:
    store.create_job(_blob(1, [1], "web"))
    keeper = _keeper(store, max_concurrent_jobs=1)
    assert keeper.claim() == 1
    with _commits(store.engine) as commits:
        assert keeper.claim() == 0
    assert commits == []


def test_a_claim_that_fails_claims_nothing(store: JobStore) -> None:
    pending, recorded, running = _three_kinds(store)
    keeper = _keeper(store)

    def failing(job_id: int, clp_config: bytes) -> bool:
        if job_id == pending:
            raise RuntimeError("a bug in the ownership check")
        return True

    keeper._is_ours = failing  # type: ignore[method-assign]
    with pytest.raises(RuntimeError):
        keeper.claim()
    assert keeper.loop.driven == {}
    with store.engine.connect() as connection:
        rows = connection.execute(select(_jobs.c.id, _jobs.c.lease_owner, _jobs.c.lease_epoch))
        assert {row.id: (row.lease_owner, row.lease_epoch) for row in rows} == {
            pending: (None, 0),
            recorded: (None, 0),
            running: ("dead", 2),  # the take-over rolled back with the rest
        }


def test_the_pending_claims_skip_only_the_driven_jobs_still_pending(
    store: JobStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every tick's Pending claims send the ids to skip: with up to 1,000 jobs in flight, only
    the driven jobs still Pending belong there (no edge leads back into Pending), and a driven
    job that moved on is still never claimed again (its row is not Pending)."""
    assert not [edge for edge in EDGES if edge.dest is JobStatus.PENDING]
    jobs = [store.create_job(_blob(1, [1], "web")) for _ in range(5)]
    keeper = _keeper(store, max_concurrent_jobs=4)
    assert keeper.claim() == 4
    claimed = sorted(keeper.loop.driven)
    moved_on = claimed[:3]
    with store.engine.begin() as connection:  # as their 'submitted' moves leave them
        connection.execute(
            update(_jobs)
            .where(_jobs.c.id.in_(moved_on))
            .values(status=int(JobStatus.RUNNING), spider_id=70)
        )
    for job_id in moved_on:
        keeper.loop.driven[job_id].status = JobStatus.RUNNING
    del keeper.loop.driven[claimed[3]]  # a place frees up; its row stays Pending, leased to "a"

    skips: list[set[int]] = []
    real = leases.claim_pending

    def recording(*args: Any, **kwargs: Any) -> Any:
        skips.append(set(kwargs["skip"]))
        return real(*args, **kwargs)

    monkeypatch.setattr(leases, "claim_pending", recording)
    assert keeper.claim() == 1
    assert skips == [set()]  # one read of the Pending rows; none of the driven jobs is Pending
    newly = set(keeper.loop.driven) - set(moved_on)
    assert newly in ({claimed[3]}, {jobs[4]})  # a Pending row; never one that moved on
    assert set(moved_on) <= set(keeper.loop.driven)
    assert all(keeper.loop.driven[job_id].epoch == 1 for job_id in moved_on)


def _lapsed(store: JobStore, spider_id: int) -> int:
    """A Running job whose coordinator died (its lease lapsed a minute ago)."""
    job_id = store.create_job(_blob(1, [1], "web"))
    with store.engine.begin() as connection:
        connection.execute(
            update(_jobs)
            .where(_jobs.c.id == job_id)
            .values(
                status=int(JobStatus.RUNNING),
                spider_id=spider_id,
                lease_owner="dead",
                lease_epoch=2,
                lease_expires_at=store.clock() - timedelta(minutes=1),
            )
        )
    return job_id


def test_take_overs_are_looked_for_once_per_interval_not_every_tick(
    store: JobStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each look sends every driven job's id; a dead coordinator's job waits for its lease to
    expire anyway, so looking 30 times per lease duration instead of every tick costs it at most
    a thirtieth more. The first claim looks at once; a look whose claims failed is made again."""
    seconds = [0.0]
    keeper = _keeper(store, monotonic=lambda: seconds[0])
    looks: list[int] = []
    real = leases.take_over_in_flight

    def counted(*args: Any, **kwargs: Any) -> Any:
        looks.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(leases, "take_over_in_flight", counted)
    first = _lapsed(store, 81)
    assert keeper.claim() == 1 and first in keeper.loop.driven and len(looks) == 1

    second = _lapsed(store, 82)
    pending = store.create_job(_blob(1, [1], "web"))
    seconds[0] += 0.9  # within the interval: the Pending claims go on, no take-over look
    assert keeper.claim() == 1 and pending in keeper.loop.driven and len(looks) == 1
    seconds[0] += LEASE.total_seconds() / TAKE_OVER_SCANS_PER_LEASE
    assert keeper.claim() == 1 and second in keeper.loop.driven and len(looks) == 2

    third = _lapsed(store, 83)
    seconds[0] += LEASE.total_seconds()

    def failing(job_id: int, clp_config: bytes) -> bool:
        raise RuntimeError("a bug in the ownership check")

    store.create_job(_blob(1, [1], "web"))  # a Pending job the failing check is asked about
    monkeypatch.setattr(keeper, "_is_ours", failing)
    with pytest.raises(RuntimeError):
        keeper.claim()
    assert third not in keeper.loop.driven and len(looks) == 3
    monkeypatch.setattr(keeper, "_is_ours", lambda job_id, clp_config: True)
    assert keeper.claim() >= 1 and third in keeper.loop.driven and len(looks) == 4


def test_an_idle_claim_opens_no_transaction_until_a_job_is_pending(store: JobStore) -> None:
    """With no Pending row and nothing to take over, the claim is one read and no transaction
    (``leases.any_pending``; ``leases.anything_claimable`` when it looks for take-overs, as the
    first claim does): an idle coordinator claims every tick."""
    keeper = _keeper(store, max_concurrent_jobs=4)
    with _commits(store.engine) as commits:
        assert keeper.claim() == 0  # the first claim, which looks for take-overs
        assert keeper.claim() == 0
        assert keeper.claim() == 0
    assert commits == []
    assert not keeper.filled_capacity
    job = store.create_job(_blob(1, [1], "web"))
    with _commits(store.engine) as commits:
        assert keeper.claim() == 1
    assert len(commits) == 1 and list(keeper.loop.driven) == [job]


def test_a_pending_job_another_coordinator_holds_takes_the_claims_transaction(
    store: JobStore,
) -> None:
    """The cheap read sees every Pending row, leased or not: the claim's transaction then decides
    (here: nothing is claimable while another coordinator's lease runs)."""
    keeper = _keeper(store, max_concurrent_jobs=4)
    assert keeper.claim() == 0
    job = store.create_job(_blob(1, [1], "web"))
    with store.engine.begin() as connection:
        connection.execute(
            update(_jobs)
            .where(_jobs.c.id == job)
            .values(lease_owner="b", lease_epoch=1, lease_expires_at=store.clock() + LEASE)
        )
    with _commits(store.engine) as commits:
        assert keeper.claim() == 0
    assert len(commits) == 1 and keeper.loop.driven == {}


def test_an_idle_look_for_take_overs_takes_a_lapsed_lease(store: JobStore) -> None:
    """While nothing is driven, the look for take-overs reads first; an in-flight row whose lease
    lapsed makes it take the claim's transaction, which takes the job over."""
    clock = [0.0]
    keeper = _keeper(store, max_concurrent_jobs=4, monotonic=lambda: clock[0])
    with _commits(store.engine) as commits:
        assert keeper.claim() == 0
    assert commits == []
    _, _, running = _three_kinds(store)
    with store.engine.begin() as connection:  # only the lapsed Running job is left to claim
        connection.execute(update(_jobs).where(_jobs.c.id != running).values(status=2))
    assert keeper.claim() == 0  # no look for take-overs due: the Pending probe finds nothing
    clock[0] += LEASE.total_seconds() / TAKE_OVER_SCANS_PER_LEASE
    with _commits(store.engine) as commits:
        assert keeper.claim() == 1
    assert len(commits) == 1 and list(keeper.loop.driven) == [running]
