"""The submitter: a claimed Pending job becomes a Spider job, state first.

For each claimed Pending job: prepare it (objects, partitions, graph; a job that can never run ends
Failed with the reason), create the dataset's tables, RegisterJob, record ``spider_id`` with
Pending → Running in one guarded transition, and only then StartJob. The jobs of one tick take
each step together: one RegisterJob call for all (``register_all``: the embedded engine stores
them in one transaction, a Spider cluster is called once per job), one transaction for every
record (each its own guarded move), one StartJob call (``start``), so that a tick's submissions
cost a few commits, not a few per job (issue 14). Each job's answer is still its own.

If the record loses its race, the registered Spider job is abandoned Ready, never started, so
nothing runs untracked (``cancel_if_safe`` never cancels a Ready job: with a cleanup task that is
fatal). If the record fails (an outage, a deadlock past its retries, any error), the registration
is kept while the job is driven and recorded on the next attempt, never registered again; when the
failed commit had in fact happened, the next record finds the row Running with this very Spider
job and starts it. A Pending row that already records a Spider job is never registered again: it
ends by the ``abandoned`` edge.

RegisterJob is not retried within a call: after an ambiguous failure the job stays Pending and is
registered anew on a later tick; a registration that did happen stays an orphan Ready job in
Spider, which Spider tolerates.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sqlalchemy.exc import DBAPIError

from coordinator.lifecycle import Actor, JobStatus, Trigger
from coordinator.service import crashpoints
from coordinator.service.driven import Clock, DrivenJob, Loop
from coordinator.service.logs import LOOP_LOGGER
from coordinator.service.prepare import (
    JobRejected,
    JobRequest,
    PreparedJob,
    RequestsRead,
    check_request,
    largest_stored_id,
    plan,
    prepare,
    read_requests,
)
from coordinator.service.resource_group import ResourceGroup, ResourceGroupUnavailable
from coordinator.spider.port import (
    InvalidArgument,
    JobNotFound,
    JobState,
    SpiderError,
    Unauthenticated,
    cancel_if_safe,
    register_all_jobs,
    start_all_registered,
    start_if_ready,
)
from coordinator.store.database import is_transient, reading
from coordinator.store.datasets import ensure_dataset_tables
from coordinator.store.guarded import Applied, LostRace, TransitionRequest, TransitionResult

_log = logging.getLogger(LOOP_LOGGER)

CANCELLED_BEFORE_SUBMISSION = "Cancelled by an operator before submission."
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


RegistrationAnswer = int | SpiderError | ResourceGroupUnavailable
"""What RegisterJob answered for one job: its Spider job id, or why there is none."""


@dataclass(frozen=True)
class Registered:
    """A Pending job registered with Spider whose submission is not recorded yet."""

    job: DrivenJob
    prepared: PreparedJob
    spider_id: int


def retry_later(job: DrivenJob, why: str, monotonic: Clock) -> None:
    """An outage: the job's next attempt waits, without limit (no attempt is counted)."""
    _log.warning(why, extra=job.log())
    job.retry_submit_at = monotonic() + max(1.0, job.backoff_ms / 1000)


@dataclass(frozen=True)
class ReadAhead:
    """The checked requests of a batch of jobs to prepare, and what one read found for them
    (``Submitter.read_ahead``)."""

    requests: dict[int, JobRequest | JobRejected]
    """By job id: the job's request, or why its config was rejected."""
    found: RequestsRead


