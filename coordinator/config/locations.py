"""The data directory and the database URL.

The embedded default keeps everything under one data directory: ``--data-dir``, else
``$COORDINATOR_HOME``, else ``./var``. Its database is the SQLite file ``<data dir>/coordinator.db``
(which database a configuration means: ``coordinator.config.loader.database_url``). Its object
store and archives live in the same directory (``objects/``, ``archives/``), and relative paths of
a configuration file resolve against it.

**Which jobs read the local object store.** A job's objects are read from where the job's own
configuration says, never from where the coordinator's mode suggests. A job names a local object
store by its input's ``endpoint_url``: ``file://`` + the store's absolute directory
(``local_store_endpoint``; ``coordinator submit`` and ``demo`` write it when they put files into
the local store). Every other job (no endpoint, or an ``http(s)`` one: every job CLP's
log-ingestor writes) is read from S3 with the job's endpoint, region and credentials. A job that
names a store other than the one a coordinator serves fails with both paths in its message.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import unquote, urlsplit

PROJECT_ROOT = Path(__file__).resolve().parents[2]
"""The folder that holds the package: the source checkout when the package runs from one (an
editable install, the tests), ``site-packages`` when it is installed from a wheel. Only what needs
the checkout uses it, through ``SOURCE_CHECKOUT``."""


def _is_source_checkout(root: Path) -> bool:
    return all(
        (root / name).is_file() for name in ("pyproject.toml", "alembic.ini", "migrations/env.py")
    )


SOURCE_CHECKOUT: Path | None = PROJECT_ROOT if _is_source_checkout(PROJECT_ROOT) else None
"""The source checkout the package runs from (``pyproject.toml``, ``alembic.ini``, ``migrations/``
beside it), ``None`` when it is installed from a wheel. The defaults of ``coordinator diagrams``
(the committed ``diagrams/``, ``docs/``, ``README.md``) and the migrations of an editable install
come from it; nothing else depends on a checkout."""

CONFIG_ENV = "COORDINATOR_CONFIG"
"""CLP's ``clp-config.yaml`` when ``--config`` is not given (the CLI and ``alembic``)."""
DATA_DIR_ENV = "COORDINATOR_HOME"
DATABASE_URL_ENV = "COORDINATOR_DATABASE_URL"
LOG_LEVEL_ENV = "COORDINATOR_LOG_LEVEL"
DEFAULT_DATA_DIR = Path("var")
EMBEDDED_DATABASE_FILE = "coordinator.db"

EMBEDDED_OBJECT_STORE_DIR = "objects"
"""The embedded default's stand-in for S3, inside the data directory: ``<bucket>/<key>`` files."""
EMBEDDED_ARCHIVE_DIR = "archives"
"""The embedded default's archive directory (CLP's ``archive_output.storage`` of type ``fs``)."""
DEFAULT_BUCKET = "logs"
"""Where ``coordinator submit`` puts files and looks for objects without ``--bucket``."""
DEFAULT_PREFIX = "ingest/"
"""The key prefix of ``coordinator submit`` without ``--prefix``."""


def resolve_data_dir(explicit: Path | None = None) -> Path:
    """The data directory (not created here)."""
    if explicit is not None:
        return explicit
    from_env = os.environ.get(DATA_DIR_ENV)
    return Path(from_env) if from_env else DEFAULT_DATA_DIR


def embedded_database_url(data_dir: Path) -> str:
    """The SQLite URL of the embedded database inside ``data_dir``."""
    return f"sqlite:///{(data_dir / EMBEDDED_DATABASE_FILE).resolve()}"


def under_data_dir(data_dir: Path, path: Path) -> Path:
    """``path`` if absolute, else ``path`` inside ``data_dir`` (which plays CLP's ``CLP_HOME``)."""
    return path if path.is_absolute() else data_dir / path


# --- naming the local object store in a job ----------------------------------------------------

LOCAL_STORE_SCHEME = "file"
"""A job names a local object store by its input's ``endpoint_url``: ``file://`` + the store's
absolute directory (``Path.as_uri``). Every other endpoint (or none) means S3."""


def local_store_endpoint(directory: Path) -> str:
    """The ``endpoint_url`` of a job whose objects are in the local object store ``directory``."""
    return Path(os.path.abspath(directory)).as_uri()


def local_store_named(endpoint_url: str | None) -> Path | None:
    """The local object store a job's ``endpoint_url`` names, or ``None`` when it means S3.

    Any ``file:`` URL names a local store: its percent-decoded path (a host other than
    ``localhost`` is kept as a ``//host`` prefix, so that it can never match a served directory).
    """
    if endpoint_url is None:
        return None
    parsed = urlsplit(endpoint_url)
    if parsed.scheme.lower() != LOCAL_STORE_SCHEME:
        return None
    path = unquote(parsed.path)
    host = parsed.netloc
    return Path(f"//{host}{path}" if host not in ("", "localhost") else path)


def is_same_store(named: Path, served: Path) -> bool:
    """Whether the store a job names is the directory ``served`` (compared as absolute paths)."""
    return Path(os.path.normpath(os.path.abspath(named))) == Path(
        os.path.normpath(os.path.abspath(served))
    )
