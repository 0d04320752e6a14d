"""The sections of CLP's ``clp-config.yaml`` the coordinator reads, modelled as CLP's Python does.

These mirror ``clp_py_utils/clp_config.py`` (pydantic v2) at the CLP revision described in
``docs/clp.md`` (Configuration): the same keys, defaults, constraints and validators, so a file
CLP's own tools accept (for instance the one CLP's Helm chart renders) is accepted here, and keys
this module does not model are ignored, as CLP ignores them. Only the sections the coordinator
reads are modelled: ``package``, ``database``, ``spider``, ``compression_coordinator``,
``logs_input`` and ``archive_output``. The coordinator's own settings are not CLP's and live
apart, in ``coordinator.config.loader`` (the ``coordinator:`` section).

CLP's Rust mirror (``clp-rust-utils/src/clp_config/package/config.rs``) is stricter in places
(``spider.host``/``port`` required, ``database.names`` limited to ``clp``, no whitespace stripping);
the Python model is followed here, as hazard H10 (``docs/hazards.md``) asks. Deliberate
differences from CLP's Python model:

* **Start-up checks beyond CLP** (H10: what would otherwise fail job by job): both commit-task
  timeouts within Spider's window (at most 24 h; the lower bound of 0.1 s already holds for a
  positive number of seconds) and soft < hard, and ``result_polling`` init <= max. CLP checks
  neither; Spider would reject every task graph, or the back-off would never grow.
* **The compression-coordinator rule** (clp-s, Spider configured) has CLP's messages but is reported
  against the key ``compression_coordinator`` rather than the whole file, and both halves are
  reported at once.
* **Database credentials** are only CLP's ``CLP_DB_USER``/``CLP_DB_PASS`` (the only user the
  coordinator needs; CLP keeps a dict of user types), read from the environment and never from the
  file, held as ``SecretStr`` in a private attribute: absent from ``repr``, ``str`` and every dump.
  They are not whitespace-stripped (CLP's Rust coordinator uses them verbatim).
* ``database.names`` takes any key but must name the ``clp`` database (the only one read); CLP's
  Python accepts its name types' keys and fails later without ``clp``; its Rust mirror accepts only
  ``clp``.
* S3 secrets (``secret_access_key``, ``session_token``) are ``SecretStr``: hidden in ``repr`` and
  JSON dumps, read with ``get_secret_value()``.
* ``logs_input`` and ``archive_output.storage`` dispatch on ``type``; without one, the variant
  whose required key is present is chosen (CLP's smart union picks the same one for well-formed
  input), and an unknown ``type`` is one clear error instead of one per variant.
* ``archive_output.storage.s3_config.key_prefix``'s rule is reported on ``key_prefix`` itself.
* ``AwsAuthentication``'s rules are CLP's; the messages are reworded slightly, and a value that is
  not a mapping gets pydantic's own error.
* ``compression_coordinator.logging_level`` is read (CLP's model has no such field; its Helm
  values have one, fed to ``RUST_LOG``): the service's log level (``coordinator.config.log_level``).
* ``package`` models only ``storage_engine`` (``query_engine`` is not the coordinator's concern).
* The models are frozen: CLP updates its models in place (paths made absolute, credentials loaded);
  here such changes produce copies (``model_copy``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    PrivateAttr,
    SecretStr,
    StringConstraints,
    Tag,
    ValidationInfo,
    field_validator,
    model_validator,
)

from coordinator.config.log_level import canonical_level_name

CLP_DB_USER_ENV = "CLP_DB_USER"
CLP_DB_PASS_ENV = "CLP_DB_PASS"

SPIDER_MAX_TIMEOUT_SECS = 24 * 60 * 60
"""Spider accepts task timeouts up to 86 400 000 ms (``docs/spider.md``, Execution policies)."""

SPIDER_STORAGE_DEFAULT_PORT = 50051
"""Where Spider's storage service listens by default; CLP's ``spider.port`` default is 6000."""

MIB = 1024 * 1024

# CLP's shared types (clp_config.py). NonEmptyStr strips surrounding whitespace, as CLP's does.
NonEmptyStr = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1)]
DomainStr = NonEmptyStr
PositiveInt = Annotated[int, Field(gt=0)]
NonNegativeInt = Annotated[int, Field(ge=0)]
Port = Annotated[int, Field(gt=0, lt=2**16)]
ZstdCompressionLevel = Annotated[int, Field(ge=1, le=19)]


def _strip(value: Any) -> Any:
    return value.strip() if isinstance(value, str) else value


NonEmptySecret = Annotated[SecretStr, BeforeValidator(_strip), Field(min_length=1)]
"""A ``NonEmptyStr`` that is a secret: stripped like CLP's, then hidden."""


