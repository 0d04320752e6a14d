"""Serving operators' cancel requests, on every tick (at least once per polling interval), until
the job ends.

The request (``cancel_requested_at``) is the only record of it: nothing in memory marks it
delivered, so whoever drives the job, a coordinator that took it over included, serves it again
until the job concludes, by Spider reporting Cancelled (→ Killed, rolled back if it was Committed)
or by ending otherwise (``coordinator.lifecycle.reactions``). A Pending job is killed at once.

A started job whose task graph has a cleanup task (the coordinator's own task package) is cancelled
through ``cancel_if_safe``: Spider cancels Running and CommitReady alike, so the job moving on
between the state read and the call is harmless; a Ready one (recorded, never started) is started
first, since Spider cannot cancel a Ready job that has a cleanup task. Spider's Cancelled outcome
then ends it (→ Killed, rolled back if it was Committed).

A graph without a cleanup task (CLP's own task package on a Spider cluster) is never sent CancelJob
once started: it may reach CommitReady between the read and the call, where CancelJob shuts a real
Spider's storage down. The job is fenced instead, at once (``coordinator.lifecycle.FENCING``): a
Running row moves to Killed, after which every commit refuses (CLP's ``compression::commit``
selects the row ``FOR UPDATE`` by ``spider_id`` and bails unless it is RUNNING), and a Committed
one is rolled back. Spider finishes the job on its own and nothing reads its outcome; a Ready
Spider job (never started) is cancelled too, which is safe without a cleanup task. When the commit
wins the race (CLP's commit wrote SUCCEEDED first), the job stays Succeeded and ``show`` says the
cancel came after the commit.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from coordinator.lifecycle import FENCING, IN_FLIGHT_STATUSES, JobStatus, Trigger
from coordinator.service.driven import DrivenJob, Loop
from coordinator.service.logs import LOOP_LOGGER
from coordinator.service.submitter import CANCELLED_BEFORE_SUBMISSION
from coordinator.spider.port import (
    JobState,
    SpiderError,
    cancel_if_safe,
    start_if_ready,
)
from coordinator.store.guarded import Applied, LostRace

_log = logging.getLogger(LOOP_LOGGER)


class CancelServer:
    """Delivers the persisted cancel requests of the driven jobs."""

    def __init__(self, loop: Loop, *, clean_up: Callable[[DrivenJob], None]) -> None:
        self.loop = loop
        self.clean_up = clean_up
        """Settles an ended job's archives (``OutcomeHandler.clean_up``): a fenced job is never
        concluded, so its files are removed here (later instances' by the sweep)."""

    def serve(self) -> None:
        """Serve every driven job's request once. Raises the driver's errors."""
        for job_id in self.loop.reads.cancel_requests(list(self.loop.driven)):
            job = self.loop.driven.get(job_id)
            if job is None:
                continue
            if job.status is JobStatus.PENDING:
                if job.spider_id is None:  # else a recorded Spider job: the submitter ends it
                    self.loop.move(
                        job, Trigger.CANCELLED, JobStatus.KILLED, CANCELLED_BEFORE_SUBMISSION
                    )
                continue
            if job.spider_id is None or job.status not in IN_FLIGHT_STATUSES:
                continue
            if self.loop.cleanup_task:
                self._cancel_in_spider(job, job.spider_id)
            else:
                self._fence(job, job.spider_id)

    def _fence(self, job: DrivenJob, spider_id: int) -> None:
        """End a started job of a graph without a cleanup task at once (``FENCING``). Raises the
        driver's errors."""
        result = self.loop.react(job, FENCING[job.status])
        if isinstance(result, LostRace) and self._moved_on_to_fence(job, result):
            result = self.loop.react(job, FENCING[job.status])  # Committed: nothing moves it now
        if not isinstance(result, Applied):
            return
        self.clean_up(job)
        try:  # a Spider job that never started is cancelled rather than left Ready
            cancel_if_safe(self.loop.spider, spider_id, cleanup_task=False)
        except SpiderError as error:
            _log.info("the fenced job's Spider job is left to finish: %s", error, extra=job.log())

    def _moved_on_to_fence(self, job: DrivenJob, race: LostRace) -> bool:
        """Whether the row the fence missed can still be fenced: this coordinator's commit made it
        Committed meanwhile, under this coordinator's lease (the job is driven again). CLP's commit
        making it Succeeded first is the commit winning the race: the job stays Succeeded."""
        if race.state in FENCING and race.lease_epoch == job.epoch:
            job.status = race.state
            self.loop.driven[job.job_id] = job
            return True
        if race.state is JobStatus.SUCCEEDED:
            _log.info(
                "the cancel came after the commit: the job is Succeeded and stays so",
                extra=job.log(),
            )
        return False

    def _cancel_in_spider(self, job: DrivenJob, spider_id: int) -> None:
        """CancelJob, for a graph with a cleanup task (safe in Running and CommitReady; a Ready
        job is started first)."""
        try:
            state = cancel_if_safe(self.loop.spider, spider_id, cleanup_task=True)
            if state is JobState.READY:
                start_if_ready(self.loop.spider, spider_id)
                state = cancel_if_safe(self.loop.spider, spider_id, cleanup_task=True)
        except SpiderError as error:
            # E.g. the job became terminal meanwhile (still cached): the poll concludes it.
            _log.warning("cancel request not delivered yet: %s", error, extra=job.log())
            job.next_poll = 0.0
            return
        if state is job.cancel_seen:
            return
        job.cancel_seen = state
        job.next_poll = 0.0
        if state is JobState.SUCCEEDED:
            _log.info("cancel requested after Spider's success: the job completes", extra=job.log())
        else:
            _log.info("cancel requested; Spider job is %s", state.name, extra=job.log())
