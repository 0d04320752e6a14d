"""The coordinator loop: a scheduler over three parts, decisions from the row and Spider.

Each ``tick`` calls, in this order:

1. the **lease keeper** (``lease_keeper.py``): renew the leases of the driven jobs (a job another
   coordinator took over is dropped at once); every later write is fenced by the lease epoch;
2. the **cancel server** (``cancels.py``): serve operators' persisted cancel requests;
3. the lease keeper again: **claim** up to ``max_concurrent_jobs`` minus the jobs already driven
   (a tick that only ``wake`` caused does 2 and 3 at most once per polling interval, see
   ``Coordinator._reads_due``);
4. for each driven job that is due: the **submitter** (``submitter.py``) for a Pending job
   (prepare, register, record, start, state first; the submissions of up to
   ``SUBMISSION_BATCH`` jobs recorded in one transaction), the **outcome handler**
   (``outcomes.py``) polls an in-flight one; in-flight jobs are polled up to
   ``ADVANCE_CONCURRENCY`` at once, beside the submissions (in claim order), each job by one
   thread at a time, all ended with the tick;
5. the outcome handler **concludes** the jobs Spider ended, together: their rows read in one
   query, the reactions of ``coordinator.lifecycle.reactions``, the finalising moves in one
   transaction (each its own guarded move), the others alone (roll back, clean up);
6. the outcome handler's periodic **sweep** of ended jobs' archives.

The parts share one ``Loop`` (``driven.py``), through which every move goes: the edge's guarded
transition, fenced by the lease.

An error that is not an outage (a dataset table that cannot be created, an unexpected exception)
counts as a failed attempt of the job: attempts back off from 1 s doubling to 60 s, and after
``max_attempts`` the job ends Failed (``coordinator.lifecycle.reactions.GIVING_UP``). Outages
(database or Spider unavailable) are retried without limit and fail no job.

Between ticks the loop sleeps until the next poll is due (``job_polling_interval_millisecs`` at
most), or until ``wake`` is called: the embedded engine calls it when a Spider job ends, so that
job is polled at once instead of after its back-off.

A restart is not a special case: the next instance claims what is left (with a stable
``instance_id`` at once, else when the leases expire). A database or Spider outage makes a tick
fail or a call be retried later; no job state is written on a guess.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import timedelta
from functools import partial
from typing import TypeVar

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from coordinator import metrics
from coordinator.archive_storage import ArchiveOutputSettings
from coordinator.config.clp import CompressionCoordinator
from coordinator.lifecycle import JobStatus
from coordinator.service.cancels import CancelServer
from coordinator.service.driven import DrivenJob, Loop
from coordinator.service.lease_keeper import LeaseKeeper
from coordinator.service.logs import LOOP_LOGGER
from coordinator.service.outcomes import Ended, OutcomeHandler
from coordinator.service.prepare import PreparedJob
from coordinator.service.resource_group import ResourceGroup
from coordinator.service.submitter import Registered, RegistrationAnswer, Submitter
from coordinator.spider.port import SpiderPort
from coordinator.store.database import is_transient
from coordinator.store.jobs import JobStore
from coordinator.store.outage import Outage

_log = logging.getLogger(LOOP_LOGGER)

_T = TypeVar("_T")

MAX_ATTEMPT_BACKOFF_SECS = 60.0
SUBMISSION_BATCH = 16
"""How many Pending jobs a tick registers before it records their submissions in one transaction
and starts them: more saves commits, but the first of them starts later."""
WOKEN_TICK_SPACING_SECS = 0.05
"""The least time from one tick's start to a tick the engine's ``wake`` causes while the last
claim filled every free place (Pending jobs may be waiting for the places ending jobs free). When
jobs end one after another (a busy engine), the ones ending meanwhile are then concluded together,
in one finalising transaction, instead of each in a tick of its own with the tick's fixed reads
(issue 14: a quarter more jobs/s and a quarter less of the coordinator's CPU per job in P1b). The
wait is half the 100 ms of a poll's first back-off (``result_polling``), which a job ends within
without a wake."""
ENDINGS_SPACING_SECS = 0.15
"""The least time from the start of the last tick that concluded a job to a tick ``wake`` causes,
while no Pending job waits for a place (the last claim left places free). Jobs that end in a
stream (small jobs on a busy engine: one every 10-20 ms) are then concluded seven or so at a
time, which costs the loop's process a quarter to a third less CPU per job than two at a time
(issue 14, P1); a job that ends after a quieter spell, a big job's end above all, is concluded
at once. Concluding a job later frees no Spider worker later (the engine runs its queue on its
own), so only the job's ``Succeeded`` row waits, by at most this."""
ADVANCE_CONCURRENCY = 4
"""How many driven jobs a tick submits or polls at once (each job by one thread at a time): the
per-job work is mostly waiting for the database and Spider."""
CLUSTER_ADVANCE_CONCURRENCY = 1
"""``ADVANCE_CONCURRENCY`` on a Spider cluster (``runtime.open_runtime``): one poll thread beside
the loop's submissions. A cluster's GetJobState takes ~3 ms on a connection of its own
(``GrpcSpider`` gives each thread one), so one thread polls 64 jobs in about two hundred ms;
four polled no faster (200 jobs at 64 and 4 slots on ``../shared/spider-cluster``, alternated:
drain times within each other's noise) and cost ~5-10 % more CPU per job."""


def default_instance_id() -> str:
    """A name unique to this process: ``host:pid:random``."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class _Stopping(threading.Event):
    """``Coordinator.stopping``: setting it also wakes the loop from its pause."""

    def __init__(self, wakeup: threading.Event) -> None:
        super().__init__()
        self._wakeup = wakeup

    def set(self) -> None:
        super().set()
        self._wakeup.set()


@dataclass
class TickReport:
    """What a tick did (for ``--until-idle`` and progress displays)."""

    claimed: int = 0
    driven: int = 0
    concluded: list[int] = field(default_factory=list)


class Coordinator:
    """Drives ``s3_object_metadata`` compression jobs through Spider; see the module docstring."""

    def __init__(
        self,
        *,
        engine: Engine,
        spider: SpiderPort,
        settings: CompressionCoordinator,
        archive_output: ArchiveOutputSettings,
        instance_id: str | None = None,
        lease_duration: timedelta = timedelta(seconds=30),
        owns_undecodable_jobs: bool = False,
        max_attempts: int = 5,
        cleanup_task: bool = True,
        leaves_job: Callable[[bytes], str | None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        store: JobStore | None = None,
        advance_concurrency: int = ADVANCE_CONCURRENCY,
    ) -> None:
        """``clock`` is the loop's monotonic clock (schedules, back-offs); ``store`` the job store
        whose clock stamps the rows (default: ``JobStore(engine)``, the wall clock in UTC);
        ``advance_concurrency`` how many in-flight jobs a tick polls at once."""
        self.advance_concurrency = advance_concurrency
        self.engine = engine
        self.archive_output = archive_output
        self.max_attempts = max_attempts
        self.loop = Loop(
            store=store if store is not None else JobStore(engine),
            spider=spider,
            settings=settings,
            instance_id=instance_id or default_instance_id(),
            cleanup_task=cleanup_task,
            monotonic=clock,
        )
        # The loop's collaborators, read-only, for callers that assemble or inspect a coordinator.
        self.driven, self.store, self.spider = self.loop.driven, self.loop.store, spider
        self.settings, self.instance_id = settings, self.loop.instance_id
        self._wakeup = threading.Event()
        self._woken: deque[int] = deque()
        self._last_tick_started = -WOKEN_TICK_SPACING_SECS
        """``time.monotonic()`` when the last tick started (``_sleep`` spaces woken ticks)."""
        self._last_ending_tick_started = -ENDINGS_SPACING_SECS
        """``time.monotonic()`` when the last tick that concluded a job started."""
        self.stopping: threading.Event = _Stopping(self._wakeup)
        self.last_activity = self.loop.monotonic()
        """When the loop last started or ended a tick (or was built), on the loop's clock: the
        liveness check (``coordinator.service.health.loop_liveness``) reads it."""
        self._claim_retry_at = 0.0
        self._phase_failures = 0
        self._reads_due_at = 0.0
        """When a woken tick reads cancel requests and claims again (see ``_reads_due``)."""
        self.resource_group = ResourceGroup(engine, spider, settings.resource_group.name)
        self.leases = LeaseKeeper(
            self.loop,
            lease_duration=lease_duration,
            owns_undecodable_jobs=owns_undecodable_jobs,
            leaves_job=leaves_job,
        )
        self.submitter = Submitter(
            self.loop, resource_group=self.resource_group, attempt_failed=self._attempt_failed
        )
        self.outcomes = OutcomeHandler(self.loop, archive_output=archive_output)
        self.cancels = CancelServer(self.loop, clean_up=self.outcomes.clean_up)
        self._advancing: ThreadPoolExecutor | None = None
        """The pool that polls in-flight jobs; made by the first tick that needs it, shut down
        when ``run`` returns (its threads would otherwise idle until the process ends)."""

    def run(self, *, until_idle: bool = False) -> None:
        """Tick until ``stopping`` is set (or, with ``until_idle``, nothing is left to do)."""
        interval = self.settings.job_polling_interval_millisecs / 1000
        outage = Outage("the database", _log, clock=self.loop.monotonic)
        while not self.stopping.is_set():
            try:
                report = self.tick()
            except SQLAlchemyError as error:
                metrics.TICK_FAILURES.labels("database").inc()
                self._sleep(outage.failed(error))
                continue
            except Exception:
                # Nothing a row holds may stop the service: a bug outside one job's handling is
                # logged and the tick retried after a pause, like an outage.
                metrics.TICK_FAILURES.labels("unexpected").inc()
                _log.exception("unexpected error in a tick; retrying")
                self._sleep(max(interval, 1.0))
                continue
            outage.recovered()
            # A tick that concluded a job claimed before the job freed its place: tick again.
            if until_idle and not self.driven and report.claimed == 0 and not report.concluded:
                break
            self._sleep(self._pause(interval))
        self.release_leases()
        self.shut_down_pool()
        self.loop.reads.close()

    def shut_down_pool(self) -> None:
        """Stop the threads that poll in-flight jobs (a later tick makes new ones)."""
        if self._advancing is not None:
            self._advancing.shutdown(wait=True)
            self._advancing = None

    def wake(self, spider_id: int) -> None:
        """Poll the job of Spider job ``spider_id`` at once (its back-off is cut short), waking the
        loop if it is pausing. Safe from any thread: the embedded engine calls it when a job ends.
        """
        self._woken.append(spider_id)
        self._wakeup.set()

    def _sleep(self, seconds: float) -> None:
        """Pause for ``seconds``, or until ``wake`` is called or ``stopping`` is set; a wake is
        served no sooner than ``_woken_tick_at``."""
        if not self._woken and not self.stopping.is_set():
            self._wakeup.wait(seconds)
        if self._woken:
            # Real time, as the pause's: the spacing is a rate, not a deadline of the loop.
            spaced = self._woken_tick_at() - time.monotonic()
            if spaced > 0:
                self.stopping.wait(spaced)
        self._wakeup.clear()

    def _woken_tick_at(self) -> float:
        """The earliest ``time.monotonic()`` for a tick that ``wake`` causes.

        While Pending jobs may wait for places, ``WOKEN_TICK_SPACING_SECS`` after the last tick
        started; otherwise ``ENDINGS_SPACING_SECS`` after the last tick that concluded a job.
        """
        if self.leases.filled_capacity:
            return self._last_tick_started + WOKEN_TICK_SPACING_SECS
        return self._last_ending_tick_started + ENDINGS_SPACING_SECS

    def _due_woken(self) -> None:
        """Make the jobs ``wake`` named due now."""
        if not self._woken:
            return
        spider_ids = set()
        while self._woken:
            spider_ids.add(self._woken.popleft())
        now = self.loop.monotonic()
        for job in self.driven.values():
            if job.spider_id in spider_ids and job.status is not JobStatus.PENDING:
                job.next_poll = min(job.next_poll, now)

    def tick(self) -> TickReport:
        """One round of the loop; raises SQLAlchemy's errors when the database is unavailable.

        Measured (``coordinator.metrics``: its duration, the jobs driven after it, when it ended),
        and ``last_activity`` is set when it starts and when it ends (liveness).
        """
        started = time.perf_counter()
        self._last_tick_started = tick_started = time.monotonic()
        self.last_activity = self.loop.monotonic()
        try:
            report = self._tick()
            if report.concluded:
                self._last_ending_tick_started = tick_started
            return report
        finally:
            metrics.TICK_DURATION.observe(time.perf_counter() - started)
            metrics.JOBS_DRIVEN.set(len(self.driven))
            metrics.LAST_TICK.set_to_current_time()
            self.last_activity = self.loop.monotonic()

    def _tick(self) -> TickReport:
        report = TickReport()
        reads_due = self._reads_due()
        self._due_woken()
        self._guarded_phase("lease renewal", self.leases.renew)
        if reads_due:
            self.cancels.serve()
        claims_due = reads_due or self.leases.filled_capacity
        if (
            claims_due
            and not self.stopping.is_set()
            and self.loop.monotonic() >= self._claim_retry_at
        ):
            report.claimed = self._guarded_phase("claim", self.leases.claim) or 0
        if reads_due:
            self._reads_due_at = (
                self.loop.monotonic() + self.settings.job_polling_interval_millisecs / 1000
            )
        jobs = [
            job
            for job in self.driven.values()
            if not (self.stopping.is_set() and job.status is JobStatus.PENDING)
        ]
        if jobs:  # an idle tick ends here: it runs every polling interval
            ended = self._advance(jobs)
            self._conclude(ended)
            report.concluded.extend(item.job.job_id for item in ended)
            if ended:
                report.claimed += self._refill()
        if self.outcomes.sweep_due():
            self.leases.forget_claimed_foreign_jobs()
            self.outcomes.sweep()
        report.driven = len(self.driven)
        return report

    def _advance(self, jobs: list[DrivenJob]) -> list[Ended]:
        """Submit the Pending ``jobs`` and poll the in-flight ones that are due; the jobs Spider
        ended, in the order of ``jobs``.

        In-flight jobs are polled by the pool (``ADVANCE_CONCURRENCY`` at once) while this thread
        submits the Pending ones in claim order (Spider ids follow the claims): one job's Spider
        round trips do not wait for another's, and each job is polled by one thread. Every poll
        ends before this returns (a transient error included), so that the ended jobs are
        concluded together by this thread (one finalising transaction).
        """
        pending = [job for job in jobs if job.status is JobStatus.PENDING]
        # Only the jobs due are handed to the pool: a tick woken by one job's end would otherwise
        # queue a no-op for every other job in flight (a future each).
        now = self.loop.monotonic()
        polled = [
            job for job in jobs if job.status is not JobStatus.PENDING and now >= job.next_poll
        ]
        if polled and self._advancing is None:
            self._advancing = ThreadPoolExecutor(
                self.advance_concurrency, thread_name_prefix="advance"
            )
        pool = self._advancing
        # Each pool thread takes the next due job when its last poll is done (a future per
        # thread, not per job: up to 1,000 jobs are due after a quiet spell).
        due = deque(enumerate(polled))
        futures = (
            []
            if pool is None
            else [
                pool.submit(self._poll_each, due)
                for _ in range(min(len(polled), self.advance_concurrency))
            ]
        )
        try:
            for start in range(0, len(pending), SUBMISSION_BATCH):
                self._submit(pending[start : start + SUBMISSION_BATCH])
        finally:
            wait(futures)
        polls = sorted(
            (poll for future in futures for poll in future.result()), key=lambda poll: poll[0]
        )
        return [item for _, item in polls if item is not None]

    def _refill(self) -> int:
        """Claim and submit Pending jobs for the places the jobs this tick concluded freed, at
        once; how many were claimed.

        Only while the last claim filled every free place (``LeaseKeeper.filled_capacity``: more
        Pending jobs may be waiting); otherwise none was waiting then, and a new one is found by
        the next tick's claim, within ``job_polling_interval_millisecs`` as before. Without this
        a freed place waited for the next tick's claim: up to a whole polling interval after the
        job ended, the loop's pause when nothing else is due. CLP's Rust coordinator
        (``coordination.rs``, ``schedule_new_jobs``) refills on its polling interval, each job's
        handle holding a semaphore permit until its job ends.
        """
        if (
            not self.leases.filled_capacity
            or self.stopping.is_set()
            or self.loop.monotonic() < self._claim_retry_at
        ):
            return 0
        before = set(self.driven)
        claimed = self._guarded_phase("claim", self.leases.claim) or 0
        if claimed:
            new = [
                job
                for job_id, job in self.driven.items()
                if job_id not in before and job.status is JobStatus.PENDING
            ]
            for start in range(0, len(new), SUBMISSION_BATCH):
                self._submit(new[start : start + SUBMISSION_BATCH])
        return claimed

    def _reads_due(self) -> bool:
        """Whether this tick reads the cancel requests and claims Pending jobs.

        A tick that only ``wake`` caused (the embedded engine ends a job: about one tick per
        job, issue 14) skips both reads unless ``job_polling_interval_millisecs`` has passed
        since they last ran; so an operator's cancel request or a new job waits no longer than
        it does between the loop's own ticks. It still claims when the last claim filled every
        free place (``LeaseKeeper.filled_capacity``): the places the ended jobs free go to the
        waiting jobs at once. Every other tick reads, as does any tick while nothing is driven
        (``--until-idle`` ends only after a claim found nothing).
        """
        if not self._woken or not self.driven:
            return True
        return self.loop.monotonic() >= self._reads_due_at

    def release_leases(self) -> None:
        """Give up every lease now, so another coordinator (or the next start) continues at once."""
        self.leases.release_all()

    def _guarded_phase(self, name: str, phase: Callable[[], int | None]) -> int | None:
        """``phase()``; an error that is not the database's is logged and the claims back off.

        Database errors propagate (the whole tick waits). Anything else (a bug, or a row no check
        foresaw) must not stop the loop: the driven jobs are still advanced, and claiming resumes
        after a pause doubling from 1 s to 60 s.
        """
        try:
            result = phase()
        except SQLAlchemyError:
            raise
        except Exception:
            delay = min(MAX_ATTEMPT_BACKOFF_SECS, 2.0**self._phase_failures)
            self._phase_failures += 1
            _log.exception("unexpected error in the %s; claiming again in %.0f s", name, delay)
            self._claim_retry_at = self.loop.monotonic() + delay
            return None
        self._phase_failures = 0
        return result

    def _submit(self, jobs: list[DrivenJob]) -> None:
        """Register the due Pending ``jobs`` together, record their submissions in one
        transaction, then start their Spider jobs together (state first). An error that is not
        an outage counts as a failed attempt of its job; when registering, recording or starting
        together fails so, each job is registered, recorded or started alone, to tell which one
        failed."""
        registered = self._register(jobs)
        if not registered:
            return

        def record_each() -> None:
            for item in registered:
                self._guarded(item.job, partial(self.submitter.record_and_start, [item]))

        results = self._together(partial(self.submitter.record, registered), record_each)
        if results is None:
            return
        recorded = [
            item
            for item, result in zip(registered, results, strict=True)
            if self._guarded(item.job, partial(self.submitter.recorded, item, result))
        ]
        if not recorded:
            return

        def start_each() -> None:  # start_if_ready: a job started meanwhile is left as it is
            for item in recorded:
                self._guarded(item.job, partial(self.submitter.start_alone, item))

        self._together(partial(self.submitter.start, recorded), start_each)

    def _register(self, jobs: list[DrivenJob]) -> list[Registered]:
        """The registrations of the due ``jobs`` to record, in claim order: those an earlier,
        failed record left, and the new ones of one RegisterJob call for all the others
        (``Submitter.register_all``). Stopping registers nothing more."""
        steps: list[tuple[DrivenJob, Registered | PreparedJob]] = []
        now = self.loop.monotonic()
        due = [job for job in jobs if now >= job.retry_submit_at]
        # One read for the batch; should it fail for a reason that is not an outage, each job
        # reads alone, so that the error counts against the job it belongs to.
        ahead = self._together(partial(self.submitter.read_ahead, due), lambda: None)
        for job in due:
            if self.stopping.is_set():
                break
            step = self._guarded(job, partial(self.submitter.prepare, job, ahead))
            if step is not None:
                steps.append((job, step))
        to_register = [(job, step) for job, step in steps if isinstance(step, PreparedJob)]
        answers: dict[int, RegistrationAnswer] = {}
        if to_register and not self.stopping.is_set():
            answers = self._register_all(to_register)
        registered: list[Registered] = []
        for job, step in steps:
            if isinstance(step, Registered):
                registered.append(step)
            elif job.job_id in answers:
                answer = answers[job.job_id]
                item = self._guarded(job, partial(self.submitter.registered, job, step, answer))
                if item is not None:
                    registered.append(item)
        return registered

    def _register_all(
        self, to_register: list[tuple[DrivenJob, PreparedJob]]
    ) -> dict[int, RegistrationAnswer]:
        """RegisterJob's answer for each job of ``to_register``, by job id. When registering
        together fails without an outage, each job is registered alone (a failure then counts
        against its own job, which gets no answer)."""

        def register_each() -> Sequence[RegistrationAnswer | None]:
            answers: list[RegistrationAnswer | None] = []
            for job, prepared in to_register:
                alone = self._guarded(job, partial(self.submitter.register_all, [(job, prepared)]))
                answers.append(alone[0] if alone else None)
            return answers

        together = partial(self.submitter.register_all, to_register)
        answers = self._together(together, register_each) or []
        return {
            job.job_id: answer
            for (job, _), answer in zip(to_register, answers, strict=True)
            if answer is not None
        }

    def _together(
        self, together: Callable[[], _T], each_alone: Callable[[], _T | None]
    ) -> _T | None:
        """``together()``, a step of several jobs at once; when it fails for a reason that is not
        an outage, ``each_alone()`` instead, so that the error counts against the job it belongs
        to. An outage propagates: the whole tick waits for the database."""
        try:
            return together()
        except Exception as error:
            if isinstance(error, SQLAlchemyError) and is_transient(error):
                raise
            return each_alone()

    def _poll_each(self, due: deque[tuple[int, DrivenJob]]) -> list[tuple[int, Ended | None]]:
        """``_poll_guarded`` of each job taken from ``due`` (shared by the pool's threads), with
        its place in the tick's order, until ``due`` is empty. Raises the first poll's error that
        propagates (the database's), leaving the rest of ``due`` to the other threads."""
        polls: list[tuple[int, Ended | None]] = []
        while True:
            try:
                index, job = due.popleft()
            except IndexError:
                return polls
            polls.append((index, self._poll_guarded(job)))

    def _poll_guarded(self, job: DrivenJob) -> Ended | None:
        """Poll an in-flight ``job`` that is due (on a pool thread); Spider's final word."""
        return self._guarded(job, lambda: self.outcomes.poll(job))

    def _conclude(self, ended: list[Ended]) -> None:
        """Conclude the jobs Spider ended, together; when that fails for a reason that is not an
        outage, each alone, so that the error counts against the job it belongs to."""
        if ended:
            self._together(
                partial(self.outcomes.conclude, ended), partial(self._conclude_each, ended)
            )

    def _conclude_each(self, ended: list[Ended]) -> None:
        for item in ended:
            if item.job.job_id in self.driven:  # not concluded before the failure
                self._guarded(item.job, partial(self.outcomes.conclude, [item]))

    def _guarded(self, job: DrivenJob, step: Callable[[], _T]) -> _T | None:
        """``step()``; an error that is not an outage counts as a failed attempt of the job."""
        try:
            return step()
        except SQLAlchemyError as error:
            if is_transient(error):
                raise  # the database is down: the whole tick waits
            self._attempt_failed(job, f"database error: {error}")
        except Exception as error:
            # A bug must not stop the service for every other job: this one backs off and,
            # if it keeps failing, ends Failed.
            _log.exception("unexpected error", extra=job.log())
            self._attempt_failed(job, f"unexpected error: {type(error).__name__}: {error}")
        return None

    def _pause(self, interval: float) -> float:
        polls = [
            job.next_poll for job in self.driven.values() if job.status is not JobStatus.PENDING
        ]
        if not polls:
            return interval
        return max(0.01, min(interval, min(polls) - self.loop.monotonic()))

    def _attempt_failed(self, job: DrivenJob, why: str) -> None:
        """An error that would repeat: back off, and after ``max_attempts`` end the job Failed."""
        job.failed_attempts += 1
        if job.failed_attempts >= self.max_attempts:
            _log.error("giving up: %s", why, extra=job.log())
            self.outcomes.give_up(job, {"attempts": job.failed_attempts, "error": why})
            return
        delay = min(MAX_ATTEMPT_BACKOFF_SECS, 2.0 ** (job.failed_attempts - 1))
        _log.warning(
            "attempt %d of %d failed, next in %.0f s: %s",
            job.failed_attempts,
            self.max_attempts,
            delay,
            why,
            extra=job.log(),
        )
        job.retry_submit_at = job.next_poll = self.loop.monotonic() + delay
