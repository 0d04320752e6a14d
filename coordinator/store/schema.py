"""The database schema as typed SQLAlchemy 2 models.

CLP's tables keep CLP's DDL column for column (``docs/clp.md``, Tables); the coordinator adds the
lease and cancel-request columns to ``compression_jobs`` and a transition history table of its own.
The migrations in ``migrations/`` create exactly this schema (a test compares them); the per-dataset
archive tables are created on demand by ``coordinator.store.datasets``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Enum,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

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


class Base(DeclarativeBase):
    """Declarative base of the coordinator's schema."""

    metadata = MetaData()


class CompressionJob(Base):
    """A row of CLP's ``compression_jobs`` plus the coordinator's lease and cancel columns."""

    __tablename__ = names.COMPRESSION_JOBS
    __table_args__ = (
        Index("JOB_STATUS", "status"),
        Index("JOB_UPDATE_TIME", "update_time"),
        Index("JOB_START_TIME_STATUS", "start_time", "status"),
        Index("JOB_SPIDER_ID", "spider_id"),
        Index("JOB_LEASE", "status", "lease_expires_at"),
        MYSQL_TABLE_OPTIONS,
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    status: Mapped[int] = mapped_column(Integer, server_default="0")
    status_msg: Mapped[str] = mapped_column(String(STATUS_MSG_MAX_CHARS), server_default="")
    creation_time: Mapped[datetime] = mapped_column(Millis, server_default=CurrentTimestamp(3))
    start_time: Mapped[datetime | None] = mapped_column(Millis)
    update_time: Mapped[datetime] = mapped_column(server_default=CurrentTimestamp(on_update=True))
    duration: Mapped[float | None] = mapped_column(Float)
    original_size: Mapped[int] = mapped_column(BigInteger, server_default="0")
    uncompressed_size: Mapped[int] = mapped_column(BigInteger, server_default="0")
    compressed_size: Mapped[int] = mapped_column(BigInteger, server_default="0")
    num_tasks: Mapped[int] = mapped_column(Integer, server_default="0")
    num_tasks_completed: Mapped[int] = mapped_column(Integer, server_default="0")
    clp_binary_version: Mapped[int | None] = mapped_column(Integer)
    spider_id: Mapped[int | None] = mapped_column(UnsignedBigInt)
    dispatch_time: Mapped[datetime | None] = mapped_column()
    clp_config: Mapped[bytes] = mapped_column(MediumBlob)

    # The coordinator's additions (migration 0002).
    lease_owner: Mapped[str | None] = mapped_column(String(255))
    """The coordinator instance driving the job, when one is."""
    lease_expires_at: Mapped[datetime | None] = mapped_column(Millis)
    """After this instant another coordinator may take the job over."""
    lease_epoch: Mapped[int] = mapped_column(Integer, server_default="0")
    """Fencing token: bumped whenever ownership changes; a fenced write checks it."""
    cancel_requested_at: Mapped[datetime | None] = mapped_column(Millis)
    """When an operator asked for the job to be cancelled."""
    committed_at: Mapped[datetime | None] = mapped_column(Millis)
    """When the commit task published the archives (migration 0004): the Committed marker."""


class JobTransition(Base):
    """One applied move of one job: the audit trail, written in the move's own transaction."""

    __tablename__ = names.COMPRESSION_JOB_TRANSITIONS
    __table_args__ = (
        Index("TRANSITION_JOB_ID", "job_id", "id"),
        MYSQL_TABLE_OPTIONS,
    )

    id: Mapped[int] = mapped_column(BigIntKey, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(Integer)
    from_status: Mapped[int] = mapped_column(Integer)
    to_status: Mapped[int] = mapped_column(Integer)
    trigger: Mapped[str] = mapped_column(String(32))
    actor: Mapped[str] = mapped_column(String(32))
    actor_id: Mapped[str] = mapped_column(String(255), server_default="")
    """Which instance of the actor (a coordinator's id, a Spider task instance, a user name)."""
    reason: Mapped[str] = mapped_column(Text)
    spider_id: Mapped[int | None] = mapped_column(UnsignedBigInt)
    lease_epoch: Mapped[int] = mapped_column(Integer)
    at: Mapped[datetime] = mapped_column(Millis)


class Dataset(Base):
    """CLP's ``clp_datasets`` (clp-s storage engine)."""

    __tablename__ = names.DATASETS
    __table_args__ = (MYSQL_TABLE_OPTIONS,)

    name: Mapped[str] = mapped_column(String(255), primary_key=True)
    archive_storage_directory: Mapped[str] = mapped_column(String(4096))


class IngestionJob(Base):
    """log-ingestor's ``ingestion_job``."""

    __tablename__ = names.INGESTION_JOBS
    __table_args__ = (MYSQL_TABLE_OPTIONS,)

    id: Mapped[int] = mapped_column(UnsignedBigIntKey, primary_key=True, autoincrement=True)
    config: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(
        Enum(
            "requested",
            "running",
            "paused",
            "failed",
            "finished",
            name="ingestion_job_status",
            create_constraint=True,
        ),
        server_default="requested",
    )
    status_msg: Mapped[str | None] = mapped_column(Text)
    num_files_compressed: Mapped[int] = mapped_column(UnsignedBigInt, server_default="0")
    creation_ts: Mapped[datetime] = mapped_column(Millis, server_default=CurrentTimestamp(3))
    last_update_ts: Mapped[datetime] = mapped_column(
        Millis, server_default=CurrentTimestamp(3, on_update=True)
    )


class IngestedS3ObjectMetadata(Base):
    """log-ingestor's ``ingested_s3_object_metadata``: the S3 objects a job compresses."""

    __tablename__ = names.INGESTED_S3_OBJECT_METADATA
    __table_args__ = (
        Index("index_ingestion_job_id", "ingestion_job_id"),
        Index("index_compression_job_id", "compression_job_id"),
        MYSQL_TABLE_OPTIONS,
    )

    id: Mapped[int] = mapped_column(UnsignedBigIntKey, primary_key=True, autoincrement=True)
    bucket: Mapped[str] = mapped_column(String(1024))
    key: Mapped[str] = mapped_column(String(1024))
    size: Mapped[int] = mapped_column(UnsignedBigInt)
    status: Mapped[str] = mapped_column(
        Enum(
            "buffered",
            "submitted",
            "compressed",
            "failed",
            name="ingested_s3_object_status",
            create_constraint=True,
        ),
        server_default="buffered",
    )
    ingestion_job_id: Mapped[int] = mapped_column(
        UnsignedBigInt, ForeignKey(f"{names.INGESTION_JOBS}.id", ondelete="RESTRICT")
    )
    compression_job_id: Mapped[int | None] = mapped_column(
        Integer, ForeignKey(f"{names.COMPRESSION_JOBS}.id", ondelete="RESTRICT")
    )
    creation_ts: Mapped[datetime] = mapped_column(Millis, server_default=CurrentTimestamp(3))
    last_update_ts: Mapped[datetime] = mapped_column(
        Millis, server_default=CurrentTimestamp(3, on_update=True)
    )


class SpiderResourceGroup(Base):
    """``spider_resource_groups``: Spider resource group ids (Spider has no lookup by name)."""

    __tablename__ = names.SPIDER_RESOURCE_GROUPS
    __table_args__ = (MYSQL_TABLE_OPTIONS,)

    rg_name: Mapped[str] = mapped_column(String(255), primary_key=True)
    rg_id: Mapped[int] = mapped_column(UnsignedBigInt)


class StoredArchive(Base):
    """An archive a compress task instance stores or stored, published or not (an outbox).

    Written by the task **before** it stores the archive (``state`` ``storing``, the location is
    deterministic) and marked ``stored`` after, so that every archive file of a job that never
    commits (failed, cancelled, rolled back, a retried, killed or late instance's) can always be
    found and removed (``coordinator.store.stored_archives``). ``location`` is a file path or
    ``s3://bucket/key``.
    """

    __tablename__ = names.STORED_ARCHIVES
    __table_args__ = (
        Index("STORED_ARCHIVE_SPIDER_JOB", "spider_job_id"),
        Index("STORED_ARCHIVE_ID", "archive_id"),
        Index("STORED_ARCHIVE_JOB", "job_id"),
        MYSQL_TABLE_OPTIONS,
    )

    id: Mapped[int] = mapped_column(BigIntKey, primary_key=True, autoincrement=True)
    spider_job_id: Mapped[int] = mapped_column(UnsignedBigInt)
    task_id: Mapped[str] = mapped_column(String(16))
    instance_id: Mapped[int] = mapped_column(BigInteger)
    dataset: Mapped[str] = mapped_column(String(255))
    archive_id: Mapped[str] = mapped_column(String(64))
    location: Mapped[str] = mapped_column(String(2048))
    size: Mapped[int] = mapped_column(BigInteger)
    stored_at: Mapped[datetime] = mapped_column(Millis)
    job_id: Mapped[int | None] = mapped_column(Integer)
    """The compression job it was stored for (migration 0004; older records may lack it)."""
    state: Mapped[str] = mapped_column(String(16), server_default="stored")
    """``storing``, ``stored``, ``published`` or ``removing`` (migration 0007)."""


class EngineResourceGroup(Base):
    """The embedded engine's resource groups (Spider's ``resource_groups``)."""

    __tablename__ = names.ENGINE_RESOURCE_GROUPS
    __table_args__ = (MYSQL_TABLE_OPTIONS,)

    id: Mapped[int] = mapped_column(UnsignedBigIntKey, primary_key=True, autoincrement=True)
    external_id: Mapped[str] = mapped_column(String(255), unique=True)
    password: Mapped[bytes] = mapped_column(LargeBinary)


class EngineJob(Base):
    """A job of the embedded engine (Spider's ``jobs``): what survives the engine's restart.

    Task states and retry counters live in memory only, as in Spider: a job found ``Running`` after
    a restart runs again from the start, a ``CommitReady`` one runs its commit again.
    """

    __tablename__ = names.ENGINE_JOBS
    __table_args__ = (
        Index("ENGINE_JOB_STATE", "state"),
        Index("ENGINE_JOB_OWNER", "owner"),
        MYSQL_TABLE_OPTIONS,
    )

    id: Mapped[int] = mapped_column(UnsignedBigIntKey, primary_key=True, autoincrement=True)
    resource_group_id: Mapped[int] = mapped_column(UnsignedBigInt)
    state: Mapped[str] = mapped_column(String(16))
    task_graph: Mapped[bytes] = mapped_column(LongBlob)
    inputs: Mapped[bytes] = mapped_column(LongBlob)
    outputs: Mapped[bytes | None] = mapped_column(LongBlob)
    error_message: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(Millis)
    updated_at: Mapped[datetime] = mapped_column(Millis)
    owner: Mapped[str | None] = mapped_column(String(64))
    """The token of the engine instance executing the job (migration 0006); none: an orphan."""


class CoordinatorInstance(Base):
    """A live coordinator process (or standalone engine) and its heartbeat (migration 0006).

    One row per coordinator ``instance_id`` (kind ``coordinator``) or standalone engine (kind
    ``engine``); ``token`` is new at every process start and owns that process's engine jobs.
    """

    __tablename__ = names.COORDINATOR_INSTANCES
    __table_args__ = (MYSQL_TABLE_OPTIONS,)

    kind: Mapped[str] = mapped_column(String(16), primary_key=True)
    name: Mapped[str] = mapped_column(String(255), primary_key=True)
    token: Mapped[str] = mapped_column(String(64), unique=True)
    host: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[datetime] = mapped_column(Millis)
    heartbeat_at: Mapped[datetime] = mapped_column(Millis)
    expires_at: Mapped[datetime] = mapped_column(Millis)


class AdoptedTable(Base):
    """A table that already existed when migration 0001 ran (it belonged to CLP).

    Downgrading past 0001 keeps adopted tables (and their rows) and drops only what it created.
    """

    __tablename__ = names.ADOPTED_TABLES
    __table_args__ = (MYSQL_TABLE_OPTIONS,)

    table_name: Mapped[str] = mapped_column(String(255), primary_key=True)