def _non_empty_directory(value: Any) -> Any:
    # Path("") is Path("."), so an empty string must be caught before pydantic converts it.
    if isinstance(value, str) and not value.strip():
        raise ValueError("directory cannot be empty")
    return value


Directory = Annotated[Path, BeforeValidator(_non_empty_directory)]

StorageEngine = Literal["clp", "clp-s"]
AwsAuthType = Literal["default", "credentials", "profile", "env_vars"]
_AWS_AUTH_TYPES: tuple[str, ...] = get_args(AwsAuthType)


class ClpModel(BaseModel):
    """A section of CLP's file: unknown keys are ignored (as CLP's pydantic models do)."""

    model_config = ConfigDict(extra="ignore", frozen=True)


class Package(ClpModel):
    """``package``: which storage engine the deployment uses."""

    storage_engine: StorageEngine = "clp-s"
    """CLP's Python default; CLP's Rust model defaults to ``clp`` (its coordinator ignores it)."""


class DatabaseCredentials(BaseModel):
    """The CLP database user, from ``CLP_DB_USER``/``CLP_DB_PASS``; both values stay hidden."""

    model_config = ConfigDict(frozen=True)

    user: Annotated[SecretStr, Field(min_length=1)]
    password: Annotated[SecretStr, Field(min_length=1)]

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> DatabaseCredentials:
        """The credentials in ``environ`` (default ``os.environ``).

        Fails with ``ValueError`` naming both variables and saying which is unset or empty.
        """
        env = os.environ if environ is None else environ
        unusable = [
            f"{name} is {'empty' if name in env else 'not set'}"
            for name in (CLP_DB_USER_ENV, CLP_DB_PASS_ENV)
            if not env.get(name)
        ]
        if unusable:
            raise ValueError(
                f"{CLP_DB_USER_ENV} and {CLP_DB_PASS_ENV} must hold the CLP database user's "
                f"credentials ({', '.join(unusable)})"
            )
        return cls(user=SecretStr(env[CLP_DB_USER_ENV]), password=SecretStr(env[CLP_DB_PASS_ENV]))


class Database(ClpModel):
    """``database``: CLP's MariaDB/MySQL server. Credentials never come from the file."""

    type: Literal["mariadb", "mysql"] = "mariadb"
    host: DomainStr = "localhost"
    port: Port = 3306
    names: dict[str, NonEmptyStr] = Field(default_factory=lambda: {"clp": "clp-db"})
    """Database names by purpose; the coordinator uses ``clp`` (tables ``compression_jobs`` …)."""
    ssl_cert: NonEmptyStr | None = None
    """Parsed for compatibility; like CLP's Rust coordinator, the coordinator does not use it."""
    auto_commit: bool = False
    """Parsed for compatibility; the coordinator manages its own transactions."""
    compress: bool = True
    """Parsed for compatibility; the coordinator's driver (PyMySQL) has no protocol compression."""

    _credentials: DatabaseCredentials | None = PrivateAttr(default=None)

    @field_validator("names")
    @classmethod
    def _names_the_clp_database(cls, names: dict[str, str]) -> dict[str, str]:
        if "clp" not in names:
            raise ValueError("must name the CLP database under the key `clp`")
        return names

    @property
    def clp_database_name(self) -> str:
        """The database holding CLP's tables (``names.clp``)."""
        return self.names["clp"]

    @property
    def credentials(self) -> DatabaseCredentials | None:
        """The CLP user's credentials, when loaded (``with_credentials``)."""
        return self._credentials

    def with_credentials(self, credentials: DatabaseCredentials) -> Database:
        """A copy of this section carrying ``credentials`` (never dumped, never in ``repr``)."""
        copy = self.model_copy()
        copy._credentials = credentials
        return copy


