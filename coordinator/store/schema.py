"""The database schema as SQLAlchemy Core tables on one ``MetaData``.

CLP's tables keep CLP's DDL column for column (``docs/clp.md``, Tables); the coordinator adds the
lease and cancel-request columns to ``compression_jobs`` and a transition history table of its own.
The migrations in ``migrations/`` create exactly this schema (a test compares them); the per-dataset
archive tables are created on demand by ``coordinator.store.datasets``.

Plain Core, not ORM models: every user builds Core statements over these tables (``table.c.col``),
and not importing ``sqlalchemy.orm`` keeps every process's start-up shorter (issue 14). A column
is ``nullable=False`` unless it may hold ``NULL``; a primary key is never ``NULL``.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Enum,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
)

from coordinator.store import names
from coordinator.store.sqltypes import (
    BigIntKey,
    CurrentTimestamp,
    LongBlob,
    MediumBlob,
    Millis,
    UnsignedBigInt,
    UnsignedBigIntKey,
)

STATUS_MSG_MAX_CHARS = 512
"""``compression_jobs.status_msg`` is ``VARCHAR(512)``."""

MYSQL_TABLE_OPTIONS: dict[str, Any] = {"mysql_row_format": "DYNAMIC", "mysql_charset": "utf8mb4"}
"""Tables the coordinator creates hold UTF-8 keys and messages, whatever the server's default."""

metadata = MetaData()
"""The coordinator's schema: every table below."""


compression_jobs = Table(
    names.COMPRESSION_JOBS,
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("status", Integer, nullable=False, server_default="0"),
    Column("status_msg", String(STATUS_MSG_MAX_CHARS), nullable=False, server_default=""),
    Column("creation_time", Millis, nullable=False, server_default=CurrentTimestamp(3)),
    Column("start_time", Millis),
    Column(
        "update_time", DateTime(), nullable=False, server_default=CurrentTimestamp(on_update=True)
    ),
    Column("duration", Float),
    Column("original_size", BigInteger, nullable=False, server_default="0"),
    Column("uncompressed_size", BigInteger, nullable=False, server_default="0"),
    Column("compressed_size", BigInteger, nullable=False, server_default="0"),
    Column("num_tasks", Integer, nullable=False, server_default="0"),
    Column("num_tasks_completed", Integer, nullable=False, server_default="0"),
    Column("clp_binary_version", Integer),
    Column("spider_id", UnsignedBigInt),
    Column("dispatch_time", DateTime()),
    Column("clp_config", MediumBlob, nullable=False),
    # The coordinator's additions (migration 0002).
    # lease_owner: the coordinator instance driving the job, when one is.
    Column("lease_owner", String(255)),
    # lease_expires_at: after this instant another coordinator may take the job over.
    Column("lease_expires_at", Millis),
    # lease_epoch: fencing token, bumped whenever ownership changes; a fenced write checks it.
    Column("lease_epoch", Integer, nullable=False, server_default="0"),
    # cancel_requested_at: when an operator asked for the job to be cancelled.
    Column("cancel_requested_at", Millis),
    # committed_at: when the commit task published the archives (migration 0004): the Committed
    # marker.
    Column("committed_at", Millis),
    Index("JOB_STATUS", "status"),
    Index("JOB_UPDATE_TIME", "update_time"),
    Index("JOB_START_TIME_STATUS", "start_time", "status"),
    Index("JOB_SPIDER_ID", "spider_id"),
    Index("JOB_LEASE", "status", "lease_expires_at"),
    **MYSQL_TABLE_OPTIONS,
)
"""A row of CLP's ``compression_jobs`` plus the coordinator's lease and cancel columns."""


