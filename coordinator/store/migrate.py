"""Running the alembic migrations from code (the CLI, tests) and from ``alembic`` itself."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine

from coordinator.config.locations import SOURCE_CHECKOUT
from coordinator.errors import CoordinatorError

PACKAGED_MIGRATIONS = "coordinator:migrations"
"""The migrations an installed wheel carries, in alembic's ``package:folder`` notation: the build
maps the repository's top-level ``migrations/`` to the package ``coordinator.migrations``
(``setup.py``)."""


class SchemaNotCurrent(CoordinatorError, RuntimeError):
    """The database is not at the revision this code expects; run ``alembic upgrade head``."""


class MigrationsNotFound(CoordinatorError, RuntimeError):
    """The package carries no migrations and runs from no source checkout (a broken install)."""


def migrations_location() -> str:
    """Where alembic finds the revisions: the migrations inside the installed package (a wheel),
    else the source checkout's ``migrations/`` (an editable install, the tests)."""
    package, _, folder = PACKAGED_MIGRATIONS.partition(":")
    if resources.files(package).joinpath(folder).is_dir():
        return PACKAGED_MIGRATIONS
    if SOURCE_CHECKOUT is None:
        raise MigrationsNotFound(
            f"the installed package has no {folder}/ and runs from no source checkout: "
            "reinstall the coordinator"
        )
    return str(SOURCE_CHECKOUT / "migrations")


def alembic_config() -> Config:
    """The alembic configuration, built here: only the script location (``migrations_location``)
    matters to the coordinator. ``alembic.ini`` at the checkout's top serves the ``alembic``
    command (``alembic upgrade head``, ``alembic revision``) and is never read from here."""
    config = Config()
    # set_main_option interpolates "%(name)s": a literal "%" in the path is written "%%".
    config.set_main_option("script_location", migrations_location().replace("%", "%%"))
    return config


@contextmanager
def migration_connection(engine: Engine) -> Iterator[Connection]:
    """A connection on which migrations may rebuild tables.

    SQLite rebuilds a table to alter it (alembic's batch mode); with foreign keys enforced, dropping
    the old ``compression_jobs`` would fail while rows reference it, so enforcement is off for the
    migration and back on before the connection returns to the pool. Other backends: unchanged.
    """
    with engine.connect() as connection:
        sqlite = engine.dialect.name == "sqlite"
        if sqlite:
            _sqlite_pragma(connection, "PRAGMA foreign_keys=OFF")
        try:
            yield connection
        finally:
            if sqlite:
                connection.rollback()
                _sqlite_pragma(connection, "PRAGMA foreign_keys=ON")


def _sqlite_pragma(connection: Connection, pragma: str) -> None:
    # Outside any transaction: SQLite ignores this pragma inside one.
    driver_connection = connection.connection.driver_connection
    assert driver_connection is not None
    driver_connection.execute(pragma)


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Upgrade the schema to ``revision``; raises alembic's or the driver's errors."""
    _run(engine, "upgrade", revision)


def downgrade(engine: Engine, revision: str) -> None:
    """Downgrade the schema to ``revision`` (``base`` removes what the migrations created)."""
    _run(engine, "downgrade", revision)


def _run(engine: Engine, direction: str, revision: str) -> None:
    config = alembic_config()
    with migration_connection(engine) as connection:
        config.attributes["connection"] = connection
        getattr(command, direction)(config, revision)
        connection.commit()


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at, ``None`` for a database never migrated."""
    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def head_revision() -> str:
    """The newest revision in ``migrations/``."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


def require_current_schema(engine: Engine) -> None:
    """Fail with ``SchemaNotCurrent`` unless the database is at the head revision."""
    current, head = current_revision(engine), head_revision()
    if current != head:
        raise SchemaNotCurrent(
            f"the database schema is at revision {current or 'none'}, this coordinator needs "
            f"{head}: run `alembic upgrade head` (or `coordinator db upgrade`) first"
        )
