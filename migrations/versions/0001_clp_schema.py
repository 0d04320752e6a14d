"""CLP's orchestration tables: create them, or adopt and upgrade an existing CLP database.

Each table is created with CLP's DDL unless it exists. An existing table belongs to CLP: it is
recorded in ``coordinator_adopted_tables``. The downgrade keeps every CLP table, adopted or created
here, with its rows (``coordinator.store.downgrade``): it drops only that registry. An existing
``compression_jobs`` from before CLP #2421 gains what CLP's own code needs and CLP's migration never
added (hazard H9, ``docs/hazards.md``): ``spider_id``, ``dispatch_time``, the ``JOB_SPIDER_ID`` and
``JOB_START_TIME_STATUS`` indexes and, on MySQL/MariaDB, ``ON UPDATE CURRENT_TIMESTAMP`` on
``update_time``. Every step checks first, so the upgrade can run again; existing rows are never
written.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from collections.abc import Callable, Sequence

import sqlalchemy as sa
from alembic import op

from coordinator.store.downgrade import refuse_unless_clp_can_read
from coordinator.store.sqltypes import (
    CurrentTimestamp,
    MediumBlob,
    Millis,
    UnsignedBigInt,
    UnsignedBigIntKey,
)

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ADOPTED = "coordinator_adopted_tables"
TABLE_OPTIONS = {"mysql_row_format": "DYNAMIC", "mysql_charset": "utf8mb4"}


def _create_ingestion_job() -> None:
    op.create_table(
        "ingestion_job",
        sa.Column("id", UnsignedBigIntKey, primary_key=True, autoincrement=True),
        sa.Column("config", sa.Text, nullable=False),
        sa.Column(
            "status",
            sa.Enum(
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
        sa.Column("status_msg", sa.Text),
        sa.Column("num_files_compressed", UnsignedBigInt, nullable=False, server_default="0"),
        sa.Column("creation_ts", Millis, nullable=False, server_default=CurrentTimestamp(3)),
        sa.Column(
            "last_update_ts",
            Millis,
            nullable=False,
            server_default=CurrentTimestamp(3, on_update=True),
        ),
        **TABLE_OPTIONS,
    )


def _create_compression_jobs() -> None:
    op.create_table(
        "compression_jobs",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("status", sa.Integer, nullable=False, server_default="0"),
        sa.Column("status_msg", sa.String(512), nullable=False, server_default=""),
        sa.Column("creation_time", Millis, nullable=False, server_default=CurrentTimestamp(3)),
        sa.Column("start_time", Millis),
        sa.Column(
            "update_time",
            sa.DateTime,
            nullable=False,
            server_default=CurrentTimestamp(on_update=True),
        ),
        sa.Column("duration", sa.Float),
        sa.Column("original_size", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("uncompressed_size", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("compressed_size", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("num_tasks", sa.Integer, nullable=False, server_default="0"),
        sa.Column("num_tasks_completed", sa.Integer, nullable=False, server_default="0"),
        sa.Column("clp_binary_version", sa.Integer),
        sa.Column("spider_id", UnsignedBigInt),
        sa.Column("dispatch_time", sa.DateTime),
        sa.Column("clp_config", MediumBlob, nullable=False),
        sa.Index("JOB_STATUS", "status"),
        sa.Index("JOB_UPDATE_TIME", "update_time"),
        sa.Index("JOB_START_TIME_STATUS", "start_time", "status"),
        sa.Index("JOB_SPIDER_ID", "spider_id"),
        **TABLE_OPTIONS,
    )


def _create_ingested_s3_object_metadata() -> None:
    op.create_table(
        "ingested_s3_object_metadata",
        sa.Column("id", UnsignedBigIntKey, primary_key=True, autoincrement=True),
        sa.Column("bucket", sa.String(1024), nullable=False),
        sa.Column("key", sa.String(1024), nullable=False),
        sa.Column("size", UnsignedBigInt, nullable=False),
        sa.Column(
            "status",
            sa.Enum(
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
        sa.Column(
            "ingestion_job_id",
            UnsignedBigInt,
            sa.ForeignKey("ingestion_job.id", ondelete="RESTRICT"),
            nullable=False,
        ),
        sa.Column(
            "compression_job_id",
            sa.Integer,
            sa.ForeignKey("compression_jobs.id", ondelete="RESTRICT"),
        ),
        sa.Column("creation_ts", Millis, nullable=False, server_default=CurrentTimestamp(3)),
        sa.Column(
            "last_update_ts",
            Millis,
            nullable=False,
            server_default=CurrentTimestamp(3, on_update=True),
        ),
        sa.Index("index_ingestion_job_id", "ingestion_job_id"),
        sa.Index("index_compression_job_id", "compression_job_id"),
        **TABLE_OPTIONS,
    )


def _create_datasets() -> None:
    op.create_table(
        "clp_datasets",
        sa.Column("name", sa.String(255), primary_key=True),
        sa.Column("archive_storage_directory", sa.String(4096), nullable=False),
        **TABLE_OPTIONS,
    )


def _create_spider_resource_groups() -> None:
    op.create_table(
        "spider_resource_groups",
        sa.Column("rg_name", sa.String(255), primary_key=True),
        sa.Column("rg_id", UnsignedBigInt, nullable=False),
        **TABLE_OPTIONS,
    )


# In foreign-key order: a table comes after the tables it references.
CLP_TABLES: tuple[tuple[str, Callable[[], None]], ...] = (
    ("ingestion_job", _create_ingestion_job),
    ("compression_jobs", _create_compression_jobs),
    ("ingested_s3_object_metadata", _create_ingested_s3_object_metadata),
    ("clp_datasets", _create_datasets),
    ("spider_resource_groups", _create_spider_resource_groups),
)


def upgrade() -> None:
    bind = op.get_bind()
    existing = set(sa.inspect(bind).get_table_names())
    # With the registry present this revision ran before (its revision mark was lost): every CLP
    # table then either was adopted or was created by it, so nothing new is adopted now.
    first_run = ADOPTED not in existing
    if first_run:
        op.create_table(
            ADOPTED, sa.Column("table_name", sa.String(255), primary_key=True), **TABLE_OPTIONS
        )
    adopted_table = sa.table(ADOPTED, sa.column("table_name", sa.String))
    for name, create in CLP_TABLES:
        if name not in existing:
            create()
        elif first_run:
            op.bulk_insert(adopted_table, [{"table_name": name}])
    _upgrade_legacy_compression_jobs(bind)


def _upgrade_legacy_compression_jobs(bind: sa.Connection) -> None:
    inspector = sa.inspect(bind)
    columns = {column["name"] for column in inspector.get_columns("compression_jobs")}
    indexes = {index["name"] for index in inspector.get_indexes("compression_jobs")}
    if "spider_id" not in columns:
        op.add_column("compression_jobs", sa.Column("spider_id", UnsignedBigInt))
    if "dispatch_time" not in columns:
        op.add_column("compression_jobs", sa.Column("dispatch_time", sa.DateTime))
    if "JOB_SPIDER_ID" not in indexes:
        op.create_index("JOB_SPIDER_ID", "compression_jobs", ["spider_id"])
    if "JOB_START_TIME_STATUS" not in indexes:
        op.create_index("JOB_START_TIME_STATUS", "compression_jobs", ["start_time", "status"])
    if bind.dialect.name in ("mysql", "mariadb") and not _update_time_has_on_update(bind):
        op.execute(
            "ALTER TABLE compression_jobs MODIFY update_time DATETIME NOT NULL "
            "DEFAULT CURRENT_TIMESTAMP ON UPDATE CURRENT_TIMESTAMP"
        )


def _update_time_has_on_update(bind: sa.Connection) -> bool:
    extra = bind.execute(
        sa.text(
            "SELECT EXTRA FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() "
            "AND TABLE_NAME = 'compression_jobs' AND COLUMN_NAME = 'update_time'"
        )
    ).scalar_one()
    return "on update" in str(extra).lower()


def downgrade() -> None:
    """Drop only the coordinator's registry: CLP's tables are CLP's, whoever created them.

    This revision may have created them, but CLP fills them and references them from tables of
    its own (``compression_tasks``, log-ingestor's), so they stay with every row, and so do the
    columns and indexes added to a legacy ``compression_jobs`` (CLP's current DDL has them all).
    A later ``upgrade`` adopts them. Re-runnable: a registry already gone is fine.
    """
    bind = op.get_bind()
    refuse_unless_clp_can_read(bind)
    if sa.inspect(bind).has_table(ADOPTED):
        op.drop_table(ADOPTED)
