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
    Index,
    Integer,
    MetaData,
    SmallInteger,
    String,
    Table,
    UniqueConstraint,
)
from sqlalchemy.dialects import mysql

from coordinator.store import names
from coordinator.store.schema import MYSQL_TABLE_OPTIONS
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


def ensure_dataset_tables(connection: Connection, dataset: str) -> None:
    """Create the dataset's archive and column-metadata tables unless they exist.

    Raises ``InvalidDatasetName`` before touching the database, or the driver's error when the DDL
    fails (on MySQL/MariaDB DDL commits implicitly, so call it outside a transaction that matters).
    """
    for table in (archives_table(dataset), column_metadata_table(dataset)):
        table.create(connection, checkfirst=True)
