"""The per-dataset tables of CLP's clp-s storage engine, and the dataset's ``clp_datasets`` row.

CLP's ``add_dataset`` (``clp_py_utils/clp_metadata_db_utils.py``) registers a dataset in
``clp_datasets`` and creates three tables: ``clp_{dataset}_archives``, ``clp_{dataset}_files`` and
``clp_{dataset}_column_metadata``. CLP's readers need all three: the archive garbage collector and
``archive_manager.py del`` delete from ``_files`` before ``_archives``, and the WebUI's Details
query unions every registered dataset's ``_files``. A dataset this coordinator publishes to must
therefore look exactly as if ``add_dataset`` had created it, and one CLP created first is adopted:

* On MySQL/MariaDB each table is CLP's DDL: the same columns, types, ``NOT NULL``, primary key and
  keys with CLP's names, ``USING BTREE`` and the ``path(768)`` prefix, ``ROW_FORMAT=DYNAMIC`` only
  on ``_files``, and no explicit charset (the database's default, as CLP's statements get), so
  ``SHOW CREATE TABLE`` cannot tell who created it. The keys are part of the ``CREATE TABLE``
  statement, which makes a creation atomic (a DDL statement commits on its own there).
* On SQLite index names are global to the database, so CLP's ``archives_creation_order`` could
  exist only once; there the non-unique indexes are prefixed with the table name
  (``clp_web_archives_archives_creation_order``) and created in the table's transaction. The
  unique key stays an inline ``CONSTRAINT archive_id`` (constraint names are per table).
* A table that exists is never altered: whoever created it (CLP, an earlier version) owns its form.
* The ``clp_datasets`` row is inserted as ``add_dataset`` inserts it when absent and never updated.

Table names are built only from a validated dataset name (``coordinator.store.names``).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, NamedTuple

from sqlalchemy import (
    BigInteger,
    Column,
    Connection,
    Engine,
    Index,
    Integer,
    MetaData,
    SmallInteger,
    String,
    Table,
    UniqueConstraint,
    bindparam,
    func,
    inspect,
    select,
)
from sqlalchemy.dialects import mysql
from sqlalchemy.dialects.mysql import insert as mysql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import CompileError
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.schema import ColumnCollectionConstraint, CreateIndex, CreateTable
from sqlalchemy.sql.compiler import DDLCompiler

from coordinator.errors import CoordinatorError
from coordinator.store import names
from coordinator.store.schema import datasets as _datasets
from coordinator.store.sqltypes import UnsignedBigIntKey

MYSQL = "mysql"
SQLITE = "sqlite"
_MYSQL_DIALECTS = ("mysql", "mariadb")

_TinyInt = SmallInteger().with_variant(mysql.TINYINT(), "mysql", "mariadb")


class DatasetNameCollision(CoordinatorError, ValueError):
    """``clp_datasets`` holds the name with another letter case (MariaDB compares names case-
    insensitively), so the dataset's tables would be ones no CLP reader looks at."""


class _Key(NamedTuple):
    """One of CLP's keys: its name, its columns (``(column, prefix length)``) and uniqueness."""

    name: str
    columns: tuple[tuple[str, int | None], ...]
    unique: bool = False


class _MySqlKey(ColumnCollectionConstraint):
    """A ``[UNIQUE] KEY `name` (`col`[(len)], …) USING BTREE`` inside MySQL's ``CREATE TABLE``."""

    __visit_name__ = "clp_mysql_key"

    def __init__(self, key: _Key) -> None:
        super().__init__(*(column for column, _ in key.columns), name=key.name)
        self.unique = key.unique
        self.prefix_lengths = {column: length for column, length in key.columns if length}


@compiles(_MySqlKey)
def _mysql_key_elsewhere(element: _MySqlKey, compiler: DDLCompiler, **_: Any) -> str:
    raise CompileError(
        f"{element.name}: a MySQL-flavoured dataset table created on another database"
    )


