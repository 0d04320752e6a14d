"""Every registered dataset gets the three tables CLP's ``add_dataset`` creates.

Earlier versions of the coordinator created only ``clp_{dataset}_archives`` and
``clp_{dataset}_column_metadata``. Without ``clp_{dataset}_files`` CLP's archive garbage
collector fails (it walks every dataset of ``clp_datasets``, so one incomplete dataset stops it for
all), as do ``archive_manager.py del`` and the WebUI's Details query. For every dataset in
``clp_datasets`` whose name is safe (``coordinator.store.names.validate_dataset_name``), whichever
of the three tables is missing is created with CLP's DDL (``coordinator.store.datasets``; on SQLite
with the table-prefixed index names). Existing tables are not altered; unsafe names are skipped
(no table name is built from them). The upgrade can run again at any time.

The downgrade changes nothing: the tables are CLP's, and CLP's readers need them.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from coordinator.store.datasets import create_missing_dataset_tables
from coordinator.store.names import InvalidDatasetName, validate_dataset_name

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _safe(name: str) -> bool:
    try:
        validate_dataset_name(name)
    except InvalidDatasetName:
        return False
    return True


def upgrade() -> None:
    bind = op.get_bind()
    if not sa.inspect(bind).has_table("clp_datasets"):
        return
    registered = bind.execute(sa.text("SELECT name FROM clp_datasets ORDER BY name")).scalars()
    for dataset in [name for name in registered if _safe(name)]:
        create_missing_dataset_tables(bind, dataset)


def downgrade() -> None:
    pass
