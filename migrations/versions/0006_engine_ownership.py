"""Ownership of the embedded engine's jobs, and a registry of live coordinator processes.

Several coordinator replicas may share one database, each hosting an embedded Spider engine. Every
``spider_engine_jobs`` row gets an ``owner``: the token of the process (engine instance) executing
it. An engine only executes the jobs it owns, writes their state only while it still owns them
(``WHERE id = ? AND owner = ?``), and takes over (adopts) a job only when its owner is gone.

``coordinator_instances`` lists live processes, one row per coordinator ``instance_id`` (kind
``coordinator``) or per standalone engine (kind ``engine``): a random ``token`` per process start,
its host and pid, and a heartbeat with an expiry. An owner whose token has no unexpired row is
gone. Two live processes cannot hold the same instance id: the second sees the first's fresh row.

Rows of ``spider_engine_jobs`` from before this revision have no owner: they are orphans, adopted
by the first engine that looks.

The upgrade checks each step first and can run again. The downgrade removes only what it adds.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from coordinator.store.sqltypes import Millis

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLE_OPTIONS = {"mysql_row_format": "DYNAMIC", "mysql_charset": "utf8mb4"}


def upgrade() -> None:
    inspector = sa.inspect(op.get_bind())
    if not inspector.has_table("coordinator_instances"):
        op.create_table(
            "coordinator_instances",
            sa.Column("kind", sa.String(16), primary_key=True),
            sa.Column("name", sa.String(255), primary_key=True),
            sa.Column("token", sa.String(64), nullable=False, unique=True),
            sa.Column("host", sa.String(255), nullable=False),
            sa.Column("pid", sa.Integer, nullable=False),
            sa.Column("started_at", Millis, nullable=False),
            sa.Column("heartbeat_at", Millis, nullable=False),
            sa.Column("expires_at", Millis, nullable=False),
            **TABLE_OPTIONS,
        )
    if inspector.has_table("spider_engine_jobs"):
        columns = {column["name"] for column in inspector.get_columns("spider_engine_jobs")}
        indexes = {index["name"] for index in inspector.get_indexes("spider_engine_jobs")}
        if "owner" not in columns or "ENGINE_JOB_OWNER" not in indexes:
            with op.batch_alter_table("spider_engine_jobs") as batch:
                if "owner" not in columns:
                    batch.add_column(sa.Column("owner", sa.String(64)))
                if "ENGINE_JOB_OWNER" not in indexes:
                    batch.create_index("ENGINE_JOB_OWNER", ["owner"])


def downgrade() -> None:
    inspector = sa.inspect(op.get_bind())
    if inspector.has_table("spider_engine_jobs"):
        columns = {column["name"] for column in inspector.get_columns("spider_engine_jobs")}
        indexes = {index["name"] for index in inspector.get_indexes("spider_engine_jobs")}
        if "owner" in columns or "ENGINE_JOB_OWNER" in indexes:
            with op.batch_alter_table("spider_engine_jobs") as batch:
                if "ENGINE_JOB_OWNER" in indexes:
                    batch.drop_index("ENGINE_JOB_OWNER")
                if "owner" in columns:
                    batch.drop_column("owner")
    if inspector.has_table("coordinator_instances"):
        op.drop_table("coordinator_instances")
