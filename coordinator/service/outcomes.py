"""The outcome handler: poll Spider, react to its final word, settle the archives.

Each in-flight job is polled when due, backing off from ``result_polling.init`` to ``max``; a Ready
job (recorded, never started) is started. When Spider's state is terminal, or Spider no longer
knows the job, the row is read and the reaction looked up in
``coordinator.lifecycle.reactions.REACTIONS`` (the table, generated, is in ``docs/lifecycle.md``).
Then the archives of the ended job are settled (``coordinator.service.cleanup``): whoever ended it,
a Failed or Killed job keeps nothing published and no stored file, a Succeeded job keeps exactly
what it published. A periodic sweep repeats this for late task instances, and hourly the archive
storage is reconciled on a thread of its own.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy.exc import SQLAlchemyError

from coordinator.archive_storage import ArchiveOutputSettings
from coordinator.lifecycle import (
    GIVING_UP,
    JobStatus,
    Outcome,
    Reaction,
    reaction_to,
)
from coordinator.service import crashpoints
from coordinator.service.cleanup import (
    RECONCILE_INTERVAL_SECS,
    ReconciliationLog,
    finish_settlement,
    settle_archives,
    settle_unattributed_archives,
    terminal_jobs_with_stored_archives,
)
from coordinator.service.driven import DrivenJob, Loop
from coordinator.service.logs import LOOP_LOGGER, job_fields
from coordinator.spider.port import (
    JobNotFound,
    JobState,
    SpiderError,
    cancel_if_safe,
    start_if_ready,
)
from coordinator.store.database import is_transient, reading
from coordinator.store.stored_archives import records_of_jobs

_log = logging.getLogger(LOOP_LOGGER)

SWEEP_INTERVAL_SECS = 60.0
MISSING_CLEANUP_TASK = re.compile(r"TaskNotFound.*compression::cleanup", re.DOTALL)
"""Spider's error when the workers' task package has no ``compression::cleanup`` (CLP's own)."""
MISSING_CLEANUP_HINT = (
    ". The Spider workers have no compression::cleanup task (CLP's own task package runs there): "
    "unset coordinator.cleanup_task, which is for workers running this coordinator's package "
    "(`coordinator spider serve`)"
)


@dataclass(frozen=True)
class Ended:
    """Spider's final word on a polled job: its terminal state, ``None`` when Spider no longer
    knows the job."""

    job: DrivenJob
    state: JobState | None


_OUTCOMES = {
    JobState.SUCCEEDED: Outcome.SUCCEEDED,
    JobState.FAILED: Outcome.FAILED,
    JobState.CANCELLED: Outcome.CANCELLED,
}


class OutcomeHandler:
    """Polls the driven in-flight jobs and concludes them."""

    def __init__(
        self,
        loop: Loop,
        *,
        archive_output: ArchiveOutputSettings,
    ) -> None:
        self.loop = loop
        self.archive_output = archive_output
        self._next_sweep = 0.0
        self._next_reconcile: float | None = None
        self._reconciler: threading.Thread | None = None
        self._reconciliation_log = ReconciliationLog()

    def poll(self, job: DrivenJob) -> Ended | None:
        """Poll one in-flight job; Spider's final word when it has one (``conclude`` it next).

        A Spider error is not an outcome: the job backs off and is polled again. Safe on any
        thread (the tick polls in a pool); raises nothing but a bug.
        """
        assert job.spider_id is not None
        try:
            state: JobState | None = self.loop.spider.get_job_state(job.spider_id)
        except JobNotFound:
            state = None
        except SpiderError as error:
            _log.warning("Spider unavailable: %s", error, extra=job.log())
            self._back_off(job)
            return None
        if state is JobState.READY:
            try:
                start_if_ready(self.loop.spider, job.spider_id)
            except SpiderError as error:
                _log.warning("StartJob failed: %s", error, extra=job.log())
            self._back_off(job)
            return None
        if state is not None and not state.is_terminal:
            self._back_off(job)
            return None
        return Ended(job, state)

    def _back_off(self, job: DrivenJob) -> None:
        job.next_poll = self.loop.monotonic() + job.backoff_ms / 1000
        job.backoff_ms = min(
            job.backoff_ms * 2, self.loop.settings.result_polling.max_backoff_millisecs
        )

    def conclude(self, ended: Sequence[Ended]) -> None:
        """React to Spider's final word on each of ``ended``, from the rows read in one query, and
        settle their archives; none of them is driven afterwards.

        The finalising moves (Committed → Succeeded, the common end) are made in one transaction
        (``Loop.finalise``), each still its own guarded move with its evidence, history row and
        settlement (the move's UPDATE ends the lease); every other reaction, and a finalisation
        whose evidence has a gap, is made on its own. Raises the driver's errors and a job's own
        failure (the caller then concludes each job alone, to tell which one failed); a finalising
        transaction that fails leaves every job of it as it was.
        """
        if not ended:
            return
        crashpoints.crashpoint("finalising")
        rows = self.loop.store.states([item.job.job_id for item in ended])
        finalising: list[tuple[DrivenJob, Reaction]] = []
        alone: list[tuple[DrivenJob, Reaction, Outcome]] = []
        for item in ended:
            job, current = item.job, rows.get(item.job.job_id)
            if current is None:  # gone, or a status no one defines: left alone
                self.loop.driven.pop(job.job_id, None)
                continue
            job.status = current
            outcome = self._outcome(item.state)
            reaction = reaction_to(outcome, current)
            if reaction.on_evidence:
                finalising.append((job, reaction))
            else:
                alone.append((job, reaction, outcome))
        self.loop.finalise_or_unpublish(finalising)
        for job, reaction, outcome in alone:
            moves = reaction.trigger is not None
            error = self._spider_error(job) if moves and outcome is Outcome.FAILED else ""
            self.loop.react(job, reaction, error=error)
        self.clean_up_all([item.job for item in ended])

    @staticmethod
    def _outcome(state: JobState | None) -> Outcome:
        return Outcome.UNKNOWN if state is None else _OUTCOMES[state]

    def _spider_error(self, job: DrivenJob) -> str:
        assert job.spider_id is not None
        try:
            error = self.loop.spider.get_job_error(job.spider_id)
        except SpiderError as failure:
            return f"<failed to fetch job error: {failure}>"
        if self.loop.cleanup_task and MISSING_CLEANUP_TASK.search(error):
            return error + MISSING_CLEANUP_HINT
        return error

    def give_up(self, job: DrivenJob, message_fields: dict[str, object]) -> None:
        """End ``job`` Failed from whatever state it is in (``GIVING_UP``); a Running job's
        Spider job is cancelled first. Raises the driver's errors."""
        reaction = GIVING_UP.get(job.status)
        if reaction is None:
            self.loop.driven.pop(job.job_id, None)
            return
        if job.status is JobStatus.RUNNING:
            assert job.spider_id is not None
            try:
                cancel_if_safe(self.loop.spider, job.spider_id, cleanup_task=self.loop.cleanup_task)
            except SpiderError as error:
                _log.warning("could not cancel the Spider job: %s", error, extra=job.log())
        self.loop.react(job, reaction, **message_fields)
        self.clean_up(job)

    def clean_up_all(self, jobs: Sequence[DrivenJob]) -> None:
        """``clean_up`` of each of ``jobs`` that has anything to settle, found in one read.

        A job that its terminal move did not settle (another writer ended it: CLP's own commit
        task writes SUCCEEDED itself) and that has no archive record, nor its Spider job a record
        naming no job, has nothing to settle: no file to remove, nothing of it to withdraw or mark
        (withdrawal and evidence go by the records). With CLP's task package no job has records,
        so this read replaces five statements per concluded job. A record stored later (a late
        instance) is the sweep's, as before. Raises as ``clean_up``.
        """
        unsettled = [job for job in jobs if job.spider_id is not None and job.settled is None]
        if not unsettled:  # every move settled its job (the embedded engine's common end)
            for job in jobs:
                self.clean_up(job)
            return
        try:
            with reading(self.loop.engine) as connection:
                found = records_of_jobs(connection, [(j.job_id, j.spider_id) for j in unsettled])
        except SQLAlchemyError as error:
            if is_transient(error):
                raise
            _log.exception("reading the ended jobs' archive records failed; settling each")
            found = {}
        idle = {
            job_id
            for job_id, of_job in found.items()
            if not of_job.records and not of_job.unattributed
        }
        for job in jobs:
            if job.job_id not in idle:  # only unsettled jobs were read
                self.clean_up(job)

    def clean_up(self, job: DrivenJob) -> None:
        """Settle the archives of a job that just ended (or, when its terminal move settled the
        records, remove the files it claimed); the sweep retries what fails here.

        A database outage is raised, so the tick fails and the loop logs the outage once.
        """
        if job.spider_id is None:
            return
        try:
            if job.settled is not None:  # in the terminal move's transaction: files are left
                settled = finish_settlement(self.loop.engine, self.archive_output, job.settled)
                job.settled = None
            else:
                settled = settle_archives(self.loop.engine, job.job_id, self.archive_output)
        except SQLAlchemyError as error:
            if is_transient(error):
                raise
            _log.exception("clean-up failed; the sweep will retry", extra=job.log())
            return
        if settled.removed:
            _log.info("removed %d unpublished archive(s)", settled.removed, extra=job.log())

    def sweep_due(self) -> bool:
        """Whether a sweep is due now (every ``SWEEP_INTERVAL_SECS``); schedules the next one."""
        now = self.loop.monotonic()
        if now < self._next_sweep:
            return False
        self._next_sweep = now + SWEEP_INTERVAL_SECS
        return True

    def sweep(self) -> None:
        """Settle the archives of ended jobs this loop did not conclude, and start the hourly
        reconciliation when it is due. Raises the driver's errors."""
        grace = self.loop.store.clock() - timedelta(seconds=SWEEP_INTERVAL_SECS)
        for job_id in terminal_jobs_with_stored_archives(self.loop.engine, grace):
            if job_id in self.loop.driven:
                continue
            settled = settle_archives(self.loop.engine, job_id, self.archive_output)
            if settled.removed:
                _log.info(
                    "sweep removed %d archive(s)", settled.removed, extra=job_fields(job_id, None)
                )
        orphans = settle_unattributed_archives(self.loop.engine, self.archive_output, grace)
        if orphans:
            _log.info("sweep removed %d archive(s) no job can publish any more", orphans)
        self._reconcile(self.loop.monotonic())

    def _reconcile(self, now: float) -> None:
        """Every hour (the first a sweep interval after the start), list the archive storage and
        log one line about entries without a record, on a thread of its own: a large bucket must
        not hold up the loop (leases, polls)."""
        if self._next_reconcile is None:
            self._next_reconcile = now + SWEEP_INTERVAL_SECS
        if now < self._next_reconcile or (self._reconciler and self._reconciler.is_alive()):
            return
        self._next_reconcile = now + RECONCILE_INTERVAL_SECS
        self._reconciler = threading.Thread(
            target=self._reconciliation_log.run,
            args=(self.loop.engine, self.archive_output),
            name="archive reconciliation",
            daemon=True,
        )
        self._reconciler.start()
