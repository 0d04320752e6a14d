"""The data directory and the database URL.

The embedded default keeps everything under one data directory: ``--data-dir``, else
``$COORDINATOR_HOME``, else ``./var``. The database URL is ``$COORDINATOR_DATABASE_URL`` when set
(production: ``mysql+pymysql://user:pass@host:3306/clp``), else the embedded SQLite file
``<data dir>/coordinator.db``. The embedded default's object store and archives live in the same
directory (``objects/``, ``archives/``), and relative paths of a configuration file resolve
against it.
"""

from __future__ import annotations

import os
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]
"""The source checkout (``alembic.ini``, ``migrations/``, ``diagrams/``); installs are editable."""

DATA_DIR_ENV = "COORDINATOR_HOME"
DATABASE_URL_ENV = "COORDINATOR_DATABASE_URL"
DEFAULT_DATA_DIR = Path("var")
EMBEDDED_DATABASE_FILE = "coordinator.db"

EMBEDDED_OBJECT_STORE_DIR = "objects"
"""The embedded default's stand-in for S3, inside the data directory: ``<bucket>/<key>`` files."""
EMBEDDED_ARCHIVE_DIR = "archives"
"""The embedded default's archive directory (CLP's ``archive_output.storage`` of type ``fs``)."""


def resolve_data_dir(explicit: Path | None = None) -> Path:
    """The data directory (not created here)."""
    if explicit is not None:
        return explicit
    from_env = os.environ.get(DATA_DIR_ENV)
    return Path(from_env) if from_env else DEFAULT_DATA_DIR


def embedded_database_url(data_dir: Path) -> str:
    """The SQLite URL of the embedded database inside ``data_dir``."""
    return f"sqlite:///{(data_dir / EMBEDDED_DATABASE_FILE).resolve()}"


def resolve_database_url(data_dir: Path | None = None) -> str:
    """``$COORDINATOR_DATABASE_URL``, else the embedded database (creating its directory)."""
    from_env = os.environ.get(DATABASE_URL_ENV)
    if from_env:
        return from_env
    directory = resolve_data_dir(data_dir)
    directory.mkdir(parents=True, exist_ok=True)
    return embedded_database_url(directory)


def under_data_dir(data_dir: Path, path: Path) -> Path:
    """``path`` if absolute, else ``path`` inside ``data_dir`` (which plays CLP's ``CLP_HOME``)."""
    return path if path.is_absolute() else data_dir / path
