"""The command line's rough edges: global options on either side of the command, one error
boundary, read-only commands that create nothing, the schema rule, the log level and its files,
and the one database resolver that ``alembic`` shares."""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import text

from coordinator.cli import jobs as job_commands
from coordinator.cli.main import EXIT_CODES, build_parser, main
from coordinator.config.clp import CLP_DB_PASS_ENV, CLP_DB_USER_ENV
from coordinator.config.locations import (
    CONFIG_ENV,
    DATA_DIR_ENV,
    DATABASE_URL_ENV,
    LOG_LEVEL_ENV,
)
from coordinator.service.logs import LOGS_DIR_ENV, HourlyFile
from coordinator.store import migrate
from coordinator.store.database import create_database_engine
from tests.sample_logs import write_json_logs

CHECKOUT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        DATABASE_URL_ENV,
        DATA_DIR_ENV,
        CONFIG_ENV,
        LOG_LEVEL_ENV,
        LOGS_DIR_ENV,
        CLP_DB_USER_ENV,
        CLP_DB_PASS_ENV,
    ):
        monkeypatch.delenv(name, raising=False)


def _err(capsys: pytest.CaptureFixture[str]) -> str:
    return capsys.readouterr().err


# --- global options ----------------------------------------------------------------------------


def test_global_options_work_before_and_after_the_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before, after = tmp_path / "before", tmp_path / "after"
    assert main(["--data-dir", str(before), "db", "upgrade"]) == 0
    assert (before / "coordinator.db").is_file()
    assert main(["db", "upgrade", "--data-dir", str(after)]) == 0
    assert (after / "coordinator.db").is_file()
    # Written twice, the one after the command wins.
    capsys.readouterr()
    assert main(["--data-dir", str(tmp_path / "nowhere"), "jobs", "--data-dir", str(after)]) == 0
    assert capsys.readouterr().out == "no jobs\n"
    assert not (tmp_path / "nowhere").exists()


def test_the_configuration_file_comes_from_the_environment_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "clp-config.yaml"
    bad.write_text("archive_output:\n  compression_level: 42\n")
    monkeypatch.setenv(CONFIG_ENV, str(bad))
    assert main(["jobs", "--data-dir", str(tmp_path)]) == 2
    assert "archive_output.compression_level" in _err(capsys)


