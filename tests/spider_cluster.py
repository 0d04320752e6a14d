"""A whole real Spider cluster (``../shared/spider-cluster``) for tests, over ``bench/cluster.py``.

``ClusterRun`` is one started cluster (storage, scheduler, execution manager running CLP's task
package: CLP's real ``compression::commit`` and a stand-in compress) with fresh databases of its own
on the tests' private MariaDB, CLP's schema upgraded by ``coordinator db upgrade`` and this
coordinator's CLP configuration written. Tests start ``coordinator run`` processes through it;
every process a test started is stopped (SIGTERM, then SIGKILL of its whole session) when the test
ends, pass or fail, and the cluster is stopped and its databases dropped after it.

Where the binaries cannot run here (``bench.cluster.cluster_problem``) or there is no MariaDB, the
tests are skipped with a notice saying why, except in CI: ``.ci/run`` sets
``$COORDINATOR_TEST_REQUIRE_SPIDER_CLUSTER=1`` (as it requires MariaDB and the storage service),
which makes them fail. A cluster that should start but does not always fails its test.

Tests wait on conditions, never on fixed sleeps: ``wait_until`` polls a predicate to a deadline and
``wait_terminal`` polls ``compression_jobs`` until the given jobs are terminal; both fail with the
job rows and the tails of every log (the cluster's three processes and the coordinators').
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

from bench.cluster import (
    ClusterError,
    JobSpec,
    SpiderCluster,
    cluster_problem,
    coordinator_command,
)
from coordinator.lifecycle.status import JobStatus

REQUIRE_ENV = "COORDINATOR_TEST_REQUIRE_SPIDER_CLUSTER"
TERMINAL = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.KILLED})
"""What ``compression_jobs.status`` ends in (CLP's commit writes SUCCEEDED itself)."""
POLL_SECS = 0.1
DEFAULT_TIMEOUT_SECS = 60.0
STOP_TIMEOUT_SECS = 15.0


def require_cluster() -> None:
    """Skip the test when the cluster's binaries cannot run here, or fail it in CI
    (``REQUIRE_ENV``), as ``tests/spider_storage.py``'s ``require_binary`` does for the storage
    service alone."""
    problem = cluster_problem()
    if problem is None:
        return
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"the real Spider cluster is required (${REQUIRE_ENV}=1) but {problem}")
    pytest.skip(f"{problem}: the tests against a real Spider cluster are skipped")


@dataclass(frozen=True)
class JobRow:
    """The columns of one ``compression_jobs`` row the tests judge."""

    id: int
    status: int
    status_msg: str
    spider_id: int | None
    compressed_size: int
    uncompressed_size: int

    def __str__(self) -> str:
        known = self.status in {member.value for member in JobStatus}
        status = JobStatus(self.status).name if known else str(self.status)
        return (
            f"job {self.id}: {status} spider_id={self.spider_id} "
            f"sizes={self.compressed_size}/{self.uncompressed_size} msg={self.status_msg!r}"
        )