@compiles(_MySqlKey, "mysql")
@compiles(_MySqlKey, "mariadb")
def _mysql_key(element: _MySqlKey, compiler: DDLCompiler, **_: Any) -> str:
    quote = compiler.preparer.quote
    parts = []
    for column in element.columns:
        length = element.prefix_lengths.get(column.name)
        parts.append(quote(column.name) + (f"({length})" if length else ""))
    kind = "UNIQUE KEY" if element.unique else "KEY"
    return f"{kind} {quote(str(element.name))} ({', '.join(parts)}) USING BTREE"


def _keys(table_name: str, flavour: str, *keys: _Key) -> list[Any]:
    """The table's keys as the flavour creates them (see the module docstring)."""
    if flavour == MYSQL:
        return [_MySqlKey(key) for key in keys]
    created: list[Any] = []
    for key in keys:
        columns = [column for column, _ in key.columns]
        if key.unique:
            created.append(UniqueConstraint(*columns, name=key.name))
        else:
            created.append(Index(f"{table_name}_{key.name}", *columns))
    return created


def _flavour(dialect_name: str) -> str:
    return MYSQL if dialect_name in _MYSQL_DIALECTS else SQLITE


class DatasetTables(NamedTuple):
    """A dataset's tables, in the order ``add_dataset`` creates them."""

    column_metadata: Table
    archives: Table
    files: Table


@lru_cache(maxsize=512)
def dataset_tables(dataset: str, dialect: str = MYSQL) -> DatasetTables:
    """The dataset's three tables for ``dialect`` (a dialect name; its keys differ on SQLite).

    Any flavour serves for queries. Raises ``InvalidDatasetName`` for an unsafe name.
    """
    flavour = _flavour(dialect)
    archives = names.archives_table_name(dataset)
    files = names.files_table_name(dataset)
    column_metadata = names.column_metadata_table_name(dataset)
    return DatasetTables(
        column_metadata=Table(
            column_metadata,
            MetaData(),
            Column("name", String(512), primary_key=True),
            Column("type", _TinyInt, primary_key=True, autoincrement=False),
        ),
        archives=Table(
            archives,
            MetaData(),
            Column("pagination_id", UnsignedBigIntKey, primary_key=True, autoincrement=True),
            Column("id", String(64), nullable=False),
            Column("begin_timestamp", BigInteger, nullable=False),
            Column("end_timestamp", BigInteger, nullable=False),
            Column("uncompressed_size", BigInteger, nullable=False),
            Column("size", BigInteger, nullable=False),
            Column("creator_id", String(64), nullable=False),
            Column("creation_ix", Integer, nullable=False),
            *_keys(
                archives,
                flavour,
                _Key("archives_creation_order", (("creator_id", None), ("creation_ix", None))),
                _Key("archive_id", (("id", None),), unique=True),
            ),
        ),
        files=Table(
            files,
            MetaData(),
            Column("id", String(64), primary_key=True),
            Column("orig_file_id", String(64), nullable=False),
            Column("path", String(12288), nullable=False),
            Column("begin_timestamp", BigInteger, nullable=False),
            Column("end_timestamp", BigInteger, nullable=False),
            Column("num_uncompressed_bytes", BigInteger, nullable=False),
            Column("begin_message_ix", BigInteger, nullable=False),
            Column("num_messages", BigInteger, nullable=False),
            Column("archive_id", String(64), nullable=False),
            *_keys(
                files,
                flavour,
                _Key("files_path", (("path", 768),)),
                _Key("files_archive_id", (("archive_id", None),)),
            ),
            mysql_row_format="DYNAMIC",
        ),
    )


def archives_table(dataset: str) -> Table:
    """``clp_{dataset}_archives`` for queries; raises ``InvalidDatasetName`` for an unsafe name."""
    return dataset_tables(dataset).archives


def files_table(dataset: str) -> Table:
    """``clp_{dataset}_files`` for queries; raises ``InvalidDatasetName`` for an unsafe name."""
    return dataset_tables(dataset).files


def column_metadata_table(dataset: str) -> Table:
    """``clp_{dataset}_column_metadata`` for queries; raises ``InvalidDatasetName``."""
    return dataset_tables(dataset).column_metadata