class Spider(ClpModel):
    """``spider``: the Spider storage service the coordinator talks to (plaintext gRPC).

    The defaults are CLP's Python ones. Port 6000 is not where Spider's storage service listens
    (50051, ``SPIDER_STORAGE_DEFAULT_PORT``); CLP's Helm chart renders both keys from the Spider
    chart's values, and CLP's Rust coordinator requires both, so a real deployment sets them.
    """

    host: DomainStr = "localhost"
    port: Port = 6000


class SpiderResourceGroup(ClpModel):
    """The Spider resource group the coordinator registers its jobs under."""

    name: NonEmptyStr


class PollingBackoff(ClpModel):
    """Exponential back-off for polling a Spider job's state: starts at init, doubles up to max."""

    init_backoff_millisecs: PositiveInt
    max_backoff_millisecs: PositiveInt

    @field_validator("max_backoff_millisecs")
    @classmethod
    def _max_is_not_below_init(cls, value: int, info: ValidationInfo) -> int:
        # Beyond CLP (H10): with max < init the back-off would never grow.
        init = info.data.get("init_backoff_millisecs")
        if init is not None and value < init:
            raise ValueError(f"must be at least init_backoff_millisecs ({init}), got {value}")
        return value


def _within_spider_window(name: str, value: int) -> int:
    if value > SPIDER_MAX_TIMEOUT_SECS:
        raise ValueError(
            f"{name} is {value} s; Spider accepts task timeouts of at most "
            f"{SPIDER_MAX_TIMEOUT_SECS} s (24 h)"
        )
    return value


class CompressionCoordinator(ClpModel):
    """``compression_coordinator``: CLP's settings for the coordinator, with CLP's defaults.

    CLP's Helm chart renders every key except ``max_concurrent_jobs`` (so 1000 applies).
    ``logging_level`` is not a field of CLP's model (its chart feeds it to ``RUST_LOG``), but an
    operator who writes it here means it: it is the service's log level unless ``--log-level``
    (or ``$COORDINATOR_LOG_LEVEL``) says otherwise.
    """

    resource_group: SpiderResourceGroup = Field(
        default_factory=lambda: SpiderResourceGroup(name="compression-coordinator")
    )
    job_polling_interval_millisecs: PositiveInt = 100
    max_concurrent_jobs: PositiveInt = 1000
    result_polling: PollingBackoff = Field(
        default_factory=lambda: PollingBackoff(
            init_backoff_millisecs=100, max_backoff_millisecs=1000
        )
    )
    compression_task_max_retry: NonNegativeInt = 1
    commit_task_max_retry: NonNegativeInt = 1
    database_connection_pool_size: PositiveInt = 10
    termination_timeout_secs: PositiveInt = 30
    commit_task_soft_timeout_secs: PositiveInt = 45
    # Validated even when defaulted: the soft timeout it must exceed may have been set.
    commit_task_hard_timeout_secs: PositiveInt = Field(default=60, validate_default=True)
    logging_level: Annotated[str, AfterValidator(canonical_level_name)] | None = None
    """The log level (``coordinator.config.log_level``: Python's or ``RUST_LOG``'s names, any
    case); unset: ``info`` for the service."""

    @field_validator("commit_task_soft_timeout_secs")
    @classmethod
    def _soft_timeout_fits_spider(cls, value: int) -> int:
        return _within_spider_window("the soft timeout", value)

    @field_validator("commit_task_hard_timeout_secs")
    @classmethod
    def _hard_timeout_fits_spider(cls, value: int, info: ValidationInfo) -> int:
        _within_spider_window("the hard timeout", value)
        soft = info.data.get("commit_task_soft_timeout_secs")
        if soft is not None and value <= soft:
            raise ValueError(
                f"must be greater than commit_task_soft_timeout_secs ({soft} s), got {value} s: "
                "Spider rejects a task whose hard timeout is not above its soft timeout"
            )
        return value


