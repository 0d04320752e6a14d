"""Serving operators' cancel requests, on every tick (at least once per polling interval), until
the job ends.

The request (``cancel_requested_at``) is the only record of it: nothing in memory marks it
delivered, so whoever drives the job, a coordinator that took it over included, serves it again
until the job concludes, by Spider reporting Cancelled (→ Killed, rolled back if it was Committed)
or by ending otherwise (``coordinator.lifecycle.reactions``). A Pending job is killed at once.

A started job is cancelled through ``cancel_if_safe``. With a cleanup task in the graph (the
coordinator's own task package), Spider cancels Running and CommitReady alike, so the job moving
on between the state read and the call is harmless; a Ready one (recorded, never started) is
started first, since Spider cannot cancel a Ready job that has a cleanup task. A graph without a
cleanup task (CLP's own task package on a Spider cluster) is sent CancelJob only while Ready: a
started one may reach CommitReady between the read and the call, where CancelJob shuts a real
Spider's storage down. It is left to finish, and the cancel wins at its outcome (Spider Succeeded
→ Killed, whatever it published withdrawn).
"""

from __future__ import annotations

import logging

from coordinator.lifecycle import IN_FLIGHT_STATUSES, JobStatus, Trigger
from coordinator.service.driven import DrivenJob, Loop
from coordinator.service.logs import LOOP_LOGGER
from coordinator.service.submitter import CANCELLED_BEFORE_SUBMISSION
from coordinator.spider.port import (
    JobState,
    SpiderError,
    cancel_if_safe,
    start_if_ready,
)
from coordinator.store import leases

_log = logging.getLogger(LOOP_LOGGER)


class CancelServer:
    """Delivers the persisted cancel requests of the driven jobs."""

    def __init__(self, loop: Loop) -> None:
        self.loop = loop

    def serve(self) -> None:
        """Serve every driven job's request once. Raises the driver's errors."""
        for job_id in leases.cancel_requests(self.loop.engine, list(self.loop.driven)):
            job = self.loop.driven.get(job_id)
            if job is None:
                continue
            if job.status is JobStatus.PENDING:
                if job.spider_id is None:  # else a recorded Spider job: the submitter ends it
                    self.loop.move(
                        job, Trigger.CANCELLED, JobStatus.KILLED, CANCELLED_BEFORE_SUBMISSION
                    )
                continue
            if job.spider_id is not None and job.status in IN_FLIGHT_STATUSES:
                self._cancel_in_spider(job, job.spider_id)

    def _cancel_in_spider(self, job: DrivenJob, spider_id: int) -> None:
        try:
            state = cancel_if_safe(self.loop.spider, spider_id, cleanup_task=self.loop.cleanup_task)
            if state is JobState.READY and self.loop.cleanup_task:
                start_if_ready(self.loop.spider, spider_id)
                state = cancel_if_safe(
                    self.loop.spider, spider_id, cleanup_task=self.loop.cleanup_task
                )
        except SpiderError as error:
            # E.g. the job became terminal meanwhile (still cached): the poll concludes it.
            _log.warning("cancel request not delivered yet: %s", error, extra=job.log())
            job.next_poll = 0.0
            return
        if state is job.cancel_seen:
            return
        job.cancel_seen = state
        job.next_poll = 0.0
        if state is JobState.SUCCEEDED and self.loop.cleanup_task:
            _log.info("cancel requested after Spider's success: the job completes", extra=job.log())
        elif not self.loop.cleanup_task and not state.is_terminal:
            _log.info(
                "cancel requested; Spider job is %s and its graph has no cleanup task, so it is "
                "left to finish and the job ends Killed then",
                state.name,
                extra=job.log(),
            )
        else:
            _log.info("cancel requested; Spider job is %s", state.name, extra=job.log())
