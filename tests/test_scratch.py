"""Scratch directories of killed task instances are removed, and only theirs (issue 10).

Real processes hold the directories: a sweep tells a dead instance's directory from a live one's
by the lock the live process holds (``coordinator.engine.tasks.scratch``). The engine test runs the
real compress task with a stand-in clp-s that hangs, so the engine kills one instance at its hard
timeout while a duplicate of the same task still runs.
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import SecretStr
from sqlalchemy import Engine

from coordinator.archive_storage import FsArchiveOutput
from coordinator.config.locations import PROJECT_ROOT, local_store_endpoint
from coordinator.engine.embedded.engine import EmbeddedSpider
from coordinator.engine.tasks import scratch
from coordinator.engine.tasks.context import WorkerSettings
from coordinator.engine.tasks.scratch import (
    MAKING_ABANDONED_AFTER_SECS,
    MAKING_PREFIX,
    SCRATCH_NAME,
    create_scratch,
    remove_scratch,
    scratch_prefix,
    sweep_scratch,
)
from coordinator.spider.policy import ExecutionPolicy, TimeoutPolicy, commit_task_policy
from coordinator.spider.port import JobState
from coordinator.spider.task_graph import build_compression_job
from coordinator.store import migrate
from coordinator.store.database import create_database_engine
from coordinator.task_io import ClpSCompressionOption, DefaultAuthentication, S3InputSource
from tests.engine_support import wait_for
from tests.processes import is_running
from tests.sample_logs import write_json_logs

HOLDER = """
import os, sys, time
from pathlib import Path
from coordinator.engine.tasks.scratch import create_scratch
path = create_scratch(Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4]))
(path / "partial-archive").write_bytes(b"x" * 4096)
print(path, flush=True)
if sys.argv[5] == "die":
    os._exit(0)  # gone without removing it, as a SIGKILLed instance
time.sleep(600)
"""


def _holder(staging: Path, job: int, task: str, instance: int, *, die: bool) -> tuple[Path, int]:
    """A process that made a scratch directory (and died, or holds it); the path and its pid."""
    mode = "die" if die else "live"
    process = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(staging), str(job), task, str(instance), mode],
        cwd=PROJECT_ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    path = Path(process.stdout.readline().strip())
    if die:
        process.wait(timeout=30)
    return path, process.pid


def _unrelated(staging: Path, outside: Path) -> dict[str, str]:
    """Entries a sweep must never touch: CLP's layout, look-alikes, a symlink, other files."""
    (staging / "default").mkdir(parents=True)
    (staging / "default" / "compression-1-0-5-log-paths.txt").write_text("s3://b/k\n")
    (staging / "compression-1-0-5-log-paths.txt").write_text("s3://b/k\n")
    (staging / "compression-2-0-6-abcdefgh").write_text("a file, not a directory")
    (staging / "compression-x-0-7-abcdefgh").mkdir()
    (staging / "compression-x-0-7-abcdefgh" / "kept").write_text("not a job id")
    (staging / "compression-3-0-8").mkdir()  # no suffix
    (staging / "journal-1.jsonl").write_text("{}\n")
    outside.mkdir()
    (outside / "precious").write_text("outside the staging directory")
    (staging / "compression-4-0-9-abcdefgh").symlink_to(outside, target_is_directory=True)
    return _snapshot(staging, outside)


def _is_scratch(path: Path) -> bool:
    return bool(SCRATCH_NAME.fullmatch(path.name)) and path.is_dir() and not path.is_symlink()


def _snapshot(*roots: Path) -> dict[str, str]:
    """Every entry under ``roots`` but scratch directories and their content, with its content."""
    found = {}
    for root in roots:
        for path in sorted(root.rglob("*")):
            if any(_is_scratch(p) for p in (path, *path.parents) if p.parent == root):
                continue
            kind = "link" if path.is_symlink() else "dir" if path.is_dir() else path.read_text()
            found[str(path)] = kind
    return found


