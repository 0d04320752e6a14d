"""Putting a job into any status through legal, guarded moves (test set-up)."""

from __future__ import annotations

from coordinator.lifecycle import Actor, JobStatus
from coordinator.store.clock import utc_now
from coordinator.store.guarded import Applied, TransitionRequest
from coordinator.store.jobs import JobStore
from coordinator.store.stored_archives import StoredArchiveRecord

SPIDER_ID = 4242

# The moves that lead from Pending to each status, in order: (trigger, source, target, actor).
_PATHS: dict[JobStatus, tuple[tuple[str, JobStatus, JobStatus, Actor], ...]] = {
    JobStatus.PENDING: (),
    JobStatus.RUNNING: (("submitted", JobStatus.PENDING, JobStatus.RUNNING, Actor.COORDINATOR),),
    JobStatus.COMMITTED: (
        ("submitted", JobStatus.PENDING, JobStatus.RUNNING, Actor.COORDINATOR),
        ("committed", JobStatus.RUNNING, JobStatus.COMMITTED, Actor.COMMIT_TASK),
    ),
    JobStatus.SUCCEEDED: (
        ("submitted", JobStatus.PENDING, JobStatus.RUNNING, Actor.COORDINATOR),
        ("committed", JobStatus.RUNNING, JobStatus.COMMITTED, Actor.COMMIT_TASK),
        ("finalised", JobStatus.COMMITTED, JobStatus.SUCCEEDED, Actor.COORDINATOR),
    ),
    JobStatus.FAILED: (("rejected", JobStatus.PENDING, JobStatus.FAILED, Actor.COORDINATOR),),
    JobStatus.KILLED: (("cancelled", JobStatus.PENDING, JobStatus.KILLED, Actor.OPERATOR),),
}


def request(
    job_id: int,
    trigger: str,
    source: JobStatus,
    target: JobStatus,
    actor: Actor,
    **extra: object,
) -> TransitionRequest:
    """A request carrying whatever any edge may need (Spider id, task count, sizes)."""
    values: dict[str, object] = {
        "spider_id": SPIDER_ID,
        "num_tasks": 3,
        "uncompressed_size": 1000,
        "compressed_size": 100,
        "reason": f"test: {trigger}",
    }
    values.update(extra)
    return TransitionRequest(job_id, trigger, source, target, actor, **values)  # type: ignore[arg-type]


def new_job_in(store: JobStore, status: JobStatus, *, spider_id: int = SPIDER_ID) -> int:
    """A new job, moved to ``status`` (submitted as Spider job ``spider_id``); its id."""
    job_id = store.create_job(b"clp-config")
    for trigger, source, target, actor in _PATHS[status]:
        moved = request(job_id, trigger, source, target, actor, spider_id=spider_id)
        result = store.transition(moved)
        assert isinstance(result, Applied), result
    return job_id


def stored_record(
    dataset: str,
    archive_id: str,
    job_id: int | None,
    *,
    task_id: str = "0",
    instance_id: int = 1,
    location: str | None = None,
    size: int = 1,
) -> StoredArchiveRecord:
    """A record as a compress instance of Spider job ``SPIDER_ID`` writes it."""
    return StoredArchiveRecord(
        spider_job_id=SPIDER_ID,
        task_id=task_id,
        instance_id=instance_id,
        dataset=dataset,
        archive_id=archive_id,
        location=location if location is not None else f"/archives/{dataset}/{archive_id}",
        size=size,
        stored_at=utc_now(),
        job_id=job_id,
    )
