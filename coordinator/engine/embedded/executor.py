"""The task executor: a worker process that runs task instances one at a time.

Executors are forked by the engine's fork server (``forkserver``), which calls ``main`` in each
with the engine's ``--package NAME=module:factory`` arguments. An executor reads framed requests
on stdin and writes framed replies on stdout (``protocol``). Task code may print: the process's
stdout is redirected to stderr, and replies go to a private copy of the original stdout.
The worker's settings come from ``$COORDINATOR_WORKER_SETTINGS`` (``WorkerSettings``). With
``--parent-pid`` it dies with that process (``die_with_parent``): a SIGKILLed coordinator leaves no
executor behind holding database connections.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from typing import IO, Any

from coordinator.engine.embedded.faults import CRASH_EXIT_STATUS
from coordinator.engine.embedded.forkserver import kill_me_with_parent, package_spec
from coordinator.engine.embedded.protocol import (
    Reply,
    Request,
    in_task_failure,
    read_request,
    write_message,
)
from coordinator.engine.tasks.context import TaskContext, TaskError, WorkerSettings
from coordinator.engine.tasks.registry import TaskPackage
from coordinator.store import pool_logs

_log = logging.getLogger("coordinator.executor")


def load_package(spec: str) -> TaskPackage:
    """``NAME=module:factory`` → the package the factory returns; raises ``ValueError``."""
    name, module_name, factory_name = package_spec(spec)
    package = getattr(importlib.import_module(module_name), factory_name)()
    if not isinstance(package, TaskPackage) or package.name != name:
        raise ValueError(f"{module_name}:{factory_name} did not return the task package {name!r}")
    return package


class Executor:
    """Runs requests against the loaded packages."""

    def __init__(self, packages: dict[str, TaskPackage]) -> None:
        self.packages = packages
        self._settings: WorkerSettings | None = None

    def run(self, request: Request) -> Reply:
        """One instance; never raises (a failure is the reply)."""
        fault = request.fault or {}
        if fault.get("kind") == "fail":
            return Reply(error=in_task_failure(str(fault.get("message"))))
        if not fault.get("after_effects"):
            _misbehave(fault)
        try:
            function = self.packages[request.package].function(request.task_func)
        except KeyError as error:
            return Reply(error=in_task_failure(f"cannot load task: {error}"))
        try:
            context = TaskContext(
                job_id=request.job_id,
                task_id=request.task_id,
                instance_id=request.instance_id,
                settings=self._worker_settings(),
                graph_outputs=tuple(request.graph_outputs),
            )
            outputs = function(context, request.inputs)
        except TaskError as error:
            return Reply(error=in_task_failure(str(error)))
        except Exception as error:  # a bug in the task: report it, keep the executor alive
            traceback.print_exc()
            return Reply(error=in_task_failure(f"{type(error).__name__}: {error}"))
        _misbehave(fault)
        return Reply(outputs=outputs)

    def _worker_settings(self) -> WorkerSettings:
        if self._settings is None:
            self._settings = WorkerSettings.from_environment()
        return self._settings


def _misbehave(fault: dict[str, Any]) -> None:
    kind = fault.get("kind")
    if kind == "hard_timeout":
        while True:  # until the execution manager kills this process
            time.sleep(3600)
    if kind == "crash":
        os._exit(CRASH_EXIT_STATUS)


PARENT_POLL_SECS = 0.5


def die_with_parent(parent_pid: int) -> None:
    """Exit (SIGKILL) as soon as the parent (the executors' fork server) is gone, even mid-task.

    On Linux the kernel does it (``forkserver.kill_me_with_parent``); everywhere, a daemon thread
    also watches the parent pid (a task blocked in C code still dies of the signal).
    """
    kill_me_with_parent(parent_pid)

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(PARENT_POLL_SECS)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def configure_logging() -> None:
    """Log to stderr (the manager passes it on), a pool's record of a connection an outage
    dropped as one warning line: an outage drops pooled connections under a task too."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    pool_logs.install(logging.getLogger().handlers)


def main(argv: Sequence[str] | None = None) -> int:
    """Serve requests until stdin closes (or the parent dies)."""
    parser = argparse.ArgumentParser(prog="coordinator-executor")
    parser.add_argument("--package", action="append", default=[], metavar="NAME=module:factory")
    parser.add_argument("--parent-pid", type=int, default=None)
    args = parser.parse_args(argv)
    if args.parent_pid is not None:
        die_with_parent(args.parent_pid)
    configure_logging()
    packages = {package.name: package for package in map(load_package, args.package)}
    replies: IO[bytes] = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # whatever tasks print goes to stderr, never into the reply stream
    sys.stdout = sys.stderr
    executor = Executor(packages)
    # Ready: imports are done. The manager waits for this before it sends the instance that made
    # it start this executor, so that a task's hard timeout never counts the executor's start-up.
    write_message(replies, Reply())
    while (request := read_request(sys.stdin.buffer)) is not None:
        write_message(replies, executor.run(request))
    return 0
