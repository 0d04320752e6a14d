"""Where a compressed archive goes: the worker's ``archive_output`` (fs directory or S3 bucket).

Mirrors CLP's compress task (``clp-contract.md`` §9, step 8) for S3: one PutObject per archive to
``<key_prefix>/<dataset>/<archive id>`` (``Path(key_prefix).join(dataset)``: ``LIB1/`` and ``LIB1``
both give ``LIB1/default/abc``, an empty prefix gives ``default/abc``), path-style addressing, the
configured endpoint, region ``region_code`` or ``us-east-1``, and the output's own authentication.

Deliberate differences:

* CLP's task refuses an ``fs`` archive output; here it is the embedded default's storage: the
  single-file archive becomes ``<directory>/<dataset>/<archive id>``, moved when the staging
  directory is on the same file system and copied otherwise, and made visible atomically (written
  to ``<directory>/<dataset>/.<archive id>.tmp``, fsynced, then renamed into place), so a reader
  never sees half an archive. The temporary name is deterministic, so that ``remove_archive`` of
  a location also removes what a killed copy left behind;
* ``archive_location`` says where an archive **will** be before it is stored, so the compress task
  can record it first (the durable outbox of ``coordinator.store.stored_archives``);
* ``remove_archive`` exists for the coordinator's rollback and the task's own clean-up, which CLP
  does not have (its uploaded objects survive a failed attempt);
* **S3 calls are retried** inside the task, bounded: connection errors, timeouts, HTTP 5xx and
  throttling get ``S3_ATTEMPTS`` attempts in all, 0.2 s doubling to at most 2 s apart (about 3 s
  of waiting), then the call fails saying how many attempts were made over how long. botocore's
  own retries are off for these clients, so the bound is this one. Other errors (a missing
  bucket, access denied) fail at once;
* **Errors name their cause**: ``cannot store archive X to /path: no space left on device
  (errno 28)``, ``… permission denied (errno 13)``, ``cannot upload archive X to s3://b/k: bucket
  b does not exist (NoSuchBucket)``, ``… access denied (AccessDenied, HTTP 403)``
  (``describe_os_error``, ``describe_s3_error``).

Both functions take only the output settings, never a task context, so the coordinator can call
them with the settings it loaded itself. A location is a string: the absolute file path, or
``s3://<bucket>/<key>``.
"""

from __future__ import annotations

import contextlib
import errno
import importlib
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from coordinator.engine.tasks.context import FsArchiveOutput, S3ArchiveOutput, TaskError
from coordinator.task_io import (
    AwsAuthentication,
    CredentialsAuthentication,
    EnvVarsAuthentication,
    ProfileAuthentication,
)

ArchiveOutput = FsArchiveOutput | S3ArchiveOutput

DEFAULT_REGION = "us-east-1"
S3_SCHEME = "s3://"
S3_ATTEMPTS = 5
"""Attempts of one S3 call (upload, delete, listing page) before it fails."""
S3_FIRST_DELAY_SECS = 0.2
S3_MAX_DELAY_SECS = 2.0
S3_CONNECT_TIMEOUT_SECS = 5
S3_READ_TIMEOUT_SECS = 60
TEMPORARY_SUFFIX = ".tmp"

_log = logging.getLogger(__name__)
_T = TypeVar("_T")
_THROTTLING_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestLimitExceeded",
        "TooManyRequestsException",
        "RequestTimeout",
        "InternalError",
        "ServiceUnavailable",
    }
)


def archive_location(output: ArchiveOutput, dataset: str, archive_id: str) -> str:
    """Where ``store_archive`` puts archive ``archive_id`` of ``dataset``, before it is stored.

    Fails with ``TaskError`` for a dataset or archive id that is not a plain name.
    """
    _check_name("dataset", dataset, archive_id)
    _check_name("archive id", archive_id, archive_id)
    if isinstance(output, FsArchiveOutput):
        return str(_fs_root(output) / dataset / archive_id)
    return f"{S3_SCHEME}{output.bucket}/{archive_key(output, dataset, archive_id)}"


def store_archive(output: ArchiveOutput, local_file: Path, dataset: str, archive_id: str) -> str:
    """Store the single-file archive ``local_file`` as ``archive_id`` of ``dataset``; its location.

    The location is ``archive_location(output, dataset, archive_id)``. On the file system
    ``local_file`` is moved (or copied, across file systems) and an existing archive of the same
    id is replaced. Fails with ``TaskError`` naming the archive, where it was going and the cause:
    a dataset or archive id that is not a plain name, an unreadable ``local_file``, or a failed
    write or upload (nothing is left at the destination then, unless the process is killed).
    """
    location = archive_location(output, dataset, archive_id)
    if not local_file.is_file():
        raise TaskError(f"cannot store archive {archive_id}: {local_file} is not a file")
    if isinstance(output, FsArchiveOutput):
        _store_file(local_file, Path(location), archive_id)
    else:
        _upload(output, local_file, location, archive_id)
    return location


