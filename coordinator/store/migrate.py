"""Running the alembic migrations from code (the CLI, tests) and from ``alembic`` itself.

Alembic is imported only to migrate (or when the revision files are not a plain chain): checking
that a schema is current, which every start does, reads the ``alembic_version`` table and the
revision files' ids (``head_revision``) without it, so that a command that finds its schema
current does not pay for importing alembic (start-up time, issue 14).
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Connection, Engine, inspect, text

from coordinator.config.locations import SOURCE_CHECKOUT
from coordinator.errors import CoordinatorError
from coordinator.store.database import reading

if TYPE_CHECKING:
    from alembic.config import Config

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
    from alembic.config import Config  # noqa: PLC0415 (alembic only to migrate: start-up time)

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
    """Upgrade the schema to ``revision``; raises alembic's or the driver's errors.

    A schema already at the head is left alone without running alembic (which would find nothing
    to do): the start of every command that writes is this check."""
    if revision == "head" and current_revision(engine) == head_revision():
        return
    _run(engine, "upgrade", revision)


def downgrade(engine: Engine, revision: str) -> None:
    """Downgrade the schema to ``revision`` (``base`` removes what the migrations created)."""
    _run(engine, "downgrade", revision)


def _run(engine: Engine, direction: str, revision: str) -> None:
    from alembic import command  # noqa: PLC0415 (alembic only to migrate: start-up time)

    config = alembic_config()
    with migration_connection(engine) as connection:
        config.attributes["connection"] = connection
        getattr(command, direction)(config, revision)
        connection.commit()


VERSION_TABLE = "alembic_version"
"""Where alembic records the revision a database is at (its default, which ``env.py`` keeps)."""


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at, ``None`` for a database never migrated.

    Read as alembic reads it (its version table, absent or empty: none); a table holding more
    than one revision (branches, which these migrations never have) is left to alembic, which
    refuses it."""
    with reading(engine) as connection:
        if not inspect(connection).has_table(VERSION_TABLE):
            return None
        rows = connection.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).all()
        if len(rows) <= 1:
            return str(rows[0][0]) if rows else None
        from alembic.runtime.migration import MigrationContext  # noqa: PLC0415 (alembic only to migrate: start-up time)

        return MigrationContext.configure(connection).get_current_revision()


def head_revision() -> str:
    """The newest revision in ``migrations/``.

    Read from the revision files' ``revision`` and ``down_revision`` assignments when they form
    one plain chain (``plain_chain_head``); anything else (a merge, a branch label, a dependency,
    an id that is not a literal) is answered by alembic's ``ScriptDirectory``."""
    location = migrations_location()
    head = plain_chain_head(_versions_directory(location))
    if head is not None:
        return head
    from alembic.script import ScriptDirectory  # noqa: PLC0415 (alembic only to migrate: start-up time)

    found = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert found is not None
    return found


def _versions_directory(location: str) -> Traversable:
    if location == PACKAGED_MIGRATIONS:
        package, _, folder = location.partition(":")
        return resources.files(package).joinpath(folder, "versions")
    return Path(location) / "versions"


@functools.cache
def _chain_head_of(files: tuple[tuple[str, str], ...]) -> str | None:
    revisions: dict[str, str | None] = {}
    for _name, source in files:
        assigned = _literal_assignments(source)
        if assigned is None:
            return None
        revision, down_revision = assigned
        if revision in revisions:
            return None
        revisions[revision] = down_revision
    parents = set(revisions.values())
    heads = [revision for revision in revisions if revision not in parents]
    if len(heads) != 1:
        return None
    chain: list[str] = []
    step: str | None = heads[0]
    while step is not None and step in revisions and len(chain) < len(revisions):
        chain.append(step)
        step = revisions[step]
    # One chain: from the head down to a root, through every revision.
    return heads[0] if step is None and len(chain) == len(revisions) else None


def plain_chain_head(versions: Traversable) -> str | None:
    """The head of the revision files in ``versions`` (as alembic lists them: ``*.py``, not
    ``__init__``), or ``None`` unless every file assigns literal ids, no branch labels and no
    dependencies, and the revisions form one chain from one root to one head."""
    if not versions.is_dir():
        return None
    files = tuple(
        sorted(
            (entry.name, entry.read_text(encoding="utf-8"))
            for entry in versions.iterdir()
            if entry.is_file()
            and entry.name.endswith(".py")
            and not entry.name.startswith((".#", "__init__"))
        )
    )
    return _chain_head_of(files) if files else None


def _literal_assignments(source: str) -> tuple[str, str | None] | None:
    """A revision file's ``revision`` and ``down_revision`` when both are literal strings (the
    down revision also ``None``) and ``branch_labels`` and ``depends_on`` are ``None``; else
    ``None``."""
    values: dict[str, object] = {}
    try:
        body = ast.parse(source).body
    except (SyntaxError, ValueError):
        return None  # alembic says what is wrong with it
    for statement in body:
        targets: list[ast.expr]
        if isinstance(statement, ast.AnnAssign) and statement.value is not None:
            targets, value = [statement.target], statement.value
        elif isinstance(statement, ast.Assign):
            targets, value = statement.targets, statement.value
        else:
            continue
        for target in targets:
            if isinstance(target, ast.Name):
                try:
                    values[target.id] = ast.literal_eval(value)
                except (ValueError, TypeError, SyntaxError, RecursionError):
                    values[target.id] = value  # not a literal: never a plain chain
    revision, down_revision = values.get("revision"), values.get("down_revision", ...)
    if not isinstance(revision, str) or not isinstance(down_revision, str | None):
        return None
    if values.get("branch_labels") is not None or values.get("depends_on") is not None:
        return None
    return revision, down_revision


def require_current_schema(engine: Engine) -> None:
    """Fail with ``SchemaNotCurrent`` unless the database is at the head revision."""
    current, head = current_revision(engine), head_revision()
    if current != head:
        raise SchemaNotCurrent(
            f"the database schema is at revision {current or 'none'}, this coordinator needs "
            f"{head}: run `alembic upgrade head` (or `coordinator db upgrade`) first"
        )
