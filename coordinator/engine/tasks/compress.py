"""The compress task (``clp`` / ``compression::clp_s_s3_compress``): one partition → archives.

Mirrors CLP's task (``docs/clp.md``, ``clp-tdl-package/src/task/compression/compress.rs``):

* inputs ``[ClpSCompressionOption, Option<String> dataset, S3InputSource]`` (task I/O wire format);
* the object list file ``compression-{job}-{task}-{instance}-log-paths.txt``, one entry per line,
  each ending in ``\\n``;
* S3 objects as URLs built by CLP's ``generate_s3_url`` (``coordinator.engine.tasks.s3_urls``), read
  with ``--auth s3``; ``credentials`` authentication reaches clp-s as ``AWS_ACCESS_KEY_ID``,
  ``AWS_SECRET_ACCESS_KEY`` (and ``AWS_SESSION_TOKEN`` when set);
* ``clp-s c <out> --print-archive-stats --target-encoded-size <N> --compression-level <L>
  --single-file-archive [--auth s3] [--timestamp-key <K>] --files-from <list>``;
* one JSON stats object per archive on stdout, of which ``id``, ``begin_timestamp``,
  ``end_timestamp``, ``size`` and ``uncompressed_size`` are kept; stderr drained on a thread; an
  unparsable line kills clp-s and fails the task, a non-zero exit fails it ("clp-s exited with …")
  unless clp-s failed only reading S3 for a transient reason (see below);
* archives stored under ``<dataset or "default">/<archive id>`` of the archive output
  (``coordinator.archive_storage``), the list file and staged archives deleted at the end (a
  failed delete is only a warning), and ``CompressionTaskOutput{dataset as given, archives}``
  returned.

Deliberate differences:

* **Local object store.** A job whose input ``endpoint_url`` is ``file://<dir>``
  (``coordinator.config.locations.local_store_endpoint``) names a local object store: when
  ``<dir>`` is the worker's ``object_store_directory``, the object ``s3://<bucket>/<key>`` is the
  file ``<dir>/<bucket>/<key>``: the list holds absolute paths, clp-s gets no ``--auth``, S3 is not
  contacted, and a missing file fails the task before clp-s runs (the archives' range index then
  names local paths rather than URLs). A job naming any other directory fails, naming both. Every
  other job is read from S3 with its own endpoint, region and credentials, whatever the worker's
  mode: the worker's local store never stands in for a job's S3 bucket.
* **Scratch per instance.** The list file and clp-s's output live in a fresh directory under the
  staging directory for each attempt (CLP shares ``<staging>/<dataset>``): two instances of one task
  may run at once, and clean-up must never touch the other's files. The attempt holds a lock on it
  while it runs, so that the directory of an instance that was killed is removed by the embedded
  engine's sweep and the directory of a live one never is (``coordinator.engine.tasks.scratch``).
* **Store after a clean exit.** CLP uploads from a callback on each stats line while clp-s runs.
  A failing clp-s still prints a stats line for the junk archive it leaves behind (exit 1, a few
  hundred bytes, even real timestamps), so here nothing is stored until clp-s has exited 0; then the
  archives are stored one after another.
* **Records first (an outbox), and roll-back.** Every archive of the attempt is recorded in
  ``compression_stored_archives`` in state ``storing``, with its deterministic location, in one
  committed transaction **before** any of them is uploaded or copied, and all are marked
  ``stored`` in one transaction after the last is stored; so a kill at any point leaves a record
  for every file (``coordinator.store.stored_archives``). If the coordinator's clean-up claimed a
  record meanwhile (the job ended), the attempt fails and removes its archives. If anything fails
  after a record was written, this attempt removes every archive it recorded (stored or not) and
  deletes their records before failing (CLP leaves its uploads behind). An archive that cannot be
  removed keeps its record, so the coordinator's clean-up finds it.
* **Storage errors name their cause**: ``no space left on device (errno 28)``, ``permission
  denied (errno 13)``, a missing bucket, access denied (``coordinator.archive_storage``, whose
  ``ArchiveStorageError`` fails the task with the same message), for the staging directory as for
  the archive output; clp-s reports a failed write only as ``Error code: 4``, so a clp-s failure
  with a (nearly) full staging file system says so.
* **A short S3 outage is retried inside the task.** CLP runs clp-s once. Here, when clp-s fails
  (exit 1) and every error on its stderr is a transient S3 read error (curl's codes 7 *couldn't
  connect*, 18 *partial file*, 28 *timed out*, 35 *SSL connect error*, 52 *empty reply*, 55/56
  *send/receive error*, and 22 with HTTP 5xx or 429; clp-s stops at the first error), that run's
  output is discarded and clp-s runs again, all objects anew, after a back-off:
  ``WorkerSettings.s3_read_retries`` (5 runs in all, 1 s doubling to 8 s apart: 15 s of waiting),
  one warning per failed run. Then the task fails with ``S3 still unreachable or failing after 5
  attempt(s) over 15.1 s while compressing …: <the last curl error>``. A 403, a 404, unparsable
  input or any other failure fails at once, as before. (Archive uploads have their own bound,
  ``coordinator.archive_storage``.)
* **An ``fs`` archive output** is accepted (CLP's task requires S3).
* **No column metadata.** CLP runs ``indexer`` per archive to fill
  ``clp_{dataset}_column_metadata``; ``yscope-clp-core`` does not ship it, so that step is skipped:
  archives are searchable, but the WebUI's per-column schema for the dataset stays empty.
* **No unstructured logs.** ``unstructured = true`` needs CLP's ``log-converter``, which is not
  shipped either: the task fails saying so rather than compressing text as if it were JSON.
* **Default authentication inherits the worker's environment**: clp-s reads only the ``AWS_*``
  variables, so credentials must be there (CLP resolves the SDK's default chain and exports it).
  ``profile`` and ``env_vars`` (CLP's Python model only) are refused, as CLP's Rust task would.
* **Object keys clp-s cannot fetch** (spaces, ``%``, ``?``, ``#``, non-ASCII, ``.``/``..``
  segments) fail the task up front, naming the key (see ``coordinator.engine.tasks.s3_urls``).
* **Error text.** The clp-s failure message carries the last lines of its stderr without their
  timestamps and with presigned query strings (``?X-Amz-…``) removed.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import IO, TypeVar

from sqlalchemy.exc import SQLAlchemyError

from coordinator.archive_storage import ArchiveOutputSettings, ArchiveStorageError
from coordinator.archive_storage.errors import describe_os_error
from coordinator.archive_storage.storage import archive_location, remove_archive, store_archive
from coordinator.config.locations import is_same_store, local_store_named
from coordinator.engine.tasks.context import TaskContext, TaskError, WorkerSettings
from coordinator.engine.tasks.database import task_engine, task_writes
from coordinator.engine.tasks.records import record_stored, record_storing
from coordinator.engine.tasks.s3_urls import s3_object_url
from coordinator.engine.tasks.scratch import create_scratch, remove_scratch
from coordinator.serde import WireFormatError, decode_as
from coordinator.store.clock import utc_now
from coordinator.store.stored_archives import StoredArchiveRecord, forget_records
from coordinator.task_io import (
    ArchiveMetadata,
    ClpSCompressionOption,
    CompressionTaskOutput,
    CredentialsAuthentication,
    DefaultAuthentication,
    S3InputSource,
    decode_dataset,
)

logger = logging.getLogger(__name__)

DEFAULT_DATASET = "default"
CLP_S_PACKAGE = "yscope_clp_core"
STDERR_LINES_KEPT = 3
STDERR_CHARS_KEPT = 300
STAGING_FULL_BYTES = 1024 * 1024
"""Below this much free space, a failing clp-s is reported as having filled the staging disk."""

_T = TypeVar("_T")
_INPUT_NAMES = ("ClpSCompressionOption", "dataset", "S3InputSource")
_LOG_TIMESTAMP = re.compile(r"^\d{4}-\d{2}-\d{2}T\S+\s+")
_PRESIGNED_QUERY = re.compile(r"\?X-Amz-[^\s'\"]*")
_LOG_LEVEL = re.compile(r"^\[(\w+)\]\s*")
_CURL_ERROR = re.compile(r"^Encountered curl error while reading .* - Code: (\d+) - Message: (.*)$")
_HTTP_STATUS = re.compile(r"returned error: (\d{3})\b")
_NOT_ERRORS = frozenset({"trace", "debug", "info", "warning"})
_MONGOC_LOG = re.compile(r"^\d{4}/\d{2}/\d{2} [\d:.]+: \[\s*\d+\]:\s+(\w+):\s+\S+: ")
"""A line of libmongoc's default log handler, which clp-s links (``2026/12/02 10:08:07.0473:
[23560]:  WARNING:       mongoc: Falling back to malloc for counters.``, printed when the shared
memory for its counters is short): its level is the first group."""
_MONGOC_NOT_ERRORS = frozenset({"trace", "debug", "info", "message", "warning"})
_READ_ERROR_AFTERMATH = "Encountered error while parsing input."
"""What clp-s prints after any read error, transient or not."""
TRANSIENT_CURL_CODES = frozenset({7, 18, 28, 35, 52, 55, 56})
"""libcurl's couldn't connect, partial file, timed out, SSL connect error, got nothing, send and
receive errors: a rerun may succeed once S3 is reachable again."""
CURL_HTTP_RETURNED_ERROR = 22
"""An HTTP status >= 400: transient only when it is a 5xx or 429."""


@dataclass(frozen=True)
class _Request:
    option: ClpSCompressionOption
    dataset: str | None
    source: S3InputSource

    def objects(self) -> str:
        """``M object(s) from <bucket> (<first key> and N more)`` for messages."""
        keys = self.source.object_keys
        first = keys[0] if len(keys[0]) <= 60 else f"{keys[0][:57]}…"
        more = f" and {len(keys) - 1} more" if len(keys) > 1 else ""
        return f"{len(keys)} object(s) from {self.source.bucket} ({first}{more})"


def clp_s_s3_compress(ctx: TaskContext, inputs: Sequence[bytes]) -> list[bytes]:
    """Compress one partition's objects with clp-s, store and record the archives; their metadata.

    Returns one payload, ``CompressionTaskOutput`` (the dataset input as given). Fails with
    ``TaskError`` for undecodable inputs, ``unstructured`` input, objects that are missing or
    cannot be fetched, a clp-s that cannot run, exits non-zero or prints an unparsable stats line
    (a clp-s that failed only reading S3 for a transient reason is first rerun within
    ``settings.s3_read_retries``), and an archive that cannot be stored or recorded; whatever this
    attempt stored is removed and forgotten first, and its scratch directory is always deleted.
    """
    request = _decode_inputs(inputs)
    if request.option.unstructured:
        raise TaskError(
            "unstructured logs need CLP's log-converter, which this worker does not have "
            "(yscope-clp-core ships only clp-s); only JSON logs (unstructured = false) can be "
            f"compressed here: {request.objects()}"
        )
    settings = ctx.settings
    clp_s_input = _clp_s_input(settings, request.source)
    binary = _clp_s_binary(settings)
    scratch = _scratch_directory(ctx)
    stored: list[_Recorded] = []
    try:
        list_file = scratch / (
            f"compression-{ctx.job_id}-{ctx.task_id}-{ctx.instance_id}-log-paths.txt"
        )
        # clp-s writes its archives beside the list, into the scratch directory itself: a
        # directory of its own would be one more made and removed per task (issue 14).
        output_directory = scratch
        try:
            list_file.write_text(
                "".join(f"{entry}\n" for entry in clp_s_input.entries), encoding="utf-8"
            )
        except OSError as error:
            raise TaskError(
                f"cannot write the object list {list_file} in the staging directory: "
                f"{describe_os_error(error)}"
            ) from error
        option = request.option
        command = clp_s_command(
            binary,
            output_directory,
            list_file,
            target_encoded_size=option.target_encoded_size,
            compression_level=option.compression_level,
            timestamp_key=option.timestamp_key,
            s3=clp_s_input.s3,
        )
        archives = _run_clp_s_retrying(
            ctx, command, clp_s_input.environment, request, output_directory, list_file=list_file
        )
        try:
            _store_and_record(
                ctx, request.dataset or DEFAULT_DATASET, archives, output_directory, stored
            )
        except ArchiveStorageError as error:
            raise TaskError(str(error)) from error
        return [CompressionTaskOutput(dataset=request.dataset, archives=archives).to_msgpack()]
    except BaseException as error:
        if stored:
            _roll_back(ctx, settings.archive_output, stored, error)
        raise
    finally:
        _remove_scratch(scratch)


# --- inputs ------------------------------------------------------------------------------------


def _decode_inputs(inputs: Sequence[bytes]) -> _Request:
    if len(inputs) != len(_INPUT_NAMES):
        raise TaskError(
            f"the compress task takes {len(_INPUT_NAMES)} inputs ({', '.join(_INPUT_NAMES)}), "
            f"got {len(inputs)}"
        )
    option = _decode_input(0, ClpSCompressionOption.from_msgpack, inputs)
    dataset = _decode_input(1, decode_dataset, inputs)
    source = _decode_input(2, S3InputSource.from_msgpack, inputs)
    if not source.object_keys:
        raise TaskError(f"S3InputSource of bucket {source.bucket} lists no objects to compress")
    return _Request(option, dataset, source)


def _decode_input(position: int, decode: Callable[[bytes], _T], inputs: Sequence[bytes]) -> _T:
    try:
        return decode(inputs[position])
    except WireFormatError as error:
        raise TaskError(
            f"compress task input {position + 1} ({_INPUT_NAMES[position]}) is invalid: {error}"
        ) from error


@dataclass(frozen=True)
class _ClpSInput:
    entries: list[str]
    """The lines of the list file: URLs, or local paths."""
    environment: dict[str, str] | None
    """clp-s's environment; ``None``: inherit this process's."""
    s3: bool
    """Whether the entries are S3 URLs (read with ``--auth s3``)."""


def _clp_s_input(settings: WorkerSettings, source: S3InputSource) -> _ClpSInput:
    named = local_store_named(source.endpoint_url)
    if named is not None:
        served = settings.object_store_directory
        if served is None:
            raise TaskError(
                f"the job names the local object store {named} (endpoint {source.endpoint_url}) "
                "but this worker serves no local object store"
            )
        if not is_same_store(named, served):
            raise TaskError(
                f"the job names the local object store {named} (endpoint {source.endpoint_url}) "
                f"but this worker serves the local object store {os.path.abspath(served)}"
            )
        return _ClpSInput(_local_objects(served, source), None, s3=False)
    environment = _credentials_environment(source)
    urls = [
        s3_object_url(source.endpoint_url, source.region_code, source.bucket, key)
        for key in source.object_keys
    ]
    return _ClpSInput(urls, environment, s3=True)


def _local_objects(directory: Path, source: S3InputSource) -> list[str]:
    root = Path(os.path.abspath(directory))
    bucket = source.bucket
    if bucket in (".", "..") or "/" in bucket or "\0" in bucket:
        raise TaskError(f"bucket {bucket!r} cannot be a directory of the local object store")
    paths: list[str] = []
    missing: list[str] = []
    for key in source.object_keys:
        # A key must stay inside <root>/<bucket> and fit on one line of the list file.
        if (
            not key
            or key.startswith("/")
            or any(character in key for character in "\0\n\r")
            or any(segment in (".", "..") for segment in key.split("/"))
        ):
            raise TaskError(f"object key {key!r} of bucket {bucket} cannot be a local file path")
        path = root / bucket / key
        if not path.is_file():
            missing.append(f"{bucket}/{key}")
        paths.append(str(path))
    if missing:
        shown = ", ".join(missing[:3]) + (
            f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        )
        raise TaskError(
            f"{len(missing)} of {len(paths)} object(s) not found in the local object store "
            f"{root}: {shown}"
        )
    return paths


def _credentials_environment(source: S3InputSource) -> dict[str, str] | None:
    authentication = source.aws_authentication
    if isinstance(authentication, DefaultAuthentication):
        return None
    if not isinstance(authentication, CredentialsAuthentication):
        raise TaskError(
            f"S3 authentication {authentication.type!r} of bucket {source.bucket} is not supported "
            "by the compress task (only 'default' and 'credentials')"
        )
    credentials = authentication.credentials
    environment = dict(os.environ)
    environment["AWS_ACCESS_KEY_ID"] = credentials.access_key_id
    environment["AWS_SECRET_ACCESS_KEY"] = credentials.secret_access_key.get_secret_value()
    if credentials.session_token is not None:
        environment["AWS_SESSION_TOKEN"] = credentials.session_token.get_secret_value()
    else:
        # A token inherited from the worker belongs to other keys and would spoil the signature.
        environment.pop("AWS_SESSION_TOKEN", None)
    return environment


# --- clp-s -------------------------------------------------------------------------------------


def _clp_s_binary(settings: WorkerSettings) -> Path:
    if settings.clp_s_path is not None:
        binary = settings.clp_s_path
    else:
        try:
            binary = Path(str(files(CLP_S_PACKAGE) / "bin" / "clp-s"))
        except ModuleNotFoundError as error:
            raise TaskError(
                "no clp-s: clp_s_path is not set and yscope-clp-core is not installed"
            ) from error
    if not binary.is_file() or not os.access(binary, os.X_OK):
        raise TaskError(f"clp-s at {binary} is missing or not executable")
    return binary


def _scratch_directory(ctx: TaskContext) -> Path:
    """This attempt's scratch directory, locked until ``_remove_scratch`` (``tasks.scratch``)."""
    staging = ctx.settings.staging_directory
    try:
        return create_scratch(staging, ctx.job_id, ctx.task_id, ctx.instance_id)
    except OSError as error:
        raise TaskError(
            f"cannot create a scratch directory in {staging}: {describe_os_error(error)}"
        ) from error