def test_a_sweep_removes_the_directories_of_dead_instances_and_nothing_else(
    tmp_path: Path,
) -> None:
    staging, outside = tmp_path / "staging", tmp_path / "outside"
    staging.mkdir()
    unrelated = _unrelated(staging, outside)
    dead, _ = _holder(staging, 7, "0", 100, die=True)
    live, live_pid = _holder(staging, 7, "0", 101, die=False)  # a second instance of the task
    other_task, other_pid = _holder(staging, 7, "1", 102, die=False)
    own = create_scratch(staging, 8, "0", 103)  # held by this very process
    try:
        assert dead.name.startswith(scratch_prefix(7, "0", 100)) and dead.parent == staging
        assert all(path.is_dir() for path in (dead, live, other_task, own))

        assert sweep_scratch(staging, instance=(7, "0", 101)) == []  # alive
        assert sweep_scratch(staging) == [dead]
        assert not dead.exists()
        for _ in range(20):  # sweeps of other replicas, again and again
            assert sweep_scratch(staging) == []
        assert all(path.is_dir() for path in (live, other_task, own))
        (live / "more").write_text("the live instance still writes here")
        assert _snapshot(staging, outside) == unrelated

        os.kill(live_pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while is_running(live_pid):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert sweep_scratch(staging, instance=(7, "1", 102)) == []  # only that instance: alive
        assert sweep_scratch(staging) == [live]
        assert other_task.is_dir() and own.is_dir()
        remove_scratch(own)
        assert not own.exists()
        assert _snapshot(staging, outside) == unrelated
    finally:
        for pid in (live_pid, other_pid):
            if is_running(pid):
                os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while is_running(other_pid):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert sweep_scratch(staging) == [other_task]
    assert _snapshot(staging, outside) == unrelated


def test_a_sweep_in_the_moment_between_mkdtemp_and_the_lock_leaves_the_directory_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another replica's whole sweep lands right after ``mkdtemp``, before the instance locked its
    new directory: the directory is not under a scratch name yet, so the sweep leaves it, and the
    instance uses the first directory it made, under its scratch name and locked."""
    staging = tmp_path / "staging"
    made: list[Path] = []
    mkdtemp = tempfile.mkdtemp

    def mkdtemp_then_sweep(prefix: str, dir: Path) -> str:
        path = mkdtemp(prefix=prefix, dir=dir)
        made.append(Path(path))
        assert sweep_scratch(staging) == []
        return path

    monkeypatch.setattr(scratch.tempfile, "mkdtemp", mkdtemp_then_sweep)
    path = create_scratch(staging, 1, "0", 1)
    assert len(made) == 1 and not made[0].exists()
    assert path.parent == staging and path.name == made[0].name.removeprefix(MAKING_PREFIX)
    assert SCRATCH_NAME.fullmatch(path.name) and path.is_dir()
    assert sweep_scratch(staging) == []  # locked under its scratch name
    remove_scratch(path)
    assert list(staging.iterdir()) == []


def test_a_directory_left_under_its_making_name_is_swept_once_abandoned(tmp_path: Path) -> None:
    """A maker killed between ``mkdtemp`` and the rename leaves its directory under the making
    name: a whole sweep leaves it while it could still be in the making, removes it once it is
    older than that, and never while it is locked; the sweep of its (ended) instance at once."""
    staging = tmp_path / "staging"
    staging.mkdir()

    def making(task: str, instance: int) -> Path:
        """A directory left as ``create_scratch``'s ``mkdtemp`` makes it, before the rename."""
        prefix = MAKING_PREFIX + scratch_prefix(4, task, instance)
        return Path(tempfile.mkdtemp(prefix=prefix, dir=staging))

    young, old, held, ended = making("0", 40), making("0", 41), making("0", 42), making("1", 43)
    (staging / ".compression-x-0-44-abcdefgh").mkdir()  # not a making name: never touched
    abandoned = time.time() - MAKING_ABANDONED_AFTER_SECS - 5
    for path in (old, held):
        os.utime(path, (abandoned, abandoned))
    descriptor = os.open(held, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        assert sweep_scratch(staging) == [old]
        assert sweep_scratch(staging, instance=(4, "1", 43)) == [ended]
        assert young.is_dir() and held.is_dir()
    finally:
        os.close(descriptor)
    assert sweep_scratch(staging) == [held]
    assert sweep_scratch(staging, instance=(4, "0", 40)) == [young]
    assert sorted(p.name for p in staging.iterdir()) == [".compression-x-0-44-abcdefgh"]


def test_a_directory_swept_before_its_creator_locked_it_is_never_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Should a sweep still take a just-made directory (its maker was stopped past the abandon
    age, or the sweep is its instance's), the creator makes another one rather than use a
    directory it does not hold (the sweep holds its lock, or has removed it already)."""
    staging = tmp_path / "staging"
    made: list[Path] = []
    sweeping: list[int] = []
    mkdtemp = tempfile.mkdtemp

    def mkdtemp_then_sweep(prefix: str, dir: Path) -> str:
        path = mkdtemp(prefix=prefix, dir=dir)
        made.append(Path(path))
        if len(made) == 1:  # a sweep has locked it and is about to remove it
            descriptor = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            sweeping.append(descriptor)
        elif len(made) == 2:  # a sweep has removed it already
            assert sweep_scratch(staging, instance=(1, "0", 1)) == [Path(path)]
        return path

    monkeypatch.setattr(scratch.tempfile, "mkdtemp", mkdtemp_then_sweep)
    path = create_scratch(staging, 1, "0", 1)
    assert path.name == made[2].name.removeprefix(MAKING_PREFIX)
    assert path.is_dir() and not made[2].exists()
    assert not made[1].exists()
    os.close(sweeping[0])
    assert sweep_scratch(staging, instance=(1, "0", 1)) == [made[0]]  # its sweep was interrupted
    assert sweep_scratch(staging) == []
    remove_scratch(path)
    assert list(staging.iterdir()) == []


@pytest.fixture
def sqlite_engine(tmp_path: Path) -> Iterator[Engine]:
    engine = create_database_engine(f"sqlite:///{tmp_path}/coordinator.db")
    migrate.upgrade(engine)
    yield engine
    engine.dispose()


@pytest.mark.slow
def test_the_engine_removes_the_directory_of_an_instance_it_kills_and_no_other(
    sqlite_engine: Engine, tmp_path: Path
) -> None:
    """Instance A of a compress task hangs in clp-s; past the soft timeout a duplicate B starts;
    at A's hard timeout the engine kills A and fails the job. A's directory is gone by the time the
    failure is reported, B's stays while B runs (and sweeps meanwhile leave both alone), and goes
    once the engine kills B too. Unrelated files in the staging directory stay."""
    staging, objects = tmp_path / "staging", tmp_path / "objects"
    unrelated = _unrelated(staging, tmp_path / "outside")
    write_json_logs(objects / "logs" / "app.jsonl", 50)
    clp_s = tmp_path / "fake-clp-s"
    clp_s.write_text("#!/bin/sh\nexec sleep 600\n")
    clp_s.chmod(0o755)
    settings = WorkerSettings(
        database_url=SecretStr(sqlite_engine.url.render_as_string(hide_password=False)),
        archive_output=FsArchiveOutput(directory=tmp_path / "archives"),
        staging_directory=staging,
        object_store_directory=objects,
        clp_s_path=clp_s,
    )
    submission = build_compression_job(
        [
            S3InputSource(
                endpoint_url=local_store_endpoint(objects),
                bucket="logs",
                aws_authentication=DefaultAuthentication(),
                object_keys=["app.jsonl"],
            )
        ],
        ClpSCompressionOption(
            target_encoded_size=1 << 20,
            compression_level=3,
            timestamp_key="timestamp",
            unstructured=False,
        ),
        None,
        compression_task_max_retry=0,
        commit_policy=commit_task_policy(0, 10, 20),
        cleanup_task=False,
    )
    hung = ExecutionPolicy(0, 2, TimeoutPolicy(soft_timeout_ms=2_000, hard_timeout_ms=5_000))
    graph = dataclasses.replace(
        submission.task_graph,
        tasks=(dataclasses.replace(submission.task_graph.tasks[0], execution_policy=hung),),
    )
    submission = dataclasses.replace(submission, task_graph=graph)

    with EmbeddedSpider(sqlite_engine, settings, workers=2) as spider:
        group = spider.add_resource_group("rg", b"rg")
        job = spider.register_job(
            group, submission.compressed_task_graph(), submission.compressed_inputs()
        )
        spider.start_job(job)

        def directories() -> list[Path]:
            """The task's scratch directories, by instance id."""
            found = [
                p
                for p in staging.iterdir()
                if p.name.startswith(f"compression-{job}-0-") and _is_scratch(p)
            ]
            return sorted(found, key=lambda p: int(p.name.split("-")[3]))

        deadline = time.monotonic() + 30
        while len(directories()) < 2:
            assert time.monotonic() < deadline, f"two instances never ran: {directories()}"
            assert sweep_scratch(staging) == []  # another replica's sweep: both are alive
            time.sleep(0.05)
        first, duplicate = directories()
        assert wait_for(spider, job, JobState.FAILED, timeout=30) is JobState.FAILED
        assert "hard timeout (5000 ms) exceeded" in spider.get_job_error(job)
        assert not first.exists(), "the killed instance's scratch directory is still there"
        assert directories() == [duplicate], "the live duplicate's directory was removed"
        assert sweep_scratch(staging) == []
        deadline = time.monotonic() + 15
        while duplicate.exists():  # killed at its own hard timeout, ~2 s later
            assert time.monotonic() < deadline, "the duplicate's directory stayed"
            time.sleep(0.05)
    assert directories() == []
    assert _snapshot(staging, tmp_path / "outside") == unrelated
