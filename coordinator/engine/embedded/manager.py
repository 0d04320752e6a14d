"""Execution managers: threads that each own one executor process and run one instance at a time.

As Spider's execution manager does (``docs/spider.md``, Job lifecycle): take an assignment, send it
to the executor, wait at most the hard timeout, then report the outcome. On a hard timeout the
executor is killed (SIGKILL) and respawned; a crashed executor is respawned too, so a task cannot
take the engine down. Executors are forked by the engine's fork server (``forkserver``) and die
with it, as it dies with the process hosting the engine; a manager thread never dies of an error
(it logs it and carries on). Once an executor that died with an instance running has been reaped,
the manager says so (``instance_gone``) before it reports the outcome, so the engine can remove
what the instance left.

With ``work_waiting`` (the engine's "is an assignment waiting?", which does not take it), the
executor is started only when there is work, then the assignment is taken: a coordinator with
nothing to run (``run --until-idle``, a restart with every job already ended) pays for no fork
server importing the task packages beside it (issue 14: ~0.3-0.45 s of CPU, on the cores the
coordinator's own start-up needs). The executor is still ready before its instance is assigned,
as Spider's managers are, so neither the instance's soft timeout (counted by the engine from the
assignment) nor its hard timeout counts the executor's start-up; a respawn after a crash or a
hard timeout happens the same way. Without ``work_waiting`` the executor is started with the
thread. Either way, a new executor that dies, or is not ready within
``EXECUTOR_START_TIMEOUT_SECS`` (it is killed then), before an assignment is taken is started
again by the next assignment, and one that does so while an assignment waits for it fails that
instance as a crash (``executor crashed``).
"""

from __future__ import annotations

import logging
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from coordinator import metrics
from coordinator.engine.embedded.forkserver import ForkedExecutor
from coordinator.engine.embedded.protocol import (
    ExecutorGone,
    Reply,
    ReplyTimeout,
    Request,
    executor_crashed,
    hard_timeout_exceeded,
    read_reply,
    write_message,
)

TERMINATION_TASKS = ("commit", "cleanup")
"""The task ids of a job's commit and cleanup tasks (every other task id is a regular task's)."""
EXECUTOR_START_TIMEOUT_SECS = 120.0
"""How long a new executor may take to be forked and to load its task packages before it counts as
crashed (the first one includes the fork server's start-up)."""

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Assignment:
    """One task instance to run."""

    request: Request
    hard_timeout_ms: int
    lose_report: bool = False
    cancelled_meanwhile: bool = False


Spawn = Callable[[float], ForkedExecutor]
"""``ForkServer.spawn``: a new executor, forked within the given seconds."""
NextAssignment = Callable[[float], Assignment | None]
WorkWaiting = Callable[[float], bool]
Report = Callable[[Assignment, Reply], None]
InstanceGone = Callable[[Request], None]


