"""The configuration: CLP's models and defaults, the embedded default, errors, database URL."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest
from pydantic import SecretStr, ValidationError
from sqlalchemy.engine import make_url

from coordinator.config.clp import (
    ArchiveFsStorage,
    ArchiveOutput,
    ArchiveS3Storage,
    AwsAuthentication,
    ClpConfig,
    CompressionCoordinator,
    Database,
    FsIngestionConfig,
    Package,
    S3IngestionConfig,
    Spider,
)
from coordinator.config.loader import ConfigError, CoordinatorConfig, database_url, load_config
from coordinator.config.locations import DATA_DIR_ENV, DATABASE_URL_ENV

MIB = 1024 * 1024
USER = "clp-user"
PASSWORD = "s3cr3t p@ss:w/rd%"

CREDENTIALS = """\
  type: "credentials"
  credentials:
    access_key_id: "AKIAEXAMPLE"
    secret_access_key: "wJalrXUtnFEMIEXAMPLEKEY"
"""

# What CLP's Helm chart renders (tools/deployment/package-helm/templates/configmap.yaml) when Spider
# is enabled: compression_coordinator without max_concurrent_jobs, spider host and port, absolute
# container paths, and many sections the coordinator does not read.
HELM_CONFIG = f"""\
package:
  storage_engine: "clp-s"
  query_engine: "clp-s"
bundled: ["database", "queue", "redis", "results_cache"]
database:
  type: "mariadb"
  host: "test-clp-database"
  port: 3306
  names:
    clp: "clp-db"
  auto_commit: false
  compress: true
  ssl_cert: null
compression_scheduler:
  jobs_poll_delay: 0.1
  logging_level: "INFO"
  max_concurrent_tasks_per_job: 0
  type: "spider"
compression_coordinator:
  resource_group:
    name: "compression-coordinator"
  job_polling_interval_millisecs: 100
  result_polling:
    init_backoff_millisecs: 100
    max_backoff_millisecs: 1000
  compression_task_max_retry: 1
  commit_task_max_retry: 1
  database_connection_pool_size: 10
  termination_timeout_secs: 30
  commit_task_soft_timeout_secs: 45
  commit_task_hard_timeout_secs: 60
spider:
  host: "test-spider-storage"
  port: 50051
results_cache:
  host: "test-clp-results-cache"
  port: 27017
  db_name: "clp-query-results"
logs_input:
  type: "s3"
  aws_authentication:
{textwrap.indent(CREDENTIALS, "  ")}
archive_output:
  storage:
    type: "s3"
    staging_directory: "/var/data/staged-archives"
    s3_config:
      endpoint_url: "http://minio:9000"
      region_code: "us-east-1"
      bucket: "clp-archives"
      key_prefix: "archives/"
      aws_authentication:
{textwrap.indent(CREDENTIALS, "      ")}
  target_archive_size: 268435456
  target_dictionaries_size: 33554432
  target_encoded_file_size: 268435456
  target_segment_size: 268435456
  compression_level: 3
  retention_period: null
stream_output:
  storage:
    type: "fs"
    directory: "/var/data/streams"
data_directory: "/var/data"
logs_directory: "/var/log"
tmp_directory: "/var/tmp"
webui:
  host: "localhost"
  port: 4000