def clp_s_command(
    binary: Path,
    output_directory: Path,
    list_file: Path,
    *,
    target_encoded_size: int,
    compression_level: int,
    timestamp_key: str | None,
    s3: bool = False,
) -> list[str]:
    """The ``clp-s c`` command line of the task (CLP's flags, the module docstring): public so
    that the benchmarks' floor runs exactly what the task runs."""
    command = [
        str(binary),
        "c",
        str(output_directory),
        "--print-archive-stats",
        "--target-encoded-size",
        str(target_encoded_size),
        "--compression-level",
        str(compression_level),
        "--single-file-archive",
    ]
    if s3:
        command += ["--auth", "s3"]
    if timestamp_key is not None:
        command += ["--timestamp-key", timestamp_key]
    return [*command, "--files-from", str(list_file)]


def _run_clp_s(
    command: list[str], environment: dict[str, str] | None, request: _Request, staging: Path
) -> list[ArchiveMetadata]:
    """The stats of the archives clp-s wrote; ``TaskError`` unless it exits 0 with valid stats.

    clp-s reports a failed write only as ``Error code: 4`` (an errno it does not print), so when
    it fails and the staging directory's file system is (nearly) full, the message says so. A
    failure is a ``_ClpSFailed`` that tells whether a rerun may succeed (``s3_read_error``).
    """
    stderr = _ClpSStderr()
    try:
        process = subprocess.Popen(
            _dying_with_parent(command),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=environment,
            text=True,
            encoding="utf-8",
            errors="replace",
        )
    except OSError as error:
        raise TaskError(f"cannot run clp-s ({command[0]}): {error}") from error
    with process:
        assert process.stdout is not None and process.stderr is not None
        # Both pipes must be read at once, or clp-s blocks on whichever fills up first.
        drainer = threading.Thread(
            target=_drain, args=(process.stderr, stderr), name="clp-s stderr", daemon=True
        )
        drainer.start()
        try:
            archives = _read_stats(process.stdout, request)
        except BaseException:
            process.kill()
            raise
        finally:
            returncode = process.wait()
            drainer.join()
    if returncode != 0:
        full = _full_file_system(staging)
        transient = returncode > 0 and full is None and stderr.only_transient_s3_read_errors()
        raise _ClpSFailed(
            f"{_exit_description(returncode)} while compressing {request.objects()}: "
            f"{f'{full}: ' if full else ''}{_stderr_summary(stderr.tail)}",
            returncode=returncode,
            s3_read_error=stderr.last_transient if transient else None,
        )
    return archives


