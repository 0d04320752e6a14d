"""Fixtures: every database test runs on SQLite and on a real MariaDB.

The MariaDB server is the private one ``bash .ci/test`` starts; its URL (without a database) comes
in ``$COORDINATOR_TEST_MARIADB_URL``. Each test gets a database of its own, dropped afterwards.
Without a server the MariaDB half is skipped, unless ``$COORDINATOR_TEST_REQUIRE_MARIADB=1`` (CI),
which fails it instead.

Markers (``pyproject.toml``): every test that needs the MariaDB server is marked ``mariadb`` here,
at collection (the MariaDB half of ``database_url``, and every test using ``MARIADB_FIXTURES``); a
test that reaches the server otherwise is marked by hand. Long tests are marked ``slow`` in their
modules. ``pytest -m "not slow and not mariadb"`` is the fast half.
"""

from __future__ import annotations

import dataclasses
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, text

from coordinator.config.loader import CoordinatorConfig, load_config
from coordinator.config.locations import DATA_DIR_ENV, DATABASE_URL_ENV
from coordinator.store import migrate
from coordinator.store.database import create_database_engine
from coordinator.store.jobs import JobStore
from tests.spider_cluster import REQUIRE_ENV as REQUIRE_CLUSTER_ENV
from tests.spider_cluster import ClusterRun, require_cluster, running_cluster_run
from tests.spider_storage import SpiderStorage, running_spider_storage

MARIADB_URL_ENV = "COORDINATOR_TEST_MARIADB_URL"
REQUIRE_MARIADB_ENV = "COORDINATOR_TEST_REQUIRE_MARIADB"
MARIADB_FIXTURES = frozenset(
    {
        "mariadb_url",
        "spider_storage",
        "throwaway_spider_storage",
        "spider_cluster",
        "shared_spider_cluster",
    }
)
"""Fixtures that need the MariaDB server (directly or through Spider's storage service or a whole
Spider cluster)."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``mariadb`` every test that needs the MariaDB server, so nobody has to remember to."""
    for item in items:
        callspec = getattr(item, "callspec", None)
        on_mariadb = callspec is not None and callspec.params.get("database_url") == "mariadb"
        if on_mariadb or MARIADB_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.mariadb)


def mariadb_server_url() -> str:
    """The test server's URL; skips (or fails, in CI) the test when there is none."""
    url = os.environ.get(MARIADB_URL_ENV)
    if url:
        return url.rstrip("/") + "/"
    if os.environ.get(REQUIRE_MARIADB_ENV) == "1":
        pytest.fail(f"MariaDB is required but ${MARIADB_URL_ENV} is not set")
    pytest.skip(f"no MariaDB server: run `bash .ci/test` (or set ${MARIADB_URL_ENV})")


@pytest.fixture
def mariadb_url() -> Iterator[str]:
    """A fresh, empty MariaDB database (server default charset, like a CLP deployment's)."""
    server = mariadb_server_url()
    name = f"coordinator_test_{uuid.uuid4().hex[:16]}"
    admin = create_engine(server)
    try:
        with admin.begin() as connection:
            connection.execute(text(f"CREATE DATABASE `{name}`"))
        yield f"{server}{name}"
        with admin.begin() as connection:
            connection.execute(text(f"DROP DATABASE IF EXISTS `{name}`"))
    finally:
        admin.dispose()


@pytest.fixture(params=["sqlite", "mariadb"])
def database_url(request: pytest.FixtureRequest, tmp_path: os.PathLike[str]) -> str:
    """An empty database on each backend."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/coordinator.db"
    return str(request.getfixturevalue("mariadb_url"))


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    """An engine on the empty database, as the coordinator configures it."""
    engine = create_database_engine(database_url)
    yield engine
    engine.dispose()


@pytest.fixture
def migrated_engine(engine: Engine) -> Engine:
    """The engine, with the schema at head."""
    migrate.upgrade(engine)
    return engine


@pytest.fixture
def store(migrated_engine: Engine) -> JobStore:
    """A job store over the migrated database."""
    return JobStore(migrated_engine)


@pytest.fixture
def config(database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> CoordinatorConfig:
    """The embedded default under ``tmp_path/var`` on the test's database, two task workers.

    A module may override it (``test_service.py`` does, to check CLP's defaults too).
    """
    if database_url.startswith("sqlite"):
        monkeypatch.delenv(DATABASE_URL_ENV, raising=False)  # the data directory's SQLite file
    else:
        monkeypatch.setenv(DATABASE_URL_ENV, database_url)
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    return dataclasses.replace(load_config(None, data_dir=tmp_path / "var"), embedded_workers=2)


@pytest.fixture(scope="module")
def spider_storage(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SpiderStorage]:
    """Spider's real storage service (``tests/spider_storage.py``), one per module, on a fresh
    database of the private MariaDB. Skipped where the binary cannot run or there is no MariaDB,
    unless CI requires both; a binary that does not start fails."""
    with running_spider_storage(
        mariadb_server_url(), tmp_path_factory.mktemp("spider-storage")
    ) as storage:
        yield storage


@pytest.fixture
def throwaway_spider_storage(tmp_path: Path) -> Iterator[SpiderStorage]:
    """A storage service of the test's own (fresh database), which the test may shut down."""
    with running_spider_storage(mariadb_server_url(), tmp_path / "spider-storage") as storage:
        yield storage


def cluster_server_url() -> str:
    """The test server's URL for a Spider cluster: skips (or fails, when CI requires the cluster
    or MariaDB) where the cluster's binaries cannot run or there is no server."""
    require_cluster()
    if not os.environ.get(MARIADB_URL_ENV) and os.environ.get(REQUIRE_CLUSTER_ENV) == "1":
        pytest.fail(f"the real Spider cluster is required but ${MARIADB_URL_ENV} is not set")
    return mariadb_server_url()


@pytest.fixture
def spider_cluster(tmp_path: Path) -> Iterator[ClusterRun]:
    """A whole real Spider cluster of the test's own (``tests/spider_cluster.py``): fresh
    databases, CLP's schema at head, this coordinator's config written; the test may kill and
    restart its processes. Its coordinators, the cluster and its databases go when the test ends.
    Skipped where the binaries cannot run or there is no MariaDB, unless CI requires both."""
    with running_cluster_run(cluster_server_url(), tmp_path / "spider-cluster") as run:
        yield run


@pytest.fixture(scope="module")
def _module_spider_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterRun]:
    directory = tmp_path_factory.mktemp("spider-cluster")
    with running_cluster_run(cluster_server_url(), directory) as run:
        yield run


@pytest.fixture
def shared_spider_cluster(_module_spider_cluster: ClusterRun) -> Iterator[ClusterRun]:
    """One cluster for the whole module (as ``spider_cluster``), for tests that leave its
    processes and configuration alone; the coordinators a test starts are stopped when it ends."""
    try:
        yield _module_spider_cluster
    finally:
        _module_spider_cluster.stop_coordinators()
