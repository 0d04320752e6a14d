"""The service as a process: killed at each step, SIGKILL, SIGTERM, JSON logs; and two coordinators
sharing MariaDB over 200 jobs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, select, text

from coordinator.config.loader import load_config
from coordinator.engine.embedded.engine import EmbeddedSpider
from coordinator.lifecycle import JobStatus
from coordinator.runtime import archive_output_of, open_engine, worker_settings
from coordinator.service.coordinator import Coordinator
from coordinator.service.crashpoints import CRASH_ENV, CRASH_EXIT_STATUS, POINTS
from coordinator.service.ingest import put_files, submit_job
from coordinator.store.database import create_database_engine
from coordinator.store.jobs import JobStore
from coordinator.store.schema import engine_jobs, job_transitions
from tests.sample_logs import write_json_logs

pytestmark = pytest.mark.slow  # real coordinator processes, killed and restarted


def _environment(database_url: str, **extra: str) -> dict[str, str]:
    environment = {k: v for k, v in os.environ.items() if k not in (CRASH_ENV,)}
    environment.pop("COORDINATOR_DATABASE_URL", None)
    if not database_url.startswith("sqlite"):
        environment["COORDINATOR_DATABASE_URL"] = database_url
    environment.update(extra)
    return environment


def _coordinator(
    data_dir: Path, database_url: str, *args: str, **env: str
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "coordinator", "run", "--data-dir", str(data_dir), *args],
        env=_environment(database_url, **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _prepare_jobs(
    data_dir: Path, database_url: str, monkeypatch: pytest.MonkeyPatch, count: int
) -> tuple[Engine, list[int]]:
    if not database_url.startswith("sqlite"):
        monkeypatch.setenv("COORDINATOR_DATABASE_URL", database_url)
    config = load_config(None, data_dir=data_dir)
    engine = open_engine(config)
    jobs = []
    for index in range(count):
        path = data_dir.parent / "in" / f"app-{index}.jsonl"
        write_json_logs(path, 3000, service=f"svc{index}")
        put_files(config, [path], bucket="logs", prefix=f"job{index}/")
        jobs.append(submit_job(config, engine, prefix=f"job{index}/", timestamp_key="timestamp"))
    return engine, jobs


def _assert_all_succeeded_once(engine: Engine, jobs: list[int]) -> None:
    store = JobStore(engine)
    for job_id in jobs:
        row = store.get(job_id)
        assert row is not None and row.status == JobStatus.SUCCEEDED, (
            job_id,
            row and row.status_msg,
        )
        triggers = [entry.trigger for entry in store.history(job_id)]
        assert triggers == ["submitted", "committed", "finalised"], (job_id, triggers)
        with engine.connect() as connection:
            published = connection.execute(
                text("SELECT COUNT(*) FROM clp_default_archives WHERE creator_id = :c"),
                {"c": str(row.spider_id)},
            ).scalar_one()
        assert published >= 1


def _resume_until_idle(data_dir: Path, database_url: str, engine: Engine, jobs: list[int]) -> None:
    """Start the coordinator again until nothing is left; every job must have ended well, once."""
    resumed = _coordinator(data_dir, database_url, "--until-idle")
    _, errors = resumed.communicate(timeout=180)
    assert resumed.returncode == 0, errors
    _assert_all_succeeded_once(engine, jobs)
    engine.dispose()


def _wait_until_one_leaves_pending(engine: Engine, jobs: list[int], timeout: float = 60) -> None:
    store = JobStore(engine)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(store.get(j).status != JobStatus.PENDING for j in jobs):  # type: ignore[union-attr]
            return
        time.sleep(0.02)
    raise AssertionError(f"no job left Pending within {timeout} s")


@pytest.mark.parametrize("point", POINTS)
def test_killed_at_each_step_the_job_still_ends_correctly(
    tmp_path: Path, database_url: str, monkeypatch: pytest.MonkeyPatch, point: str
) -> None:
    data_dir = tmp_path / "var"
    engine, jobs = _prepare_jobs(data_dir, database_url, monkeypatch, 1)
    crashed = _coordinator(data_dir, database_url, "--until-idle", **{CRASH_ENV: point})
    _, errors = crashed.communicate(timeout=120)
    assert crashed.returncode == CRASH_EXIT_STATUS, errors

    _resume_until_idle(data_dir, database_url, engine, jobs)


def test_sigkill_mid_run_then_restart(
    tmp_path: Path, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    data_dir = tmp_path / "var"
    engine, jobs = _prepare_jobs(data_dir, database_url, monkeypatch, 6)
    process = _coordinator(data_dir, database_url)
    _wait_until_one_leaves_pending(engine, jobs)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    _resume_until_idle(data_dir, database_url, engine, jobs)


def test_sigterm_stops_promptly_and_the_next_start_resumes(
    tmp_path: Path, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    data_dir = tmp_path / "var"
    engine, jobs = _prepare_jobs(data_dir, database_url, monkeypatch, 6)
    process = _coordinator(data_dir, database_url)
    store = JobStore(engine)
    _wait_until_one_leaves_pending(engine, jobs)
    asked = time.monotonic()
    process.send_signal(signal.SIGTERM)
    _, errors = process.communicate(timeout=60)
    took = time.monotonic() - asked
    assert process.returncode == 0, errors
    assert took < 30  # termination_timeout_secs
    assert "Received SIGTERM" in errors and "Compression coordinator stopped." in errors
    with engine.connect() as connection:
        held = connection.execute(
            text(
                "SELECT COUNT(*) FROM compression_jobs WHERE lease_expires_at > :now "
                "AND status NOT IN (2, 3, 4)"
            ),
            {"now": store.clock()},
        ).scalar_one()
    assert held == 0  # leases released on the way out
    _resume_until_idle(data_dir, database_url, engine, jobs)


def test_json_logs_name_the_job_and_the_spider_job(tmp_path: Path) -> None:
    data_dir = tmp_path / "var"
    config_file = tmp_path / "clp-config.yaml"
    config_file.write_text(
        "package: {storage_engine: clp-s}\nspider: {host: 127.0.0.1, port: 50051}\n"
        "compression_coordinator: {}\n"
        f"coordinator: {{engine: embedded, log_format: json, data_dir: {data_dir}}}\n"
    )
    url = f"sqlite:///{data_dir / 'coordinator.db'}"
    environment = _environment(url)
    common = ["--config", str(config_file)]
    subprocess.run(
        [sys.executable, "-m", "coordinator", "db", "upgrade", *common],
        env=environment,
        check=True,
        capture_output=True,
    )
    path = tmp_path / "in" / "a.jsonl"
    write_json_logs(path, 100)
    subprocess.run(
        [sys.executable, "-m", "coordinator", "submit", str(path), *common],
        env=environment,
        check=True,
        capture_output=True,
    )
    completed = subprocess.run(
        [sys.executable, "-m", "coordinator", "run", "--until-idle", *common],
        env=environment,
        capture_output=True,
        text=True,
        check=True,
    )
    lines = [json.loads(line) for line in completed.stderr.splitlines() if line.startswith("{")]
    assert lines, completed.stderr
    about_job = [line for line in lines if line.get("job_id") == 1]
    assert any(
        line["message"].startswith("submitted") and line["spider_id"] == 1 for line in about_job
    )
    assert any("finalised" in line["message"] for line in about_job)
    assert all({"ts", "level", "logger", "message"} <= set(line) for line in lines)


def test_two_coordinators_on_mariadb_never_double_submit(
    tmp_path: Path, mariadb_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """200 jobs, two coordinators racing for them over one database (and one Spider)."""
    monkeypatch.setenv("COORDINATOR_DATABASE_URL", mariadb_url)
    data_dir = tmp_path / "var"
    config = load_config(None, data_dir=data_dir)
    engine = open_engine(config)
    for index in range(200):
        target = config.object_store_directory / "logs" / f"job{index}" / "a.jsonl"
        write_json_logs(target, 20, service=f"s{index}")
        submit_job(config, engine, prefix=f"job{index}/", timestamp_key="timestamp")
    settings = config.compression_coordinator.model_copy(
        update={
            "max_concurrent_jobs": 40,
            "job_polling_interval_millisecs": 20,
            "result_polling": config.compression_coordinator.result_polling.model_copy(
                update={"init_backoff_millisecs": 20, "max_backoff_millisecs": 200}
            ),
        }
    )
    spider = EmbeddedSpider(
        create_database_engine(mariadb_url),
        worker_settings(config, mariadb_url),
        workers=2,
    ).start()
    coordinators = [
        Coordinator(
            engine=create_database_engine(mariadb_url),
            spider=spider,
            settings=settings,
            archive_output=archive_output_of(config),
            instance_id=name,
            lease_duration=timedelta(seconds=60),
        )
        for name in ("coordinator-a", "coordinator-b")
    ]
    errors: list[BaseException] = []

    def drive(coordinator: Coordinator) -> None:
        try:
            while True:
                coordinator.run(until_idle=True)
                with engine.connect() as connection:
                    left = connection.execute(
                        text("SELECT COUNT(*) FROM compression_jobs WHERE status NOT IN (2, 3, 4)")
                    ).scalar_one()
                if left == 0:
                    return
                time.sleep(0.05)
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=drive, args=(c,)) for c in coordinators]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=600)
    finally:
        spider.close()
    assert errors == []
    with engine.connect() as connection:
        statuses = Counter(
            connection.execute(text("SELECT status FROM compression_jobs")).scalars()
        )
        submitted = connection.execute(
            select(job_transitions.c.job_id, func.count())
            .where(job_transitions.c.trigger == "submitted")
            .group_by(job_transitions.c.job_id)
        ).all()
        submitters = Counter(
            connection.execute(
                select(job_transitions.c.actor_id).where(job_transitions.c.trigger == "submitted")
            ).scalars()
        )
        registered = connection.execute(select(func.count()).select_from(engine_jobs)).scalar_one()
    assert statuses == {int(JobStatus.SUCCEEDED): 200}
    assert len(submitted) == 200 and all(count == 1 for _, count in submitted)
    assert registered == 200  # no job was registered with Spider twice
    assert set(submitters) == {"coordinator-a", "coordinator-b"}  # both took part
    for coordinator in coordinators:
        coordinator.engine.dispose()
    engine.dispose()
