"""The command line on the embedded default: demo, submit, run, jobs, show, cancel, db, errors."""

from __future__ import annotations

import gc
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from coordinator.cli.main import main
from coordinator.config.locations import DATA_DIR_ENV, DATABASE_URL_ENV
from coordinator.store import migrate
from coordinator.store.database import create_database_engine
from tests.sample_logs import write_json_logs


@pytest.fixture(autouse=True)
def _embedded_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DATABASE_URL_ENV, raising=False)
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    capsys.readouterr()
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.slow
def test_demo_runs_a_whole_job_from_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data_dir = tmp_path / "fresh" / "var"
    assert main(["demo", "--data-dir", str(data_dir)]) == 0
    out = capsys.readouterr().out
    assert "Pending -> Running  [submitted by coordinator]" in out
    assert "Running -> Committed  [committed by commit_task]" in out
    assert "Job 1: Succeeded" in out
    assert re.search(r"compress tasks done: (\d+)/\1\n", out), out
    assert "Compression ratio:" in out
    assert "Search 'level: \"ERROR\"' -> {" in out and '"level": "ERROR"' in out
    document = _json(capsys, "show", "1", "--json", "--data-dir", str(data_dir))
    assert document["status"] == "Succeeded"
    assert document["archives"] and all(Path(a["location"]).is_file() for a in document["archives"])


@pytest.mark.slow
def test_submit_run_show(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = ["--data-dir", str(tmp_path / "var")]
    files = []
    for name in ("web", "db"):
        path = tmp_path / "in" / f"{name}.jsonl"
        write_json_logs(path, 2000, service=name)
        files.append(str(path))
    assert (
        main(
            [
                "submit",
                *files,
                "--prefix",
                "batch/",
                "--dataset",
                "prod",
                "--timestamp-key",
                "timestamp",
                *data,
            ]
        )
        == 0
    )
    job_id = int(capsys.readouterr().out.strip())
    listed = _json(capsys, "jobs", "--json", *data)
    assert [(row["id"], row["status"]) for row in listed] == [(job_id, "Pending")]

    assert main(["run", "--until-idle", *data]) == 0
    document = _json(capsys, "show", str(job_id), "--json", *data)
    assert document["status"] == "Succeeded" and document["status_msg"] == ""
    assert document["dataset"] == "prod"
    assert [h["trigger"] for h in document["history"]] == ["submitted", "committed", "finalised"]
    assert [h["actor"] for h in document["history"]] == [
        "coordinator",
        "commit_task",
        "coordinator",
    ]
    assert {"from", "to", "trigger", "actor", "reason", "at"} <= set(document["history"][0])
    (archive,) = document["archives"]
    assert {"id", "size", "uncompressed_size", "location"} <= set(archive)
    assert archive["uncompressed_size"] > archive["size"] > 0
    assert Path(archive["location"]).parent == tmp_path / "var" / "archives" / "prod"

    assert main(["show", str(job_id), *data]) == 0
    text = capsys.readouterr().out
    assert f"Job {job_id}: Succeeded" in text and "finalised by coordinator" in text


def test_cancel_kills_a_pending_job_nobody_holds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = ["--data-dir", str(tmp_path / "var")]
    write_json_logs(tmp_path / "in" / "a.jsonl", 10)
    assert main(["submit", str(tmp_path / "in" / "a.jsonl"), *data]) == 0
    job_id = int(capsys.readouterr().out.strip())
    assert main(["cancel", str(job_id), *data]) == 0
    assert "killed" in capsys.readouterr().out
    document = _json(capsys, "show", str(job_id), "--json", *data)
    assert document["status"] == "Killed" and document["cancel_requested"]
    assert [(h["trigger"], h["actor"]) for h in document["history"]] == [("cancelled", "operator")]
    assert main(["cancel", str(job_id), *data]) == 0
    assert "already Killed" in capsys.readouterr().out


def test_errors_are_clear(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = ["--data-dir", str(tmp_path / "var")]
    assert main(["cancel", "99", *data]) == 1
    assert "no database at" in capsys.readouterr().err
    assert not (tmp_path / "var").exists()  # cancelling never creates a database
    assert main(["db", "upgrade", *data]) == 0
    assert main(["cancel", "99", *data]) == 1
    assert "no compression job 99" in capsys.readouterr().err
    assert main(["submit", "--prefix", "nothing/", *data]) == 1
    assert "no objects under logs/nothing/" in capsys.readouterr().err
    assert main(["submit", str(tmp_path / "missing.log"), *data]) == 1
    assert "is not a file" in capsys.readouterr().err
    bad = tmp_path / "clp-config.yaml"
    bad.write_text("archive_output:\n  compression_level: 42\n")
    assert main(["jobs", "--config", str(bad), *data]) == 2
    assert "archive_output.compression_level" in capsys.readouterr().err


def test_the_data_dir_defaults_to_coordinator_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path / "home"))
    assert main(["db", "upgrade"]) == 0
    assert (tmp_path / "home" / "coordinator.db").exists()


