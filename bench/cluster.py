"""A real Spider cluster (``../shared/spider-cluster``) with CLP's databases: tests and bench.

``SpiderCluster`` gives one cluster its own two MariaDB databases on a server the caller names
(Spider's own and CLP's, both ``utf8mb4``: Spider's storage service exits on a database error with
another character set) and two free ports below 32768 (``cluster.sh``: an execution manager whose
storage or scheduler vanishes reconnects in a tight loop, and ephemeral ports collide). It starts
and stops the cluster with ``cluster.sh``, stops and restarts each of its three processes alone,
writes the CLP configuration files both coordinators read (this one's and CLP's Rust
``compression-coordinator``'s), and inserts Pending jobs the way log-ingestor does.

The cluster runs CLP's own task package: CLP's real ``compression::commit`` and a stand-in
``compression::clp_s_s3_compress`` that returns CLP's output shape at once without reading S3
(``../shared/spider-cluster/README.md``), so the objects a job names need not exist.

Both the tests (``tests/spider_cluster.py``, which wraps this in fixtures) and the bench's
``spider-cluster`` case use it; it imports nothing from either.
"""

from __future__ import annotations

import os
import platform
import random
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import zstandard
from sqlalchemy import Engine, create_engine, make_url, text

from coordinator.job_config import ClpIoConfig, OutputConfig, S3ObjectMetadataInputConfig
from coordinator.serde import pack
from coordinator.store.ingestion import S3ScannerJob, ingest_and_submit
from coordinator.task_io import DefaultAuthentication

SHARED = Path(__file__).resolve().parents[2] / "shared"
CLUSTER_HOME = SHARED / "spider-cluster"
CLUSTER_SH = CLUSTER_HOME / "cluster.sh"
RUST_COORDINATOR = CLUSTER_HOME / "bin" / "compression-coordinator"
STORAGE_BINARY = SHARED / "spider-storage" / "spider-storage"
BINARIES = (
    STORAGE_BINARY,
    CLUSTER_HOME / "bin" / "spider-scheduler",
    CLUSTER_HOME / "bin" / "spider-execution-manager",
    CLUSTER_HOME / "bin" / "spider-task-executor",
    RUST_COORDINATOR,
)
PACKAGE_DIR = CLUSTER_HOME / "packages"
MIN_GLIBC = (2, 34)
PORT_RANGE = (20000, 32000)
"""Below Linux's ephemeral range (32768-60999), so no outgoing connection takes them meanwhile."""
START_TIMEOUT_SECS = 60.0
PROCESSES = ("storage", "scheduler", "em")
"""``cluster.sh``'s names for the three processes (``DIR/<name>.pid``), in start order."""

BUCKET = "logs"
PREFIX = "in/"
DEFAULT_OUTPUT = OutputConfig(
    target_archive_size=256 << 20,
    target_dictionaries_size=32 << 20,
    target_encoded_file_size=256 << 20,
    target_segment_size=256 << 20,
    compression_level=3,
)


class ClusterError(RuntimeError):
    """The cluster did not start, stop or answer as expected; the message names its logs."""


def cluster_problem() -> str | None:
    """Why the cluster's binaries cannot run here, or ``None`` when they should."""
    for binary in (*BINARIES, CLUSTER_SH):
        problem = binary_problem(binary)
        if problem is not None:
            return problem
    return None


def binary_problem(binary: Path) -> str | None:
    """Why Spider's prebuilt ``binary`` cannot run here (missing, not executable, not Linux
    x86-64, glibc older than ``MIN_GLIBC``), or ``None`` when it should."""
    if not binary.is_file():
        return f"{binary} is missing"
    if not os.access(binary, os.X_OK):
        return f"{binary} is not executable"
    system, machine = platform.system(), platform.machine()
    if system != "Linux" or machine not in ("x86_64", "amd64", "AMD64"):
        return f"{binary} is built for Linux x86-64; this machine is {system} {machine}"
    try:
        libc = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError):
        libc = ""
    found = re.fullmatch(r"glibc (\d+)\.(\d+).*", libc)
    if found is None or (int(found[1]), int(found[2])) < MIN_GLIBC:
        needed = ".".join(str(part) for part in MIN_GLIBC)
        return f"{binary} needs glibc {needed}+; this machine has {libc or 'no glibc'}"
    return None


