"""The archive outbox: the state of each stored-archive record.

``compression_stored_archives.state`` makes the records an outbox
(``coordinator.store.stored_archives``): the compress task inserts a record in state ``storing``,
naming the archive's deterministic location, **before** the file or object exists, and marks it
``stored`` after; clean-up marks a record ``removing`` before it removes the file, and
``published`` when it settles a Succeeded job and the archive is the job's published one. So no
archive file can exist without a record, whenever a task instance is killed.

Existing records were all written after their archive was stored: they become ``stored``, except
those of Succeeded jobs stored no later than the job's commit, which the earlier version had
already settled (it removed every unpublished archive when the job ended, and its sweep never
looked at them again): they become ``published``, so the upgrade does not make the sweep revisit,
or remove anything of, jobs that were finished before it.

The upgrade checks each step first and can run again (no coordinator of this revision runs between
an interrupted upgrade and its repetition). The downgrade removes only the column; the earlier
version treats every remaining record as a stored archive, which is what it removes or keeps.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-04
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TABLE = "compression_stored_archives"
_SUCCEEDED = 2


def upgrade() -> None:
    inspector = sa.inspect(op.get_bind())
    if not inspector.has_table(_TABLE):
        return
    columns = {column["name"] for column in inspector.get_columns(_TABLE)}
    if "state" not in columns:
        with op.batch_alter_table(_TABLE) as batch:
            batch.add_column(
                sa.Column("state", sa.String(16), nullable=False, server_default="stored")
            )
    op.execute(
        sa.text(
            f"UPDATE {_TABLE} SET state = 'published' WHERE state = 'stored' AND job_id IN ("
            " SELECT j.id FROM compression_jobs j WHERE j.status = :succeeded"
            f" AND (j.committed_at IS NULL OR j.committed_at >= {_TABLE}.stored_at))"
        ).bindparams(succeeded=_SUCCEEDED)
    )


def downgrade() -> None:
    inspector = sa.inspect(op.get_bind())
    if not inspector.has_table(_TABLE):
        return
    columns = {column["name"] for column in inspector.get_columns(_TABLE)}
    if "state" in columns:
        with op.batch_alter_table(_TABLE) as batch:
            batch.drop_column("state")
