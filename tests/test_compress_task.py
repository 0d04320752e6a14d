"""The compress task with the real clp-s: local objects and moto's S3 in, fs and S3 archives out.

Database tests run on SQLite and MariaDB (``migrated_engine``). Nothing of clp-s is mocked; one
test runs it through a recording wrapper script to see its exact arguments, list file and
environment.
"""

from __future__ import annotations

import json
import re
import stat
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr
from sqlalchemy import Engine
from yscope_clp_core import KqlQuery, open_archive, search_archive

from coordinator.archive_storage import FsArchiveOutput, S3ArchiveOutput
from coordinator.archive_storage.errors import ArchiveStorageError
from coordinator.archive_storage.storage import archive_key, remove_archive, store_archive
from coordinator.config.locations import local_store_endpoint
from coordinator.engine.tasks.compress import _clp_s_binary, _stderr_summary, clp_s_s3_compress
from coordinator.engine.tasks.context import TaskContext, TaskError, WorkerSettings
from coordinator.engine.tasks.s3_urls import s3_object_url
from coordinator.store.stored_archives import StoredArchiveRecord, stored_archives
from coordinator.task_io import (
    ArchiveMetadata,
    AwsAuthentication,
    AwsCredentials,
    ClpSCompressionOption,
    CompressionTaskOutput,
    CredentialsAuthentication,
    DefaultAuthentication,
    S3InputSource,
    encode_dataset,
)
from tests.s3_server import ACCESS_KEY_ID, SECRET_ACCESS_KEY, s3_client, s3_endpoint
from tests.sample_logs import ERROR_EVERY, START_MS, STEP_MS, json_log_lines, write_json_logs

__all__ = ["s3_endpoint"]  # the fixture, imported so that pytest finds it here

JOB_ID = 9001
DATASET = "web_logs"
BUCKET = "logs"
INPUT_CREDENTIALS = CredentialsAuthentication(
    credentials=AwsCredentials(
        access_key_id=ACCESS_KEY_ID, secret_access_key=SecretStr(SECRET_ACCESS_KEY)
    )
)


@pytest.fixture
def worker_database_url(migrated_engine: Engine) -> str:
    """The migrated test database's URL, password included, for the worker settings."""
    return migrated_engine.url.render_as_string(hide_password=False)


def settings_for(
    tmp_path: Path,
    database_url: str,
    output: FsArchiveOutput | S3ArchiveOutput | None = None,
    *,
    local_objects: bool = True,
    clp_s_path: Path | None = None,
) -> WorkerSettings:
    return WorkerSettings(
        database_url=SecretStr(database_url),
        archive_output=output or FsArchiveOutput(directory=tmp_path / "archives"),
        staging_directory=tmp_path / "staging",
        object_store_directory=tmp_path / "objects" if local_objects else None,
        clp_s_path=clp_s_path,
    )


def task_inputs(
    keys: list[str],
    *,
    bucket: str = BUCKET,
    dataset: str | None = DATASET,
    endpoint_url: str | None = None,
    store: Path | None = None,
    authentication: AwsAuthentication | None = None,
    target_encoded_size: int = 64 * 1024 * 1024,
    unstructured: bool = False,
) -> list[bytes]:
    option = ClpSCompressionOption(
        target_encoded_size=target_encoded_size,
        compression_level=3,
        timestamp_key="timestamp",
        unstructured=unstructured,
    )
    source = S3InputSource(
        endpoint_url=local_store_endpoint(store) if store is not None else endpoint_url,
        bucket=bucket,
        aws_authentication=authentication or DefaultAuthentication(),
        object_keys=keys,
    )
    return [option.to_msgpack(), encode_dataset(dataset), source.to_msgpack()]


def run_task(
    settings: WorkerSettings, inputs: list[bytes], instance: int = 1
) -> list[ArchiveMetadata]:
    context = TaskContext(job_id=JOB_ID, task_id="0", instance_id=instance, settings=settings)
    [payload] = clp_s_s3_compress(context, inputs)
    output = CompressionTaskOutput.from_msgpack(payload)
    return list(output.archives)


def records(engine: Engine) -> list[StoredArchiveRecord]:
    with engine.connect() as connection:
        return stored_archives(connection, JOB_ID)


