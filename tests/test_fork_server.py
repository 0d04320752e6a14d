"""The executors' fork server (``coordinator.engine.embedded.forkserver``, issue 14): one process
imports the task packages once and forks every executor of an engine.

Each test drives a ``ForkServer`` directly, as an execution manager does: spawn an executor, wait
for its ready reply, send it requests over its pipes, kill it, wait for its exit status. Before
the fork server, every executor was a fresh interpreter started by its manager (the host's
child), paying the start-up imports again each time.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from pydantic import SecretStr

from coordinator.archive_storage import FsArchiveOutput
from coordinator.config.locations import PROJECT_ROOT
from coordinator.engine.embedded.faults import CRASH_EXIT_STATUS
from coordinator.engine.embedded.forkserver import ForkedExecutor, ForkServer
from coordinator.engine.embedded.protocol import (
    ExecutorGone,
    Reply,
    ReplyTimeout,
    Request,
    read_reply,
    write_message,
)
from coordinator.engine.tasks.context import WorkerSettings
from tests.processes import cpu_seconds, is_running, parent_of

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="processes are looked at in /proc"
)

_WAIT_SECS = 60.0


_NO_PIDFD = """
import os


def _refused(pid, flags=0):
    raise PermissionError(1, "Operation not permitted")  # as a seccomp profile refuses it


os.pidfd_open = _refused
"""


@contextmanager
def _fork_server(
    tmp_path: Path, factory: str = "tests.engine_tasks:package", *, pidfd: bool = True
) -> Iterator[ForkServer]:
    settings = WorkerSettings(
        database_url=SecretStr(f"sqlite:///{tmp_path / 'unused.db'}"),
        archive_output=FsArchiveOutput(directory=tmp_path / "archives"),
        staging_directory=tmp_path,
    )
    path = [str(PROJECT_ROOT)]
    if not pidfd:  # the server (and what it forks) starts with ``os.pidfd_open`` refused
        (tmp_path / "no_pidfd").mkdir()
        (tmp_path / "no_pidfd" / "sitecustomize.py").write_text(_NO_PIDFD)
        path.insert(0, str(tmp_path / "no_pidfd"))
    environment = {**os.environ, **settings.to_environment(), "PYTHONPATH": os.pathsep.join(path)}
    server = ForkServer(["--package", f"test={factory}"], environment)
    try:
        yield server
    finally:
        server.close()


def _ready(server: ForkServer) -> ForkedExecutor:
    executor = server.spawn(_WAIT_SECS)
    assert read_reply(executor.stdout.fileno(), time.monotonic() + _WAIT_SECS) == Reply()
    return executor


def _run(executor: ForkedExecutor, task_func: str, *inputs: bytes, **fault: object) -> Reply:
    request = Request(
        package="test",
        task_func=task_func,
        job_id=1,
        task_id="0",
        instance_id=1,
        inputs=list(inputs),
        fault=fault or None,
    )
    write_message(executor.stdin, request)
    return read_reply(executor.stdout.fileno(), time.monotonic() + _WAIT_SECS)


def test_executors_are_forked_by_one_server_that_loaded_the_packages(tmp_path: Path) -> None:
    """Both executors are children of one server, not of this process (before: two fresh
    interpreters, each this process's child); each runs tasks on its own."""
    with _fork_server(tmp_path) as server:
        first, second = _ready(server), _ready(server)
        assert parent_of(first.pid) == parent_of(second.pid) != os.getpid()
        assert Path(f"/proc/{parent_of(first.pid)}/cmdline").read_bytes().split(b"\0")[1:3] == [
            b"-m",
            b"coordinator.engine.embedded",
        ]
        assert _run(first, "echo", b"a") == Reply(outputs=[b"a"])
        assert _run(second, "echo", b"b") == Reply(outputs=[b"b"])
        assert _run(first, "echo", b"c") == Reply(outputs=[b"c"])
        assert first.poll() is None and second.poll() is None


def test_an_executor_reports_its_exit_status_and_its_pipe_ends(tmp_path: Path) -> None:
    """A crash's exit status reaches the host through the server, as ``Popen`` gave it."""
    with _fork_server(tmp_path) as server:
        executor = _ready(server)
        with pytest.raises(ExecutorGone):
            _run(executor, "echo", b"a", kind="crash")
        assert executor.wait(_WAIT_SECS) == CRASH_EXIT_STATUS
        assert executor.poll() == CRASH_EXIT_STATUS


def test_a_killed_executor_is_reported_killed_and_the_server_forks_another(
    tmp_path: Path,
) -> None:
    with _fork_server(tmp_path) as server:
        hung = _ready(server)
        server_pid = parent_of(hung.pid)
        request = Request("test", "sleep", job_id=1, task_id="0", instance_id=1, inputs=[b"3600"])
        write_message(hung.stdin, request)
        with pytest.raises(ReplyTimeout):
            read_reply(hung.stdout.fileno(), time.monotonic() + 0.3)
        with pytest.raises(subprocess.TimeoutExpired):
            hung.wait(0.1)
        hung.kill()
        assert hung.wait(_WAIT_SECS) == -signal.SIGKILL
        assert not is_running(hung.pid)
        hung.kill()  # reported: its pid is no longer signalled (it may be another process's now)
        after = _ready(server)
        assert parent_of(after.pid) == server_pid
        assert _run(after, "echo", b"x") == Reply(outputs=[b"x"])


def test_a_dead_servers_executors_die_and_the_next_spawn_starts_a_new_server(
    tmp_path: Path,
) -> None:
    """SIGKILL the server: its executors die with it and are reported killed, and the next
    spawn works through a new server."""
    with _fork_server(tmp_path) as server:
        executors = [_ready(server), _ready(server)]
        old_server = parent_of(executors[0].pid)
        os.kill(old_server, signal.SIGKILL)
        for executor in executors:
            assert executor.wait(_WAIT_SECS) == -signal.SIGKILL
            assert not is_running(executor.pid)
        replacement = _ready(server)
        assert parent_of(replacement.pid) != old_server
        assert _run(replacement, "echo", b"y") == Reply(outputs=[b"y"])


def test_close_ends_the_server_and_its_executors(tmp_path: Path) -> None:
    with _fork_server(tmp_path) as server:
        executor = _ready(server)
        server_pid = parent_of(executor.pid)
        server.close()
        assert executor.poll() == -signal.SIGKILL  # gone by the time close returns
        assert not is_running(executor.pid) and not is_running(server_pid)
        with pytest.raises(ExecutorGone):
            server.spawn(_WAIT_SECS)


def test_close_reaps_the_executors_so_their_cpu_time_reaches_the_host(tmp_path: Path) -> None:
    """The server reaps its executors before it leaves, so their CPU time (and their clp-s
    runs') is in the host's children's resource usage. Before, the host killed the server as
    soon as it closed it and init reaped the executors: ``coordinator run``'s CPU time left out
    every task. One executor is still running at ``close``, one was killed just before it (as
    the engine's close does: its managers kill their executors, then it closes the server). The
    server's own CPU time (its imports: 0.3-0.6 s) reaches the host either way and is left out."""
    with _fork_server(tmp_path) as server:
        running, killed = _ready(server), _ready(server)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        assert _run(running, "spin", b"0.3") == Reply(outputs=[b"spun"])
        assert _run(killed, "spin", b"0.3") == Reply(outputs=[b"spun"])
        server_own = cpu_seconds(parent_of(running.pid))
        killed.kill()  # not waiting for its exit to be reported
        server.close()
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    spent = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime) - server_own
    assert spent >= 0.6


