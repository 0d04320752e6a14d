"""The compress task's outbox records of an attempt: ``storing`` before its files, ``stored`` after.

``record_storing`` inserts every archive's record in state ``storing`` in one transaction (each
insert also resolves the owning compression job), committed before any file is stored;
``record_stored`` marks them all ``stored`` in one transaction after the last file is stored
(``coordinator.store.stored_archives`` says why the order matters). An attempt with one record
(the usual: one archive per task) is one statement, committed by itself on MariaDB
(``AutocommitWrites``: one request instead of two). Both wait out a database outage
(``coordinator.engine.tasks.database.wait_out_outages``) and are safe to repeat after an ambiguous
failure: a record this instance already inserted, or already marked, is found rather than written
twice. The benchmarks' instant compress task (``bench.noop``) runs the same two steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import Connection

from coordinator.engine.tasks.database import wait_out_outages
from coordinator.store.clock import utc_now
from coordinator.store.database import AutocommitWrites
from coordinator.store.stored_archives import (
    STORED,
    StoredArchiveRecord,
    begin_storing_attributed,
    mark_stored,
    stored_archives,
)


def record_storing(
    writes: AutocommitWrites, records: Sequence[StoredArchiveRecord], *, doing: str
) -> list[int]:
    """Insert ``records`` (one task instance's) as ``storing`` in one transaction; their ids.

    Each record's insert resolves the owning job in its own statement (``NULL`` when not exactly
    one in-flight job records the Spider job id: the commit or the coordinator's sweep attributes
    it later; ``begin_storing_attributed``). Only an attempt after a failed one looks for records
    already inserted: instance ids are never reused, so before this call's first attempt the
    instance has none. ``doing`` names the step while an outage is waited out. Raises the
    driver's non-transient errors (whatever was inserted was then rolled back, or is found by a
    repeat).
    """
    attempts = 0

    def attempt() -> list[int]:
        nonlocal attempts
        attempts += 1
        return _begin_storing_once(writes, records, repeat=attempts > 1)

    return wait_out_outages(attempt, doing=doing)


def record_stored(
    writes: AutocommitWrites,
    records: Sequence[StoredArchiveRecord],
    record_ids: Sequence[int],
    *,
    doing: str,
) -> list[str]:
    """Mark ``records`` (inserted by ``record_storing`` as ``record_ids``) ``stored`` in one
    transaction; the archive ids that the coordinator's clean-up claimed meanwhile.

    Raises the driver's non-transient errors; an outage is waited out (``doing`` names the step).
    """
    return wait_out_outages(lambda: _mark_stored_once(writes, records, record_ids), doing=doing)


def _begin_storing_once(
    writes: AutocommitWrites, records: Sequence[StoredArchiveRecord], *, repeat: bool
) -> list[int]:
    if len(records) == 1 and not repeat:
        with writes.connection() as connection:
            return [begin_storing_attributed(connection, records[0])]
    with writes.engine.begin() as connection:
        mine = _own_records(connection, records[0]) if repeat else {}
        ids: list[int] = []
        for record in records:
            existing = mine.get(record.archive_id)
            if existing is not None and existing.id is not None:
                ids.append(existing.id)
            else:
                ids.append(begin_storing_attributed(connection, record))
        return ids


def _mark_stored_once(
    writes: AutocommitWrites, records: Sequence[StoredArchiveRecord], record_ids: Sequence[int]
) -> list[str]:
    # A record that an attempt which seemed to fail marked already counts as marked. With one
    # record, the look-up after a failed mark only reads: the mark alone is the write.
    claimed: list[str] = []
    opened = writes.connection() if len(records) == 1 else writes.engine.begin()
    with opened as connection:
        now: datetime = utc_now()
        mine: dict[str, StoredArchiveRecord] | None = None
        for record, record_id in zip(records, record_ids, strict=True):
            if mark_stored(connection, record_id, record.location, now):
                continue
            if mine is None:
                mine = _own_records(connection, record)
            own = mine.get(record.archive_id)
            if own is None or own.id != record_id or own.state != STORED:
                claimed.append(record.archive_id)
    return claimed


def _own_records(
    connection: Connection, record: StoredArchiveRecord
) -> dict[str, StoredArchiveRecord]:
    """The records ``record``'s task instance already inserted, by archive id."""
    return {
        existing.archive_id: existing
        for existing in stored_archives(connection, record.spider_job_id)
        if existing.instance_id == record.instance_id
    }
