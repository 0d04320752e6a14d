"""One rule for what a database outage is (``is_transient``), one way to live through one.

Before, the embedded engine had a rule of its own: every ``OperationalError`` was an outage. A
lasting error that is not one (a missing privilege, a read-only database file) made the write of a
task's report retry without end, holding the engine's lock, so that every other call of the
engine (``GetJobState`` included) waited with it. Now such an error is raised at once (the
execution manager logs it and carries on) and only an outage is waited out, as the service loop
and the tasks do (``coordinator.store.outage.Outage``). The tasks' wait (``wait_out_outages``) and
the back-off are checked here too.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pymysql
import pytest
from sqlalchemy import Engine, event, update
from sqlalchemy.exc import OperationalError

from coordinator.engine.embedded.engine import EmbeddedSpider
from coordinator.engine.tasks.database import wait_out_outages
from coordinator.spider.port import JobState, start_if_ready
from coordinator.store.database import is_transient
from coordinator.store.outage import Outage, backoff
from coordinator.store.schema import engine_jobs
from tests.engine_support import TEST_PACKAGES, graph, running_engine, settings, submit, task

_UPDATE = "UPDATE spider_engine_jobs SET state=%s"


def _mysql(code: int, message: str) -> OperationalError:
    return OperationalError(_UPDATE, None, pymysql.err.OperationalError(code, message))


def _sqlite(message: str) -> OperationalError:
    return OperationalError(_UPDATE, None, sqlite3.OperationalError(message))


LASTING = {
    "mysql_update_denied": _mysql(
        1142, "UPDATE command denied to user 'clp'@'localhost' for table `spider_engine_jobs`"
    ),
    "sqlite_read_only": _sqlite("attempt to write a readonly database"),
}
"""Errors that would repeat on every attempt: not an outage."""
OUTAGES = {
    "mysql_connection_lost": _mysql(2013, "Lost connection to MySQL server during query"),
    "sqlite_locked": _sqlite("database is locked"),
}


class FailingWrites:
    """Every UPDATE of ``spider_engine_jobs`` raises ``error`` (the first ``times`` of them only,
    when given) until ``disarm``: on every engine of the process, for the embedded engine writes
    its states through a sibling of ``engine`` on MariaDB (``AutocommitWrites``)."""

    def __init__(self, engine: Engine, error: Exception, times: int | None = None) -> None:
        self.engine, self.error, self.times = engine, error, times
        self.failures = 0
        event.listen(Engine, "before_cursor_execute", self._before)

    def _before(self, _connection: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if not statement.startswith("UPDATE spider_engine_jobs"):
            return
        if self.times is None or self.failures < self.times:
            self.failures += 1
            raise self.error

    def disarm(self) -> None:
        event.remove(Engine, "before_cursor_execute", self._before)


class CountedPauses(threading.Event):
    """The engine's back-off between two attempts of a write, recorded instead of slept. After
    ``limit`` pauses the engine is told to stop, so that a write retried without end ends the
    test (with the engine's ``_Stopping``) instead of hanging it."""

    def __init__(self, limit: int = 5) -> None:
        super().__init__()
        self.limit = limit
        self.pauses: list[float | None] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.pauses.append(timeout)
        return len(self.pauses) >= self.limit


def _idle_engine(engine: Engine, directory: Path) -> tuple[EmbeddedSpider, CountedPauses]:
    """An engine that is not started (no executors, no monitor), with its pauses counted."""
    spider = EmbeddedSpider(engine, settings(engine, directory), packages=TEST_PACKAGES, workers=1)
    pauses = CountedPauses()
    spider._stopping = pauses
    return spider, pauses


_RECORD = update(engine_jobs).values(error_message="recorded")


@pytest.mark.parametrize("error", LASTING.values(), ids=LASTING.keys())
def test_a_lasting_error_in_a_report_write_is_raised_not_retried(
    error: OperationalError, migrated_engine: Engine, tmp_path: Path
) -> None:
    assert not is_transient(error)
    spider, pauses = _idle_engine(migrated_engine, tmp_path)
    failing = FailingWrites(migrated_engine, error)
    try:
        with pytest.raises(OperationalError) as raised:
            spider._write(_RECORD, retry=True, doing="recording job 1 Succeeded")
    finally:
        failing.disarm()
    assert raised.value is error
    assert pauses.pauses == []  # not one retry
    assert failing.failures == 1


@pytest.mark.parametrize("error", OUTAGES.values(), ids=OUTAGES.keys())
def test_an_outage_in_a_report_write_is_waited_out_and_logged_once(
    error: OperationalError,
    migrated_engine: Engine,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert is_transient(error)
    spider, pauses = _idle_engine(migrated_engine, tmp_path)
    failing = FailingWrites(migrated_engine, error, times=3)
    try:
        with caplog.at_level(logging.WARNING, logger="coordinator.engine.embedded.engine"):
            assert spider._write(_RECORD, retry=True, doing="recording job 1 Succeeded") == 0
    finally:
        failing.disarm()
    assert pauses.pauses == [0.1, 0.2, 0.4]
    messages = [record.getMessage() for record in caplog.records]
    assert len(messages) == 2, messages
    assert messages[0].startswith(
        "embedded engine: database unavailable while recording job 1 Succeeded ("
    )
    assert messages[0].endswith(
        "); retrying with back-off up to 5 s, nothing changes until it is back"
    )
    assert messages[1].startswith("embedded engine: database available again after ")
    assert messages[1].endswith(" s (3 failed attempts)")


def test_a_lasting_error_in_a_report_does_not_stall_the_engine(
    migrated_engine: Engine, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The report of a finished task meets a lasting error: the engine still answers."""
    caplog.set_level(logging.WARNING)
    with running_engine(migrated_engine, tmp_path / "work", workers=1) as spider:
        group = spider.resource_group_by_name("rg", b"pw")
        job_id = submit(spider, group, graph(task("sleep"), commit=False), [b"0.5"])
        assert start_if_ready(spider, job_id) is JobState.RUNNING
        failing = FailingWrites(migrated_engine, LASTING["sqlite_read_only"])
        answers: list[JobState] = []
        asking = threading.Thread(target=lambda: answers.append(spider.get_job_state(job_id)))
        try:
            deadline = time.monotonic() + 60
            while failing.failures == 0:  # the task ends and its report is written
                assert time.monotonic() < deadline, "the task's report never came"
                time.sleep(0.02)
            asking.start()
            asking.join(timeout=10)
            assert answers == [JobState.RUNNING], "GetJobState waited for the report's retries"
        finally:
            failing.disarm()  # (before, the retried write then succeeds and the engine closes)
            if asking.is_alive():
                asking.join()
    assert failing.failures == 1
    assert not any("database unavailable" in record.getMessage() for record in caplog.records)
    assert any(
        "unexpected error" in record.getMessage() and record.exc_info is not None
        for record in caplog.records
    )


def test_a_task_waits_out_an_outage_with_one_line_at_its_start_and_one_at_its_end(
    caplog: pytest.LogCaptureFixture,
) -> None:
    failures = [OUTAGES["mysql_connection_lost"]] * 6
    pauses: list[float] = []

    def look_up() -> str:
        if failures:
            raise failures.pop()
        return "found"

    with caplog.at_level(logging.WARNING, logger="coordinator.engine.tasks.database"):
        found = wait_out_outages(
            look_up, doing="task 7/0#1 looking up its job", sleep=pauses.append
        )
    assert found == "found"
    assert pauses == [0.5, 1, 2, 4, 5, 5]
    messages = [record.getMessage() for record in caplog.records]
    assert len(messages) == 2, messages
    assert messages[0] == (
        "task 7/0#1 looking up its job: the database is unavailable (Lost connection to MySQL "
        "server during query (error 2013)); waiting for it"
    )
    assert messages[1].startswith("task 7/0#1 looking up its job: the database is available again")
    assert messages[1].endswith(" s (6 failed attempts)")


def test_a_task_raises_a_lasting_error_at_once() -> None:
    pauses: list[float] = []

    def denied() -> None:
        raise LASTING["mysql_update_denied"]

    with pytest.raises(OperationalError):
        wait_out_outages(denied, doing="task 7/0#1 recording its archives", sleep=pauses.append)
    assert pauses == []


def test_a_long_outage_keeps_its_longest_pause() -> None:
    """Before, the service loop's pause was ``first * 2.0 ** (failures - 1)``: at the 1,026th
    failure in a row (about 8.5 hours into an outage, at 30 s a pause) it overflowed, and the
    ``OverflowError`` ended the loop."""
    outage = Outage("the database", logging.getLogger("test.outage"), clock=lambda: 0.0)
    pauses = [outage.failed(OUTAGES["mysql_connection_lost"]) for _ in range(2000)]
    assert pauses[:6] == [1, 2, 4, 8, 16, 30]
    assert set(pauses[5:]) == {30}
    assert backoff(10**9, 0.1, 5.0) == 5.0
