"""``coordinator run`` imports the monitoring server only with a metrics port (start-up time,
issue 14), checked without timing: the modules a fresh process holds after the command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from coordinator.config.locations import CONFIG_ENV, DATA_DIR_ENV, DATABASE_URL_ENV

MONITORING = ("coordinator.service.monitoring", "coordinator.service.health")

_REPORT = """
import json, runpy, sys
names = json.loads(sys.argv[2])
sys.argv = ["coordinator", *json.loads(sys.argv[1])]
try:
    runpy.run_module("coordinator", run_name="__main__")
except SystemExit as exit:
    code = exit.code
else:
    code = 0
loaded = sorted(name for name in names if name in sys.modules)
print("IMPORTED " + json.dumps([code, loaded]), file=sys.stderr)
"""


def _run_imports(*argv: str) -> tuple[object, set[str]]:
    """The exit code of ``coordinator *argv`` and which of ``MONITORING`` it imported."""
    environment = {
        name: value
        for name, value in os.environ.items()
        if name not in {CONFIG_ENV, DATA_DIR_ENV, DATABASE_URL_ENV}
    }
    finished = subprocess.run(
        [sys.executable, "-c", _REPORT, json.dumps(argv), json.dumps(MONITORING)],
        capture_output=True,
        text=True,
        env=environment,
        timeout=120,
        check=False,
    )
    lines = [line for line in finished.stderr.splitlines() if line.startswith("IMPORTED ")]
    assert lines, finished.stderr
    code, imported = json.loads(lines[-1].removeprefix("IMPORTED "))
    return code, set(imported)


def test_run_without_a_metrics_port_does_not_import_the_monitoring_server(tmp_path: Path) -> None:
    code, imported = _run_imports("--data-dir", str(tmp_path / "data"), "run", "--until-idle")
    assert code == 0
    assert imported == set()


def test_run_with_a_metrics_port_imports_the_monitoring_server(tmp_path: Path) -> None:
    config = tmp_path / "coordinator.yaml"
    config.write_text(
        "coordinator:\n"
        "  legacy_scheduler: absent\n"
        f"  data_dir: {tmp_path / 'data'}\n"
        "  metrics_port: 0\n"
        "  metrics_host: 127.0.0.1\n"
    )
    code, imported = _run_imports("--config", str(config), "run", "--until-idle")
    assert code == 0
    assert imported == set(MONITORING)
