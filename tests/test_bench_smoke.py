"""Issue 14's benchmark suite (``python -m bench``) keeps working: its smoke mode prints the table.

Only that the table comes out with every case's row, and that ``--rounds`` prints each round and
then the medians' table: the figures are not checked (benchmarks are not tests; the machine may
be loaded).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from coordinator.config.locations import PROJECT_ROOT

ROWS = (
    "P1 ",
    "P1b ",
    "P2 ",
    "P3 backlog: peak RSS",
    "P3 backlog: tick cost",
    "P3 backlog: Spider",
    "P4 ",
    "P5 ",
    "Start-up",
)


def run_suite(*options: str, timeout: float) -> str:
    """``python -m bench`` with ``options``, outside any coordinator's environment; its stdout."""
    environment = {
        k: v
        for k, v in os.environ.items()
        if k not in ("COORDINATOR_DATABASE_URL", "COORDINATOR_HOME", "COORDINATOR_CRASH_AT")
    }
    completed = subprocess.run(
        [sys.executable, "-m", "bench", *options],
        cwd=PROJECT_ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr[-4000:]
    return completed.stdout


@pytest.mark.slow
def test_the_smoke_suite_prints_every_case() -> None:
    stdout = run_suite("--smoke", timeout=300)
    lines = stdout.splitlines()
    assert lines[0] == "| case | coordinator | floor | ratio | goal | holds |"
    for row in ROWS:
        assert any(line.startswith(f"| {row}") for line in lines), (row, stdout)
    assert all(line.count(" | ") == 5 for line in lines[2:]), stdout
    # P1b has a floor too: the database's own rate for the run's commits per job.
    (p1b,) = [line for line in lines if line.startswith("| P1b ")]
    assert "guarded moves/s from 3 processes" in p1b.split(" | ")[2], p1b
    # The issue sets P1b's goal on MariaDB: on SQLite the row is measured, not judged.
    assert p1b.split(" | ")[4:] == ["none on SQLite (≥ 300 jobs/s on MariaDB)", "— |"], p1b
    # P1 is measured inside a running service, after a warm-up job, as P1b and P2 are.
    (p1,) = [line for line in lines if line.startswith("| P1 ")]
    assert "after a warm-up job" in p1.split(" | ")[1], p1
    # Start-up's floor is every library a run needs, metrics' client included.
    (startup,) = [line for line in lines if line.startswith("| Start-up")]
    assert "prometheus_client" in startup.split(" | ")[2], startup


def test_rounds_print_every_round_then_each_goal_on_its_median() -> None:
    stdout = run_suite("--smoke", "--rounds", "2", "--case", "p5", timeout=120)
    assert "Round 1 of 2" in stdout and "Round 2 of 2" in stdout, stdout
    summary = stdout.split("Each goal on the median of 2 rounds", 1)[1].strip().splitlines()
    assert summary[0] == "| case | each round | median | goal | holds |", stdout
    (p5,) = [line for line in summary if line.startswith("| P5 partitioning")]
    cells = p5.split(" | ")
    assert len(cells[1].split(", ")) == 2 and cells[3] == "≤ 2 s", p5
