"""Storing, removing, listing and finding archives in the archive output (directory or S3 bucket).

Mirrors CLP's compress task (``docs/clp.md``) for S3: one PutObject per archive to
``<key_prefix>/<dataset>/<archive id>`` (``Path(key_prefix).join(dataset)``: ``LIB1/`` and ``LIB1``
both give ``LIB1/default/abc``, an empty prefix gives ``default/abc``), with a client of
``coordinator.archive_storage.s3`` (path-style addressing, the configured endpoint, region
``region_code`` or ``us-east-1``, and the output's own authentication).

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
* **S3 calls are retried**, bounded (``coordinator.archive_storage.s3.with_s3_retries``: about
  3 s of waiting), then fail saying how many attempts were made over how long;
* **Errors name their cause** (``ArchiveStorageError``): ``cannot store archive X to /path: no
  space left on device (errno 28)``, ``… permission denied (errno 13)``, ``cannot upload archive
  X to s3://b/k: bucket b does not exist (NoSuchBucket)``, ``… access denied (AccessDenied, HTTP
  403)`` (``describe_os_error``, ``describe_s3_error``). The tasks report them as their own
  ``TaskError``, with the same message.

The functions take only the output settings, never a task context, so the coordinator's clean-up
calls them with the settings it loaded itself. A location is a string: the absolute file path, or
``s3://<bucket>/<key>``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from coordinator.archive_storage.errors import ArchiveStorageError, describe_os_error
from coordinator.archive_storage.s3 import (
    describe_s3_error,
    s3_client,
    s3_errors,
    s3_status,
    with_s3_retries,
)
from coordinator.archive_storage.settings import (
    ArchiveOutputSettings,
    FsArchiveOutput,
    S3ArchiveOutput,
)

S3_SCHEME = "s3://"
TEMPORARY_SUFFIX = ".tmp"


def archive_location(output: ArchiveOutputSettings, dataset: str, archive_id: str) -> str:
    """Where ``store_archive`` puts archive ``archive_id`` of ``dataset``, before it is stored.

    Fails with ``ArchiveStorageError`` for a dataset or archive id that is not a plain name.
    """
    _check_name("dataset", dataset, archive_id)
    _check_name("archive id", archive_id, archive_id)
    if isinstance(output, FsArchiveOutput):
        return str(_fs_root(output) / dataset / archive_id)
    return f"{S3_SCHEME}{output.bucket}/{archive_key(output, dataset, archive_id)}"


def store_archive(
    output: ArchiveOutputSettings, local_file: Path, dataset: str, archive_id: str
) -> str:
    """Store the single-file archive ``local_file`` as ``archive_id`` of ``dataset``; its location.

    The location is ``archive_location(output, dataset, archive_id)``. On the file system
    ``local_file`` is moved (or copied, across file systems) and an existing archive of the same
    id is replaced. Fails with ``ArchiveStorageError`` naming the archive, where it was going and
    the cause: a dataset or archive id that is not a plain name, an unreadable ``local_file``, or a
    failed write or upload (nothing is left at the destination then, unless the process is
    killed).
    """
    location = archive_location(output, dataset, archive_id)
    if not local_file.is_file():
        raise ArchiveStorageError(f"cannot store archive {archive_id}: {local_file} is not a file")
    if isinstance(output, FsArchiveOutput):
        _store_file(local_file, Path(location), archive_id)
    else:
        _upload(output, local_file, location, archive_id)
    return location


def remove_archive(output: ArchiveOutputSettings, location: str) -> None:
    """Delete the archive at ``location``; a missing archive is not an error.

    On the file system the temporary file of an interrupted copy goes too. Fails with
    ``ValueError`` when ``location`` is not an archive location of ``output`` (another directory,
    bucket or key prefix), and with ``ArchiveStorageError`` when the delete itself fails (S3: after
    the bounded retries).
    """
    if isinstance(output, FsArchiveOutput):
        path = _fs_location(output, location)
        try:
            path.unlink(missing_ok=True)
            _temporary_path(path).unlink(missing_ok=True)
        except OSError as error:
            raise ArchiveStorageError(
                f"cannot remove archive {location}: {describe_os_error(error)}"
            ) from error
        return
    key = _s3_location_key(output, location)
    client = _s3_client(output)
    try:
        # S3 answers 204 for a key that does not exist, which makes this idempotent.
        with_s3_retries(lambda: client.delete_object(Bucket=output.bucket, Key=key))
    except s3_errors() as error:
        raise ArchiveStorageError(
            f"cannot remove archive {location}: {describe_s3_error(error, output.bucket)}"
        ) from error


def archive_key(output: S3ArchiveOutput, dataset: str, archive_id: str) -> str:
    """The object key of an archive: ``<key_prefix>/<dataset>/<archive_id>`` (CLP's join).

    Pure string work; it does not fail (names are checked by ``store_archive``).
    """
    return f"{_key_prefix(output)}{dataset}/{archive_id}"


def list_archive_locations(output: ArchiveOutputSettings) -> Iterator[str]:
    """Every archive-shaped entry of the output: ``<dataset>/<name>`` under the directory or prefix.

    On the file system, files and directories two levels down (a directory is an archive CLP wrote
    without ``--single-file-archive``), temporary files of interrupted copies included; on S3, the
    keys ``<key_prefix><dataset>/<name>``. Raises ``OSError`` or ``ArchiveStorageError`` (S3, after
    the bounded retries) when the listing fails.
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
        except s3_errors() as error:
            raise ArchiveStorageError(
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


def archive_exists(output: ArchiveOutputSettings, location: str) -> bool:
    """Whether ``location`` (a file, directory or object of the output) exists now."""
    if isinstance(output, FsArchiveOutput):
        return os.path.lexists(location)
    if not location.startswith(f"{S3_SCHEME}{output.bucket}/"):
        return False
    key = location.removeprefix(f"{S3_SCHEME}{output.bucket}/")
    client = _s3_client(output)
    try:
        with_s3_retries(lambda: client.head_object(Bucket=output.bucket, Key=key))
    except s3_errors() as error:
        if s3_status(error) == 404:
            return False
        raise ArchiveStorageError(
            f"cannot look at {location}: {describe_s3_error(error, output.bucket)}"
        ) from error
    return True


def temporary_archive_name(archive_id: str) -> str:
    """The file name an archive has while it is copied into the fs output."""
    return f".{archive_id}{TEMPORARY_SUFFIX}"


def _check_name(what: str, name: str, archive_id: str) -> None:
    # Both become path components (or key segments); anything else could land outside the output.
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        raise ArchiveStorageError(
            f"cannot store archive {archive_id!r}: {what} {name!r} is not a plain name"
        )


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
        raise ArchiveStorageError(
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
        raise ArchiveStorageError(
            f"cannot upload archive {archive_id} to {location}: cannot read {local_file}: "
            f"{describe_os_error(error)}"
        ) from error
    except s3_errors() as error:
        raise ArchiveStorageError(
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


def _s3_client(output: S3ArchiveOutput) -> Any:
    """A boto3 S3 client for the output (botocore's retries off: ``with_s3_retries`` bounds them);
    fails with ``ArchiveStorageError`` for unusable credentials."""
    return s3_client(
        output.endpoint_url, output.region_code, output.aws_authentication, max_attempts=1
    )
