"""A MariaDB deadlock is run again at once, and a submission's record never registers twice.

Found by CI: two coordinators sharing one MariaDB, each recording the ``submitted`` moves of a
tick together, met in a deadlock. It was taken for an outage: the tick failed, the loop paused, and
the registered Spider jobs were abandoned and registered anew (204 Spider jobs for 200 jobs,
``test_two_coordinators_on_mariadb_never_double_submit``). Now the victim transaction runs again
(``retrying_deadlocks``), and a registration whose record fails is recorded on the next attempt.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pymysql
import pytest
from sqlalchemy import Connection, text
from sqlalchemy.exc import OperationalError

from coordinator.config.loader import CoordinatorConfig
from coordinator.lifecycle import JobStatus
from coordinator.runtime import Runtime, open_runtime
from coordinator.service import driven
from coordinator.service.ingest import submit_job
from coordinator.store.database import (
    DEADLOCK_ATTEMPTS,
    create_database_engine,
    is_deadlock,
    is_transient,
    retrying_deadlocks,
)
from coordinator.store.guarded import TransitionRequest, TransitionResult
from coordinator.store.jobs import JobStore, job_state
from tests.service_support import (
    CountingRegistrations,
    coordinator_with,
    job_row,
    put_logs,
    run_until_idle,
    triggers,
)


def _deadlock() -> OperationalError:
    """MariaDB's deadlock as SQLAlchemy raises it (the driver's error wrapped)."""
    return OperationalError(
        "UPDATE compression_jobs",
        None,
        pymysql.err.OperationalError(
            1213, "Deadlock found when trying to get lock; try restarting transaction"
        ),
    )


def _fail_apply(monkeypatch: pytest.MonkeyPatch, errors: list[OperationalError]) -> None:
    """Each guarded move, or moves applied together, raise the next of ``errors`` (in their
    transaction) until none is left."""
    real, real_together = JobStore.apply, JobStore.apply_together

    def apply(self: JobStore, connection: Connection, request: TransitionRequest) -> Any:
        if errors:
            raise errors.pop()
        return real(self, connection, request)

    def apply_together(
        self: JobStore, connection: Connection, requests: Sequence[TransitionRequest]
    ) -> Any:
        if errors:
            raise errors.pop()
        return real_together(self, connection, requests)

    monkeypatch.setattr(JobStore, "apply", apply)
    monkeypatch.setattr(JobStore, "apply_together", apply_together)


def test_a_deadlock_is_told_apart_from_other_outages() -> None:
    lost = OperationalError(
        "SELECT 1", None, pymysql.err.OperationalError(2013, "Lost connection to server")
    )
    assert is_deadlock(_deadlock()) and is_transient(_deadlock())
    assert not is_deadlock(lost) and is_transient(lost)


def test_a_transaction_is_run_again_after_a_deadlock_and_at_most_so_often() -> None:
    calls: list[int] = []

    def deadlocked_twice() -> str:
        calls.append(1)
        if len(calls) <= 2:
            raise _deadlock()
        return "committed"

    assert retrying_deadlocks(deadlocked_twice) == "committed" and len(calls) == 3
    calls.clear()

    def always_deadlocked() -> str:
        calls.append(1)
        raise _deadlock()

    with pytest.raises(OperationalError):
        retrying_deadlocks(always_deadlocked)
    assert len(calls) == DEADLOCK_ATTEMPTS

    calls.clear()

    def lost_connection() -> str:
        calls.append(1)
        raise OperationalError("SELECT 1", None, pymysql.err.OperationalError(2013, "Lost"))

    with pytest.raises(OperationalError):
        retrying_deadlocks(lost_connection)
    assert len(calls) == 1  # an outage is not run again here: the loop waits it out


def test_a_real_deadlock_on_mariadb_is_run_again(mariadb_url: str) -> None:
    """Two transactions lock two rows in opposite orders; MariaDB rolls back the lighter one (the
    one that wrote fewer rows), which ``retrying_deadlocks`` runs again: it then waits for the
    other and commits."""
    engine = create_database_engine(mariadb_url)
    try:
        with engine.begin() as connection:
            connection.execute(text("CREATE TABLE probe (id INT PRIMARY KEY, v INT NOT NULL)"))
            connection.execute(
                text("INSERT INTO probe (id, v) VALUES (:id, 0)"),
                [{"id": row} for row in range(1, 61)],
            )
        holder = engine.connect()
        holder.begin()
        # The heavier transaction: it writes 59 rows, so MariaDB picks the other as the victim.
        holder.execute(text("UPDATE probe SET v = v + 1 WHERE id <> 2"))
        attempts: list[int] = []
        outcome: list[object] = []

        def light() -> int:
            attempts.append(1)
            with engine.begin() as connection:
                connection.execute(text("UPDATE probe SET v = v + 10 WHERE id = 2"))
                connection.execute(text("UPDATE probe SET v = v + 10 WHERE id = 1"))  # waits
            return len(attempts)

        def run() -> None:
            try:
                outcome.append(retrying_deadlocks(light))
            except BaseException as error:  # reported by the assertion below
                outcome.append(error)

        thread = threading.Thread(target=run)
        thread.start()
        deadline = time.monotonic() + 10
        with engine.connect() as watcher:
            while not watcher.execute(
                text(
                    "SELECT COUNT(*) FROM information_schema.PROCESSLIST "
                    "WHERE INFO LIKE 'UPDATE probe SET v = v + 10 WHERE id = 1%'"
                )
            ).scalar_one():
                assert time.monotonic() < deadline, "the light transaction never waited"
                time.sleep(0.02)
        holder.execute(text("UPDATE probe SET v = v + 1 WHERE id = 2"))  # the deadlock
        holder.commit()
        holder.close()
        thread.join(timeout=30)
        assert outcome == [2], outcome  # rolled back once, then committed
        with engine.connect() as connection:
            values = dict(connection.execute(text("SELECT id, v FROM probe WHERE id <= 2")).all())
        assert values == {1: 11, 2: 11}
    finally:
        engine.dispose()


def test_a_deadlock_while_recording_submissions_is_run_again_within_the_tick(
    config: CoordinatorConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    put_logs(config, tmp_path, ["svc0"])
    with open_runtime(config, lease_secs=5) as rt:
        job_ids = [submit_job(config, rt.engine, timestamp_key="timestamp") for _ in range(3)]
        spider = CountingRegistrations(rt.spider)
        coordinator = coordinator_with(rt, spider=spider, instance_id="deadlocks")
        _fail_apply(monkeypatch, [_deadlock()])
        coordinator.tick()  # before, the deadlock failed the tick as an outage
        assert [job_state(job_row(rt, job_id)) for job_id in job_ids] == [JobStatus.RUNNING] * 3
        run_until_idle(coordinator)
        assert [job_state(job_row(rt, job_id)) for job_id in job_ids] == [JobStatus.SUCCEEDED] * 3
        assert len(spider.registered) == 3
        assert sorted(job_row(rt, job_id).spider_id for job_id in job_ids) == sorted(
            spider.registered
        )


def test_a_deadlock_while_finalising_is_run_again_within_the_tick(
    config: CoordinatorConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    put_logs(config, tmp_path, ["svc0"])
    with open_runtime(config, lease_secs=5) as rt:
        job_id = submit_job(config, rt.engine, timestamp_key="timestamp")
        coordinator = coordinator_with(rt, instance_id="deadlocks")
        coordinator.tick()
        assert job_state(job_row(rt, job_id)) is JobStatus.RUNNING
        real = driven.read_publications
        deadlocks = [_deadlock()]

        def read_publications(*args: Any, **kwargs: Any) -> Any:
            if deadlocks:
                raise deadlocks.pop()
            return real(*args, **kwargs)

        monkeypatch.setattr(driven, "read_publications", read_publications)
        run_until_idle(coordinator)  # a tick that failed would raise here
        assert deadlocks == []  # the finalising transaction met it
        assert job_state(job_row(rt, job_id)) is JobStatus.SUCCEEDED
        assert triggers(rt, job_id) == ["submitted", "committed", "finalised"]


def test_a_record_that_keeps_failing_keeps_its_registration_for_the_next_attempt(
    config: CoordinatorConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More deadlocks in a row than are run again: the tick fails as an outage, and the next one
    records the same Spider job instead of registering another."""
    put_logs(config, tmp_path, ["svc0"])
    with open_runtime(config, lease_secs=5) as rt:
        job_id = submit_job(config, rt.engine, timestamp_key="timestamp")
        spider = CountingRegistrations(rt.spider)
        coordinator = coordinator_with(rt, spider=spider, instance_id="deadlocks")
        _fail_apply(monkeypatch, [_deadlock() for _ in range(DEADLOCK_ATTEMPTS)])
        with pytest.raises(OperationalError):
            coordinator.tick()
        assert job_state(job_row(rt, job_id)) is JobStatus.PENDING
        run_until_idle(coordinator)
        _succeeded_registered_once(rt, job_id, spider)
        assert job_row(rt, job_id).spider_id == spider.registered[0]