def test_db_commands_move_between_revisions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data_dir = ["--data-dir", str(tmp_path)]
    assert main(["db", "current", *data_dir]) == 1
    assert "no database at" in capsys.readouterr().err
    (tmp_path / "coordinator.db").touch()  # an empty SQLite database
    assert main(["db", "current", *data_dir]) == 0
    assert "base" in capsys.readouterr().out
    assert main(["db", "upgrade", *data_dir]) == 0
    assert main(["db", "downgrade", "0001", *data_dir]) == 0
    assert "schema at revision 0001" in capsys.readouterr().out
    assert main(["db", "current", *data_dir]) == 0
    assert capsys.readouterr().out.strip() == "0001"
    engine = create_database_engine(f"sqlite:///{tmp_path / 'coordinator.db'}")
    try:
        assert migrate.current_revision(engine) == "0001"
    finally:
        engine.dispose()


def test_the_console_script_runs_as_a_module(tmp_path: Path) -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "coordinator", "lifecycle"],
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if k != DATABASE_URL_ENV},
        capture_output=True,
        text=True,
        check=True,
    )
    assert "finalised    Committed (5)  Succeeded (2)" in completed.stdout
    assert "Committed  1 or 5  set" in completed.stdout  # how it is stored
    assert re.search(r"\n  Failed +Committed +rolled_back → Failed \(withdraws\)", completed.stdout)


def test_the_version_is_the_installed_distributions(capsys: pytest.CaptureFixture[str]) -> None:
    """One source of the version: pyproject.toml, read back from the package metadata."""
    import tomllib
    from importlib.metadata import version

    from coordinator import DISTRIBUTION

    project = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())
    assert version(DISTRIBUTION) == project["project"]["version"]
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"coordinator {project['project']['version']}\n"


def test_the_package_is_typed_and_licensed_as_its_metadata_says() -> None:
    import tomllib

    root = Path(__file__).parent.parent
    project = tomllib.loads((root / "pyproject.toml").read_text())
    assert (root / "coordinator" / "py.typed").exists()
    assert project["tool"]["setuptools"]["package-data"]["coordinator"] == ["py.typed"]
    assert project["project"]["license"] == "Apache-2.0"
    assert (
        "Apache License\n                           Version 2.0" in (root / "LICENSE").read_text()
    )


def test_the_service_starts_with_the_collector_paused_and_runs_with_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``run``'s start-up (imports, the runtime's assembly) runs with the cyclic garbage collector
    paused (23 % less CPU for an idle ``run --until-idle`` here, issue 14); the loop runs with it
    resumed, what the start-up built frozen out of later full collections."""
    from coordinator import runtime
    from coordinator.service.coordinator import Coordinator

    seen: dict[str, tuple[bool, int]] = {}
    real_open, real_run = runtime.open_runtime, Coordinator.run

    def open_runtime(*args: Any, **kwargs: Any) -> Any:
        seen["assembly"] = _collector()
        return real_open(*args, **kwargs)

    def run(self: Coordinator, *, until_idle: bool = False) -> None:
        seen["loop"] = _collector()
        real_run(self, until_idle=until_idle)

    monkeypatch.setattr(runtime, "open_runtime", open_runtime)
    monkeypatch.setattr(Coordinator, "run", run)
    _main_unfrozen("run", "--until-idle", "--data-dir", str(tmp_path / "var"))
    assert seen["assembly"] == (False, 0)
    assert seen["loop"][0] is True and seen["loop"][1] > 10_000


def test_spider_serve_starts_with_the_collector_paused_and_serves_with_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``spider serve`` is long-lived too: its start-up (imports, the engine) as ``run``'s."""
    from coordinator.engine import grpc_server
    from coordinator.runtime import embedded_spider

    seen: dict[str, tuple[bool, int]] = {}

    def engine_started(*args: Any, **kwargs: Any) -> Any:
        seen["assembly"] = _collector()
        return embedded_spider(*args, **kwargs)

    def serving(*args: Any, **kwargs: Any) -> None:
        seen["serving"] = _collector()

    monkeypatch.setattr("coordinator.runtime.embedded_spider", engine_started)
    monkeypatch.setattr(grpc_server, "run_server", serving)
    data = ["--data-dir", str(tmp_path / "var")]
    assert main(["db", "upgrade", *data]) == 0
    _main_unfrozen("spider", "serve", "--port", "0", *data)
    assert seen["assembly"] == (False, 0)
    assert seen["serving"][0] is True and seen["serving"][1] > 10_000


def _collector() -> tuple[bool, int]:
    """Whether the cyclic garbage collector runs, and how many objects are frozen."""
    return gc.isenabled(), gc.get_freeze_count()


def _main_unfrozen(*argv: str) -> None:
    """``main(argv)`` succeeds, from nothing frozen, leaving the collector running; this test
    process's collector is left as it was found."""
    gc.unfreeze()
    try:
        assert main(list(argv)) == 0
        assert gc.isenabled()
    finally:
        gc.enable()
        gc.unfreeze()
