"""Loading the coordinator's configuration: CLP's ``clp-config.yaml``, or the embedded default.

**With a file**, it is CLP's own ``clp-config.yaml`` (the sections in ``coordinator.config.clp``;
``docs/clp.md``, Configuration) plus, optionally, a ``coordinator:`` section for settings CLP does
not have (``CoordinatorExtras``). CLP's tools ignore that key, so one file serves both.

**Without a file**, the embedded default applies: no database server, no Spider, no S3. Everything
lives under one data directory: the SQLite database ``coordinator.db``, the object store
``objects/`` (``<bucket>/<key>`` files standing in for S3 objects) and the archive directory
``archives/``; jobs run on the embedded engine.

Rules:

* **Data directory**: the ``data_dir`` argument (``--data-dir``), else ``$COORDINATOR_HOME``, else
  ``coordinator.data_dir`` from the file, else ``./var``; relative values are taken from the
  current directory. It is made absolute but not created here.
* **Relative paths in the file** (``archive_output.storage.directory``,
  ``archive_output.storage.staging_directory``, ``logs_input.directory``,
  ``coordinator.object_store_directory``) resolve against the data directory, which plays the part
  ``CLP_HOME`` plays for CLP. CLP's defaults are relative (``var/data/archives``), so set
  ``coordinator.data_dir`` to the CLP home to get CLP's layout; CLP's Helm chart renders absolute
  paths, which are kept as they are.
* **Engine**: ``coordinator.engine`` when set; otherwise ``spider`` when the file has a ``spider``
  section (the operator pointed the coordinator at a Spider cluster, even if only by accepting
  CLP's defaults for it) and ``embedded`` when it has none or there is no file.
* **The Spider engine** must be able to run CLP's tasks, so the start-up checks of CLP's coordinator
  (``docs/clp.md``, CLP's Rust coordinator) apply to it, with its messages: ``logs_input`` and
  ``archive_output.storage`` are S3, and the ``compression_coordinator`` and ``spider`` sections
  are present. It also needs CLP's database (the commit task writes there), never the embedded one.
* **Database**: ``database_url`` returns ``$COORDINATOR_DATABASE_URL`` when set; else, for a file
  with a ``database`` section, CLP's MariaDB/MySQL with the credentials of ``CLP_DB_USER`` and
  ``CLP_DB_PASS``; else the embedded SQLite file.
* **The legacy scheduler** (checked when the service starts, ``legacy_scheduler_problem``): a
  file without a ``compression_coordinator`` section is refused, because CLP's legacy compression
  scheduler skips log-ingestor's jobs only when that section exists; ``coordinator.legacy_scheduler:
  absent`` declares that no such scheduler runs. Read-only commands accept such a file.
* **Credentials**: a file with a ``database`` section needs ``CLP_DB_USER`` and ``CLP_DB_PASS``
  (CLP's coordinator refuses to start without them), unless ``$COORDINATOR_DATABASE_URL`` names the
  database instead. They are never read from the file.

Differences from CLP beyond the models' (those are listed in ``coordinator.config.clp``): a file
without a ``database`` section means the embedded SQLite database (CLP would use its default
section, ``localhost:3306``); relative paths resolve against the data directory, not ``CLP_HOME``;
``$COORDINATOR_DATABASE_URL`` can stand in for the ``database`` section and its credentials. An
empty file means all defaults, as for CLP.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import quote

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError
from pydantic_core import ErrorDetails

from coordinator.config.clp import (
    CLP_DB_PASS_ENV,
    CLP_DB_USER_ENV,
    SPIDER_STORAGE_DEFAULT_PORT,
    UNION_TAG_PREFIX,
    ArchiveFsStorage,
    ArchiveOutput,
    ClpConfig,
    CompressionCoordinator,
    DatabaseCredentials,
    FsIngestionConfig,
)
from coordinator.config.locations import (
    DATA_DIR_ENV,
    DATABASE_URL_ENV,
    EMBEDDED_ARCHIVE_DIR,
    EMBEDDED_OBJECT_STORE_DIR,
    embedded_database_url,
    resolve_data_dir,
    under_data_dir,
)
from coordinator.errors import CoordinatorError
from coordinator.lifecycle.storage import DEFAULT_COMMITTED_STORAGE, CommittedStorage

_log = logging.getLogger(__name__)

COORDINATOR_SECTION = "coordinator"

EngineKind = Literal["embedded", "spider"]
LogFormat = Literal["text", "json"]

LEASE_OWNER_MAX_CHARS = 255
"""``compression_jobs.lease_owner`` is ``VARCHAR(255)``."""


# --- The coordinator's own settings (not CLP's) -----------------------------------------------


class CoordinatorExtras(BaseModel):
    """The ``coordinator:`` section: settings CLP's models do not have. Every key is optional.

    Unlike CLP's sections, unknown keys here are errors: this section is the coordinator's own, and
    a misspelt key would otherwise be silently ignored.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    engine: EngineKind | None = None
    """Where jobs run: ``spider`` (a Spider cluster) or ``embedded`` (a pool of local processes).
    Unset: ``spider`` when the file has a ``spider`` section, else ``embedded``."""

    embedded_workers: Annotated[int, Field(gt=0)] | None = None
    """How many tasks the embedded engine runs at once. Unset: the number of CPUs."""

    embedded_unrecorded_grace_secs: Annotated[float, Field(gt=0)] | None = None
    """How long the embedded engine leaves alone a Ready Spider job that no compression job
    records and whose coordinator is gone (it died between RegisterJob and recording the job), in
    case the record is only late, before it cancels it. Unset: the engine's default,
    ``coordinator.engine.embedded.engine.UNRECORDED_GRACE_SECS`` (60 s). A short grace is for tests
    and soaks; a record later than the grace would find its Spider job cancelled."""

    data_dir: Path | None = None
    """The data directory, when neither ``--data-dir`` nor ``$COORDINATOR_HOME`` is given."""

    object_store_directory: Path | None = None
    """The embedded default's local object store: the file ``<dir>/<bucket>/<key>`` stands in for
    the S3 object ``s3://<bucket>/<key>``. Unset: ``objects`` in the data directory; a relative
    path resolves against the data directory."""

    log_format: LogFormat = "text"
    """``text`` (for people) or ``json`` (one object per line, as CLP's Rust services log)."""

    instance_id: (
        Annotated[
            str,
            StringConstraints(
                strip_whitespace=True, min_length=1, max_length=LEASE_OWNER_MAX_CHARS
            ),
        ]
        | None
    ) = None
    """This coordinator's name in job leases and the transition history. Unset: the service
    derives one per process. Two running coordinators must never share one."""

    committed_status: CommittedStorage = DEFAULT_COMMITTED_STORAGE
    """How a Committed job is stored: ``running`` (CLP's RUNNING plus the coordinator's
    ``committed_at`` marker, so CLP's readers see a job in progress) or ``distinct`` (status 5,
    only for a CLP whose readers know that value)."""

    cleanup_task: bool | None = None
    """Whether task graphs carry the coordinator's ``compression::cleanup`` task, with which
    Spider lets a job be cancelled in CommitReady too (without it, CancelJob in CommitReady shuts
    a real Spider's storage down, so a cancel is sent only to a Ready job and a started one ends
    Killed when Spider finishes it). Unset: yes with the
    embedded engine; no with a Spider cluster, whose workers may run CLP's own task package, which
    has no such task (set it for workers running this coordinator's package:
    ``coordinator spider serve``)."""

    max_job_attempts: Annotated[int, Field(ge=1, le=100)] = 5
    """How often a job is tried after an error that is not an outage (a table that cannot be
    created, an unexpected error) before it ends Failed with that error; attempts back off from 1 s
    doubling up to 60 s. Outages (database or Spider unavailable) are retried without limit."""

    legacy_scheduler: Literal["absent"] | None = None
    """``absent``: this deployment runs no legacy compression scheduler (CLP's Celery
    ``compression_scheduler``), so a CLP file without a ``compression_coordinator`` section may be
    used anyway. Unset: such a file is refused at start-up (``legacy_scheduler_problem``)."""

    metrics_port: Annotated[int, Field(ge=0, le=65535)] | None = None
    """The port on which ``coordinator run`` serves ``/metrics`` (Prometheus), ``/healthz`` and
    ``/readyz`` (``coordinator.service.monitoring``); 0: any free port (logged). Unset (the
    default, the embedded demo's too): no port is opened."""

    metrics_host: Annotated[str, StringConstraints(strip_whitespace=True, min_length=1)] = "0.0.0.0"
    """The address the metrics port listens on: every IPv4 interface by default (a scraper or a
    kubelet reaches it from outside the host or pod); ``127.0.0.1`` keeps it local, ``::`` is
    every IPv6 one."""