class _ClpSFailed(TaskError):
    """clp-s exited non-zero; ``s3_read_error`` is set when a rerun may succeed."""

    def __init__(self, message: str, *, returncode: int, s3_read_error: str | None) -> None:
        super().__init__(message)
        self.returncode = returncode
        self.s3_read_error = s3_read_error
        """The last error line when every error clp-s reported was a transient S3 read error."""


def _run_clp_s_retrying(
    ctx: TaskContext,
    command: list[str],
    environment: dict[str, str] | None,
    request: _Request,
    output_directory: Path,
    *,
    list_file: Path,
) -> list[ArchiveMetadata]:
    """``_run_clp_s``, rerun after a back-off while it fails only reading S3 for a transient reason.

    Each rerun starts from an output directory emptied but for ``list_file`` (a failed run leaves
    a junk archive there).
    After ``s3_read_retries.attempts`` such failures, raises ``TaskError`` saying S3 is still
    unreachable or failing, after how many attempts over how long, and the last curl error; any
    other failure is raised at once.
    """
    retries = ctx.settings.s3_read_retries
    started = time.monotonic()
    delay = retries.first_delay_secs
    for attempt in range(1, retries.attempts + 1):
        if attempt > 1:
            _empty_directory(output_directory, keep=list_file)
        try:
            return _run_clp_s(command, environment, request, ctx.settings.staging_directory)
        except _ClpSFailed as failure:
            if failure.s3_read_error is None:
                raise
            if attempt == retries.attempts:
                elapsed = time.monotonic() - started
                raise TaskError(
                    f"S3 still unreachable or failing after {attempt} attempt(s) over "
                    f"{elapsed:.1f} s while compressing {request.objects()}: "
                    f"{_exit_description(failure.returncode)}: "
                    f"{_stderr_summary([failure.s3_read_error])}"
                ) from failure
            logger.warning(
                "compress task %s/%s#%s: clp-s failed reading S3 (attempt %d of %d), "
                "running it again in %.1f s: %s",
                ctx.job_id,
                ctx.task_id,
                ctx.instance_id,
                attempt,
                retries.attempts,
                delay,
                _stderr_summary([failure.s3_read_error]),
            )
            time.sleep(delay)
            delay = min(delay * 2, retries.max_delay_secs)
    raise AssertionError("unreachable")


