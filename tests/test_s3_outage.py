"""A short S3 outage is survived inside the compress task; a long one fails it saying so.

The real clp-s reads moto's S3 (``tests.s3_server``) through a pausable TCP proxy
(``tests.tcp_proxy``) that is taken down when clp-s opens its n-th connection: one connection per
object, so the outage begins after clp-s has read some of the objects, and moto keeps its buckets
throughout. The task runs as the other compress-task tests run it (``run_task``: the task function
itself, with its real subprocess of clp-s). Database tests run on SQLite and MariaDB.

Measured here: clp-s stops at the first error and exits 1 (``Code: 56 … Connection reset by
peer`` for the connection the outage cut, or ``Code: 7`` with the same reason when the reset comes
while curl still counts itself connecting; ``Code: 7 … Connection refused`` while it lasts); with
the default bound (1 s doubling) a 2 s outage costs one rerun that finds S3 still down and a third
run, about 3 s after the first, that succeeds.
"""

from __future__ import annotations

import logging
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine
from yscope_clp_core import open_archive

from coordinator.archive_storage import S3ArchiveOutput
from coordinator.engine.tasks.compress import _ClpSStderr, is_transient_s3_read_error
from coordinator.engine.tasks.context import S3ReadRetries, TaskError, WorkerSettings
from coordinator.store.stored_archives import STORED
from tests.s3_server import s3_client, s3_endpoint
from tests.sample_logs import json_log_lines
from tests.tcp_proxy import TcpProxy, proxy_to
from tests.test_compress_task import (
    DATASET,
    INPUT_CREDENTIALS,
    assert_nothing_left,
    new_bucket,
    records,
    run_task,
    settings_for,
    task_inputs,
    worker_database_url,
)

__all__ = ["s3_endpoint", "worker_database_url"]  # fixtures, imported so that pytest finds them

OBJECTS = 6
EVENTS_PER_OBJECT = 300
COMPRESS_LOGGER = "coordinator.engine.tasks.compress"
STORAGE_LOGGER = "coordinator.archive_storage.s3"
SHORT_BOUND = S3ReadRetries(attempts=3, first_delay_secs=0.2, max_delay_secs=0.4)


@pytest.fixture
def proxy(s3_endpoint: str) -> Iterator[TcpProxy]:
    """A pausable proxy in front of the module's moto server."""
    with proxy_to(s3_endpoint) as proxy:
        yield proxy


@pytest.fixture
def logs_bucket(s3_endpoint: str) -> tuple[str, list[str]]:
    """A fresh bucket holding ``OBJECTS`` JSON-lines objects; its name and their keys."""
    client = s3_client(s3_endpoint)
    bucket = new_bucket(client)
    keys = [f"k{index}.jsonl" for index in range(OBJECTS)]
    for index, key in enumerate(keys):
        body = json_log_lines(EVENTS_PER_OBJECT, service=f"svc{index}")
        client.put_object(Bucket=bucket, Key=key, Body=body)
    return bucket, keys


def read_through(proxy: TcpProxy, bucket: str, keys: list[str]) -> list[bytes]:
    """The task's inputs: ``keys`` of ``bucket``, read by clp-s through ``proxy``."""
    return task_inputs(
        keys, bucket=bucket, endpoint_url=proxy.url, authentication=INPUT_CREDENTIALS
    )


def s3_input_settings(
    tmp_path: Path, database_url: str, retries: S3ReadRetries | None = None
) -> WorkerSettings:
    settings = settings_for(tmp_path, database_url, local_objects=False)
    if retries is None:
        return settings
    return settings.model_copy(update={"s3_read_retries": retries})


def retry_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.name == COMPRESS_LOGGER and record.levelno == logging.WARNING
    ]


def events_in(archive: Path) -> int:
    with open_archive(archive, "r") as reader:
        return sum(1 for _ in reader)


# --- a short outage ----------------------------------------------------------------------------