# --- Errors ------------------------------------------------------------------------------------


class ConfigError(CoordinatorError, ValueError):
    """A configuration that cannot be used; one line per problem, each naming the file and the key.

    ``problems`` holds the lines without the file name (``key: why``).
    """

    def __init__(self, source: Path | None, problems: Sequence[str]) -> None:
        self.source = source
        self.problems = tuple(problems)
        where = str(source) if source is not None else "embedded default"
        super().__init__("\n".join(f"{where}: {problem}" for problem in self.problems))


def _dotted(location: Sequence[int | str]) -> str:
    path = ""
    for part in location:
        if isinstance(part, int):
            path += f"[{part}]"
        elif not part.startswith(UNION_TAG_PREFIX):
            path += f".{part}" if path else part
    return path or "(top level)"


def _reason(error: ErrorDetails) -> str:
    # pydantic prefixes a validator's message with "Value error, "; the message alone reads better.
    cause = error.get("ctx", {}).get("error")
    if error["type"] in ("value_error", "assertion_error") and cause is not None:
        return str(cause)
    if error["type"] == "extra_forbidden":
        # Only the coordinator's own section forbids unknown keys; CLP's sections ignore them.
        return f"unknown key; the section takes {', '.join(CoordinatorExtras.model_fields)}"
    return error["msg"]


