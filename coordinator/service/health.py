"""Health: what ``coordinator health`` checks, and what ``/healthz`` and ``/readyz`` answer.

Each check is a ``HealthCheck`` (name, ok, detail), printed one per line (``HealthCheck.line``).
Every check only reads: nothing is created, migrated or registered, and a SQLite database that
does not exist is a failed check (``no database at PATH``), never a new file.

``run_health_checks(config)`` (the ``coordinator health`` command) checks, in order:

* **database**: a ``SELECT 1`` answers;
* **schema**: the database is at the head revision of ``migrations/`` (``coordinator db upgrade``
  moves it there);
* **spider**: for the embedded engine, nothing to reach (it runs inside ``coordinator run``); for
  ``engine: spider``, Spider's storage service at ``spider.host:spider.port`` answers a call
  (one attempt, ``PROBE_DEADLINE_SECS``);
* **resource group**: the group ``compression_coordinator.resource_group.name`` names. Embedded:
  its row in the engine's table, or not created yet (the first submission creates it). Spider:
  the id CLP's ``spider_resource_groups`` records is verified with ``VerifyResourceGroup``; no
  row yet is fine (the first submission registers it), an id Spider does not know (its storage
  was reset) fails, although the coordinator registers the group anew at its next submission.

A running coordinator with ``coordinator.metrics_port`` serves (``coordinator.service.monitoring``)
``/healthz``, liveness: the loop started or ended a tick within ``LIVENESS_STALE_SECS``
(``loop_liveness``); and ``/readyz``, readiness: database, schema and spider above
(``readiness``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlalchemy import Engine, select, text
from sqlalchemy.exc import SQLAlchemyError

from coordinator.config.clp import Spider
from coordinator.config.loader import ConfigError, CoordinatorConfig, database_url
from coordinator.service.coordinator import Coordinator
from coordinator.service.resource_group import ResourceGroup
from coordinator.spider.port import SpiderError, SpiderPort, Unauthenticated, Unavailable
from coordinator.store import migrate
from coordinator.store.database import create_database_engine, reading, sqlite_file
from coordinator.store.outage import describe_error
from coordinator.store.schema import engine_resource_groups as _engine_groups

if TYPE_CHECKING:
    from coordinator.spider.grpc.client import GrpcSpider


PROBE_DEADLINE_SECS = 5.0
"""How long the Spider check waits for Spider's answer (one attempt, no retries)."""
LIVENESS_STALE_SECS = 300.0
"""``/healthz`` fails when the loop has neither started nor ended a tick for this long: a tick
stuck that long (each Spider call has a deadline, each database call the driver's timeouts) is a
loop that no longer moves. A tick that submits a large backlog can take minutes, hence the
margin."""
RESOURCE_GROUP = "resource group"
EMBEDDED_SPIDER = "the embedded engine runs inside `coordinator run` (nothing to reach)"


@dataclass(frozen=True)
class HealthCheck:
    """The result of one check."""

    name: str
    ok: bool
    detail: str

    def line(self) -> str:
        """``ok   database: SQLite /var/coordinator.db answers`` or ``FAIL schema: …``."""
        return f"{'ok' if self.ok else 'FAIL':<4} {self.name}: {self.detail}"


def all_ok(checks: Sequence[HealthCheck]) -> bool:
    """Whether every check passed (``coordinator health`` exits 0 then, else 1)."""
    return all(check.ok for check in checks)


def run_health_checks(config: CoordinatorConfig) -> list[HealthCheck]:
    """Every check of the module docstring, for ``coordinator health``; only reads."""
    name = config.compression_coordinator.resource_group.name
    engine, checks = _open_database(config)
    probe = spider_probe(config)
    try:
        if engine is not None:
            checks.append(check_database(engine))
            if checks[-1].ok:
                checks.append(check_schema(engine))
            else:
                checks.append(HealthCheck("schema", False, "not checked: no database answers"))
        spider = check_spider(probe, spider_endpoint(config))
        checks.append(spider)
        if engine is None or not checks[0].ok:
            checks.append(HealthCheck(RESOURCE_GROUP, False, "not checked: no database"))
        elif not spider.ok:
            checks.append(HealthCheck(RESOURCE_GROUP, False, "not checked: Spider is not reached"))
        else:
            checks.append(check_resource_group(engine, probe, name))
    finally:
        if probe is not None:
            probe.close()
        if engine is not None:
            engine.dispose()
    return checks


def readiness(
    engine: Engine, probe: SpiderPort | None, where: str, head: str | None = None
) -> list[HealthCheck]:
    """``/readyz``: the database answers at the head revision (``head``, else read from
    ``migrations/``), and Spider answers (``probe``; ``None`` for the embedded engine). ``where``
    names Spider's endpoint for the messages."""
    checks = [check_database(engine)]
    if checks[0].ok:
        checks.append(check_schema(engine, head))
    checks.append(check_spider(probe, where))
    return checks


def loop_liveness(
    coordinator: Coordinator, stale_after_secs: float = LIVENESS_STALE_SECS
) -> HealthCheck:
    """``/healthz``: whether the loop started or ended a tick within ``stale_after_secs`` (on
    the loop's clock; before its first tick, since the coordinator was built)."""
    age = coordinator.loop.monotonic() - coordinator.last_activity
    if age <= stale_after_secs:
        return HealthCheck("loop", True, f"last tick activity {age:.1f} s ago")
    return HealthCheck(
        "loop",
        False,
        f"no tick started or ended for {age:.0f} s (more than {stale_after_secs:.0f} s): the loop "
        "is stuck",
    )


