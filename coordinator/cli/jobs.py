"""``jobs`` and ``show``: what an operator reads of compression jobs (``cancel``:
``coordinator.service.operator_cancel``).

``show --json`` is a stable document::

    {"id", "status", "status_code", "spider_id", "status_msg", "dataset", "num_tasks",
     "creation_time", "start_time", "duration", "uncompressed_size", "compressed_size",
     "cancel_requested": bool,
     "history": [{"from", "to", "trigger", "actor", "actor_id", "reason", "at"}],
     "archives": [{"id", "size", "uncompressed_size", "begin_timestamp", "end_timestamp",
                   "location"}]}

Statuses are the lifecycle's names (``Pending`` … ``Committed``); times are ISO 8601 UTC.
``dataset`` is ``null`` when the job's config cannot be decoded (or names an invalid dataset).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, cast

from sqlalchemy import Engine, Row, Table, select

from coordinator.lifecycle import describe_status, describe_stored
from coordinator.service.prepare import known_dataset_of
from coordinator.store.archives import published_archives_of_job
from coordinator.store.datasets import archives_table
from coordinator.store.jobs import JobStore, NoSuchJob
from coordinator.store.schema import CompressionJob
from coordinator.store.stored_archives import stored_archives_of_job

_jobs = cast(Table, CompressionJob.__table__)


def _time(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat(timespec="milliseconds") + "Z"


def list_jobs(engine: Engine, limit: int = 100) -> list[dict[str, Any]]:
    """The newest ``limit`` jobs, newest first, as short documents."""
    with engine.connect() as connection:
        rows = connection.execute(
            select(
                _jobs.c.id,
                _jobs.c.status,
                _jobs.c.committed_at,
                _jobs.c.spider_id,
                _jobs.c.num_tasks,
                _jobs.c.creation_time,
                _jobs.c.status_msg,
            )
            .order_by(_jobs.c.id.desc())
            .limit(limit)
        ).all()
    return [
        {
            "id": row.id,
            "status": describe_stored(row.status, row.committed_at),
            "spider_id": row.spider_id,
            "num_tasks": row.num_tasks,
            "creation_time": _time(row.creation_time),
            "status_msg": row.status_msg,
        }
        for row in rows
    ]


def show_job(store: JobStore, job_id: int) -> dict[str, Any]:
    """The ``show`` document of the job; raises ``NoSuchJob``."""
    job = store.get(job_id)
    if job is None:
        raise NoSuchJob(f"no compression job {job_id}")
    # None when the config does not decode (or names an invalid dataset): shown, never fatal.
    dataset = known_dataset_of(job.clp_config)
    return {
        "id": job.id,
        "status": describe_stored(job.status, job.committed_at),
        "status_code": job.status,
        "committed_at": _time(job.committed_at),
        "spider_id": job.spider_id,
        "status_msg": job.status_msg,
        "dataset": dataset,
        "num_tasks": job.num_tasks,
        "creation_time": _time(job.creation_time),
        "start_time": _time(job.start_time),
        "duration": job.duration,
        "uncompressed_size": job.uncompressed_size,
        "compressed_size": job.compressed_size,
        "cancel_requested": job.cancel_requested_at is not None,
        "history": [
            {
                "from": describe_status(entry.from_status),
                "to": describe_status(entry.to_status),
                "trigger": entry.trigger,
                "actor": entry.actor,
                "actor_id": entry.actor_id,
                "reason": entry.reason,
                "at": _time(entry.at),
            }
            for entry in store.history(job_id)
        ],
        "archives": _published_archives(store.engine, job.id, job.spider_id),
    }


def _published_archives(engine: Engine, job_id: int, spider_id: int | None) -> list[dict[str, Any]]:
    rows: list[Row[Any]] = []
    with engine.connect() as connection:
        locations = {r.archive_id: r.location for r in stored_archives_of_job(connection, job_id)}
        for dataset, ids in published_archives_of_job(connection, job_id, spider_id).items():
            table = archives_table(dataset)
            rows += connection.execute(
                select(table).where(table.c.id.in_(ids)).order_by(table.c.creation_ix)
            ).all()
    return [
        {
            "id": row.id,
            "size": row.size,
            "uncompressed_size": row.uncompressed_size,
            "begin_timestamp": row.begin_timestamp,
            "end_timestamp": row.end_timestamp,
            "location": locations.get(row.id),
        }
        for row in rows
    ]