def remove_archive(output: ArchiveOutput, location: str) -> None:
    """Delete the archive at ``location``; a missing archive is not an error.

    On the file system the temporary file of an interrupted copy goes too. Fails with
    ``ValueError`` when ``location`` is not an archive location of ``output`` (another directory,
    bucket or key prefix), and with ``TaskError`` when the delete itself fails (S3: after the
    bounded retries).
    """
    if isinstance(output, FsArchiveOutput):
        path = _fs_location(output, location)
        try:
            path.unlink(missing_ok=True)
            _temporary_path(path).unlink(missing_ok=True)
        except OSError as error:
            raise TaskError(
                f"cannot remove archive {location}: {describe_os_error(error)}"
            ) from error
        return
    key = _s3_location_key(output, location)
    client = _s3_client(output)
    try:
        # S3 answers 204 for a key that does not exist, which makes this idempotent.
        with_s3_retries(lambda: client.delete_object(Bucket=output.bucket, Key=key))
    except _boto_errors() as error:
        raise TaskError(
            f"cannot remove archive {location}: {describe_s3_error(error, output.bucket)}"
        ) from error


def archive_key(output: S3ArchiveOutput, dataset: str, archive_id: str) -> str:
    """The object key of an archive: ``<key_prefix>/<dataset>/<archive_id>`` (CLP's join).

    Pure string work; it does not fail (names are checked by ``store_archive``).
    """
    return f"{_key_prefix(output)}{dataset}/{archive_id}"


def list_archive_locations(output: ArchiveOutput) -> Iterator[str]:
    """Every archive-shaped entry of the output: ``<dataset>/<name>`` under the directory or prefix.

    On the file system, files and directories two levels down (a directory is an archive CLP wrote
    without ``--single-file-archive``), temporary files of interrupted copies included; on S3, the
    keys ``<key_prefix><dataset>/<name>``. Raises ``OSError`` or ``TaskError`` (S3, after the
    bounded retries) when the listing fails.
    """
    if isinstance(output, FsArchiveOutput):
        root = _fs_root(output)
        if not root.is_dir():
            return
        for dataset in sorted(root.iterdir()):
            if dataset.is_dir() and not dataset.is_symlink():
                for entry in sorted(dataset.iterdir()):
                    yield str(entry)
        return
    client = _s3_client(output)
    prefix = _key_prefix(output)
    arguments = {"Bucket": output.bucket, "Prefix": prefix}
    while True:
        try:
            page = with_s3_retries(lambda: client.list_objects_v2(**arguments))
        except _boto_errors() as error:
            raise TaskError(
                f"cannot list the archives of s3://{output.bucket}/{prefix}: "
                f"{describe_s3_error(error, output.bucket)}"
            ) from error
        for entry in page.get("Contents", []):
            rest = str(entry["Key"]).removeprefix(prefix).split("/")
            if len(rest) == 2 and all(rest):
                yield f"{S3_SCHEME}{output.bucket}/{entry['Key']}"
        if not page.get("IsTruncated"):
            return
        arguments["ContinuationToken"] = page["NextContinuationToken"]


def archive_exists(output: ArchiveOutput, location: str) -> bool:
    """Whether ``location`` (a file, directory or object of the output) exists now."""
    if isinstance(output, FsArchiveOutput):
        return os.path.lexists(location)
    if not location.startswith(f"{S3_SCHEME}{output.bucket}/"):
        return False
    key = location.removeprefix(f"{S3_SCHEME}{output.bucket}/")
    client = _s3_client(output)
    try:
        with_s3_retries(lambda: client.head_object(Bucket=output.bucket, Key=key))
    except _boto_errors() as error:
        if _s3_status(error) == 404:
            return False
        raise TaskError(
            f"cannot look at {location}: {describe_s3_error(error, output.bucket)}"
        ) from error
    return True


def temporary_archive_name(archive_id: str) -> str:
    """The file name an archive has while it is copied into the fs output."""
    return f".{archive_id}{TEMPORARY_SUFFIX}"


def _check_name(what: str, name: str, archive_id: str) -> None:
    # Both become path components (or key segments); anything else could land outside the output.
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        raise TaskError(f"cannot store archive {archive_id!r}: {what} {name!r} is not a plain name")


# --- what went wrong ---------------------------------------------------------------------------


def describe_os_error(error: OSError) -> str:
    """``no space left on device (errno 28)``: the cause of a failed file operation, by errno."""
    if error.errno is None:
        return str(error)
    reason = os.strerror(error.errno)
    reason = reason[:1].lower() + reason[1:]
    return f"{reason} (errno {error.errno})"


def describe_s3_error(error: Exception, bucket: str) -> str:
    """The cause of a failed S3 call: S3's error code and HTTP status, or the connection error."""
    response = getattr(error, "response", None)
    if isinstance(response, dict):
        details = response.get("Error", {})
        code = str(details.get("Code", "")) or "unknown error"
        status = _s3_status(error)
        message = str(details.get("Message", "")).rstrip(".")
        where = f"{code}, HTTP {status}" if status else code
        if code == "NoSuchBucket":
            return f"bucket {bucket} does not exist ({where})"
        if code == "AccessDenied" or (status == 403 and code in ("403", "Forbidden")):
            return f"access denied ({where}){f': {message}' if message else ''}"
        if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken"):
            return f"the credentials were refused ({where}){f': {message}' if message else ''}"
        return f"{message or 'S3 refused the request'} ({where})"
    return str(error)


