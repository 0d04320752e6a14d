"""The lease keeper: which jobs this coordinator drives.

It renews the leases of the driven jobs (a job whose lease another coordinator took over is
dropped at once), claims new ones up to ``max_concurrent_jobs`` minus the jobs already driven
(taken-over ones included, hazard H6 in ``docs/hazards.md``): first in-flight jobs whose
coordinator died, then Pending rows that already record a Spider job (claimed only to be ended),
then Pending ``s3_object_metadata`` jobs. Jobs of other input types are never written (H1). Every
later write for a job is fenced by the epoch its lease was taken with.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta

from sqlalchemy.exc import SQLAlchemyError

from coordinator import metrics
from coordinator.job_config import S3_OBJECT_METADATA, UndecodableJobConfig, peek_input_type
from coordinator.lifecycle import JobStatus
from coordinator.service import crashpoints
from coordinator.service.driven import DrivenJob, Loop
from coordinator.service.logs import LOOP_LOGGER, job_fields
from coordinator.service.prepare import dataset_of
from coordinator.store import leases

_log = logging.getLogger(LOOP_LOGGER)

TAKE_OVER_SCANS_PER_LEASE = 30
"""How often, per lease duration, the claims look for in-flight jobs to take over (each look
sends the ids of every driven job): once a second with 30 s leases. A dead coordinator's job
waits for its lease to expire before anyone may take it, so the wait grows by a thirtieth at
most; the first claim after start always looks (this coordinator's own jobs of before a restart)."""


class LeaseKeeper:
    """Claims, renews and releases the leases of the jobs in ``driven``."""

    def __init__(
        self,
        loop: Loop,
        *,
        lease_duration: timedelta,
        owns_undecodable_jobs: bool,
        leaves_job: Callable[[bytes], str | None] | None,
    ) -> None:
        self.loop = loop
        self.lease_duration = lease_duration
        self.owns_undecodable_jobs = owns_undecodable_jobs
        # Why an s3_object_metadata job is not this coordinator's after all (None: it is); the
        # embedded default leaves jobs that do not name its local object store (runtime.py).
        self.leaves_job = leaves_job
        self._foreign: set[int] = set()
        self._next_renewal = 0.0
        self._next_take_over = 0.0
        self.filled_capacity = True
        """Whether the last claim took a job for every free place (more Pending jobs may be
        waiting); so before the first claim, and while no place is free."""

    def renew(self) -> None:
        """Renew the leases every third of their duration; drop the jobs whose lease was lost.

        Raises SQLAlchemy's errors when the database is unavailable.
        """
        now = self.loop.monotonic()
        if now < self._next_renewal or not self.loop.driven:
            return
        self._next_renewal = now + self.lease_duration.total_seconds() / 3
        lost = leases.renew(
            self.loop.engine,
            {job.job_id: job.epoch for job in self.loop.driven.values()},
            owner=self.loop.instance_id,
            expires=self.loop.store.clock() + self.lease_duration,
        )
        metrics.LEASES_LOST.inc(len(lost))
        for job_id in lost:
            job = self.loop.driven.pop(job_id)
            _log.warning("lease lost: another coordinator took the job over", extra=job.log())

    def claim(self) -> int:
        """Claim up to the free capacity; how many jobs were claimed. Raises the driver's errors.

        The take-overs and the Pending claims share one transaction (one ``BEGIN IMMEDIATE`` on
        SQLite per tick): each row is still its own compare-and-set on its epoch, and nothing is
        driven before the transaction committed. The in-flight take-overs are looked for at the
        first claim and then ``TAKE_OVER_SCANS_PER_LEASE`` times per lease duration, not every
        tick.
        """
        capacity = self.loop.settings.max_concurrent_jobs - len(self.loop.driven)
        self.filled_capacity = capacity <= 0  # until this claim is known to have filled them
        if capacity <= 0:
            return 0
        now = self.loop.store.clock()
        owner = self.loop.instance_id
        # No edge leads into Pending, so of the driven jobs only those still Pending here can be
        # Pending rows: the others need no place in the Pending claims' list of ids to skip,
        # which every tick sends (and the server parses) while up to 1,000 jobs are in flight.
        driven_pending = [
            job_id for job_id, job in self.loop.driven.items() if job.status is JobStatus.PENDING
        ]
        pending_skip = self._foreign.union(driven_pending)
        looks_for_take_overs = self.loop.monotonic() >= self._next_take_over
        if not pending_skip and self._nothing_to_claim(looks_for_take_overs, owner, now):
            if looks_for_take_overs:
                self._schedule_next_take_over_look()
            self.filled_capacity = False
            return 0
        with self.loop.engine.begin() as connection:
            taken = []
            if looks_for_take_overs:
                taken = leases.take_over_in_flight(
                    connection,
                    owner=owner,
                    lease=self.lease_duration,
                    now=now,
                    limit=capacity,
                    skip=list(self.loop.driven),
                )
            # Pending rows that already record a Spider job are claimed only to be ended (never
            # submitted: the `submitted` edge would lose its race on every attempt).
            pending = leases.claim_pending(
                connection,
                owner=owner,
                lease=self.lease_duration,
                now=now,
                limit=capacity - len(taken),
                is_ours=self._is_ours,
                skip=pending_skip,
            )
        if looks_for_take_overs:  # once the claims committed: a failed look is made again
            self._schedule_next_take_over_look()
        recorded = sum(lease.spider_id is not None for lease in pending)
        metrics.CLAIMS.labels("taken_over").inc(len(taken))
        metrics.CLAIMS.labels("recorded").inc(recorded)
        metrics.CLAIMS.labels("pending").inc(len(pending) - recorded)
        init = self.loop.settings.result_polling.init_backoff_millisecs
        for lease in [*taken, *pending]:
            job = DrivenJob(
                job_id=lease.job_id,
                epoch=lease.epoch,
                status=lease.status,
                spider_id=lease.spider_id,
                dataset=dataset_of(lease.clp_config),
                clp_config=lease.clp_config,
                backoff_ms=init,
                cancel_requested=lease.cancel_requested,
            )
            self.loop.driven[job.job_id] = job
            verb = "took over" if lease.status is not JobStatus.PENDING else "claimed"
            _log.info("%s job (%s)", verb, lease.status.label, extra=job.log())
            crashpoints.crashpoint("claimed")
        total = len(taken) + len(pending)
        self.filled_capacity = total >= capacity
        return total

    def _schedule_next_take_over_look(self) -> None:
        interval = self.lease_duration.total_seconds() / TAKE_OVER_SCANS_PER_LEASE
        self._next_take_over = self.loop.monotonic() + interval

    def _nothing_to_claim(self, looks_for_take_overs: bool, owner: str, now: datetime) -> bool:
        """Whether one cheap read shows that the claim's transaction would take nothing; for a
        claim that knows of no Pending row (none driven, none left to others).

        An idle coordinator claims every tick, and the claim's transaction (two or three reads)
        was most of its CPU: without a look for take-overs, ``PollingReads.any_pending`` (no Pending
        row at all); with one, while nothing is driven (else this coordinator's own in-flight
        rows would always answer), ``PollingReads.anything_claimable`` (no Pending row, no in-flight
        row whose lease lapsed). A Pending row makes the claim's transaction decide, as before.
        """
        if not looks_for_take_overs:
            return not self.loop.reads.any_pending()
        if self.loop.driven:
            return False
        return not self.loop.reads.anything_claimable(owner=owner, now=now)

    def release_all(self) -> None:
        """Give up every lease now, so another coordinator (or the next start) continues at once."""
        held = {job.job_id: job.epoch for job in self.loop.driven.values()}
        if held:
            try:
                leases.release(
                    self.loop.engine, held, owner=self.loop.instance_id, now=self.loop.store.clock()
                )
            except SQLAlchemyError:
                _log.warning("could not release %d lease(s); they will expire", len(held))

    def forget_claimed_foreign_jobs(self) -> None:
        """Foreign jobs leave Pending once the legacy scheduler takes them; forget those, so the
        claim query's exclusion list stays as short as the foreign backlog."""
        self._foreign = leases.still_pending(self.loop.engine, self._foreign)

    def _is_ours(self, job_id: int, clp_config: bytes) -> bool:
        try:
            ours = peek_input_type(clp_config) == S3_OBJECT_METADATA
        except Exception as error:
            # Whatever a blob holds, failing to classify it makes the job undecodable (the
            # embedded default rejects it, a coordinator of a CLP deployment never writes it);
            # it never escapes into the claim.
            if not isinstance(error, UndecodableJobConfig):
                _log.warning("unclassifiable job config: %r", error, extra=job_fields(job_id, None))
            ours = self.owns_undecodable_jobs
        else:
            why = self._why_left(clp_config) if ours else None
            if why is not None:  # logged once: the job joins _foreign and is not looked at again
                ours = False
                _log.warning("%s", why, extra=job_fields(job_id, None))
        if not ours:
            self._foreign.add(job_id)
        return ours

    def _why_left(self, clp_config: bytes) -> str | None:
        """Why an ``s3_object_metadata`` job is left to others (``leaves_job``), or ``None``.

        When ``leaves_job`` fails, the job is left: it is not known to be this coordinator's.
        """
        if self.leaves_job is None:
            return None
        try:
            return self.leaves_job(clp_config)
        except Exception as error:
            return f"left Pending: cannot tell where its objects are ({error!r})"
