"""A task package for engine tests (loaded by executors as ``test=tests.engine_tasks:package``).

Tasks record what they did in files under the worker's staging directory, so tests can see side
effects that happened in executor processes.
"""

from __future__ import annotations

import gc
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path

from coordinator.engine.tasks.context import TaskContext, TaskError
from coordinator.engine.tasks.registry import TaskPackage


def journal(ctx: TaskContext) -> Path:
    """The file where the tasks of ``ctx``'s job record their runs."""
    return ctx.settings.staging_directory / f"journal-{ctx.job_id}.jsonl"


def _record(ctx: TaskContext, **fields: object) -> None:
    line = json.dumps({"task": ctx.task_id, "instance": ctx.instance_id, **fields})
    with journal(ctx).open("a", encoding="utf-8") as file:
        file.write(line + "\n")


def echo(ctx: TaskContext, inputs: Sequence[bytes]) -> list[bytes]:
    _record(ctx, event="echo")
    return list(inputs)


def join(ctx: TaskContext, inputs: Sequence[bytes]) -> list[bytes]:
    _record(ctx, event="join")
    return [b"+".join(inputs)]


def sleep(ctx: TaskContext, inputs: Sequence[bytes]) -> list[bytes]:
    """A task that runs for its input's seconds: a slow task is the subject (hard timeouts, a
    running instance when a test needs one); to act while it runs, use ``wait_for_release``."""
    _record(ctx, event="start")
    time.sleep(float(inputs[0].decode()))
    _record(ctx, event="done")
    return [b"slept"]


def spin(ctx: TaskContext, inputs: Sequence[bytes]) -> list[bytes]:
    """Burns its input's seconds of CPU time: work whose accounting a test can follow."""
    until = time.process_time() + float(inputs[0].decode())
    while time.process_time() < until:
        pass
    return [b"spun"]


def release(staging_directory: Path, job_id: int) -> None:
    """Let the ``wait_for_release`` instances of job ``job_id`` return."""
    (staging_directory / f"release-{job_id}").touch()


def wait_for_release(ctx: TaskContext, inputs: Sequence[bytes]) -> list[bytes]:
    """Runs until the test calls ``release`` (at most 60 s): a task that is surely still running
    when the test acts on it, however slow the machine, and ends when the test says so."""
    _record(ctx, event="start")
    released = ctx.settings.staging_directory / f"release-{ctx.job_id}"
    deadline = time.monotonic() + 60
    while not released.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    _record(ctx, event="done")
    return [b"released"]


def slow_first_run(ctx: TaskContext, inputs: Sequence[bytes]) -> list[bytes]:
    """Hangs on its first run ever (for restart tests); returns at once afterwards."""
    marker = ctx.settings.staging_directory / f"ran-{ctx.job_id}-{ctx.task_id}"
    first = not marker.exists()
    marker.touch()
    _record(ctx, event="start", first=first)
    if first:
        time.sleep(3600)
    return [b"second run"]


def fail(ctx: TaskContext, inputs: Sequence[bytes]) -> list[bytes]:
    _record(ctx, event="fail")
    raise TaskError("boom: the input is unusable")


def crash(ctx: TaskContext, inputs: Sequence[bytes]) -> list[bytes]:
    _record(ctx, event="crash")
    os._exit(3)


def record_commit(ctx: TaskContext, inputs: Sequence[bytes]) -> list[bytes]:
    _record(ctx, event="commit", outputs=[output.decode() for output in ctx.graph_outputs])
    return []


def record_commit_slowly(ctx: TaskContext, inputs: Sequence[bytes]) -> list[bytes]:
    """A commit that waits (up to 30 s) until a second instance of it has started, so that two
    instances surely overlap however slowly the machine starts the second."""
    _record(ctx, event="commit-start")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _started(ctx, "commit-start") < 2:
        time.sleep(0.02)
    return record_commit(ctx, inputs)


def _started(ctx: TaskContext, event: str) -> int:
    # Whole lines only: another instance may be appending one right now.
    lines = journal(ctx).read_text(encoding="utf-8").split("\n")[:-1]
    return sum(1 for line in lines if json.loads(line)["event"] == event)


def collector(ctx: TaskContext, inputs: Sequence[bytes]) -> list[bytes]:
    """Whether the executor's garbage collector runs, whether its start-up was frozen, and the
    command line of the process that started the executor (Linux)."""
    parent = Path(f"/proc/{os.getppid()}/cmdline").read_bytes().decode().split("\0")
    state = {"enabled": gc.isenabled(), "frozen": gc.get_freeze_count(), "parent": parent}
    return [json.dumps(state).encode()]


def record_cleanup(ctx: TaskContext, inputs: Sequence[bytes]) -> list[bytes]:
    _record(ctx, event="cleanup")
    return []


def package() -> TaskPackage:
    """The ``test`` package."""
    return TaskPackage(
        "test",
        {
            "echo": echo,
            "join": join,
            "sleep": sleep,
            "spin": spin,
            "wait_for_release": wait_for_release,
            "slow_first_run": slow_first_run,
            "fail": fail,
            "crash": crash,
            "record_commit": record_commit,
            "record_commit_slowly": record_commit_slowly,
            "record_cleanup": record_cleanup,
            "collector": collector,
        },
    )
