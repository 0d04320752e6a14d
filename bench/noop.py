"""Task packages for the benchmarks: CLP's package with the compress task replaced.

Loaded by the embedded engine's executors (``open_runtime(config, packages={"clp": …})``):

* ``bench.noop:instant_package``: a compress task that returns at once a fixed archive list (one
  archive per task, its id derived from the Spider job and task, so that ids stay unique), with the
  compress task's own database steps (``coordinator.engine.tasks.records``: the archive recorded
  ``storing``, then marked ``stored``, as the real task does around the upload; no file is
  written), through the **real** commit task (``coordinator.engine.tasks.commit``) and the real
  cleanup task. Only clp-s and the upload are left out: what remains is the lifecycle.
* ``bench.noop:holding_package``: a compress task that holds its executor until the engine closes
  (at most ``HOLD_SECS``): jobs stay in flight while the loop is measured (P3).

Each executor counts the database transactions of its process (SQLAlchemy's ``commit`` and
``rollback`` events on every ``Engine``, and each statement run on a connection in autocommit
mode, a transaction of its own: ``self_committed``) and, after each task, writes its totals over
the previous ones in ``<staging>/bench-transactions-<pid>`` (``commits rollbacks``, fixed width:
the executors are killed at the end, so the file must be current after every task, and one
``pwrite`` on a file kept open costs the measured process little): ``executor_transactions``
sums them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from sqlalchemy import Connection, Engine, event
from sqlalchemy.exc import SQLAlchemyError

from coordinator.archive_storage.storage import archive_location
from coordinator.engine.tasks.cleanup import cleanup
from coordinator.engine.tasks.commit import commit
from coordinator.engine.tasks.context import TaskContext
from coordinator.engine.tasks.database import task_writes
from coordinator.engine.tasks.records import record_stored, record_storing
from coordinator.engine.tasks.registry import (
    CLEANUP,
    CLP_PACKAGE,
    COMMIT,
    COMPRESS,
    TaskFunction,
    TaskPackage,
)
from coordinator.store.clock import utc_now
from coordinator.store.names import DEFAULT_DATASET
from coordinator.store.stored_archives import StoredArchiveRecord
from coordinator.task_io import ArchiveMetadata, CompressionTaskOutput, decode_dataset

HOLD_SECS = 600.0
TRANSACTIONS_FILE = "bench-transactions-"
INSTANT_PACKAGE = {CLP_PACKAGE: "bench.noop:instant_package"}
HOLDING_PACKAGE = {CLP_PACKAGE: "bench.noop:holding_package"}


def self_committed(connection: Connection) -> bool:
    """Whether a statement on ``connection`` commits itself (autocommit mode: ``AutocommitWrites``
    on MariaDB), so that it is a transaction of its own without any ``commit`` event."""
    try:
        dbapi_connection = connection.connection.dbapi_connection
    except SQLAlchemyError:  # invalidated (a lost connection's rollback): not one of those
        return False
    autocommit = getattr(dbapi_connection, "get_autocommit", None)
    return bool(autocommit is not None and autocommit())


class TransactionCounter:
    """The transactions (commits, and statements that commit themselves: ``self_committed``),
    rollbacks and statements of every engine of this process (SQLAlchemy events)."""

    def __init__(self) -> None:
        self.commits = self.rollbacks = self.statements = 0
        event.listen(Engine, "commit", self._commit)
        event.listen(Engine, "rollback", self._rollback)
        event.listen(Engine, "before_cursor_execute", self._statement)

    def _commit(self, _: object) -> None:
        self.commits += 1

    def _rollback(self, connection: Connection) -> None:
        if not self_committed(connection):  # the block's end: no ROLLBACK is sent (skipped)
            self.rollbacks += 1

    def _statement(self, connection: Connection, *_: object) -> None:
        self.statements += 1
        if self_committed(connection):
            self.commits += 1

    def close(self) -> None:
        event.remove(Engine, "commit", self._commit)
        event.remove(Engine, "rollback", self._rollback)
        event.remove(Engine, "before_cursor_execute", self._statement)


_executor_counter: list[TransactionCounter] = []
"""The executor process's counter, made by the first package built in it."""


_count_files: dict[Path, int] = {}


def _counted(function: TaskFunction) -> TaskFunction:
    def run(ctx: TaskContext, inputs: Sequence[bytes]) -> list[bytes]:
        try:
            return function(ctx, inputs)
        finally:
            os.pwrite(_count_file(ctx.settings.staging_directory), _counts_line(), 0)

    return run


def _count_file(staging: Path) -> int:
    descriptor = _count_files.get(staging)
    if descriptor is None:
        staging.mkdir(parents=True, exist_ok=True)
        path = staging / f"{TRANSACTIONS_FILE}{os.getpid()}"
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        _count_files[staging] = descriptor
    return descriptor


def _counts_line() -> bytes:
    counter = _executor_counter[0]
    return f"{counter.commits:20d} {counter.rollbacks:20d}\n".encode()


def instant_compress(ctx: TaskContext, inputs: Sequence[bytes]) -> list[bytes]:
    """One fixed archive, recorded as the compress task records it; the dataset input as given."""
    dataset = decode_dataset(inputs[1])
    archive = ArchiveMetadata(
        id=f"bench-{ctx.job_id}-{ctx.task_id}",
        begin_timestamp=1_700_000_000_000,
        end_timestamp=1_700_000_060_000,
        size=1_000,
        uncompressed_size=10_000,
    )
    writes = task_writes(ctx.settings)
    name = dataset or DEFAULT_DATASET
    record = StoredArchiveRecord(
        spider_job_id=ctx.job_id,
        task_id=ctx.task_id,
        instance_id=ctx.instance_id,
        dataset=name,
        archive_id=archive.id,
        location=archive_location(ctx.settings.archive_output, name, archive.id),
        size=archive.size,
        stored_at=utc_now(),
    )
    who = f"instant compress task {ctx.job_id}/{ctx.task_id}#{ctx.instance_id}"
    record_ids = record_storing(writes, [record], doing=f"{who} recording")
    record_stored(writes, [record], record_ids, doing=f"{who} marking stored")
    output = CompressionTaskOutput(dataset=dataset, archives=[archive])
    return [output.to_msgpack()]


def holding_compress(ctx: TaskContext, inputs: Sequence[bytes]) -> list[bytes]:
    """Holds the executor (the engine kills it at close), then behaves as ``instant_compress``."""
    time.sleep(HOLD_SECS)
    return instant_compress(ctx, inputs)


def _package(compress: Callable[[TaskContext, Sequence[bytes]], list[bytes]]) -> TaskPackage:
    if not _executor_counter:
        _executor_counter.append(TransactionCounter())
    functions = {COMPRESS: compress, COMMIT: commit, CLEANUP: cleanup}
    return TaskPackage(CLP_PACKAGE, {name: _counted(f) for name, f in functions.items()})


def instant_package() -> TaskPackage:
    return _package(instant_compress)


def holding_package() -> TaskPackage:
    return _package(holding_compress)


def executor_transactions(staging: Path) -> tuple[int, int]:
    """The commits and rollbacks the executors counted (``staging`` is the engine's)."""
    commits = rollbacks = 0
    for path in staging.glob(f"{TRANSACTIONS_FILE}*"):
        first, second = path.read_text().split()
        commits, rollbacks = commits + int(first), rollbacks + int(second)
    return commits, rollbacks
