"""One connection kept open for the statements a process runs every few hundred milliseconds
whatever it is doing: the loop's reads (``polling_reads``) and the heartbeat
(``instances.Presence``).

Between two such statements the process sleeps, so each runs with cold caches, where a pooled
checkout and check-in cost ~0.27 ms of CPU, SQLAlchemy's statement execution ~0.35 ms, and the
``ROLLBACK`` or ``COMMIT`` that ends a statement's transaction a round trip: measured on MariaDB,
0.75-0.82 ms per read through the pool and 1.9 ms per heartbeat, against 0.41-0.45 ms for one
autocommit request on a kept connection (``docs/performance.md``). So each statement here is run
on the driver's cursor of one connection this object keeps, as its own transaction: on
MariaDB/MySQL from a sibling engine in autocommit mode (``database.autocommit_sibling``), on SQLite
from the engine itself (its connections are in the driver's autocommit mode already, and take a
transaction only from ``database._begin_immediately``'s ``BEGIN``). Statements are compiled once
(``Prepared``).

Only for a statement that is a whole transaction by itself. A driver error discards the connection
(the next statement opens another) and is raised as SQLAlchemy's ``DBAPIError``, so an outage is
seen as one. One thread's at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar, cast

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import PoolProxiedConnection
from sqlalchemy.sql import ClauseElement
from sqlalchemy.sql.compiler import SQLCompiler

from coordinator.store.database import autocommit_sibling, is_mysql

_T = TypeVar("_T")


class Prepared:
    """A statement as the driver takes it: its text in the engine's parameter style, and the
    driver's parameters for named values (each converted by its column type, as SQLAlchemy
    would)."""

    def __init__(self, statement: ClauseElement, engine: Engine) -> None:
        compiled = cast(SQLCompiler, statement.compile(dialect=engine.dialect))
        if not any(bind.required for bind in compiled.binds.values()):
            # Only its own constants: rendered into the text, so the driver formats nothing.
            compiled = cast(
                SQLCompiler,
                statement.compile(dialect=engine.dialect, compile_kwargs={"literal_binds": True}),
            )
        self.text = str(compiled)
        self._positions = compiled.positiontup if compiled.positional else None
        self._processors = {
            name: processor
            for name, bind in compiled.binds.items()
            if (processor := bind.type.bind_processor(engine.dialect)) is not None
        }
        # The values the statement holds itself (its constants, its LIMIT), the named ones unset.
        self._literals: dict[str, Any] = dict(
            compiled.construct_params(
                {name: None for name, bind in compiled.binds.items() if bind.required}
            )
        )

    def parameters(self, values: Mapping[str, object]) -> Any:
        """The driver's parameters for ``values`` (``None`` for a statement without any)."""
        if not self._literals and not values:
            return None
        named = {**self._literals, **values}
        for name, processor in self._processors.items():
            named[name] = processor(named[name])
        if self._positions is None:
            return named
        return tuple(named[name] for name in self._positions)


class KeptConnection:
    """See the module docstring."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._sibling = autocommit_sibling(engine, pool_size=1) if is_mysql(engine) else None
        self._connection: PoolProxiedConnection | None = None

    def prepare(self, statement: ClauseElement) -> Prepared:
        """``statement`` compiled for this connection's engine."""
        return Prepared(statement, self.engine)

    def finds(self, statement: Prepared, values: Mapping[str, object]) -> bool:
        """Whether the query ``statement`` returns a row. Raises ``DBAPIError``."""
        return self._run(statement, values, lambda cursor: cursor.fetchone() is not None)

    def rows(self, statement: Prepared, values: Mapping[str, object]) -> list[tuple[Any, ...]]:
        """The rows the query ``statement`` returns. Raises ``DBAPIError``."""
        return self._run(statement, values, lambda cursor: [tuple(row) for row in cursor])

    def changes(self, statement: Prepared, values: Mapping[str, object]) -> int:
        """The rows the write ``statement`` matched (``CLIENT.FOUND_ROWS`` on MariaDB, as
        everywhere in the coordinator), committed as it completes. Raises ``DBAPIError``; a
        failed write may have been committed all the same when its reply was lost."""
        return self._run(statement, values, lambda cursor: int(cursor.rowcount))

    def close(self) -> None:
        """Give the kept connection back and close the sibling engine's; a later statement opens
        another."""
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.close()
        if self._sibling is not None:
            self._sibling.dispose()

    def _run(
        self, statement: Prepared, values: Mapping[str, object], result: Callable[[Any], _T]
    ) -> _T:
        """``result(cursor)`` once the driver's cursor ran ``statement`` with ``values``."""
        parameters = statement.parameters(values)
        dbapi_error = self.engine.dialect.loaded_dbapi.Error
        try:
            if self._connection is None:
                self._connection = (self._sibling or self.engine).raw_connection()
            cursor = self._connection.driver_connection.cursor()  # type: ignore[union-attr]
            try:
                if parameters is None:  # sqlite3 refuses None for "no parameters"
                    cursor.execute(statement.text)
                else:
                    cursor.execute(statement.text, parameters)
                return result(cursor)
            finally:
                cursor.close()
        except dbapi_error as error:
            connection, self._connection = self._connection, None
            if connection is not None:
                connection.invalidate(error)
            raise DBAPIError.instance(statement.text, parameters, error, dbapi_error) from error
