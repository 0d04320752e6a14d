"""Spider's real storage service (``../shared/spider-storage/spider-storage``) for tests.

``SpiderStorage`` runs the binary on a free port of 127.0.0.1 with a MariaDB database of its own
(the tests' private server, ``$COORDINATOR_TEST_MARIADB_URL``; the service creates its tables and
takes the credentials from ``SPIDER_STORAGE_DB_USERNAME``/``PASSWORD``), waits until it answers a
gRPC call, and stops (SIGTERM), kills or restarts it on the same port and database.

Where the binary cannot run here (missing, not Linux x86-64, glibc older than 2.34) or there is no
MariaDB, its tests are skipped with a notice saying why, except in CI: ``.ci/run`` sets
``$COORDINATOR_TEST_REQUIRE_SPIDER_STORAGE=1`` (as it requires MariaDB), which makes them fail.
A binary that should run but does not start or answer always fails its tests, naming its log.

The service is the storage server alone (no scheduler, no execution manager): nothing executes.
``StandInExecutionManager`` plays an execution manager's part over Spider's internal services
(``docs/spider.md``, gRPC surface; the coordinator's stubs carry them too): it takes the ready tasks
off the inbound queue,
registers task instances and reports their successes and failures, so tests can bring a job to
``CommitReady``, ``Succeeded`` or ``Failed`` on the real server without running any task.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import grpc
import pytest
from sqlalchemy import create_engine, make_url, text

from bench.cluster import binary_problem as spider_binary_problem
from coordinator.spider.grpc.client import GrpcSpider
from coordinator.spider.grpc.generated.common import common_pb2
from coordinator.spider.grpc.generated.storage import storage_pb2, storage_pb2_grpc
from coordinator.spider.port import JobNotFound, SpiderError
from coordinator.spider.wire import encode_frame

SHARED = Path(__file__).resolve().parents[2] / "shared"
BINARY = SHARED / "spider-storage" / "spider-storage"
REQUIRE_ENV = "COORDINATOR_TEST_REQUIRE_SPIDER_STORAGE"
START_TIMEOUT_SECS = 30.0
_stubs: Any = storage_pb2_grpc
"""The generated stubs (Spider's whole ``storage.proto``, its internal services included)."""
STOP_TIMEOUT_SECS = 15.0
UNKNOWN_JOB = 2**63
"""A job id no test registers: ``GetJobState`` of it answers NOT_FOUND once the service is up."""


class SpiderStorageError(RuntimeError):
    """The service did not start, answer or stop as expected; the message carries its log."""


def binary_problem(binary: Path | None = None) -> str | None:
    """Why ``binary`` (default ``BINARY``) cannot run here, or ``None`` when it should."""
    problem = spider_binary_problem(BINARY if binary is None else binary)
    return None if problem is None else f"Spider's storage service: {problem}"


def require_binary() -> None:
    """Skip the test when the binary cannot run here, or fail it in CI (``REQUIRE_ENV``)."""
    problem = binary_problem()
    if problem is None:
        return
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"Spider's storage service is required (${REQUIRE_ENV}=1) but {problem}")
    pytest.skip(f"{problem}: the tests against Spider's real server are skipped")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def storage_database(server_url: str, charset: str = "utf8mb4") -> Iterator[str]:
    """A fresh database on the MariaDB server at ``server_url`` (dropped afterwards); its name.

    Spider's service creates its tables in the database's default character set, so the database
    is ``utf8mb4`` as in Spider's deployments (the MariaDB image's default): in ``latin1`` (this
    private server's default) a task failure message with a character outside it, such as the
    U+FFFD of every in-task failure, fails the service's write, which shuts it down.
    """
    name = f"spider_storage_{uuid.uuid4().hex[:12]}"
    admin = create_engine(server_url)
    try:
        with admin.begin() as connection:
            connection.execute(text(f"CREATE DATABASE `{name}` CHARACTER SET {charset}"))
        try:
            yield name
        finally:
            with admin.begin() as connection:
                connection.execute(text(f"DROP DATABASE IF EXISTS `{name}`"))
    finally:
        admin.dispose()


