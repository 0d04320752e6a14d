"""Each command imports only what it uses (start-up time, issue 14), checked without timing: the
packages a fresh process has imported after importing the CLI, or after running a command."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.import_probe import RUN_COMMAND, imported_after

HEAVY = (
    "alembic",
    "boto3",
    "botocore",
    "google.protobuf",
    "grpc",
    "mako",
    "prometheus_client",
    "pydantic",
    "rapidfuzz",
    "sqlalchemy",
    "sqlalchemy.orm",
    "transitions",
    "yaml",
    "yscope_clp_core",
)
"""Third-party packages that cost start-up time; each is imported only by what needs it.

``sqlalchemy.orm`` is no command's: the schema is Core tables and every query Core."""

ASSEMBLY = ("coordinator.runtime", "coordinator.engine", "coordinator.service.coordinator")
"""The running service's parts: a command that only reads a database imports none of them."""


def _imported(*argv: str, action: str = RUN_COMMAND) -> set[str]:
    """The heavy packages (and parts of ``ASSEMBLY``) a fresh interpreter holds after ``action``
    (default: the command)."""
    return imported_after(argv, HEAVY + ASSEMBLY, action=action)[1]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data directory whose database is migrated (``coordinator db upgrade``)."""
    directory = tmp_path_factory.mktemp("data")
    subprocess.run(
        [sys.executable, "-m", "coordinator", "db", "upgrade", "--data-dir", str(directory)],
        check=True,
        capture_output=True,
    )
    return directory


def test_importing_the_cli_imports_no_heavy_package() -> None:
    assert _imported(action="import coordinator.cli.main") == set()


def test_version_and_help_import_no_heavy_package() -> None:
    assert _imported("--version") == set()
    assert _imported("--help") == set()


def test_lifecycle_imports_neither_the_database_nor_grpc_nor_s3() -> None:
    assert not _imported("lifecycle") & {
        "alembic",
        "sqlalchemy",  # configuring the logs needs no database
        "transitions",  # the tables need the edges, not the transitions machine
        "boto3",
        "botocore",
        "grpc",
        "google.protobuf",
        "pydantic",
        "yaml",
        "yscope_clp_core",
    }


def test_jobs_on_a_current_schema_imports_no_alembic_grpc_or_s3(data_dir: Path) -> None:
    assert not _imported("jobs", "--data-dir", str(data_dir)) & {
        *ASSEMBLY,
        "alembic",
        "boto3",
        "botocore",
        "grpc",
        "google.protobuf",
        "mako",
        "sqlalchemy.orm",
        "transitions",
        "yaml",
        "yscope_clp_core",
    }


def test_run_with_nothing_to_do_imports_only_what_the_embedded_default_uses(
    data_dir: Path,
) -> None:
    imported = _imported("run", "--until-idle", "--data-dir", str(data_dir))
    assert not imported & {
        "alembic",
        "boto3",
        "botocore",
        "grpc",
        "google.protobuf",
        "mako",
        "rapidfuzz",
        "sqlalchemy.orm",  # the schema is Core tables, every query Core
        "transitions",  # the machine is built at the first move
        "yaml",
        "yscope_clp_core",
    }
    assert {"sqlalchemy", "pydantic"} <= imported  # the check sees what it should


def test_the_lifecycle_s_transitions_machine_is_built_at_first_use() -> None:
    prefix = "from coordinator.lifecycle import JobStatus, edge_for, edges_from; "
    assert "transitions" not in _imported(action=prefix + "edges_from(JobStatus.PENDING)")
    move = "edge_for('submitted', JobStatus.PENDING, JobStatus.RUNNING)"
    assert "transitions" in _imported(action=prefix + move)


def test_show_opens_the_database_without_the_running_service_s_parts(data_dir: Path) -> None:
    assert not _imported("show", "1", "--data-dir", str(data_dir)) & {
        *ASSEMBLY,
        "sqlalchemy.orm",
        "transitions",
    }
