"""The commit marker, and the owning job of each stored archive.

``compression_jobs.committed_at`` records when the commit task published a job's archives. With it,
the lifecycle's Committed state no longer needs a status number of its own: by default a committed
job keeps CLP's RUNNING (1) in ``status``, which every CLP reader understands, and the marker tells
the coordinator it is Committed (``coordinator.lifecycle.storage``). Rows an earlier version stored
as status 5 get the marker too (their ``update_time`` is when they were committed).

``compression_stored_archives.job_id`` names the compression job an archive was stored for: a
Spider job id alone is not an identity (a reset Spider, or CLP's Rust coordinator before this one,
reuses ids), and clean-up and rollback must never touch another job's archives. Existing records
are attributed when their Spider job id belongs to exactly one job.

Downgrading refuses, changing nothing, while a job is Committed (in either form): without the
marker the older schema could not tell its publication apart from a running job.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from coordinator.store.downgrade import refuse_unless_clp_can_read
from coordinator.store.sqltypes import Millis

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_COMMITTED_BEFORE_0004 = 5
_RUNNING = 1


def upgrade() -> None:
    inspector = sa.inspect(op.get_bind())
    job_columns = {column["name"] for column in inspector.get_columns("compression_jobs")}
    if "committed_at" not in job_columns:
        with op.batch_alter_table("compression_jobs") as batch:
            batch.add_column(sa.Column("committed_at", Millis))
    op.execute(
        sa.text(
            "UPDATE compression_jobs SET committed_at = update_time, update_time = update_time "
            "WHERE status = :committed AND committed_at IS NULL"
        ).bindparams(committed=_COMMITTED_BEFORE_0004)
    )
    stored_columns = {
        column["name"] for column in inspector.get_columns("compression_stored_archives")
    }
    stored_indexes = {
        index["name"] for index in inspector.get_indexes("compression_stored_archives")
    }
    with op.batch_alter_table("compression_stored_archives") as batch:
        if "job_id" not in stored_columns:
            batch.add_column(sa.Column("job_id", sa.Integer))
        if "STORED_ARCHIVE_JOB" not in stored_indexes:
            batch.create_index("STORED_ARCHIVE_JOB", ["job_id"])
    op.execute(
        "UPDATE compression_stored_archives SET job_id = ("
        " SELECT MIN(j.id) FROM compression_jobs j"
        " WHERE j.spider_id = compression_stored_archives.spider_job_id"
        ") WHERE job_id IS NULL AND ("
        " SELECT COUNT(*) FROM compression_jobs j"
        " WHERE j.spider_id = compression_stored_archives.spider_job_id"
        ") = 1"
    )


def downgrade() -> None:
    """Refuse, changing nothing, while a job is in a state CLP cannot read: Committed in either
    form, or any status outside CLP's 0–4 (``coordinator.store.downgrade``). Re-runnable: each
    step checks first."""
    bind = op.get_bind()
    refuse_unless_clp_can_read(bind)
    inspector = sa.inspect(bind)
    if inspector.has_table("compression_stored_archives"):
        stored_columns = {
            column["name"] for column in inspector.get_columns("compression_stored_archives")
        }
        stored_indexes = {
            index["name"] for index in inspector.get_indexes("compression_stored_archives")
        }
        if "job_id" in stored_columns or "STORED_ARCHIVE_JOB" in stored_indexes:
            with op.batch_alter_table("compression_stored_archives") as batch:
                if "STORED_ARCHIVE_JOB" in stored_indexes:
                    batch.drop_index("STORED_ARCHIVE_JOB")
                if "job_id" in stored_columns:
                    batch.drop_column("job_id")
    job_columns = {column["name"] for column in inspector.get_columns("compression_jobs")}
    if "committed_at" in job_columns:
        with op.batch_alter_table("compression_jobs") as batch:
            batch.drop_column("committed_at")