"""


@pytest.fixture(autouse=True)
def _clean_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (DATABASE_URL_ENV, DATA_DIR_ENV, "CLP_DB_USER", "CLP_DB_PASS"):
        monkeypatch.delenv(name, raising=False)
    # ./var, the last-resort data directory, then lands in the test's own directory.
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def clp_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLP_DB_USER", USER)
    monkeypatch.setenv("CLP_DB_PASS", PASSWORD)


def config_file(tmp_path: Path, text: str, name: str = "clp-config.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def problems_of(path: Path) -> list[str]:
    """The problem lines ``load_config`` reports for ``path`` (each prefixed with the file)."""
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    lines = str(raised.value).splitlines()
    assert all(line.startswith(f"{path}: ") for line in lines)
    assert len(lines) == len(raised.value.problems)
    return list(raised.value.problems)


# --- CLP's defaults ------------------------------------------------------------------------------


def test_compression_coordinator_defaults_are_clps() -> None:
    section = CompressionCoordinator()
    assert section.model_dump() == {
        "resource_group": {"name": "compression-coordinator"},
        "job_polling_interval_millisecs": 100,
        "max_concurrent_jobs": 1000,
        "result_polling": {"init_backoff_millisecs": 100, "max_backoff_millisecs": 1000},
        "compression_task_max_retry": 1,
        "commit_task_max_retry": 1,
        "database_connection_pool_size": 10,
        "termination_timeout_secs": 30,
        "commit_task_soft_timeout_secs": 45,
        "commit_task_hard_timeout_secs": 60,
        "logging_level": None,  # not CLP's field; honoured when written (coordinator.cli.options)
    }


@pytest.mark.parametrize(
    ("written", "read"),
    [("INFO", "info"), ("warn", "warn"), ("Debug", "debug"), (" ERROR ", "error")],
)
def test_logging_level_takes_pythons_and_rust_logs_names(written: str, read: str) -> None:
    assert CompressionCoordinator(logging_level=written).logging_level == read


def test_an_unknown_logging_level_is_one_problem(tmp_path: Path) -> None:
    path = config_file(tmp_path, "compression_coordinator:\n  logging_level: loud\n")
    (problem,) = problems_of(path)
    assert problem.startswith("compression_coordinator.logging_level: unknown log level 'loud'")


def test_archive_output_defaults_are_clps() -> None:
    output = ArchiveOutput()
    assert output.storage == ArchiveFsStorage(directory=Path("var/data/archives"))
    assert output.target_archive_size == 256 * MIB
    assert output.target_dictionaries_size == 32 * MIB
    assert output.target_encoded_file_size == 256 * MIB
    assert output.target_segment_size == 256 * MIB
    assert output.compression_level == 3
    assert output.retention_period is None
    storage = ArchiveOutput.model_validate(
        {
            "storage": {
                "type": "s3",
                "s3_config": {
                    "bucket": "b",
                    "key_prefix": "p/",
                    "aws_authentication": {"type": "default"},
                },
            }
        }
    ).storage
    assert isinstance(storage, ArchiveS3Storage)
    assert storage.staging_directory == Path("var/data/staged-archives")


def test_spider_database_and_package_defaults_are_clps() -> None:
    assert Spider().model_dump() == {"host": "localhost", "port": 6000}
    assert Database().model_dump() == {
        "type": "mariadb",
        "host": "localhost",
        "port": 3306,
        "names": {"clp": "clp-db"},
        "ssl_cert": None,
        "auto_commit": False,
        "compress": True,
    }
    assert Database().credentials is None
    assert Package().storage_engine == "clp-s"
    config = ClpConfig()
    assert config.spider is None
    assert config.compression_coordinator is None
    assert config.logs_input.type == "fs"
    assert config.logs_input.directory == Path("/")


# --- The embedded default ------------------------------------------------------------------------


def assert_embedded_under(config: CoordinatorConfig, data_dir: Path) -> None:
    assert config.source is None
    assert config.data_dir == data_dir
    assert config.engine == "embedded"
    assert config.embedded_workers == (os.cpu_count() or 1)
    assert config.object_store_directory == data_dir / "objects"
    assert config.archive_directory == data_dir / "archives"
    assert config.clp.archive_output.storage.type == "fs"
    assert not config.database_configured
    assert database_url(config) == f"sqlite:///{data_dir / 'coordinator.db'}"
    assert config.compression_coordinator == CompressionCoordinator()


def test_without_a_file_everything_lives_under_dot_var(tmp_path: Path) -> None:
    assert_embedded_under(load_config(None), tmp_path.resolve() / "var")


def test_without_a_file_everything_lives_under_coordinator_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path / "home"))
    assert_embedded_under(load_config(None), tmp_path.resolve() / "home")


def test_the_data_dir_argument_beats_coordinator_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path / "home"))
    config = load_config(None, data_dir=tmp_path / "cli")
    assert_embedded_under(config, tmp_path.resolve() / "cli")
    # Resolving creates nothing: only a command that writes creates the SQLite file's directory.
    assert not (tmp_path / "cli").exists()
    assert not (tmp_path / "home").exists()


# --- A file --------------------------------------------------------------------------------------


def test_the_file_clps_helm_chart_renders_loads(tmp_path: Path, clp_credentials: None) -> None:
    config = load_config(config_file(tmp_path, HELM_CONFIG))
    assert config.engine == "spider"
    assert config.database_configured
    assert config.clp.spider == Spider(host="test-spider-storage", port=50051)
    assert config.compression_coordinator == CompressionCoordinator()
    assert config.compression_coordinator.max_concurrent_jobs == 1000
    assert isinstance(config.clp.logs_input, S3IngestionConfig)
    assert config.clp.logs_input.aws_authentication.type == "credentials"
    storage = config.clp.archive_output.storage
    assert isinstance(storage, ArchiveS3Storage)
    assert storage.s3_config.bucket == "clp-archives"
    assert storage.s3_config.key_prefix == "archives/"
    assert storage.s3_config.endpoint_url == "http://minio:9000"
    assert config.archive_directory == Path("/var/data/staged-archives")
    assert config.clp.database.host == "test-clp-database"
    assert config.clp.database.clp_database_name == "clp-db"
    url = make_url(database_url(config))
    assert url.drivername == "mysql+pymysql"
    assert (url.host, url.port, url.database) == ("test-clp-database", 3306, "clp-db")
    assert (url.username, url.password) == (USER, PASSWORD)


def test_unknown_keys_are_ignored(tmp_path: Path) -> None:
    config = load_config(
        config_file(
            tmp_path,
            """\
            future_section: {anything: 1}
            package: {storage_engine: "clp-s", query_engine: "presto", new_key: true}
            compression_coordinator: {logging_level: "DEBUG", max_concurrent_jobs: 4}
            spider: {host: "spider", port: 50051, tls: true}
            archive_output: {storage: {type: "fs", directory: "/a", extra: 1}, unknown: 2}
            coordinator: {engine: "embedded"}
            """,
        )
    )
    assert config.compression_coordinator.max_concurrent_jobs == 4
    assert config.archive_directory == Path("/a")
    assert config.engine == "embedded"


def test_non_empty_strings_are_stripped_like_clps(tmp_path: Path, clp_credentials: None) -> None:
    config = load_config(
        config_file(
            tmp_path,
            """\
            spider: {host: "  spider-storage \\t", port: 50051}
            database: {host: " db ", names: {clp: " clp-db  "}}
            compression_coordinator: {resource_group: {name: "  group "}}
            coordinator: {engine: "embedded"}
            """,
        )
    )
    assert config.clp.spider is not None
    assert config.clp.spider.host == "spider-storage"
    assert config.clp.database.host == "db"
    assert config.clp.database.clp_database_name == "clp-db"
    assert config.compression_coordinator.resource_group.name == "group"
    with pytest.raises(ValidationError, match="at least 1 character"):
        Spider(host="   ")


def test_a_missing_type_is_inferred_from_the_keys(tmp_path: Path) -> None:
    config = load_config(
        config_file(
            tmp_path,
            """\
            logs_input: {aws_authentication: {type: default}}
            archive_output:
              storage:
                s3_config: {bucket: b, key_prefix: k/, aws_authentication: {type: default}}
            """,
        )
    )
    assert isinstance(config.clp.logs_input, S3IngestionConfig)
    assert isinstance(config.clp.archive_output.storage, ArchiveS3Storage)
    config = load_config(config_file(tmp_path, "archive_output: {storage: {directory: /a}}"))
    assert config.clp.archive_output.storage == ArchiveFsStorage(directory=Path("/a"))


def test_an_empty_file_means_clps_defaults(tmp_path: Path) -> None:
    config = load_config(config_file(tmp_path, ""))
    assert config.engine == "embedded"
    assert config.clp.package.storage_engine == "clp-s"
    assert not config.database_configured


def test_relative_paths_resolve_against_the_data_directory(tmp_path: Path) -> None:
    path = config_file(
        tmp_path,
        """\
        logs_input: {type: "fs", directory: "logs"}
        archive_output: {storage: {type: "fs"}}
        coordinator: {data_dir: "state", object_store_directory: "bucket-root"}
        """,
    )
    config = load_config(path)
    data_dir = tmp_path.resolve() / "state"
    assert config.data_dir == data_dir
    assert config.archive_directory == data_dir / "var/data/archives"  # CLP's relative default
    assert isinstance(config.clp.logs_input, FsIngestionConfig)
    assert config.clp.logs_input.directory == data_dir / "logs"
    assert config.object_store_directory == data_dir / "bucket-root"

    staged = config_file(
        tmp_path,
        """\
        archive_output:
          storage:
            type: "s3"
            staging_directory: "staging"
            s3_config: {bucket: "b", key_prefix: "k/", aws_authentication: {type: "default"}}
        coordinator: {object_store_directory: "/srv/objects"}
        """,
        name="staged.yaml",
    )
    config = load_config(staged, data_dir=tmp_path / "dd")
    assert config.archive_directory == tmp_path.resolve() / "dd" / "staging"
    assert config.object_store_directory == Path("/srv/objects")


def test_the_data_directory_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = config_file(tmp_path, "coordinator: {data_dir: from-file}")
    assert load_config(path).data_dir == tmp_path.resolve() / "from-file"
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path / "from-env"))
    assert load_config(path).data_dir == tmp_path.resolve() / "from-env"
    assert load_config(path, data_dir=tmp_path / "cli").data_dir == tmp_path.resolve() / "cli"


def test_the_coordinator_section(tmp_path: Path) -> None:
    config = load_config(
        config_file(
            tmp_path,
            """\
            coordinator:
              embedded_workers: 3
              embedded_unrecorded_grace_secs: 2.5
              log_format: "json"
              instance_id: " coordinator-a "
            """,
        )
    )
    assert config.embedded_workers == 3
    assert config.extras.embedded_unrecorded_grace_secs == 2.5
    assert load_config(None).extras.embedded_unrecorded_grace_secs is None  # the engine's 60 s
    assert problems_of(
        config_file(tmp_path, "coordinator: {embedded_unrecorded_grace_secs: 0}")
    ) == ["coordinator.embedded_unrecorded_grace_secs: Input should be greater than 0"]
    assert config.extras.log_format == "json"
    assert config.extras.instance_id == "coordinator-a"
    assert problems_of(config_file(tmp_path, "coordinator: {engin: spider}")) == [
        "coordinator.engin: unknown key; the section takes engine, embedded_workers, "
        "embedded_unrecorded_grace_secs, data_dir, object_store_directory, log_format, "
        "instance_id, committed_status, cleanup_task, max_job_attempts, legacy_scheduler, "
        "metrics_port, metrics_host"
    ]
    assert problems_of(config_file(tmp_path, "coordinator: {log_format: xml}")) == [
        "coordinator.log_format: Input should be 'text' or 'json'"
    ]


# --- Engine selection ----------------------------------------------------------------------------


def test_the_engine_follows_the_spider_section(tmp_path: Path, clp_credentials: None) -> None:
    assert load_config(config_file(tmp_path, "package: {}")).engine == "embedded"
    assert load_config(config_file(tmp_path, "coordinator: null")).engine == "embedded"
    assert load_config(config_file(tmp_path, HELM_CONFIG)).engine == "spider"


def test_an_explicit_spider_engine_needs_a_spider_section(tmp_path: Path) -> None:
    problems = problems_of(config_file(tmp_path, "coordinator: {engine: spider}"))
    assert (
        "spider: Spider configuration is missing. (coordinator.engine is 'spider'; give Spider's "
        "storage service host and port, by default 50051)"
    ) in problems


def test_a_spider_section_without_a_port_is_warned_about(
    tmp_path: Path, clp_credentials: None, caplog: pytest.LogCaptureFixture
) -> None:
    path = config_file(tmp_path, HELM_CONFIG.replace("  port: 50051\n", ""))
    config = load_config(path)
    assert config.clp.spider == Spider(host="test-spider-storage", port=6000)
    assert "spider.port is not set: using CLP's default 6000" in caplog.text
    assert "listens on 50051 by default" in caplog.text


def test_an_explicit_embedded_engine_ignores_the_spider_section(
    tmp_path: Path, clp_credentials: None
) -> None:
    path = config_file(tmp_path, HELM_CONFIG + "coordinator: {engine: embedded}\n")
    assert load_config(path).engine == "embedded"


def test_the_spider_engine_needs_what_clps_coordinator_needs(tmp_path: Path) -> None:
    path = config_file(tmp_path, "spider: {host: spider, port: 50051}")
    # CLP's S3-only rules are not among them: this coordinator's task package handles the local
    # object store and fs archives too (the runtime warns when a cluster may need S3).
    assert problems_of(path) == [
        "compression_coordinator: Compression coordinator configuration is missing. (the Spider "
        "engine needs it; `coordinator.engine: embedded` runs without Spider)",
        "database: the Spider engine needs CLP's database, where Spider's commit task publishes "
        "archives: add a `database` section or set $COORDINATOR_DATABASE_URL",
    ]


# --- Validators ----------------------------------------------------------------------------------

S3_ARCHIVES = """\
archive_output:
  storage:
    type: "s3"
    s3_config:
      bucket: "b"
      key_prefix: {prefix}
      aws_authentication: {{type: "default"}}