@pytest.mark.slow
def test_an_outage_after_some_objects_were_read_is_retried_and_the_task_succeeds(
    migrated_engine: Engine,
    worker_database_url: str,
    tmp_path: Path,
    proxy: TcpProxy,
    logs_bucket: tuple[str, list[str]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    bucket, keys = logs_bucket
    settings = s3_input_settings(tmp_path, worker_database_url)
    default_bound = S3ReadRetries(attempts=5, first_delay_secs=1.0, max_delay_secs=8.0)
    assert settings.s3_read_retries == default_bound
    # clp-s reads k0 and k1; its connection for k2 is reset and S3 is unreachable for 2 s.
    proxy.outage_at_connection(3, 2.0)
    started = time.monotonic()

    with caplog.at_level(logging.WARNING, logger=COMPRESS_LOGGER):
        [archive] = run_task(settings, read_through(proxy, bucket, keys))

    elapsed = time.monotonic() - started
    [outage] = proxy.outages
    assert outage.ended is not None
    assert outage.ended - outage.started > 1.9
    # Run 1: 3 connections (the third reset); run 2, 1 s later: refused; run 3, 2 s later: 6.
    # (On a loaded machine run 1 may end so late that run 2 already finds S3 back: 6 then.)
    assert proxy.accepted == 3 + OBJECTS
    assert elapsed > 1.0  # at least the first back-off
    warnings = retry_warnings(caplog)
    assert 1 <= len(warnings) <= 2, warnings
    assert "(attempt 1 of 5), running it again in 1.0 s: " in warnings[0]
    # Code 56 (Recv failure), or 7 when the reset comes while curl still counts itself connecting.
    assert f"{bucket}/k2.jsonl - Code: " in warnings[0]
    assert warnings[0].endswith(": Connection reset by peer")
    if len(warnings) == 2:
        assert "(attempt 2 of 5), running it again in 2.0 s: " in warnings[1]
        assert f"{bucket}/k0.jsonl - Code: 7 - Message: Failed to connect" in warnings[1]
    # One archive of every object, stored and recorded once; the failed runs' junk is gone.
    path = tmp_path / "archives" / DATASET / archive.id
    assert events_in(path) == OBJECTS * EVENTS_PER_OBJECT
    assert archive.size == path.stat().st_size
    assert [p.name for p in (tmp_path / "archives" / DATASET).iterdir()] == [archive.id]
    [record] = records(migrated_engine)
    assert (record.archive_id, record.location, record.state) == (archive.id, str(path), STORED)
    assert list((tmp_path / "staging").iterdir()) == []


@pytest.mark.slow
def test_a_503_from_s3_is_retried_and_the_task_succeeds(
    migrated_engine: Engine,
    worker_database_url: str,
    tmp_path: Path,
    proxy: TcpProxy,
    logs_bucket: tuple[str, list[str]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    bucket, keys = logs_bucket
    settings = s3_input_settings(tmp_path, worker_database_url)
    proxy.answer_connections(2, 1, "503 Service Unavailable", "ServiceUnavailable")

    with caplog.at_level(logging.WARNING, logger=COMPRESS_LOGGER):
        [archive] = run_task(settings, read_through(proxy, bucket, keys))

    assert proxy.accepted == 2 + OBJECTS
    [warning] = retry_warnings(caplog)
    assert "(attempt 1 of 5)" in warning
    assert "Code: 22 - Message: The requested URL returned error: 503" in warning
    assert events_in(tmp_path / "archives" / DATASET / archive.id) == OBJECTS * EVENTS_PER_OBJECT
    assert [r.archive_id for r in records(migrated_engine)] == [archive.id]


# --- an outage that outlasts the bound ---------------------------------------------------------


@pytest.mark.slow
def test_an_outage_longer_than_the_bound_fails_saying_s3_is_unreachable_and_leaves_nothing(
    migrated_engine: Engine,
    worker_database_url: str,
    tmp_path: Path,
    proxy: TcpProxy,
    logs_bucket: tuple[str, list[str]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    bucket, keys = logs_bucket
    settings = s3_input_settings(tmp_path, worker_database_url, SHORT_BOUND)
    proxy.outage_at_connection(2, 60.0)
    started = time.monotonic()

    with (
        caplog.at_level(logging.WARNING, logger=COMPRESS_LOGGER),
        pytest.raises(TaskError) as raised,
    ):
        run_task(settings, read_through(proxy, bucket, keys))

    elapsed = time.monotonic() - started
    message = str(raised.value)
    over = re.match(
        r"S3 still unreachable or failing after 3 attempt\(s\) over (\d+\.\d) s ", message
    )
    assert over is not None, message
    # The back-off (0.2 s + 0.4 s) and the runs; the message rounds to 0.1 s.
    assert 0.6 <= float(over.group(1)) <= elapsed + 0.05
    assert message.endswith(
        f" s while compressing {OBJECTS} object(s) from {bucket} (k0.jsonl and {OBJECTS - 1} "
        f"more): clp-s exited with 1: [error] Encountered curl error while reading "
        f"{proxy.url}/{bucket}/k0.jsonl - Code: 7 - Message: Failed to connect to 127.0.0.1 "
        f"port {proxy.port}: Connection refused"
    )
    assert elapsed > 0.6  # 0.2 s + 0.4 s of back-off, three short runs
    assert len(retry_warnings(caplog)) == 2
    assert proxy.accepted == 2  # the first run's two connections; then refused
    assert_nothing_left(tmp_path, migrated_engine)


# --- refusals are not retried ------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("refusal", ["404 from moto", "403 Forbidden", "unparsable object"])
def test_a_refusal_fails_at_once_without_another_run(
    migrated_engine: Engine,
    worker_database_url: str,
    tmp_path: Path,
    s3_endpoint: str,
    proxy: TcpProxy,
    logs_bucket: tuple[str, list[str]],
    caplog: pytest.LogCaptureFixture,
    refusal: str,
) -> None:
    bucket, keys = logs_bucket
    settings = s3_input_settings(tmp_path, worker_database_url)
    if refusal == "404 from moto":
        keys = [*keys[:2], "absent.jsonl", *keys[2:]]
        expected = (
            f"{bucket}/absent.jsonl - Code: 22 - Message: The requested URL returned error: 404"
        )
    elif refusal == "403 Forbidden":
        proxy.answer_connections(3, 1, "403 Forbidden", "AccessDenied")
        expected = f"{bucket}/k2.jsonl - Code: 22 - Message: The requested URL returned error: 403"
    else:
        body = '{"timestamp": 1}\nnot json at all\n'
        s3_client(s3_endpoint).put_object(Bucket=bucket, Key="bad.jsonl", Body=body)
        keys = [*keys[:2], "bad.jsonl", *keys[2:]]
        expected = (
            f"[error] Encountered non-json-object while trying to parse {proxy.url}/{bucket}/"
        )

    with (
        caplog.at_level(logging.WARNING, logger=COMPRESS_LOGGER),
        pytest.raises(TaskError) as raised,
    ):
        run_task(settings, read_through(proxy, bucket, keys))

    message = str(raised.value)
    assert message.startswith(f"clp-s exited with 1 while compressing {len(keys)} object(s) from ")
    assert expected in message
    assert proxy.accepted == 3  # one run: two objects read, the third refused or unparsable
    assert retry_warnings(caplog) == []
    assert_nothing_left(tmp_path, migrated_engine)


@pytest.mark.parametrize(
    ("line", "transient"),
    [
        ("Code: 7 - Message: Failed to connect to 127.0.0.1 port 1: Connection refused", True),
        ("Code: 18 - Message: transfer closed with 991 bytes remaining to read", True),
        ("Code: 28 - Message: Operation timed out after 30000 milliseconds", True),
        ("Code: 35 - Message: OpenSSL SSL_connect: Connection reset by peer", True),
        ("Code: 52 - Message: Empty reply from server", True),
        ("Code: 55 - Message: Send failure: Broken pipe", True),
        ("Code: 56 - Message: Recv failure: Connection reset by peer", True),
        ("Code: 22 - Message: The requested URL returned error: 500 Internal Server Error", True),
        ("Code: 22 - Message: The requested URL returned error: 503 Service Unavailable", True),
        ("Code: 22 - Message: The requested URL returned error: 429 Too Many Requests", True),
        ("Code: 22 - Message: The requested URL returned error: 403 Forbidden", False),
        ("Code: 22 - Message: The requested URL returned error: 404 NOT FOUND", False),
        ("Code: 22 - Message: The requested URL returned error: 400 Bad request syntax", False),
        ("Code: 6 - Message: Could not resolve host: s3.example", False),
        ("Code: 60 - Message: SSL certificate problem: unable to get local issuer", False),
    ],
)
def test_curl_errors_are_told_apart_as_clp_s_prints_them(line: str, transient: bool) -> None:
    # Lines as clp-s 0.12.1b0 prints them (measured for 7, 18, 22, 52 and 56), without timestamp.
    text = f"Encountered curl error while reading http://127.0.0.1:9000/logs/a.jsonl - {line}"
    assert is_transient_s3_read_error(text) is transient
    assert not is_transient_s3_read_error("Encountered error while parsing input.")


MONGOC_WARNING = (
    "2026/12/02 10:08:07.0473: [23560]:  WARNING:       mongoc: "
    "Falling back to malloc for counters."
)
"""What libmongoc (linked into clp-s) prints when the shared memory for its counters is short:
seen on this machine's CI, where it made a transient read error count as a permanent one."""
RESET = (
    "2026-12-02T10:08:07.100+00:00 [error] Encountered curl error while reading "
    "http://127.0.0.1:9000/logs/k1.jsonl - Code: 7 - Message: Failed to connect to 127.0.0.1 "
    "port 9000: Connection reset by peer"
)


def test_libmongocs_warnings_leave_a_transient_read_error_transient() -> None:
    stderr = _ClpSStderr()
    for line in (MONGOC_WARNING, RESET, "[error] Encountered error while parsing input."):
        stderr.add(f"{line}\n")
    assert stderr.only_transient_s3_read_errors()

    critical = _ClpSStderr()
    for line in (MONGOC_WARNING.replace(" WARNING:", "CRITICAL:"), RESET):
        critical.add(f"{line}\n")
    assert not critical.only_transient_s3_read_errors()


# --- an outage during the archive upload -------------------------------------------------------


@pytest.mark.slow
def test_an_outage_during_the_archive_upload_is_survived_by_the_upload_retries(
    migrated_engine: Engine,
    worker_database_url: str,
    tmp_path: Path,
    s3_endpoint: str,
    proxy: TcpProxy,
    logs_bucket: tuple[str, list[str]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # clp-s reads moto directly; the archive goes to moto through the proxy, which resets the
    # upload's connection and stays down for 1 s (the upload waits 0.2, 0.4, 0.8 s between tries).
    bucket, keys = logs_bucket
    client = s3_client(s3_endpoint)
    archives_bucket = new_bucket(client)
    output = S3ArchiveOutput(
        bucket=archives_bucket,
        key_prefix="clp",
        endpoint_url=proxy.url,
        aws_authentication=INPUT_CREDENTIALS,
    )
    settings = settings_for(tmp_path, worker_database_url, output, local_objects=False)
    inputs = task_inputs(
        keys, bucket=bucket, endpoint_url=s3_endpoint, authentication=INPUT_CREDENTIALS
    )
    proxy.outage_at_connection(1, 1.0)

    with caplog.at_level(logging.WARNING):
        [archive] = run_task(settings, inputs)

    [outage] = proxy.outages
    assert outage.ended is not None
    upload_retries = [
        r.getMessage()
        for r in caplog.records
        if r.name == STORAGE_LOGGER and "S3 call failed (attempt" in r.getMessage()
    ]
    assert len(upload_retries) >= 2, upload_retries  # the reset, then at least one refusal
    assert retry_warnings(caplog) == []  # clp-s itself never met the outage
    key = f"clp/{DATASET}/{archive.id}"
    assert client.head_object(Bucket=archives_bucket, Key=key)["ContentLength"] == archive.size
    assert _keys(client, archives_bucket) == [key]
    [record] = records(migrated_engine)
    assert (record.location, record.state) == (f"s3://{archives_bucket}/{key}", STORED)
    assert list((tmp_path / "staging").iterdir()) == []


def _keys(client: Any, bucket: str) -> list[str]:
    return [entry["Key"] for entry in client.list_objects_v2(Bucket=bucket).get("Contents", [])]


@pytest.mark.slow
def test_the_proxy_refuses_and_resets_while_down_and_serves_again_on_the_same_port(
    s3_endpoint: str, proxy: TcpProxy
) -> None:
    client = s3_client(s3_endpoint)
    bucket = new_bucket(client)
    client.put_object(Bucket=bucket, Key="k", Body=b"kept")
    through = s3_client(proxy.url)
    assert through.get_object(Bucket=bucket, Key="k")["Body"].read() == b"kept"
    port = proxy.port
    open_connection = socket.create_connection(("127.0.0.1", port), timeout=5)

    proxy.take_down()

    assert not proxy.is_up
    with open_connection, pytest.raises(ConnectionResetError):
        open_connection.recv(1)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5)
    proxy.bring_up()
    assert proxy.is_up
    assert proxy.port == port
    assert through.get_object(Bucket=bucket, Key="k")["Body"].read() == b"kept"  # moto's state
    [outage] = proxy.outages
    assert outage.ended is not None
