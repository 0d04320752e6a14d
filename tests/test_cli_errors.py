"""Every database URL or data directory an operator can get wrong gives one line and an exit code.

Before, these printed tracebacks of 20 to 140 lines. The errors are real: an unparsable URL, a
refused connection, a wrong password, an unknown database, a driver that is not installed, an
unopenable SQLite file, a data directory below a file.
"""

from __future__ import annotations

import pytest
from sqlalchemy.engine import make_url

from coordinator.cli.main import main
from coordinator.config.locations import DATA_DIR_ENV, DATABASE_URL_ENV


def _run(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    url: str | None,
    *args: str,
    command: str = "jobs",
) -> tuple[int, str]:
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    if url is None:
        monkeypatch.delenv(DATABASE_URL_ENV, raising=False)
    else:
        monkeypatch.setenv(DATABASE_URL_ENV, url)
    code = main([command, *args])
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    ("url", "code", "message"),
    [
        (
            "nonsense",
            2,
            "coordinator: cannot use the database URL: Could not parse SQLAlchemy URL",
        ),
        (
            "postgresql+psycopg://u:p@127.0.0.1/db",
            2,
            "coordinator: cannot use the database URL: its driver is not installed",
        ),
        (
            "mysql+pymysql://u:secret@127.0.0.1:1/db",
            1,
            "coordinator: cannot use the database: Can't connect to MySQL server on '127.0.0.1'",
        ),
        (
            "sqlite:////nonexistent/directory/coordinator.db",
            1,
            "coordinator: no database at /nonexistent/directory/coordinator.db: check --data-dir",
        ),
    ],
)
def test_a_bad_database_url_is_one_line(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    url: str,
    code: int,
    message: str,
) -> None:
    exit_code, err = _run(capsys, monkeypatch, url)
    assert exit_code == code
    assert err.startswith(message), err
    assert len(err.strip().splitlines()) == 1
    assert "secret" not in err


def test_a_data_directory_below_a_file_is_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    # A command that writes tries to create the directory; one that reads finds no database.
    exit_code, err = _run(
        capsys, monkeypatch, None, "--data-dir", "/etc/hostname/var", command="submit"
    )
    assert (exit_code, err) == (1, "coordinator: cannot use /etc/hostname/var: Not a directory\n")
    exit_code, err = _run(capsys, monkeypatch, None, "--data-dir", "/etc/hostname/var")
    assert exit_code == 1
    assert err.startswith("coordinator: no database at /etc/hostname/var/coordinator.db")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("password", "Access denied for user 'coordinator'@'127.0.0.1' (using password: YES)"),
        ("database", "Unknown database 'no_such_database' (error 1049)"),
    ],
)
def test_a_refused_mariadb_login_is_one_line(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    mariadb_url: str,
    change: str,
    message: str,
) -> None:
    url = make_url(mariadb_url)
    if change == "password":
        url = url.set(password="wrong-password")
    else:
        url = url.set(database="no_such_database")
    exit_code, err = _run(capsys, monkeypatch, url.render_as_string(hide_password=False))
    assert exit_code == 1
    assert err.startswith("coordinator: cannot use the database: ") and message in err, err
    assert len(err.strip().splitlines()) == 1
    assert "wrong-password" not in err
