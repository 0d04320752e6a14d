"""The reads an idle coordinator makes every polling interval, one request each on a kept
connection (``kept_connection``).

An idle coordinator asks every ``job_polling_interval_millisecs`` (200 ms by default, as CLP's
Rust coordinator reads in ``coordination.rs``, ``fetch_new_job_rows``) whether a Pending job
exists, and once a second whether a lease lapsed; that is nearly all it does, so these two reads
are nearly all of its CPU (``docs/performance.md``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Engine, Select, and_, or_, select

from coordinator.lifecycle import IN_FLIGHT_STATUS_VALUES, JobStatus
from coordinator.store.expressions import in_constants
from coordinator.store.kept_connection import KeptConnection
from coordinator.store.leases import claimable_lease
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


class IdleReads:
    """The idle coordinator's two reads (see the module docstring); one thread's at a time."""

    def __init__(self, engine: Engine) -> None:
        self._connection = KeptConnection(engine)
        self._any_pending = self._connection.prepare(_ANY_PENDING)
        self._anything_claimable = self._connection.prepare(_ANYTHING_CLAIMABLE)

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

    def close(self) -> None:
        """Close the kept connection (a later read opens another)."""
        self._connection.close()