def check_database(engine: Engine) -> HealthCheck:
    """Whether the database answers a ``SELECT 1``."""
    where = describe_database(engine)
    try:
        with reading(engine) as connection:
            connection.execute(text("SELECT 1"))
    except SQLAlchemyError as error:
        return HealthCheck("database", False, f"{where} does not answer: {describe_error(error)}")
    return HealthCheck("database", True, f"{where} answers")


def check_schema(engine: Engine, head: str | None = None) -> HealthCheck:
    """Whether the schema is at the head revision (``head``, else read from ``migrations/``)."""
    head = head or migrate.head_revision()
    try:
        current = migrate.current_revision(engine)
    except SQLAlchemyError as error:
        return HealthCheck("schema", False, f"cannot read the revision: {describe_error(error)}")
    if current == head:
        return HealthCheck("schema", True, f"at the head revision {head}")
    return HealthCheck(
        "schema",
        False,
        f"at revision {current or 'none (never migrated)'}, this coordinator needs {head}: run "
        "`coordinator db upgrade`",
    )


def check_spider(probe: SpiderPort | None, where: str) -> HealthCheck:
    """Whether Spider answers: any answer but ``Unavailable`` to ``GetJobState`` of job 0 (which
    Spider never numbers: ``JobNotFound`` is the expected one). ``None``: the embedded engine."""
    if probe is None:
        return HealthCheck("spider", True, EMBEDDED_SPIDER)
    try:
        probe.get_job_state(0)
    except Unavailable as error:
        return HealthCheck("spider", False, f"Spider at {where} is unreachable: {error}")
    except SpiderError:
        pass
    return HealthCheck("spider", True, f"Spider at {where} answers")


def check_resource_group(engine: Engine, probe: SpiderPort | None, name: str) -> HealthCheck:
    """The resource group ``name`` (see the module); ``probe`` ``None``: the embedded engine."""
    try:
        if probe is None:
            return _embedded_resource_group(engine, name)
        stored = ResourceGroup(engine, probe, name).stored_id()
    except SQLAlchemyError as error:
        return HealthCheck(RESOURCE_GROUP, False, f"cannot read it: {describe_error(error)}")
    if stored is None:
        return HealthCheck(
            RESOURCE_GROUP,
            True,
            f"{name!r} not registered yet (the first submission registers it with Spider)",
        )
    try:
        probe.verify_resource_group(stored, name.encode())
    except Unauthenticated:
        why = (
            f"Spider does not know group {stored}, which spider_resource_groups records for "
            f"{name!r} (was Spider's storage reset?); the coordinator registers it anew at its "
            "next submission"
        )
        return HealthCheck(RESOURCE_GROUP, False, why)
    except SpiderError as error:
        why = f"cannot verify group {stored} of {name!r}: {error}"
        return HealthCheck(RESOURCE_GROUP, False, why)
    return HealthCheck(RESOURCE_GROUP, True, f"{name!r} is group {stored}, verified by Spider")


def _embedded_resource_group(engine: Engine, name: str) -> HealthCheck:
    with reading(engine) as connection:
        group_id = connection.execute(
            select(_engine_groups.c.id).where(_engine_groups.c.external_id == name)
        ).scalar_one_or_none()
    if group_id is None:
        return HealthCheck(
            RESOURCE_GROUP, True, f"{name!r} not created yet (the first submission creates it)"
        )
    return HealthCheck(RESOURCE_GROUP, True, f"{name!r} is the embedded engine's group {group_id}")


def spider_probe(config: CoordinatorConfig) -> GrpcSpider | None:
    """A client for the Spider check (one attempt, a short deadline), ``None`` for the embedded
    engine. The caller closes it."""
    if config.engine == "embedded":
        return None
    endpoint = config.clp.spider or Spider()
    # gRPC only for a Spider cluster (start-up time of the embedded default, issue 14)
    from coordinator.spider.grpc.client import GrpcSpider  # noqa: PLC0415

    return GrpcSpider(
        endpoint.host, endpoint.port, deadline_secs=PROBE_DEADLINE_SECS, max_retries=0
    )


def describe_database(engine: Engine) -> str:
    """``SQLite /path/coordinator.db`` or ``mysql db on host:port``: never the credentials."""
    url = engine.url
    if url.get_backend_name() == "sqlite":
        return f"SQLite {url.database}"
    return f"{url.get_backend_name()} database {url.database} on {url.host}:{url.port or 3306}"


def spider_endpoint(config: CoordinatorConfig) -> str:
    """``spider.host:spider.port`` (CLP's defaults without a ``spider`` section), for messages."""
    endpoint = config.clp.spider or Spider()
    return f"{endpoint.host}:{endpoint.port}"


def _open_database(config: CoordinatorConfig) -> tuple[Engine | None, list[HealthCheck]]:
    """The database's engine, or ``None`` with the failed checks when there is none to open."""
    try:
        url = database_url(config)
        path = sqlite_file(url)
    except (ConfigError, SQLAlchemyError) as error:
        return None, [
            HealthCheck("database", False, str(error)),
            HealthCheck("schema", False, "not checked: no database"),
        ]
    if path is not None and not path.is_file():
        return None, [
            HealthCheck("database", False, f"no database at {path}"),
            HealthCheck("schema", False, "not checked: no database"),
        ]
    return create_database_engine(url, pool_size=1), []