def search(archive: Path, query: str) -> list[dict[str, Any]]:
    with search_archive(archive, KqlQuery(query)) as results:
        return [event.get_kv_pairs() for event in results]


def assert_nothing_left(tmp_path: Path, engine: Engine) -> None:
    """No archive, no record, no scratch directory."""
    for directory in (tmp_path / "archives", tmp_path / "staging"):
        leftovers = [p for p in directory.rglob("*") if p.is_file()] if directory.exists() else []
        assert leftovers == [], leftovers
    if (tmp_path / "staging").exists():
        assert list((tmp_path / "staging").iterdir()) == []
    assert records(engine) == []


# --- local objects → fs archives ---------------------------------------------------------------


def test_local_objects_compress_into_a_searchable_fs_archive(
    migrated_engine: Engine, worker_database_url: str, tmp_path: Path
) -> None:
    write_json_logs(tmp_path / "objects" / BUCKET / "app/api.jsonl", 200, service="api")
    write_json_logs(tmp_path / "objects" / BUCKET / "app/db 1.jsonl", 100, service="db")
    settings = settings_for(tmp_path, worker_database_url)

    [archive] = run_task(
        settings, task_inputs(["app/api.jsonl", "app/db 1.jsonl"], store=tmp_path / "objects")
    )

    path = tmp_path / "archives" / DATASET / archive.id
    assert path.is_file()
    assert archive.size == path.stat().st_size
    assert archive.begin_timestamp == START_MS
    assert archive.end_timestamp == START_MS + 199 * STEP_MS
    assert archive.uncompressed_size > archive.size > 0
    [record] = records(migrated_engine)
    assert (record.location, record.archive_id, record.dataset) == (str(path), archive.id, DATASET)
    assert (record.task_id, record.instance_id, record.size) == ("0", 1, archive.size)
    assert search(path, 'request_id: "db-000042"') == [
        event for event in _events("db", 100) if event["request_id"] == "db-000042"
    ]
    assert len(search(path, "service: api AND level: ERROR")) == 200 // ERROR_EVERY
    with open_archive(path, "r") as reader:
        assert sum(1 for _ in reader) == 300
    assert list((tmp_path / "staging").iterdir()) == []


def test_small_target_size_makes_several_archives_all_stored_and_recorded(
    migrated_engine: Engine, worker_database_url: str, tmp_path: Path
) -> None:
    write_json_logs(tmp_path / "objects" / BUCKET / "big.jsonl", 1500)
    settings = settings_for(tmp_path, worker_database_url)

    archives = run_task(
        settings,
        task_inputs(["big.jsonl"], target_encoded_size=64 * 1024, store=tmp_path / "objects"),
    )

    assert len(archives) >= 2
    assert len({archive.id for archive in archives}) == len(archives)
    assert sorted(r.archive_id for r in records(migrated_engine)) == sorted(a.id for a in archives)
    events = 0
    for archive in archives:
        path = tmp_path / "archives" / DATASET / archive.id
        assert path.stat().st_size == archive.size
        with open_archive(path, "r") as reader:
            events += sum(1 for _ in reader)
    assert events == 1500
    assert archives[0].begin_timestamp == START_MS
    assert max(a.end_timestamp for a in archives) == START_MS + 1499 * STEP_MS


def test_no_dataset_stores_under_default_and_reports_none(
    migrated_engine: Engine, worker_database_url: str, tmp_path: Path
) -> None:
    write_json_logs(tmp_path / "objects" / BUCKET / "a.jsonl", 10)
    settings = settings_for(tmp_path, worker_database_url)
    context = TaskContext(job_id=JOB_ID, task_id="3", instance_id=7, settings=settings)

    [payload] = clp_s_s3_compress(
        context, task_inputs(["a.jsonl"], dataset=None, store=tmp_path / "objects")
    )

    output = CompressionTaskOutput.from_msgpack(payload)
    assert output.dataset is None
    assert (tmp_path / "archives" / "default" / output.archives[0].id).is_file()
    assert [r.dataset for r in records(migrated_engine)] == ["default"]


