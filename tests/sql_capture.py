"""The SQL a test's code sends: every statement's text, as the driver receives it; and what the
MariaDB server counted of a session's requests."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection, Engine, event, text


@contextmanager
def statements_sent(engine: Engine) -> Iterator[list[str]]:
    """The text of each statement ``engine`` runs while the block runs, in order."""
    statements: list[str] = []

    def record(_connection: Any, _cursor: Any, statement: str, *_: Any) -> None:
        statements.append(statement)

    event.listen(engine, "before_cursor_execute", record)
    try:
        yield statements
    finally:
        event.remove(engine, "before_cursor_execute", record)


def one_line(statement: str) -> str:
    """``statement`` in lower case on one line (whitespace runs made one space)."""
    return " ".join(statement.split()).lower()


def session_counter(connection: Connection, name: str) -> int:
    """MariaDB's own count ``name`` (``Com_commit``, ``Com_rollback``...) for the session of
    ``connection``: what the server received on it, whatever the client believes it sent."""
    row = connection.execute(text("SHOW SESSION STATUS LIKE :name"), {"name": name}).one()
    return int(row[1])
