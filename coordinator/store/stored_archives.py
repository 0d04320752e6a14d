"""Records of the archives compress tasks store (``compression_stored_archives``): an outbox.

Every archive file a task instance stores has a record **before** it exists, so no kill at any
point can leave a file nobody knows about. A record's ``state``:

``storing``
    inserted by the compress task before the upload or copy starts, with the archive's
    deterministic location (``coordinator.archive_storage.storage.archive_location``); the file
    may or may not exist (the instance may have been killed before, during or after storing it).
``stored``
    the task marked it after the archive was stored (``mark_stored``, only from ``storing``).
``removing``
    clean-up claimed it (``claim_for_removal``) and is removing the file; once the file is gone
    the record is deleted. An instance still storing finds its record no longer ``storing`` and
    removes what it stored itself.
``published``
    clean-up settled a Succeeded job and this is one of its published archives: kept for good
    (CLP's retention owns the file), never removed by the coordinator.

A failed attempt removes its archives and deletes their records itself. Whatever is left for a
job that never committed (or whose commit was rolled back), and whatever a Succeeded job did not
publish, is what clean-up (``coordinator.service.cleanup``) removes.

A record names the compression job it was stored for (``job_id``): the compress task resolves it
from its Spider job id when exactly one in-flight job records that id, and the commit attributes
the archives it publishes. Clean-up and rollback work by ``job_id`` only, so they never touch
another job's archives, even one that shares a Spider job id after a reset of Spider.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Connection,
    and_,
    bindparam,
    case,
    delete,
    func,
    insert,
    or_,
    select,
    tuple_,
    update,
)
from sqlalchemy.engine import Engine

from coordinator.lifecycle import IN_FLIGHT_STATUS_VALUES, JobStatus
from coordinator.store.database import reading
from coordinator.store.expressions import in_constants, in_flight_recording
from coordinator.store.schema import compression_jobs as _jobs
from coordinator.store.schema import stored_archives as _stored

STORING = "storing"
STORED = "stored"
REMOVING = "removing"
PUBLISHED = "published"
STATES = (STORING, STORED, REMOVING, PUBLISHED)
_BATCH = 1000

# The statements every compress task and commit runs, built once: SQLAlchemy then reuses their
# memoized cache keys and compiled forms instead of rebuilding both per call (~5x cheaper here).
_INSERT = insert(_stored)
_INSERT_STORING_ATTRIBUTED = insert(_stored).values(
    job_id=select(case((func.count() == 1, func.min(_jobs.c.id))))
    .where(in_flight_recording(bindparam("w_spider_job")))
    .scalar_subquery()
)
_MARK_STORED = (
    update(_stored)
    .where(
        _stored.c.id == bindparam("record_id"),
        _stored.c.location == bindparam("w_location"),
        _stored.c.state == STORING,
    )
    .values(state=STORED, stored_at=bindparam("marked_at"))
)
_ATTRIBUTE = (
    update(_stored)
    .where(
        _stored.c.spider_job_id == bindparam("spider_job"),
        _stored.c.job_id.is_(None),
        _stored.c.archive_id.in_(bindparam("archive_ids", expanding=True)),
    )
    .values(job_id=bindparam("owner"))
)
_CLAIM_FOR_REMOVAL = (
    update(_stored)
    .where(_stored.c.id.in_(bindparam("record_ids", expanding=True)))
    .values(state=REMOVING)
)
_MARK_PUBLISHED = (
    update(_stored)
    .where(_stored.c.id.in_(bindparam("record_ids", expanding=True)), _stored.c.state == STORED)
    .values(state=PUBLISHED)
)
_RECORDS_OF_JOB = (
    select(_stored).where(_stored.c.job_id == bindparam("job_id")).order_by(_stored.c.id)
)
_RECORDS_OF_JOBS_OR_UNATTRIBUTED = (
    select(_stored)
    .where(
        or_(
            _stored.c.job_id.in_(bindparam("job_ids", expanding=True)),
            and_(
                _stored.c.job_id.is_(None),
                _stored.c.spider_job_id.in_(bindparam("spider_jobs", expanding=True)),
            ),
        )
    )
    .order_by(_stored.c.id)
)
_ATTRIBUTE_UNAMBIGUOUS = (
    update(_stored)
    .where(
        _stored.c.job_id.is_(None),
        select(func.count()).where(_jobs.c.spider_id == _stored.c.spider_job_id).scalar_subquery()
        == 1,
    )
    .values(
        job_id=select(_jobs.c.id)
        .where(_jobs.c.spider_id == _stored.c.spider_job_id)
        .scalar_subquery()
    )
)
_ATTRIBUTE_UNAMBIGUOUS_OF_ONE = _ATTRIBUTE_UNAMBIGUOUS.where(
    _stored.c.spider_job_id == bindparam("w_spider_job")
)


@dataclass(frozen=True)
class StoredArchiveRecord:
    """One stored archive: which task instance stored what, where."""

    spider_job_id: int
    task_id: str
    instance_id: int
    dataset: str
    archive_id: str
    location: str
    size: int
    stored_at: datetime
    job_id: int | None = None
    """The compression job it was stored for; ``None`` only on records older than migration 0004."""
    state: str = STORED
    """Where the archive is in the outbox (see the module)."""
    id: int | None = None
    """The record's key (set on records read from the database)."""