class S3Credentials(ClpModel):
    """Static AWS credentials."""

    access_key_id: NonEmptyStr
    secret_access_key: NonEmptySecret
    session_token: NonEmptySecret | None = None


class AwsAuthentication(ClpModel):
    """How to authenticate to S3, with CLP's rules on which keys go with which ``type``.

    ``default``: the AWS SDK's default chain; ``credentials``: the static ``credentials``;
    ``profile``: a named ``profile``; ``env_vars``: the ``AWS_*`` environment variables.
    """

    type: AwsAuthType
    profile: NonEmptyStr | None = None
    credentials: S3Credentials | None = None

    @model_validator(mode="before")
    @classmethod
    def _keys_match_type(cls, data: Any) -> Any:
        # Non-mappings (and already-built models) are left to pydantic's own errors.
        if not isinstance(data, Mapping):
            return data
        auth_type = data.get("type")
        profile = data.get("profile")
        credentials = data.get("credentials")
        if auth_type not in _AWS_AUTH_TYPES:
            expected = ", ".join(f"'{name}'" for name in _AWS_AUTH_TYPES)
            raise ValueError(f"unsupported authentication type {auth_type!r} (expected {expected})")
        if profile and credentials:
            raise ValueError("profile and credentials cannot be set simultaneously")
        if auth_type == "profile" and not profile:
            raise ValueError("profile must be set when type is 'profile'")
        if auth_type == "credentials" and not credentials:
            raise ValueError("credentials must be set when type is 'credentials'")
        if auth_type in ("default", "env_vars") and (profile or credentials):
            raise ValueError(f"profile and credentials must not be set when type is '{auth_type}'")
        return data


class S3Config(ClpModel):
    """Where an S3 (or S3-compatible) location is and how to reach it."""

    endpoint_url: str | None = None
    """An S3-compatible endpoint (``http://minio:9000``); unset: AWS."""
    region_code: NonEmptyStr | None = None
    bucket: NonEmptyStr
    key_prefix: str
    aws_authentication: AwsAuthentication


class ArchiveS3Config(S3Config):
    """The archive output's ``s3_config``: its key prefix is a "directory" ending in ``/``.

    CLP's legacy worker builds keys as ``key_prefix + f"{dataset}/{archive_id}"``, which relies on
    the trailing ``/``.
    """

    @field_validator("key_prefix")
    @classmethod
    def _key_prefix_is_a_directory(cls, value: str) -> str:
        if not value:
            raise ValueError("key_prefix cannot be empty")
        if not value.endswith("/"):
            raise ValueError('key_prefix must end with "/"')
        return value


class FsIngestionConfig(ClpModel):
    """``logs_input`` of type ``fs``: logs read from a directory."""

    type: Literal["fs"] = "fs"
    directory: Directory = Path("/")


class S3IngestionConfig(ClpModel):
    """``logs_input`` of type ``s3``: logs read from S3 (jobs carry the objects' locations)."""

    type: Literal["s3"] = "s3"
    aws_authentication: AwsAuthentication


class ArchiveFsStorage(ClpModel):
    """Archives written to a local directory."""

    type: Literal["fs"] = "fs"
    directory: Directory = Path("var/data/archives")


