"""``coordinator.store.kept_connection``: one request per statement on one kept connection, no
pooled checkout, and a dropped connection seen as an outage and replaced."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing
from datetime import datetime
from typing import Any

import pytest
from sqlalchemy import Engine, bindparam, delete, event, select, text, update
from sqlalchemy.exc import DBAPIError

from coordinator.lifecycle import JobStatus
from coordinator.store import migrate
from coordinator.store.database import create_database_engine, is_mysql, is_transient
from coordinator.store.instances import COORDINATOR, Presence
from coordinator.store.jobs import JobStore
from coordinator.store.kept_connection import KeptConnection
from coordinator.store.schema import compression_jobs as _jobs
from coordinator.store.schema import coordinator_instances as _instances
from tests.timing import wait_until

_PENDING = select(_jobs.c.id).where(_jobs.c.status == int(JobStatus.PENDING)).limit(1)
_LEASE = (
    update(_jobs)
    .where(_jobs.c.id == bindparam("w_id"))
    .values(lease_owner=bindparam("owner"), lease_expires_at=bindparam("expires"))
)
EXPIRES = datetime(2026, 12, 7, 23, 0, 0, 123_000)


@pytest.fixture
def kept(store: JobStore) -> Iterator[KeptConnection]:
    with closing(KeptConnection(store.engine)) as connection:
        yield connection


def _requests_of(kept: KeptConnection) -> list[bytes]:
    """The requests the kept connection sends from now on (MariaDB: its driver's commands)."""
    connection = kept._connection
    assert connection is not None
    driver = connection.driver_connection
    requests: list[bytes] = []
    sent = driver._execute_command  # type: ignore[union-attr]

    def counted(command: int, sql: Any) -> Any:
        requests.append(sql if isinstance(sql, bytes) else str(sql).encode())
        return sent(command, sql)

    driver._execute_command = counted  # type: ignore[union-attr]
    return requests


def test_each_statement_is_one_request_on_the_kept_connection(
    store: JobStore, kept: KeptConnection
) -> None:
    """No pooled checkout of the engine after the first, and on MariaDB nothing but the statement
    itself (autocommit: no ``ROLLBACK``, no ``COMMIT``); the write is committed as it completes."""
    pending, lease = kept.prepare(_PENDING), kept.prepare(_LEASE)
    checkouts: list[object] = []
    event.listen(store.engine, "checkout", lambda *_: checkouts.append(1))
    assert not kept.finds(pending, {})  # opens the kept connection
    checkouts.clear()
    connection = kept._connection
    requests = _requests_of(kept) if is_mysql(store.engine) else []
    job = store.create_job(b"x")
    checkouts.clear()
    for _ in range(3):
        assert kept.finds(pending, {})
        assert kept.changes(lease, {"w_id": job, "owner": "a", "expires": EXPIRES}) == 1
    assert kept.changes(lease, {"w_id": job + 1, "owner": "a", "expires": EXPIRES}) == 0
    assert checkouts == [] and kept._connection is connection
    if is_mysql(store.engine):
        assert len(requests) == 7
        assert all(request.split()[0].upper() in (b"SELECT", b"UPDATE") for request in requests)
    with store.engine.connect() as other:  # seen, to the millisecond, by another session
        row = other.execute(select(_jobs.c.lease_owner, _jobs.c.lease_expires_at)).one()
    assert tuple(row) == ("a", EXPIRES)


def test_a_dropped_connection_is_an_outage_and_the_next_statement_reconnects(
    mariadb_url: str,
) -> None:
    """MariaDB ends the kept connection: the statement fails as an outage (``is_transient``), and
    the next one opens another connection."""
    engine = create_database_engine(mariadb_url)
    migrate.upgrade(engine)
    kept = KeptConnection(engine)
    try:
        pending = kept.prepare(_PENDING)
        assert not kept.finds(pending, {})
        connection = kept._connection
        assert connection is not None
        session = connection.driver_connection.thread_id()  # type: ignore[union-attr]
        with engine.begin() as admin:
            admin.execute(text(f"KILL CONNECTION {int(session)}"))
        with pytest.raises(DBAPIError) as failed:
            kept.finds(pending, {})
        assert is_transient(failed.value)
        JobStore(engine).create_job(b"x")
        assert kept.finds(pending, {})
        assert kept._connection is not connection
    finally:
        kept.close()
        engine.dispose()


def test_close_closes_the_kept_connection(store: JobStore) -> None:
    """After ``close`` the kept connection is gone (MariaDB: from the server's process list too);
    a later statement opens another."""
    kept = KeptConnection(store.engine)
    pending = kept.prepare(_PENDING)
    sessions_before = _sessions(store.engine)
    assert not kept.finds(pending, {})
    assert _sessions(store.engine) == sessions_before + (1 if is_mysql(store.engine) else 0)
    kept.close()
    assert kept._connection is None
    wait_until(
        lambda: _sessions(store.engine) == sessions_before, 10, what="the kept session closed"
    )
    assert not kept.finds(pending, {})
    kept.close()


def _sessions(engine: Engine) -> int:
    """The server's sessions on this database (0 on SQLite)."""
    if not is_mysql(engine):
        return 0
    with engine.connect() as connection:
        return int(
            connection.execute(
                text(
                    "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE DB = DATABASE() "
                    "AND ID <> CONNECTION_ID()"
                )
            ).scalar_one()
        )


def test_a_heartbeat_is_one_request_and_a_deleted_row_is_taken_again(store: JobStore) -> None:
    """``Presence.beat`` renews its row with one UPDATE on its kept connection (MariaDB: nothing
    else sent); when its row is gone (an operator deleted it) the beat's transaction takes it
    again."""
    presence = Presence(store.engine, COORDINATOR, "beating").register()
    try:
        assert presence.beat()  # opens the heartbeat's kept connection
        requests = _requests_of(presence._beats) if is_mysql(store.engine) else []
        assert presence.beat()
        if is_mysql(store.engine):
            assert [request.split()[0].upper() for request in requests] == [b"UPDATE"]
        with store.engine.begin() as connection:
            connection.execute(delete(_instances).where(_instances.c.name == "beating"))
        assert presence.beat()
        with store.engine.connect() as connection:
            token = connection.execute(
                select(_instances.c.token).where(_instances.c.name == "beating")
            ).scalar_one()
        assert token == presence.token
    finally:
        presence.close()