@pytest.mark.parametrize("command", [["lifecycle"], ["diagrams", "--check"]])
@pytest.mark.parametrize("option", ["--config", "--data-dir"])
def test_database_options_given_to_a_command_without_a_database_are_a_usage_error(
    command: list[str], option: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main([option, str(tmp_path), *command])
    assert exited.value.code == 2
    assert f"{option} not used by `coordinator {command[0]}`" in _err(capsys)
    with pytest.raises(SystemExit) as exited:
        main([*command, option, str(tmp_path)])
    assert exited.value.code == 2


def test_every_command_and_option_is_described() -> None:
    parser = build_parser()
    undescribed: list[str] = []

    def walk(current: object, path: str) -> None:
        assert hasattr(current, "_actions")
        if not getattr(current, "description", None):
            undescribed.append(f"{path}: no description")
        for action in current._actions:
            name = f"{path} {'/'.join(action.option_strings) or action.dest}"
            choices = getattr(action, "choices", None)
            if isinstance(choices, dict):  # the commands
                for command, sub in choices.items():
                    walk(sub, f"{path} {command}")
            elif action.dest not in {"help", "version"} and not action.help:
                undescribed.append(f"{name}: no help")
            elif (
                action.option_strings
                and action.default not in (None, False, argparse.SUPPRESS)
                and "default" not in (action.help or "")
            ):
                undescribed.append(f"{name}: no default in its help")

    walk(parser, "coordinator")
    assert undescribed == []
    for option in ("--config", "--data-dir", "--log-level"):
        (action,) = [a for a in parser._actions if option in a.option_strings]
        assert "default:" in (action.help or "") and "env: $COORDINATOR_" in (action.help or "")


def test_the_exit_codes_are_documented_in_the_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert sorted(EXIT_CODES) == [0, 1, 2]
    for code, meaning in EXIT_CODES.items():
        assert f"{code} {' '.join(meaning.split())}" in out


# --- one error boundary ------------------------------------------------------------------------


def test_a_bug_is_one_line_without_a_traceback_unless_debugging(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(*_: object, **__: object) -> list[dict[str, object]]:
        raise RuntimeError("the listing broke")

    data = ["--data-dir", str(tmp_path)]
    assert main(["db", "upgrade", *data]) == 0
    monkeypatch.setattr(job_commands, "list_jobs", broken)
    capsys.readouterr()
    assert main(["jobs", *data]) == 1
    err = _err(capsys)
    assert err == (
        "coordinator: internal error: RuntimeError: the listing broke (a bug: run again with "
        "--log-level debug for the traceback, and report it)\n"
    )
    assert main(["jobs", *data, "--log-level", "debug"]) == 1
    err = _err(capsys)
    assert "Traceback (most recent call last)" in err and "the listing broke" in err
    monkeypatch.setenv(LOG_LEVEL_ENV, "DEBUG")
    assert main(["jobs", *data]) == 1
    assert "Traceback (most recent call last)" in _err(capsys)


def test_a_schema_that_is_not_current_is_one_line_naming_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = ["--data-dir", str(tmp_path)]
    assert main(["db", "upgrade", "0001", *data]) == 0
    capsys.readouterr()
    assert main(["jobs", *data]) == 1
    err = _err(capsys)
    assert err.startswith("coordinator: the database schema is at revision 0001")
    assert "coordinator db upgrade" in err and len(err.splitlines()) == 1


# --- read-only commands ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [["jobs"], ["show", "1"], ["archives"], ["db", "current"], ["cancel", "1"]],
)
def test_commands_that_only_read_never_create_a_database(
    command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mistyped = tmp_path / "vra"
    assert main([*command, "--data-dir", str(mistyped)]) == 1
    assert _err(capsys).startswith(f"coordinator: no database at {mistyped / 'coordinator.db'}")
    assert not mistyped.exists()


def test_commands_that_only_read_never_migrate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = ["--data-dir", str(tmp_path)]
    assert main(["db", "upgrade", "0001", *data]) == 0
    for command in (["jobs"], ["show", "1"], ["archives"]):
        assert main([*command, *data]) == 1
    assert main(["db", "current", *data]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "0001"


# --- one schema rule ---------------------------------------------------------------------------


def test_a_configuration_file_on_sqlite_is_migrated_like_the_embedded_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before, ``submit --config F`` refused with "schema at revision none" where the embedded
    default migrated by itself; now every database but CLP's (a ``database`` section) is
    migrated by the commands that write."""
    config = tmp_path / "clp-config.yaml"
    config.write_text("coordinator:\n  data_dir: " + str(tmp_path / "home") + "\n")
    logs = tmp_path / "in" / "a.jsonl"
    write_json_logs(logs, 10)
    assert main(["submit", str(logs), "--config", str(config)]) == 0
    assert capsys.readouterr().out.strip() == "1"
    engine = create_database_engine(f"sqlite:///{tmp_path / 'home' / 'coordinator.db'}")
    try:
        assert migrate.current_revision(engine) == migrate.head_revision()
    finally:
        engine.dispose()


def _clp_config(path: Path, url: str) -> Path:
    """A CLP configuration whose ``database`` section names the database of ``url`` (jobs run on
    the embedded engine; CLP's model wants ``spider`` beside ``compression_coordinator``)."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    path.write_text(
        "database:\n"
        f"  host: {parsed.host}\n"
        f"  port: {parsed.port}\n"
        f"  names:\n    clp: {parsed.database}\n"
        "spider: {host: localhost, port: 50051}\n"
        "compression_coordinator: {}\n"
        "coordinator:\n  engine: embedded\n"
    )
    return path


def test_clps_database_is_migrated_only_by_db_upgrade(
    mariadb_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from sqlalchemy.engine import make_url

    parsed = make_url(mariadb_url)
    monkeypatch.setenv(CLP_DB_USER_ENV, parsed.username or "")
    monkeypatch.setenv(CLP_DB_PASS_ENV, parsed.password or "")
    config = _clp_config(tmp_path / "clp-config.yaml", mariadb_url)
    logs = tmp_path / "in" / "a.jsonl"
    write_json_logs(logs, 10)
    assert main(["submit", str(logs), "--config", str(config), "--data-dir", str(tmp_path)]) == 1
    err = _err(capsys)
    assert "schema is at revision none" in err and "coordinator db upgrade" in err
    assert main(["--config", str(config), "db", "upgrade"]) == 0
    assert main(["submit", str(logs), "--config", str(config), "--data-dir", str(tmp_path)]) == 0


# --- one database resolver, alembic included ---------------------------------------------------


def _alembic(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "alembic", *args],
        cwd=CHECKOUT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=False,
    )


def test_alembic_upgrades_the_database_clps_configuration_names(
    mariadb_url: str, tmp_path: Path
) -> None:
    """Before, ``alembic upgrade head`` ignored the configuration's ``database`` section and
    migrated the embedded SQLite file of the current directory."""
    from sqlalchemy.engine import make_url

    parsed = make_url(mariadb_url)
    environment = {
        CLP_DB_USER_ENV: parsed.username or "",
        CLP_DB_PASS_ENV: parsed.password or "",
        DATA_DIR_ENV: str(tmp_path / "embedded"),
    }
    for name in (DATABASE_URL_ENV, CONFIG_ENV):
        os.environ.pop(name, None)
    config = _clp_config(tmp_path / "clp-config.yaml", mariadb_url)
    done = _alembic("-x", f"config={config}", "upgrade", "0003", env=environment)
    assert done.returncode == 0, done.stderr
    done = _alembic("upgrade", "head", env={**environment, CONFIG_ENV: str(config)})
    assert done.returncode == 0, done.stderr
    engine = create_database_engine(mariadb_url)
    try:
        assert migrate.current_revision(engine) == migrate.head_revision()
        with engine.connect() as connection:
            assert connection.execute(text("SELECT COUNT(*) FROM compression_jobs")).scalar() == 0
    finally:
        engine.dispose()
    assert not (tmp_path / "embedded").exists()


# --- the log level, and CLP's log directory ----------------------------------------------------


def test_the_log_level_comes_from_the_option_the_environment_or_clps_configuration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "clp-config.yaml"
    config.write_text(
        "spider: {host: localhost, port: 50051}\n"
        "compression_coordinator:\n  logging_level: ERROR\n"
        "coordinator:\n  engine: embedded\n"
    )
    data = ["--data-dir", str(tmp_path)]
    assert main(["db", "upgrade", *data]) == 0
    assert main(["jobs", *data]) == 0
    assert logging.getLogger().level == logging.WARNING  # a command's default
    assert main(["jobs", *data, "--config", str(config)]) == 0
    assert logging.getLogger().level == logging.ERROR  # the configuration
    monkeypatch.setenv(LOG_LEVEL_ENV, "info")
    assert main(["jobs", *data, "--config", str(config)]) == 0
    assert logging.getLogger().level == logging.INFO  # the environment beats the file
    assert main(["--log-level", "debug", "jobs", *data, "--config", str(config)]) == 0
    assert logging.getLogger().level == logging.DEBUG  # the option beats both


def test_a_bad_log_level_in_the_environment_is_a_usage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(LOG_LEVEL_ENV, "loud")
    assert main(["lifecycle"]) == 2
    assert _err(capsys).startswith("coordinator: $COORDINATOR_LOG_LEVEL: unknown log level 'loud'")


@pytest.mark.slow
def test_the_service_also_logs_to_clps_log_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    logs_dir = tmp_path / "logs"
    monkeypatch.setenv(LOGS_DIR_ENV, str(logs_dir))
    data = ["--data-dir", str(tmp_path / "var")]
    write_json_logs(tmp_path / "in" / "a.jsonl", 10)
    assert main(["submit", str(tmp_path / "in" / "a.jsonl"), *data]) == 0
    assert main(["run", "--until-idle", *data]) == 0
    logging.shutdown()
    (written,) = logs_dir.iterdir()
    assert written.name.startswith("compression_coordinator.log.20")
    content = written.read_text()
    assert "Compression coordinator stopped." in content and "Succeeded" in content


def test_the_log_file_rolls_every_hour_under_clps_names(tmp_path: Path) -> None:
    handler = HourlyFile(tmp_path)
    handler.setFormatter(logging.Formatter("%(message)s"))
    for hour, message in ((10, "first"), (10, "second"), (11, "third")):
        record = logging.LogRecord("test", logging.INFO, __file__, 1, message, None, None)
        record.created = datetime(2026, 12, 1, hour, 30, tzinfo=UTC).timestamp()
        handler.handle(record)
    handler.close()
    assert (tmp_path / "compression_coordinator.log.2026-12-01-10").read_text() == "first\nsecond\n"
    assert (tmp_path / "compression_coordinator.log.2026-12-01-11").read_text() == "third\n"


# --- coordinator health ------------------------------------------------------------------------


def test_health_prints_one_line_per_check_and_exits_by_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = ["--data-dir", str(tmp_path / "var")]
    assert main(["health", *data]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "FAIL database",
        "FAIL schema",
        "ok   spider",
        "FAIL resource group",
    ]
    assert not (tmp_path / "var").exists()
    assert main(["db", "upgrade", "0001", *data]) == 0
    capsys.readouterr()
    assert main(["health", *data]) == 1
    assert "FAIL schema: " in capsys.readouterr().out
    assert main(["db", "upgrade", *data]) == 0
    capsys.readouterr()
    assert main(["health", *data]) == 0
    assert all(line.startswith("ok   ") for line in capsys.readouterr().out.splitlines())
