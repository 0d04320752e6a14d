"""No job waits forever: an error that repeats ends the job after bounded attempts; outages do not.

Before attempts were bounded, a dataset table that could not be created (or any unexpected error
of one job) kept the job Pending and retried it every second for ever, and ``run --until-idle``
never returned.
"""

from __future__ import annotations

import dataclasses
import sqlite3
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError, SQLAlchemyError

from coordinator.config.loader import CoordinatorConfig, load_config
from coordinator.config.locations import DATA_DIR_ENV, DATABASE_URL_ENV
from coordinator.lifecycle import JobStatus
from coordinator.runtime import archive_output_of, open_runtime
from coordinator.service.coordinator import Coordinator
from coordinator.service.ingest import submit_job
from coordinator.service.submitter import Registered, Submitter
from coordinator.store.database import create_database_engine, is_transient
from coordinator.store.guarded import TransitionRequest
from coordinator.store.jobs import JobStore, job_state
from tests.service_support import (
    SpiderProxy,
    coordinator_with,
    engine_jobs,
    job_row,
    put_logs,
    run_until_idle,
    triggers,
)


class _FakeClock:
    """A monotonic clock the test moves, so back-off costs no wall time."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self) -> None:
        self.now += 120.0


class _BrokenRegistration(SpiderProxy):
    def register_job(
        self, resource_group_id: int, compressed_task_graph: bytes, compressed_inputs: bytes
    ) -> int:
        raise RuntimeError("the adapter is broken")


def test_an_error_on_every_attempt_ends_the_job_failed(
    config: CoordinatorConfig, tmp_path: Path
) -> None:
    put_logs(config, tmp_path, ["svc0"])
    clock = _FakeClock()
    with open_runtime(config, lease_secs=5) as rt:
        job_id = submit_job(config, rt.engine, timestamp_key="timestamp")
        coordinator = Coordinator(
            engine=rt.engine,
            spider=_BrokenRegistration(rt.spider),
            settings=rt.config.compression_coordinator,
            archive_output=archive_output_of(rt.config),
            instance_id="attempts",
            max_attempts=3,
            clock=clock,
        )
        run_until_idle(coordinator, after_tick=clock.advance)
        row = job_row(rt, job_id)
        assert job_state(row) is JobStatus.FAILED
        assert row.status_msg == (
            "Compression job failed after 3 attempt(s): "
            "unexpected error: RuntimeError: the adapter is broken"
        )
        assert triggers(rt, job_id) == ["rejected"]


def test_a_dataset_table_that_cannot_be_created_fails_the_job_after_bounded_attempts(
    mariadb_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user without the CREATE privilege: the error repeats, so the job ends Failed saying so."""
    monkeypatch.setenv(DATABASE_URL_ENV, mariadb_url)
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    config = dataclasses.replace(load_config(None, data_dir=tmp_path / "var"), embedded_workers=1)
    put_logs(config, tmp_path, ["svc0"])
    url = make_url(mariadb_url)
    user = f"limited_{uuid.uuid4().hex[:8]}"
    admin = create_engine(mariadb_url)
    clock = _FakeClock()
    try:
        with open_runtime(config, lease_secs=5) as rt:
            job_id = submit_job(config, rt.engine, dataset="nocreate", timestamp_key="timestamp")
            with admin.begin() as connection:
                connection.execute(text(f"CREATE USER '{user}'@'127.0.0.1' IDENTIFIED BY 'pw'"))
                connection.execute(
                    text(
                        f"GRANT SELECT, INSERT, UPDATE, DELETE ON `{url.database}`.* "
                        f"TO '{user}'@'127.0.0.1'"
                    )
                )
            limited = create_database_engine(
                url.set(username=user, password="pw").render_as_string(hide_password=False)
            )
            try:
                coordinator = Coordinator(
                    engine=limited,
                    spider=rt.spider,
                    settings=rt.config.compression_coordinator,
                    archive_output=archive_output_of(rt.config),
                    instance_id="limited",
                    max_attempts=2,
                    clock=clock,
                )
                run_until_idle(coordinator, after_tick=clock.advance)
            finally:
                limited.dispose()
            row = job_row(rt, job_id)
            assert job_state(row) is JobStatus.FAILED
            assert row.status_msg.startswith(
                "Compression job failed after 2 attempt(s): "
                "cannot create the tables of dataset nocreate: "
            )
            assert "CREATE command denied" in row.status_msg
    finally:
        with admin.begin() as connection:
            connection.execute(text(f"DROP USER IF EXISTS '{user}'@'127.0.0.1'"))
        admin.dispose()


