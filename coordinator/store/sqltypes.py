"""Column types and defaults that render CLP's MySQL DDL on MariaDB and a working form on SQLite.

Migrations import these too: they are part of the stable vocabulary of the schema, not of any one
revision.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import BigInteger, DateTime, Integer, LargeBinary
from sqlalchemy.dialects import mysql
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.expression import FunctionElement

_MYSQL = ("mysql", "mariadb")

UnsignedBigInt = BigInteger().with_variant(mysql.BIGINT(unsigned=True), *_MYSQL)
"""``BIGINT UNSIGNED`` (CLP's u64 ids and sizes)."""

UnsignedBigIntKey = UnsignedBigInt.with_variant(Integer(), "sqlite")
"""An auto-incrementing ``BIGINT UNSIGNED`` key; SQLite only auto-increments ``INTEGER`` keys."""

BigIntKey = BigInteger().with_variant(Integer(), "sqlite")
"""An auto-incrementing ``BIGINT`` key."""

Millis = DateTime().with_variant(mysql.DATETIME(fsp=3), *_MYSQL)
"""``DATETIME(3)``."""

MediumBlob = LargeBinary().with_variant(mysql.MEDIUMBLOB(), *_MYSQL)
"""``MEDIUMBLOB`` (the job's ``clp_config``)."""

LongBlob = LargeBinary().with_variant(mysql.LONGBLOB(), *_MYSQL)
"""``LONGBLOB`` (task graphs, inputs and outputs of the embedded engine)."""


class CurrentTimestamp(FunctionElement[Any]):
    """A column default of "now": ``CURRENT_TIMESTAMP[(fsp)] [ON UPDATE …]`` on MySQL/MariaDB.

    SQLite has neither fractional ``CURRENT_TIMESTAMP`` nor ``ON UPDATE``; there it renders the
    plain ``CURRENT_TIMESTAMP`` and the coordinator sets ``update_time`` explicitly in every write.
    """

    inherit_cache = True

    def __init__(self, fsp: int = 0, *, on_update: bool = False) -> None:
        super().__init__()
        self.fsp = fsp
        self.on_update = on_update


@compiles(CurrentTimestamp)
def _current_timestamp_default(element: CurrentTimestamp, compiler: SQLCompiler, **_: Any) -> str:
    return "CURRENT_TIMESTAMP"


@compiles(CurrentTimestamp, "mysql")
@compiles(CurrentTimestamp, "mariadb")
def _current_timestamp_mysql(element: CurrentTimestamp, compiler: SQLCompiler, **_: Any) -> str:
    now = f"CURRENT_TIMESTAMP({element.fsp})" if element.fsp else "CURRENT_TIMESTAMP"
    return f"{now} ON UPDATE {now}" if element.on_update else now
