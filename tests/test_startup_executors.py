"""Execution managers given ``work_waiting`` start their executor only when work waits (start-up
time, issue 14).

An engine with nothing to run (``coordinator run --until-idle`` with no job) starts no executor
process; when an assignment waits, the manager starts its executor, waits until it is ready, and
only then takes the assignment (so neither timeout counts the start-up). A new executor that dies,
or is not ready in time, fails the instance that waits for it as a crash. Each test drives one
``ExecutionManager`` directly, with ``next_assignment``, ``work_waiting`` and ``report`` of its
own; executor processes are found in ``/proc`` by a marker in their environment.
"""

from __future__ import annotations

import json
import os
import queue
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from pydantic import SecretStr
from sqlalchemy import Engine

from coordinator.archive_storage import FsArchiveOutput
from coordinator.config.locations import PROJECT_ROOT
from coordinator.engine.embedded import manager as manager_module
from coordinator.engine.embedded.forkserver import ForkServer
from coordinator.engine.embedded.manager import Assignment, ExecutionManager
from coordinator.engine.embedded.protocol import Reply, Request
from coordinator.engine.tasks.context import WorkerSettings
from coordinator.engine.tasks.registry import TaskPackage
from coordinator.spider.port import JobState
from tests.engine_support import graph, running_engine, submit, task, wait_for
from tests.engine_tasks import package

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="executor processes are found in /proc"
)

_MARKER = "COORDINATOR_TEST_EXECUTOR_MARKER"
_WAIT_SECS = 60.0


def slow_package() -> TaskPackage:
    """The ``test`` package, ready only after 3 s (longer than the hard timeout used below)."""
    time.sleep(3)
    return package()


def hanging_package() -> TaskPackage:
    """Never ready: the executor hangs while it loads its packages."""
    time.sleep(3600)
    return package()


def broken_package() -> TaskPackage:
    """The executor dies while it loads its packages."""
    raise RuntimeError("this package cannot be loaded")


def _executors(marker: str) -> list[int]:
    """The live executors whose environment carries ``marker``: the processes that carry it and
    whose parent does too (the fork server that forked them; it carries it, its parent not)."""
    marked: dict[int, int] = {}  # pid → parent pid
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environment = (entry / "environ").read_bytes()
            state, parent = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:2]
        except OSError:
            continue
        if f"{_MARKER}={marker}".encode() in environment.split(b"\0") and state != "Z":
            marked[int(entry.name)] = int(parent)
    return sorted(pid for pid, parent in marked.items() if parent in marked)


class _Driver:
    """``next_assignment``, ``work_waiting`` and ``report`` for one manager: hands out
    ``assignments`` in order, then ``None``; counts the looks for work that found none, notes the
    executors alive when each assignment was taken, and collects the replies."""

    def __init__(self, marker: str, *assignments: Assignment) -> None:
        self._marker = marker
        self._assignments = list(assignments)
        self._lock = threading.Lock()
        self._empty_looks = 0
        self.idle = threading.Event()
        """Set once three looks for work found none."""
        self.executors_when_taken: list[list[int]] = []
        self.replies: queue.Queue[tuple[Assignment, Reply]] = queue.Queue()

    def _found_none(self, timeout: float) -> None:
        with self._lock:
            self._empty_looks += 1
            if self._empty_looks >= 3:
                self.idle.set()
        time.sleep(min(timeout, 0.05))

    def work_waiting(self, timeout: float) -> bool:
        with self._lock:
            if self._assignments:
                return True
        self._found_none(timeout)
        return False

    def next_assignment(self, timeout: float) -> Assignment | None:
        with self._lock:
            if self._assignments:
                self.executors_when_taken.append(_executors(self._marker))
                return self._assignments.pop(0)
        self._found_none(timeout)
        return None

    def report(self, assignment: Assignment, reply: Reply) -> None:
        self.replies.put((assignment, reply))


def _echo(job_id: int = 1, *, hard_timeout_ms: int = 60_000) -> Assignment:
    request = Request(
        package="test",
        task_func="echo",
        job_id=job_id,
        task_id="0",
        instance_id=job_id,
        inputs=[b"hello"],
    )
    return Assignment(request, hard_timeout_ms)


@contextmanager
def _manager(
    tmp_path: Path, *assignments: Assignment, factory: str = "tests.engine_tasks:package"
) -> Iterator[tuple[_Driver, str]]:
    """A running manager (with ``work_waiting``) whose executor loads ``test=factory``, and that
    is handed ``assignments``; its driver and marker."""
    marker = uuid.uuid4().hex
    driver = _Driver(marker, *assignments)
    settings = WorkerSettings(
        database_url=SecretStr(f"sqlite:///{tmp_path / 'unused.db'}"),
        archive_output=FsArchiveOutput(directory=tmp_path / "archives"),
        staging_directory=tmp_path,
    )
    environment = {
        **os.environ,
        **settings.to_environment(),
        "PYTHONPATH": str(PROJECT_ROOT),
        _MARKER: marker,
    }
    fork_server = ForkServer(["--package", f"test={factory}"], environment)
    manager = ExecutionManager(
        "spider-em-test",
        fork_server.spawn,
        driver.next_assignment,
        driver.report,
        work_waiting=driver.work_waiting,
    )
    manager.start()
    try:
        yield driver, marker
    finally:
        manager.stop()
        manager.join(timeout=30)
        fork_server.close()
    assert not manager.is_alive()
    assert _executors(marker) == [], "the stopped manager left its executor running"