def test_a_missing_local_object_fails_naming_it_and_leaves_nothing(
    migrated_engine: Engine, worker_database_url: str, tmp_path: Path
) -> None:
    write_json_logs(tmp_path / "objects" / BUCKET / "present.jsonl", 10)
    settings = settings_for(tmp_path, worker_database_url)

    with pytest.raises(TaskError, match=r"1 of 2 object\(s\) not found .*: logs/gone/away\.jsonl"):
        run_task(
            settings, task_inputs(["present.jsonl", "gone/away.jsonl"], store=tmp_path / "objects")
        )

    assert_nothing_left(tmp_path, migrated_engine)


@pytest.mark.parametrize("key", ["../escape.jsonl", "/etc/passwd", "a/./b", "two\nlines"])
def test_a_key_that_is_no_local_path_is_refused(tmp_path: Path, key: str) -> None:
    settings = settings_for(tmp_path, f"sqlite:///{tmp_path}/unused.db")
    with pytest.raises(TaskError, match="cannot be a local file path"):
        run_task(settings, task_inputs([key], store=tmp_path / "objects"))


def test_a_failure_after_storing_removes_every_stored_archive_and_record(
    migrated_engine: Engine,
    worker_database_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    write_json_logs(tmp_path / "objects" / BUCKET / "big.jsonl", 1500)
    settings = settings_for(tmp_path, worker_database_url)
    real_store = store_archive
    calls: list[str] = []

    def store_then_fail(*arguments: Any) -> str:
        if calls:
            raise TaskError("injected: the second archive cannot be stored")
        location = real_store(*arguments)
        calls.append(location)
        return location

    monkeypatch.setattr("coordinator.engine.tasks.compress.store_archive", store_then_fail)

    with pytest.raises(TaskError, match="injected"):
        run_task(
            settings,
            task_inputs(["big.jsonl"], target_encoded_size=64 * 1024, store=tmp_path / "objects"),
        )

    assert len(calls) == 1
    assert not Path(calls[0]).exists()
    assert_nothing_left(tmp_path, migrated_engine)


# --- moto's S3 ---------------------------------------------------------------------------------


RECORDER = """#!/bin/sh
record="{record}"
printf '%s\\n' "$@" > "$record/args"
printf '%s\\n' "AWS_ACCESS_KEY_ID=${{AWS_ACCESS_KEY_ID-<unset>}}" \\
    "AWS_SECRET_ACCESS_KEY=${{AWS_SECRET_ACCESS_KEY-<unset>}}" \\
    "AWS_SESSION_TOKEN=${{AWS_SESSION_TOKEN-<unset>}}" > "$record/env"
previous=""
for argument in "$@"; do
    if [ "$previous" = "--files-from" ]; then
        cp "$argument" "$record/list"
        basename "$argument" > "$record/list-name"
    fi
    previous="$argument"
done
exec "{real}" "$@"
"""


@pytest.fixture
def recording_clp_s(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """A wrapper around the real clp-s that records its arguments, list file and AWS variables."""
    record = tmp_path / "clp-s-record"
    record.mkdir()
    real = _clp_s_binary(settings_for(tmp_path, "sqlite://"))
    wrapper = tmp_path / "clp-s-recorder"
    wrapper.write_text(RECORDER.format(record=record, real=real))
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    yield wrapper, record


def new_bucket(client: Any) -> str:
    name = f"b-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=name)
    return name


def test_s3_input_with_credentials_into_an_s3_archive_output(
    migrated_engine: Engine,
    worker_database_url: str,
    tmp_path: Path,
    s3_endpoint: str,
    recording_clp_s: tuple[Path, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client = s3_client(s3_endpoint)
    logs, archives_bucket = new_bucket(client), new_bucket(client)
    client.put_object(Bucket=logs, Key="in/api.jsonl", Body=json_log_lines(120, service="api"))
    client.put_object(Bucket=logs, Key="in/web+1.jsonl", Body=json_log_lines(80, service="web"))
    output = S3ArchiveOutput(
        bucket=archives_bucket,
        key_prefix="clp/archives",
        endpoint_url=s3_endpoint,
        aws_authentication=INPUT_CREDENTIALS,
    )
    wrapper, record = recording_clp_s
    settings = settings_for(
        tmp_path, worker_database_url, output, local_objects=False, clp_s_path=wrapper
    )
    # A token of other credentials in the worker's environment must not reach clp-s.
    monkeypatch.setenv("AWS_SESSION_TOKEN", "stale-token-of-someone-else")
    keys = ["in/api.jsonl", "in/web+1.jsonl"]
    inputs = task_inputs(
        keys, bucket=logs, endpoint_url=s3_endpoint, authentication=INPUT_CREDENTIALS
    )

    [archive] = run_task(settings, inputs, instance=4)

    list_name = f"compression-{JOB_ID}-0-4-log-paths.txt"
    assert (record / "list-name").read_text().strip() == list_name
    assert (record / "list").read_text() == "".join(f"{s3_endpoint}/{logs}/{k}\n" for k in keys)
    arguments = (record / "args").read_text().splitlines()
    assert arguments[0] == "c"
    assert arguments[2:] == [
        "--print-archive-stats",
        "--target-encoded-size",
        str(64 * 1024 * 1024),
        "--compression-level",
        "3",
        "--single-file-archive",
        "--auth",
        "s3",
        "--timestamp-key",
        "timestamp",
        "--files-from",
        arguments[-1],
    ]
    assert (record / "env").read_text().splitlines() == [
        f"AWS_ACCESS_KEY_ID={ACCESS_KEY_ID}",
        f"AWS_SECRET_ACCESS_KEY={SECRET_ACCESS_KEY}",
        "AWS_SESSION_TOKEN=<unset>",
    ]

    key = f"clp/archives/{DATASET}/{archive.id}"
    assert archive_key(output, DATASET, archive.id) == key
    head = client.head_object(Bucket=archives_bucket, Key=key)
    assert head["ContentLength"] == archive.size
    [stored] = records(migrated_engine)
    assert stored.location == f"s3://{archives_bucket}/{key}"
    downloaded = tmp_path / "downloaded.clp"
    client.download_file(archives_bucket, key, str(downloaded))
    assert [e["request_id"] for e in search(downloaded, "service: web AND latency_ms > 0")] == [
        f"web-{i:06d}" for i in range(80)
    ]
    assert list((tmp_path / "staging").iterdir()) == []


def test_a_clp_s_failure_reports_its_exit_and_leaves_nothing_behind(
    migrated_engine: Engine, worker_database_url: str, tmp_path: Path, s3_endpoint: str
) -> None:
    client = s3_client(s3_endpoint)
    logs = new_bucket(client)
    client.put_object(Bucket=logs, Key="present.jsonl", Body=json_log_lines(50))
    settings = settings_for(tmp_path, worker_database_url, local_objects=False)
    inputs = task_inputs(
        ["present.jsonl", "absent.jsonl"],
        bucket=logs,
        endpoint_url=s3_endpoint,
        authentication=INPUT_CREDENTIALS,
    )

    with pytest.raises(TaskError) as raised:
        run_task(settings, inputs)

    message = str(raised.value)
    assert message.startswith(
        f"clp-s exited with 1 while compressing 2 object(s) from {logs} "
        "(present.jsonl and 1 more): "
    )
    assert f"{logs}/absent.jsonl" in message
    assert "404" in message
    assert "X-Amz-" not in message
    assert len(message) < 512
    # clp-s leaves a junk archive (and prints its stats) when it fails: none of it may survive.
    assert_nothing_left(tmp_path, migrated_engine)


def test_a_key_clp_s_cannot_fetch_fails_before_clp_s_runs(
    migrated_engine: Engine, worker_database_url: str, tmp_path: Path, s3_endpoint: str
) -> None:
    settings = settings_for(tmp_path, worker_database_url, local_objects=False)
    inputs = task_inputs(["with space.jsonl"], endpoint_url=s3_endpoint)

    with pytest.raises(TaskError, match=r"cannot read object 'with space\.jsonl' of bucket 'logs'"):
        run_task(settings, inputs)

    assert not (tmp_path / "staging").exists()
    assert records(migrated_engine) == []


# --- where a job's objects are read from ----------------------------------------------------------


def test_an_s3_job_is_read_from_s3_by_a_worker_that_serves_a_local_store(
    migrated_engine: Engine, worker_database_url: str, tmp_path: Path, s3_endpoint: str
) -> None:
    # What log-ingestor writes (an S3 endpoint) is read from S3, whatever the worker's local store.
    client = s3_client(s3_endpoint)
    logs = new_bucket(client)
    client.put_object(Bucket=logs, Key="app/s3.jsonl", Body=json_log_lines(40))
    settings = settings_for(tmp_path, worker_database_url)
    assert settings.object_store_directory == tmp_path / "objects"

    [archive] = run_task(
        settings,
        task_inputs(
            ["app/s3.jsonl"],
            bucket=logs,
            endpoint_url=s3_endpoint,
            authentication=INPUT_CREDENTIALS,
        ),
    )

    path = tmp_path / "archives" / DATASET / archive.id
    with open_archive(path, "r") as reader:
        assert sum(1 for _ in reader) == 40
    assert [r.archive_id for r in records(migrated_engine)] == [archive.id]


def test_a_job_naming_another_local_store_fails_naming_both(
    migrated_engine: Engine, worker_database_url: str, tmp_path: Path
) -> None:
    for store in ("objects", "elsewhere"):
        write_json_logs(tmp_path / store / BUCKET / "a.jsonl", 10)
    settings = settings_for(tmp_path, worker_database_url)
    elsewhere = tmp_path / "elsewhere"

    with pytest.raises(TaskError) as raised:
        run_task(settings, task_inputs(["a.jsonl"], store=elsewhere))

    assert str(raised.value) == (
        f"the job names the local object store {elsewhere} "
        f"(endpoint {local_store_endpoint(elsewhere)}) but this worker serves the local object "
        f"store {tmp_path / 'objects'}"
    )
    assert_nothing_left(tmp_path, migrated_engine)


def test_a_job_naming_a_local_store_fails_on_a_worker_without_one(tmp_path: Path) -> None:
    write_json_logs(tmp_path / "objects" / BUCKET / "a.jsonl", 10)
    settings = settings_for(tmp_path, f"sqlite:///{tmp_path}/unused.db", local_objects=False)
    with pytest.raises(TaskError, match="but this worker serves no local object store"):
        run_task(settings, task_inputs(["a.jsonl"], store=tmp_path / "objects"))


# --- refusals ----------------------------------------------------------------------------------


def test_unstructured_input_is_refused(tmp_path: Path) -> None:
    write_json_logs(tmp_path / "objects" / BUCKET / "a.jsonl", 5)
    settings = settings_for(tmp_path, f"sqlite:///{tmp_path}/unused.db")
    with pytest.raises(TaskError, match="unstructured logs need CLP's log-converter"):
        run_task(settings, task_inputs(["a.jsonl"], unstructured=True, store=tmp_path / "objects"))
    assert not (tmp_path / "staging").exists()


def test_an_undecodable_input_is_named(tmp_path: Path) -> None:
    settings = settings_for(tmp_path, f"sqlite:///{tmp_path}/unused.db")
    inputs = task_inputs(["a.jsonl"], store=tmp_path / "objects")
    with pytest.raises(TaskError, match=r"input 3 \(S3InputSource\) is invalid: S3InputSource"):
        run_task(settings, [*inputs[:2], b"\x93\x01"])
    with pytest.raises(TaskError, match=r"takes 3 inputs"):
        run_task(settings, inputs[:2])


def test_an_unparsable_stats_line_kills_clp_s(tmp_path: Path) -> None:
    # The one test with a stand-in for clp-s: the real one cannot be made to print a bad line.
    stand_in = tmp_path / "clp-s-stand-in"
    stand_in.write_text("#!/bin/sh\necho 'not json'\nexec sleep 60\n")
    stand_in.chmod(stand_in.stat().st_mode | stat.S_IXUSR)
    write_json_logs(tmp_path / "objects" / BUCKET / "a.jsonl", 5)
    settings = settings_for(tmp_path, f"sqlite:///{tmp_path}/unused.db", clp_s_path=stand_in)
    started = time.monotonic()

    with pytest.raises(TaskError, match=r"unparsable archive stats line .*: 'not json'"):
        run_task(settings, task_inputs(["a.jsonl"], store=tmp_path / "objects"))

    assert time.monotonic() - started < 10
    assert list((tmp_path / "staging").iterdir()) == []


def test_clp_s_stderr_is_summarised_without_timestamps_and_signatures() -> None:
    # Lines as clp-s 0.12.1b0 prints them for a request S3 refuses.
    stderr = [
        "2026-11-30T02:10:03.507+00:00 [error] Encountered curl error while reading "
        "http://127.0.0.1:43151/logs/a.jsonl - Code: 22 - Message: The requested URL returned "
        "error: 400 Bad request syntax ('GET /logs/a.jsonl?X-Amz-Algorithm=AWS4-HMAC-SHA256&"
        "X-Amz-Credential=k%2F20261130%2Fus-east-1%2Fs3%2Faws4_request&X-Amz-Signature=abc "
        "HTTP/1.1')\n",
        "2026-11-30T02:10:03.511+00:00 [error] Encountered error while parsing input.\n",
        "\n",
    ]
    assert _stderr_summary(stderr) == (
        "[error] Encountered curl error while reading http://127.0.0.1:43151/logs/a.jsonl - "
        "Code: 22 - Message: The requested URL returned error: 400 Bad request syntax "
        "('GET /logs/a.jsonl?… HTTP/1.1') / [error] Encountered error while parsing input."
    )
    assert _stderr_summary([]) == "(nothing on stderr)"
    assert len(_stderr_summary(["x" * 1000])) == 300


# --- archive storage ---------------------------------------------------------------------------


def staged_file(tmp_path: Path, content: bytes = b"archive bytes") -> Path:
    path = tmp_path / "staged" / uuid.uuid4().hex
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return path


def test_fs_archives_are_stored_under_the_dataset_and_removed_idempotently(tmp_path: Path) -> None:
    output = FsArchiveOutput(directory=tmp_path / "archives")
    local = staged_file(tmp_path)

    location = store_archive(output, local, "ds", "archive-1")

    assert location == str(tmp_path / "archives" / "ds" / "archive-1")
    assert Path(location).read_bytes() == b"archive bytes"
    assert not local.exists()
    assert [p.name for p in (tmp_path / "archives" / "ds").iterdir()] == ["archive-1"]
    remove_archive(output, location)
    assert not Path(location).exists()
    remove_archive(output, location)


@pytest.mark.parametrize(
    "location",
    [
        "/etc/passwd",
        "archives/ds/archive-1",
        "{root}/archive-1",
        "{root}/ds/sub/archive-1",
        "{root}/ds/../../elsewhere/archive-1",
        "{root}-other/ds/archive-1",
        "s3://bucket/ds/archive-1",
    ],
)
def test_removing_a_location_outside_the_fs_output_is_refused(
    tmp_path: Path, location: str
) -> None:
    output = FsArchiveOutput(directory=tmp_path / "archives")
    with pytest.raises(ValueError, match="is not an archive location"):
        remove_archive(output, location.format(root=tmp_path / "archives"))


@pytest.mark.parametrize("dataset", ["", ".", "..", "a/b"])
def test_a_dataset_that_is_no_plain_name_is_refused(tmp_path: Path, dataset: str) -> None:
    output = FsArchiveOutput(directory=tmp_path / "archives")
    with pytest.raises(ArchiveStorageError, match="cannot store archive 'x': dataset"):
        store_archive(output, staged_file(tmp_path), dataset, "x")


@pytest.mark.parametrize(
    ("key_prefix", "key"),
    [("LIB1/", "LIB1/default/abc"), ("LIB1", "LIB1/default/abc"), ("", "default/abc")],
)
def test_archive_keys_join_the_prefix_as_clp_does(key_prefix: str, key: str) -> None:
    output = S3ArchiveOutput(bucket="archives", key_prefix=key_prefix)
    assert archive_key(output, "default", "abc") == key


def test_s3_archives_are_uploaded_and_removed_idempotently(
    tmp_path: Path, s3_endpoint: str
) -> None:
    client = s3_client(s3_endpoint)
    bucket = new_bucket(client)
    output = S3ArchiveOutput(
        bucket=bucket,
        key_prefix="prefix/",
        endpoint_url=s3_endpoint,
        aws_authentication=INPUT_CREDENTIALS,
    )

    location = store_archive(output, staged_file(tmp_path, b"sfa"), "ds", "archive-2")

    assert location == f"s3://{bucket}/prefix/ds/archive-2"
    body = client.get_object(Bucket=bucket, Key="prefix/ds/archive-2")["Body"].read()
    assert body == b"sfa"
    remove_archive(output, location)
    assert client.list_objects_v2(Bucket=bucket).get("KeyCount") == 0
    remove_archive(output, location)
    for foreign in (
        f"s3://other-{bucket}/prefix/ds/archive-2",
        f"s3://{bucket}/elsewhere/ds/archive-2",
        f"s3://{bucket}/prefix/archive-2",
        str(tmp_path / "prefix" / "ds" / "archive-2"),
    ):
        with pytest.raises(ValueError, match="not"):
            remove_archive(output, foreign)


def test_an_upload_to_a_missing_bucket_names_the_archive(tmp_path: Path, s3_endpoint: str) -> None:
    output = S3ArchiveOutput(
        bucket=f"missing-{uuid.uuid4().hex[:8]}",
        key_prefix="",
        endpoint_url=s3_endpoint,
        aws_authentication=INPUT_CREDENTIALS,
    )
    with pytest.raises(
        ArchiveStorageError, match=r"cannot upload archive archive-3 to s3://missing-.*/ds/"
    ):
        store_archive(output, staged_file(tmp_path), "ds", "archive-3")


# --- S3 URLs -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("endpoint_url", "region_code", "url"),
    [
        (None, None, "https://logs.s3.amazonaws.com/a/b.json"),
        (None, "us-east-1", "https://logs.s3.us-east-1.amazonaws.com/a/b.json"),
        ("http://minio:9000", None, "http://minio:9000/logs/a/b.json"),
        ("http://minio:9000/", None, "http://minio:9000/logs/a/b.json"),
        ("https://s3.example.com", None, "https://s3.example.com/logs/a/b.json"),
        ("http://127.0.0.1:4566", None, "http://127.0.0.1:4566/logs/a/b.json"),
        ("http://minio:9000", "us-east-1", "http://us-east-1.minio:9000/logs/a/b.json"),
        ("https://s3.example.com/", "eu-west-1", "https://s3.eu-west-1.example.com/logs/a/b.json"),
        # CLP's rule, however unhelpful: the region goes in front of an IP address too.
        ("http://10.0.0.1:9000", "us-east-1", "http://us-east-1.10.0.0.1:9000/logs/a/b.json"),
    ],
)
def test_s3_object_urls_follow_clp(
    endpoint_url: str | None, region_code: str | None, url: str
) -> None:
    assert s3_object_url(endpoint_url, region_code, "logs", "a/b.json") == url


@pytest.mark.parametrize(
    "endpoint_url",
    [
        "ftp://example.com",
        "http://Minio:9000",
        "http://minio:9000/path",
        "http://minio:9000//",
        "minio:9000",
        "http://minio:port",
        "http://minio:9000\n",
        "https://",
        "",
    ],
)
def test_other_endpoints_are_unsupported(endpoint_url: str) -> None:
    with pytest.raises(TaskError, match=re.escape(f"unsupported S3 endpoint {endpoint_url!r}")):
        s3_object_url(endpoint_url, None, "logs", "a/b.json")


@pytest.mark.parametrize(
    "key", ["a b.json", "a%20b.json", "q?.json", "h#.json", "é.json", "a/../b", "./a", "x\ny", ""]
)
def test_keys_clp_s_cannot_fetch_are_refused(key: str) -> None:
    with pytest.raises(TaskError, match="cannot read object"):
        s3_object_url("http://minio:9000", None, "logs", key)


def test_other_printable_keys_are_used_verbatim() -> None:
    key = "dir//a+b=c&d@e!(f)'g*,h;i:j~k$l.json"
    assert s3_object_url(None, None, "logs", key) == f"https://logs.s3.amazonaws.com/{key}"


def _events(service: str, count: int) -> list[dict[str, Any]]:
    return [json.loads(line) for line in json_log_lines(count, service=service).splitlines()]
