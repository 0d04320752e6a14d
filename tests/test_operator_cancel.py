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


def test_a_pending_job_a_coordinator_holds_is_left_to_that_coordinator(store: JobStore) -> None:
    job_id = new_job_in(store, JobStatus.PENDING)
    claimed = claim_pending(
        store.engine,
        owner="other",
        lease=timedelta(minutes=1),
        now=store.clock(),
        limit=1,
        is_ours=lambda _id, _config: True,
    )
    assert [lease.job_id for lease in claimed] == [job_id]

    outcome = request_cancel(store, job_id, "alice")

    assert outcome == CancelOutcome(job_id, JobStatus.PENDING, killed=False)
    assert outcome.message == (
        f"cancel requested for job {job_id} (Pending); the coordinator acts on it"
    )
    assert _state(store, job_id) == (JobStatus.PENDING, True)


def test_a_started_job_is_left_to_the_coordinator(store: JobStore) -> None:
    job_id = new_job_in(store, JobStatus.RUNNING)

    outcome = request_cancel(store, job_id, "alice")

    assert outcome.message == (
        f"cancel requested for job {job_id} (Running); the coordinator acts on it"
    )
    assert _state(store, job_id) == (JobStatus.RUNNING, True)


def test_a_terminal_job_stays_as_it_is(store: JobStore) -> None:
    job_id = new_job_in(store, JobStatus.SUCCEEDED)

    outcome = request_cancel(store, job_id, "alice")

    assert outcome == CancelOutcome(job_id, JobStatus.SUCCEEDED, killed=False)
    assert outcome.message == f"job {job_id} is already Succeeded; nothing to cancel"
    assert _state(store, job_id)[0] is JobStatus.SUCCEEDED


def test_an_unknown_job_is_refused(store: JobStore) -> None:
    with pytest.raises(NoSuchJob, match="no compression job 99"):
        request_cancel(store, 99, "alice")