def _problems(error: ValidationError, prefix: tuple[str, ...] = ()) -> list[str]:
    # Input values are never echoed: they may be secrets.
    return [
        f"{_dotted(prefix + tuple(detail['loc']))}: {_reason(detail)}"
        for detail in error.errors(include_url=False, include_input=False)
    ]


# --- The loaded configuration --------------------------------------------------------------------


@dataclass(frozen=True)
class CoordinatorConfig:
    """Everything the coordinator reads at start-up, validated and resolved.

    Paths are absolute. ``clp`` holds CLP's sections (relative paths already resolved, database
    credentials attached when the file has a ``database`` section); ``extras`` the ``coordinator:``
    section as written; the other fields are the values the rules above resolve to.
    """

    clp: ClpConfig
    extras: CoordinatorExtras
    source: Path | None
    """The file, or ``None`` for the embedded default."""
    data_dir: Path
    engine: EngineKind
    embedded_workers: int
    object_store_directory: Path
    database_configured: bool
    """Whether the file has a ``database`` section (so CLP's database is used, not SQLite)."""

    @property
    def compression_coordinator(self) -> CompressionCoordinator:
        """The ``compression_coordinator`` section, or CLP's defaults for it when there is none."""
        return self.clp.compression_coordinator or CompressionCoordinator()

    @property
    def archive_directory(self) -> Path:
        """Where archives are written locally: the ``fs`` directory, or the S3 staging directory."""
        storage = self.clp.archive_output.storage
        if isinstance(storage, ArchiveFsStorage):
            return storage.directory
        return storage.staging_directory


def load_config(path: Path | None, *, data_dir: Path | None = None) -> CoordinatorConfig:
    """The configuration in the YAML file ``path``, or the embedded default when ``path`` is None.

    ``data_dir`` is ``--data-dir``. Reads ``$COORDINATOR_HOME``, ``$COORDINATOR_DATABASE_URL``,
    ``$CLP_DB_USER`` and ``$CLP_DB_PASS``; creates nothing.

    Fails with ``ConfigError`` for a missing or unreadable file, YAML that does not parse (with the
    line and column), a top level that is not a mapping, and every invalid value or missing
    requirement, one line per problem naming the dotted key and why.
    """
    if path is None:
        return _embedded_default(data_dir)
    document = _read_mapping(path)
    problems: list[str] = []
    clp: ClpConfig | None = None
    extras: CoordinatorExtras | None = None
    try:
        clp = ClpConfig.model_validate(document)
    except ValidationError as error:
        problems += _problems(error)
    section = document.get(COORDINATOR_SECTION)
    try:
        extras = CoordinatorExtras.model_validate({} if section is None else section)
    except ValidationError as error:
        problems += _problems(error, (COORDINATOR_SECTION,))
    if clp is None or extras is None:
        raise ConfigError(path, problems)
    return _resolve(path, clp, extras, data_dir)


