"""A stored-archive record's id may be given again to another archive's record once it is deleted
(SQLite reuses the highest row id), so a write about a record that may be gone names its archive
too (found by ``test_lifecycle_model``: a settlement retried after a lost commit reply deleted a
late duplicate instance's new record, which had the id of the one it had removed, and left that
archive's file with no record: never removed, never published).

Each test deletes a record, then records another archive under the same id (given explicitly, so
that MariaDB, which does not reuse ids, is put in the same place), then replays the stale write.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from sqlalchemy import Engine, insert, select

from coordinator.archive_storage import FsArchiveOutput
from coordinator.lifecycle import JobStatus
from coordinator.service.cleanup import Settlement, finish_settlement
from coordinator.store.clock import utc_now
from coordinator.store.schema import stored_archives
from coordinator.store.stored_archives import (
    REMOVING,
    STORED,
    STORING,
    StoredArchiveRecord,
    begin_storing_attributed,
    claim_for_removal,
    forget_records,
    mark_stored,
)
from tests.paths import stored_record


def _archive(directory: Path, name: str) -> StoredArchiveRecord:
    location = directory / "web" / name
    location.parent.mkdir(parents=True, exist_ok=True)
    location.write_bytes(b"archive")
    return stored_record("web", name, None, location=str(location))


def _record_again(engine: Engine, record: StoredArchiveRecord, record_id: int, state: str) -> None:
    """Record ``record`` under ``record_id``, as SQLite does by itself once that id is free."""
    values = {**record.__dict__, "id": record_id, "state": state}
    with engine.begin() as connection:
        connection.execute(insert(stored_archives).values(**values))


def _states(engine: Engine) -> dict[str, str]:
    with engine.connect() as connection:
        rows = connection.execute(select(stored_archives.c.archive_id, stored_archives.c.state))
        return {archive_id: state for archive_id, state in rows}


def test_a_settlement_finished_again_keeps_the_record_that_took_its_id(
    migrated_engine: Engine, tmp_path: Path
) -> None:
    """Before: the second ``finish_settlement`` (the coordinator retries one whose transaction's
    reply was lost) deleted the new record by id alone, leaving the new archive's file behind."""
    output = FsArchiveOutput(directory=tmp_path)
    first = _archive(tmp_path, "first")
    with migrated_engine.begin() as connection:
        first_id = begin_storing_attributed(connection, first)
        claim_for_removal(connection, [first_id])
    settlement = Settlement(
        job_id=1,
        state=JobStatus.FAILED,
        withdrawn=0,
        to_remove=[replace(first, id=first_id, state=REMOVING)],
        unexpected=[],
    )
    assert finish_settlement(migrated_engine, output, settlement).removed == 1
    assert _states(migrated_engine) == {}
    late = _archive(tmp_path, "late")
    _record_again(migrated_engine, late, first_id, STORED)

    finish_settlement(migrated_engine, output, settlement)

    assert _states(migrated_engine) == {"late": STORED}
    assert Path(late.location).is_file()
    assert not Path(first.location).exists()


def test_forget_records_deletes_only_the_records_of_the_removed_locations(
    migrated_engine: Engine, tmp_path: Path
) -> None:
    first, late = _archive(tmp_path, "first"), _archive(tmp_path, "late")
    with migrated_engine.begin() as connection:
        first_id = begin_storing_attributed(connection, first)
        assert forget_records(connection, [(first_id, first.location)]) == 1
    _record_again(migrated_engine, late, first_id, STORED)
    with migrated_engine.begin() as connection:
        assert forget_records(connection, [(first_id, first.location)]) == 0
        assert forget_records(connection, [(first_id, late.location)]) == 1
    assert _states(migrated_engine) == {}


def test_a_late_mark_does_not_mark_the_record_that_took_its_id(
    migrated_engine: Engine, tmp_path: Path
) -> None:
    """A compress instance whose record was claimed and deleted while it stored marks nothing:
    the other instance's record under the same id stays ``storing`` (before: marked ``stored``,
    so that instance, whose own mark then found no ``storing`` record, removed its archive)."""
    first, late = _archive(tmp_path, "first"), _archive(tmp_path, "late")
    with migrated_engine.begin() as connection:
        first_id = begin_storing_attributed(connection, first)
        forget_records(connection, [(first_id, first.location)])
    _record_again(migrated_engine, late, first_id, STORING)
    with migrated_engine.begin() as connection:
        assert not mark_stored(connection, first_id, first.location, utc_now())
    assert _states(migrated_engine) == {"late": STORING}
    with migrated_engine.begin() as connection:
        assert mark_stored(connection, first_id, late.location, utc_now())
    assert _states(migrated_engine) == {"late": STORED}
