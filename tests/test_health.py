"""Health: ``run_health_checks`` (``coordinator health``), and ``/healthz`` and ``/readyz`` of
``coordinator run``'s monitoring server, on SQLite and MariaDB, with the embedded engine and with
Spider's protocol (the embedded engine served over gRPC, as ``coordinator spider serve`` does).

Every check only reads: a missing SQLite database stays missing, a schema behind the head stays
behind.
"""

from __future__ import annotations

import dataclasses
import socket
import textwrap
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from sqlalchemy import Engine, select, text, update

from coordinator import metrics
from coordinator.config.loader import ConfigError, CoordinatorConfig, database_url, load_config
from coordinator.config.locations import DATA_DIR_ENV, DATABASE_URL_ENV
from coordinator.engine.grpc_server import serve
from coordinator.runtime import open_runtime
from coordinator.service.health import (
    EMBEDDED_SPIDER,
    HealthCheck,
    all_ok,
    readiness,
    run_health_checks,
)
from coordinator.service.monitoring import start_monitoring
from coordinator.service.resource_group import ResourceGroup
from coordinator.spider.grpc.client import GrpcSpider
from coordinator.store import migrate
from coordinator.store.database import create_database_engine
from coordinator.store.schema import coordinator_instances, spider_resource_groups
from tests.service_support import coordinator_with
from tests.timing import MovableClock

NAMES = ["database", "schema", "spider", "resource group"]
NAME = "compression-coordinator"
"""CLP's default resource group name."""


@pytest.fixture
def config(config: CoordinatorConfig, migrated_engine: Engine) -> CoordinatorConfig:
    """The embedded default on the test's database at the head revision (the SQLite file of the
    data directory is created by ``open_runtime``; a MariaDB one migrated here)."""
    del migrated_engine
    return config


def _engine_of(config: CoordinatorConfig) -> Engine:
    """An engine on the configuration's database (a SQLite file is created by connecting)."""
    config.data_dir.mkdir(parents=True, exist_ok=True)
    return create_database_engine(database_url(config))


def _by_name(checks: list[HealthCheck]) -> dict[str, HealthCheck]:
    assert [check.name for check in checks] == NAMES
    return {check.name: check for check in checks}


def _get(url: str) -> tuple[int, str]:
    """The status and body of a GET, 503 included."""
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def _with_metrics_port(config: CoordinatorConfig, port: int = 0) -> CoordinatorConfig:
    extras = config.extras.model_copy(update={"metrics_port": port, "metrics_host": "127.0.0.1"})
    return dataclasses.replace(config, extras=extras)


# --- coordinator health -------------------------------------------------------------------------