def test_a_server_that_does_not_fork_in_time_is_killed(tmp_path: Path) -> None:
    """A package module whose import never ends: the server never serves; the spawn gives up
    after its timeout and kills it (the next spawn would start another)."""
    with _fork_server(tmp_path, "tests.hanging_import:package") as server:
        started = time.monotonic()
        with pytest.raises(ExecutorGone, match="did not fork an executor within 1 s"):
            server.spawn(1.0)
        assert time.monotonic() - started < _WAIT_SECS
        stuck = server._server
        assert stuck is not None and stuck.settled.wait(_WAIT_SECS)
        assert stuck.process.returncode == -signal.SIGKILL


def test_without_pidfds_kills_and_exits_are_still_reported(tmp_path: Path) -> None:
    """Where ``pidfd_open`` is refused (an old container runtime's seccomp profile), the server
    forks all the same; the host signals the pid until its exit is reported, and a dead server's
    executors are reported killed once their pids are gone."""
    with _fork_server(tmp_path, pidfd=False) as server:
        hung = _ready(server)
        assert hung._pidfd is None
        request = Request("test", "sleep", job_id=1, task_id="0", instance_id=1, inputs=[b"3600"])
        write_message(hung.stdin, request)
        hung.kill()
        assert hung.wait(_WAIT_SECS) == -signal.SIGKILL
        executors = [_ready(server), _ready(server)]
        assert _run(executors[0], "echo", b"z") == Reply(outputs=[b"z"])
        os.kill(parent_of(executors[0].pid), signal.SIGKILL)
        for executor in executors:
            assert executor.wait(_WAIT_SECS) == -signal.SIGKILL
            assert not is_running(executor.pid)