class SpiderStorage:
    """One storage service process on ``127.0.0.1:port`` over the database ``database``."""

    def __init__(self, directory: Path, server_url: str, database: str) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.server_url = server_url
        self.database = database
        self.database_url = f"{server_url.rstrip('/')}/{database}"
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = directory / "spider-storage.log"
        self.config_path = directory / "storage.yaml"
        self.starts = 0

    # --- life cycle -------------------------------------------------------------------------

    def start(self) -> SpiderStorage:
        """Start the service and wait until it answers; a port taken meanwhile is replaced (on
        the first start only: a restart keeps its address). Raises ``SpiderStorageError``."""
        assert not self.running, "already running"
        for _ in range(3):
            self._write_config()
            self._spawn()
            try:
                self._wait_until_answering()
                self.starts += 1
                return self
            except SpiderStorageError:
                in_use = "Address already in use" in self.log() or "AddrInUse" in self.log()
                self.kill()
                if not in_use or self.starts > 0:
                    raise
                self.port = free_port()
        raise SpiderStorageError(f"no free port for Spider's storage service: {self.log_tail()}")

    def stop(self, timeout: float = STOP_TIMEOUT_SECS) -> int:
        """SIGTERM, then wait (SIGKILL after ``timeout``); the exit status."""
        process = self._process()
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        return int(process.returncode)

    def kill(self) -> None:
        """SIGKILL (a crash), and reap it."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def restart(self) -> None:
        """Stop the service gracefully and start it again on the same port and database."""
        self.stop()
        self.start()

    def wait_for_exit(self, timeout: float) -> int | None:
        """The exit status once the process ended by itself, ``None`` if it still runs."""
        try:
            return int(self._process().wait(timeout))
        except subprocess.TimeoutExpired:
            return None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    # --- use --------------------------------------------------------------------------------

    def client(self, **settings: Any) -> GrpcSpider:
        """A ``GrpcSpider`` on the service (no retries by default: failures show at once)."""
        options: dict[str, Any] = {"deadline_secs": 10.0, "max_retries": 0, **settings}
        return GrpcSpider("127.0.0.1", self.port, **options)

    def log(self) -> str:
        """Everything the service wrote (JSON lines, ``RUST_LOG=info``)."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log().splitlines()[-lines:])

    def query(self, statement: str, **values: Any) -> list[tuple[Any, ...]]:
        """The rows of ``statement`` on the service's own database (its ``jobs`` table, say)."""
        engine = create_engine(self.database_url)
        try:
            with engine.connect() as connection:
                return [tuple(row) for row in connection.execute(text(statement), values)]
        finally:
            engine.dispose()

    # --- internals --------------------------------------------------------------------------

    def _process(self) -> subprocess.Popen[bytes]:
        assert self.process is not None, "never started"
        return self.process

    def _write_config(self) -> None:
        """``storage.example.yaml``'s settings, but an execution manager is declared dead only
        after an hour: the stand-in sends no heartbeats, and a module may outlast a minute."""
        url = make_url(self.server_url)
        self.config_path.write_text(
            f'host: "127.0.0.1"\n'
            f"port: {self.port}\n"
            "runtime:\n"
            "  db:\n"
            f'    host: "{url.host or "127.0.0.1"}"\n'
            "    max_connections: 8\n"
            f'    name: "{self.database}"\n'
            f"    port: {url.port or 3306}\n"
            "  inbound_queue:\n"
            "    cleanup_capacity: 256\n"
            "    commit_capacity: 256\n"
            "    task_capacity: 1048576\n"
            "  job_cache_gc:\n"
            "    gc_interval_sec: 30\n"
            "    terminated_job_retention_sec: 300\n"
            "  task_instance_pool:\n"
            "    execution_manager_stale_cutoff_sec: 3600\n"
            "    gc_interval_sec: 30\n"
            "    message_channel_capacity: 128\n"
        )

    def _spawn(self) -> None:
        url = make_url(self.server_url)
        environment = {
            **os.environ,
            "SPIDER_STORAGE_DB_USERNAME": url.username or "",
            "SPIDER_STORAGE_DB_PASSWORD": url.password or "",
            "RUST_LOG": "info",
        }
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [str(BINARY), "--config", str(self.config_path)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=environment,
                cwd=self.directory,
            )

    def _wait_until_answering(self) -> None:
        """Until the port accepts connections and a gRPC call is answered. (A gRPC channel that
        failed to connect waits a second before trying again, so the port is watched first.)"""
        deadline = time.monotonic() + START_TIMEOUT_SECS
        while True:
            status = self._process().poll()
            if status is not None:
                raise SpiderStorageError(
                    f"Spider's storage service exited with status {status} while starting "
                    f"(config {self.config_path}); its log:\n{self.log_tail()}"
                )
            if self._answers():
                return
            if time.monotonic() > deadline:
                raise SpiderStorageError(
                    f"Spider's storage service did not answer within {START_TIMEOUT_SECS} s; "
                    f"its log:\n{self.log_tail()}"
                )
            time.sleep(0.02)

    def _answers(self) -> bool:
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
        except OSError:
            return False
        with self.client(deadline_secs=2.0) as probe:
            try:
                probe.get_job_state(UNKNOWN_JOB)
            except JobNotFound:
                return True
            except SpiderError:
                return False
        raise SpiderStorageError(f"job {UNKNOWN_JOB} exists on a fresh service")


@contextmanager
def running_spider_storage(
    server_url: str, directory: Path, *, charset: str = "utf8mb4"
) -> Iterator[SpiderStorage]:
    """A started service with a fresh database of its own (in ``charset``), its config and log in
    ``directory``; stopped and its database dropped afterwards.

    Skips (or, in CI, fails) when the binary cannot run here; fails the test when it does not
    start or answer.
    """
    require_binary()
    with storage_database(server_url, charset) as database:
        storage = SpiderStorage(directory, server_url, database)
        try:
            storage.start()
        except SpiderStorageError as error:
            pytest.fail(str(error))
        try:
            yield storage
        finally:
            storage.stop()