def test_a_missing_sqlite_database_is_a_failed_check_and_is_not_created(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(DATABASE_URL_ENV, raising=False)
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    config = load_config(None, data_dir=tmp_path / "mistyped")
    path = tmp_path / "mistyped" / "coordinator.db"

    checks = _by_name(run_health_checks(config))

    assert checks["database"] == HealthCheck("database", False, f"no database at {path}")
    assert checks["schema"] == HealthCheck("schema", False, "not checked: no database")
    assert checks["spider"] == HealthCheck("spider", True, EMBEDDED_SPIDER)
    assert not checks["resource group"].ok
    assert not all_ok(list(checks.values()))
    assert not path.exists()
    assert checks["database"].line() == f"FAIL database: no database at {path}"


def test_every_check_passes_on_a_current_database(config: CoordinatorConfig) -> None:
    with open_runtime(config, lease_secs=5):
        pass  # creates the SQLite file (a MariaDB database is migrated by the fixture)

    checks = _by_name(run_health_checks(config))

    assert all_ok(list(checks.values())), [check.line() for check in checks.values()]
    assert checks["database"].detail.endswith(" answers")
    assert "coordinator:" not in checks["database"].detail  # no credentials in the output
    assert checks["schema"].detail == f"at the head revision {migrate.head_revision()}"
    assert checks["spider"].detail == EMBEDDED_SPIDER
    assert checks["resource group"].detail == (
        "'compression-coordinator' not created yet (the first submission creates it)"
    )
    assert checks["schema"].line() == f"ok   schema: at the head revision {migrate.head_revision()}"

    with open_runtime(config, lease_secs=5) as rt:
        group = rt.coordinator.resource_group.id()
    checks = _by_name(run_health_checks(config))
    assert checks["resource group"] == HealthCheck(
        "resource group", True, f"'compression-coordinator' is the embedded engine's group {group}"
    )


def test_a_schema_behind_the_head_fails_and_stays_behind(
    config: CoordinatorConfig, database_url: str
) -> None:
    head = migrate.head_revision()
    with open_runtime(config, lease_secs=5):
        pass  # creates the SQLite file at the head
    engine = _engine_of(config)
    try:
        migrate.downgrade(engine, "0006")

        checks = _by_name(run_health_checks(config))

        assert checks["database"].ok
        assert checks["schema"] == HealthCheck(
            "schema",
            False,
            f"at revision 0006, this coordinator needs {head}: run `coordinator db upgrade`",
        )
        assert not all_ok(list(checks.values()))
        assert migrate.current_revision(engine) == "0006"  # nothing was migrated
    finally:
        engine.dispose()


def test_a_database_never_migrated_fails_the_schema_check(
    tmp_path: Path, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    monkeypatch.setenv(DATABASE_URL_ENV, database_url)  # an empty database (a SQLite file too)
    engine = create_database_engine(database_url)
    with engine.connect() as connection:
        connection.execute(text("SELECT 1"))  # SQLite: the file exists now, empty
    config = load_config(None, data_dir=tmp_path / "var")

    checks = _by_name(run_health_checks(config))

    assert checks["database"].ok
    assert not checks["schema"].ok
    assert checks["schema"].detail.startswith("at revision none (never migrated), ")
    assert migrate.current_revision(engine) is None
    engine.dispose()


def _spider_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, url: str, port: int
) -> CoordinatorConfig:
    """A CLP file for ``engine: spider`` at ``127.0.0.1:port`` on the database ``url``."""
    monkeypatch.setenv(DATABASE_URL_ENV, url)
    path = tmp_path / "clp-config.yaml"
    path.write_text(
        textwrap.dedent(
            f"""\
            compression_coordinator: {{}}
            spider: {{host: 127.0.0.1, port: {port}}}
            """
        ),
        encoding="utf-8",
    )
    config = load_config(path, data_dir=tmp_path / "spider-var")
    assert config.engine == "spider"
    return config


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.slow
def test_the_spider_checks_reach_spider_and_verify_the_resource_group(
    config: CoordinatorConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = database_url(config)
    with open_runtime(config, lease_secs=5) as rt:
        assert rt.embedded is not None
        server = serve(rt.embedded, "127.0.0.1", 0)  # what `coordinator spider serve` runs
        try:
            spider_config = _spider_config(tmp_path, monkeypatch, url, server.port)
            where = f"127.0.0.1:{server.port}"

            checks = _by_name(run_health_checks(spider_config))
            assert all_ok(list(checks.values())), [check.line() for check in checks.values()]
            assert checks["spider"].detail == f"Spider at {where} answers"
            assert checks["resource group"].detail == (
                "'compression-coordinator' not registered yet (the first submission "
                "registers it with Spider)"
            )

            # Registered as the coordinator does for a Spider cluster: the id in CLP's table.
            with GrpcSpider("127.0.0.1", server.port) as client:
                group = ResourceGroup(rt.engine, client, NAME).id()
            checks = _by_name(run_health_checks(spider_config))
            assert checks["resource group"] == HealthCheck(
                "resource group",
                True,
                f"'compression-coordinator' is group {group}, verified by Spider",
            )

            # Spider's storage was reset: the recorded id is unknown to it.
            with rt.engine.begin() as connection:
                connection.execute(update(spider_resource_groups).values(rg_id=group + 1000))
            checks = _by_name(run_health_checks(spider_config))
            assert not checks["resource group"].ok
            assert checks["resource group"].detail.startswith(
                f"Spider does not know group {group + 1000}, which spider_resource_groups "
                "records for 'compression-coordinator'"
            )
        finally:
            server.stop(0)

        checks = _by_name(run_health_checks(spider_config))
        assert checks["database"].ok and checks["schema"].ok
        assert not checks["spider"].ok
        assert checks["spider"].detail.startswith(f"Spider at {where} is unreachable: ")
        assert checks["resource group"] == HealthCheck(
            "resource group", False, "not checked: Spider is not reached"
        )


# --- /healthz and /readyz -----------------------------------------------------------------------


@pytest.mark.slow
def test_the_endpoints_of_coordinator_run_answer_and_stop_with_it(
    config: CoordinatorConfig,
) -> None:
    config = _with_metrics_port(config)
    with open_runtime(config, lease_secs=5) as rt:
        assert rt.monitor is not None
        url, port = rt.monitor.url, rt.monitor.port
        assert port > 0 and url == f"http://127.0.0.1:{port}"
        rt.coordinator.tick()

        status, body = _get(f"{url}/healthz")
        assert status == 200 and body.startswith("ok   loop: last tick activity ")
        status, body = _get(f"{url}/readyz")
        assert status == 200, body
        assert [line.split(":")[0] for line in body.splitlines()] == [
            "ok   database",
            "ok   schema",
            "ok   spider",
        ]
        assert _get(f"{url}/metrics")[0] == 200
        assert _get(f"{url}/nothing")[0] == 404

        # A database that is not at the head (as after a newer coordinator's migration, or
        # before `coordinator db upgrade`): not ready, and says why.
        head = migrate.head_revision()
        with rt.engine.begin() as connection:
            connection.execute(text("UPDATE alembic_version SET version_num = '0006'"))
        status, body = _get(f"{url}/readyz")
        assert status == 503
        assert (
            f"FAIL schema: at revision 0006, this coordinator needs {head}: run "
            "`coordinator db upgrade`\n" in body
        )
        assert _get(f"{url}/healthz")[0] == 200  # alive all the same
        with rt.engine.begin() as connection:
            connection.execute(
                text("UPDATE alembic_version SET version_num = :head"), {"head": head}
            )
        assert _get(f"{url}/readyz")[0] == 200

    with pytest.raises(urllib.error.URLError), urllib.request.urlopen(f"{url}/healthz", timeout=30):
        pass  # Runtime.close stopped the server
    assert metrics.JOBS.source is None  # nothing counts jobs in a closed database


@pytest.mark.slow
def test_healthz_fails_when_the_loop_stops_ticking(config: CoordinatorConfig) -> None:
    clock = MovableClock()
    with open_runtime(config, lease_secs=5) as rt:
        coordinator = coordinator_with(rt, clock=clock.monotonic)
        server = start_monitoring(
            _with_metrics_port(config), rt.engine, coordinator, stale_after_secs=60
        )
        try:
            assert _get(f"{server.url}/healthz")[0] == 200  # built, not ticked yet: starting
            coordinator.tick()
            assert _get(f"{server.url}/healthz")[0] == 200
            clock.advance(61)
            status, body = _get(f"{server.url}/healthz")
            assert status == 503
            assert body.startswith("FAIL loop: no tick started or ended for 61 s (more than 60 s)")
            coordinator.tick()
            assert _get(f"{server.url}/healthz")[0] == 200
        finally:
            server.close()


@pytest.mark.slow
def test_readyz_fails_when_spider_is_unreachable(
    config: CoordinatorConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = _free_port()  # nothing listens there
    with open_runtime(config, lease_secs=5) as rt:
        spider_config = _spider_config(tmp_path, monkeypatch, database_url(config), port)
        server = start_monitoring(_with_metrics_port(spider_config), rt.engine, rt.coordinator)
        try:
            status, body = _get(f"{server.url}/readyz")
        finally:
            server.close()
    assert status == 503
    lines = body.splitlines()
    assert [line.split(":")[0] for line in lines[:2]] == ["ok   database", "ok   schema"]
    assert lines[2].startswith(f"FAIL spider: Spider at 127.0.0.1:{port} is unreachable: ")


def test_a_metrics_port_in_use_refuses_to_start_and_leaves_nothing_behind(
    config: CoordinatorConfig,
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = int(taken.getsockname()[1])
        with pytest.raises(ConfigError) as raised:
            open_runtime(_with_metrics_port(config, port), lease_secs=5)
    assert raised.value.problems[0].startswith(
        f"coordinator.metrics_port: cannot listen on 127.0.0.1:{port}: "
    )
    # Everything it had started was stopped: its heartbeat row is gone with its presence.
    engine = _engine_of(config)
    try:
        with engine.connect() as connection:
            assert connection.execute(select(coordinator_instances)).all() == []
    finally:
        engine.dispose()
    with open_runtime(config, lease_secs=5) as rt:
        assert rt.monitor is None  # off unless set


def test_the_metrics_port_is_off_by_default_and_checked(tmp_path: Path) -> None:
    assert load_config(None, data_dir=tmp_path).extras.metrics_port is None
    path = tmp_path / "clp-config.yaml"
    path.write_text("coordinator: {metrics_port: 9464, metrics_host: '::'}\n", encoding="utf-8")
    extras = load_config(path).extras
    assert (extras.metrics_port, extras.metrics_host) == (9464, "::")
    path.write_text("coordinator: {metrics_port: 70000}\n", encoding="utf-8")
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    assert raised.value.problems == (
        "coordinator.metrics_port: Input should be less than or equal to 65535",
    )


def test_readiness_fails_when_the_database_does_not_answer(tmp_path: Path) -> None:
    engine = create_database_engine(f"sqlite:///{tmp_path}/gone/coordinator.db")
    try:
        checks = readiness(engine, None, "embedded")
    finally:
        engine.dispose()
    # The schema is not asked of a database that does not answer.
    assert [(check.name, check.ok) for check in checks] == [("database", False), ("spider", True)]
    assert "unable to open database file" in checks[0].detail
    assert not (tmp_path / "gone").exists()