def _empty_directory(directory: Path, *, keep: Path) -> None:
    """Remove what a failed clp-s run left in ``directory`` (its junk archive), all but ``keep``."""
    try:
        with os.scandir(directory) as listing:
            entries = [entry for entry in listing if entry.name != keep.name]
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
    except OSError as error:
        raise TaskError(
            f"cannot empty clp-s's output directory {directory} for another run: "
            f"{describe_os_error(error)}"
        ) from error


def _full_file_system(directory: Path) -> str | None:
    """``the staging directory D is full …`` when its file system has (almost) no room left."""
    try:
        usage = os.statvfs(directory)
    except OSError:
        return None
    free = usage.f_bavail * usage.f_frsize
    if free < STAGING_FULL_BYTES:
        return (
            f"the staging directory {directory} is full ({free} bytes free): "
            f"no space left on device (errno {errno.ENOSPC})"
        )
    if usage.f_files > 0 and usage.f_favail == 0:
        return (
            f"the staging directory {directory} has no free inodes: "
            f"no space left on device (errno {errno.ENOSPC})"
        )
    return None


class _ClpSStderr:
    """What clp-s printed on stderr: its last lines, and whether every error was transient.

    Every line is looked at as it comes (the tail keeps only the last ones): an error is a line
    that is not a trace/debug/info/warning log line, clp-s's own or libmongoc's (which clp-s
    links); the error clp-s prints after any read error (``Encountered error while parsing
    input.``) counts as neither kind.
    """

    def __init__(self) -> None:
        self.tail: deque[str] = deque(maxlen=50)
        self.last_transient: str | None = None
        self.other_errors = 0

    def add(self, line: str) -> None:
        self.tail.append(line)
        text = _LOG_TIMESTAMP.sub("", line.strip())
        if not text:
            return
        mongoc = _MONGOC_LOG.match(text)
        if mongoc is not None and mongoc.group(1).lower() in _MONGOC_NOT_ERRORS:
            return
        level = _LOG_LEVEL.match(text)
        if level is not None:
            if level.group(1).lower() in _NOT_ERRORS:
                return
            text = text[level.end() :]
        if text == _READ_ERROR_AFTERMATH:
            return
        if is_transient_s3_read_error(text):
            self.last_transient = line
        else:
            self.other_errors += 1

    def only_transient_s3_read_errors(self) -> bool:
        return self.last_transient is not None and self.other_errors == 0


