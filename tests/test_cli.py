"""The command line: demo on the embedded default, schema commands."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from coordinator.cli.main import main
from coordinator.config.locations import DATA_DIR_ENV, DATABASE_URL_ENV, PROJECT_ROOT
from coordinator.store import migrate
from coordinator.store.database import create_database_engine


@pytest.fixture(autouse=True)
def _no_database_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DATABASE_URL_ENV, raising=False)


def test_demo_brings_up_the_embedded_database_from_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data_dir = tmp_path / "fresh" / "var"
    assert main(["demo", "--data-dir", str(data_dir)]) == 0
    out = capsys.readouterr().out
    assert f"schema {migrate.head_revision()}" in out
    assert "submitted    Pending (0)    Running (1)" in out
    assert "rolled_back  Committed (5)  Killed (4)" in out
    engine = create_database_engine(f"sqlite:///{data_dir / 'coordinator.db'}")
    try:
        assert migrate.current_revision(engine) == migrate.head_revision()
    finally:
        engine.dispose()


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
    assert main(["db", "current", *data_dir]) == 0
    assert "base" in capsys.readouterr().out
    assert main(["db", "upgrade", *data_dir]) == 0
    assert main(["db", "downgrade", "0001", *data_dir]) == 0
    assert "schema at revision 0001" in capsys.readouterr().out
    assert main(["db", "current", *data_dir]) == 0
    assert capsys.readouterr().out.strip() == "0001"


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
    assert PROJECT_ROOT.exists()
