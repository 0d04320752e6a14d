"""The operator's cancel (``coordinator cancel``): record the request, kill an unheld Pending job.

The request is recorded on the job (``cancel_requested_at``), whatever its status. A Pending job
that no coordinator holds (no lease, or an expired one) is killed at once, by the operator, since
no coordinator would otherwise see it before it is claimed. Every other job is left to the
coordinator driving it (``coordinator.service.cancels``): a held Pending job is killed by its
coordinator, a started one is cancelled through Spider (a job whose commit is under way
completes). A terminal job stays as it is.
"""

from __future__ import annotations

from dataclasses import dataclass

from coordinator.lifecycle import Actor, JobStatus, Trigger
from coordinator.service.submitter import CANCELLED_BEFORE_SUBMISSION
from coordinator.store import leases
from coordinator.store.guarded import Applied, TransitionRequest
from coordinator.store.jobs import JobStore, NoSuchJob, job_state


@dataclass(frozen=True)
class CancelOutcome:
    """What a cancel request did: ``message`` is the line ``coordinator cancel`` prints."""

    job_id: int
    status: JobStatus
    """The job's status when the request was recorded (Killed when it was killed at once)."""
    killed: bool
    """The job was Pending, held by no coordinator, and has been killed at once."""

    @property
    def message(self) -> str:
        """``job 7 killed (it had not been submitted)``, ``job 7 is already Succeeded; nothing to
        cancel``, or ``cancel requested for job 7 (Running); the coordinator acts on it``."""
        if self.killed:
            return f"job {self.job_id} killed (it had not been submitted)"
        if self.status.is_terminal:
            return f"job {self.job_id} is already {self.status.label}; nothing to cancel"
        return (
            f"cancel requested for job {self.job_id} ({self.status.label}); "
            "the coordinator acts on it"
        )


def request_cancel(store: JobStore, job_id: int, operator: str) -> CancelOutcome:
    """Persist an operator's cancel request; kill a Pending job no coordinator holds at once.

    ``operator`` is recorded as the actor id of the kill. Raises ``NoSuchJob``.
    """
    now = store.clock()
    if not leases.request_cancel(store.engine, job_id, now):
        raise NoSuchJob(f"no compression job {job_id}")
    job = store.get(job_id)
    assert job is not None
    status = job_state(job)
    unheld = job.lease_expires_at is None or job.lease_expires_at < now
    if status is JobStatus.PENDING and unheld:
        result = store.transition(
            TransitionRequest(
                job_id,
                Trigger.CANCELLED,
                JobStatus.PENDING,
                JobStatus.KILLED,
                Actor.OPERATOR,
                reason=CANCELLED_BEFORE_SUBMISSION,
                actor_id=operator,
                fence=job.lease_epoch,
            )
        )
        if isinstance(result, Applied):
            return CancelOutcome(job_id, JobStatus.KILLED, killed=True)
    return CancelOutcome(job_id, status, killed=False)