def database_url(config: CoordinatorConfig) -> str:
    """The SQLAlchemy URL of the coordinator's database. It holds the password: never log it.

    ``$COORDINATOR_DATABASE_URL`` when set; else, when the file has a ``database`` section,
    ``mysql+pymysql://<user>:<password>@<host>:<port>/<names.clp>`` (user and password escaped);
    else the embedded SQLite file in the data directory. Creates nothing. This is the one answer
    for the CLI, the service and ``alembic`` (``migrations/env.py``).

    Fails with ``ConfigError`` when the database section has no credentials (``CLP_DB_USER`` and
    ``CLP_DB_PASS`` were not set when the file was loaded).
    """
    from_env = os.environ.get(DATABASE_URL_ENV)
    if from_env:
        return from_env
    if config.database_configured:
        database = config.clp.database
        credentials = database.credentials
        if credentials is None:
            why = (
                f"{CLP_DB_USER_ENV} and {CLP_DB_PASS_ENV} were not set when the configuration "
                "was loaded"
            )
            raise ConfigError(config.source, [_missing_credentials(why)])
        user = quote(credentials.user.get_secret_value(), safe="")
        password = quote(credentials.password.get_secret_value(), safe="")
        host = f"[{database.host}]" if ":" in database.host else database.host
        name = quote(database.clp_database_name, safe="")
        return f"mysql+pymysql://{user}:{password}@{host}:{database.port}/{name}"
    return embedded_database_url(config.data_dir)


def legacy_scheduler_problem(config: CoordinatorConfig) -> str | None:
    """Why the service must not start with this configuration because of CLP's legacy
    compression scheduler, or ``None``.

    CLP's scheduler (``compression_scheduler.py``, ``_schedule_job``) leaves
    ``s3_object_metadata`` jobs alone only when CLP's configuration has a
    ``compression_coordinator`` section; without one it runs them itself, with unguarded writes,
    alongside this coordinator. So a CLP file without that section is refused unless
    ``coordinator.legacy_scheduler: absent`` says no such scheduler runs. The embedded default
    (no file) has no legacy scheduler. Only the service checks this: read-only commands work with
    any valid file.
    """
    if (
        config.source is None
        or config.clp.compression_coordinator is not None
        or config.extras.legacy_scheduler == "absent"
    ):
        return None
    return (
        "compression_coordinator: the section is missing, so CLP's legacy compression scheduler "
        "would run log-ingestor's jobs alongside this coordinator; add a "
        "`compression_coordinator:` section to clp-config.yaml (`compression_coordinator: {}` "
        "for CLP's defaults; CLP requires `spider` and `package.storage_engine: clp-s` with it) "
        "so CLP's scheduler leaves these jobs alone, or set "
        "`coordinator.legacy_scheduler: absent` if this deployment runs no legacy compression "
        "scheduler"
    )


def _missing_credentials(why: str) -> str:
    return (
        f"database: {why}; the credentials are never read from the file "
        f"(or set ${DATABASE_URL_ENV} to name the database instead)"
    )


def _embedded_default(data_dir: Path | None) -> CoordinatorConfig:
    directory = resolve_data_dir(data_dir).resolve()
    clp = ClpConfig(
        archive_output=ArchiveOutput(
            storage=ArchiveFsStorage(directory=directory / EMBEDDED_ARCHIVE_DIR)
        )
    )
    return CoordinatorConfig(
        clp=clp,
        extras=CoordinatorExtras(),
        source=None,
        data_dir=directory,
        engine="embedded",
        embedded_workers=_cpu_count(),
        object_store_directory=directory / EMBEDDED_OBJECT_STORE_DIR,
        database_configured=False,
    )


def _cpu_count() -> int:
    return os.cpu_count() or 1


