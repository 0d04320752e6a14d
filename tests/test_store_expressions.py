"""The state guards every job's statements carry are written into the SQL, not expanded per call.

SQLAlchemy renders ``column.in_([...])`` of Python values as an expanding parameter and rewrites
the statement's text on every execution; ``in_constants`` writes a fixed list of integers as
literals, so the compiled statement runs as it is. Its behaviour against the rows (which states
a guard selects) is what the store's tests check on SQLite and MariaDB.
"""

from __future__ import annotations

import pytest
from sqlalchemy import Dialect, column
from sqlalchemy.dialects import mysql, sqlite

from coordinator.lifecycle import EDGES
from coordinator.store import jobs, leases, stored_archives
from coordinator.store.expressions import in_constants
from coordinator.store.guarded import _guarded_update

DIALECTS = [mysql.dialect(), sqlite.dialect()]


@pytest.mark.parametrize("dialect", DIALECTS, ids=["mysql", "sqlite"])
def test_no_state_guard_is_expanded_per_execution(dialect: Dialect) -> None:
    statements = [
        _guarded_update(edge, fenced, unless)
        for edge in EDGES
        for fenced in (False, True)
        for unless in (False, True)
    ]
    statements += [jobs._IN_FLIGHT_LOCKED, leases._in_flight_candidates(False)]
    statements.append(stored_archives._INSERT_STORING_ATTRIBUTED)
    for statement in statements:
        compiled = str(statement.compile(dialect=dialect))
        assert "POSTCOMPILE" not in compiled, compiled


def test_the_integers_are_written_as_they_are() -> None:
    sql = str(in_constants(column("status"), [1, 5]).compile(dialect=sqlite.dialect()))
    assert sql == "status IN (1, 5)"


def test_anything_but_an_integer_is_refused() -> None:
    with pytest.raises(ValueError):
        in_constants(column("status"), ["1) OR (1=1"])  # type: ignore[list-item]
