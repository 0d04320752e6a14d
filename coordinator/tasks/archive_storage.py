"""Where a compressed archive goes: the worker's ``archive_output`` (fs directory or S3 bucket).

Mirrors CLP's compress task (``clp-contract.md`` §9, step 8) for S3: one PutObject per archive to
``<key_prefix>/<dataset>/<archive id>`` (``Path(key_prefix).join(dataset)``: ``LIB1/`` and ``LIB1``
both give ``LIB1/default/abc``, an empty prefix gives ``default/abc``), path-style addressing, the
configured endpoint, region ``region_code`` or ``us-east-1``, and the output's own authentication.

Deliberate differences:

* CLP's task refuses an ``fs`` archive output; here it is the embedded default's storage: the
  single-file archive becomes ``<directory>/<dataset>/<archive id>``, moved when the staging
  directory is on the same file system and copied otherwise, and made visible atomically (fsynced,
  then renamed into place), so a reader never sees half an archive;
* ``remove_archive`` exists for the coordinator's rollback and the task's own clean-up, which CLP
  does not have (its uploaded objects survive a failed attempt).

Both functions take only the output settings, never a task context, so the coordinator can call
them with the settings it loaded itself. A location is a string: the absolute file path, or
``s3://<bucket>/<key>``.
"""

from __future__ import annotations

import errno
import importlib
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

from coordinator.task_io import (
    AwsAuthentication,
    CredentialsAuthentication,
    EnvVarsAuthentication,
    ProfileAuthentication,
)
from coordinator.tasks.context import FsArchiveOutput, S3ArchiveOutput, TaskError

ArchiveOutput = FsArchiveOutput | S3ArchiveOutput

DEFAULT_REGION = "us-east-1"
S3_SCHEME = "s3://"


def store_archive(output: ArchiveOutput, local_file: Path, dataset: str, archive_id: str) -> str:
    """Store the single-file archive ``local_file`` as ``archive_id`` of ``dataset``; its location.

    On the file system ``local_file`` is moved (or copied, across file systems) and an existing
    archive of the same id is replaced. Fails with ``TaskError`` naming the archive and the reason:
    a dataset or archive id that is not a plain name, an unreadable ``local_file``, or a failed
    write or upload (nothing is left at the destination then).
    """
    _check_name("dataset", dataset, archive_id)
    _check_name("archive id", archive_id, archive_id)
    if not local_file.is_file():
        raise TaskError(f"cannot store archive {archive_id}: {local_file} is not a file")
    if isinstance(output, FsArchiveOutput):
        return str(_store_file(output, local_file, dataset, archive_id))
    return _upload(output, local_file, dataset, archive_id)


def remove_archive(output: ArchiveOutput, location: str) -> None:
    """Delete the archive at ``location``; a missing archive is not an error.

    Fails with ``ValueError`` when ``location`` is not an archive location of ``output`` (another
    directory, bucket or key prefix), and with ``TaskError`` when the delete itself fails.
    """
    if isinstance(output, FsArchiveOutput):
        path = _fs_location(output, location)
        try:
            path.unlink(missing_ok=True)
        except OSError as error:
            raise TaskError(f"cannot remove archive {location}: {error}") from error
        return
    key = _s3_location_key(output, location)
    try:
        # S3 answers 204 for a key that does not exist, which makes this idempotent.
        _s3_client(output).delete_object(Bucket=output.bucket, Key=key)
    except _boto_errors() as error:
        raise TaskError(f"cannot remove archive {location}: {error}") from error


def archive_key(output: S3ArchiveOutput, dataset: str, archive_id: str) -> str:
    """The object key of an archive: ``<key_prefix>/<dataset>/<archive_id>`` (CLP's join).

    Pure string work; it does not fail (names are checked by ``store_archive``).
    """
    return f"{_key_prefix(output)}{dataset}/{archive_id}"


def _check_name(what: str, name: str, archive_id: str) -> None:
    # Both become path components (or key segments); anything else could land outside the output.
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        raise TaskError(f"cannot store archive {archive_id!r}: {what} {name!r} is not a plain name")


# --- the file system ---------------------------------------------------------------------------


def _fs_root(output: FsArchiveOutput) -> Path:
    return Path(os.path.abspath(output.directory))


def _store_file(output: FsArchiveOutput, local_file: Path, dataset: str, archive_id: str) -> Path:
    target = _fs_root(output) / dataset / archive_id
    temporary = target.with_name(f".{archive_id}.{uuid.uuid4().hex}.tmp")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        _fsync_file(local_file)
        try:
            os.rename(local_file, temporary)
        except OSError as error:
            if error.errno != errno.EXDEV:
                raise
            _copy_durably(local_file, temporary)
        os.replace(temporary, target)
        _fsync_directory(target.parent)
    except OSError as error:
        temporary.unlink(missing_ok=True)
        raise TaskError(f"cannot store archive {archive_id} at {target}: {error}") from error
    return target