def _values(record: StoredArchiveRecord) -> dict[str, object]:
    return {k: v for k, v in record.__dict__.items() if k != "id"}


def record_stored_archive(connection: Connection, record: StoredArchiveRecord) -> int:
    """Insert ``record`` in the caller's transaction; its id. Raises the driver's errors."""
    key = connection.execute(_INSERT, _values(record)).inserted_primary_key
    assert key is not None
    return int(key[0])


def begin_storing_attributed(connection: Connection, record: StoredArchiveRecord) -> int:
    """Insert ``record`` in state ``storing`` (before the archive is stored), attributed in the
    same statement (its ``job_id`` is ignored) to the one Running or Committed job that records
    its Spider job id; ``NULL`` when none or several do (the commit or the coordinator's sweep
    attributes it later). Its id.

    One round trip where reading the owner first would take two: the compress task's record of
    every archive. Raises the driver's errors.
    """
    values = {k: v for k, v in _values(record).items() if k != "job_id"}
    parameters = {**values, "state": STORING, "w_spider_job": record.spider_job_id}
    key = connection.execute(_INSERT_STORING_ATTRIBUTED, parameters).inserted_primary_key
    assert key is not None
    return int(key[0])


def mark_stored(connection: Connection, record_id: int, location: str, stored_at: datetime) -> bool:
    """``storing`` → ``stored``; ``False`` when clean-up claimed (or deleted) the record meanwhile.

    Only the record of ``location`` is marked: should it have been deleted meanwhile, its id may
    have been given to another archive's record (SQLite reuses the highest row id), which is not
    this task's to mark.

    Then the archive must not stay: the caller removes it (and its record).
    """
    parameters = {"record_id": record_id, "w_location": location, "marked_at": stored_at}
    result = connection.execute(_MARK_STORED, parameters)
    return int(result.rowcount) == 1


def claim_for_removal(connection: Connection, record_ids: Sequence[int]) -> None:
    """Mark the records ``removing`` (clean-up is about to remove their files)."""
    for start in range(0, len(record_ids), _BATCH):
        connection.execute(
            _CLAIM_FOR_REMOVAL, {"record_ids": list(record_ids[start : start + _BATCH])}
        )


def mark_published(connection: Connection, record_ids: Sequence[int]) -> None:
    """``stored`` → ``published``: a Succeeded job's published archives, kept for good."""
    for start in range(0, len(record_ids), _BATCH):
        connection.execute(
            _MARK_PUBLISHED, {"record_ids": list(record_ids[start : start + _BATCH])}
        )


def forget_records(connection: Connection, records: Sequence[tuple[int, str]]) -> int:
    """Delete the records given as (id, location) (their archives are gone); how many were.

    A record is deleted only with the location its archive was removed from: a removal retried
    after an outage may name a record deleted since, whose id SQLite may have given to another
    archive's record (it reuses the highest row id); that record and its file stay.
    """
    deleted = 0
    for start in range(0, len(records), _BATCH):
        batch = list(records[start : start + _BATCH])
        result = connection.execute(
            delete(_stored).where(tuple_(_stored.c.id, _stored.c.location).in_(batch))
        )
        deleted += int(result.rowcount)
    return deleted


def recorded_locations(engine: Engine) -> set[str]:
    """The location of every record, whatever its state (read in batches)."""
    locations: set[str] = set()
    last = 0
    while True:
        with reading(engine) as connection:
            rows = connection.execute(
                select(_stored.c.id, _stored.c.location)
                .where(_stored.c.id > last)
                .order_by(_stored.c.id)
                .limit(10_000)
            ).all()
        if not rows:
            return locations
        locations.update(str(row.location) for row in rows)
        last = int(rows[-1].id)


def stored_archives(connection: Connection, spider_job_id: int) -> list[StoredArchiveRecord]:
    """Every archive recorded for the Spider job, oldest first."""
    return _records(connection, _stored.c.spider_job_id == spider_job_id)


def stored_archives_of_job(connection: Connection, job_id: int) -> list[StoredArchiveRecord]:
    """Every archive recorded for the compression job, oldest first."""
    rows = connection.execute(_RECORDS_OF_JOB, {"job_id": job_id}).mappings()
    return [StoredArchiveRecord(**row) for row in rows]


@dataclass
class RecordsOfJob:
    """A job's records, and whether its Spider job stored records that name no job yet."""

    records: list[StoredArchiveRecord]
    """Every archive recorded for the job, oldest first."""
    unattributed: bool
    """Records of its Spider job name no job (``attribute_unambiguous_records`` would try)."""