def _read_mapping(path: Path) -> Mapping[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(path, ["configuration file not found"]) from None
    except OSError as error:
        raise ConfigError(
            path, [f"cannot read the configuration file: {error.strerror or error}"]
        ) from None
    except UnicodeDecodeError as error:
        raise ConfigError(path, [f"not UTF-8 text ({error.reason})"]) from None
    import yaml  # noqa: PLC0415 (only with a configuration file: start-up time, issue 14)

    try:
        document = yaml.safe_load(text)
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(path, [f"not valid YAML{where}: {error.problem or error}"]) from None
    except yaml.YAMLError as error:
        raise ConfigError(path, [f"not valid YAML: {error}"]) from None
    if document is None:
        return {}
    if not isinstance(document, Mapping):
        raise ConfigError(
            path,
            [f"(top level): must be a mapping of sections, not a {type(document).__name__}"],
        )
    return document


def _resolve(
    source: Path, clp: ClpConfig, extras: CoordinatorExtras, data_dir: Path | None
) -> CoordinatorConfig:
    if data_dir is None and not os.environ.get(DATA_DIR_ENV):
        data_dir = extras.data_dir
    directory = resolve_data_dir(data_dir).resolve()
    engine: EngineKind = extras.engine or ("spider" if clp.spider is not None else "embedded")
    database_configured = "database" in clp.model_fields_set
    url_from_env = bool(os.environ.get(DATABASE_URL_ENV))

    problems = (
        _spider_engine_problems(clp, database_configured, url_from_env)
        if engine == "spider"
        else []
    )
    database = clp.database
    if database_configured:
        try:
            database = database.with_credentials(DatabaseCredentials.from_environment())
        except ValueError as error:
            if not url_from_env:
                problems.append(_missing_credentials(str(error)))
    if problems:
        raise ConfigError(source, problems)
    if engine == "spider" and clp.spider is not None and "port" not in clp.spider.model_fields_set:
        _log.warning(
            "spider.port is not set: using CLP's default %d, but Spider's storage service listens "
            "on %d by default",
            clp.spider.port,
            SPIDER_STORAGE_DEFAULT_PORT,
        )

    storage = clp.archive_output.storage
    if isinstance(storage, ArchiveFsStorage):
        storage = storage.model_copy(
            update={"directory": under_data_dir(directory, storage.directory)}
        )
    else:
        storage = storage.model_copy(
            update={"staging_directory": under_data_dir(directory, storage.staging_directory)}
        )
    logs_input = clp.logs_input
    if isinstance(logs_input, FsIngestionConfig):
        logs_input = logs_input.model_copy(
            update={"directory": under_data_dir(directory, logs_input.directory)}
        )
    resolved = clp.model_copy(
        update={
            "database": database,
            "logs_input": logs_input,
            "archive_output": clp.archive_output.model_copy(update={"storage": storage}),
        }
    )
    return CoordinatorConfig(
        clp=resolved,
        extras=extras,
        source=source,
        data_dir=directory,
        engine=engine,
        embedded_workers=extras.embedded_workers or _cpu_count(),
        object_store_directory=under_data_dir(
            directory, extras.object_store_directory or Path(EMBEDDED_OBJECT_STORE_DIR)
        ),
        database_configured=database_configured,
    )


_FOR_SPIDER = " (the Spider engine needs it; `coordinator.engine: embedded` runs without Spider)"


def _spider_engine_problems(
    clp: ClpConfig, database_configured: bool, url_from_env: bool
) -> list[str]:
    # CLP's coordinator refuses to start without these (docs/clp.md, CLP's Rust coordinator);
    # its messages. Its S3-only rules for logs_input and archive_output belong to CLP's upstream
    # task package; this coordinator's own package (behind `coordinator spider serve`) also
    # handles the local object store and fs archives, so the runtime only warns about them.
    problems: list[str] = []
    if clp.compression_coordinator is None:
        problems.append(
            "compression_coordinator: "
            f"Compression coordinator configuration is missing.{_FOR_SPIDER}"
        )
    if clp.spider is None:
        problems.append(
            "spider: Spider configuration is missing. (coordinator.engine is 'spider'; give "
            f"Spider's storage service host and port, by default {SPIDER_STORAGE_DEFAULT_PORT})"
        )
    if not database_configured and not url_from_env:
        problems.append(
            "database: the Spider engine needs CLP's database, where Spider's commit task "
            f"publishes archives: add a `database` section or set ${DATABASE_URL_ENV}"
        )
    return problems