class ArchiveS3Storage(ClpModel):
    """Archives written to S3, staged in a local directory first."""

    type: Literal["s3"] = "s3"
    s3_config: ArchiveS3Config
    staging_directory: Directory = Path("var/data/staged-archives")


# Union tags appear in validation error locations; the prefix lets the loader drop them so that an
# error names the file's keys only (archive_output.storage.s3_config.bucket).
UNION_TAG_PREFIX = "type="


def _storage_kind(s3_key: str) -> Any:
    def kind(value: Any) -> str | None:
        if isinstance(value, Mapping):
            declared = value.get("type", "s3" if s3_key in value else "fs")
        else:
            declared = getattr(value, "type", None)
        return f"{UNION_TAG_PREFIX}{declared}" if declared in ("fs", "s3") else None

    return kind


def _by_type(s3_key: str) -> Any:
    """Dispatch on ``type``; without one, ``s3`` if ``s3_key`` (its required key) is present."""
    return Discriminator(
        _storage_kind(s3_key),
        custom_error_type="storage_type",
        custom_error_message="expected a mapping whose `type` is 'fs' or 's3'",
    )


LogsInput = Annotated[
    Annotated[FsIngestionConfig, Tag(f"{UNION_TAG_PREFIX}fs")]
    | Annotated[S3IngestionConfig, Tag(f"{UNION_TAG_PREFIX}s3")],
    _by_type("aws_authentication"),
]
ArchiveStorage = Annotated[
    Annotated[ArchiveFsStorage, Tag(f"{UNION_TAG_PREFIX}fs")]
    | Annotated[ArchiveS3Storage, Tag(f"{UNION_TAG_PREFIX}s3")],
    _by_type("s3_config"),
]


class ArchiveOutput(ClpModel):
    """``archive_output``: where archives go and how big they grow (sizes in bytes)."""

    storage: ArchiveStorage = Field(default_factory=ArchiveFsStorage)
    target_archive_size: PositiveInt = 256 * MIB
    target_dictionaries_size: PositiveInt = 32 * MIB
    target_encoded_file_size: PositiveInt = 256 * MIB
    target_segment_size: PositiveInt = 256 * MIB
    compression_level: ZstdCompressionLevel = 3
    retention_period: PositiveInt | None = None
    """Minutes; not used by the coordinator (CLP's garbage collector reads it)."""


class ClpConfig(ClpModel):
    """The part of CLP's ``ClpConfig`` the coordinator reads; other top-level keys are ignored.

    ``compression_coordinator`` is validated last so that CLP's rule on it (clp-s, Spider
    configured) sees the sections it depends on.
    """

    package: Package = Field(default_factory=Package)
    database: Database = Field(default_factory=Database)
    spider: Spider | None = None
    logs_input: LogsInput = Field(default_factory=FsIngestionConfig)
    archive_output: ArchiveOutput = Field(default_factory=ArchiveOutput)
    compression_coordinator: CompressionCoordinator | None = None

    @field_validator("compression_coordinator")
    @classmethod
    def _coordinator_needs_clp_s_and_spider(
        cls, value: CompressionCoordinator | None, info: ValidationInfo
    ) -> CompressionCoordinator | None:
        if value is None:
            return value
        problems: list[str] = []
        # A section that failed its own validation is missing from info.data and already reported.
        package = info.data.get("package")
        if isinstance(package, Package) and package.storage_engine != "clp-s":
            problems.append(
                "compression-coordinator is only compatible with storage engine `clp-s`. "
                f"(package.storage_engine is `{package.storage_engine}`)"
            )
        if "spider" in info.data and info.data["spider"] is None:
            problems.append(
                "compression-coordinator requires Spider to be configured. (no `spider` section)"
            )
        if problems:
            raise ValueError(" ".join(problems))
        return value
