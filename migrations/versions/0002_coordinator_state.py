"""The coordinator's own state: lease and cancel-request columns, and the transition history.

``compression_jobs`` gains ``lease_owner``, ``lease_expires_at``, ``lease_epoch`` (the fencing
token) and ``cancel_requested_at``; all are nullable or defaulted, so CLP's inserters (which write
only ``clp_config``) and readers are unaffected. ``compression_job_transitions`` is the audit trail:
one row per applied move, written in the move's transaction. Both steps check first and can run
again; so does the downgrade, which removes exactly these (CLP's DDL has none of them).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from coordinator.store.downgrade import refuse_unless_clp_can_read
from coordinator.store.sqltypes import BigIntKey, Millis, UnsignedBigInt

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JOB_COLUMNS = (
    ("lease_owner", lambda: sa.Column("lease_owner", sa.String(255))),
    ("lease_expires_at", lambda: sa.Column("lease_expires_at", Millis)),
    (
        "lease_epoch",
        lambda: sa.Column("lease_epoch", sa.Integer, nullable=False, server_default="0"),
    ),
    ("cancel_requested_at", lambda: sa.Column("cancel_requested_at", Millis)),
)


def upgrade() -> None:
    inspector = sa.inspect(op.get_bind())
    columns = {column["name"] for column in inspector.get_columns("compression_jobs")}
    indexes = {index["name"] for index in inspector.get_indexes("compression_jobs")}
    with op.batch_alter_table("compression_jobs") as batch:
        for name, column in JOB_COLUMNS:
            if name not in columns:
                batch.add_column(column())
        if "JOB_LEASE" not in indexes:
            batch.create_index("JOB_LEASE", ["status", "lease_expires_at"])
    if "compression_job_transitions" not in inspector.get_table_names():
        op.create_table(
            "compression_job_transitions",
            sa.Column("id", BigIntKey, primary_key=True, autoincrement=True),
            sa.Column("job_id", sa.Integer, nullable=False),
            sa.Column("from_status", sa.Integer, nullable=False),
            sa.Column("to_status", sa.Integer, nullable=False),
            sa.Column("trigger", sa.String(32), nullable=False),
            sa.Column("actor", sa.String(32), nullable=False),
            sa.Column("actor_id", sa.String(255), nullable=False, server_default=""),
            sa.Column("reason", sa.Text, nullable=False),
            sa.Column("spider_id", UnsignedBigInt),
            sa.Column("lease_epoch", sa.Integer, nullable=False),
            sa.Column("at", Millis, nullable=False),
            sa.Index("TRANSITION_JOB_ID", "job_id", "id"),
            mysql_row_format="DYNAMIC",
            mysql_charset="utf8mb4",
        )


def downgrade() -> None:
    """Drop only the coordinator's own columns, index and table (none is in CLP's DDL).

    Refuses first while a job is in a state CLP cannot read; each step checks before it changes
    anything, so a downgrade interrupted half-way can run again.
    """
    bind = op.get_bind()
    refuse_unless_clp_can_read(bind)
    inspector = sa.inspect(bind)
    if inspector.has_table("compression_job_transitions"):
        op.drop_table("compression_job_transitions")
    columns = {column["name"] for column in inspector.get_columns("compression_jobs")}
    indexes = {index["name"] for index in inspector.get_indexes("compression_jobs")}
    dropped = [name for name, _ in reversed(JOB_COLUMNS) if name in columns]
    if "JOB_LEASE" not in indexes and not dropped:
        return
    with op.batch_alter_table("compression_jobs") as batch:
        if "JOB_LEASE" in indexes:
            batch.drop_index("JOB_LEASE")
        for name in dropped:
            batch.drop_column(name)