job_transitions = Table(
    names.COMPRESSION_JOB_TRANSITIONS,
    metadata,
    Column("id", BigIntKey, primary_key=True, autoincrement=True),
    Column("job_id", Integer, nullable=False),
    Column("from_status", Integer, nullable=False),
    Column("to_status", Integer, nullable=False),
    Column("trigger", String(32), nullable=False),
    Column("actor", String(32), nullable=False),
    # actor_id: which instance of the actor (a coordinator's id, a Spider task instance, a user
    # name).
    Column("actor_id", String(255), nullable=False, server_default=""),
    Column("reason", Text, nullable=False),
    Column("spider_id", UnsignedBigInt),
    Column("lease_epoch", Integer, nullable=False),
    Column("at", Millis, nullable=False),
    Index("TRANSITION_JOB_ID", "job_id", "id"),
    **MYSQL_TABLE_OPTIONS,
)
"""One applied move of one job: the audit trail, written in the move's own transaction."""


datasets = Table(
    names.DATASETS,
    metadata,
    Column("name", String(255), primary_key=True),
    Column("archive_storage_directory", String(4096), nullable=False),
    **MYSQL_TABLE_OPTIONS,
)
"""CLP's ``clp_datasets`` (clp-s storage engine)."""


ingestion_jobs = Table(
    names.INGESTION_JOBS,
    metadata,
    Column("id", UnsignedBigIntKey, primary_key=True, autoincrement=True),
    Column("config", Text, nullable=False),
    Column(
        "status",
        Enum(
            "requested",
            "running",
            "paused",
            "failed",
            "finished",
            name="ingestion_job_status",
            create_constraint=True,
        ),
        nullable=False,
        server_default="requested",
    ),
    Column("status_msg", Text),
    Column("num_files_compressed", UnsignedBigInt, nullable=False, server_default="0"),
    Column("creation_ts", Millis, nullable=False, server_default=CurrentTimestamp(3)),
    Column(
        "last_update_ts",
        Millis,
        nullable=False,
        server_default=CurrentTimestamp(3, on_update=True),
    ),
    **MYSQL_TABLE_OPTIONS,
)
"""log-ingestor's ``ingestion_job``."""


ingested_s3_object_metadata = Table(
    names.INGESTED_S3_OBJECT_METADATA,
    metadata,
    Column("id", UnsignedBigIntKey, primary_key=True, autoincrement=True),
    Column("bucket", String(1024), nullable=False),
    Column("key", String(1024), nullable=False),
    Column("size", UnsignedBigInt, nullable=False),
    Column(
        "status",
        Enum(
            "buffered",
            "submitted",
            "compressed",
            "failed",
            name="ingested_s3_object_status",
            create_constraint=True,
        ),
        nullable=False,
        server_default="buffered",
    ),
    Column(
        "ingestion_job_id",
        UnsignedBigInt,
        ForeignKey(f"{names.INGESTION_JOBS}.id", ondelete="RESTRICT"),
        nullable=False,
    ),
    Column(
        "compression_job_id",
        Integer,
        ForeignKey(f"{names.COMPRESSION_JOBS}.id", ondelete="RESTRICT"),
    ),
    Column("creation_ts", Millis, nullable=False, server_default=CurrentTimestamp(3)),
    Column(
        "last_update_ts",
        Millis,
        nullable=False,
        server_default=CurrentTimestamp(3, on_update=True),
    ),
    Index("index_ingestion_job_id", "ingestion_job_id"),
    Index("index_compression_job_id", "compression_job_id"),
    **MYSQL_TABLE_OPTIONS,
)
"""log-ingestor's ``ingested_s3_object_metadata``: the S3 objects a job compresses."""


spider_resource_groups = Table(
    names.SPIDER_RESOURCE_GROUPS,
    metadata,
    Column("rg_name", String(255), primary_key=True),
    Column("rg_id", UnsignedBigInt, nullable=False),
    **MYSQL_TABLE_OPTIONS,
)
"""``spider_resource_groups``: Spider resource group ids (Spider has no lookup by name)."""