def test_no_executor_process_is_started_while_nothing_is_assigned(tmp_path: Path) -> None:
    with _manager(tmp_path) as (driver, marker):
        assert driver.idle.wait(_WAIT_SECS)
        # Before, the executor was started (and waited for) before the first look for work.
        assert _executors(marker) == []


def test_the_first_assignment_waits_for_a_started_executor_and_runs(tmp_path: Path) -> None:
    with _manager(tmp_path, _echo(1), _echo(2)) as (driver, marker):
        for job_id in (1, 2):
            assignment, reply = driver.replies.get(timeout=_WAIT_SECS)
            assert assignment.request.job_id == job_id
            assert reply == Reply(outputs=[b"hello"])
        assert driver.idle.wait(_WAIT_SECS)
        executors = _executors(marker)
    assert len(executors) == 1
    # Started before the first assignment was taken (its soft timeout counts from then), and
    # kept for the next one.
    assert driver.executors_when_taken == [executors, executors]


def test_the_hard_timeout_does_not_count_the_executor_start_up(tmp_path: Path) -> None:
    """The executor needs 3 s to be ready; the instance's hard timeout is 1.5 s, counted from
    when the executor is ready, so the instance succeeds."""
    factory = f"{__name__}:slow_package"
    with _manager(tmp_path, _echo(hard_timeout_ms=1_500), factory=factory) as (driver, _):
        _, reply = driver.replies.get(timeout=_WAIT_SECS)
    assert reply == Reply(outputs=[b"hello"])


def test_an_executor_that_dies_before_it_is_ready_fails_the_waiting_assignment_as_a_crash(
    tmp_path: Path,
) -> None:
    factory = f"{__name__}:broken_package"
    with _manager(tmp_path, _echo(1), _echo(2), factory=factory) as (driver, _):
        for _ in range(2):  # each assignment starts a new executor, which dies again
            _, reply = driver.replies.get(timeout=_WAIT_SECS)
            assert reply == Reply(error="executor crashed (exit_status = Some(1))")


def test_an_executor_not_ready_in_time_is_killed_and_fails_the_waiting_assignment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(manager_module, "EXECUTOR_START_TIMEOUT_SECS", 1.0)
    factory = f"{__name__}:hanging_package"
    with _manager(tmp_path, _echo(), factory=factory) as (driver, marker):
        _, reply = driver.replies.get(timeout=_WAIT_SECS)
        assert reply == Reply(error="executor crashed (exit_status = None)")  # SIGKILLed
        assert _executors(marker) == []


def test_an_embedded_engine_with_nothing_to_run_starts_no_executor(
    migrated_engine: Engine, tmp_path: Path
) -> None:
    """The engine wires ``work_waiting`` into its managers: started with nothing to run (a
    ``run --until-idle`` with nothing to do), it starts no executor process; the first job's
    task still runs."""
    with running_engine(migrated_engine, tmp_path) as spider:
        time.sleep(0.5)  # a manager started its executor at once, before the engine waited
        assert all(manager._process is None for manager in spider._managers)
        group = spider.add_resource_group("startup", b"secret")
        job_id = submit(spider, group, graph(task("echo")), [b"hello"])
        spider.start_job(job_id)
        assert wait_for(spider, job_id, JobState.SUCCEEDED) is JobState.SUCCEEDED


def test_an_executor_starts_with_the_collector_paused_and_runs_tasks_with_it(
    migrated_engine: Engine, tmp_path: Path
) -> None:
    """Executors are forked by ``python -m coordinator.engine.embedded`` (the fork server),
    which pauses the cyclic garbage collector for the imports (about a quarter of the start-up's
    CPU, issue 14), then freezes what it loaded and resumes the collector: its executors run
    tasks with the collector on and the start-up left out of it."""
    with running_engine(migrated_engine, tmp_path, workers=1) as spider:
        group = spider.add_resource_group("startup", b"secret")
        job_id = submit(spider, group, graph(task("collector"), commit=False), [b""])
        spider.start_job(job_id)
        assert wait_for(spider, job_id, JobState.SUCCEEDED) is JobState.SUCCEEDED
        [state] = [json.loads(output) for output in spider.get_job_outputs(job_id)]
    assert state["parent"][1:3] == ["-m", "coordinator.engine.embedded"]
    assert state["enabled"] is True
    assert state["frozen"] > 10_000  # the task packages' objects, left out of later collections
