"""The SQL a test's code sends: every statement's text, as the driver receives it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Engine, event


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
