"""The loop's reads every polling interval (``coordinator.store.polling_reads``): what they find
on both backends (their connection: ``tests/test_kept_connection.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import insert, update

from coordinator.lifecycle import JobStatus
from coordinator.store.jobs import JobStore
from coordinator.store.leases import cancel_requests
from coordinator.store.polling_reads import PollingReads
from coordinator.store.schema import compression_jobs as _jobs

NOW = datetime(2026, 12, 7, 23, 0, 0, 500_000)


@pytest.fixture
def reads(store: JobStore) -> Iterator[PollingReads]:
    with closing(PollingReads(store.engine)) as polling_reads:
        yield polling_reads


def _job(store: JobStore, status: JobStatus, **lease: Any) -> int:
    with store.engine.begin() as connection:
        key = connection.execute(
            insert(_jobs).values(status=int(status), clp_config=b"x", **lease)
        ).inserted_primary_key
    assert key is not None
    return int(key[0])


def test_any_pending_sees_a_pending_row_whoever_holds_it(
    store: JobStore, reads: PollingReads
) -> None:
    assert not reads.any_pending()
    _job(store, JobStatus.RUNNING, spider_id=1)
    assert not reads.any_pending()
    _job(store, JobStatus.PENDING, lease_owner="b", lease_epoch=1, lease_expires_at=NOW)
    assert reads.any_pending()


@pytest.mark.parametrize(
    ("expires", "owner", "claimable"),
    [
        (NOW - timedelta(milliseconds=1), "b", True),  # lapsed a millisecond ago
        (NOW, "b", False),  # lapses only after now
        (NOW + timedelta(milliseconds=1), "b", False),
        (NOW + timedelta(seconds=30), "a", True),  # the asking coordinator's own (a restart)
    ],
)
def test_anything_claimable_compares_leases_as_the_claim_does(
    store: JobStore, reads: PollingReads, expires: datetime, owner: str, claimable: bool
) -> None:
    """The lease's expiry is compared with ``now`` to the millisecond on both backends."""
    job = _job(
        store,
        JobStatus.RUNNING,
        spider_id=7,
        lease_owner=owner,
        lease_epoch=1,
        lease_expires_at=expires,
    )
    assert reads.anything_claimable(owner="a", now=NOW) is claimable
    with store.engine.begin() as connection:  # without a Spider id, never taken over
        connection.execute(update(_jobs).where(_jobs.c.id == job).values(spider_id=None))
    assert not reads.anything_claimable(owner="a", now=NOW)
    _job(store, JobStatus.PENDING, lease_owner="b", lease_epoch=1, lease_expires_at=NOW)
    assert reads.anything_claimable(owner="a", now=NOW)


def test_cancel_requests_read_dense_and_sparse_ids_alike(
    store: JobStore, reads: PollingReads
) -> None:
    """A dense range of ids is read on the kept connection, sparse ids through the pool
    (``leases.cancel_requests``): both find exactly the requests of the ids asked about."""
    jobs = [_job(store, JobStatus.RUNNING, spider_id=index) for index in range(1, 41)]
    requested = set(jobs[::3])
    with store.engine.begin() as connection:
        connection.execute(
            update(_jobs).where(_jobs.c.id.in_(requested)).values(cancel_requested_at=NOW)
        )
    dense = jobs[5:25]
    sparse = [jobs[0], jobs[39]]
    assert reads.cancel_requests(dense) == requested.intersection(dense)
    assert reads.cancel_requests(sparse) == requested.intersection(sparse)
    assert reads.cancel_requests([]) == set()
    assert reads.cancel_requests(dense) == cancel_requests(store.engine, dense)
