"""The coordinator loop: claim, prepare, submit, poll, react; decisions from the row and Spider.

Each ``tick``:

1. **Leases.** Renew the leases of the jobs this coordinator drives (a job whose lease another
   coordinator took over is dropped at once); every write for a job is fenced by its lease epoch.
2. **Cancel requests.** A driven job an operator asked to cancel (``cancel_requested_at``):
   Pending → Killed directly; Running or Committed → ``CancelJob`` through ``cancel_if_safe``.
   The coordinator's graphs carry a cleanup task (``coordinator.spider.task_graph``), so Spider
   cancels Running and CommitReady alike and the job moving on between the state read and the call
   is harmless; a Ready job (recorded, never started) is started first. Nothing in memory marks a
   cancel delivered: the persisted request is served on every tick by whoever drives the job (after
   a takeover too) until the job concludes. **A cancel wins until Spider reports Succeeded**:
   Spider Cancelled → Killed, rolled back if the commit had already published (Committed); Spider
   Succeeded first → the job completes (the cancel came too late; logged); Spider Failed → Failed.
   A graph without a cleanup task (``coordinator.cleanup_task: false``, CLP's own task package)
   is sent CancelJob only while Ready: a started one may reach CommitReady between the state read
   and the call, where CancelJob shuts a real Spider's storage down. It is left to finish, and
   the cancel wins at its outcome: Spider Succeeded → Killed, whatever it published withdrawn.
3. **Claim** up to ``max_concurrent_jobs`` minus the jobs already driven (taken-over ones included,
   hazard H6): first in-flight jobs whose coordinator died, then Pending ``s3_object_metadata``
   jobs. Jobs of other input types are never written (H1).
4. **Submit** each claimed Pending job: prepare it (objects, partitions, graph; an impossible job
   ends Failed with the reason), create the dataset's tables, RegisterJob, record ``spider_id`` with
   Pending → Running in one guarded transition, and only then StartJob (state first). If the
   record fails, the registered Spider job is left Ready, never started, so nothing runs untracked
   (``cancel_if_safe`` never cancels a Ready job: with a cleanup task that is fatal).
5. **Poll** each in-flight job when due, backing off from ``result_polling.init`` to ``max``, and
   react to a terminal Spider state:

   ===========  =============  ============================================================
   Spider       row            move
   ===========  =============  ============================================================
   Succeeded    Committed      finalised → Succeeded, **only on evidence**: in the same
                               transaction, the job's archives are in ``clp_<ds>_archives``
                               and weigh what the commit published; else rolled_back →
                               Failed (``Spider reports success but the job's archives are
                               not published: …``), what is left withdrawn
   Failed       Running        failed → Failed, Spider's error in ``status_msg``
   Cancelled    Running        killed → Killed
   Failed       Committed      rolled_back → Failed: archive rows deleted in the same
                               transaction, then the archive files removed
   Cancelled    Committed      rolled_back → Killed (likewise): e.g. a cancel requested
                               after the commit published, before Spider's success
   Succeeded    Running        failed: Spider succeeded but nothing was published
   unknown      Running        failed: Spider no longer knows the job (its storage was reset)
   unknown      Committed      finalised: the publication stands (on the same evidence)
   any          terminal       no move (a Succeeded job is never overwritten; a KILLED written
                               by CLP's legacy scheduler stays, H2); its archives are settled
   ===========  =============  ============================================================

6. **Settle** the archives of every job that ended (``coordinator.service.cleanup``): whoever
   finished it, a Failed or Killed job keeps nothing published (a Committed job killed by a foreign
   writer has its archives withdrawn, as a rollback does) and no stored file; a Succeeded job keeps
   exactly what it published. A periodic sweep repeats this for late task instances.

An error that is not an outage (a dataset table that cannot be created, an unexpected exception)
counts as a failed attempt of the job: attempts back off from 1 s doubling to 60 s, and after
``max_attempts`` the job ends Failed with the error in ``status_msg`` (a Running job's Spider job
is cancelled first, a Committed job is rolled back). Outages (database or Spider unavailable) are
retried without limit and fail no job.

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
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from coordinator.config.clp import CompressionCoordinator
from coordinator.engine.tasks.context import ArchiveOutputSettings
from coordinator.job_config import S3_OBJECT_METADATA, UndecodableJobConfig, peek_input_type
from coordinator.lifecycle import Actor, JobStatus
from coordinator.service.cleanup import (
    RECONCILE_INTERVAL_SECS,
    log_reconciliation,
    settle_archives,
    settle_unattributed_archives,
    terminal_jobs_with_stored_archives,
)
from coordinator.service.crashpoints import crashpoint
from coordinator.service.logs import job_fields
from coordinator.service.outage import Outage
from coordinator.service.prepare import JobRejected, PreparedJob, dataset_of, prepare
from coordinator.service.resource_group import ResourceGroup, ResourceGroupUnavailable
from coordinator.spider.port import (
    InvalidArgument,
    JobNotFound,
    JobState,
    SpiderError,
    SpiderPort,
    Unauthenticated,
    cancel_if_safe,
    start_if_ready,
)
from coordinator.store import leases
from coordinator.store.archives import withdraw_archives
from coordinator.store.database import is_transient
from coordinator.store.datasets import ensure_dataset_tables
from coordinator.store.evidence import publication_gap
from coordinator.store.guarded import Applied, LostRace, TransitionRequest, TransitionResult
from coordinator.store.jobs import JobStore, job_state

_log = logging.getLogger(__name__)

SPIDER_FAILED = "The Spider compression job failed: {}"
SPIDER_CANCELLED = "The Spider compression job was cancelled."
UNPUBLISHED = "Spider reports success but the job's archives are not published: {}."
CANCELLED_BEFORE_SUBMISSION = "Cancelled by an operator before submission."
CANCELLED_AT_OUTCOME = (
    "Cancelled by an operator. Spider was left to finish the job, since its task graph has no "
    "cleanup task (cancelling it while it commits would shut Spider's storage down), and nothing "
    "it produced is kept."
)
SWEEP_INTERVAL_SECS = 60.0
GAVE_UP = "Compression job failed after {attempts} attempt(s): {error}"
RECORDED_SPIDER_JOB = (
    "Compression job failed: the Pending job already records Spider job {spider_id}, so it is "
    "not submitted again; {outcome}."
)
RECORDED_SPIDER_JOB_STATES = {
    # What became of the recorded Spider job (cancel_if_safe's answer), for the message.
    JobState.READY: "it was never started and is left so",
    JobState.COMMIT_READY: "it is committing and is left to finish",
    JobState.CLEANUP_READY: "it is being cancelled",
    JobState.CANCELLED: "it is cancelled",
    JobState.SUCCEEDED: "it had already succeeded",
    JobState.FAILED: "it had already failed",
}
MAX_ATTEMPT_BACKOFF_SECS = 60.0


def default_instance_id() -> str:
    """A name unique to this process: ``host:pid:random``."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class _Unpublished(Exception):
    """Finalising found no evidence of the job's publication (the message says what is missing)."""