def test_a_record_whose_commit_failed_after_all_happening_starts_its_spider_job(
    config: CoordinatorConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The record commits, and the connection is lost before the answer (an ambiguous commit):
    the next record finds the row Running with this Spider job, and starts it. Before, the job
    was registered again, that registration's record lost its race, and the job was dropped with
    its recorded Spider job never started."""
    put_logs(config, tmp_path, ["svc0"])
    with open_runtime(config, lease_secs=5) as rt:
        job_id = submit_job(config, rt.engine, timestamp_key="timestamp")
        spider = CountingRegistrations(rt.spider)
        coordinator = coordinator_with(rt, spider=spider, instance_id="ambiguous")
        real = JobStore.transition_all
        lost = [OperationalError("COMMIT", None, pymysql.err.OperationalError(2013, "Lost"))]

        def transition_all(
            self: JobStore, requests: Sequence[TransitionRequest]
        ) -> list[TransitionResult]:
            results = real(self, requests)
            if lost:
                raise lost.pop()
            return results

        monkeypatch.setattr(JobStore, "transition_all", transition_all)
        with pytest.raises(OperationalError):
            coordinator.tick()
        assert job_state(job_row(rt, job_id)) is JobStatus.RUNNING
        run_until_idle(coordinator)
        _succeeded_registered_once(rt, job_id, spider)


def _succeeded_registered_once(rt: Runtime, job_id: int, spider: CountingRegistrations) -> None:
    """The job ended Succeeded through its three moves, its Spider job registered once."""
    assert job_state(job_row(rt, job_id)) is JobStatus.SUCCEEDED
    assert len(spider.registered) == 1
    assert triggers(rt, job_id) == ["submitted", "committed", "finalised"]
