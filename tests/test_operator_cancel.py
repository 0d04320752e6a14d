"""The operator's cancel (``coordinator.service.operator_cancel``): a policy the CLI prints."""

from __future__ import annotations

from datetime import timedelta

import pytest

from coordinator.lifecycle import JobStatus
from coordinator.service.operator_cancel import CancelOutcome, request_cancel
from coordinator.service.submitter import CANCELLED_BEFORE_SUBMISSION
from coordinator.store.jobs import JobStore, NoSuchJob, job_state
from coordinator.store.leases import claim_pending
from tests.paths import new_job_in


def _state(store: JobStore, job_id: int) -> tuple[JobStatus, bool]:
    job = store.get(job_id)
    assert job is not None
    return job_state(job), job.cancel_requested_at is not None


def test_a_pending_job_no_coordinator_holds_is_killed_at_once(store: JobStore) -> None:
    job_id = new_job_in(store, JobStatus.PENDING)

    outcome = request_cancel(store, job_id, "alice")

    assert outcome == CancelOutcome(job_id, JobStatus.KILLED, killed=True)
    assert outcome.message == f"job {job_id} killed (it had not been submitted)"
    assert _state(store, job_id) == (JobStatus.KILLED, True)
    last = store.history(job_id)[-1]
    assert (last.trigger, last.actor, last.actor_id, last.reason) == (
        "cancelled",
        "operator",
        "alice",
        CANCELLED_BEFORE_SUBMISSION,
    )


ACTED_ON = "cancel requested for job {job} ({status}); the coordinator acts on it"
NOTHING_TO_DO = "job {job} is already {status}; nothing to cancel"


@pytest.mark.parametrize(
    ("status", "message"),
    [
        (JobStatus.PENDING, ACTED_ON),  # held by a coordinator: it kills the job itself
        (JobStatus.RUNNING, ACTED_ON),
        (JobStatus.COMMITTED, ACTED_ON),
        (JobStatus.SUCCEEDED, NOTHING_TO_DO),
        (JobStatus.FAILED, NOTHING_TO_DO),
        (JobStatus.KILLED, NOTHING_TO_DO),
    ],
)
def test_any_other_job_is_left_to_its_coordinator_or_as_it_is(
    store: JobStore, status: JobStatus, message: str
) -> None:
    job_id = new_job_in(store, status)
    if status is JobStatus.PENDING:
        with store.engine.begin() as connection:
            claimed = claim_pending(
                connection,
                owner="other",
                lease=timedelta(minutes=1),
                now=store.clock(),
                limit=1,
                is_ours=lambda _id, _config: True,
            )
        assert [lease.job_id for lease in claimed] == [job_id]

    outcome = request_cancel(store, job_id, "alice")

    assert outcome == CancelOutcome(job_id, status, killed=False)
    assert outcome.message == message.format(job=job_id, status=status.label)
    assert _state(store, job_id) == (status, True)


def test_an_unknown_job_is_refused(store: JobStore) -> None:
    with pytest.raises(NoSuchJob, match="no compression job 99"):
        request_cancel(store, 99, "alice")