@dataclass
class ClusterRun:
    """A started cluster, its CLP database's engine and this coordinator's config for it."""

    cluster: SpiderCluster
    config: Path
    engine: Engine
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    # --- coordinators -------------------------------------------------------------------------

    def coordinator(
        self, *args: str, config: Path | None = None, log: Path | None = None
    ) -> subprocess.Popen[bytes]:
        """``coordinator --config CONFIG ARGS`` (default ``run``) as a process the fixture stops
        when the test ends; output appended to ``log`` (default ``DIR/logs/coordinator.log``, so
        it is among ``log_tails``)."""
        process = self.cluster.coordinator(config or self.config, *args, log=log)
        self.processes.append(process)
        return process

    def write_config(self, name: str, **extras: object) -> Path:
        """Another coordinator config for the cluster, ``coordinator:`` section ``extras``."""
        return self.cluster.coordinator_config(self.cluster.directory / name, extras=extras)

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        """A one-shot ``coordinator --config CONFIG ARGS`` (``show``, ``jobs``), run to its end."""
        return subprocess.run(
            coordinator_command("--config", str(self.config), *args),
            env=self.cluster.env(),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def stop_coordinators(self) -> None:
        """SIGTERM each started coordinator's session, SIGKILL what is left after a while."""
        for process in self.processes:
            _signal_session(process, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_SECS
        for process in self.processes:
            with suppress(subprocess.TimeoutExpired):
                process.wait(max(0.0, deadline - time.monotonic()))
            _signal_session(process, signal.SIGKILL)
            process.wait()
        self.processes.clear()

    # --- jobs ---------------------------------------------------------------------------------

    def insert_jobs(self, jobs: Sequence[JobSpec]) -> list[int]:
        return self.cluster.insert_jobs(self.engine, jobs)

    def job_rows(self, ids: Sequence[int]) -> dict[int, JobRow]:
        if not ids:
            return {}
        with self.engine.connect() as connection:
            rows = connection.execute(
                text(
                    "SELECT id, status, status_msg, spider_id, compressed_size, uncompressed_size"
                    f" FROM compression_jobs WHERE id IN ({', '.join(str(int(i)) for i in ids)})"
                )
            ).all()
        return {
            row.id: JobRow(
                row.id,
                row.status,
                row.status_msg,
                row.spider_id,
                row.compressed_size,
                row.uncompressed_size,
            )
            for row in rows
        }

    def query(self, sql: str, params: Mapping[str, Any] | None = None) -> list[Any]:
        """Rows of one read of CLP's database."""
        with self.engine.connect() as connection:
            return list(connection.execute(text(sql), dict(params or {})).all())

    def execute(self, *statements: str) -> None:
        """Statements run in one transaction on CLP's database."""
        with self.engine.begin() as connection:
            for statement in statements:
                connection.execute(text(statement))

    def context(self, ids: Sequence[int] = ()) -> str:
        """The given jobs' rows, the coordinators' exit codes and every log's tail."""
        rows = self.job_rows(ids) if ids else {}
        lines = [str(row) for row in rows.values()]
        lines += [f"coordinator pid {p.pid}: exit {p.poll()}" for p in self.processes]
        return "\n".join([*lines, self.cluster.log_tails(25)])

    def wait_until(
        self,
        predicate: Callable[[], bool],
        what: str,
        *,
        timeout: float = DEFAULT_TIMEOUT_SECS,
        ids: Sequence[int] = (),
    ) -> None:
        """Poll ``predicate`` until it holds; fail with ``ids``' rows and the logs after
        ``timeout``."""
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                pytest.fail(f"{what} did not happen within {timeout:.0f} s\n{self.context(ids)}")
            time.sleep(POLL_SECS)

    def statuses(self, ids: Sequence[int]) -> list[int]:
        return [row.status for row in self.job_rows(ids).values()]

    def count(self, ids: Sequence[int], status: JobStatus) -> int:
        return sum(1 for value in self.statuses(ids) if value == status)

    def wait_terminal(
        self, ids: Sequence[int], *, timeout: float = DEFAULT_TIMEOUT_SECS
    ) -> dict[int, JobRow]:
        """Poll until every job of ``ids`` is terminal; their rows. Fails after ``timeout`` with
        the rows and the logs, and at once when every started coordinator has exited (nothing
        would move the rest)."""
        deadline = time.monotonic() + timeout
        while True:
            rows = self.job_rows(ids)
            if len(rows) == len(ids) and all(row.status in TERMINAL for row in rows.values()):
                return rows
            gone = self.processes and all(p.poll() is not None for p in self.processes)
            if gone or time.monotonic() > deadline:
                rows = self.job_rows(ids)
                if len(rows) == len(ids) and all(r.status in TERMINAL for r in rows.values()):
                    return rows
                cause = "every coordinator exited" if gone else f"{timeout:.0f} s passed"
                done = sum(1 for row in rows.values() if row.status in TERMINAL)
                pytest.fail(f"{done} of {len(ids)} jobs terminal when {cause}\n{self.context(ids)}")
            time.sleep(POLL_SECS)

    def archives(self, dataset: str = "default") -> list[Any]:
        """Every row of ``clp_<dataset>_archives`` (id, size, uncompressed_size, creator_id)."""
        return self.query(
            f"SELECT id, size, uncompressed_size, creator_id FROM clp_{dataset}_archives"
        )


def _signal_session(process: subprocess.Popen[bytes], signum: signal.Signals) -> None:
    """Signal the process's whole session (``bench.cluster`` starts it as a session leader), also
    after the leader exited: a child of a SIGKILLed coordinator would outlive it."""
    process.poll()
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signum)


@contextmanager
def running_cluster_run(server_url: str, directory: Path) -> Iterator[ClusterRun]:
    """A started cluster with fresh databases, CLP's schema at head and the config written;
    afterwards its coordinators stopped, the cluster stopped and its databases dropped (also when
    the test fails). Skips (fails in CI) when the binaries cannot run; fails when it does not
    start."""
    require_cluster()
    cluster = SpiderCluster(directory, server_url)
    cluster.create_databases()
    try:
        config = cluster.coordinator_config(directory / "clp-config.yaml")
        try:
            # CLP's schema needs only the database: upgrade it while the cluster starts.
            with ThreadPoolExecutor(1) as pool:
                upgraded = pool.submit(cluster.upgrade_schema, config)
                try:
                    cluster.start()
                finally:
                    upgraded.result()
        except (ClusterError, subprocess.TimeoutExpired) as error:
            cluster.stop(graceful=False)  # start() stops what it started when it fails itself
            pytest.fail(str(error))
        engine = cluster.clp_engine()
        run = ClusterRun(cluster, config, engine)
        try:
            yield run
        finally:
            try:
                run.stop_coordinators()
            finally:
                engine.dispose()
                cluster.stop(graceful=False)  # its databases are dropped next
    finally:
        cluster.drop_databases()
