"""MariaDB's pooled connections: no round trip the pool does not need, and no transaction or dead
connection handed on (``coordinator.store.database._pool_round_trips_when_needed``, issue 14).

Each check reads the server's own per-session counters on the pooled connection itself:
``Com_rollback`` counts ``ROLLBACK`` statements, ``Com_admin_commands`` counts pings.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import OperationalError

from coordinator.store import database
from coordinator.store.database import create_database_engine, is_transient
from tests.sql_capture import session_counter

pytestmark = pytest.mark.mariadb


@pytest.fixture
def pooled(mariadb_url: str) -> Iterator[Engine]:
    """An engine whose pool holds one connection, so each checkout reuses it."""
    engine = create_database_engine(mariadb_url, pool_size=1)
    with engine.begin() as connection:
        connection.execute(text("CREATE TABLE probe (id INT PRIMARY KEY) ENGINE=InnoDB"))
    try:
        yield engine
    finally:
        engine.dispose()


@contextmanager
def _another_connection(mariadb_url: str) -> Iterator[Connection]:
    """A transaction on an engine of its own, outside the pool under test."""
    engine = create_database_engine(mariadb_url)
    try:
        with engine.begin() as connection:
            yield connection
    finally:
        engine.dispose()


def _session(connection: Connection) -> int:
    return int(connection.execute(text("SELECT CONNECTION_ID()")).scalar_one())


def test_a_committed_connection_goes_back_to_the_pool_without_a_rollback(pooled: Engine) -> None:
    with pooled.begin() as connection:
        session = _session(connection)
        connection.execute(text("INSERT INTO probe VALUES (1)"))
        rollbacks = session_counter(connection, "Com_rollback")
    with pooled.begin() as connection:
        assert _session(connection) == session
        assert session_counter(connection, "Com_rollback") == rollbacks


def test_a_transaction_left_open_on_a_connection_is_rolled_back(pooled: Engine) -> None:
    with pooled.connect() as connection:
        connection.execute(text("INSERT INTO probe VALUES (2)"))
    # Without a commit, SQLAlchemy rolled it back on close: the row is not there.
    with pooled.connect() as connection:
        assert connection.execute(text("SELECT COUNT(*) FROM probe")).scalar_one() == 0


def test_a_transaction_left_open_under_sqlalchemy_is_rolled_back_by_the_pool(
    pooled: Engine, mariadb_url: str
) -> None:
    raw = pooled.raw_connection()  # a DBAPI user SQLAlchemy's Connection knows nothing of
    cursor = raw.cursor()
    cursor.execute("INSERT INTO probe VALUES (3)")
    cursor.close()
    raw.close()  # back to the pool inside the transaction: the pool's reset must roll it back
    with _another_connection(mariadb_url) as connection:
        # The row lock is free and the row absent: NOWAIT fails at once otherwise.
        locked = connection.execute(text("SELECT id FROM probe WHERE id = 3 FOR UPDATE NOWAIT"))
        assert locked.all() == []


def test_a_connection_in_use_is_not_pinged(pooled: Engine) -> None:
    with pooled.connect() as connection:
        session = _session(connection)
        pings = session_counter(connection, "Com_admin_commands")
    with pooled.connect() as connection:
        assert _session(connection) == session
        assert session_counter(connection, "Com_admin_commands") == pings


def test_an_idle_connection_is_pinged_before_reuse(
    pooled: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pooled.connect() as connection:
        session = _session(connection)
        pings = session_counter(connection, "Com_admin_commands")
    monkeypatch.setattr(database, "PING_AFTER_IDLE_SECS", 0.0)
    with pooled.connect() as connection:
        assert _session(connection) == session
        assert session_counter(connection, "Com_admin_commands") == pings + 1


def _kill_pooled_session(pooled: Engine, mariadb_url: str) -> int:
    with pooled.connect() as connection:
        session = _session(connection)
    with _another_connection(mariadb_url) as connection:
        connection.execute(text(f"KILL CONNECTION {session}"))
    return session


def test_an_idle_connection_the_server_dropped_is_replaced_on_checkout(
    pooled: Engine, mariadb_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    killed = _kill_pooled_session(pooled, mariadb_url)
    monkeypatch.setattr(database, "PING_AFTER_IDLE_SECS", 0.0)
    with pooled.begin() as connection:
        assert _session(connection) != killed
        connection.execute(text("INSERT INTO probe VALUES (4)"))


def test_a_connection_dropped_within_the_idle_time_fails_as_an_outage(
    pooled: Engine, mariadb_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trade for not pinging busy connections: the statement fails as an outage (which every
    caller already retries, as it must for a server dying mid-transaction), and the pool replaces
    the connection for the next checkout."""
    monkeypatch.setattr(database, "PING_AFTER_IDLE_SECS", 3600.0)
    killed = _kill_pooled_session(pooled, mariadb_url)
    with pytest.raises(OperationalError) as failure, pooled.begin() as connection:
        connection.execute(text("INSERT INTO probe VALUES (5)"))
    assert is_transient(failure.value)
    with pooled.begin() as connection:
        assert _session(connection) != killed
        connection.execute(text("INSERT INTO probe VALUES (5)"))


def test_connections_share_one_opportunistic_tls_context(
    mariadb_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pymysql tries TLS where the URL asks for none, building a context that loads the system's
    CA store for every connection (~20 ms each); the process builds it once. A URL's own TLS
    options still build their own context, per connection, as pymysql does."""
    built: list[ssl.SSLContext] = []
    real = ssl.create_default_context

    def counting(*args: Any, **kwargs: Any) -> ssl.SSLContext:
        built.append(real(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr(ssl, "create_default_context", counting)
    database._shared_tls_connection_class.cache_clear()
    engines = [create_database_engine(mariadb_url) for _ in range(3)]
    try:
        contexts = []
        for engine in engines:
            with engine.connect() as connection:
                assert connection.execute(text("SELECT 1")).scalar_one() == 1
                contexts.append(connection.connection.dbapi_connection.ctx)
    finally:
        for engine in engines:
            engine.dispose()
    assert len(built) == 1 and all(context is built[0] for context in contexts)

    own_options = database._shared_tls_connection_class()
    options = {"ssl": {"check_hostname": False}, "defer_connect": True}
    first, second = (own_options(**options) for _ in range(2))
    assert len(built) == 3 and first.ctx is not second.ctx
