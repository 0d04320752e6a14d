"""Opening a configuration's database: created and migrated for a command that writes jobs
(``open_engine``), only opened for one that reads (``open_existing_engine``).

Here rather than in ``coordinator.runtime`` (which re-exports both) so that the commands that only
read (``jobs``, ``show``, ``health``, ``archives``, ``db current``) do not import the engine and the
service loop to open a database (start-up time, issue 14).
"""

from __future__ import annotations

from sqlalchemy import Engine

from coordinator.config.loader import CoordinatorConfig, database_url
from coordinator.store import migrate
from coordinator.store.database import (
    NoDatabase,
    create_database_engine,
    create_sqlite_directory,
    sqlite_file,
)


def open_engine(config: CoordinatorConfig) -> Engine:
    """The database for a command that writes jobs (``run``, ``submit``, ``cancel``, ``demo``,
    ``spider serve``).

    The schema rule, one for every footing: **the database a configuration's ``database``
    section names is CLP's**, shared with CLP's components: only an explicit ``coordinator db
    upgrade`` (the deployment's init step, or ``alembic upgrade head``) changes its schema, and
    this refuses one that is not current. **Any other database is the coordinator's own** (the
    embedded default's SQLite file, a configuration file without a ``database`` section, or
    ``$COORDINATOR_DATABASE_URL`` without one): it is created (SQLite) and migrated here.

    Fails with ``SchemaNotCurrent`` for CLP's database, ``OSError`` when the SQLite file's
    directory cannot be created, and the driver's errors.
    """
    url = database_url(config)
    create_sqlite_directory(url)
    engine = create_database_engine(
        url, pool_size=config.compression_coordinator.database_connection_pool_size
    )
    try:
        if not config.database_configured:
            migrate.upgrade(engine)
        else:
            migrate.require_current_schema(engine)
    except BaseException:
        engine.dispose()
        raise
    return engine


def open_existing_engine(config: CoordinatorConfig, *, require_current: bool = True) -> Engine:
    """The database for a command that only reads (``jobs``, ``show``, ``health``, ``archives``,
    ``db current``): never created nor migrated.

    Fails with ``NoDatabase`` when a SQLite file does not exist (a mistyped ``--data-dir``),
    ``SchemaNotCurrent`` when ``require_current`` and the schema is not at the head, and the
    driver's errors.
    """
    url = database_url(config)
    path = sqlite_file(url)
    if path is not None and not path.is_file():
        raise NoDatabase(path)
    engine = create_database_engine(
        url, pool_size=config.compression_coordinator.database_connection_pool_size
    )
    try:
        if require_current:
            migrate.require_current_schema(engine)
    except BaseException:
        engine.dispose()
        raise
    return engine
