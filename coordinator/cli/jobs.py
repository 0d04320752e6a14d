"""``jobs`` and ``show``: what an operator reads of compression jobs (``cancel``:
``coordinator.service.operator_cancel``).

``jobs --json`` is a list of row documents, newest first::

    [{"id", "status", "spider_id", "dataset", "num_tasks", "creation_time", "status_msg",
      "cancel"}]

``show --json`` is a stable document::

    {"id", "status", "status_code", "committed_at", "spider_id", "status_msg", "dataset",
     "num_tasks", "creation_time", "start_time", "duration", "uncompressed_size",
     "compressed_size", "cancel_requested": bool, "cancel",
     "history": [{"from", "to", "trigger", "actor", "actor_id", "reason", "at"}],
     "archives": [{"id", "size", "uncompressed_size", "begin_timestamp", "end_timestamp",
                   "location"}],
     "archives_unknown"}

``cancel`` is ``null`` without an operator's cancel request, else one line saying what became of
it (``cancel_note``): a cancel that came after the commit leaves the job Succeeded, and says so.
``archives`` lists what the job published: the archives this coordinator's compress tasks recorded,
or, for a Succeeded job whose archives CLP's own commit published (CLP's task package on a Spider
cluster), those Spider's outputs name (``coordinator.service.clp_published``);
``archives_unknown`` is ``null``, or why the latter could not be listed.

Statuses are the lifecycle's names (``Pending`` … ``Committed``); times are ISO 8601 UTC.
``dataset`` is ``null`` when the job's config cannot be decoded (or names an invalid dataset).

``jobs`` filters (``list_jobs``): lifecycle statuses (``parse_statuses``: case-insensitive,
repeatable or comma-separated), a dataset, a creation time (``parse_since``: an ISO 8601 date or
time, naive meaning UTC, or an age such as ``30m``, ``2h``, ``7d``) and a limit (``parse_limit``: a
positive number or ``all``; the filters themselves: ``coordinator.cli.job_filters``, re-exported
here). A mistyped filter raises ``InvalidFilter``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Engine, Row, and_, or_, select

from coordinator.cli.job_filters import (
    DEFAULT_LIMIT,
    STATUS_NAMES,
    InvalidFilter,
    naive_utc,
    parse_limit,
    parse_since,
    parse_statuses,
)
from coordinator.lifecycle import JobStatus, describe_status, describe_stored
from coordinator.service.clp_published import ArchivesUnknown, ClpPublished
from coordinator.service.prepare import known_dataset_of
from coordinator.store.archives import published_archives_of_job
from coordinator.store.database import reading
from coordinator.store.datasets import archives_table
from coordinator.store.guarded import in_state
from coordinator.store.jobs import JobStore, NoSuchJob
from coordinator.store.names import InvalidDatasetName, validate_dataset_name
from coordinator.store.schema import compression_jobs as _jobs
from coordinator.store.stored_archives import stored_archives_of_job

__all__ = [
    "DEFAULT_LIMIT",
    "STATUS_NAMES",
    "InvalidFilter",
    "format_job",
    "format_jobs",
    "list_jobs",
    "parse_limit",
    "parse_since",
    "parse_statuses",
    "show_job",
]


_BATCH = 500
"""Rows read at a time while a dataset filter (decoded from each job's config) is applied."""


def _time(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat(timespec="milliseconds") + "Z"


# --- filters ---------------------------------------------------------------------------------


def _dataset_filter(dataset: str) -> str:
    try:
        return validate_dataset_name(dataset)
    except InvalidDatasetName as error:
        raise InvalidFilter(str(error)) from None


# --- jobs --------------------------------------------------------------------------------------


def list_jobs(
    engine: Engine,
    *,
    statuses: Sequence[str] = (),
    dataset: str | None = None,
    since: datetime | None = None,
    limit: int | None = DEFAULT_LIMIT,
) -> list[dict[str, Any]]:
    """The newest jobs first, as row documents (module docstring), at most ``limit`` (``None``:
    all) of those matching every filter given.

    ``statuses``: lifecycle names in any case (a job in any of them; both stored forms of
    Committed), ``dataset``: the dataset the job's config names (``default`` when it names none;
    a config that does not decode matches no dataset), ``since``: created at or after this
    instant (naive: UTC). Status and time filter in SQL; the dataset, which lives in the encoded
    config, is read row by row, and ``limit`` counts only the jobs that match it.

    Raises ``InvalidFilter`` for an unknown status, an invalid dataset name or a limit below 1.
    """
    if limit is not None and limit < 1:
        raise InvalidFilter(f"invalid limit {limit}: use a positive number of jobs, or no limit")
    wanted = _dataset_filter(dataset) if dataset is not None else None
    conditions: list[ColumnElement[bool]] = []
    states = parse_statuses(statuses)
    if states:
        conditions.append(or_(*(and_(*in_state(JobStatus.from_label(label))) for label in states)))
    if since is not None:
        conditions.append(_jobs.c.creation_time >= naive_utc(since))
    query = select(
        _jobs.c.id,
        _jobs.c.status,
        _jobs.c.committed_at,
        _jobs.c.spider_id,
        _jobs.c.num_tasks,
        _jobs.c.creation_time,
        _jobs.c.status_msg,
        _jobs.c.clp_config,
        _jobs.c.cancel_requested_at,
    ).order_by(_jobs.c.id.desc())
    documents: list[dict[str, Any]] = []
    before: int | None = None
    with reading(engine) as connection:
        while limit is None or len(documents) < limit:
            page = query.where(*conditions)
            if before is not None:
                page = page.where(_jobs.c.id < before)
            # Without a dataset filter every row read is listed: read no more than needed.
            size = (
                _BATCH
                if wanted is not None or limit is None
                else min(_BATCH, limit - len(documents))
            )
            rows: list[Row[Any]] = list(connection.execute(page.limit(size)))
            for row in rows:
                document = _row_document(row)
                if wanted is None or document["dataset"] == wanted:
                    documents.append(document)
                    if limit is not None and len(documents) == limit:
                        break
            if len(rows) < size:
                break
            before = rows[-1].id
    return documents


def _row_document(row: Row[Any]) -> dict[str, Any]:
    status = describe_stored(row.status, row.committed_at)
    return {
        "id": row.id,
        "status": status,
        "spider_id": row.spider_id,
        "dataset": known_dataset_of(row.clp_config),
        "num_tasks": row.num_tasks,
        "creation_time": _time(row.creation_time),
        "status_msg": row.status_msg,
        "cancel": cancel_note(status, requested=row.cancel_requested_at is not None),
    }


def cancel_note(status: str, *, requested: bool) -> str | None:
    """What became of an operator's cancel request, in one line (``None``: no request).

    A job Succeeded or Failed despite the request ended before the cancel took effect: with CLP's
    own commit task, the commit publishes and writes SUCCEEDED in one transaction, and a cancel
    that comes after it has nothing left to withdraw (``coordinator.lifecycle.FENCING``).
    """
    if not requested:
        return None
    if status == JobStatus.SUCCEEDED.label:
        return "the cancel came after the commit had published it: Succeeded"
    if status == JobStatus.FAILED.label:
        return "the cancel came after the job had failed"
    if status == JobStatus.KILLED.label:
        return "cancelled by an operator"
    return "cancel requested: the coordinator driving it acts on it"


_MESSAGE_WIDTH = 60


def format_jobs(rows: Sequence[dict[str, Any]], *, filtered: bool = False) -> list[str]:
    """The ``jobs`` table of ``list_jobs``'s rows: a header and one line a job; one line saying
    there is none (``no jobs``, or ``no jobs match`` when ``filtered``) for no rows."""
    if not rows:
        return ["no jobs match" if filtered else "no jobs"]
    cells = [
        (
            str(row["id"]),
            row["status"],
            "" if row["spider_id"] is None else str(row["spider_id"]),
            str(row["num_tasks"]),
            row["creation_time"] or "",
            row["dataset"] or "unknown",
            _one_line(row["status_msg"] or row["cancel"] or ""),
        )
        for row in rows
    ]
    header = ("id", "status", "spider_id", "tasks", "created", "dataset", "message")
    minimum = (6, 10, 10, 5, 24, 7)
    widths = [max(least, *(len(line[i]) for line in cells)) for i, least in enumerate(minimum)]
    right = (True, False, True, True, False, False)

    def line(values: tuple[str, ...]) -> str:
        fixed = [
            value.rjust(width) if flush_right else value.ljust(width)
            for value, width, flush_right in zip(values, widths, right, strict=False)
        ]
        return (
            f"{fixed[0]}  {fixed[1]} {fixed[2]} {fixed[3]}  {fixed[4]}  {fixed[5]}  {values[6]}"
        ).rstrip()

    return [line(header), *(line(values) for values in cells)]


def _one_line(message: str) -> str:
    flat = " ".join(message.split())
    return flat if len(flat) <= _MESSAGE_WIDTH else flat[: _MESSAGE_WIDTH - 1] + "…"


# --- show --------------------------------------------------------------------------------------


SpiderArchives = Callable[[int, str], list[ClpPublished]]
"""``clp_published_archives`` bound to a Spider and an archive output: (Spider job id, dataset)."""


def show_job(
    store: JobStore, job_id: int, *, spider_archives: SpiderArchives | None = None
) -> dict[str, Any]:
    """The ``show`` document of the job; raises ``NoSuchJob``.

    ``spider_archives`` lists the archives of a Succeeded job that has no archive records of this
    coordinator (CLP's own commit published them); without it, such a job lists none.
    """
    job = store.get(job_id)
    if job is None:
        raise NoSuchJob(f"no compression job {job_id}")
    # None when the config does not decode (or names an invalid dataset): shown, never fatal.
    dataset = known_dataset_of(job.clp_config)
    status = describe_stored(job.status, job.committed_at)
    archives = _published_archives(store.engine, job.id, job.spider_id)
    unknown: str | None = None
    succeeded = status == JobStatus.SUCCEEDED.label
    if not archives and succeeded and spider_archives and job.spider_id and dataset:
        try:
            archives = [asdict(archive) for archive in spider_archives(job.spider_id, dataset)]
        except ArchivesUnknown as error:
            unknown = str(error)
    return {
        "id": job.id,
        "status": status,
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
        "cancel": cancel_note(status, requested=job.cancel_requested_at is not None),
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
        "archives": archives,
        "archives_unknown": unknown,
    }


def format_job(document: dict[str, Any]) -> list[str]:
    """What ``show`` prints of ``show_job``'s document: only what is known (no empty heading, no
    ``None``)."""
    spider = "" if document["spider_id"] is None else f"  (Spider job {document['spider_id']})"
    lines = [f"Job {document['id']}: {document['status']}{spider}"]
    if document["status_msg"]:
        lines += [f"  {text}" for text in document["status_msg"].splitlines() if text.strip()]
    facts = [f"dataset {document['dataset'] or 'unknown (the job config does not decode)'}"]
    if document["num_tasks"]:
        facts.append(f"{document['num_tasks']} task(s)")
    if _sizes_known(document):
        facts.append(f"{document['uncompressed_size']:,} B -> {document['compressed_size']:,} B")
    lines.append("  " + ", ".join(facts))
    times = [f"created {document['creation_time']}"] if document["creation_time"] else []
    if document["start_time"]:
        times.append(f"started {document['start_time']}")
    if document["committed_at"]:
        times.append(f"committed {document['committed_at']}")
    if document["duration"] is not None:
        times.append(f"took {document['duration']:.3f} s")
    if times:
        lines.append("  " + ", ".join(times))
    if document["cancel"]:
        lines.append(f"  {document['cancel']}")
    if document["history"]:
        lines.append("History:")
        lines += [f"  {_history_line(entry)}" for entry in document["history"]]
    if document["archives"]:
        lines.append("Archives:")
        lines += [f"  {_archive_line(archive)}" for archive in document["archives"]]
    elif document["archives_unknown"]:
        lines.append(f"Archives: unknown ({document['archives_unknown']})")
    return lines


def _sizes_known(document: dict[str, Any]) -> bool:
    """Whether the sizes were recorded: they are 0 until a job's commit (a Succeeded job may
    really have compressed nothing)."""
    recorded = bool(document["uncompressed_size"] or document["compressed_size"])
    return recorded or document["status"] == JobStatus.SUCCEEDED.label


def _history_line(entry: dict[str, Any]) -> str:
    actor = " ".join(str(part) for part in (entry["actor"], entry["actor_id"]) if part)
    line = f"{entry['at']}  {entry['from']} -> {entry['to']}  {entry['trigger']}"
    if actor:
        line += f" by {actor}"
    if entry["reason"]:
        line += f": {' '.join(entry['reason'].split())}"
    return line


def _archive_line(archive: dict[str, Any]) -> str:
    line = f"{archive['id']}  {archive['size']:,} B"
    if archive["uncompressed_size"] is not None:
        line += f" (from {archive['uncompressed_size']:,} B)"
    if archive["location"]:
        line += f"  {archive['location']}"
    return line


def _published_archives(engine: Engine, job_id: int, spider_id: int | None) -> list[dict[str, Any]]:
    rows: list[Row[Any]] = []
    with reading(engine) as connection:
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