def records_of_jobs(
    connection: Connection, jobs: Sequence[tuple[int, int | None]]
) -> dict[int, RecordsOfJob]:
    """``stored_archives_of_job`` of each ``(job id, Spider job id)``, and whether its Spider job
    left records unattributed, in one query per ``_BATCH`` jobs. Raises the driver's errors."""
    found = {job_id: RecordsOfJob([], unattributed=False) for job_id, _ in jobs}
    for start in range(0, len(jobs), _BATCH):
        batch = jobs[start : start + _BATCH]
        by_spider_job: dict[int, list[int]] = {}
        for job_id, spider_job_id in batch:
            if spider_job_id is not None:
                by_spider_job.setdefault(spider_job_id, []).append(job_id)
        params = {"job_ids": [job_id for job_id, _ in batch], "spider_jobs": list(by_spider_job)}
        for row in connection.execute(_RECORDS_OF_JOBS_OR_UNATTRIBUTED, params).mappings():
            record = StoredArchiveRecord(**row)
            if record.job_id is not None:
                found[record.job_id].records.append(record)
                continue
            for job_id in by_spider_job.get(record.spider_job_id, ()):
                found[job_id].unattributed = True
    return found


def tasks_with_stored_archives(connection: Connection, job_id: int) -> int:
    """How many tasks of the compression job have recorded an archive (in any state).

    A compress task records its archives as it stores them, so this is how many have got that
    far: the progress ``coordinator demo`` shows.
    """
    return int(
        connection.execute(
            select(func.count(func.distinct(_stored.c.task_id))).where(_stored.c.job_id == job_id)
        ).scalar_one()
    )


def _records(connection: Connection, condition: Any) -> list[StoredArchiveRecord]:
    rows = connection.execute(select(_stored).where(condition).order_by(_stored.c.id)).mappings()
    return [StoredArchiveRecord(**row) for row in rows]


def unattributed_orphans(
    connection: Connection, stored_before: datetime
) -> list[StoredArchiveRecord]:
    """Unattributed records, stored before ``stored_before``, that no job can still publish.

    A record stays unattributed when, as its archive was stored, no single in-flight job recorded
    its Spider job id (a reset Spider reused the id while an earlier job with it was in flight, or
    the job had already ended). Once no Pending, Running or Committed job records that id, no
    commit can publish the archive any more (a commit attributes what it publishes).
    """
    live = (
        select(_jobs.c.id)
        .where(
            _jobs.c.spider_id == _stored.c.spider_job_id,
            in_constants(_jobs.c.status, [int(JobStatus.PENDING), *IN_FLIGHT_STATUS_VALUES]),
        )
        .exists()
    )
    return _records(
        connection,
        and_(
            _stored.c.job_id.is_(None),
            _stored.c.stored_at < stored_before,
            _stored.c.state != PUBLISHED,
            ~live,
        ),
    )


def attribute_stored_archives(
    connection: Connection, job_id: int, spider_job_id: int, archive_ids: Sequence[str]
) -> None:
    """Name ``job_id`` on the unattributed records of ``archive_ids`` the Spider job stored."""
    for start in range(0, len(archive_ids), _BATCH):
        connection.execute(
            _ATTRIBUTE,
            {
                "spider_job": spider_job_id,
                "archive_ids": list(archive_ids[start : start + _BATCH]),
                "owner": job_id,
            },
        )


def attribute_unambiguous_records(connection: Connection, spider_job_id: int | None = None) -> int:
    """Name the job on unattributed records whose Spider job id exactly one job records; how many.

    Records the compress task could not attribute (no single in-flight job at the time, e.g. a
    foreign writer had already finished the job) become attributable once the job row is known;
    an id several jobs share stays unattributed. ``spider_job_id`` limits this to one Spider job.
    """
    if spider_job_id is None:
        result = connection.execute(_ATTRIBUTE_UNAMBIGUOUS)
    else:
        result = connection.execute(_ATTRIBUTE_UNAMBIGUOUS_OF_ONE, {"w_spider_job": spider_job_id})
    return int(result.rowcount)


def forget_stored_archives(
    connection: Connection, spider_job_id: int, locations: Sequence[str]
) -> int:
    """Delete the records of ``locations`` (archives already removed); how many were deleted."""
    return _forget(connection, _stored.c.spider_job_id == spider_job_id, locations)


def forget_job_archives(connection: Connection, job_id: int, locations: Sequence[str]) -> int:
    """Delete the job's records of ``locations`` (removed, or CLP's now); how many were deleted."""
    return _forget(connection, _stored.c.job_id == job_id, locations)


def _forget(connection: Connection, owner: Any, locations: Sequence[str]) -> int:
    deleted = 0
    for start in range(0, len(locations), 1000):
        batch = list(locations[start : start + 1000])
        result = connection.execute(delete(_stored).where(owner, _stored.c.location.in_(batch)))
        deleted += int(result.rowcount)
    return deleted
