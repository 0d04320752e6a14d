"""Executors die with their coordinator (issue 10).

A real ``coordinator run`` is SIGKILLed while its compress task hangs (a stand-in ``clp-s``, found
first on the executors' ``PYTHONPATH`` as ``yscope_clp_core/bin/clp-s``, sleeps). Before: the
executor processes lived on for as long as the task did, holding database connections. Now each
executor asks the kernel for SIGKILL when its parent dies (``prctl(PR_SET_PDEATHSIG)``) and
watches its parent pid besides.
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
from coordinator.service.ingest import put_files, submit_job
from coordinator.service.runtime import open_engine
from tests.processes import children, is_running
from tests.sample_logs import write_json_logs


def test_executors_die_with_a_sigkilled_coordinator(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
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
    coordinator = subprocess.Popen(
        [sys.executable, "-m", "coordinator", "run", "--data-dir", str(data_dir)],
        env=environment,
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "coordinator.log").open("w"),
    )
    executors: list[int] = []
    hung: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while not hung:
            assert time.monotonic() < deadline, "the compress task never started"
            assert coordinator.poll() is None, "the coordinator exited"
            executors = children(coordinator.pid)
            hung = [child for executor in executors for child in children(executor)]
            time.sleep(0.2)
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
