"""Storage errors name their cause; a short S3 outage is retried inside the task, a long one fails.

Real conditions, nothing mocked: a full file system is a small tmpfs mounted for the test (root
only; skipped with a notice otherwise) or ``/dev/full``; permission denied is a directory this
process may not write (as root, the action runs in a child process that drops to ``nobody``); a
missing bucket and access denied come from moto's S3 (IAM enforced for one test); an outage is a
port nothing listens on, or one where a moto server starts listening after a delay.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import boto3
import pytest
from moto import settings as moto_settings
from sqlalchemy import Engine

from coordinator.archive_storage import ArchiveStorageError, FsArchiveOutput, S3ArchiveOutput
from coordinator.archive_storage.errors import describe_os_error
from coordinator.archive_storage.s3 import S3_ATTEMPTS
from coordinator.archive_storage.storage import remove_archive, store_archive
from coordinator.config.loader import CoordinatorConfig
from coordinator.engine.tasks.compress import clp_s_s3_compress
from coordinator.engine.tasks.context import TaskContext, TaskError, WorkerSettings
from coordinator.lifecycle import JobStatus
from coordinator.service.ingest import submit_job
from coordinator.store.jobs import job_state
from coordinator.task_io import AwsCredentials, CredentialsAuthentication
from tests.s3_server import s3_client, s3_endpoint
from tests.sample_logs import write_json_logs
from tests.service_support import (
    coordinator_with,
    job_row,
    put_logs,
    run_until_idle,
    runtime_over,
)
from tests.tcp_proxy import proxy_to
from tests.test_compress_task import (
    INPUT_CREDENTIALS,
    JOB_ID,
    new_bucket,
    records,
    settings_for,
    staged_file,
    task_inputs,
)

__all__ = ["s3_endpoint"]  # the fixture, imported so that pytest finds it here

NOBODY = 65534


@pytest.fixture
def worker_database_url(migrated_engine: Engine) -> str:
    return migrated_engine.url.render_as_string(hide_password=False)


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Callable[..., Path]]:
    """Mounts a tmpfs of the given size (``"64k"``) per call, at ``point`` or a new directory;
    skips the test when this process cannot."""
    mounted: list[Path] = []

    def mount(size: str, point: Path | None = None) -> Path:
        point = point or tmp_path / f"tmpfs-{len(mounted)}"
        point.mkdir(parents=True, exist_ok=True)
        if os.geteuid() != 0 or shutil.which("mount") is None:
            pytest.skip("a full file system needs root to mount a small tmpfs; not root here")
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(point)],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            pytest.skip(f"cannot mount a small tmpfs: {done.stderr.strip()}")
        mounted.append(point)
        return point

    yield mount
    for point in mounted:
        subprocess.run(["umount", str(point)], check=False)


def _fill(directory: Path) -> None:
    """Writes into ``directory`` until its file system has no space left."""
    with pytest.raises(OSError) as raised, (directory / "filler").open("wb", buffering=0) as filler:
        while True:
            filler.write(b"\0" * 4096)
    assert raised.value.errno == errno.ENOSPC


def _context(settings: WorkerSettings) -> TaskContext:
    return TaskContext(job_id=JOB_ID, task_id="0", instance_id=1, settings=settings)


# --- no space left -----------------------------------------------------------------------------


def test_an_enospc_is_described_by_its_cause() -> None:
    with pytest.raises(OSError) as raised, open("/dev/full", "wb", buffering=0) as full:
        full.write(b"archive bytes")
    assert describe_os_error(raised.value) == "no space left on device (errno 28)"


def test_a_full_archive_output_fails_the_task_saying_no_space_left_and_leaves_nothing(
    migrated_engine: Engine,
    worker_database_url: str,
    tmp_path: Path,
    small_tmpfs: Callable[..., Path],
) -> None:
    archives = small_tmpfs("64k")
    (archives / "web_logs").mkdir()
    _fill(archives)
    write_json_logs(tmp_path / "objects" / "logs" / "a.jsonl", 200)
    settings = settings_for(tmp_path, worker_database_url, FsArchiveOutput(directory=archives))

    with pytest.raises(TaskError) as raised:
        clp_s_s3_compress(_context(settings), task_inputs(["a.jsonl"], store=tmp_path / "objects"))

    message = str(raised.value)
    assert message.startswith("cannot store archive ")
    assert message.endswith(": no space left on device (errno 28)")
    archive_id = message.split()[3]
    assert f" to {archives}/web_logs/{archive_id}: " in message
    assert sorted(p.name for p in (archives / "web_logs").iterdir()) == []
    assert records(migrated_engine) == []


def test_a_full_staging_directory_fails_clp_s_saying_no_space_left(
    tmp_path: Path, small_tmpfs: Callable[..., Path]
) -> None:
    staging = small_tmpfs("32k")
    write_json_logs(tmp_path / "objects" / "logs" / "a.jsonl", 5000)
    settings = settings_for(tmp_path, f"sqlite:///{tmp_path}/unused.db").model_copy(
        update={"staging_directory": staging}
    )

    with pytest.raises(TaskError) as raised:
        clp_s_s3_compress(_context(settings), task_inputs(["a.jsonl"], store=tmp_path / "objects"))

    message = str(raised.value)
    assert message.startswith("clp-s exited with 1 while compressing 1 object(s) from logs")
    assert f"the staging directory {staging} is full (" in message
    assert "no space left on device (errno 28)" in message
    assert list(staging.iterdir()) == []


# --- permission denied -------------------------------------------------------------------------


def _failure_unprivileged(action: Callable[[], object]) -> str:
    """The message of what ``action`` raises, run as ``nobody`` when this process is root."""
    if os.geteuid() != 0:
        try:
            action()
        except Exception as error:
            return str(error)
        return ""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop privileges, act, report, leave without any clean-up
        os.close(read)
        message = ""
        try:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            action()
        except BaseException as error:
            message = str(error)
        os.write(write, message.encode())
        os._exit(0)
    os.close(write)
    received = b""
    while chunk := os.read(read, 65536):
        received += chunk
    os.close(read)
    os.waitpid(pid, 0)
    return received.decode()


@pytest.fixture
def shared_directory() -> Iterator[Path]:
    """A directory ``nobody`` may enter (pytest's own are private to root)."""
    directory = Path(tempfile.mkdtemp(prefix="storage-errors-", dir="/tmp"))
    directory.chmod(0o755)
    yield directory
    for path in directory.rglob("*"):
        if path.is_dir():
            path.chmod(0o755)
    shutil.rmtree(directory)


def test_an_unwritable_staging_directory_fails_saying_permission_denied(
    shared_directory: Path,
) -> None:
    write_json_logs(shared_directory / "objects" / "logs" / "a.jsonl", 10)
    staging = shared_directory / "staging"
    staging.mkdir(mode=0o555)
    # clp-s is never reached; a stand-in nobody can run wherever the checkout (and its venv) is.
    stand_in = shared_directory / "clp-s"
    stand_in.write_text("#!/bin/sh\nexit 1\n")
    stand_in.chmod(0o755)
    settings = settings_for(shared_directory, "sqlite:///unused.db").model_copy(
        update={"clp_s_path": stand_in}
    )

    message = _failure_unprivileged(
        lambda: clp_s_s3_compress(
            _context(settings), task_inputs(["a.jsonl"], store=shared_directory / "objects")
        )
    )

    assert message == (
        f"cannot create a scratch directory in {staging}: permission denied (errno 13)"
    )


def test_an_unwritable_archive_directory_fails_saying_permission_denied(
    shared_directory: Path,
) -> None:
    archives = shared_directory / "archives"
    archives.mkdir(mode=0o555)
    staged = staged_file(shared_directory)
    staged.parent.chmod(0o777)
    output = FsArchiveOutput(directory=archives)

    message = _failure_unprivileged(lambda: store_archive(output, staged, "ds", "archive-1"))

    assert message == (
        f"cannot store archive archive-1 to {archives}/ds/archive-1: permission denied (errno 13)"
    )


# --- S3: a missing bucket, access denied -------------------------------------------------------


def test_an_upload_to_a_missing_bucket_says_the_bucket_does_not_exist(
    tmp_path: Path, s3_endpoint: str, caplog: pytest.LogCaptureFixture
) -> None:
    bucket = f"missing-{uuid.uuid4().hex[:8]}"
    output = S3ArchiveOutput(
        bucket=bucket, key_prefix="", endpoint_url=s3_endpoint, aws_authentication=INPUT_CREDENTIALS
    )
    with (
        caplog.at_level(logging.WARNING, logger="coordinator.archive_storage.s3"),
        pytest.raises(ArchiveStorageError) as raised,
    ):
        store_archive(output, staged_file(tmp_path), "ds", "archive-3")
    assert str(raised.value) == (
        f"cannot upload archive archive-3 to s3://{bucket}/ds/archive-3: "
        f"bucket {bucket} does not exist (NoSuchBucket, HTTP 404)"
    )
    # Not retried: it would not change.
    assert not any("retrying in" in record.getMessage() for record in caplog.records)


def test_an_upload_refused_by_iam_says_access_denied(tmp_path: Path, s3_endpoint: str) -> None:
    client = s3_client(s3_endpoint)
    bucket = new_bucket(client)
    user = f"u-{uuid.uuid4().hex[:8]}"
    iam_client = boto3.session.Session().client(
        "iam",
        endpoint_url=s3_endpoint,
        region_name="us-east-1",
        aws_access_key_id="AKIATESTCOORDINATOR",
        aws_secret_access_key="test",
    )
    iam_client.create_user(UserName=user)
    key = iam_client.create_access_key(UserName=user)["AccessKey"]
    output = S3ArchiveOutput(
        bucket=bucket,
        key_prefix="",
        endpoint_url=s3_endpoint,
        aws_authentication=CredentialsAuthentication(
            credentials=AwsCredentials(
                access_key_id=key["AccessKeyId"], secret_access_key=key["SecretAccessKey"]
            )
        ),
    )
    enforced = moto_settings.INITIAL_NO_AUTH_ACTION_COUNT
    moto_settings.INITIAL_NO_AUTH_ACTION_COUNT = 0  # type: ignore[assignment]
    try:
        with pytest.raises(ArchiveStorageError) as raised:
            store_archive(output, staged_file(tmp_path), "ds", "archive-4")
    finally:
        moto_settings.INITIAL_NO_AUTH_ACTION_COUNT = enforced
    assert str(raised.value) == (
        f"cannot upload archive archive-4 to s3://{bucket}/ds/archive-4: "
        "access denied (AccessDenied, HTTP 403): Access Denied"
    )


# --- S3: outages -------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def late_s3(s3_endpoint: str) -> Iterator[Callable[[float], str]]:
    """An S3 endpoint whose first connection is reset and which then refuses connections for
    ``seconds`` (a proxy in front of moto, so the outage begins with the call whatever the
    machine's load)."""
    with ExitStack() as stack:

        def endpoint(seconds: float) -> str:
            proxy = stack.enter_context(proxy_to(s3_endpoint))
            proxy.outage_at_connection(1, seconds)
            return proxy.url

        yield endpoint


def _output(bucket: str, endpoint: str) -> S3ArchiveOutput:
    return S3ArchiveOutput(
        bucket=bucket, key_prefix="p", endpoint_url=endpoint, aws_authentication=INPUT_CREDENTIALS
    )


@pytest.mark.slow
def test_an_upload_during_a_short_outage_is_retried_and_succeeds(
    tmp_path: Path,
    s3_endpoint: str,
    late_s3: Callable[[float], str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = s3_client(s3_endpoint)
    bucket = new_bucket(client)
    output = _output(bucket, late_s3(1.0))

    with caplog.at_level(logging.WARNING, logger="coordinator.archive_storage.s3"):
        location = store_archive(output, staged_file(tmp_path, b"after the outage"), "ds", "a-5")

    assert any("retrying in" in record.getMessage() for record in caplog.records)

    assert location == f"s3://{bucket}/p/ds/a-5"
    assert client.get_object(Bucket=bucket, Key="p/ds/a-5")["Body"].read() == b"after the outage"


@pytest.mark.slow
def test_a_delete_during_a_short_outage_is_retried_and_succeeds(
    tmp_path: Path, s3_endpoint: str, late_s3: Callable[[float], str]
) -> None:
    client = s3_client(s3_endpoint)
    bucket = new_bucket(client)
    client.put_object(Bucket=bucket, Key="p/ds/a-6", Body=b"x")

    remove_archive(_output(bucket, late_s3(0.5)), f"s3://{bucket}/p/ds/a-6")

    assert client.list_objects_v2(Bucket=bucket).get("KeyCount") == 0


@pytest.mark.slow
def test_a_lasting_outage_fails_within_the_bound_saying_so(tmp_path: Path) -> None:
    endpoint = f"http://127.0.0.1:{_free_port()}"
    output = _output("archives", endpoint)
    started = time.monotonic()

    with pytest.raises(ArchiveStorageError) as raised:
        store_archive(output, staged_file(tmp_path), "ds", "a-7")

    elapsed = time.monotonic() - started
    assert 2.5 < elapsed < 10
    message = str(raised.value)
    assert message.startswith(
        f"cannot upload archive a-7 to s3://archives/p/ds/a-7: S3 still failing after "
        f"{S3_ATTEMPTS} attempt(s) over "
    )
    assert f'Could not connect to the endpoint URL: "{endpoint}/archives/p/ds/a-7"' in message


# --- the job's status_msg ----------------------------------------------------------------------


@pytest.mark.slow
def test_a_job_whose_archive_disk_is_full_fails_with_a_status_msg_saying_so(
    config: CoordinatorConfig, tmp_path: Path, small_tmpfs: Callable[..., Path]
) -> None:
    """The whole way: the coordinator, the embedded engine, the task, its error, the row."""
    archives = small_tmpfs("64k", Path(config.archive_directory))
    _fill(archives)
    put_logs(config, tmp_path, ["svc0"])
    with runtime_over("embedded", config, lease_secs=5) as rt:
        job_id = submit_job(config, rt.engine, timestamp_key="timestamp")
        run_until_idle(coordinator_with(rt), timeout=60)
        row = job_row(rt, job_id)
    assert job_state(row) is JobStatus.FAILED
    assert row.status_msg.startswith("The Spider compression job failed: ")
    assert "cannot store archive " in row.status_msg
    assert f" to {archives}/default/" in row.status_msg
    assert row.status_msg.endswith(": no space left on device (errno 28)")
    assert [p for p in archives.rglob("*") if p.is_file()] == [archives / "filler"]