# --- a stand-in execution manager ----------------------------------------------------------------


@dataclass(frozen=True)
class ReadyTask:
    """A task Spider's inbound queue handed out: ``task`` is an index, ``"commit"`` or
    ``"cleanup"``."""

    job_id: int
    task: int | str
    session_id: int


class StandInExecutionManager:
    """An execution manager that runs nothing: it registers itself with the storage service, takes
    ready tasks off its inbound queue (as the scheduler would), registers a task instance for one
    and reports the instance's success (with given output payloads) or failure (with a message),
    through Spider's internal services (``docs/spider.md``, gRPC surface). Calls raise
    ``grpc.RpcError``; each waits (10 s at most) for the service to be reachable."""

    _LANES: ClassVar[dict[str, str]] = {
        "tasks": "PollReadyTasks",
        "commit": "PollReadyCommitTasks",
        "cleanup": "PollReadyCleanupTasks",
    }

    def __init__(self, port: int) -> None:
        self._channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self._queue: Any = _stubs.InboundQueueServiceStub(self._channel)
        self._instances: Any = _stubs.TaskInstanceManagementServiceStub(self._channel)
        liveness: Any = _stubs.ExecutionManagerLivenessServiceStub(self._channel)
        registration = self._call(
            liveness.RegisterExecutionManager,
            storage_pb2.RegisterExecutionManagerRequest(ip_address="127.0.0.1"),
        ).registration
        self.em_id = int(registration.execution_manager_id)
        self.session_id = int(registration.session_id)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> StandInExecutionManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def poll(self, lane: str = "tasks", *, max_items: int = 1024) -> list[ReadyTask]:
        """What the inbound queue's lane (``tasks``, ``commit`` or ``cleanup``) holds now (taken
        off it)."""
        request = storage_pb2.PollReadyTasksRequest(max_items=max_items, wait_ms=100)
        ready = self._call(getattr(self._queue, self._LANES[lane]), request).tasks
        return [
            ReadyTask(int(task.job_id), _task_of(task.task_id), int(ready.session_id))
            for task in ready.tasks
        ]

    def register(self, job_id: int, task: int | str) -> Any:
        """Register an instance of the task; Spider's ``ExecutionContext`` for it (instance id,
        TDL context, timeout policy, serialized inputs)."""
        request = storage_pb2.RegisterTaskInstanceRequest(
            job_id=job_id,
            task_id=_task_id(task),
            execution_manager_id=self.em_id,
            session_id=self.session_id,
        )
        return self._call(self._instances.RegisterTaskInstance, request).execution_context

    def succeed(
        self, job_id: int, task: int | str, instance: int, outputs: Sequence[bytes] = ()
    ) -> None:
        """Report the instance's success with ``outputs`` (their wire frame, as an executor
        returns them)."""
        request = storage_pb2.ReportTaskSuccessRequest(
            serialized_outputs=encode_frame(outputs), **self._instance(job_id, task, instance)
        )
        self._call(self._instances.ReportTaskSuccess, request)

    def fail(self, job_id: int, task: int | str, instance: int, error: str) -> None:
        """Report the instance's failure with the message ``error``."""
        request = storage_pb2.ReportTaskFailureRequest(
            error_message=error, **self._instance(job_id, task, instance)
        )
        self._call(self._instances.ReportTaskFailure, request)

    def run(
        self,
        job_id: int,
        task: int | str,
        *,
        outputs: Sequence[bytes] = (),
        error: str | None = None,
    ) -> Any:
        """Register an instance of the task and report it: failed with ``error`` when given, else
        succeeded with ``outputs``. The instance's ``ExecutionContext``."""
        context = self.register(job_id, task)
        if error is not None:
            self.fail(job_id, task, context.task_instance_id, error)
        else:
            self.succeed(job_id, task, context.task_instance_id, outputs)
        return context

    def _instance(self, job_id: int, task: int | str, instance: int) -> dict[str, Any]:
        return {
            "job_id": job_id,
            "task_id": _task_id(task),
            "task_instance_id": instance,
            "execution_manager_id": self.em_id,
            "session_id": self.session_id,
        }

    @staticmethod
    def _call(method: Any, request: Any) -> Any:
        return method(request, timeout=10.0, wait_for_ready=True)


def _task_id(task: int | str) -> common_pb2.TaskId:
    if isinstance(task, int):
        return common_pb2.TaskId(index=task)
    return common_pb2.TaskId(**{task: common_pb2.Void()})


def _task_of(task_id: common_pb2.TaskId) -> int | str:
    kind = task_id.WhichOneof("kind")
    return int(task_id.index) if kind == "index" else str(kind)