def is_transient_s3_read_error(text: str) -> bool:
    """Whether a clp-s error line (``Encountered curl error while reading <url> - Code: <n> -
    Message: <m>``, without timestamp and level) says S3 was unreachable, cut the transfer off or
    answered 5xx or 429: an error that a later run may well not meet."""
    curl = _CURL_ERROR.match(text)
    if curl is None:
        return False
    code = int(curl.group(1))
    if code in TRANSIENT_CURL_CODES:
        return True
    if code != CURL_HTTP_RETURNED_ERROR:
        return False
    status = _HTTP_STATUS.search(curl.group(2))
    return status is not None and (int(status.group(1)) >= 500 or int(status.group(1)) == 429)


def _drain(stream: IO[str], stderr: _ClpSStderr) -> None:
    for line in stream:
        stderr.add(line)


def _read_stats(stdout: Iterable[str], request: _Request) -> list[ArchiveMetadata]:
    archives: list[ArchiveMetadata] = []
    for line in stdout:
        if not line.strip():
            continue
        try:
            stats = json.loads(line)
            if not isinstance(stats, dict):
                raise ValueError("not a JSON object")
            archives.append(decode_as(ArchiveMetadata, stats))
        except ValueError as error:
            shown = line.strip()
            shown = shown if len(shown) <= 120 else f"{shown[:117]}…"
            raise TaskError(
                f"clp-s printed an unparsable archive stats line while compressing "
                f"{request.objects()}: {error}: {shown!r}"
            ) from error
    return archives


