"""Sharing a CLP deployment: whose jobs, read from where, and what log-ingestor finds afterwards.

* A job's objects are read from where the job says (issue 9, case 7): a log-ingestor job (an S3
  endpoint) is read from S3 even by a coordinator whose CLP configuration has ``fs`` logs input; a
  job naming another local object store fails naming both stores; the embedded default (no CLP
  configuration) leaves log-ingestor's jobs Pending and untouched, and refuses to start on a
  database that already holds some.
* CLP's legacy scheduler (case 6): a CLP file without ``compression_coordinator`` is refused by
  ``coordinator run`` unless ``coordinator.legacy_scheduler: absent``; read-only commands and the
  embedded default are unaffected.
* ``coordinator submit`` (case 8) leaves the rows log-ingestor leaves for a finished S3 scanner: its
  own start-up queries (copied from ``clp_ingestion.rs``) do not resume the job, and its config
  deserialises as log-ingestor's serde model requires.

Database tests run on SQLite and MariaDB; S3 is moto's server; clp-s is real.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import uuid
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr
from sqlalchemy import Engine, text

from coordinator.cli.main import main
from coordinator.config.clp import ArchiveOutput, FsIngestionConfig
from coordinator.config.loader import CoordinatorConfig, legacy_scheduler_problem, load_config
from coordinator.config.locations import DATA_DIR_ENV, DATABASE_URL_ENV, local_store_endpoint
from coordinator.job_config import (
    ClpIoConfig,
    S3ObjectMetadataInputConfig,
    encode_clp_io_config,
)
from coordinator.lifecycle import JobStatus
from coordinator.runtime import open_runtime
from coordinator.service.ingest import output_config_of, submit_job
from coordinator.store.database import create_database_engine
from coordinator.store.ingestion import S3ScannerJob, ingest_and_submit
from coordinator.task_io import (
    AwsAuthentication,
    AwsCredentials,
    CredentialsAuthentication,
    DefaultAuthentication,
)
from tests.s3_server import ACCESS_KEY_ID, SECRET_ACCESS_KEY, s3_client, s3_endpoint
from tests.sample_logs import json_log_lines
from tests.service_support import job_row, put_logs, raw_rows, run_until_idle

__all__ = ["s3_endpoint"]  # the fixture, imported so that pytest finds it here

PREFIX = "ingest/"
AWS_REGION = "us-east-2"
MOTO_CREDENTIALS = CredentialsAuthentication(
    credentials=AwsCredentials(
        access_key_id=ACCESS_KEY_ID, secret_access_key=SecretStr(SECRET_ACCESS_KEY)
    )
)
QUICK_POLLING = (
    "compression_coordinator: {result_polling: {init_backoff_millisecs: 50, "
    "max_backoff_millisecs: 200}}\n"
)


# --- helpers ------------------------------------------------------------------------------------


def insert_log_ingestor_job(
    engine: Engine,
    *,
    bucket: str,
    objects: list[tuple[str, int]],
    endpoint_url: str | None,
    region: str | None = None,
    authentication: AwsAuthentication | None = None,
) -> int:
    """What log-ingestor writes for objects it found in S3: an ``s3_object_metadata`` job whose
    input carries the bucket's endpoint and region. The compression job's id."""
    scanner = S3ScannerJob(
        bucket=bucket,
        key_prefix=PREFIX,
        region=region,
        endpoint_url=endpoint_url,
        dataset="default",
        timestamp_key="timestamp",
    )
    output = ArchiveOutput()

    def blob(ingestion_job: int, ids: list[int]) -> bytes:
        return encode_clp_io_config(
            ClpIoConfig(
                input=S3ObjectMetadataInputConfig(
                    bucket=bucket,
                    region_code=region,
                    key_prefix=PREFIX,
                    endpoint_url=endpoint_url,
                    aws_authentication=authentication or DefaultAuthentication(),
                    ingestion_job_id=ingestion_job,
                    s3_object_metadata_ids=ids,
                    dataset="default",
                    timestamp_key="timestamp",
                    unstructured=False,
                ),
                output=output_config_of(output),
            )
        )

    rows = [(bucket, key, size) for key, size in objects]
    return ingest_and_submit(engine, scanner, rows, blob).compression_job_id


def insert_aws_job(engine: Engine) -> int:
    """A log-ingestor job on AWS S3 (no endpoint, a region); nothing here ever reads it."""
    return insert_log_ingestor_job(
        engine,
        bucket="prod-logs",
        objects=[(f"{PREFIX}a.jsonl", 100)],
        endpoint_url=None,
        region=AWS_REGION,
    )


def clp_config_file(tmp_path: Path, extra: str = "") -> Path:
    """A CLP ``clp-config.yaml`` (``fs`` logs input, ``fs`` archives, the sections CLP requires
    beside ``compression_coordinator``) for this test's data dir, run on the embedded engine."""
    path = tmp_path / "clp-config.yaml"
    path.write_text(
        "package: {storage_engine: clp-s}\n"
        "spider: {host: 127.0.0.1, port: 50051}\n"
        "archive_output: {storage: {type: fs, directory: archives}}\n"
        f"coordinator: {{engine: embedded, data_dir: {tmp_path / 'var'}, embedded_workers: 2}}\n"
        f"{extra}"
    )
    return path


