"""Two processes: ``coordinator spider serve`` and a coordinator pointed at it by its ``spider``
section, talking Spider's gRPC protocol, as with a Spider cluster.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.sample_logs import write_json_logs

pytestmark = pytest.mark.slow  # a real coordinator spider serve process


def _coordinator(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "coordinator", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def test_a_job_runs_through_coordinator_spider_serve(tmp_path: Path, database_url: str) -> None:
    data_dir = tmp_path / "var"
    env = {k: v for k, v in os.environ.items() if not k.startswith("COORDINATOR_")}
    env["COORDINATOR_DATABASE_URL"] = (
        f"sqlite:///{data_dir / 'coordinator.db'}"
        if database_url.startswith("sqlite")
        else database_url
    )
    data_dir.mkdir()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "coordinator",
            "spider",
            "serve",
            "--port",
            "0",
            "--data-dir",
            str(data_dir),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        banner = server.stdout.readline()
        assert "listening on 127.0.0.1:" in banner, server.stderr.read() if server.stderr else ""
        port = int(banner.rsplit(":", 1)[1])
        config = tmp_path / "clp-config.yaml"
        config.write_text(
            "package: {storage_engine: clp-s}\n"
            f"spider: {{host: 127.0.0.1, port: {port}}}\n"
            "compression_coordinator: {result_polling: {init_backoff_millisecs: 50, "
            "max_backoff_millisecs: 200}}\n"
            "archive_output: {storage: {type: fs, directory: archives}}\n"
            f"coordinator: {{data_dir: {data_dir}}}\n"
        )
        common = ["--config", str(config)]
        path = tmp_path / "in" / "app.jsonl"
        write_json_logs(path, 2000)
        submitted = _coordinator(
            "submit", str(path), "--timestamp-key", "timestamp", *common, env=env
        )
        assert submitted.returncode == 0, submitted.stderr
        job_id = submitted.stdout.strip()

        ran = _coordinator("run", "--until-idle", *common, env=env)
        assert ran.returncode == 0, ran.stderr
        shown = _coordinator("show", job_id, "--json", *common, env=env)
        document = json.loads(shown.stdout)
        assert document["status"] == "Succeeded", document
        assert [h["trigger"] for h in document["history"]] == [
            "submitted",
            "committed",
            "finalised",
        ]
        (archive,) = document["archives"]
        assert Path(archive["location"]).is_file()
        assert Path(archive["location"]).parent == data_dir / "archives" / "default"
    finally:
        server.send_signal(signal.SIGTERM)
        _, errors = server.communicate(timeout=60)
    assert server.returncode == 0, errors