def _exit_description(returncode: int) -> str:
    if returncode >= 0:
        return f"clp-s exited with {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    return f"clp-s exited with {returncode} ({name})"


def _stderr_summary(lines: Iterable[str]) -> str:
    """The last lines of clp-s's stderr, without log timestamps and signed query strings."""
    kept = [
        _PRESIGNED_QUERY.sub("?…", _LOG_TIMESTAMP.sub("", line.strip()))
        for line in lines
        if line.strip()
    ][-STDERR_LINES_KEPT:]
    if not kept:
        return "(nothing on stderr)"
    summary = " / ".join(kept)
    if len(summary) > STDERR_CHARS_KEPT:
        summary = f"…{summary[-(STDERR_CHARS_KEPT - 1) :]}"
    return summary


# --- storing, recording, rolling back ----------------------------------------------------------


@dataclass(frozen=True)
class _Recorded:
    """An archive this attempt recorded (and may have stored, fully or in part)."""

    record_id: int
    location: str


def _store_and_record(
    ctx: TaskContext,
    dataset: str,
    archives: Sequence[ArchiveMetadata],
    output_directory: Path,
    stored: list[_Recorded],
) -> None:
    """Record every archive as ``storing``, store them, mark them all ``stored``; ``stored`` gains
    the records as soon as they are inserted, so the roll-back removes what a failure left
    half-stored.

    Two write transactions whatever the number of archives: every ``storing`` record, each
    resolving its owning job in its insert, in the first (committed before any file is stored),
    every ``stored`` mark in the second (after the last file is stored); both wait out an outage
    and are safe to repeat (``coordinator.engine.tasks.records``).
    """
    if not archives:
        return
    output = ctx.settings.archive_output
    writes = task_writes(ctx.settings)
    who = f"compress task {ctx.job_id}/{ctx.task_id}#{ctx.instance_id}"
    locations = [archive_location(output, dataset, archive.id) for archive in archives]
    now = utc_now()
    records = [
        StoredArchiveRecord(
            spider_job_id=ctx.job_id,
            task_id=ctx.task_id,
            instance_id=ctx.instance_id,
            dataset=dataset,
            archive_id=archive.id,
            location=location,
            size=archive.size,
            stored_at=now,
        )
        for archive, location in zip(archives, locations, strict=True)
    ]
    named = ", ".join(archive.id for archive in archives)
    try:
        record_ids = record_storing(writes, records, doing=f"{who} recording archive(s) {named}")
    except SQLAlchemyError as error:
        raise TaskError(
            f"cannot record archive(s) {named} before storing them at "
            f"{', '.join(locations)}: {error}"
        ) from error
    stored.extend(_Recorded(i, location) for i, location in zip(record_ids, locations, strict=True))
    for archive in archives:
        store_archive(output, output_directory / archive.id, dataset, archive.id)
    try:
        claimed = record_stored(
            writes, records, record_ids, doing=f"{who} marking archive(s) {named} stored"
        )
    except SQLAlchemyError as error:
        raise TaskError(
            f"cannot record archive(s) {named} as stored at {', '.join(locations)}: {error}"
        ) from error
    if claimed:
        at = [r.location for r in records if r.archive_id in claimed]
        raise TaskError(
            f"archive(s) {', '.join(claimed)} stored at {', '.join(at)} claimed by the "
            "coordinator's clean-up while they were being stored (the job has ended); this "
            "attempt's archives are removed"
        )


