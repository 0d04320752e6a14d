"""A database outage is logged once, summarised with back-off, and its end reported.

Before, the service logged a traceback on every failed tick (one a second) for as long as the
database was down.
"""

from __future__ import annotations

import io
import logging
import subprocess
import sys
import threading
from pathlib import Path
from typing import cast

import pymysql
import pytest
from sqlalchemy import update
from sqlalchemy.exc import OperationalError, SQLAlchemyError

from coordinator import metrics
from coordinator.config.loader import load_config
from coordinator.lifecycle import JobStatus
from coordinator.runtime import archive_output_of
from coordinator.service.coordinator import Coordinator
from coordinator.service.driven import DrivenJob
from coordinator.service.ingest import put_files, submit_job
from coordinator.service.logs import LostPooledConnections
from coordinator.spider.port import JobState, SpiderPort
from coordinator.store import migrate
from coordinator.store.database import create_database_engine
from coordinator.store.outage import Outage
from coordinator.store.schema import compression_jobs
from tests.sample_logs import write_json_logs
from tests.timing import wait_until

LOGGER = "coordinator.service.coordinator"
TICK_FAILURES = "clp_coordinator_tick_failures_total"


def test_an_outage_is_one_line_then_summaries_at_growing_intervals(tmp_path: Path) -> None:
    engine = create_database_engine(f"sqlite:///{tmp_path}/missing/directory/c.db")
    with pytest.raises(SQLAlchemyError) as refused, engine.connect():
        pass
    now = [0.0]
    records: list[logging.LogRecord] = []
    log = logging.getLogger("test.outage")
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    log.addHandler(handler)
    try:
        outage = Outage("the database", log, clock=lambda: now[0])
        pauses = []
        for _ in range(9):
            pauses.append(outage.failed(refused.value))
            now[0] += pauses[-1]
        outage.recovered()
        outage.recovered()  # nothing more: the outage is over
    finally:
        log.removeHandler(handler)
    assert pauses == [1, 2, 4, 8, 16, 30, 30, 30, 30]
    messages = [record.getMessage() for record in records]
    assert messages == [
        "the database is unavailable (unable to open database file); retrying with back-off",
        "the database still unavailable after 1 s (2 failed attempts, next in 2 s): "
        "unable to open database file",
        "the database still unavailable after 7 s (4 failed attempts, next in 8 s): "
        "unable to open database file",
        "the database still unavailable after 91 s (8 failed attempts, next in 30 s): "
        "unable to open database file",
        "the database is available again after 151 s (9 failed attempts)",
    ]
    assert all(record.exc_info is None for record in records)
    engine.dispose()


