"""What a schema downgrade must respect: CLP's tables and CLP's readers.

A downgrade removes only what is the coordinator's own (its columns, its tables, its registry) and
never a CLP table or a column CLP's current DDL has, whoever created it: CLP fills and references
those tables (``compression_tasks`` references ``compression_jobs``, log-ingestor's tables
reference each other), so dropping them would lose CLP's data or fail half-way.

Nor may a downgrade leave rows CLP cannot read. CLP's readers know the statuses 0–4 only
(``CompressionJobStatus`` in Python and Rust); a Committed job (status 5, or RUNNING (1) with the
``committed_at`` marker of migration 0004) has published its archives and awaits Spider's word, and
without the coordinator's schema nothing could tell it apart from a running one. So a downgrade
refuses, before it changes anything, while any job is in such a state:
``refuse_unless_clp_can_read`` runs in ``migrations/env.py`` before the first downgrade step
(alembic commits each step's revision on its own, so a refusal by a later step would leave the
revision moved) and again at the start of each revision's downgrade.
"""

from __future__ import annotations

from sqlalchemy import Connection, inspect, text

from coordinator.errors import CoordinatorError

CLP_STATUSES = (0, 1, 2, 3, 4)
"""CLP's ``CompressionJobStatus``: PENDING, RUNNING, SUCCEEDED, FAILED, KILLED (never change)."""
_RUNNING = 1

CLP_TABLES = (
    "compression_jobs",
    "compression_tasks",
    "ingestion_job",
    "ingestion_job_s3_scanner_state",
    "ingested_s3_object_metadata",
    "clp_datasets",
    "spider_resource_groups",
    "query_jobs",
    "query_tasks",
)
"""CLP's tables no downgrade drops (with every ``clp_*`` per-dataset table)."""

_LISTED = 10


class DowngradeRefused(CoordinatorError, RuntimeError):
    """The downgrade would leave jobs CLP cannot read; nothing was changed."""


def jobs_clp_cannot_read(connection: Connection, limit: int = _LISTED) -> list[tuple[int, int]]:
    """``(id, status)`` of up to ``limit`` jobs whose state CLP cannot read, oldest first."""
    inspector = inspect(connection)
    if not inspector.has_table("compression_jobs"):
        return []
    columns = {column["name"] for column in inspector.get_columns("compression_jobs")}
    statuses = ", ".join(str(status) for status in CLP_STATUSES)
    condition = f"status NOT IN ({statuses})"
    if "committed_at" in columns:
        condition += f" OR (status = {_RUNNING} AND committed_at IS NOT NULL)"
    rows = connection.execute(
        text(f"SELECT id, status FROM compression_jobs WHERE {condition} ORDER BY id LIMIT {limit}")
    ).all()
    return [(int(row[0]), int(row[1])) for row in rows]


def refuse_unless_clp_can_read(connection: Connection) -> None:
    """Raise ``DowngradeRefused`` while a job is in a state CLP cannot read (module docstring)."""
    jobs = jobs_clp_cannot_read(connection)
    if not jobs:
        return
    listed = ", ".join(
        f"{job_id} (Committed)" if status in (_RUNNING, 5) else f"{job_id} (status {status})"
        for job_id, status in jobs
    )
    if len(jobs) == _LISTED:
        listed += " and possibly more"
    raise DowngradeRefused(
        f"cannot downgrade: compression job(s) {listed} are in a state CLP cannot read "
        "(Committed: archives published, Spider's confirmation pending); run the coordinator "
        "until they finish, then retry. Nothing was changed."
    )
