"""Assembling a running coordinator from its configuration: database, Spider engine, settings.

Start-up refusals (``open_runtime`` raises ``ConfigError``, so ``coordinator run`` exits 2 with
one line; read-only commands never open a runtime and keep working):

* **A CLP file without ``compression_coordinator``** (``loader.legacy_scheduler_problem``): CLP's
  legacy scheduler then takes log-ingestor's jobs too, with unguarded writes; add the section, or
  declare ``coordinator.legacy_scheduler: absent``.
* **The embedded default on a CLP deployment's database.** Without a CLP configuration the
  coordinator serves only jobs that name its local object store (``file://<objects dir>`` as the
  input's ``endpoint_url``, ``coordinator.config.locations``). If the database already holds
  Pending ``s3_object_metadata`` jobs that do not (log-ingestor's, read from S3), it belongs to a
  CLP deployment: the coordinator refuses to start and says to pass CLP's configuration with
  ``--config``. Such jobs arriving later are left Pending, untouched, logged once each.
* **An instance id a live coordinator holds** (``coordinator.store.instances``): every coordinator
  keeps a heartbeat row for its ``instance_id`` (the embedded default's is ``embedded``). A second
  process with the same id waits one expiry period for the first's heartbeat to lapse, then refuses;
  a restart on the same host after a crash takes the row over at once.

Where a job's objects are read never depends on the mode: the worker settings always carry the
local store this coordinator serves, and the compress task reads it only for jobs naming it; every
other job is read from S3 with its own endpoint, region and credentials.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Self

from pydantic import SecretStr
from sqlalchemy import Engine, select

from coordinator.archive_storage import ArchiveOutputSettings, FsArchiveOutput, S3ArchiveOutput
from coordinator.config.clp import ArchiveFsStorage, ArchiveS3Storage, S3IngestionConfig, Spider
from coordinator.config.loader import (
    ConfigError,
    CoordinatorConfig,
    database_url,
    legacy_scheduler_problem,
)
from coordinator.config.locations import is_same_store, local_store_endpoint, local_store_named
from coordinator.engine.embedded.engine import CLP_PACKAGES, UNRECORDED_GRACE_SECS, EmbeddedSpider
from coordinator.engine.tasks.context import WorkerSettings
from coordinator.job_config import (
    S3_OBJECT_METADATA,
    UndecodableJobConfig,
    peek_endpoint_url,
    peek_input_type,
)
from coordinator.lifecycle import JobStatus
from coordinator.service.coordinator import (
    ADVANCE_CONCURRENCY,
    CLUSTER_ADVANCE_CONCURRENCY,
    Coordinator,
    default_instance_id,
)
from coordinator.spider.measured import MeasuredSpider
from coordinator.spider.port import SpiderPort
from coordinator.store.database import reading
from coordinator.store.instances import COORDINATOR, InstanceInUse, Presence
from coordinator.store.jobs import JobStore
from coordinator.store.opening import open_engine
from coordinator.store.schema import compression_jobs as _jobs
from coordinator.task_io import AwsCredentials, CredentialsAuthentication, DefaultAuthentication

if TYPE_CHECKING:
    from coordinator.service.monitoring import MonitoringServer
    from coordinator.spider.grpc.client import GrpcSpider

_log = logging.getLogger(__name__)

EMBEDDED_INSTANCE_ID = "embedded"
"""The embedded default runs one coordinator per data directory, so its name can be stable and a
restart continues its jobs at once instead of waiting for their leases to expire."""


def archive_output_of(config: CoordinatorConfig) -> ArchiveOutputSettings:
    """Where archives go, as the tasks and the clean-up see it."""
    storage = config.clp.archive_output.storage
    if isinstance(storage, ArchiveFsStorage):
        return FsArchiveOutput(directory=storage.directory)
    s3 = storage.s3_config
    credentials = s3.aws_authentication.credentials
    authentication = (
        CredentialsAuthentication(
            credentials=AwsCredentials(
                access_key_id=credentials.access_key_id,
                secret_access_key=credentials.secret_access_key,
                session_token=credentials.session_token,
            )
        )
        if credentials is not None
        else DefaultAuthentication()
    )
    return S3ArchiveOutput(
        bucket=s3.bucket,
        key_prefix=s3.key_prefix,
        region_code=s3.region_code,
        endpoint_url=s3.endpoint_url,
        aws_authentication=authentication,
    )


def worker_settings(config: CoordinatorConfig, url: str) -> WorkerSettings:
    """The environment of the embedded engine's task processes.

    The local object store is always the one this coordinator serves: only jobs that name it read
    from it (see ``coordinator.engine.tasks.compress``), whatever ``logs_input`` says.
    """
    return WorkerSettings(
        database_url=SecretStr(url),
        archive_output=archive_output_of(config),
        staging_directory=config.data_dir / "staging",
        committed_storage=config.extras.committed_status,
        object_store_directory=config.object_store_directory,
    )


def leaves_jobs_not_naming(store: Path) -> Callable[[bytes], str | None]:
    """For the embedded default: why an ``s3_object_metadata`` job is left to others, or ``None``
    when it names the local object store ``store`` (and so is this coordinator's to run)."""
    endpoint = local_store_endpoint(store)

    def leaves(clp_config: bytes) -> str | None:
        try:
            job_endpoint = peek_endpoint_url(clp_config)
        except UndecodableJobConfig:
            return None  # ownership of undecodable blobs is decided elsewhere
        try:
            named = local_store_named(job_endpoint)
        except ValueError:  # not a URL at all (``http://[::1``): it names no local store
            named = None
        if named is not None and is_same_store(named, store):
            return None
        where = f"endpoint_url {job_endpoint}" if job_endpoint else "S3 (no endpoint_url)"
        return (
            f"left Pending: its objects are in {where}, not in this coordinator's local object "
            f"store {endpoint}; without CLP's configuration (--config) it runs only jobs that "
            "name its local store"
        )

    return leaves


def foreign_jobs_problem(engine: Engine, store: Path) -> str | None:
    """Why a coordinator without CLP's configuration must not start on this database, or ``None``.

    It must not when Pending ``s3_object_metadata`` jobs already wait there that do not name its
    local object store ``store``: log-ingestor's jobs, so this is a CLP deployment's database.
    """
    leaves = leaves_jobs_not_naming(store)
    foreign: list[int] = []
    with reading(engine) as connection:
        rows = connection.execute(
            select(_jobs.c.id, _jobs.c.clp_config)
            .where(_jobs.c.status == int(JobStatus.PENDING))
            .order_by(_jobs.c.id)
        )
        for job_id, blob in rows:
            try:
                input_type = peek_input_type(bytes(blob))
            except UndecodableJobConfig:
                continue
            if input_type == S3_OBJECT_METADATA and leaves(bytes(blob)) is not None:
                foreign.append(int(job_id))
    if not foreign:
        return None
    shown = ", ".join(str(job_id) for job_id in foreign[:5]) + (
        f" and {len(foreign) - 5} more" if len(foreign) > 5 else ""
    )
    return (
        f"this database holds {len(foreign)} Pending log-ingestor compression job(s) (id {shown}) "
        f"whose objects are not in this coordinator's local object store {store}: it is a CLP "
        "deployment's database; give the coordinator CLP's configuration with "
        "--config clp-config.yaml"
    )


@dataclass
class Runtime:
    """The open database, the Spider port, and the coordinator wired to them."""

    config: CoordinatorConfig
    engine: Engine
    store: JobStore
    spider: SpiderPort
    coordinator: Coordinator
    embedded: EmbeddedSpider | None
    """The in-process engine, when the engine is ``embedded``."""
    client: GrpcSpider | None = None
    """The connection to a Spider cluster, when the engine is ``spider``."""
    presence: Presence | None = None
    """This coordinator's row in ``coordinator_instances`` (its heartbeat)."""
    monitor: MonitoringServer | None = None
    """``/metrics``, ``/healthz`` and ``/readyz``, when ``coordinator.metrics_port`` is set."""

    def close(self) -> None:
        """Stop the embedded engine (its running tasks die and resume at the next start)."""
        if self.monitor is not None:
            self.monitor.close()
        if self.embedded is not None:
            self.embedded.close()
        if self.client is not None:
            self.client.close()
        if self.presence is not None:
            self.presence.close()
        self.engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


INSTANCE_STALE_AFTER_SECS = 10.0
"""A coordinator whose heartbeat is older than this is gone (``coordinator.store.instances``)."""


def open_runtime(
    config: CoordinatorConfig,
    *,
    lease_secs: float = 30.0,
    stale_after_secs: float = INSTANCE_STALE_AFTER_SECS,
    packages: Mapping[str, str] = CLP_PACKAGES,
) -> Runtime:
    """Everything ``coordinator run`` needs, started. Close it (or use ``with``) to stop.

    The engine is the in-process embedded engine, or, for ``engine: spider``, the Spider cluster
    (or ``coordinator spider serve``) at ``spider.host:spider.port`` over gRPC. Raises
    ``ConfigError`` for the start-up refusals of the module docstring and for a
    ``coordinator.metrics_port`` that cannot be bound, ``SchemaNotCurrent`` and the database's
    errors. With ``coordinator.metrics_port`` set, ``/metrics``, ``/healthz`` and ``/readyz`` are
    served until ``close`` (``coordinator.service.monitoring``). Spider is reached through
    ``MeasuredSpider``, which measures every call. ``packages``: the embedded engine's task
    packages (``EmbeddedSpider``'s ``name → module:factory``; the benchmarks substitute a no-op
    compress task this way).
    """
    legacy = legacy_scheduler_problem(config)
    if legacy is not None:
        raise ConfigError(config.source, [legacy])
    engine = open_engine(config)
    standalone = config.source is None
    if standalone:
        problem = foreign_jobs_problem(engine, config.object_store_directory)
        if problem is not None:
            engine.dispose()
            raise ConfigError(None, [problem])
    # One live process per instance id: a second one waits for the first's heartbeat to lapse,
    # then refuses; a restart after a crash on this host takes the row over at once.
    name = config.extras.instance_id or (
        EMBEDDED_INSTANCE_ID if standalone else default_instance_id()
    )
    presence = Presence(engine, COORDINATOR, name, stale_after_secs=stale_after_secs)
    try:
        presence.register()
    except InstanceInUse as error:
        engine.dispose()
        raise ConfigError(config.source, [str(error)]) from None
    presence.start()
    embedded: EmbeddedSpider | None = None
    client: GrpcSpider | None = None
    spider: SpiderPort
    if config.engine == "embedded":
        try:
            embedded = embedded_spider(
                config, engine, presence=presence, coordinator_name=name, packages=packages
            ).start()
        except BaseException:
            presence.close()
            raise
        spider = MeasuredSpider(embedded)
    else:
        endpoint = config.clp.spider or Spider()
        _warn_about_upstream_requirements(config)
        # gRPC only for a Spider cluster (start-up time of the embedded default, issue 14)
        from coordinator.spider.grpc.client import GrpcSpider  # noqa: PLC0415

        client = GrpcSpider(endpoint.host, endpoint.port)
        spider = MeasuredSpider(client)
    coordinator = Coordinator(
        engine=engine,
        spider=spider,
        settings=config.compression_coordinator,
        archive_output=archive_output_of(config),
        instance_id=name,
        lease_duration=timedelta(seconds=lease_secs),
        owns_undecodable_jobs=standalone,
        max_attempts=config.extras.max_job_attempts,
        cleanup_task=cleanup_task_of(config),
        leaves_job=leaves_jobs_not_naming(config.object_store_directory) if standalone else None,
        advance_concurrency=(
            ADVANCE_CONCURRENCY if embedded is not None else CLUSTER_ADVANCE_CONCURRENCY
        ),
    )
    if embedded is not None:
        embedded.on_job_ended(coordinator.wake)  # polled at once, not after its back-off
    runtime = Runtime(
        config, engine, JobStore(engine), spider, coordinator, embedded, client, presence
    )
    if config.extras.metrics_port is not None:
        # Only with a metrics port (start-up time of the embedded default, issue 14).
        from coordinator.service.monitoring import start_monitoring  # noqa: PLC0415

        try:
            runtime.monitor = start_monitoring(config, engine, coordinator)
        except OSError as error:
            runtime.close()
            where = f"{config.extras.metrics_host}:{config.extras.metrics_port}"
            reason = error.strerror or str(error)
            raise ConfigError(
                config.source, [f"coordinator.metrics_port: cannot listen on {where}: {reason}"]
            ) from None
    return runtime


def embedded_spider(
    config: CoordinatorConfig,
    engine: Engine,
    *,
    presence: Presence | None = None,
    coordinator_name: str | None = None,
    packages: Mapping[str, str] = CLP_PACKAGES,
) -> EmbeddedSpider:
    """The embedded engine with the configuration's settings, not started yet (see
    ``EmbeddedSpider`` for ``presence``, ``coordinator_name`` and ``packages``)."""
    grace = config.extras.embedded_unrecorded_grace_secs
    return EmbeddedSpider(
        engine,
        worker_settings(config, database_url(config)),
        packages=packages,
        workers=config.embedded_workers,
        presence=presence,
        coordinator_name=coordinator_name,
        unrecorded_grace_secs=UNRECORDED_GRACE_SECS if grace is None else grace,
    )


def cleanup_task_of(config: CoordinatorConfig) -> bool:
    """Whether the graphs carry ``compression::cleanup`` (``coordinator.cleanup_task``).

    Unset: only with the embedded engine, whose task package is this coordinator's; a Spider
    cluster's workers may run CLP's own package, which has no cleanup task.
    """
    if config.extras.cleanup_task is not None:
        return config.extras.cleanup_task
    return config.engine == "embedded"


def _warn_about_upstream_requirements(config: CoordinatorConfig) -> None:
    if not isinstance(config.clp.logs_input, S3IngestionConfig) or not isinstance(
        config.clp.archive_output.storage, ArchiveS3Storage
    ):
        _log.warning(
            "logs_input or archive_output is not S3: a Spider cluster running CLP's own task "
            "package needs both (`coordinator spider serve` runs this coordinator's package, "
            "which does not)"
        )
    if config.extras.cleanup_task:
        _log.warning(
            "coordinator.cleanup_task is true: the cluster's workers must run this coordinator's "
            "task package (`coordinator spider serve`); CLP's own package has no "
            "compression::cleanup, so every cancel of a started job would end it Failed "
            "(TaskNotFound): unset it for CLP's package"
        )
