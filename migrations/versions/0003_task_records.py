"""Stored-archive records, and the embedded Spider engine's own tables.

``compression_stored_archives`` lists every archive a compress task instance stored, so that the
archives of a job that never commits can be found and removed. ``spider_engine_resource_groups``
and ``spider_engine_jobs`` are the embedded engine's persistent state (Spider keeps the same in its
own database): jobs survive a restart of the process hosting the engine.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from coordinator.store.downgrade import refuse_unless_clp_can_read
from coordinator.store.sqltypes import (
    BigIntKey,
    LongBlob,
    Millis,
    UnsignedBigInt,
    UnsignedBigIntKey,
)

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLE_OPTIONS = {"mysql_row_format": "DYNAMIC", "mysql_charset": "utf8mb4"}


def upgrade() -> None:
    existing = set(sa.inspect(op.get_bind()).get_table_names())
    if "compression_stored_archives" not in existing:
        op.create_table(
            "compression_stored_archives",
            sa.Column("id", BigIntKey, primary_key=True, autoincrement=True),
            sa.Column("spider_job_id", UnsignedBigInt, nullable=False),
            sa.Column("task_id", sa.String(16), nullable=False),
            sa.Column("instance_id", sa.BigInteger, nullable=False),
            sa.Column("dataset", sa.String(255), nullable=False),
            sa.Column("archive_id", sa.String(64), nullable=False),
            sa.Column("location", sa.String(2048), nullable=False),
            sa.Column("size", sa.BigInteger, nullable=False),
            sa.Column("stored_at", Millis, nullable=False),
            sa.Index("STORED_ARCHIVE_SPIDER_JOB", "spider_job_id"),
            sa.Index("STORED_ARCHIVE_ID", "archive_id"),
            **TABLE_OPTIONS,
        )
    if "spider_engine_resource_groups" not in existing:
        op.create_table(
            "spider_engine_resource_groups",
            sa.Column("id", UnsignedBigIntKey, primary_key=True, autoincrement=True),
            sa.Column("external_id", sa.String(255), nullable=False, unique=True),
            sa.Column("password", sa.LargeBinary, nullable=False),
            **TABLE_OPTIONS,
        )
    if "spider_engine_jobs" not in existing:
        op.create_table(
            "spider_engine_jobs",
            sa.Column("id", UnsignedBigIntKey, primary_key=True, autoincrement=True),
            sa.Column("resource_group_id", UnsignedBigInt, nullable=False),
            sa.Column("state", sa.String(16), nullable=False),
            sa.Column("task_graph", LongBlob, nullable=False),
            sa.Column("inputs", LongBlob, nullable=False),
            sa.Column("outputs", LongBlob),
            sa.Column("error_message", sa.Text),
            sa.Column("created_at", Millis, nullable=False),
            sa.Column("updated_at", Millis, nullable=False),
            sa.Index("ENGINE_JOB_STATE", "state"),
            **TABLE_OPTIONS,
        )


def downgrade() -> None:
    """Drop the coordinator's own tables (re-runnable); refuses first while CLP cannot read a job.

    The embedded engine's job records go with them; its new job ids stay above every Spider job id
    ``compression_jobs`` records, so ids are not reused after an upgrade (``EmbeddedSpider``).
    """
    bind = op.get_bind()
    refuse_unless_clp_can_read(bind)
    existing = set(sa.inspect(bind).get_table_names())
    for table in (
        "spider_engine_jobs",
        "spider_engine_resource_groups",
        "compression_stored_archives",
    ):
        if table in existing:
            op.drop_table(table)
