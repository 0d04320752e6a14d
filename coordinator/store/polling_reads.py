"""The reads the loop makes every polling interval, one request each on a kept connection
(``kept_connection``).

Every ``job_polling_interval_millisecs`` (200 ms by default, as CLP's Rust coordinator reads in
``coordination.rs``, ``fetch_new_job_rows``) the loop asks whether a Pending job exists (and once
a second whether a lease lapsed) while it has free places, and which of the jobs it drives an
operator asked to cancel while it drives any. An idle coordinator does little else, so the first
two are nearly all of its CPU (``docs/performance.md``).
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, Select, and_, or_, select

from coordinator.lifecycle import IN_FLIGHT_STATUS_VALUES, JobStatus
from coordinator.store.expressions import in_constants
from coordinator.store.kept_connection import KeptConnection
from coordinator.store.leases import (
    CANCEL_REQUESTED_BETWEEN,
    cancel_requests,
    claimable_lease,
    dense_range,
)
from coordinator.store.schema import compression_jobs as _jobs

_ANY_PENDING: Select[Any] = (
    select(_jobs.c.id).where(_jobs.c.status == int(JobStatus.PENDING)).limit(1)
)

_ANYTHING_CLAIMABLE: Select[Any] = (
    select(_jobs.c.id)
    .where(
        or_(
            _jobs.c.status == int(JobStatus.PENDING),
            and_(
                in_constants(_jobs.c.status, IN_FLIGHT_STATUS_VALUES),
                _jobs.c.spider_id.is_not(None),
                claimable_lease(),
            ),
        )
    )
    .limit(1)
)
"""Parameters ``now`` and ``owner``."""


class PollingReads:
    """The loop's reads (see the module docstring); the loop thread's alone."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._connection = KeptConnection(engine)
        self._any_pending = self._connection.prepare(_ANY_PENDING)
        self._anything_claimable = self._connection.prepare(_ANYTHING_CLAIMABLE)
        self._cancel_requested_between = self._connection.prepare(CANCEL_REQUESTED_BETWEEN)

    def any_pending(self) -> bool:
        """Whether any job is Pending, whoever holds its lease: one indexed read (``JOB_STATUS``).
        Raises the driver's errors as SQLAlchemy's ``DBAPIError``."""
        return self._connection.finds(self._any_pending, {})

    def anything_claimable(self, *, owner: str, now: datetime) -> bool:
        """Whether a claim that also looks for take-overs could find anything: a Pending row
        (whoever holds its lease), or an in-flight one ``leases.take_over_in_flight`` may take
        (its lease expired, or ``owner``'s). A superset of what the claim takes, so ``False``
        means the claim would take nothing. Raises the driver's errors as ``DBAPIError``."""
        return self._connection.finds(self._anything_claimable, {"owner": owner, "now": now})

    def cancel_requests(self, job_ids: Collection[int]) -> set[int]:
        """Which of ``job_ids`` have a cancel request (``leases.cancel_requests``): ids dense
        enough to be read as a range are read on the kept connection. Raises ``DBAPIError``."""
        if not job_ids:
            return set()
        dense = dense_range(job_ids)
        if dense is None:
            return cancel_requests(self.engine, job_ids)
        asked = set(job_ids)
        rows = self._connection.rows(self._cancel_requested_between, dense)
        return {row[0] for row in rows if row[0] in asked}

    def close(self) -> None:
        """Close the kept connection (a later read opens another)."""
        self._connection.close()