class ExecutionManager(threading.Thread):
    """Runs assignments from ``next_assignment`` in its executor and ``report``s each outcome."""

    def __init__(
        self,
        name: str,
        spawn: Spawn,
        next_assignment: NextAssignment,
        report: Report,
        *,
        instance_gone: InstanceGone | None = None,
        work_waiting: WorkWaiting | None = None,
    ) -> None:
        """``instance_gone``: called with the request of an instance whose executor was killed or
        crashed, once that process is reaped (so nothing of it runs any more). ``work_waiting``:
        waits at most its argument's seconds for an assignment to be waiting, and says whether
        one is, without taking it; given, the executor is started only once one is (module
        docstring)."""
        super().__init__(name=name, daemon=True)
        self._spawn = spawn
        self._next_assignment = next_assignment
        self._report = report
        self._instance_gone = instance_gone
        self._work_waiting = work_waiting
        self._stopping = threading.Event()
        self._process: ForkedExecutor | None = None
        self._start_failed = False
        """A start before any assignment failed: the next assignment starts the executor itself
        (and fails as a crash if it cannot), so a broken executor is not started twice for it."""

    def run(self) -> None:
        """Take, run and report assignments until stopped."""
        try:
            if self._work_waiting is None:
                self._start_before_assignment()
            while not self._stopping.is_set():
                try:
                    self._run_one()
                except Exception:  # never die: the engine would lose a worker for good
                    _log.exception("%s: unexpected error; carrying on", self.name)
                    self._stopping.wait(1.0)
        finally:
            self._discard()

    def _run_one(self) -> None:
        if self._process is None and self._work_waiting is not None and not self._start_failed:
            if not self._work_waiting(0.2):
                return
            self._start_before_assignment()
        assignment = self._next_assignment(0.2)
        if assignment is None:
            return
        reply = self._execute(assignment)
        if not self._stopping.is_set():
            self._report(assignment, reply)

    def _start_before_assignment(self) -> None:
        """Start the executor and wait until it is ready, before an assignment is taken, so the
        instance's timeouts never count the start-up. Never raises: a failure is remembered
        (``_start_failed``) and the executor reaped."""
        try:
            self._executor()
        except (ExecutorGone, OSError):
            self._discard(kill=True)
            self._start_failed = True

    def stop(self) -> None:
        """Stop taking work and kill the executor (its running instance dies with it).

        Only SIGKILL is sent from here; the manager's own thread reaps the process and closes its
        pipes, so no file descriptor is closed under a reader.
        """
        self._stopping.set()
        process = self._process
        if process is not None and process.poll() is None:
            process.kill()

    def _execute(self, assignment: Assignment) -> Reply:
        """Run the instance; its reply (a hard timeout or a crash as Spider reports them).

        Counted by outcome (``clp_coordinator_engine_task_instances_total``), unless the engine
        is closing (its instances are killed then, not ended)."""
        try:
            process = self._executor()
            deadline = time.monotonic() + assignment.hard_timeout_ms / 1000
            write_message(process.stdin, assignment.request)
            reply = read_reply(process.stdout.fileno(), deadline)
        except ReplyTimeout:
            self._discard(kill=True)
            self._gone(assignment.request)
            self._count(assignment.request, "timed_out")
            return Reply(error=hard_timeout_exceeded(assignment.hard_timeout_ms))
        except (ExecutorGone, OSError):
            returncode = self._discard()
            self._gone(assignment.request)
            self._count(assignment.request, "crashed")
            return Reply(error=executor_crashed(returncode))
        self._count(assignment.request, "succeeded" if reply.error is None else "failed")
        return reply

    def _count(self, request: Request, outcome: str) -> None:
        if not self._stopping.is_set():
            task = request.task_id if request.task_id in TERMINATION_TASKS else "regular"
            metrics.ENGINE_TASK_INSTANCES.labels(task, outcome).inc()

    def _gone(self, request: Request) -> None:
        if self._instance_gone is None:
            return
        try:
            self._instance_gone(request)
        except Exception:
            _log.exception("%s: handling the end of a killed instance failed", self.name)

    def _executor(self) -> ForkedExecutor:
        """The running executor, started (and waited for until ready) when there is none.

        Raises ``ExecutorGone`` when a new executor dies before it is ready, when it is not ready
        within ``EXECUTOR_START_TIMEOUT_SECS`` (it is killed then), when the fork server cannot
        fork one, or when the manager is stopping; ``OSError`` when the fork server cannot be
        started at all. The caller reaps it (``_discard``).
        """
        if self._process is None:
            deadline = time.monotonic() + EXECUTOR_START_TIMEOUT_SECS
            process = self._spawn(EXECUTOR_START_TIMEOUT_SECS)
            self._process = process
            if self._stopping.is_set():
                # ``stop`` may have looked for a process before this one was recorded.
                process.kill()
                raise ExecutorGone("the execution manager is stopping")
            try:
                read_reply(process.stdout.fileno(), deadline)
            except ReplyTimeout as error:
                process.kill()
                raise ExecutorGone(f"the executor was not ready in time: {error}") from error
            self._start_failed = False
        return self._process

    def _discard(self, *, kill: bool = False) -> int | None:
        """Reap the executor (killing it first if asked); its exit status, ``None`` for a signal."""
        process, self._process = self._process, None
        if process is None:
            return None
        if kill or self._stopping.is_set():
            process.kill()
        try:
            returncode = process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            returncode = process.wait()
        process.stdin.close()
        process.stdout.close()
        return returncode
