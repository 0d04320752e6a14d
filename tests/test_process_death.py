"""Executors die with their coordinator, and leave no scratch directory behind (issue 10).

A real ``coordinator run`` is SIGKILLed while its compress task hangs (a stand-in ``clp-s``, found
first on the executors' ``PYTHONPATH`` as ``yscope_clp_core/bin/clp-s``, sleeps). Before: the
executor processes lived on for as long as the task did, holding database connections. Now each
executor asks the kernel for SIGKILL when its parent dies (``prctl(PR_SET_PDEATHSIG)``) and
watches its parent pid besides. The killed instance's scratch directory (where clp-s writes) was
left for ever; now the next engine on that staging directory removes it when it starts, while a
live instance's directory survives any sweep (``coordinator.engine.tasks.scratch``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from coordinator.config.loader import load_config
from coordinator.config.locations import DATA_DIR_ENV, DATABASE_URL_ENV, PROJECT_ROOT
from coordinator.runtime import open_engine
from coordinator.service.ingest import put_files, submit_job
from tests.processes import children, engine_processes, is_running
from tests.sample_logs import write_json_logs

pytestmark = pytest.mark.slow  # real coordinator processes, SIGKILLed


def _hanging_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, dict[str, str]]:
    """A data directory with one job whose compress task will hang; the environment that makes
    ``coordinator run`` use the stand-in clp-s."""
    monkeypatch.delenv(DATABASE_URL_ENV, raising=False)
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    data_dir = tmp_path / "var"
    config = load_config(None, data_dir=data_dir)
    engine = open_engine(config)
    source = tmp_path / "in" / "app.jsonl"
    write_json_logs(source, 100)
    put_files(config, [source], bucket="logs", prefix="hang/")
    submit_job(config, engine, prefix="hang/", timestamp_key="timestamp")
    engine.dispose()
    fake = tmp_path / "fake" / "yscope_clp_core"
    (fake / "bin").mkdir(parents=True)
    real = Path(importlib.util.find_spec("yscope_clp_core").origin or "").parent  # type: ignore[union-attr]
    (fake / "__init__.py").write_text(  # the real package, but its clp-s is found here first
        f"__path__.append({str(real)!r})\n"
        f"exec(compile(open({str(real / '__init__.py')!r}).read(), __file__, 'exec'))\n"
    )
    (fake / "bin" / "clp-s").write_text("#!/bin/sh\nexec sleep 600\n")
    (fake / "bin" / "clp-s").chmod(0o755)
    environment = {k: v for k, v in os.environ.items() if k not in (DATABASE_URL_ENV, DATA_DIR_ENV)}
    environment["PYTHONPATH"] = os.pathsep.join([str(fake.parent), str(PROJECT_ROOT)])
    return data_dir, environment


def _coordinator(data_dir: Path, environment: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "coordinator", "run", "--data-dir", str(data_dir)],
        env=environment,
        stdout=subprocess.DEVNULL,
        stderr=log.open("w"),
    )


def _hung_task(coordinator: subprocess.Popen[bytes]) -> tuple[list[int], list[int]]:
    """The coordinator's executors with their fork server, and the stand-in clp-s, once the
    compress task hangs in it."""
    deadline = time.monotonic() + 60
    while True:
        assert time.monotonic() < deadline, "the compress task never started"
        assert coordinator.poll() is None, "the coordinator exited"
        servers, forked = engine_processes(coordinator.pid)
        hung = [child for executor in forked for child in children(executor)]
        if hung:
            return servers + forked, hung
        time.sleep(0.2)


def _wait_until_gone(pids: list[int], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while any(is_running(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)


def test_executors_die_with_a_sigkilled_coordinator(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data_dir, environment = _hanging_job(tmp_path, monkeypatch)
    coordinator = _coordinator(data_dir, environment, tmp_path / "coordinator.log")
    executors: list[int] = []
    hung: list[int] = []
    try:
        executors, hung = _hung_task(coordinator)
        assert executors
    finally:
        coordinator.send_signal(signal.SIGKILL)
        coordinator.wait()
    try:
        killed_at = time.monotonic()
        while any(is_running(pid) for pid in executors) and time.monotonic() - killed_at < 5:
            time.sleep(0.05)
        gone_after = time.monotonic() - killed_at
        assert not any(is_running(pid) for pid in executors), "executors outlived their coordinator"
        print(f"{len(executors)} executor(s) gone {gone_after:.2f} s after the SIGKILL")
        # clp-s dies with its executor too (setpriv --pdeathsig), not only the executor.
        while any(is_running(pid) for pid in hung) and time.monotonic() - killed_at < 5:
            time.sleep(0.05)
        assert not any(is_running(pid) for pid in hung), "clp-s outlived its executor"
    finally:
        for pid in hung:  # the stand-in clp-s, the task's own child
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _scratch_directories(staging: Path) -> set[Path]:
    return {path for path in staging.glob("compression-*") if path.is_dir()}


def test_a_sigkilled_coordinators_scratch_directory_is_removed_and_a_live_one_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SIGKILLed instance's directory stays until the next engine on the staging directory
    starts; that one removes it, runs the task again in a new directory, which a sweep by another
    process (another replica's engine) leaves alone while the instance lives, and removes it
    itself when it stops (SIGTERM)."""
    data_dir, environment = _hanging_job(tmp_path, monkeypatch)
    staging = data_dir / "staging"
    unrelated = staging / "default" / "compression-1-0-5-log-paths.txt"  # CLP's layout: not ours
    unrelated.parent.mkdir(parents=True)
    unrelated.write_text("s3://logs/hang/app.jsonl\n")
    stand_ins: list[int] = []
    first = _coordinator(data_dir, environment, tmp_path / "first.log")
    try:
        executors, hung = _hung_task(first)
        stand_ins += hung
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    try:
        _wait_until_gone(executors + hung, 5)
        assert not any(is_running(pid) for pid in executors + hung)
        (left,) = _scratch_directories(staging)  # nobody was there to remove it

        second = _coordinator(data_dir, environment, tmp_path / "second.log")
        try:
            started = time.monotonic()
            while left.exists():
                assert time.monotonic() - started < 30, "the killed instance's directory stayed"
                assert second.poll() is None, "the coordinator exited"
                time.sleep(0.05)
            print(f"the killed instance's directory gone {time.monotonic() - started:.2f} s in")
            _, hung = _hung_task(second)  # the task runs again, in a directory of its own
            stand_ins += hung
            (live,) = _scratch_directories(staging)
            sweep = subprocess.run(
                [
                    sys.executable,
                    "-c",
                    "import sys; from pathlib import Path; "
                    "from coordinator.engine.tasks.scratch import sweep_scratch; "
                    "print(len(sweep_scratch(Path(sys.argv[1]))))",
                    str(staging),
                ],
                check=True,
                capture_output=True,
                text=True,
                cwd=PROJECT_ROOT,
            )
            assert sweep.stdout.strip() == "0" and live.is_dir(), sweep.stderr
        finally:
            second.send_signal(signal.SIGTERM)
            second.wait(timeout=60)
        assert _scratch_directories(staging) == set()
        assert unrelated.read_text() == "s3://logs/hang/app.jsonl\n"
    finally:
        for pid in stand_ins:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