@dataclass
class DrivenJob:
    """A job this coordinator holds the lease of."""

    job_id: int
    epoch: int
    status: JobStatus
    spider_id: int | None
    dataset: str
    clp_config: bytes
    backoff_ms: int
    next_poll: float = 0.0
    cancel_seen: JobState | None = None
    """The Spider state the last cancel attempt left (for the log only: a cancel counts as
    delivered when Spider reports Cancelled, and the persisted request is served until then)."""
    retry_submit_at: float = 0.0
    failed_attempts: int = 0
    """Attempts that failed with an error that is not an outage (bounded by ``max_attempts``)."""

    def log(self) -> dict[str, object]:
        return job_fields(self.job_id, self.spider_id)


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
    ) -> None:
        self.engine = engine
        self.store = JobStore(engine)
        self.spider = spider
        self.settings = settings
        self.archive_output = archive_output
        self.instance_id = instance_id or default_instance_id()
        self.lease_duration = lease_duration
        self.owns_undecodable_jobs = owns_undecodable_jobs
        self.max_attempts = max_attempts
        # Whether graphs carry compression::cleanup, which makes CancelJob safe in CommitReady;
        # CLP's own task package (on a Spider cluster) has no such task.
        self.cleanup_task = cleanup_task
        # Why an s3_object_metadata job is not this coordinator's after all (None: it is); the
        # embedded default leaves jobs that do not name its local object store (runtime.py).
        self.leaves_job = leaves_job
        self.resource_group = ResourceGroup(engine, spider, settings.resource_group.name)
        self.driven: dict[int, DrivenJob] = {}
        self.stopping = threading.Event()
        self._monotonic = clock
        self._foreign: set[int] = set()
        self._next_renewal = 0.0
        self._next_sweep = 0.0
        self._next_reconcile: float | None = None
        self._reconciler: threading.Thread | None = None
        self._claim_retry_at = 0.0
        self._phase_failures = 0

    # --- the loop -----------------------------------------------------------------------------

    def run(self, *, until_idle: bool = False) -> None:
        """Tick until ``stopping`` is set (or, with ``until_idle``, nothing is left to do)."""
        interval = self.settings.job_polling_interval_millisecs / 1000
        outage = Outage("the database", _log, clock=self._monotonic)
        while not self.stopping.is_set():
            try:
                report = self.tick()
            except SQLAlchemyError as error:
                self.stopping.wait(outage.failed(error))
                continue
            except Exception:
                # Nothing a row holds may stop the service: a bug outside one job's handling is
                # logged and the tick retried after a pause, like an outage.
                _log.exception("unexpected error in a tick; retrying")
                self.stopping.wait(max(interval, 1.0))
                continue
            outage.recovered()
            # A tick that concluded a job claimed before the job freed its place: tick again.
            if until_idle and not self.driven and report.claimed == 0 and not report.concluded:
                break
            self.stopping.wait(self._pause(interval))
        self.release_leases()

    def tick(self) -> TickReport:
        """One round of the loop; raises SQLAlchemy's errors when the database is unavailable."""
        report = TickReport()
        self._guarded_phase("lease renewal", self._renew_leases)
        self._serve_cancel_requests()
        if not self.stopping.is_set() and self._monotonic() >= self._claim_retry_at:
            report.claimed = self._guarded_phase("claim", self._claim) or 0
        for job in list(self.driven.values()):
            if self.stopping.is_set() and job.status is JobStatus.PENDING:
                continue
            try:
                if self._advance(job):
                    report.concluded.append(job.job_id)
            except SQLAlchemyError as error:
                if is_transient(error):
                    raise  # the database is down: the whole tick waits
                self._attempt_failed(job, f"database error: {error}")
            except Exception as error:
                # A bug must not stop the service for every other job: this one backs off and,
                # if it keeps failing, ends Failed.
                _log.exception("unexpected error", extra=job.log())
                self._attempt_failed(job, f"unexpected error: {type(error).__name__}: {error}")
        self._sweep()
        report.driven = len(self.driven)
        return report

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
            self._claim_retry_at = self._monotonic() + delay
            return None
        self._phase_failures = 0
        return result

    def _advance(self, job: DrivenJob) -> bool:
        """Submit or poll ``job`` when it is due; whether it concluded."""
        now = self._monotonic()
        if job.status is JobStatus.PENDING:
            if now >= job.retry_submit_at:
                self._submit(job)
            return False
        return now >= job.next_poll and self._poll(job)

    def release_leases(self) -> None:
        """Give up every lease now, so another coordinator (or the next start) continues at once."""
        held = {job.job_id: job.epoch for job in self.driven.values()}
        if held:
            try:
                leases.release(self.engine, held, owner=self.instance_id, now=self.store.clock())
            except SQLAlchemyError:
                _log.warning("could not release %d lease(s); they will expire", len(held))

    def _pause(self, interval: float) -> float:
        polls = [
            job.next_poll for job in self.driven.values() if job.status is not JobStatus.PENDING
        ]
        if not polls:
            return interval
        return max(0.01, min(interval, min(polls) - self._monotonic()))

    # --- leases, claims, cancel requests ------------------------------------------------------

    def _renew_leases(self) -> None:
        now = self._monotonic()
        if now < self._next_renewal or not self.driven:
            return
        self._next_renewal = now + self.lease_duration.total_seconds() / 3
        lost = leases.renew(
            self.engine,
            {job.job_id: job.epoch for job in self.driven.values()},
            owner=self.instance_id,
            expires=self.store.clock() + self.lease_duration,
        )
        for job_id in lost:
            job = self.driven.pop(job_id)
            _log.warning("lease lost: another coordinator took the job over", extra=job.log())

    def _claim(self) -> int:
        capacity = self.settings.max_concurrent_jobs - len(self.driven)
        now = self.store.clock()
        taken = leases.take_over_in_flight(
            self.engine,
            owner=self.instance_id,
            lease=self.lease_duration,
            now=now,
            limit=capacity,
            skip=list(self.driven),
        )
        # Pending rows that already record a Spider job are claimed only to be ended (never
        # submitted: the `submitted` edge would lose its race on every attempt).
        recorded = leases.claim_pending(
            self.engine,
            owner=self.instance_id,
            lease=self.lease_duration,
            now=now,
            limit=capacity - len(taken),
            is_ours=self._is_ours,
            skip=self._foreign | set(self.driven),
            recorded_spider_id=True,
        )
        claimed = leases.claim_pending(
            self.engine,
            owner=self.instance_id,
            lease=self.lease_duration,
            now=now,
            limit=capacity - len(taken) - len(recorded),
            is_ours=self._is_ours,
            skip=self._foreign | set(self.driven),
        )
        init = self.settings.result_polling.init_backoff_millisecs
        for lease in [*taken, *recorded, *claimed]:
            job = DrivenJob(
                job_id=lease.job_id,
                epoch=lease.epoch,
                status=lease.status,
                spider_id=lease.spider_id,
                dataset=dataset_of(lease.clp_config),
                clp_config=lease.clp_config,
                backoff_ms=init,
            )
            self.driven[job.job_id] = job
            verb = "took over" if lease.status is not JobStatus.PENDING else "claimed"
            _log.info("%s job (%s)", verb, lease.status.label, extra=job.log())
            crashpoint("claimed")
        return len(taken) + len(recorded) + len(claimed)

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

    def _serve_cancel_requests(self) -> None:
        """Serve the persisted cancel request of every driven job, on every tick, until it ends.

        The request (``cancel_requested_at``) is the only record of it: nothing in memory marks it
        delivered, so whoever drives the job, a coordinator that took it over included, serves it
        again until the job concludes, by Spider reporting Cancelled (→ Killed, rolled back if it
        was Committed) or by ending otherwise (Spider Succeeded or Failed; see the table). A Pending
        job is killed at once. A started job is cancelled through ``cancel_if_safe`` with the
        cleanup task its graph carries, so CancelJob is safe whatever the job does meanwhile, in
        CommitReady too; a Ready one (recorded but never started) is started first, since Spider
        cannot cancel a Ready job that has a cleanup task.
        """
        requested = leases.cancel_requests(self.engine, list(self.driven))
        for job_id in requested:
            job = self.driven.get(job_id)
            if job is None:
                continue
            if job.status is JobStatus.PENDING:
                if job.spider_id is None:  # else a recorded Spider job: _submit ends the row
                    self._move(job, "cancelled", JobStatus.KILLED, CANCELLED_BEFORE_SUBMISSION)
                continue
            if job.spider_id is None or job.status not in (JobStatus.RUNNING, JobStatus.COMMITTED):
                continue
            try:
                state = cancel_if_safe(self.spider, job.spider_id, cleanup_task=self.cleanup_task)
                if state is JobState.READY and self.cleanup_task:
                    start_if_ready(self.spider, job.spider_id)
                    state = cancel_if_safe(
                        self.spider, job.spider_id, cleanup_task=self.cleanup_task
                    )
            except SpiderError as error:
                # E.g. the job became terminal meanwhile (still cached): the poll concludes it.
                _log.warning("cancel request not delivered yet: %s", error, extra=job.log())
                job.next_poll = 0.0
                continue
            if state is not job.cancel_seen:
                job.cancel_seen = state
                job.next_poll = 0.0
                if state is JobState.SUCCEEDED and self.cleanup_task:
                    _log.info(
                        "cancel requested after Spider's success: the job completes",
                        extra=job.log(),
                    )
                elif not self.cleanup_task and not state.is_terminal:
                    _log.info(
                        "cancel requested; Spider job is %s and its graph has no cleanup task, "
                        "so it is left to finish and the job ends Killed then",
                        state.name,
                        extra=job.log(),
                    )
                else:
                    _log.info("cancel requested; Spider job is %s", state.name, extra=job.log())

    # --- submission ---------------------------------------------------------------------------

    def _submit(self, job: DrivenJob) -> None:
        if job.spider_id is not None:
            self._end_recorded_submission(job)
            return
        prepared = self._prepare(job)
        if prepared is None:
            return
        spider_id = self._register(job, prepared)
        if spider_id is None:
            return
        crashpoint("registered")
        self._record_and_start(job, prepared, spider_id)

    def _prepare(self, job: DrivenJob) -> PreparedJob | None:
        """The job's submission, or ``None`` when it was cancelled, rejected or must wait."""
        if leases.cancel_requests(self.engine, [job.job_id]):
            # Asked before this coordinator claimed it (or since): never submit it.
            self._move(job, "cancelled", JobStatus.KILLED, CANCELLED_BEFORE_SUBMISSION)
            return None
        try:
            prepared = prepare(
                self.engine, job.clp_config, self.settings, cleanup_task=self.cleanup_task
            )
        except JobRejected as rejection:
            self._move(job, "rejected", JobStatus.FAILED, str(rejection))
            return None
        try:
            ensure_dataset_tables(self.engine, prepared.dataset)
        except DBAPIError as error:
            why = f"cannot create the tables of dataset {prepared.dataset}: {error}"
            if is_transient(error):
                self._retry_later(job, why)
            else:
                self._attempt_failed(job, why)
            return None
        return prepared

    def _register(self, job: DrivenJob, prepared: PreparedJob) -> int | None:
        """The new Spider job's id, or ``None`` when the job was rejected or must wait."""
        submission = prepared.submission
        try:
            return self.spider.register_job(
                self.resource_group.id(),
                submission.compressed_task_graph(),
                submission.compressed_inputs(),
            )
        except InvalidArgument as error:
            message = f"Compression job failed: Spider rejected the task graph: {error}"
            self._move(job, "rejected", JobStatus.FAILED, message)
        except Unauthenticated:
            self.resource_group.invalidate()  # Spider's storage was reset (H11)
            self._retry_later(job, "Spider does not know the resource group; registering it again")
        except ResourceGroupUnavailable as error:
            self._retry_later(job, f"cannot submit yet: {error}")
        except SpiderError as error:
            # The call is not retried: it may have registered the job. The job stays Pending and a
            # later tick registers it anew; a registration that did happen stays an orphan Ready
            # job in Spider, never started (Spider tolerates those).
            self._retry_later(job, f"RegisterJob failed, the job stays Pending: {error}")
        return None

    def _record_and_start(self, job: DrivenJob, prepared: PreparedJob, spider_id: int) -> None:
        job.spider_id = spider_id
        result = self.store.transition(
            TransitionRequest(
                job.job_id,
                "submitted",
                JobStatus.PENDING,
                JobStatus.RUNNING,
                Actor.COORDINATOR,
                reason=(
                    f"{prepared.num_objects} object(s) in {prepared.num_tasks} task(s), "
                    f"Spider job {spider_id}"
                ),
                actor_id=self.instance_id,
                spider_id=spider_id,
                num_tasks=prepared.num_tasks,
                fence=job.epoch,
            )
        )
        if not isinstance(result, Applied):
            self._abandon_registration(job, spider_id, result)
            return
        crashpoint("submitted")
        job.status = JobStatus.RUNNING
        _log.info("submitted: %d task(s)", prepared.num_tasks, extra=job.log())
        try:
            start_if_ready(self.spider, spider_id)
        except SpiderError as error:
            _log.warning("StartJob failed; polling will retry: %s", error, extra=job.log())
        crashpoint("started")
        job.next_poll = self._monotonic() + job.backoff_ms / 1000

    def _abandon_registration(
        self, job: DrivenJob, spider_id: int, result: TransitionResult
    ) -> None:
        _log.warning(
            "recording the submission failed (%s); cancelling Spider job %d",
            result,
            spider_id,
            extra=job.log(),
        )
        try:
            cancel_if_safe(self.spider, spider_id, cleanup_task=self.cleanup_task)
        except SpiderError as error:
            _log.error(
                "could not cancel orphan Spider job %d: %s", spider_id, error, extra=job.log()
            )
        if (
            isinstance(result, LostRace)
            and result.state is JobStatus.PENDING
            and result.spider_id is not None
            and result.lease_epoch == job.epoch
        ):
            # Another writer put a Spider id on the row: a race that would be lost on every
            # attempt, so the job is never registered again but ended (next advance).
            job.spider_id = result.spider_id
            return
        job.spider_id = None
        self.driven.pop(job.job_id, None)

    def _end_recorded_submission(self, job: DrivenJob) -> None:
        """End a Pending job whose row already records a Spider job, cancelling that job first.

        Never registers anything. A Spider outage leaves the job for a later tick.
        """
        assert job.spider_id is not None
        spider_id = job.spider_id
        try:
            state = cancel_if_safe(self.spider, spider_id, cleanup_task=self.cleanup_task)
        except JobNotFound:
            outcome = "Spider does not know it"
        except SpiderError as error:
            self._retry_later(job, f"cannot cancel recorded Spider job {spider_id} yet: {error}")
            return
        else:
            outcome = RECORDED_SPIDER_JOB_STATES.get(state, f"it is {state.name.lower()}")
        message = RECORDED_SPIDER_JOB.format(spider_id=spider_id, outcome=outcome)
        self._move(job, "abandoned", JobStatus.FAILED, message)

    def _retry_later(self, job: DrivenJob, why: str) -> None:
        """An outage: try again later, without limit."""
        _log.warning(why, extra=job.log())
        job.retry_submit_at = self._monotonic() + max(1.0, job.backoff_ms / 1000)

    def _attempt_failed(self, job: DrivenJob, why: str) -> None:
        """An error that would repeat: back off, and after ``max_attempts`` end the job Failed."""
        job.failed_attempts += 1
        if job.failed_attempts >= self.max_attempts:
            message = GAVE_UP.format(attempts=job.failed_attempts, error=why)
            _log.error("giving up: %s", why, extra=job.log())
            self._give_up(job, message)
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
        job.retry_submit_at = job.next_poll = self._monotonic() + delay

    def _give_up(self, job: DrivenJob, message: str) -> None:
        """End ``job`` Failed with ``message`` from whatever state it is in."""
        if job.status is JobStatus.PENDING:
            self._move(job, "rejected", JobStatus.FAILED, message)
        elif job.status is JobStatus.RUNNING:
            assert job.spider_id is not None
            try:
                cancel_if_safe(self.spider, job.spider_id, cleanup_task=self.cleanup_task)
            except SpiderError as error:
                _log.warning("could not cancel the Spider job: %s", error, extra=job.log())
            self._move(job, "failed", JobStatus.FAILED, message)
            self._clean_up(job)
        elif job.status is JobStatus.COMMITTED:
            self._end_badly(job, True, JobStatus.FAILED, message)
            self._clean_up(job)
        else:
            self.driven.pop(job.job_id, None)

    # --- outcomes -----------------------------------------------------------------------------

    def _poll(self, job: DrivenJob) -> bool:
        """Poll one in-flight job; whether it concluded (and is no longer driven)."""
        assert job.spider_id is not None
        try:
            state: JobState | None = self.spider.get_job_state(job.spider_id)
        except JobNotFound:
            state = None
        except SpiderError as error:
            _log.warning("Spider unavailable: %s", error, extra=job.log())
            self._back_off(job)
            return False
        if state is JobState.READY:
            try:
                start_if_ready(self.spider, job.spider_id)
            except SpiderError as error:
                _log.warning("StartJob failed: %s", error, extra=job.log())
            self._back_off(job)
            return False
        if state is not None and not state.is_terminal:
            self._back_off(job)
            return False
        crashpoint("finalising")
        self._conclude(job, state)
        return True

    def _back_off(self, job: DrivenJob) -> None:
        job.next_poll = self._monotonic() + job.backoff_ms / 1000
        job.backoff_ms = min(job.backoff_ms * 2, self.settings.result_polling.max_backoff_millisecs)

    def _conclude(self, job: DrivenJob, state: JobState | None) -> None:
        row = self.store.get(job.job_id)
        try:
            current = None if row is None else job_state(row)
        except ValueError:
            current = None  # a status no one defines: another writer's, left as it is
        if current not in (JobStatus.RUNNING, JobStatus.COMMITTED):
            # Terminal (never overwritten: another writer finished it) or gone.
            self.driven.pop(job.job_id, None)
            self._clean_up(job)
            return
        assert current is not None
        job.status = current
        committed = job.status is JobStatus.COMMITTED
        if state is JobState.SUCCEEDED and self._cancel_left_to_the_outcome(job):
            self._end_badly(job, committed, JobStatus.KILLED, CANCELLED_AT_OUTCOME)
        elif state is JobState.SUCCEEDED:
            if committed:
                self._finalise(job, "Spider reports success.")
            else:
                message = "Spider reports success but the commit did not publish the archives."
                self._move(job, "failed", JobStatus.FAILED, message)
        elif state is JobState.FAILED:
            message = SPIDER_FAILED.format(self._spider_error(job))
            self._end_badly(job, committed, JobStatus.FAILED, message)
        elif state is JobState.CANCELLED:
            self._end_badly(job, committed, JobStatus.KILLED, SPIDER_CANCELLED)
        elif committed:  # Spider no longer knows the job; its publication decides
            reason = f"Spider no longer knows job {job.spider_id}; the published commit stands."
            self._finalise(job, reason)
        else:
            message = (
                f"Spider no longer knows job {job.spider_id} (its storage may have been reset); "
                "nothing was published"
            )
            self._move(job, "failed", JobStatus.FAILED, message)
        self._clean_up(job)

    def _cancel_left_to_the_outcome(self, job: DrivenJob) -> bool:
        """Whether an operator's cancel waits for Spider's outcome: the graph has no cleanup task,
        so a started job was never sent CancelJob (``cancel_if_safe``) and ran to its end."""
        return not self.cleanup_task and bool(leases.cancel_requests(self.engine, [job.job_id]))

    def _finalise(self, job: DrivenJob, reason: str) -> None:
        """Committed → Succeeded, only on evidence that the job's archives are published.

        The evidence (``coordinator.store.evidence.publication_gap``) is read in the finalising
        transaction; without it the move is undone and the job is rolled back to Failed instead,
        with what is missing in ``status_msg`` (whatever of it is still published is withdrawn).
        """
        job_id, spider_id = job.job_id, job.spider_id

        def require_publication(connection: Connection, _: Applied) -> None:
            gap = publication_gap(connection, job_id, spider_id)
            if gap is not None:
                raise _Unpublished(gap)

        try:
            self._move(job, "finalised", JobStatus.SUCCEEDED, reason, effects=require_publication)
        except _Unpublished as gap:
            _log.warning("not finalised: %s", gap, extra=job.log())
            self._end_badly(
                job,
                True,
                JobStatus.FAILED,
                UNPUBLISHED.format(gap),
                note=" Whatever of them was still published was withdrawn.",
            )

    def _end_badly(
        self,
        job: DrivenJob,
        committed: bool,
        target: JobStatus,
        message: str,
        *,
        note: str = " The published archives were withdrawn.",
    ) -> None:
        if not committed:
            self._move(job, "failed" if target is JobStatus.FAILED else "killed", target, message)
            return
        assert job.spider_id is not None
        job_id, spider_id = job.job_id, job.spider_id

        def withdraw(connection: Connection, _: Applied) -> None:
            withdrawn = withdraw_archives(connection, job_id, spider_id)
            _log.info("rolled back %d published archive(s)", len(withdrawn), extra=job.log())

        self._move(job, "rolled_back", target, f"{message}{note}", effects=withdraw)

    def _spider_error(self, job: DrivenJob) -> str:
        assert job.spider_id is not None
        try:
            return self.spider.get_job_error(job.spider_id)
        except SpiderError as error:
            return f"<failed to fetch job error: {error}>"

    def _move(
        self,
        job: DrivenJob,
        trigger: str,
        target: JobStatus,
        reason: str,
        effects: Callable[..., None] | None = None,
    ) -> TransitionResult:
        result = self.store.transition(
            TransitionRequest(
                job.job_id,
                trigger,
                job.status,
                target,
                Actor.COORDINATOR,
                reason=reason,
                actor_id=self.instance_id,
                spider_id=job.spider_id,
                fence=job.epoch,
            ),
            effects=effects,
        )
        if isinstance(result, Applied):
            job.status = target
            _log.info("%s → %s: %s", trigger, target.label, reason, extra=job.log())
            if target.is_terminal:
                leases.release(
                    self.engine, {job.job_id: job.epoch}, owner=self.instance_id, now=result.at
                )
        elif isinstance(result, LostRace):
            _log.info("lost a race: %s", result.describe(), extra=job.log())
        if target.is_terminal or not isinstance(result, Applied):
            self.driven.pop(job.job_id, None)
        return result

    # --- clean-up -------------------------------------------------------------------------------

    def _clean_up(self, job: DrivenJob) -> None:
        """Settle the archives of a job that just ended; the sweep retries what fails here.

        A database outage is raised, so the tick fails and the loop logs the outage once. Before,
        a job that ended just as the database went away logged an ERROR with a full traceback.
        """
        if job.spider_id is None:
            return
        try:
            settled = settle_archives(self.engine, job.job_id, self.archive_output)
        except SQLAlchemyError as error:
            if is_transient(error):
                raise
            _log.exception("clean-up failed; the sweep will retry", extra=job.log())
            return
        if settled.removed:
            _log.info("removed %d unpublished archive(s)", settled.removed, extra=job.log())

    def _sweep(self) -> None:
        now = self._monotonic()
        if now < self._next_sweep:
            return
        self._next_sweep = now + SWEEP_INTERVAL_SECS
        # Foreign jobs leave Pending once the legacy scheduler takes them; forget those, so the
        # claim query's exclusion list stays as short as the foreign backlog.
        self._foreign = leases.still_pending(self.engine, self._foreign)
        grace = self.store.clock() - timedelta(seconds=SWEEP_INTERVAL_SECS)
        for job_id in terminal_jobs_with_stored_archives(self.engine, grace):
            if job_id in self.driven:
                continue
            settled = settle_archives(self.engine, job_id, self.archive_output)
            if settled.removed:
                _log.info(
                    "sweep removed %d archive(s)", settled.removed, extra=job_fields(job_id, None)
                )
        orphans = settle_unattributed_archives(self.engine, self.archive_output, grace)
        if orphans:
            _log.info("sweep removed %d archive(s) no job can publish any more", orphans)
        self._reconcile(now)

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
            target=log_reconciliation,
            args=(self.engine, self.archive_output),
            name="archive reconciliation",
            daemon=True,
        )
        self._reconciler.start()