stored_archives = Table(
    names.STORED_ARCHIVES,
    metadata,
    Column("id", BigIntKey, primary_key=True, autoincrement=True),
    Column("spider_job_id", UnsignedBigInt, nullable=False),
    Column("task_id", String(16), nullable=False),
    Column("instance_id", BigInteger, nullable=False),
    Column("dataset", String(255), nullable=False),
    Column("archive_id", String(64), nullable=False),
    Column("location", String(2048), nullable=False),
    Column("size", BigInteger, nullable=False),
    Column("stored_at", Millis, nullable=False),
    # job_id: the compression job it was stored for (migration 0004; older records may lack it).
    Column("job_id", Integer),
    # state: storing, stored, published or removing (migration 0007).
    Column("state", String(16), nullable=False, server_default="stored"),
    Index("STORED_ARCHIVE_SPIDER_JOB", "spider_job_id"),
    Index("STORED_ARCHIVE_ID", "archive_id"),
    Index("STORED_ARCHIVE_JOB", "job_id"),
    **MYSQL_TABLE_OPTIONS,
)
"""An archive a compress task instance stores or stored, published or not (an outbox).

Written by the task **before** it stores the archive (``state`` ``storing``, the location is
deterministic) and marked ``stored`` after, so that every archive file of a job that never
commits (failed, cancelled, rolled back, a retried, killed or late instance's) can always be
found and removed (``coordinator.store.stored_archives``). ``location`` is a file path or
``s3://bucket/key``.
"""


engine_resource_groups = Table(
    names.ENGINE_RESOURCE_GROUPS,
    metadata,
    Column("id", UnsignedBigIntKey, primary_key=True, autoincrement=True),
    Column("external_id", String(255), nullable=False, unique=True),
    Column("password", LargeBinary, nullable=False),
    **MYSQL_TABLE_OPTIONS,
)
"""The embedded engine's resource groups (Spider's ``resource_groups``)."""


engine_jobs = Table(
    names.ENGINE_JOBS,
    metadata,
    Column("id", UnsignedBigIntKey, primary_key=True, autoincrement=True),
    Column("resource_group_id", UnsignedBigInt, nullable=False),
    Column("state", String(16), nullable=False),
    Column("task_graph", LongBlob, nullable=False),
    Column("inputs", LongBlob, nullable=False),
    Column("outputs", LongBlob),
    Column("error_message", Text),
    Column("created_at", Millis, nullable=False),
    Column("updated_at", Millis, nullable=False),
    # owner: the token of the engine instance executing the job (migration 0006); none: an orphan.
    Column("owner", String(64)),
    Index("ENGINE_JOB_STATE", "state"),
    Index("ENGINE_JOB_OWNER", "owner"),
    **MYSQL_TABLE_OPTIONS,
)
"""A job of the embedded engine (Spider's ``jobs``): what survives the engine's restart.

Task states and retry counters live in memory only, as in Spider: a job found ``Running`` after
a restart runs again from the start, a ``CommitReady`` one runs its commit again.
"""


coordinator_instances = Table(
    names.COORDINATOR_INSTANCES,
    metadata,
    Column("kind", String(16), primary_key=True),
    Column("name", String(255), primary_key=True),
    Column("token", String(64), nullable=False, unique=True),
    Column("host", String(255), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("started_at", Millis, nullable=False),
    Column("heartbeat_at", Millis, nullable=False),
    Column("expires_at", Millis, nullable=False),
    **MYSQL_TABLE_OPTIONS,
)
"""A live coordinator process (or standalone engine) and its heartbeat (migration 0006).

One row per coordinator ``instance_id`` (kind ``coordinator``) or standalone engine (kind
``engine``); ``token`` is new at every process start and owns that process's engine jobs.
"""


adopted_tables = Table(
    names.ADOPTED_TABLES,
    metadata,
    Column("table_name", String(255), primary_key=True),
    **MYSQL_TABLE_OPTIONS,
)
"""A table that already existed when migration 0001 ran (it belonged to CLP).

Downgrading past 0001 keeps adopted tables (and their rows) and drops only what it created.
"""