def with_s3_retries(call: Callable[[], _T], *, attempts: int = S3_ATTEMPTS) -> _T:
    """``call()``, retried on connection errors, timeouts, HTTP 5xx and throttling (bounded).

    Waits 0.2 s doubling to at most 2 s between attempts. The last error is raised with a note
    saying how many attempts were made over how long; errors that would not change on another
    attempt are raised at once.
    """
    started = time.monotonic()
    delay = S3_FIRST_DELAY_SECS
    for attempt in range(1, attempts + 1):
        try:
            return call()
        except _boto_errors() as error:
            if not _is_transient_s3_error(error):
                raise
            if attempt == attempts:
                elapsed = time.monotonic() - started
                raise _S3Unavailable(
                    f"S3 still failing after {attempts} attempt(s) over {elapsed:.1f} s: "
                    f"{describe_s3_error(error, '')}"
                ) from error
            _log.warning(
                "S3 call failed (attempt %d of %d), retrying in %.1f s: %s",
                attempt,
                attempts,
                delay,
                error,
            )
            time.sleep(delay)
            delay = min(delay * 2, S3_MAX_DELAY_SECS)
    raise AssertionError("unreachable")


class _S3Unavailable(Exception):
    """A transient S3 error that outlasted the retries (its message says so)."""


def _is_transient_s3_error(error: Exception) -> bool:
    exceptions: Any = importlib.import_module("botocore.exceptions")
    if isinstance(error, (exceptions.ConnectionError, exceptions.HTTPClientError)):
        return True
    if isinstance(error, exceptions.ClientError):
        status = _s3_status(error)
        code = str(error.response.get("Error", {}).get("Code", ""))
        return status >= 500 or status == 429 or code in _THROTTLING_CODES
    return False


def _s3_status(error: Exception) -> int:
    response = getattr(error, "response", None)
    if not isinstance(response, dict):
        return 0
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
    return int(status) if isinstance(status, int) else 0


# --- the file system ---------------------------------------------------------------------------


def _fs_root(output: FsArchiveOutput) -> Path:
    return Path(os.path.abspath(output.directory))


def _temporary_path(target: Path) -> Path:
    return target.with_name(temporary_archive_name(target.name))


def _store_file(local_file: Path, target: Path, archive_id: str) -> None:
    temporary = _temporary_path(target)
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
        # Should this fail, the record still names the archive: clean-up removes it too.
        with contextlib.suppress(OSError):
            temporary.unlink(missing_ok=True)
        raise TaskError(
            f"cannot store archive {archive_id} to {target}: {describe_os_error(error)}"
        ) from error


def _copy_durably(source: Path, destination: Path) -> None:
    # "wb", not "xb": a killed earlier attempt of this very archive may have left the file.
    with source.open("rb") as reader, destination.open("wb") as writer:
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


def _upload(output: S3ArchiveOutput, local_file: Path, location: str, archive_id: str) -> None:
    key = location.removeprefix(f"{S3_SCHEME}{output.bucket}/")
    client = _s3_client(output)

    def put() -> None:
        with local_file.open("rb") as body:
            client.put_object(Bucket=output.bucket, Key=key, Body=body)

    try:
        with_s3_retries(put)
    except OSError as error:
        raise TaskError(
            f"cannot upload archive {archive_id} to {location}: cannot read {local_file}: "
            f"{describe_os_error(error)}"
        ) from error
    except _boto_errors() as error:
        raise TaskError(
            f"cannot upload archive {archive_id} to {location}: "
            f"{describe_s3_error(error, output.bucket)}"
        ) from error


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


# boto3 ships no type information; its use stays in these functions, typed as Any.


def _s3_client(output: S3ArchiveOutput) -> Any:
    """A boto3 S3 client for the output (botocore's retries off: ``with_s3_retries`` bounds them);
    fails with ``TaskError`` for unusable credentials."""
    return s3_client(
        output.endpoint_url, output.region_code, output.aws_authentication, max_attempts=1
    )


def s3_client(
    endpoint_url: str | None,
    region_code: str | None,
    authentication: AwsAuthentication,
    *,
    max_attempts: int | None = None,
) -> Any:
    """A path-style boto3 S3 client with CLP's authentication; ``TaskError`` for unusable ones.

    ``max_attempts`` caps botocore's own attempts per call (``None``: its standard mode's 3).
    """
    boto3: Any = importlib.import_module("boto3")
    retries: dict[str, Any] = {"mode": "standard"}
    if max_attempts is not None:
        retries["total_max_attempts"] = max_attempts
    config: Any = importlib.import_module("botocore.config").Config(
        s3={"addressing_style": "path"},
        retries=retries,
        connect_timeout=S3_CONNECT_TIMEOUT_SECS,
        read_timeout=S3_READ_TIMEOUT_SECS,
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
    return (exceptions.BotoCoreError, exceptions.ClientError, _S3Unavailable)


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