"""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            "package: {storage_engine: clp}\nspider: {}\ncompression_coordinator: {}",
            "compression_coordinator: compression-coordinator is only compatible with storage "
            "engine `clp-s`. (package.storage_engine is `clp`)",
            id="coordinator-requires-clp-s",
        ),
        pytest.param(
            "compression_coordinator: {}",
            "compression_coordinator: compression-coordinator requires Spider to be configured. "
            "(no `spider` section)",
            id="coordinator-requires-spider",
        ),
        pytest.param(
            "compression_coordinator: {commit_task_soft_timeout_secs: 60}",
            "compression_coordinator.commit_task_hard_timeout_secs: must be greater than "
            "commit_task_soft_timeout_secs (60 s), got 60 s: Spider rejects a task whose hard "
            "timeout is not above its soft timeout",
            id="commit-soft-not-below-hard",
        ),
        pytest.param(
            "compression_coordinator: {commit_task_hard_timeout_secs: 86401}",
            "compression_coordinator.commit_task_hard_timeout_secs: the hard timeout is 86401 s; "
            "Spider accepts task timeouts of at most 86400 s (24 h)",
            id="hard-timeout-over-24h",
        ),
        pytest.param(
            "compression_coordinator: "
            "{commit_task_soft_timeout_secs: 90000, commit_task_hard_timeout_secs: 86400}",
            "compression_coordinator.commit_task_soft_timeout_secs: the soft timeout is 90000 s; "
            "Spider accepts task timeouts of at most 86400 s (24 h)",
            id="soft-timeout-over-24h",
        ),
        pytest.param(
            "compression_coordinator: {commit_task_soft_timeout_secs: 0}",
            "compression_coordinator.commit_task_soft_timeout_secs: Input should be greater than 0",
            id="soft-timeout-zero",
        ),
        pytest.param(
            "compression_coordinator: "
            "{result_polling: {init_backoff_millisecs: 500, max_backoff_millisecs: 100}}",
            "compression_coordinator.result_polling.max_backoff_millisecs: must be at least "
            "init_backoff_millisecs (500), got 100",
            id="polling-init-above-max",
        ),
        pytest.param(
            "compression_coordinator: {result_polling: {init_backoff_millisecs: 5}}",
            "compression_coordinator.result_polling.max_backoff_millisecs: Field required",
            id="polling-needs-both",
        ),
        pytest.param(
            "archive_output: {target_archive_size: 0}",
            "archive_output.target_archive_size: Input should be greater than 0",
            id="target-archive-size-zero",
        ),
        pytest.param(
            "archive_output: {compression_level: 0}",
            "archive_output.compression_level: Input should be greater than or equal to 1",
            id="compression-level-0",
        ),
        pytest.param(
            "archive_output: {compression_level: 20}",
            "archive_output.compression_level: Input should be less than or equal to 19",
            id="compression-level-20",
        ),
        pytest.param(
            S3_ARCHIVES.format(prefix='"archives"'),
            'archive_output.storage.s3_config.key_prefix: key_prefix must end with "/"',
            id="key-prefix-without-slash",
        ),
        pytest.param(
            S3_ARCHIVES.format(prefix='""'),
            "archive_output.storage.s3_config.key_prefix: key_prefix cannot be empty",
            id="key-prefix-empty",
        ),
        pytest.param(
            "archive_output: {storage: {type: gcs}}",
            "archive_output.storage: expected a mapping whose `type` is 'fs' or 's3'",
            id="storage-type-unknown",
        ),
        pytest.param(
            "archive_output: {storage: {type: fs, directory: ''}}",
            "archive_output.storage.directory: directory cannot be empty",
            id="directory-empty",
        ),
        pytest.param(
            "database: {port: 65536}",
            "database.port: Input should be less than 65536",
            id="database-port",
        ),
        pytest.param(
            "database: {type: postgres}",
            "database.type: Input should be 'mariadb' or 'mysql'",
            id="database-type",
        ),
        pytest.param(
            "database: {names: {spider: spider-db}}",
            "database.names: must name the CLP database under the key `clp`",
            id="database-names-without-clp",
        ),
        pytest.param(
            "package: {storage_engine: clp-x}",
            "package.storage_engine: Input should be 'clp' or 'clp-s'",
            id="storage-engine",
        ),
    ],
)
def test_invalid_values_are_rejected_naming_the_key(
    tmp_path: Path, text: str, expected: str
) -> None:
    assert problems_of(config_file(tmp_path, text)) == [expected]


@pytest.mark.parametrize(
    ("authentication", "expected"),
    [
        pytest.param(
            "{type: profile}", "profile must be set when type is 'profile'", id="profile-missing"
        ),
        pytest.param(
            "{type: credentials, profile: p}",
            "credentials must be set when type is 'credentials'",
            id="credentials-missing",
        ),
        pytest.param(
            "{type: profile, profile: p, credentials: {access_key_id: a, secret_access_key: s}}",
            "profile and credentials cannot be set simultaneously",
            id="both",
        ),
        pytest.param(
            "{type: default, profile: p}",
            "profile and credentials must not be set when type is 'default'",
            id="default-with-profile",
        ),
        pytest.param(
            "{type: env_vars, credentials: {access_key_id: a, secret_access_key: s}}",
            "profile and credentials must not be set when type is 'env_vars'",
            id="env-vars-with-credentials",
        ),
        pytest.param(
            "{type: ec2}",
            "unsupported authentication type 'ec2' (expected 'default', 'credentials', "
            "'profile', 'env_vars')",
            id="unsupported-type",
        ),
    ],
)
def test_aws_authentication_rules(tmp_path: Path, authentication: str, expected: str) -> None:
    text = f"logs_input: {{type: s3, aws_authentication: {authentication}}}"
    assert problems_of(config_file(tmp_path, text)) == [
        f"logs_input.aws_authentication: {expected}"
    ]


def load_authentication(tmp_path: Path, authentication: str) -> AwsAuthentication:
    text = f"logs_input: {{type: s3, aws_authentication: {authentication}}}"
    logs_input = load_config(config_file(tmp_path, text)).clp.logs_input
    assert isinstance(logs_input, S3IngestionConfig)
    return logs_input.aws_authentication


def test_valid_aws_authentications_load(tmp_path: Path) -> None:
    assert load_authentication(tmp_path, "{type: default}").type == "default"
    assert load_authentication(tmp_path, "{type: env_vars}").type == "env_vars"
    assert load_authentication(tmp_path, "{type: profile, profile: ' dev '}").profile == "dev"
    authentication = load_authentication(
        tmp_path,
        "{type: credentials, credentials: {access_key_id: a, secret_access_key: ' s3cr3t ', "
        "session_token: t0k3n}}",
    )
    credentials = authentication.credentials
    assert credentials is not None
    assert isinstance(credentials.secret_access_key, SecretStr)
    assert credentials.secret_access_key.get_secret_value() == "s3cr3t"
    assert credentials.session_token is not None
    assert credentials.session_token.get_secret_value() == "t0k3n"
    assert "s3cr3t" not in repr(authentication)
    assert "t0k3n" not in authentication.model_dump_json()


def test_every_problem_is_reported_on_its_own_line(tmp_path: Path) -> None:
    path = config_file(
        tmp_path,
        """\
        database: {port: 0}
        archive_output: {compression_level: 20, target_segment_size: -1}
        coordinator: {embedded_workers: 0}
        """,
    )
    assert problems_of(path) == [
        "database.port: Input should be greater than 0",
        "archive_output.target_segment_size: Input should be greater than 0",
        "archive_output.compression_level: Input should be less than or equal to 19",
        "coordinator.embedded_workers: Input should be greater than 0",
    ]


# --- Files that cannot be read -------------------------------------------------------------------


def test_a_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.yaml"
    with pytest.raises(ConfigError, match=f"^{path}: configuration file not found$"):
        load_config(path)


def test_malformed_yaml_names_the_line_and_column(tmp_path: Path) -> None:
    path = config_file(tmp_path, "spider:\n  host: [spider\n  port: 50051\n")
    [problem] = problems_of(path)
    assert problem.startswith("not valid YAML at line 3, column 7: ")


@pytest.mark.parametrize("text", ["- spider\n- database\n", "just text\n", "42\n"])
def test_the_top_level_must_be_a_mapping(tmp_path: Path, text: str) -> None:
    [problem] = problems_of(config_file(tmp_path, text))
    assert problem.startswith("(top level): must be a mapping of sections, not a ")


def test_a_directory_is_not_a_file(tmp_path: Path) -> None:
    [problem] = problems_of(tmp_path)
    assert problem.startswith("cannot read the configuration file: ")


# --- Credentials and the database URL ------------------------------------------------------------


def test_credentials_come_from_the_environment_and_stay_hidden(
    tmp_path: Path, clp_credentials: None
) -> None:
    config = load_config(config_file(tmp_path, "database: {host: db}"))
    credentials = config.clp.database.credentials
    assert credentials is not None
    assert isinstance(credentials.user, SecretStr)
    assert isinstance(credentials.password, SecretStr)
    assert credentials.user.get_secret_value() == USER
    assert credentials.password.get_secret_value() == PASSWORD
    for shown in (
        repr(config),
        str(config),
        repr(config.clp),
        str(config.clp),
        repr(config.clp.database),
        str(config.clp.database),
        repr(credentials),
        str(credentials),
        str(config.clp.model_dump()),
        config.clp.model_dump_json(),
        config.clp.database.model_dump_json(),
        credentials.model_dump_json(),
    ):
        assert USER not in shown
        assert PASSWORD not in shown
    assert "credentials" not in config.clp.database.model_dump()


def test_credentials_are_never_read_from_the_file(tmp_path: Path) -> None:
    path = config_file(
        tmp_path, "database: {host: db, credentials: {user: file-user, password: file-pass}}"
    )
    [problem] = problems_of(path)
    assert problem == (
        "database: CLP_DB_USER and CLP_DB_PASS must hold the CLP database user's credentials "
        "(CLP_DB_USER is not set, CLP_DB_PASS is not set); the credentials are never read from "
        "the file (or set $COORDINATOR_DATABASE_URL to name the database instead)"
    )


def test_an_empty_password_counts_as_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLP_DB_USER", USER)
    monkeypatch.setenv("CLP_DB_PASS", "")
    [problem] = problems_of(config_file(tmp_path, "database: {host: db}"))
    assert "(CLP_DB_PASS is empty)" in problem


def test_the_database_url_prefers_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clp_credentials: None
) -> None:
    path = config_file(tmp_path, "database: {host: db.example, port: 3307, names: {clp: clp}}")
    from_file = load_config(path)
    embedded = load_config(None)
    assert database_url(from_file) == (
        "mysql+pymysql://clp-user:s3cr3t%20p%40ss%3Aw%2Frd%25@db.example:3307/clp"
    )
    assert database_url(embedded) == f"sqlite:///{tmp_path.resolve() / 'var' / 'coordinator.db'}"

    monkeypatch.setenv(DATABASE_URL_ENV, "mysql+pymysql://other:pw@elsewhere:3306/clp-db")
    assert database_url(from_file) == "mysql+pymysql://other:pw@elsewhere:3306/clp-db"
    assert database_url(embedded) == "mysql+pymysql://other:pw@elsewhere:3306/clp-db"


def test_the_environment_url_stands_in_for_missing_credentials(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(DATABASE_URL_ENV, "mysql+pymysql://u:p@h:3306/clp-db")
    config = load_config(config_file(tmp_path, "database: {host: db}"))
    assert config.clp.database.credentials is None
    assert database_url(config) == "mysql+pymysql://u:p@h:3306/clp-db"
    monkeypatch.delenv(DATABASE_URL_ENV)
    with pytest.raises(ConfigError, match="CLP_DB_USER and CLP_DB_PASS were not set"):
        database_url(config)


def test_a_file_without_a_database_section_uses_the_embedded_database(
    tmp_path: Path, clp_credentials: None
) -> None:
    config = load_config(config_file(tmp_path, "package: {storage_engine: clp-s}"))
    assert not config.database_configured
    assert database_url(config).startswith("sqlite:///")


def test_an_ipv6_database_host_is_bracketed(tmp_path: Path, clp_credentials: None) -> None:
    config = load_config(config_file(tmp_path, "database: {host: '::1'}"))
    url = make_url(database_url(config))
    assert (url.host, url.port, url.database) == ("::1", 3306, "clp-db")