@pytest.fixture
def on_database(database_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every configuration of the test uses the test's database."""
    monkeypatch.setenv(DATABASE_URL_ENV, database_url)
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    return database_url


# --- case 7: a job's objects are read from where the job says -----------------------------------


@pytest.mark.slow
def test_a_log_ingestor_job_is_read_from_s3_under_a_clp_config_with_fs_logs_input(
    on_database: str, migrated_engine: Engine, tmp_path: Path, s3_endpoint: str
) -> None:
    client = s3_client(s3_endpoint)
    bucket = f"b-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=bucket)
    objects = []
    for name, events in (("api.jsonl", 300), ("db.jsonl", 200)):
        body = json_log_lines(events)
        client.put_object(Bucket=bucket, Key=f"{PREFIX}{name}", Body=body)
        objects.append((f"{PREFIX}{name}", len(body)))
    config = load_config(clp_config_file(tmp_path, QUICK_POLLING))
    assert isinstance(config.clp.logs_input, FsIngestionConfig)

    with open_runtime(config, lease_secs=5) as rt:
        job_id = insert_log_ingestor_job(
            rt.engine,
            bucket=bucket,
            objects=objects,
            endpoint_url=s3_endpoint,
            authentication=MOTO_CREDENTIALS,
        )
        run_until_idle(rt.coordinator, timeout=60)
        row = job_row(rt, job_id)

    assert (row.status, row.status_msg) == (JobStatus.SUCCEEDED, "")
    assert row.uncompressed_size > row.compressed_size > 0
    assert not (tmp_path / "var" / "objects").exists()  # the local store was never involved


@pytest.mark.slow
def test_a_job_naming_another_local_store_fails_naming_both_stores(
    on_database: str, migrated_engine: Engine, tmp_path: Path
) -> None:
    config = load_config(clp_config_file(tmp_path, QUICK_POLLING))
    elsewhere = tmp_path / "elsewhere"
    put_logs(config, tmp_path, ["svc0"])  # in the local store too: it must not be read from there
    put_logs(dataclasses.replace(config, object_store_directory=elsewhere), tmp_path, ["svc0"])

    with open_runtime(config, lease_secs=5) as rt:
        job_id = insert_log_ingestor_job(
            rt.engine,
            bucket="logs",
            objects=[(f"{PREFIX}svc0.jsonl", 1)],
            endpoint_url=local_store_endpoint(elsewhere),
        )
        run_until_idle(rt.coordinator, timeout=60)
        row = job_row(rt, job_id)

    assert row.status == JobStatus.FAILED
    assert row.status_msg.startswith("The Spider compression job failed: ")
    assert (
        f"the job names the local object store {elsewhere} (endpoint "
        f"{local_store_endpoint(elsewhere)}) but this worker serves the local object store "
        f"{config.object_store_directory}"
    ) in row.status_msg


@pytest.mark.slow
def test_the_embedded_default_leaves_a_log_ingestor_job_pending_and_untouched(
    on_database: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = dataclasses.replace(load_config(None, data_dir=tmp_path / "var"), embedded_workers=2)
    put_logs(config, tmp_path, ["svc0"])
    caplog.set_level(logging.WARNING, logger="coordinator.service.coordinator")

    with open_runtime(config, lease_secs=5) as rt:
        foreign = insert_aws_job(rt.engine)
        before = raw_rows(rt.engine, [foreign])
        ours = submit_job(config, rt.engine, timestamp_key="timestamp")
        run_until_idle(rt.coordinator, timeout=60)
        for _ in range(3):
            rt.coordinator.tick()
        assert job_row(rt, ours).status == JobStatus.SUCCEEDED
        assert raw_rows(rt.engine, [foreign]) == before  # never written: no lease, no dispatch
        assert rt.store.history(foreign) == []

    (left,) = [r for r in caplog.records if "left Pending" in r.getMessage()]
    assert left.getMessage() == (
        "left Pending: its objects are in S3 (no endpoint_url), not in this coordinator's local "
        f"object store {local_store_endpoint(config.object_store_directory)}; without CLP's "
        "configuration (--config) it runs only jobs that name its local store"
    )
    assert getattr(left, "job_id", None) == foreign


def test_run_without_clp_config_refuses_to_start_on_a_clp_deployments_database(
    on_database: str,
    migrated_engine: Engine,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    first = insert_aws_job(migrated_engine)
    second = insert_aws_job(migrated_engine)
    before = raw_rows(migrated_engine, [first, second])
    data_dir = tmp_path / "var"
    capsys.readouterr()

    assert main(["run", "--until-idle", "--data-dir", str(data_dir)]) == 2

    assert capsys.readouterr().err == (
        "coordinator: embedded default: this database holds 2 Pending log-ingestor compression "
        f"job(s) (id {first}, {second}) whose objects are not in this coordinator's local object "
        f"store {data_dir / 'objects'}: it is a CLP deployment's database; give the coordinator "
        "CLP's configuration with --config clp-config.yaml\n"
    )
    assert raw_rows(migrated_engine, [first, second]) == before


# --- case 6: CLP's legacy scheduler ---------------------------------------------------------------

LEGACY_REFUSAL = (
    "compression_coordinator: the section is missing, so CLP's legacy compression scheduler would "
    "run log-ingestor's jobs alongside this coordinator; add a `compression_coordinator:` section "
    "to clp-config.yaml (`compression_coordinator: {}` for CLP's defaults; CLP requires `spider` "
    "and `package.storage_engine: clp-s` with it) so CLP's scheduler leaves these jobs alone, or "
    "set `coordinator.legacy_scheduler: absent` if this deployment runs no legacy compression "
    "scheduler"
)


def test_run_refuses_a_clp_config_without_compression_coordinator(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(DATABASE_URL_ENV, f"sqlite:///{tmp_path}/clp.db")
    config = clp_config_file(tmp_path)
    assert main(["db", "upgrade", "--config", str(config)]) == 0
    capsys.readouterr()

    assert main(["run", "--until-idle", "--config", str(config)]) == 2
    assert capsys.readouterr().err == f"coordinator: {config}: {LEGACY_REFUSAL}\n"

    # Read-only commands still work with such a file.
    assert main(["jobs", "--json", "--config", str(config)]) == 0
    assert json.loads(capsys.readouterr().out) == []


def test_legacy_scheduler_absent_lets_such_a_file_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(DATABASE_URL_ENV, f"sqlite:///{tmp_path}/clp.db")
    config = tmp_path / "clp-config.yaml"
    config.write_text(
        "archive_output: {storage: {type: fs, directory: archives}}\n"
        f"coordinator: {{data_dir: {tmp_path / 'var'}, legacy_scheduler: absent}}\n"
    )
    assert main(["db", "upgrade", "--config", str(config)]) == 0
    assert main(["run", "--until-idle", "--config", str(config)]) == 0
    loaded = load_config(config)
    assert loaded.clp.compression_coordinator is None
    assert legacy_scheduler_problem(loaded) is None


def test_the_legacy_scheduler_rule_spares_the_embedded_default_and_a_file_with_the_section(
    tmp_path: Path,
) -> None:
    assert legacy_scheduler_problem(load_config(None, data_dir=tmp_path / "var")) is None
    with_section = clp_config_file(tmp_path, "compression_coordinator: {}\n")
    assert legacy_scheduler_problem(load_config(with_section)) is None
    without = tmp_path / "without.yaml"
    without.write_text("package: {storage_engine: clp-s}\n")
    assert legacy_scheduler_problem(load_config(without)) == LEGACY_REFUSAL


# --- case 8: what log-ingestor finds after `coordinator submit` --------------------------------

# log-ingestor's own statements, copied from
# components/log-ingestor/src/ingestion_job_manager/clp_ingestion.rs (CLP e00317e3) with the
# `formatcp!` table names substituted and `?` turned into named binds.
# load_ingestion_jobs: requested jobs, running jobs (both resumed), inactive jobs (loaded).
LOAD_REQUESTED_OR_RUNNING = "SELECT `id`, `config` FROM `ingestion_job` WHERE `status` = :status;"
LOAD_INACTIVE = (
    "SELECT `id`, `config` FROM `ingestion_job` WHERE `status` NOT in (:requested, :running);"
)
# update_start_after (for every running S3 scanner; `fetch_one`: a missing row fails the job).
LAST_INGESTED_KEY = (
    "SELECT `last_ingested_key` FROM `ingestion_job_s3_scanner_state` WHERE `id` = :id;"
)
# get_unfinished_compression_jobs: the compression jobs it waits for, to mark their objects.
UNFINISHED_COMPRESSION_JOBS = (
    "SELECT `ingestion_job_id`, `compression_job_id`, COUNT(*) as `num_submitted` FROM "
    "`ingested_s3_object_metadata` WHERE `compression_job_id` IS NOT NULL AND `status` = :status "
    "GROUP BY `ingestion_job_id`, `compression_job_id` ORDER BY `compression_job_id` ASC;"
)
# ClpIngestionState::get_buffered_object_metadata: what it would submit (again) for the job.
BUFFERED_OBJECTS = (
    "SELECT `id`, `size` FROM `ingested_s3_object_metadata` WHERE `ingestion_job_id` = :job "
    "AND `status` = :status;"
)


def _optional_non_empty(value: Any) -> bool:
    return value is None or (isinstance(value, str) and value != "")


def _unsigned(value: Any, bits: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**bits


def deserialize_s3_ingestion_job_config(document: str) -> dict[str, Any]:
    """``serde_json::from_str::<S3IngestionJobConfig>`` as
    ``clp-rust-utils/src/job_config/ingestion.rs`` defines it, field by field; the S3 scanner's
    fields. Fails the test where serde would fail (and wherever a field is left out: log-ingestor
    writes every one)."""
    value = json.loads(document)
    # An externally tagged enum: one key, the variant's name.
    assert isinstance(value, dict) and len(value) == 1, value
    ((variant, config),) = value.items()
    assert variant in ("SqsListener", "S3Scanner"), variant
    assert variant == "S3Scanner"  # objects found under a prefix: a scanner, not an SQS listener
    assert isinstance(config, dict)
    # S3ScannerConfig: #[serde(flatten)] BaseConfig, buffer_config, scanning_interval_sec,
    # start_after.
    assert set(config) == {
        "bucket_name",  # NonEmptyString, required
        "key_prefix",  # NonEmptyString, required
        "region",  # Option<NonEmptyString>
        "endpoint_url",  # Option<NonEmptyString>
        "dataset",  # Option<NonEmptyString>
        "timestamp_key",  # Option<NonEmptyString>
        "unstructured",  # bool
        "buffer_config",  # BufferConfig
        "scanning_interval_sec",  # u32
        "start_after",  # Option<NonEmptyString>
    }
    for required in ("bucket_name", "key_prefix"):
        assert isinstance(config[required], str) and config[required], required
    for optional in ("region", "endpoint_url", "dataset", "timestamp_key", "start_after"):
        assert _optional_non_empty(config[optional]), optional
    assert isinstance(config["unstructured"], bool)
    assert _unsigned(config["scanning_interval_sec"], 32)
    buffer = config["buffer_config"]
    assert isinstance(buffer, dict)
    assert set(buffer) == {"flush_threshold_bytes", "timeout_sec", "channel_capacity"}
    assert _unsigned(buffer["flush_threshold_bytes"], 64)
    assert _unsigned(buffer["timeout_sec"], 64)
    assert _unsigned(buffer["channel_capacity"], 64) and buffer["channel_capacity"] >= 1
    return config


def test_submit_leaves_what_log_ingestor_leaves_for_a_finished_scanner(
    on_database: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data_dir = tmp_path / "var"
    files = []
    for name in ("b.jsonl", "a.jsonl"):
        path = tmp_path / "in" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(json_log_lines(20))
        files.append(str(path))
    capsys.readouterr()
    options = ["--prefix", "batch/", "--timestamp-key", "ts", "--dataset", "web"]
    assert main(["submit", *files, *options, "--data-dir", str(data_dir)]) == 0
    compression_job = int(capsys.readouterr().out.strip())
    config: CoordinatorConfig = load_config(None, data_dir=data_dir)

    engine = create_database_engine(on_database)
    try:
        with engine.connect() as connection:
            resumed = [
                row.id
                for status in ("requested", "running")
                for row in connection.execute(text(LOAD_REQUESTED_OR_RUNNING), {"status": status})
            ]
            inactive = connection.execute(
                text(LOAD_INACTIVE), {"requested": "requested", "running": "running"}
            ).all()
            unfinished = connection.execute(
                text(UNFINISHED_COMPRESSION_JOBS), {"status": "submitted"}
            ).all()
            (ingestion_job, config_text) = inactive[0]
            last_key = connection.execute(
                text(LAST_INGESTED_KEY), {"id": ingestion_job}
            ).scalar_one()
            buffered = connection.execute(
                text(BUFFERED_OBJECTS), {"job": ingestion_job, "status": "buffered"}
            ).all()
            status, status_msg = connection.execute(
                text("SELECT status, status_msg FROM ingestion_job WHERE id = :id"),
                {"id": ingestion_job},
            ).one()
    finally:
        engine.dispose()

    assert resumed == []  # nothing for log-ingestor to resume as a live scanner
    assert len(inactive) == 1
    assert (status, status_msg) == ("finished", None)  # where ClpIngestionState::end leaves it
    assert [tuple(row) for row in unfinished] == [(ingestion_job, compression_job, 2)]
    assert buffered == []  # nothing it would submit a second time
    assert last_key == "batch/b.jsonl"  # the scanner's progress: the last key, in S3's order

    scanner = deserialize_s3_ingestion_job_config(config_text)
    assert scanner == {
        "bucket_name": "logs",
        "key_prefix": "batch/",
        "region": None,
        "endpoint_url": local_store_endpoint(config.object_store_directory),
        "dataset": "web",
        "timestamp_key": "ts",
        "unstructured": False,
        "buffer_config": {
            "flush_threshold_bytes": 4 * 1024 * 1024 * 1024,
            "timeout_sec": 300,
            "channel_capacity": 16,
        },
        "scanning_interval_sec": 30,
        "start_after": None,
    }
    # serde_json::to_string's form: compact, fields in declaration order.
    assert config_text.startswith('{"S3Scanner":{"bucket_name":"logs","key_prefix":"batch/",')
