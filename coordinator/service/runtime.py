"""Assembling a running coordinator from its configuration: database, Spider engine, settings."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta
from types import TracebackType
from typing import Self

from pydantic import SecretStr
from sqlalchemy import Engine

from coordinator.config.clp import ArchiveFsStorage, ArchiveS3Storage, S3IngestionConfig, Spider
from coordinator.config.loader import CoordinatorConfig, database_url
from coordinator.service.coordinator import Coordinator
from coordinator.spider.embedded.engine import EmbeddedSpider
from coordinator.spider.grpc.client import GrpcSpider
from coordinator.spider.port import SpiderPort
from coordinator.store import migrate
from coordinator.store.database import create_database_engine
from coordinator.store.jobs import JobStore
from coordinator.task_io import AwsCredentials, CredentialsAuthentication, DefaultAuthentication
from coordinator.tasks.context import (
    ArchiveOutputSettings,
    FsArchiveOutput,
    S3ArchiveOutput,
    WorkerSettings,
)

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
    """The environment of the embedded engine's task processes."""
    reads_s3 = isinstance(config.clp.logs_input, S3IngestionConfig)
    return WorkerSettings(
        database_url=SecretStr(url),
        archive_output=archive_output_of(config),
        staging_directory=config.data_dir / "staging",
        object_store_directory=None if reads_s3 else config.object_store_directory,
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

    def close(self) -> None:
        """Stop the embedded engine (its running tasks die and resume at the next start)."""
        if self.embedded is not None:
            self.embedded.close()
        if self.client is not None:
            self.client.close()
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


def open_engine(config: CoordinatorConfig) -> Engine:
    """The database, migrated on the embedded default; elsewhere it must already be current.

    Raises ``SchemaNotCurrent`` for a production database that needs ``alembic upgrade head``.
    """
    settings = config.compression_coordinator
    engine = create_database_engine(
        database_url(config), pool_size=settings.database_connection_pool_size
    )
    if config.source is None:
        migrate.upgrade(engine)
    else:
        migrate.require_current_schema(engine)
    return engine


def open_runtime(config: CoordinatorConfig, *, lease_secs: float = 30.0) -> Runtime:
    """Everything ``coordinator run`` needs, started. Close it (or use ``with``) to stop.

    The engine is the in-process embedded engine, or, for ``engine: spider``, the Spider cluster
    (or ``coordinator spider serve``) at ``spider.host:spider.port`` over gRPC. Raises
    ``SchemaNotCurrent`` and the database's errors.
    """
    engine = open_engine(config)
    standalone = config.source is None
    embedded: EmbeddedSpider | None = None
    client: GrpcSpider | None = None
    spider: SpiderPort
    if config.engine == "embedded":
        embedded = EmbeddedSpider(
            engine, worker_settings(config, database_url(config)), workers=config.embedded_workers
        ).start()
        spider = embedded
    else:
        endpoint = config.clp.spider or Spider()
        _warn_about_upstream_requirements(config)
        client = GrpcSpider(endpoint.host, endpoint.port)
        spider = client
    coordinator = Coordinator(
        engine=engine,
        spider=spider,
        settings=config.compression_coordinator,
        archive_output=archive_output_of(config),
        instance_id=config.extras.instance_id or (EMBEDDED_INSTANCE_ID if standalone else None),
        lease_duration=timedelta(seconds=lease_secs),
        owns_undecodable_jobs=standalone,
    )
    return Runtime(config, engine, JobStore(engine), spider, coordinator, embedded, client)


def _warn_about_upstream_requirements(config: CoordinatorConfig) -> None:
    if not isinstance(config.clp.logs_input, S3IngestionConfig) or not isinstance(
        config.clp.archive_output.storage, ArchiveS3Storage
    ):
        _log.warning(
            "logs_input or archive_output is not S3: a Spider cluster running CLP's own task "
            "package needs both (`coordinator spider serve` runs this coordinator's package, "
            "which does not)"
        )