def test_outages_are_transient_and_lasting_faults_are_not(mariadb_url: str) -> None:
    """Errors raised by a real server and a real refused connection, classified."""
    url = make_url(mariadb_url)
    unreachable = create_database_engine(
        url.set(host="127.0.0.1", port=1).render_as_string(hide_password=False)
    )
    engine = create_database_engine(mariadb_url)
    try:
        with pytest.raises(SQLAlchemyError) as refused:
            unreachable.connect()
        assert is_transient(refused.value)
        with pytest.raises(SQLAlchemyError) as missing, engine.connect() as connection:
            connection.execute(text("SELECT * FROM no_such_table"))
        assert not is_transient(missing.value)
    finally:
        unreachable.dispose()
        engine.dispose()


def test_a_busy_sqlite_file_is_an_outage(tmp_path: Path) -> None:
    path = tmp_path / "busy.db"
    holder = create_engine(f"sqlite:///{path}")
    waiter = create_engine(f"sqlite:///{path}", connect_args={"timeout": 0.05})
    try:
        with holder.connect() as connection:
            connection.exec_driver_sql("CREATE TABLE t (x INTEGER)")
            connection.commit()
            connection.exec_driver_sql("BEGIN EXCLUSIVE")
            with pytest.raises(SQLAlchemyError) as busy, waiter.connect() as other:
                other.exec_driver_sql("SELECT * FROM t")
            connection.rollback()
        assert is_transient(busy.value)
        with pytest.raises(SQLAlchemyError) as missing, waiter.connect() as other:
            other.exec_driver_sql("SELECT * FROM missing")
        assert not is_transient(missing.value)
    finally:
        holder.dispose()
        waiter.dispose()


def test_a_failure_of_the_recording_together_counts_only_against_its_own_job(
    config: CoordinatorConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ``submitted`` moves of one tick share a transaction; when it fails for a reason that is
    not an outage (here a request the lifecycle refuses, for one job only), nothing of it is
    kept and each job is recorded alone: the others run, the faulty one backs off and fails."""
    put_logs(config, tmp_path, ["svc0"])
    clock = _FakeClock()
    with open_runtime(config, lease_secs=5) as rt:
        good, bad, other = (
            submit_job(config, rt.engine, timestamp_key="timestamp") for _ in range(3)
        )
        real = Submitter._submitted

        def submitted(self: Submitter, item: Registered) -> TransitionRequest:
            request = real(self, item)
            return dataclasses.replace(request, num_tasks=0) if item.job.job_id == bad else request

        monkeypatch.setattr(Submitter, "_submitted", submitted)
        coordinator = coordinator_with(rt, instance_id="attempts", clock=clock)
        run_until_idle(coordinator, after_tick=clock.advance)
        assert [job_state(job_row(rt, job_id)) for job_id in (good, bad, other)] == [
            JobStatus.SUCCEEDED,
            JobStatus.FAILED,
            JobStatus.SUCCEEDED,
        ]
        assert "needs a task count" in (job_row(rt, bad).status_msg or "")


def test_an_outage_while_recording_the_submission_leaves_the_job_to_be_recorded_again(
    config: CoordinatorConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The move that records the Spider job meets an outage: nothing is recorded, the tick fails,
    and the next one records the same registration (never registering the job twice). Before,
    the driven job kept the Spider id of the failed record, and the next tick ended the job Failed
    as one that "already records" it."""
    put_logs(config, tmp_path, ["svc0"])
    with open_runtime(config, lease_secs=5) as rt:
        job_id = submit_job(config, rt.engine, timestamp_key="timestamp")
        registered_before = engine_jobs(rt.engine)
        real = JobStore.transition_all
        outages = [OperationalError("UPDATE", None, sqlite3.OperationalError("database is locked"))]

        def transition_all(self: JobStore, requests: Sequence[TransitionRequest]) -> Any:
            if outages:
                raise outages.pop()
            return real(self, requests)

        monkeypatch.setattr(JobStore, "transition_all", transition_all)
        coordinator = coordinator_with(rt, instance_id="attempts")
        with pytest.raises(OperationalError):
            coordinator.tick()
        run_until_idle(coordinator)
        assert job_state(job_row(rt, job_id)) is JobStatus.SUCCEEDED
        assert triggers(rt, job_id) == ["submitted", "committed", "finalised"]
        assert engine_jobs(rt.engine) == registered_before + 1  # registered once
