"""Batched claims, take-overs and renewals (``coordinator.store.leases``) stay fenced row by row.

One statement takes or renews many leases, yet each row is still compared and set on the epoch it
was read with: a row that moved on (another coordinator took it, or the epoch changed) is neither
claimed nor renewed, and the others are. On SQLite and MariaDB.
"""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import Engine, select, update

from coordinator.lifecycle import JobStatus
from coordinator.store import leases
from coordinator.store.jobs import JobStore
from coordinator.store.schema import compression_jobs as _jobs

LEASE = timedelta(seconds=30)


def _pending(store: JobStore, count: int) -> list[int]:
    return [store.create_job(b"blob-%d" % index) for index in range(count)]


def _row(engine: Engine, job_id: int) -> dict[str, object]:
    with engine.connect() as connection:
        return dict(connection.execute(select(_jobs).where(_jobs.c.id == job_id)).one()._mapping)


def _claim(store: JobStore, owner: str, limit: int, **options: object) -> list[leases.Lease]:
    with store.engine.begin() as connection:
        return leases.claim_pending(
            connection,
            owner=owner,
            lease=LEASE,
            now=store.clock(),
            limit=limit,
            is_ours=lambda job_id, blob: True,
            **options,  # type: ignore[arg-type]
        )


def test_a_batched_claim_takes_each_row_once_at_its_next_epoch(store: JobStore) -> None:
    ids = _pending(store, leases.BATCH + 37)  # more than one batch
    claimed = _claim(store, "a", len(ids))
    assert sorted(lease.job_id for lease in claimed) == ids
    for lease in claimed:
        row = _row(store.engine, lease.job_id)
        assert lease.epoch == row["lease_epoch"] == 1
        assert row["lease_owner"] == "a" and row["dispatch_time"] is not None
        assert lease.clp_config == row["clp_config"] and lease.status is JobStatus.PENDING
    # Another coordinator finds nothing left; the owner's own rows are skipped when asked.
    assert _claim(store, "b", len(ids)) == []
    assert _claim(store, "a", len(ids), skip=ids) == []


def test_a_batched_claim_respects_the_limit_and_the_refusals(store: JobStore) -> None:
    ids = _pending(store, 30)
    refused = set(ids[::3])
    with store.engine.begin() as connection:
        claimed = leases.claim_pending(
            connection,
            owner="a",
            lease=LEASE,
            now=store.clock(),
            limit=10,
            is_ours=lambda job_id, blob: job_id not in refused,
        )
    taken = [lease.job_id for lease in claimed]
    assert taken == [job_id for job_id in ids if job_id not in refused][:10]
    for job_id in refused:
        row = _row(store.engine, job_id)
        assert row["lease_owner"] is None and row["lease_epoch"] == 0  # never written (H1)


def test_a_row_that_moved_on_since_it_was_read_is_not_taken(store: JobStore) -> None:
    ids = _pending(store, 6)
    with store.engine.connect() as connection:
        rows = connection.execute(
            select(_jobs.c.id, _jobs.c.lease_epoch).where(_jobs.c.id.in_(ids)).order_by(_jobs.c.id)
        ).all()
    stolen = ids[2]
    with store.engine.begin() as connection:  # another coordinator took it meanwhile
        connection.execute(
            update(_jobs)
            .where(_jobs.c.id == stolen)
            .values(lease_owner="b", lease_epoch=_jobs.c.lease_epoch + 1)
        )
    with store.engine.begin() as connection:
        taken = leases._take_all(
            connection, rows, "a", store.clock() + LEASE, dispatch_at=store.clock()
        )
    assert taken == set(ids) - {stolen}
    assert _row(store.engine, stolen)["lease_owner"] == "b"
    assert _row(store.engine, stolen)["lease_epoch"] == 1
    assert all(_row(store.engine, job_id)["lease_epoch"] == 1 for job_id in taken)


def _in_flight(store: JobStore, ids: list[int], owner: str, expired: bool) -> None:
    now = store.clock()
    with store.engine.begin() as connection:
        connection.execute(
            update(_jobs)
            .where(_jobs.c.id.in_(ids))
            .values(
                status=int(JobStatus.RUNNING),
                spider_id=_jobs.c.id + 1000,
                lease_owner=owner,
                lease_epoch=3,
                lease_expires_at=now - LEASE if expired else now + LEASE,
            )
        )


def test_a_batched_take_over_takes_expired_and_own_leases_only(store: JobStore) -> None:
    expired, live, own = _pending(store, 40), _pending(store, 5), _pending(store, 7)
    _in_flight(store, expired, "dead", expired=True)
    _in_flight(store, live, "alive", expired=False)
    _in_flight(store, own, "a", expired=False)  # held by this name before a restart
    with store.engine.begin() as connection:
        taken = leases.take_over_in_flight(
            connection, owner="a", lease=LEASE, now=store.clock(), limit=100
        )
    assert sorted(lease.job_id for lease in taken) == sorted(expired + own)
    assert {lease.epoch for lease in taken} == {4}
    assert {lease.status for lease in taken} == {JobStatus.RUNNING}
    assert all(lease.spider_id == lease.job_id + 1000 for lease in taken)
    assert all(_row(store.engine, job_id)["lease_owner"] == "alive" for job_id in live)
    assert all(_row(store.engine, job_id)["lease_epoch"] == 3 for job_id in live)


def test_a_batched_renewal_reports_exactly_the_lost_leases(store: JobStore) -> None:
    ids = _pending(store, leases.BATCH + 11)
    claimed = {lease.job_id: lease.epoch for lease in _claim(store, "a", len(ids))}
    taken_over, stale = ids[4], ids[-1]
    with store.engine.begin() as connection:  # another coordinator took one over
        connection.execute(
            update(_jobs)
            .where(_jobs.c.id == taken_over)
            .values(lease_owner="b", lease_epoch=_jobs.c.lease_epoch + 1)
        )
    held = dict(claimed)
    held[stale] = 0  # an epoch this coordinator no longer holds
    expires = store.clock() + 2 * LEASE
    lost = leases.renew(store.engine, held, owner="a", expires=expires)
    assert lost == {taken_over, stale}
    renewed = [job_id for job_id in ids if job_id not in lost]
    assert all(_row(store.engine, job_id)["lease_expires_at"] == expires for job_id in renewed)
    assert _row(store.engine, taken_over)["lease_owner"] == "b"
    assert _row(store.engine, stale)["lease_expires_at"] != expires
    assert leases.renew(store.engine, {}, owner="a", expires=expires) == set()
