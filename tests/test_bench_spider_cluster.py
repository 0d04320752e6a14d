"""The bench's ``spider-cluster`` case (``bench/spider_cluster.py``) runs and prints its rows.

Only that the rows come out, judged, with both coordinators' figures: the figures themselves are
not checked (benchmarks are not tests; the machine may be loaded). Without ``--database`` the case
prints one row saying it was skipped and why.
"""

from __future__ import annotations

import os

import pytest

from tests.conftest import mariadb_server_url
from tests.spider_cluster import require_cluster
from tests.test_bench_smoke import run_suite

ROWS = (
    "Spider cluster: drain 20 jobs, 4 slots",
    "Spider cluster: latency p50, 20 jobs, 4 slots",
    "Spider cluster: latency p95, 20 jobs, 4 slots",
    "Spider cluster: coordinator CPU per job",
    "Spider cluster: coordinator peak RSS",
    "Spider cluster: idle CPU",
)


def bench(*options: str, timeout: float) -> str:
    """``python -m bench --case spider-cluster`` with ``options``; its stdout."""
    return run_suite("--case", "spider-cluster", *options, timeout=timeout)


def test_without_a_database_the_case_says_it_was_skipped() -> None:
    stdout = bench("--smoke", timeout=60)
    (row,) = [line for line in stdout.splitlines() if line.startswith("| Spider cluster")]
    assert "skipped, needs a MariaDB server (--database URL)" in row, stdout


@pytest.mark.mariadb
@pytest.mark.slow
def test_the_smoke_case_prints_every_row_against_rust() -> None:
    server = mariadb_server_url()
    require_cluster()
    stdout = bench("--smoke", "--database", server, timeout=300)
    lines = stdout.splitlines()
    for name in ROWS:
        (row,) = [line for line in lines if line.startswith(f"| {name}")]
        cells = row.split(" | ")
        assert cells[2].startswith("Rust "), row
        assert cells[5].rstrip(" |") in ("yes", "no"), row


@pytest.mark.mariadb
@pytest.mark.slow
def test_without_an_idle_window_the_idle_row_is_left_out() -> None:
    """``--cluster-idle-secs 0`` (only the drains, e.g. at 64 slots): every other row, no idle
    row, no failure."""
    server = mariadb_server_url()
    require_cluster()
    stdout = bench("--smoke", "--database", server, "--cluster-idle-secs", "0", timeout=300)
    lines = stdout.splitlines()
    for name in ROWS[:-1]:
        (row,) = [line for line in lines if line.startswith(f"| {name}")]
        assert row.split(" | ")[2].startswith("Rust "), row
    assert not [line for line in lines if "idle CPU" in line], stdout


@pytest.mark.mariadb
@pytest.mark.slow
def test_with_a_cpu_of_its_own_the_rows_say_so_and_every_thread_gets_its_cpus_back() -> None:
    """``--cluster-own-cpu 1``: the drain rows name the placement, and afterwards this process's
    threads (pinned to the other CPUs during the runs) are on every CPU they had again."""
    server = mariadb_server_url()
    require_cluster()
    before = os.sched_getaffinity(0)
    stdout = bench(
        "--smoke",
        "--database",
        server,
        "--cluster-idle-secs",
        "0",
        "--cluster-own-cpu",
        "1",
        timeout=300,
    )
    name = "Spider cluster, coordinator on a CPU of its own: drain 20 jobs, 4 slots"
    (row,) = [line for line in stdout.splitlines() if line.startswith(f"| {name}")]
    assert row.split(" | ")[2].startswith("Rust "), row
    assert os.sched_getaffinity(0) == before
