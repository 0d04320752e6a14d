"""Alembic environment: runs the coordinator's migrations online.

The connection is one handed over by ``coordinator.store.migrate`` (tests, the CLI), else the
database the coordinator itself would use (``coordinator.config.loader.database_url``, the one
resolver): CLP's configuration from ``alembic -x config=/etc/clp-config.yaml upgrade head`` or
``$COORDINATOR_CONFIG`` (its ``database`` section with ``CLP_DB_USER``/``CLP_DB_PASS``), else
``$COORDINATOR_DATABASE_URL``, else the embedded SQLite database of ``$COORDINATOR_HOME``.
"""

from __future__ import annotations

import os
from pathlib import Path

from alembic import context
from alembic.runtime.migration import RevisionStep
from sqlalchemy import Connection

from coordinator.config.loader import database_url, load_config
from coordinator.config.locations import CONFIG_ENV
from coordinator.store.database import create_database_engine, create_sqlite_directory
from coordinator.store.downgrade import refuse_unless_clp_can_read
from coordinator.store.migrate import migration_connection
from coordinator.store.schema import metadata


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        transaction_per_migration=True,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    if _downgrading():
        # Before the first step: each step commits its revision on its own, so a refusal by a
        # later step would leave the revision moved (``coordinator.store.downgrade``).
        refuse_unless_clp_can_read(connection)
    with context.begin_transaction():
        context.run_migrations()


def _downgrading() -> bool:
    """Whether this run takes any downgrade step (not a stamp), from alembic's own step plan."""
    migration_context = context.get_context()
    plan = getattr(migration_context, "_migrations_fn", None)
    heads = migration_context.get_current_heads()
    if plan is None or not heads:
        return False  # each revision's downgrade still refuses first
    return any(
        isinstance(step, RevisionStep) and step.is_downgrade
        for step in plan(heads, migration_context)
    )


def run_migrations_online() -> None:
    handed_over = context.config.attributes.get("connection")
    if handed_over is not None:
        _run(handed_over)
        return
    config_file = context.get_x_argument(as_dictionary=True).get("config") or os.environ.get(
        CONFIG_ENV
    )
    url = database_url(load_config(Path(config_file) if config_file else None))
    create_sqlite_directory(url)
    engine = create_database_engine(url)
    try:
        with migration_connection(engine) as connection:
            _run(connection)
            connection.commit()
    finally:
        engine.dispose()


if context.is_offline_mode():
    raise SystemExit("offline (--sql) migrations are unsupported: the upgrade inspects the schema")
run_migrations_online()