def free_low_port(taken: Sequence[int] = ()) -> int:
    """A port of ``PORT_RANGE`` nothing listens on now (and not in ``taken``)."""
    for _ in range(200):
        port = random.randint(*PORT_RANGE)
        if port in taken:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise ClusterError(f"no free port in {PORT_RANGE[0]}-{PORT_RANGE[1]} after 200 tries")


@dataclass(frozen=True)
class JobSpec:
    """One Pending job to insert: its objects' keys (under ``PREFIX`` of ``BUCKET``)."""

    keys: tuple[str, ...]
    dataset: str = "default"


def varied_jobs(count: int, *, first: int = 0, objects: Sequence[int] = (1, 2, 3)) -> list[JobSpec]:
    """``count`` jobs of 1-3 objects each (cycling through ``objects``), keys unique per job."""
    return [
        JobSpec(
            tuple(f"{PREFIX}{index}/part{k}.jsonl" for k in range(objects[index % len(objects)]))
        )
        for index in range(first, first + count)
    ]


@dataclass
class SpiderCluster:
    """One cluster on ``directory`` with databases of its own on ``server_url``'s MariaDB."""

    directory: Path
    server_url: str
    """``mysql+pymysql://user:password@host:port/`` (a user that may create databases)."""
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:10])
    storage_port: int = 0
    scheduler_port: int = 0
    running: bool = False
    _children: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict, repr=False)
    """The processes ``restart`` started: this process's children, reaped here (an unreaped one
    stays a zombie that ``kill -0`` still finds, so ``cluster.sh stop`` would wait on it)."""

    def __post_init__(self) -> None:
        self.directory = self.directory.resolve()
        self.directory.mkdir(parents=True, exist_ok=True)
        if not self.storage_port:
            self.storage_port = free_low_port()
        if not self.scheduler_port:
            self.scheduler_port = free_low_port((self.storage_port,))
        url = make_url(self.server_url)
        self.db_host = url.host or "127.0.0.1"
        self.db_port = url.port or 3306
        self.db_user = url.username or ""
        self.db_password = url.password or ""
        self.spider_db = f"spider_{self.tag}"
        self.clp_db = f"clp_{self.tag}"

    # --- databases ----------------------------------------------------------------------------

    @property
    def clp_url(self) -> str:
        return f"{self.server_url.rstrip('/')}/{self.clp_db}"

    @property
    def spider_url(self) -> str:
        return f"{self.server_url.rstrip('/')}/{self.spider_db}"

    def create_databases(self) -> None:
        """Both databases, ``utf8mb4``, empty (the coordinator's ``db upgrade`` makes CLP's
        tables; Spider's storage makes its own)."""
        self._admin(
            f"CREATE DATABASE `{self.spider_db}` CHARACTER SET utf8mb4",
            f"CREATE DATABASE `{self.clp_db}` CHARACTER SET utf8mb4",
        )

    def drop_databases(self) -> None:
        self._admin(
            f"DROP DATABASE IF EXISTS `{self.spider_db}`",
            f"DROP DATABASE IF EXISTS `{self.clp_db}`",
        )

    def _admin(self, *statements: str) -> None:
        admin = create_engine(self.server_url)
        try:
            with admin.begin() as connection:
                for statement in statements:
                    connection.execute(text(statement))
        finally:
            admin.dispose()

    # --- processes ----------------------------------------------------------------------------

    def env(self) -> dict[str, str]:
        """``cluster.sh``'s settings for this cluster, over the caller's environment."""
        env = dict(os.environ)
        env.update(
            SPIDER_STORAGE_PORT=str(self.storage_port),
            SPIDER_SCHEDULER_PORT=str(self.scheduler_port),
            SPIDER_DB_HOST=self.db_host,
            SPIDER_DB_PORT=str(self.db_port),
            SPIDER_DB_NAME=self.spider_db,
            SPIDER_DB_USER=self.db_user,
            SPIDER_DB_PASSWORD=self.db_password,
            CLP_DB_NAME=self.clp_db,
            CLP_DB_USER=self.db_user,
            CLP_DB_PASS=self.db_password,
        )
        return env

    def cluster_sh(self, command: str) -> None:
        """Run ``cluster.sh COMMAND DIR``; raises ``ClusterError`` with the logs' tails."""
        done = subprocess.run(
            [str(CLUSTER_SH), command, str(self.directory)],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=START_TIMEOUT_SECS,
            check=False,
        )
        if done.returncode != 0:
            raise ClusterError(
                f"cluster.sh {command} failed ({done.returncode}): {done.stderr.strip()}\n"
                + self.log_tails()
            )

    def start(self) -> SpiderCluster:
        """Start storage, scheduler and execution manager (``cluster.sh start``); when that
        fails, stop what it did start (``cluster.sh start`` exits leaving the others running)."""
        try:
            self.cluster_sh("start")
        except (ClusterError, subprocess.TimeoutExpired):
            with suppress(ClusterError, subprocess.TimeoutExpired):
                self.cluster_sh("stop")
            raise
        self.running = True
        return self

    def stop(self, *, graceful: bool = True) -> None:
        """Stop the three processes, the execution manager first (as ``cluster.sh stop``).

        ``graceful=False`` (tests about to drop the databases) still stops the execution manager
        with SIGTERM, so that it ends its task executors, but SIGKILLs the scheduler and the
        storage service rather than waiting the seconds each takes to shut down.
        """
        if not self.running:
            return
        self.em_stop()
        for name in ("scheduler", "storage"):
            if graceful:
                self._terminate(name)
            self.kill(name)
        self.cluster_sh("stop")  # nothing of its own is left to stop: it clears the pid files
        self.running = False

    def _terminate(self, name: str, timeout: float = 5.0) -> None:
        """SIGTERM ``name`` and wait up to ``timeout`` until it is gone (``kill`` after)."""
        pid = self.pid(name)
        if pid is None:
            return
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while self.pid(name) is not None and time.monotonic() < deadline:
            time.sleep(0.02)

    def pid(self, name: str) -> int | None:
        """The pid of ``name`` (``storage``, ``scheduler``, ``em``) when it runs."""
        child = self._children.get(name)
        if child is not None and child.poll() is not None:
            return None
        path = self.directory / f"{name}.pid"
        if not path.is_file():
            return None
        pid = int(path.read_text().strip())
        return pid if process_alive(pid) else None

    def kill(self, name: str) -> None:
        """SIGKILL ``name`` and wait until it is gone; its pid file goes too (also when it was
        gone already: ``cluster.sh stop`` would wait on a pid file whose zombie is unreaped)."""
        pid = self.pid(name)
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 10
            while self.pid(name) is not None and time.monotonic() < deadline:
                time.sleep(0.02)
        (self.directory / f"{name}.pid").unlink(missing_ok=True)

    def em_stop(self) -> None:
        """Stop the execution manager as ``cluster.sh em-stop`` does (SIGTERM, SIGKILL after 5 s),
        but noticing its exit at once: it is no child of this process, and an init that reaps
        orphans only now and then leaves it a zombie that ``kill -0`` still finds for seconds."""
        self._terminate("em")
        self.kill("em")

    def em_start(self) -> None:
        self.cluster_sh("em-start")

    def restart(self, name: str) -> None:
        """Stop ``storage`` or ``scheduler`` (SIGTERM as ``cluster.sh`` does, then SIGKILL) and
        start it again on the same port and configuration; ``em``: ``em_stop`` then ``em_start``.

        The execution manager reconnects to a restarted scheduler. A restarted storage service is
        another matter: Spider's scheduler and execution manager exit when their storage
        connection breaks (the scheduler's core with "Scheduler core exited on error", the
        execution manager with "Execution manager exited on error"), so restart both after it.
        """
        if name == "em":
            self.em_stop()
            self.em_start()
            return
        binary, config, port, log_env = {
            "storage": (STORAGE_BINARY, "storage.yaml", self.storage_port, "SPIDER_STORAGE_LOG"),
            "scheduler": (
                CLUSTER_HOME / "bin" / "spider-scheduler",
                "scheduler.yaml",
                self.scheduler_port,
                "SPIDER_SCHEDULER_LOG",
            ),
        }[name]
        self._terminate(name)
        self.kill(name)
        env = self.env()
        env["SPIDER_STORAGE_DB_USERNAME"] = self.db_user
        env["SPIDER_STORAGE_DB_PASSWORD"] = self.db_password
        env["RUST_LOG"] = env.get(log_env, "info" if name == "storage" else "warn")
        with (self.directory / "logs" / f"{name}.log").open("ab") as log:
            process = subprocess.Popen(
                [str(binary), "--config", str(self.directory / config)],
                cwd=self.directory,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        (self.directory / f"{name}.pid").write_text(f"{process.pid}\n")
        self._children[name] = process
        wait_for_port(port, process, START_TIMEOUT_SECS, what=f"spider {name}", logs=self.log_tails)

    def log_tails(self, lines: int = 15) -> str:
        """The last lines of each process's log, for an error message."""
        parts = []
        for log in sorted((self.directory / "logs").glob("*.log")):
            tail = log.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {log.name}\n" + "\n".join(tail))
        return "\n".join(parts)

    # --- configuration files ------------------------------------------------------------------

    def coordinator_config(
        self,
        path: Path,
        *,
        max_concurrent_jobs: int = 4,
        extras: Mapping[str, object] | None = None,
        archives: Path | None = None,
    ) -> Path:
        """Write this coordinator's CLP configuration for the cluster; ``path``.

        CLP's sections as CLP writes them (database, S3 logs input, fs archive output: the
        directory ``cluster.sh`` gives the commit task), CLP's default coordinator settings
        (``compression-coordinator.example.yaml``) with ``max_concurrent_jobs``, and the
        ``coordinator:`` section ``extras``. The credentials come from ``CLP_DB_USER``/``PASS``
        (``env()``).
        """
        archives = archives or self.directory / "archives"
        coordinator = {"legacy_scheduler": "absent", **(extras or {})}
        lines = [
            "package: {storage_engine: clp-s}",
            f"database: {{host: {self.db_host}, port: {self.db_port}, "
            f"names: {{clp: {self.clp_db}}}}}",
            f"spider: {{host: 127.0.0.1, port: {self.storage_port}}}",
            "logs_input: {type: s3, aws_authentication: {type: default}}",
            f"archive_output: {{storage: {{type: fs, directory: {archives}}}}}",
            "compression_coordinator:",
            "  job_polling_interval_millisecs: 200",
            f"  max_concurrent_jobs: {max_concurrent_jobs}",
            "  result_polling: {init_backoff_millisecs: 100, max_backoff_millisecs: 500}",
            "coordinator:",
            *(f"  {key}: {_yaml_scalar(value)}" for key, value in coordinator.items()),
        ]
        path.write_text("\n".join(lines) + "\n")
        return path

    def rust_config(self, path: Path, *, max_concurrent_jobs: int = 4) -> Path:
        """Write CLP's Rust coordinator's configuration (``compression-coordinator.example.yaml``
        with this cluster's database, storage port and ``max_concurrent_jobs``); ``path``."""
        example = (CLUSTER_HOME / "compression-coordinator.example.yaml").read_text()
        written = (
            example.replace("port: 3306", f"port: {self.db_port}")
            .replace(
                'host: "127.0.0.1"\n  port: 29551',
                f'host: "127.0.0.1"\n  port: {self.storage_port}',
            )
            .replace('clp: "clp"', f'clp: "{self.clp_db}"')
            .replace("max_concurrent_jobs: 4", f"max_concurrent_jobs: {max_concurrent_jobs}")
        )
        assert f"port: {self.storage_port}" in written, "the example's spider section moved"
        path.write_text(written)
        return path

    def upgrade_schema(self, config: Path) -> None:
        """``coordinator db upgrade`` on CLP's database (the deployment's schema step)."""
        done = subprocess.run(
            coordinator_command("--config", str(config), "db", "upgrade"),
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if done.returncode != 0:
            raise ClusterError(f"coordinator db upgrade failed: {done.stderr.strip()}")

    def coordinator(
        self, config: Path, *args: str, log: Path | None = None
    ) -> subprocess.Popen[bytes]:
        """``coordinator --config CONFIG ARGS`` (default ``run``) as a process of its own session,
        its output appended to ``log`` (default ``DIR/logs/coordinator.log``)."""
        return self._spawn(
            coordinator_command("--config", str(config), *(args or ("run",))),
            log or self.directory / "logs" / "coordinator.log",
        )

    def rust_coordinator(self, config: Path, *, log: Path | None = None) -> subprocess.Popen[bytes]:
        """CLP's Rust ``compression-coordinator --config CONFIG``, its hourly log files under
        ``DIR/logs/rust`` (``CLP_LOGS_DIR``) and its output appended to ``log``."""
        logs = self.directory / "logs" / "rust"
        logs.mkdir(parents=True, exist_ok=True)
        return self._spawn(
            [str(RUST_COORDINATOR), "--config", str(config)],
            log or self.directory / "logs" / "rust-coordinator.log",
            CLP_LOGS_DIR=str(logs),
        )

    def _spawn(self, command: Sequence[str], log: Path, **env: str) -> subprocess.Popen[bytes]:
        with log.open("ab") as output:
            return subprocess.Popen(
                command,
                cwd=self.directory,
                env={**self.env(), **env},
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    # --- jobs ---------------------------------------------------------------------------------

    def clp_engine(self) -> Engine:
        return create_engine(self.clp_url, pool_size=2)

    def insert_jobs(self, engine: Engine, jobs: Sequence[JobSpec]) -> list[int]:
        """Insert each job with its objects as log-ingestor does (one finished ingestion job per
        compression job); the compression job ids, in order."""
        ids = []
        for job in jobs:
            objects = [(BUCKET, key, 1000 + index) for index, key in enumerate(job.keys)]
            scanner = S3ScannerJob(bucket=BUCKET, key_prefix=PREFIX, dataset=job.dataset)
            written = ingest_and_submit(
                engine,
                scanner,
                objects,
                partial(job_blob, job),
            )
            ids.append(written.compression_job_id)
        return ids


def process_alive(pid: int) -> bool:
    """Whether ``pid`` runs: exists and is not a zombie (an exited process its parent has not
    reaped yet, which ``kill -0`` still finds)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:
        stat = ""
    if stat:
        return stat.rpartition(")")[2].split()[:1] not in (["Z"], ["X"])
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def coordinator_command(*args: str) -> list[str]:
    """This coordinator's command line, run by the current interpreter."""
    return [sys.executable, "-m", "coordinator", *args]


def job_blob(job: JobSpec, ingestion_job_id: int, object_ids: Sequence[int]) -> bytes:
    """The ``clp_config`` log-ingestor writes for ``object_ids`` (zstd over named msgpack)."""
    config = ClpIoConfig(
        input=S3ObjectMetadataInputConfig(
            bucket=BUCKET,
            key_prefix=PREFIX,
            endpoint_url=None,
            aws_authentication=DefaultAuthentication(),
            ingestion_job_id=ingestion_job_id,
            s3_object_metadata_ids=list(object_ids),
            dataset=job.dataset,
            timestamp_key="timestamp",
            unstructured=False,
        ),
        output=DEFAULT_OUTPUT,
    )
    return zstandard.ZstdCompressor(level=3).compress(pack(config.to_named()))


def _yaml_scalar(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    return f'"{value}"'


def wait_for_port(
    port: int,
    process: subprocess.Popen[bytes] | None,
    timeout: float,
    *,
    what: str,
    logs: object = None,
) -> None:
    """Wait until ``127.0.0.1:port`` accepts a connection; raises ``ClusterError`` when
    ``process`` exits first or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            pass
        if process is not None and process.poll() is not None:
            break
        time.sleep(0.05)
    tails = logs() if callable(logs) else ""
    raise ClusterError(f"{what} did not answer on 127.0.0.1:{port}\n{tails}")


@contextmanager
def running_cluster(directory: Path, server_url: str) -> Iterator[SpiderCluster]:
    """A started cluster with fresh databases; stopped and its databases dropped afterwards."""
    cluster = SpiderCluster(directory, server_url)
    cluster.create_databases()
    try:
        cluster.start()
        try:
            yield cluster
        finally:
            cluster.stop()
    finally:
        cluster.drop_databases()
