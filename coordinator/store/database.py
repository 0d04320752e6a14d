"""Engines for the two footings: SQLite (embedded default) and MariaDB/MySQL (production)."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import (
    DBAPIError,
    DisconnectionError,
    InterfaceError,
    InvalidatePoolError,
    SQLAlchemyError,
)
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.pool import ConnectionPoolEntry, PoolResetState

from coordinator.errors import CoordinatorError

SQLITE_BUSY_TIMEOUT_SECONDS = 30.0
MYSQL_DEADLOCK = 1213
DEADLOCK_ATTEMPTS = 3
"""How often ``retrying_deadlocks`` runs a transaction that MariaDB chose as a deadlock's victim."""
PING_AFTER_IDLE_SECS = 1.0
"""A pooled MariaDB connection unused this long is pinged before it is used again."""

_SERVER_STATUS_IN_TRANS = 0x0001
"""MySQL's ``SERVER_STATUS_IN_TRANS`` flag, which pymysql keeps in ``server_status``."""
_CHECKED_IN_AT = "coordinator_checked_in_at"
_READ_ONLY = "coordinator_read_only"

_T = TypeVar("_T")


class NoDatabase(CoordinatorError, FileNotFoundError):
    """A command that only reads found no SQLite database file where the configuration points.

    Read-only commands never create a database: a mistyped ``--data-dir`` must say so, not answer
    from a new empty one.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        super().__init__(
            f"no database at {path}: check --data-dir (or $COORDINATOR_HOME, "
            "$COORDINATOR_DATABASE_URL, --config); `coordinator db upgrade` or `coordinator demo` "
            "creates one"
        )


def sqlite_file(url: str) -> Path | None:
    """The file a SQLite URL names; ``None`` for another backend or an in-memory database.

    Fails with SQLAlchemy's ``ArgumentError`` for a URL it cannot parse.
    """
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database)


def create_sqlite_directory(url: str) -> Path | None:
    """For a SQLite URL, create the directory of its file (SQLite creates the file itself) and
    return the file; ``None`` for another backend. Fails with ``OSError`` as ``Path.mkdir``."""
    path = sqlite_file(url)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
    return path


def create_database_engine(url: str, *, pool_size: int = 10) -> Engine:
    """An engine for ``url`` set up so that guarded transitions behave alike on both backends.

    * SQLite: every transaction starts with ``BEGIN IMMEDIATE`` (a read in it cannot be overtaken by
      another writer, the stand-in for ``SELECT … FOR UPDATE``), except a ``reading`` block's, WAL
      journal, foreign keys on, and a busy timeout instead of an immediate "database is locked".
    * MySQL/MariaDB: ``READ COMMITTED`` (as log-ingestor uses; fewer gap locks for ``SKIP LOCKED``
      claims), ``utf8mb4``, a liveness check before a pooled connection idle for a second or more
      is reused, and a rollback of a returned one that may hold a transaction
      (``_pool_round_trips_when_needed``). The ``mysql+pymysql`` dialect reports matched rows
      (``CLIENT.FOUND_ROWS``), which the row-count checks rely on.

    Fails with SQLAlchemy's ``ArgumentError`` for a URL it cannot parse; no connection is made here.
    """
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        engine = create_engine(
            parsed,
            connect_args={"timeout": SQLITE_BUSY_TIMEOUT_SECONDS, "check_same_thread": False},
        )
        _begin_immediately(engine)
        return engine
    if parsed.get_backend_name() in ("mysql", "mariadb") and "charset" not in parsed.query:
        parsed = parsed.update_query_dict({"charset": "utf8mb4"})
    return _mysql_engine(parsed, pool_size=pool_size, isolation_level="READ COMMITTED")


def _mysql_engine(url: URL, *, pool_size: int, isolation_level: str, **options: Any) -> Engine:
    engine = create_engine(
        url,
        pool_size=pool_size,
        pool_recycle=3600,
        pool_reset_on_return=None,
        isolation_level=isolation_level,
        **options,
    )
    _pool_round_trips_when_needed(engine)
    if engine.dialect.driver == "pymysql":
        event.listen(engine, "do_connect", _connect_sharing_tls_context)
    return engine


def _connect_sharing_tls_context(
    dialect: Any, _: ConnectionPoolEntry, cargs: list[Any], cparams: dict[str, Any]
) -> Any:
    """A pymysql connection whose opportunistic TLS context is the process's one.

    pymysql (1.2) tries TLS on a connection whose URL asks for none ("preferred" mode: used when
    the server offers it, nothing verified) and builds that context anew for every connection,
    loading the system's CA store, which an unverifying context never reads: ~20 ms of CPU per
    connection here, a fifth of a command's own work on MariaDB and ~1 ms per job of a
    1,000-job benchmark's executors. Any TLS option in the URL builds its context as before.
    """
    return _shared_tls_connection_class()(*cargs, **cparams)


@lru_cache(maxsize=1)
def _shared_tls_connection_class() -> type[Any]:
    from pymysql.connections import Connection as PyMySQLConnection  # noqa: PLC0415 (MariaDB only)

    lock = threading.Lock()
    shared: list[Any] = []

    class SharedTlsConnection(PyMySQLConnection):  # type: ignore[misc]
        def _create_ssl_ctx(self, sslp: Any) -> Any:
            if sslp != {}:  # the URL's own TLS options (or a context): pymysql's way
                return super()._create_ssl_ctx(sslp)
            with lock:
                if not shared:
                    shared.append(super()._create_ssl_ctx(sslp))
                return shared[0]

    return SharedTlsConnection


class AutocommitWrites:
    """Writes made of one statement, in which that statement is the whole transaction.

    On MariaDB/MySQL a one-statement transaction costs two requests (the statement, then
    ``COMMIT``); on a connection in autocommit mode InnoDB commits the statement as it completes,
    atomically and durably alike, in one request. Four such writes happen per small job (the
    embedded engine's two state records, the compress task's ``storing`` and ``stored``): issue 14
    measured 0.06-0.08 ms less client CPU and 0.12 ms less latency per write, and a request fewer
    for the server. The connections come from a sibling engine of ``engine`` (same URL, a pool of
    ``pool_size``, made on first use), with ``READ COMMITTED`` as every other session of the
    coordinator, on which neither ``COMMIT`` nor ``ROLLBACK`` is ever sent
    (``skip_autocommit_rollback``). On SQLite a block is an ordinary ``engine.begin()``
    transaction: its ``COMMIT`` is no round trip, and its ``BEGIN IMMEDIATE`` must stay.

    Only for a block whose one write is the last statement that matters: on MariaDB a read before
    it sees the database as of that read, not as of the write, and nothing is rolled back when the
    block fails after its write. A block that must write twice atomically uses ``engine.begin()``.
    """

    def __init__(self, engine: Engine, *, pool_size: int = 2) -> None:
        self.engine = engine
        self._pool_size = pool_size
        self._on_mysql = is_mysql(engine)
        self._autocommit: Engine | None = None
        self._lock = threading.Lock()

    @contextmanager
    def connection(self) -> Iterator[Connection]:
        """A connection for one write (see the class). Raises the driver's errors; a failed write
        may have been committed all the same when its reply was lost, as a failed ``COMMIT``."""
        if not self._on_mysql:
            with self.engine.begin() as connection:
                yield connection
            return
        with (self._autocommit or self._sibling()).connect() as connection:
            yield connection

    def dispose(self) -> None:
        """Close the sibling engine's pooled connections (``engine`` is its owner's to dispose)."""
        with self._lock:
            if self._autocommit is not None:
                self._autocommit.dispose()

    def _sibling(self) -> Engine:
        """The sibling engine, made by the first write (the lock only guards its making)."""
        with self._lock:
            if self._autocommit is None:
                self._autocommit = autocommit_sibling(self.engine, pool_size=self._pool_size)
            return self._autocommit


def autocommit_sibling(engine: Engine, *, pool_size: int) -> Engine:
    """An engine for MariaDB/MySQL ``engine``'s URL whose connections are in autocommit mode, with
    ``READ COMMITTED`` as every other session of the coordinator, on which neither ``COMMIT`` nor
    ``ROLLBACK`` is ever sent (``skip_autocommit_rollback``); no connection is made here."""
    sibling = _mysql_engine(
        engine.url,
        pool_size=pool_size,
        isolation_level="AUTOCOMMIT",
        skip_autocommit_rollback=True,
    )
    event.listen(sibling, "connect", _read_committed)
    return sibling


def _read_committed(dbapi_connection: Any, _: ConnectionPoolEntry) -> None:
    # AUTOCOMMIT leaves the session at the server's default (REPEATABLE READ), under which an
    # INSERT … SELECT would lock the rows it reads; every other session is READ COMMITTED.
    cursor = dbapi_connection.cursor()
    cursor.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
    cursor.close()


def _begin_immediately(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: sqlite3.Connection, _: ConnectionPoolEntry) -> None:
        # Take transaction control away from the sqlite3 module so "begin" below is the only BEGIN.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={int(SQLITE_BUSY_TIMEOUT_SECONDS * 1000)}")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Connection) -> None:
        read_only = connection.get_execution_options().get(_READ_ONLY, False)
        connection.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")


@contextmanager
def reading(engine: Engine) -> Iterator[Connection]:
    """A connection for reads only; its transaction is rolled back when the block ends.

    On SQLite its transaction begins deferred (``BEGIN``), not ``BEGIN IMMEDIATE``: a WAL reader
    takes no lock, so it neither waits for the writers of other processes (an executor's commit
    and its fsync) nor makes them wait. Its reads see one snapshot, as on MariaDB. Nothing may be
    written on it: on SQLite the write would have to take the lock a reader never waits for, and
    could fail at once with "database is locked". Raises the driver's errors.
    """
    with engine.connect() as connection:
        yield connection.execution_options(**{_READ_ONLY: True})


def _pool_round_trips_when_needed(engine: Engine) -> None:
    """SQLAlchemy's pool, as configured by default, spends two round trips per checkout: a ping
    before (``pool_pre_ping``) and a ``ROLLBACK`` on return, even after a ``COMMIT``. With several
    short transactions per job, they were about a third of all round trips (issue 14). Instead:

    * a connection is pinged only when it has been idle ``PING_AFTER_IDLE_SECS`` or more (a server
      restart or ``wait_timeout`` then shows on checkout, not in a statement); a failed ping
      replaces it, and every pooled connection older than it when the server dropped it. One that
      dies within the second fails its statement as an outage, as one dying mid-transaction does.
    * a returned connection is rolled back when it may hold a transaction. SQLAlchemy already
      rolled back a transaction left open on its ``Connection`` (``transaction_was_reset``); after
      an explicit commit or rollback, pymysql's ``server_status`` (from that statement's OK packet)
      says whether a transaction is still open. A driver without it is always rolled back.
    """

    @event.listens_for(engine, "checkin")
    def _on_checkin(_: Any, record: ConnectionPoolEntry) -> None:
        record.info[_CHECKED_IN_AT] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _on_checkout(dbapi_connection: Any, record: ConnectionPoolEntry, _: Any) -> None:
        checked_in_at = record.info.get(_CHECKED_IN_AT)
        if checked_in_at is None or time.monotonic() - checked_in_at < PING_AFTER_IDLE_SECS:
            return  # new, or used within the second
        try:
            engine.dialect.do_ping(dbapi_connection)
        except engine.dialect.loaded_dbapi.Error as error:
            if engine.dialect.is_disconnect(error, dbapi_connection, None):
                raise InvalidatePoolError(f"pooled connection gone: {error}") from error
            raise DisconnectionError(f"pooled connection unusable: {error}") from error

    @event.listens_for(engine, "reset")
    def _on_reset(dbapi_connection: Any, _: ConnectionPoolEntry, state: PoolResetState) -> None:
        if state.transaction_was_reset:
            return
        server_status = getattr(dbapi_connection, "server_status", None)
        if isinstance(server_status, int) and not server_status & _SERVER_STATUS_IN_TRANS:
            return
        dbapi_connection.rollback()


def is_mysql(engine: Engine) -> bool:
    """Whether ``engine`` speaks to MySQL or MariaDB."""
    return engine.dialect.name in ("mysql", "mariadb")


_TRANSIENT_MYSQL_ERRORS = frozenset(
    {
        1040,  # too many connections
        1053,  # server shutdown in progress
        1205,  # lock wait timeout
        MYSQL_DEADLOCK,
        1927,  # connection was killed
        2002,  # cannot connect through the socket
        2003,  # cannot connect to the server
        2006,  # server has gone away
        2013,  # lost connection during query
        2055,  # lost connection at handshake / system error
    }
)
_TRANSIENT_SQLITE_WORDS = ("locked", "busy", "unable to open", "disk i/o")


def is_transient(error: SQLAlchemyError) -> bool:
    """Whether ``error`` is an outage (worth retrying without limit) rather than a lasting fault.

    Outages: a connection lost or refused, a pool exhausted, a deadlock or lock timeout, a busy
    SQLite file. Everything else (a missing privilege, a table that cannot be created, bad data)
    would fail the same way on every attempt.
    """
    if isinstance(error, DisconnectionError | PoolTimeout | InterfaceError):
        return True
    if isinstance(error, DBAPIError):
        return error.connection_invalidated or (
            error.orig is not None and is_transient_driver_error(error.orig)
        )
    return False


def is_transient_driver_error(error: BaseException) -> bool:
    """``is_transient`` for an error as the driver raised it, before SQLAlchemy wraps it (what
    SQLAlchemy's pool logs when it cannot roll back a connection the database dropped)."""
    code = _mysql_code(error)
    if code is not None:
        return code in _TRANSIENT_MYSQL_ERRORS
    if isinstance(error, sqlite3.OperationalError):
        text = str(error).lower()
        return any(word in text for word in _TRANSIENT_SQLITE_WORDS)
    return False


def is_deadlock(error: SQLAlchemyError) -> bool:
    """Whether ``error`` is MariaDB's deadlock (1213): it rolled the whole transaction back."""
    return _mysql_code(getattr(error, "orig", None)) == MYSQL_DEADLOCK


def _mysql_code(error: BaseException | None) -> int | None:
    """The MySQL/MariaDB error number a driver error carries first (pymysql's form), if any."""
    arguments: tuple[object, ...] = tuple(getattr(error, "args", ()))
    code = arguments[0] if arguments else None
    return code if isinstance(code, int) else None


def retrying_deadlocks(transaction: Callable[[], _T], *, attempts: int = DEADLOCK_ATTEMPTS) -> _T:
    """``transaction()`` (which opens, runs and commits one whole transaction), run again at once
    when MariaDB chose it as a deadlock's victim, at most ``attempts`` times in all.

    A deadlock is not an outage: MariaDB has rolled the victim back ("try restarting transaction")
    and the other transaction goes on, so running it again at once succeeds, where waiting out an
    outage would pause the whole loop and drop the work done before the transaction (a Spider
    registration not yet recorded). ``transaction`` must keep nothing of a rolled-back attempt.
    Raises the last deadlock after ``attempts`` of them, and any other error at once.
    """
    for attempt in range(1, attempts + 1):
        try:
            return transaction()
        except SQLAlchemyError as error:
            if attempt == attempts or not is_deadlock(error):
                raise
    raise AssertionError("unreachable: the last attempt returns or raises")