def _copy_durably(source: Path, destination: Path) -> None:
    with source.open("rb") as reader, destination.open("xb") as writer:
        shutil.copyfileobj(reader, writer, length=1024 * 1024)
        writer.flush()
        os.fsync(writer.fileno())


def _fsync_file(path: Path) -> None:
    # The record written next claims the archive exists; it must survive a crash of the machine.
    with path.open("rb") as file:
        os.fsync(file.fileno())


def _fsync_directory(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _fs_location(output: FsArchiveOutput, location: str) -> Path:
    path = Path(location)
    root = _fs_root(output)
    if (
        not path.is_absolute()
        or Path(os.path.normpath(path)) != path
        or len(path.parts) != len(root.parts) + 2
        or path.parent.parent != root
    ):
        raise ValueError(f"{location!r} is not an archive location under {root}")
    return path


# --- S3 ----------------------------------------------------------------------------------------


def _key_prefix(output: S3ArchiveOutput) -> str:
    prefix = output.key_prefix
    return prefix if not prefix or prefix.endswith("/") else f"{prefix}/"


def _upload(output: S3ArchiveOutput, local_file: Path, dataset: str, archive_id: str) -> str:
    key = archive_key(output, dataset, archive_id)
    location = f"{S3_SCHEME}{output.bucket}/{key}"
    failures: tuple[type[Exception], ...] = (OSError, *_boto_errors())
    try:
        client = _s3_client(output)
        with local_file.open("rb") as body:
            client.put_object(Bucket=output.bucket, Key=key, Body=body)
    except failures as error:
        raise TaskError(f"cannot upload archive {archive_id} to {location}: {error}") from error
    return location


def _s3_location_key(output: S3ArchiveOutput, location: str) -> str:
    bucket_prefix = f"{S3_SCHEME}{output.bucket}/"
    if not location.startswith(bucket_prefix):
        raise ValueError(f"{location!r} is not in the archive bucket {output.bucket!r}")
    key = location.removeprefix(bucket_prefix)
    prefix = _key_prefix(output)
    rest = key.removeprefix(prefix).split("/")
    if not key.startswith(prefix) or len(rest) != 2 or not all(rest):
        raise ValueError(f"{location!r} is not an archive location under key prefix {prefix!r}")
    return key


# boto3 ships no type information; its use stays in these two functions, typed as Any.


def _s3_client(output: S3ArchiveOutput) -> Any:
    """A boto3 S3 client for the output; fails with ``TaskError`` for unusable credentials."""
    return s3_client(output.endpoint_url, output.region_code, output.aws_authentication)


def s3_client(
    endpoint_url: str | None, region_code: str | None, authentication: AwsAuthentication
) -> Any:
    """A path-style boto3 S3 client with CLP's authentication; ``TaskError`` for unusable ones."""
    boto3: Any = importlib.import_module("boto3")
    config: Any = importlib.import_module("botocore.config").Config(
        s3={"addressing_style": "path"}, retries={"mode": "standard"}
    )
    session = boto3.session.Session(**_session_arguments(authentication))
    return session.client(
        "s3",
        endpoint_url=endpoint_url,
        region_name=region_code or DEFAULT_REGION,
        config=config,
    )


def _boto_errors() -> tuple[type[Exception], ...]:
    exceptions: Any = importlib.import_module("botocore.exceptions")
    return (exceptions.BotoCoreError, exceptions.ClientError)


def _session_arguments(authentication: AwsAuthentication) -> dict[str, str]:
    if isinstance(authentication, CredentialsAuthentication):
        credentials = authentication.credentials
        arguments = {
            "aws_access_key_id": credentials.access_key_id,
            "aws_secret_access_key": credentials.secret_access_key.get_secret_value(),
        }
        if credentials.session_token is not None:
            arguments["aws_session_token"] = credentials.session_token.get_secret_value()
        return arguments
    if isinstance(authentication, ProfileAuthentication):
        return {"profile_name": authentication.profile}
    if isinstance(authentication, EnvVarsAuthentication):
        # CLP's env_vars means these variables, and only these: no fallback to other sources.
        missing = [
            name
            for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
            if not os.environ.get(name)
        ]
        if missing:
            raise TaskError(
                f"archive output authentication env_vars: ${', $'.join(missing)} not set"
            )
        arguments = {
            "aws_access_key_id": os.environ["AWS_ACCESS_KEY_ID"],
            "aws_secret_access_key": os.environ["AWS_SECRET_ACCESS_KEY"],
        }
        if os.environ.get("AWS_SESSION_TOKEN"):
            arguments["aws_session_token"] = os.environ["AWS_SESSION_TOKEN"]
        return arguments
    return {}
