"""The embedded engine through a real database outage (issue 10).

A throw-away MariaDB server (``.ci/mariadb.sh``) is SIGKILLed while 20 jobs run, and started again
10 s later. Before: the execution-manager threads died of the failed state write ("Exception in
thread spider-em-0") and the jobs stayed Running until the process restarted. Now the writes wait
the outage out, memory changes only once they succeed, and every job finishes, its commit once.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import text

from coordinator.config.locations import PROJECT_ROOT
from coordinator.spider.port import JobState, start_if_ready
from coordinator.store import migrate
from coordinator.store.database import create_database_engine
from tests.engine_support import graph, journal, running_engine, submit, task
from tests.processes import is_running

pytestmark = pytest.mark.slow


@dataclass
class Server:
    """A private MariaDB server that the test may kill and start again."""

    run_dir: Path
    url: str

    @property
    def pid(self) -> int:
        return int((self.run_dir / "mariadb.pid").read_text().strip())

    def kill(self) -> None:
        os.kill(self.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while is_running(self.pid) and time.monotonic() < deadline:
            time.sleep(0.05)

    def start(self) -> None:
        mariadbd = shutil.which("mariadbd") or "/usr/sbin/mariadbd"
        subprocess.Popen(
            [mariadbd, f"--defaults-file={self.run_dir / 'my.cnf'}"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + 60
        while not self._answers():
            assert time.monotonic() < deadline, "MariaDB did not come back"
            time.sleep(0.1)

    def _answers(self) -> bool:
        ping = subprocess.run(
            ["mariadb-admin", f"--socket={self.run_dir / 'mariadb.sock'}", "-uroot", "ping"],
            check=False,
            capture_output=True,
        )
        return ping.returncode == 0


@pytest.fixture
def server() -> Iterator[Server]:
    if shutil.which("mariadb-install-db") is None:
        pytest.skip("no MariaDB server binaries")
    script = (
        "source .ci/mariadb.sh && mariadb_start >&2 && "
        'echo "$MARIADB_RUN_DIR $COORDINATOR_TEST_MARIADB_URL"'
    )
    started = subprocess.run(
        ["bash", "-c", script], cwd=PROJECT_ROOT, check=True, capture_output=True, text=True
    )
    run_dir, url = started.stdout.split()
    server = Server(Path(run_dir), url)
    try:
        admin = create_database_engine(url)
        with admin.begin() as connection:
            connection.execute(text("CREATE DATABASE outage"))
        admin.dispose()
        server.url = url.rstrip("/") + "/outage"
        yield server
    finally:
        if (server.run_dir / "mariadb.pid").exists() and is_running(server.pid):
            server.kill()
        shutil.rmtree(server.run_dir, ignore_errors=True)


def test_the_engine_survives_a_database_outage(
    server: Server,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    engine = create_database_engine(server.url)
    migrate.upgrade(engine)
    work = tmp_path / "work"
    caplog.set_level(logging.INFO)
    with running_engine(
        engine, work, workers=4, sweep_interval_secs=0.2, stale_after_secs=2.0
    ) as spider:
        group = spider.resource_group_by_name("rg", b"pw")
        jobs = [
            submit(spider, group, graph(task("sleep")), [f"{0.5 + (index % 5) * 0.5}".encode()])
            for index in range(20)
        ]
        for job_id in jobs:
            assert start_if_ready(spider, job_id) is JobState.RUNNING
        time.sleep(1.5)
        server.kill()
        outage_started = time.monotonic()
        time.sleep(10)
        assert all(manager.is_alive() for manager in spider._managers)
        server.start()
        deadline = time.monotonic() + 90
        states: dict[int, JobState] = {}
        while time.monotonic() < deadline:
            try:
                states = {job_id: spider.get_job_state(job_id) for job_id in jobs}
            except Exception:  # the pool reconnects on the next call
                time.sleep(0.2)
                continue
            if all(state is JobState.SUCCEEDED for state in states.values()):
                break
            time.sleep(0.2)
        recovered_after = time.monotonic() - outage_started
        assert states == {job_id: JobState.SUCCEEDED for job_id in jobs}
        assert all(manager.is_alive() for manager in spider._managers)
        with engine.connect() as connection:
            stored = connection.execute(
                text("SELECT state, COUNT(*) FROM spider_engine_jobs GROUP BY state")
            ).all()
        assert [tuple(row) for row in stored] == [("Succeeded", 20)]
    for job_id in jobs:
        events = [e["event"] for e in journal(work, job_id)]
        assert events.count("commit") == 1, (job_id, events)
    captured = capfd.readouterr()
    assert "Exception in thread" not in captured.err
    unavailable = [r for r in caplog.records if "database unavailable" in r.getMessage()]
    assert 1 <= len(unavailable) <= 10  # logged once per outage and thread, not per attempt
    assert any("available again" in r.getMessage() for r in caplog.records)
    print(f"all 20 jobs succeeded {recovered_after:.1f} s after the outage began")
    engine.dispose()