def create_table_if_missing(connection: Connection, table: Table) -> bool:
    """Create ``table`` (from ``dataset_tables`` for this connection's dialect) unless it exists.

    Whether it was created. An existing table is left exactly as it is. ``IF NOT EXISTS`` makes a
    creator that loses a race a no-op instead of an error (as CLP's own statements). On MySQL this
    is one statement that commits implicitly; on SQLite the indexes join the caller's transaction.
    Fails with the driver's errors.
    """
    if inspect(connection).has_table(table.name):
        return False
    connection.execute(CreateTable(table, if_not_exists=True))
    for index in sorted(table.indexes, key=lambda index: str(index.name)):
        connection.execute(CreateIndex(index, if_not_exists=True))
    return True


def create_missing_dataset_tables(connection: Connection, dataset: str) -> list[str]:
    """Create whichever of the dataset's three tables is missing, on the caller's connection.

    The names of the tables created. Used by migration ``0005`` (keep the definitions above stable:
    the migration's result depends on them). Raises ``InvalidDatasetName`` before touching the
    database, else the driver's errors.
    """
    tables = dataset_tables(dataset, connection.dialect.name)
    return [table.name for table in tables if create_table_if_missing(connection, table)]


def ensure_dataset_tables(engine: Engine, dataset: str) -> None:
    """Create the dataset's tables as ``add_dataset`` does, unless they exist.

    Each table in a transaction of its own, on connections of its own: on MySQL/MariaDB DDL commits
    implicitly, so it must never run inside a transaction that matters. Safe under concurrent
    creators (``IF NOT EXISTS``; SQLite's ``BEGIN IMMEDIATE`` serialises them). Raises
    ``InvalidDatasetName`` before touching the database, else the driver's errors.
    """
    for table in dataset_tables(dataset, engine.dialect.name):
        with engine.begin() as connection:
            create_table_if_missing(connection, table)


def registered_in_any_case(connection: Connection, name: str) -> list[str]:
    """The registered datasets whose name equals ``name`` but for letter case (``name`` itself
    included when registered). Raises the driver's errors."""
    return list(connection.execute(_IN_ANY_CASE, {"lower_name": name.lower()}).scalars())


_IN_ANY_CASE = select(_datasets.c.name).where(
    func.lower(_datasets.c.name) == bindparam("lower_name")
)
"""Built once (read at every submission): SQLAlchemy reuses its cache key and compiled form."""


def register_dataset(connection: Connection, name: str, archive_storage_directory: str) -> None:
    """Register the dataset in ``clp_datasets`` as ``add_dataset`` does, unless it is registered.

    Runs in the caller's transaction (the commit's). The row CLP's ``add_dataset`` inserts —
    ``(name, archive_storage_directory)`` — is inserted when absent; an existing row is adopted and
    never altered, whoever wrote it. A concurrent writer inserting it first is not an error: the
    insert becomes a no-op (``ON DUPLICATE KEY UPDATE name = name`` on MySQL, which leaves the row
    unchanged; ``ON CONFLICT DO NOTHING`` on SQLite). Raises ``DatasetNameCollision`` when the
    registered name differs from ``name`` only in letter case (MariaDB's collations compare names
    case-insensitively, while table names are case-sensitive), else the driver's errors.
    """
    registered = select(_datasets.c.name).where(_datasets.c.name == name)
    existing = connection.execute(registered).scalar_one_or_none()
    if existing is None:
        values = {"name": name, "archive_storage_directory": archive_storage_directory}
        if connection.dialect.name in _MYSQL_DIALECTS:
            connection.execute(
                mysql_insert(_datasets)
                .values(**values)
                .on_duplicate_key_update(name=_datasets.c.name)
            )
        else:
            connection.execute(
                sqlite_insert(_datasets)
                .values(**values)
                .on_conflict_do_nothing(index_elements=["name"])
            )
        existing = connection.execute(registered).scalar_one()
    if existing != name:
        raise DatasetNameCollision(
            f"dataset {name!r} collides with the registered dataset {existing!r}: the database "
            f"compares dataset names without letter case, so CLP would never read "
            f"{names.archives_table_name(name)}; use {existing!r}"
        )