@pytest.mark.slow
def test_the_service_logs_an_outage_without_tracebacks_and_reports_its_end(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    database = tmp_path / "later" / "coordinator.db"
    engine = create_database_engine(f"sqlite:///{database}")
    config = load_config(None, data_dir=tmp_path / "var")
    coordinator = Coordinator(
        engine=engine,
        spider=cast(SpiderPort, object()),  # never reached: every tick fails at the database
        settings=config.compression_coordinator,
        archive_output=archive_output_of(config),
        instance_id="outage",
    )
    failed_ticks = {"cause": "database"}
    before = metrics.REGISTRY.get_sample_value(TICK_FAILURES, failed_ticks) or 0.0
    thread = threading.Thread(target=coordinator.run)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        thread.start()
        try:
            wait_until(lambda: len(caplog.records) >= 2)  # the first failure, then one summary
            database.parent.mkdir()
            migrate.upgrade(engine)
            wait_until(lambda: "available again" in caplog.records[-1].getMessage())
        finally:
            coordinator.stopping.set()
            thread.join(timeout=30)
    messages = [record.getMessage() for record in caplog.records if record.name == LOGGER]
    assert messages[0] == (
        "the database is unavailable (unable to open database file); retrying with back-off"
    )
    assert messages[1].startswith("the database still unavailable after ")
    assert messages[2].startswith("the database is available again after ")
    assert len(messages) == 3
    assert all(record.exc_info is None for record in caplog.records)
    # Every failed tick is counted, though only three lines were logged.
    failed = (metrics.REGISTRY.get_sample_value(TICK_FAILURES, failed_ticks) or 0.0) - before
    assert failed >= 2
    engine.dispose()


class _FailedSpider:
    """A Spider that reports every job Failed (the only call a poll of a failed job makes)."""

    def get_job_state(self, job_id: int) -> JobState:
        return JobState.FAILED


def test_a_clean_up_that_meets_an_outage_fails_the_tick_without_a_traceback(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, a job that ended just as the database went away logged "clean-up failed; the sweep
    will retry" as an ERROR with the driver's whole traceback; now the outage fails the tick, which
    the loop logs once as the outage's start."""
    engine = create_database_engine(f"sqlite:///{tmp_path}/c.db")
    migrate.upgrade(engine)
    config = load_config(None, data_dir=tmp_path / "var")
    source = tmp_path / "in" / "app.jsonl"
    write_json_logs(source, 10)
    put_files(config, [source], bucket="logs", prefix="p/")
    job_id = submit_job(config, engine, prefix="p/")
    with engine.begin() as connection:  # ended meanwhile (Spider job 7 failed)
        connection.execute(
            update(compression_jobs)
            .where(compression_jobs.c.id == job_id)
            .values(status=int(JobStatus.FAILED), spider_id=7, lease_owner="outage", lease_epoch=1)
        )
    coordinator = Coordinator(
        engine=engine,
        spider=cast(SpiderPort, _FailedSpider()),
        settings=config.compression_coordinator,
        archive_output=archive_output_of(config),
        instance_id="outage",
    )
    coordinator.driven[job_id] = DrivenJob(
        job_id, 1, JobStatus.RUNNING, 7, "default", b"", backoff_ms=100
    )
    lost = pymysql.err.OperationalError(2013, "Lost connection to MySQL server during query")
    outage = OperationalError("DESCRIBE `clp_default_archives`", None, lost)

    def settle(*_: object) -> None:
        raise outage

    # Whichever of the clean-up's reads meets it: the ended jobs' records, or a settlement.
    monkeypatch.setattr("coordinator.service.outcomes.records_of_jobs", settle)
    monkeypatch.setattr("coordinator.service.outcomes.settle_archives", settle)
    with caplog.at_level(logging.INFO), pytest.raises(OperationalError) as raised:
        coordinator.tick()
    assert raised.value is outage
    assert job_id not in coordinator.driven  # concluded: the sweep settles its archives
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert all(record.exc_info is None for record in caplog.records)
    engine.dispose()


def _pool_record(error: BaseException) -> logging.LogRecord:
    try:
        raise error
    except BaseException:
        exc_info = sys.exc_info()
    return logging.LogRecord(
        "sqlalchemy.pool.impl.QueuePool",
        logging.ERROR,
        __file__,
        1,
        "Exception during reset or similar",
        None,
        exc_info,
    )


def test_a_pooled_connection_lost_in_an_outage_is_one_warning_line_without_traceback() -> None:
    """SQLAlchemy's pool logs an ERROR with a traceback when its rollback of a connection the
    database dropped fails; seen in CI when MariaDB stopped while a transaction was open."""
    lost = pymysql.err.OperationalError(2013, "Lost connection to MySQL server during query")
    record = _pool_record(lost)
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(LostPooledConnections())
    handler.handle(record)
    assert record.levelname == "WARNING" and record.exc_info is None
    assert stream.getvalue() == (
        "discarded a pooled database connection: "
        "(2013, 'Lost connection to MySQL server during query')\n"
    )


def test_other_pool_errors_keep_their_level_and_traceback() -> None:
    denied = pymysql.err.OperationalError(1142, "UPDATE command denied to user")
    record = _pool_record(denied)
    LostPooledConnections().filter(record)
    assert record.levelno == logging.ERROR and record.exc_info is not None
    elsewhere = _pool_record(pymysql.err.OperationalError(2013, "Lost connection"))
    elsewhere.name = "coordinator.service.coordinator"
    LostPooledConnections().filter(elsewhere)
    assert elsewhere.levelno == logging.ERROR and elsewhere.exc_info is not None


def test_an_executor_logs_a_pooled_connection_lost_in_an_outage_as_one_line() -> None:
    """Seen in CI: an executor's pool logged "Exception during reset or similar" with the
    driver's whole traceback when MariaDB stopped under a task; the service's filter now runs in
    the executors too."""
    script = (
        "import logging, pymysql\n"
        "from coordinator.engine.embedded.executor import configure_logging\n"
        "configure_logging()\n"
        "lost = pymysql.err.OperationalError(\n"
        "    2013, 'Lost connection to MySQL server during query'\n"
        ")\n"
        "try:\n"
        "    raise lost\n"
        "except Exception:\n"
        "    logging.getLogger('sqlalchemy.pool.impl.QueuePool').exception("
        "'Exception during reset or similar')\n"
    )
    finished = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    )
    assert finished.stderr.splitlines() == [
        "WARNING:sqlalchemy.pool.impl.QueuePool:discarded a pooled database connection: "
        "(2013, 'Lost connection to MySQL server during query')"
    ]
