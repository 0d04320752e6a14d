"""The per-dataset archive tables of CLP's clp-s storage engine, created on demand.

``clp_{dataset}_archives`` and ``clp_{dataset}_column_metadata`` follow CLP's DDL
(``clp_metadata_db_utils.py``); the name is built only from a validated dataset name.
"""

from __future__ import annotations

from functools import lru_cache

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
    inspect,
)
from sqlalchemy.dialects import mysql
from sqlalchemy.dialects.mysql import insert as mysql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import DBAPIError

from coordinator.store import names
from coordinator.store.schema import MYSQL_TABLE_OPTIONS, Dataset
from coordinator.store.sqltypes import UnsignedBigIntKey

_TinyInt = SmallInteger().with_variant(mysql.TINYINT(), "mysql", "mariadb")


@lru_cache(maxsize=256)
def archives_table(dataset: str) -> Table:
    """``clp_{dataset}_archives``; raises ``InvalidDatasetName`` for an unsafe name."""
    return Table(
        names.archives_table_name(dataset),
        MetaData(),
        Column("pagination_id", UnsignedBigIntKey, primary_key=True, autoincrement=True),
        Column("id", String(64), nullable=False),
        Column("begin_timestamp", BigInteger, nullable=False),
        Column("end_timestamp", BigInteger, nullable=False),
        Column("uncompressed_size", BigInteger, nullable=False),
        Column("size", BigInteger, nullable=False),
        Column("creator_id", String(64), nullable=False),
        Column("creation_ix", Integer, nullable=False),
        UniqueConstraint("id", name="archive_id"),
        Index("archives_creation_order", "creator_id", "creation_ix"),
        **MYSQL_TABLE_OPTIONS,
    )


@lru_cache(maxsize=256)
def column_metadata_table(dataset: str) -> Table:
    """``clp_{dataset}_column_metadata``; raises ``InvalidDatasetName`` for an unsafe name."""
    return Table(
        names.column_metadata_table_name(dataset),
        MetaData(),
        Column("name", String(512), primary_key=True),
        Column("type", _TinyInt, primary_key=True, autoincrement=False),
        **MYSQL_TABLE_OPTIONS,
    )


def ensure_dataset_tables(engine: Engine, dataset: str) -> None:
    """Create the dataset's archive and column-metadata tables unless they exist.

    Runs on its own connection: on MySQL/MariaDB DDL commits implicitly, so it must never run inside
    a transaction that matters. Two processes creating the same table at once is not an error.
    Raises ``InvalidDatasetName`` before touching the database, else the driver's errors.
    """
    for table in (archives_table(dataset), column_metadata_table(dataset)):
        try:
            with engine.begin() as connection:
                table.create(connection, checkfirst=True)
        except DBAPIError:
            # Lost a creation race (checkfirst saw nothing, the other creator finished first).
            if not inspect(engine).has_table(table.name):
                raise


def register_dataset(connection: Connection, name: str, archive_storage_directory: str) -> None:
    """Insert or update the ``clp_datasets`` row, as CLP's commit and ``add_dataset`` do."""
    values = {"name": name, "archive_storage_directory": archive_storage_directory}
    if connection.dialect.name in ("mysql", "mariadb"):
        mysql_upsert = mysql_insert(Dataset).values(**values)
        connection.execute(
            mysql_upsert.on_duplicate_key_update(
                archive_storage_directory=mysql_upsert.inserted.archive_storage_directory
            )
        )
    else:
        sqlite_upsert = sqlite_insert(Dataset).values(**values)
        connection.execute(
            sqlite_upsert.on_conflict_do_update(
                index_elements=["name"],
                set_={"archive_storage_directory": archive_storage_directory},
            )
        )