class Submitter:
    """Prepares, registers, records and starts claimed Pending jobs."""

    def __init__(
        self,
        loop: Loop,
        *,
        resource_group: ResourceGroup,
        attempt_failed: Callable[[DrivenJob, str], None],
    ) -> None:
        self.loop = loop
        self.resource_group = resource_group
        self._attempt_failed = attempt_failed
        self._datasets_with_tables: set[str] = set()
        """Datasets whose tables this submitter created or found (checked once per process: the
        commit creates them again should they be dropped meanwhile)."""
        self._datasets_registered_as_named: set[str] = set()
        """Datasets seen registered under exactly their name (``prepare``'s letter-case check is
        then not read again: the commit checks it anyway)."""
        self._unrecorded: dict[int, Registered] = {}
        """Registrations whose record has not succeeded yet, by job id (kept for the next attempt
        while the very same ``DrivenJob`` is driven)."""

    def read_ahead(self, jobs: Sequence[DrivenJob]) -> ReadAhead:
        """Check the configs of the ``jobs`` that ``prepare`` will prepare, and read what they
        need in one read-only transaction: a tick's batch costs one read, not one per job (issue
        14). Raises the driver's errors (each job is then prepared with a read of its own)."""
        largest_id = largest_stored_id(self.loop.engine)
        requests: dict[int, JobRequest | JobRejected] = {}
        for job in jobs:
            if (
                job.spider_id is None
                and not job.cancel_requested
                and job.job_id not in self._unrecorded
            ):
                try:
                    requests[job.job_id] = check_request(job.clp_config, largest_id)
                except JobRejected as rejection:
                    requests[job.job_id] = rejection
        valid = [request for request in requests.values() if isinstance(request, JobRequest)]
        if not valid:
            return ReadAhead(requests, RequestsRead({}, {}))
        with reading(self.loop.engine) as connection:
            found = read_requests(connection, valid, self._datasets_registered_as_named)
        return ReadAhead(requests, found)

    def prepare(
        self, job: DrivenJob, ahead: ReadAhead | None = None
    ) -> Registered | PreparedJob | None:
        """The first step of ``job``'s submission: the registration an earlier, failed record
        left (to be recorded again, never registered anew), the prepared job to register, or
        ``None`` when there is nothing to register (the job was ended, or must wait).
        ``ahead``: what ``read_ahead`` read for a batch of jobs; a job it did not read for reads
        alone. Raises the driver's errors."""
        if job.spider_id is not None:
            self._end_recorded_submission(job)
            return None
        self._forget_undriven()
        unrecorded = self._unrecorded.get(job.job_id)
        if unrecorded is not None:
            return unrecorded
        return self._prepare(job, ahead)

    def register_all(
        self, prepared: Sequence[tuple[DrivenJob, PreparedJob]]
    ) -> list[RegistrationAnswer]:
        """RegisterJob of every ``prepared`` job, in one call when the engine registers several
        at once (``register_all_jobs``); each answer in its place, for ``registered``. Raises the
        engine's errors that are not Spider's (nothing of the batch stored, unless the database
        went away during its commit)."""
        try:
            group = self.resource_group.id()
        except (ResourceGroupUnavailable, SpiderError) as error:
            return [error] * len(prepared)
        submissions = [
            (item.submission.compressed_task_graph(), item.submission.compressed_inputs())
            for _, item in prepared
        ]
        return list(register_all_jobs(self.loop.spider, group, submissions))

    def registered(
        self, job: DrivenJob, prepared: PreparedJob, answer: RegistrationAnswer
    ) -> Registered | None:
        """Take ``job``'s RegisterJob answer: the registration to record, kept until its record
        succeeds; ``None`` when Spider refused it (the job is rejected, or waits)."""
        if isinstance(answer, int):
            registered = self._unrecorded[job.job_id] = Registered(job, prepared, answer)
            crashpoints.crashpoint("registered")
            return registered
        self._registration_failed(job, answer)
        return None

    def record(self, registered: Sequence[Registered]) -> list[TransitionResult]:
        """Record every registration (``submitted``: Pending → Running with the Spider job id)
        in one transaction, each its own guarded move; the results, in order. Start nothing.

        Raises the database's errors and a refused request, after which nothing is recorded (the
        registered Spider jobs stay Ready, never started; each job is registered anew).
        """
        results = self.loop.store.transition_all([self._submitted(item) for item in registered])
        if any(isinstance(result, Applied) for result in results):
            crashpoints.crashpoint("submitted")
        return results

    def recorded(self, item: Registered, result: TransitionResult) -> bool:
        """After ``record``: whether ``item``'s submission is recorded, its job then Running here
        (state first: ``start`` comes next); a registration whose record lost its race is
        abandoned instead."""
        job = item.job
        self._unrecorded.pop(job.job_id, None)
        if isinstance(result, LostRace) and _recorded_before(item, result):
            _log.info("an earlier, failed record of the submission had committed", extra=job.log())
        elif not isinstance(result, Applied):
            self._abandon_registration(job, item.spider_id, result)
            return False
        job.status, job.spider_id = JobStatus.RUNNING, item.spider_id
        _log.info("submitted: %d task(s)", item.prepared.num_tasks, extra=job.log())
        return True

    def start(self, recorded: Sequence[Registered]) -> None:
        """Start the Spider jobs of ``recorded`` submissions (``recorded`` said so), in one call
        when the engine starts several at once (``start_all_registered``). A Spider error leaves a
        job to its polls, which start a Ready job. Raises the engine's other errors (the jobs
        then wait for their polls likewise)."""
        answers = start_all_registered(self.loop.spider, [item.spider_id for item in recorded])
        for item, answer in zip(recorded, answers, strict=True):
            self._started(item, answer)

    def start_alone(self, item: Registered) -> None:
        """``start`` of one recorded submission, never with others (after starting together
        failed). Raises the engine's errors that are not Spider's."""
        try:
            answer: JobState | SpiderError = start_if_ready(self.loop.spider, item.spider_id)
        except SpiderError as error:
            answer = error
        self._started(item, answer)

    def _started(self, item: Registered, answer: JobState | SpiderError) -> None:
        job = item.job
        if isinstance(answer, SpiderError):
            _log.warning("StartJob failed; polling will retry: %s", answer, extra=job.log())
        crashpoints.crashpoint("started")
        job.next_poll = self.loop.monotonic() + job.backoff_ms / 1000

    def record_and_start(self, registered: Sequence[Registered]) -> None:
        """``record``, ``recorded`` and ``start``. Raises what they raise."""
        results = self.record(registered)
        recorded = [
            item
            for item, result in zip(registered, results, strict=True)
            if self.recorded(item, result)
        ]
        if recorded:
            self.start(recorded)

    def _forget_undriven(self) -> None:
        """Drop the kept registrations of jobs no longer driven as they were (ended, their lease
        lost, or claimed anew): their Spider jobs stay Ready orphans, which Spider tolerates."""
        driven = self.loop.driven
        for job_id, item in list(self._unrecorded.items()):
            if driven.get(job_id) is not item.job:
                del self._unrecorded[job_id]

    def _prepare(self, job: DrivenJob, ahead: ReadAhead | None) -> PreparedJob | None:
        """The job's submission, or ``None`` when it was cancelled, rejected or must wait."""
        if job.cancel_requested:
            # Asked before this coordinator claimed it: never submit it. A request made since is
            # served at the start of the next tick (``CancelServer``), or, when it comes during
            # this submission, refused by the ``submitted`` move's guard (the registered Spider
            # job is abandoned Ready and the job is killed when claimed again).
            self.loop.move(job, Trigger.CANCELLED, JobStatus.KILLED, CANCELLED_BEFORE_SUBMISSION)
            return None
        try:
            prepared = self._prepared(job, ahead)
        except JobRejected as rejection:
            self.loop.move(job, Trigger.REJECTED, JobStatus.FAILED, str(rejection))
            return None
        try:
            if prepared.dataset not in self._datasets_with_tables:
                ensure_dataset_tables(self.loop.engine, prepared.dataset)
                self._datasets_with_tables.add(prepared.dataset)
        except DBAPIError as error:
            why = f"cannot create the tables of dataset {prepared.dataset}: {error}"
            if is_transient(error):
                retry_later(job, why, self.loop.monotonic)
            else:
                self._attempt_failed(job, why)
            return None
        return prepared

    def _prepared(self, job: DrivenJob, ahead: ReadAhead | None) -> PreparedJob:
        """``plan`` from what ``ahead`` read for ``job``, else ``prepare`` with a read of its own.
        Raises ``JobRejected`` and the driver's errors."""
        request = None if ahead is None else ahead.requests.get(job.job_id)
        if ahead is None or request is None:
            return prepare(
                self.loop.engine,
                job.clp_config,
                self.loop.settings,
                cleanup_task=self.loop.cleanup_task,
                registered_as_named=self._datasets_registered_as_named,
            )
        if isinstance(request, JobRejected):
            raise request
        return plan(request, ahead.found, self.loop.settings, cleanup_task=self.loop.cleanup_task)

    def _registration_failed(
        self, job: DrivenJob, error: SpiderError | ResourceGroupUnavailable
    ) -> None:
        """RegisterJob refused ``job``: a rejected graph ends it Failed, anything else waits."""
        if isinstance(error, InvalidArgument):
            message = f"Compression job failed: Spider rejected the task graph: {error}"
            self.loop.move(job, Trigger.REJECTED, JobStatus.FAILED, message)
        elif isinstance(error, Unauthenticated):
            # Spider's storage was reset (hazard H11, docs/hazards.md): register the group anew.
            self.resource_group.invalidate()
            retry_later(
                job,
                "Spider does not know the resource group; registering it again",
                self.loop.monotonic,
            )
        elif isinstance(error, ResourceGroupUnavailable):
            retry_later(job, f"cannot submit yet: {error}", self.loop.monotonic)
        else:
            # Not retried: the call may have registered the job (see the module docstring).
            retry_later(
                job, f"RegisterJob failed, the job stays Pending: {error}", self.loop.monotonic
            )

    def _submitted(self, item: Registered) -> TransitionRequest:
        prepared, spider_id = item.prepared, item.spider_id
        return TransitionRequest(
            item.job.job_id,
            Trigger.SUBMITTED,
            JobStatus.PENDING,
            JobStatus.RUNNING,
            Actor.COORDINATOR,
            reason=(
                f"{prepared.num_objects} object(s) in {prepared.num_tasks} task(s), "
                f"Spider job {spider_id}"
            ),
            actor_id=self.loop.instance_id,
            spider_id=spider_id,
            num_tasks=prepared.num_tasks,
            fence=item.job.epoch,
            unless_cancel_requested=True,
        )

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
            cancel_if_safe(self.loop.spider, spider_id, cleanup_task=self.loop.cleanup_task)
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
        self.loop.driven.pop(job.job_id, None)

    def _end_recorded_submission(self, job: DrivenJob) -> None:
        """End a Pending job whose row already records a Spider job, cancelling that job first.

        Never registers anything. A Spider outage leaves the job for a later tick.
        """
        assert job.spider_id is not None
        spider_id = job.spider_id
        try:
            state = cancel_if_safe(self.loop.spider, spider_id, cleanup_task=self.loop.cleanup_task)
        except JobNotFound:
            outcome = "Spider does not know it"
        except SpiderError as error:
            why = f"cannot cancel recorded Spider job {spider_id} yet: {error}"
            retry_later(job, why, self.loop.monotonic)
            return
        else:
            outcome = RECORDED_SPIDER_JOB_STATES.get(state, f"it is {state.name.lower()}")
        message = RECORDED_SPIDER_JOB.format(spider_id=spider_id, outcome=outcome)
        self.loop.move(job, Trigger.ABANDONED, JobStatus.FAILED, message)


def _recorded_before(item: Registered, race: LostRace) -> bool:
    """Whether the row lost to ``item``'s record holds ``item`` recorded: Running with its Spider
    job under the same lease, which only an earlier record of it can have written (a commit whose
    error left its outcome unknown)."""
    return (
        race.state is JobStatus.RUNNING
        and race.spider_id == item.spider_id
        and race.lease_epoch == item.job.epoch
    )