def _dying_with_parent(command: Sequence[str]) -> list[str]:
    """``command`` made to die with the executor: a SIGKILLed coordinator's clp-s must not run on.

    On Linux, ``setpriv --pdeathsig KILL`` (util-linux) execs clp-s with the parent-death signal
    set; elsewhere, or when clp-s cannot be found (so that its own error stays the one reported),
    the command is unchanged.
    """
    setpriv = shutil.which("setpriv") if sys.platform.startswith("linux") else None
    if setpriv is None or shutil.which(command[0]) is None:
        return list(command)
    return [setpriv, "--pdeathsig", "KILL", "--", *command]


def _roll_back(
    ctx: TaskContext,
    output: ArchiveOutputSettings,
    recorded: Sequence[_Recorded],
    failure: BaseException,
) -> None:
    """Remove what this attempt stored (or began to), then forget the records of what is gone."""
    removed: list[tuple[int, str]] = []
    problems: list[str] = []
    for entry in recorded:
        try:
            remove_archive(output, entry.location)
            removed.append((entry.record_id, entry.location))
        except Exception as error:
            problems.append(f"{entry.location}: {error}")
    if removed:
        try:
            with task_engine(ctx.settings).begin() as connection:
                forget_records(connection, removed)
        except SQLAlchemyError as error:
            problems.append(f"records of removed archives: {error}")
    if problems:
        message = "; ".join(problems)
        logger.error(
            "compress task %s/%s#%s: after %s, clean-up left: %s",
            ctx.job_id,
            ctx.task_id,
            ctx.instance_id,
            type(failure).__name__,
            message,
        )
        failure.add_note(f"clean-up after this failure was incomplete: {message}")


def _remove_scratch(scratch: Path) -> None:
    try:
        remove_scratch(scratch)
    except OSError as error:
        logger.warning("cannot remove the scratch directory %s: %s", scratch, error)
