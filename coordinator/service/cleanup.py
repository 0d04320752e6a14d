"""Settling a finished job's archives: withdraw what must not stay published, remove the rest.

Compress tasks record every archive they store, with the compression job it was stored for. Once
a job is terminal, whoever finished it (this coordinator, another one, or a foreign writer such as
CLP's legacy scheduler), its archives are settled by ``settle_archives``:

* **Failed or Killed**: nothing of the job may stay published. A job this coordinator rolled back
  has already withdrawn its archive rows in the rollback's transaction; a Committed job that a
  foreign writer finished (CLP's legacy scheduler kills every RUNNING row at its start-up, and a
  Committed job is stored as RUNNING by default) still has them, so they are withdrawn here, as a
  rollback does. Then every stored archive file is removed and its record forgotten.
* **Succeeded**: the published archives stay (CLP's retention owns them now; their records keep
  their locations for ``coordinator show``). Archives that are not published (a retried or
  duplicate task instance's) are removed.

Records are an outbox (``coordinator.store.stored_archives``): a task inserts a record in state
``storing`` before its archive exists, so a record may name a file that was never (or only
partly) written; removing such a location is harmless (a missing file or object is no error, and
an interrupted copy's temporary file goes with it). Before removing a file, settling claims its
record (``removing``), so an instance still storing it sees that and removes the file itself
rather than marking it stored. The file is removed before its record is deleted; a file that
cannot be removed keeps its record and is retried. The published archives of a Succeeded job get
the state ``published``, and are never looked at again.

Instances of a finished Spider job may still be running and storing, so a periodic sweep settles,
once their records are older than a grace period, every Failed or Killed job that still has
records (settling removes them all, so the job drops out) and every Succeeded job with records not
yet settled (whatever their state but ``published``: a duplicate, retried, killed or late
instance's).

**Reconciliation** (``reconcile_archive_storage``, run by the service every
``RECONCILE_INTERVAL_SECS`` and by ``coordinator archives``) lists the archive storage (the fs
directory's ``<dataset>/<name>`` entries, or the keys under the S3 key prefix) and reports every
entry that has no record and is not published in its dataset's ``clp_{dataset}_archives``: one log
line with the count and the first few. It never deletes them: the storage is shared with CLP
(archives its legacy scheduler or the Rust coordinator wrote, and files whose metadata CLP's
garbage collector or ``archive_manager.py del`` has just deleted look exactly the same), and since
the outbox every archive of this coordinator has a record before it exists, so an entry without a
record is, by construction, not one this version stored. An operator decides (``coordinator
archives`` lists them).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import PurePosixPath

from sqlalchemy import Connection, Engine, and_, inspect, or_, select
from sqlalchemy.exc import SQLAlchemyError

from coordinator import metrics
from coordinator.archive_storage import (
    ArchiveOutputSettings,
    ArchiveStorageError,
    FsArchiveOutput,
)
from coordinator.archive_storage.storage import (
    TEMPORARY_SUFFIX,
    archive_exists,
    list_archive_locations,
    remove_archive,
)
from coordinator.lifecycle import (
    ENDED_BADLY_STATUS_VALUES,
    TERMINAL_STATUS_VALUES,
    JobStatus,
    state_of,
)
from coordinator.store.archives import withdraw_archives
from coordinator.store.database import reading
from coordinator.store.datasets import archives_table
from coordinator.store.evidence import PublicationEvidence, read_publication
from coordinator.store.names import InvalidDatasetName
from coordinator.store.schema import compression_jobs as _jobs
from coordinator.store.schema import stored_archives as _stored
from coordinator.store.stored_archives import (
    PUBLISHED,
    STORED,
    StoredArchiveRecord,
    attribute_unambiguous_records,
    claim_for_removal,
    forget_records,
    mark_published,
    recorded_locations,
    stored_archives_of_job,
    unattributed_orphans,
)

_log = logging.getLogger(__name__)
RECONCILE_INTERVAL_SECS = 3600.0
"""How often the service lists the archive storage for files without a record."""
REPORTED_LOCATIONS = 5
"""How many unrecorded locations the summary line names."""


@dataclass(frozen=True)
class Settled:
    """What ``settle_archives`` did for one job."""

    withdrawn: int = 0
    """Published archive rows withdrawn (a foreign writer failed or killed a Committed job)."""
    removed: int = 0
    """Stored archive files removed."""


@dataclass(frozen=True)
class Settlement:
    """The transactional part of settling a terminal job's archives, done; its files are next.

    ``finish_settlement`` removes ``to_remove`` (claimed ``removing`` in the transaction) once that
    transaction has committed, and logs what the transaction found.
    """

    job_id: int
    state: JobStatus
    withdrawn: int
    """Published archive rows withdrawn (a foreign writer failed or killed a Committed job)."""
    to_remove: list[StoredArchiveRecord]
    unexpected: list[str]
    """Locations of published archives whose record is neither stored nor published."""


def settle_archives(engine: Engine, job_id: int, output: ArchiveOutputSettings) -> Settled:
    """Settle the archives of job ``job_id`` if it is terminal (see the module); else nothing.

    Raises the driver's errors (the sweep retries); a file that cannot be removed is logged and
    keeps its record (``removing``).
    """
    with engine.begin() as connection:
        row = connection.execute(
            select(_jobs.c.status, _jobs.c.committed_at, _jobs.c.spider_id).where(
                _jobs.c.id == job_id
            )
        ).one_or_none()
        if row is None or row.status not in TERMINAL_STATUS_VALUES:
            return Settled()
        spider_id = None if row.spider_id is None else int(row.spider_id)
        settlement = settle_within(
            connection, job_id, state_of(row.status, row.committed_at), spider_id
        )
    return finish_settlement(engine, output, settlement)


def settle_within(
    connection: Connection,
    job_id: int,
    state: JobStatus,
    spider_id: int | None,
    publication: PublicationEvidence | None = None,
) -> Settlement:
    """Settle the records of job ``job_id``, which is terminal in ``state``, inside the caller's
    transaction: withdraw what a Failed or Killed job still has published, mark a Succeeded job's
    published archives ``published``, and claim every other record for removal.

    ``publication`` is what ``read_publication`` read in this transaction (the finalising move's
    evidence); it is read again when absent or when records were attributed meanwhile. The
    Spider job's records that name no job are attributed first, unless ``publication`` saw none.
    Raises ``InvalidDatasetName`` (a record with an unsafe dataset) or the driver's errors.
    """
    return settle_all_within(connection, [Ending(job_id, state, spider_id, publication)])[0]


@dataclass(frozen=True)
class Ending:
    """A job a terminal move ended, to settle (``settle_all_within``): its id, its terminal state,
    its Spider job, and the evidence its finalising move read, if any."""

    job_id: int
    state: JobStatus
    spider_id: int | None
    publication: PublicationEvidence | None = None


def settle_all_within(connection: Connection, endings: Sequence[Ending]) -> list[Settlement]:
    """``settle_within`` of each of ``endings``, in order, inside the caller's transaction; the
    ``published`` marks of all of them in one statement, and their claims for removal in
    another (a tick's finalised jobs: one statement, not one per job). Raises as
    ``settle_within``."""
    settlements: list[Settlement] = []
    to_mark: list[int] = []
    for ending in endings:
        settlement, kept = _settlement(connection, ending)
        settlements.append(settlement)
        to_mark += [r.id for r in kept if r.id is not None and r.state == STORED]
    mark_published(connection, to_mark)
    # Claimed in this transaction, before any file is touched: an instance still storing one
    # of them can no longer mark it stored, and removes it itself.
    claim_for_removal(
        connection, [r.id for s in settlements for r in s.to_remove if r.id is not None]
    )
    return settlements


def _settlement(
    connection: Connection, ending: Ending
) -> tuple[Settlement, list[StoredArchiveRecord]]:
    """What settling ``ending`` finds, its attributions and withdrawals made: the settlement, and
    the records of the archives it keeps (to mark ``published``)."""
    job_id, state, spider_id = ending.job_id, ending.state, ending.spider_id
    publication = ending.publication
    attributed = 0
    if spider_id is not None and (publication is None or publication.unattributed):
        attributed = attribute_unambiguous_records(connection, spider_id)
    withdrawn: list[str] = []
    if state is not JobStatus.SUCCEEDED and spider_id is not None:
        withdrawn = withdraw_archives(connection, job_id, spider_id)
    records: list[StoredArchiveRecord]
    published: set[tuple[str, str]] = set()
    if state is JobStatus.SUCCEEDED:
        if publication is None or attributed:
            publication = read_publication(connection, job_id, spider_id)
        records, published = publication.records, publication.published
    else:
        records = stored_archives_of_job(connection, job_id)
    kept = [r for r in records if (r.dataset, r.archive_id) in published]
    to_remove = [r for r in records if (r.dataset, r.archive_id) not in published]
    unexpected = [r.location for r in kept if r.state not in (STORED, PUBLISHED)]
    return Settlement(job_id, state, len(withdrawn), to_remove, unexpected), kept


def finish_settlement(
    engine: Engine, output: ArchiveOutputSettings, settlement: Settlement
) -> Settled:
    """After the transaction of ``settle_within`` committed: log what it found and remove the
    claimed files (then their records). A file that cannot be removed is logged and keeps its
    record (``removing``); raises the driver's errors when forgetting the records fails."""
    job_id = settlement.job_id
    if settlement.unexpected:
        _log.warning(
            "job %d: %d published archive(s) whose record is not stored, left as they are: %s",
            job_id,
            len(settlement.unexpected),
            ", ".join(settlement.unexpected[:REPORTED_LOCATIONS]),
        )
    if settlement.withdrawn:
        metrics.ARCHIVES_WITHDRAWN.labels("foreign_end").inc(settlement.withdrawn)
        _log.warning(
            "job %d ended %s by another writer after its commit: withdrew %d published archive(s)",
            job_id,
            settlement.state.label,
            settlement.withdrawn,
        )
    removed = _remove(engine, output, settlement.to_remove) if settlement.to_remove else 0
    metrics.STORED_ARCHIVES_REMOVED.labels("ended_job").inc(removed)
    return Settled(withdrawn=settlement.withdrawn, removed=removed)


def settle_unattributed_archives(
    engine: Engine, output: ArchiveOutputSettings, stored_before: datetime
) -> int:
    """Remove the archives of unattributed records that no job can publish any more; how many.

    See ``unattributed_orphans``: their Spider job id belongs to no live job, and an archive that
    is not published (checked in its record's dataset) is garbage. Raises the driver's errors.
    """
    with engine.begin() as connection:
        orphans = unattributed_orphans(connection, stored_before)
        published = {
            (record.dataset, record.archive_id)
            for record in orphans
            if _is_published(connection, record.dataset, record.archive_id)
        }
        to_remove = [r for r in orphans if (r.dataset, r.archive_id) not in published]
        claim_for_removal(connection, [r.id for r in to_remove if r.id is not None])
    removed = _remove(engine, output, to_remove)
    metrics.STORED_ARCHIVES_REMOVED.labels("unattributed").inc(removed)
    return removed


def _is_published(connection: Connection, dataset: str, archive_id: str) -> bool:
    table = archives_table(dataset)
    if not inspect(connection).has_table(table.name):
        return False
    return (
        connection.execute(select(table.c.id).where(table.c.id == archive_id)).first() is not None
    )


def _remove(
    engine: Engine, output: ArchiveOutputSettings, records: Sequence[StoredArchiveRecord]
) -> int:
    """Remove the claimed records' files, then forget the records; how many were removed.

    A file that cannot be removed is logged and keeps its record (``removing``) for a retry.
    """
    removed: list[tuple[int, str]] = []
    for record in records:
        try:
            remove_archive(output, record.location)
        except Exception:
            metrics.STORED_ARCHIVE_REMOVAL_ERRORS.inc()
            _log.exception("cannot remove archive %s; it stays recorded", record.location)
            continue
        if record.id is not None:
            removed.append((record.id, record.location))
    if removed:
        with engine.begin() as connection:
            forget_records(connection, removed)
    return len(removed)


def terminal_jobs_with_stored_archives(engine: Engine, stored_before: datetime) -> list[int]:
    """Terminal jobs with archive records to settle, stored before ``stored_before``.

    Failed or Killed jobs with any record; Succeeded jobs with a record not yet settled (any state
    but ``published``: stored or being stored by a duplicate, retried, killed or late instance,
    before or after the commit). Records the compress task could not attribute are attributed
    first, where exactly one job records their Spider job id.
    """
    with engine.begin() as connection:
        attribute_unambiguous_records(connection)
        rows = connection.execute(
            select(_jobs.c.id)
            .distinct()
            .join(_stored, _stored.c.job_id == _jobs.c.id)
            .where(
                _stored.c.stored_at < stored_before,
                or_(
                    _jobs.c.status.in_(ENDED_BADLY_STATUS_VALUES),
                    and_(
                        _jobs.c.status == int(JobStatus.SUCCEEDED),
                        _stored.c.state != PUBLISHED,
                    ),
                ),
            )
            .order_by(_jobs.c.id)
        ).scalars()
        return list(rows)


# --- reconciliation ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Reconciliation:
    """What ``reconcile_archive_storage`` found in the archive storage."""

    storage: str
    """The fs directory or ``s3://bucket/prefix`` that was listed."""
    listed: int = 0
    """Archive entries listed."""
    recorded: int = 0
    """Entries with a record (any state), temporary files of recorded archives included."""
    published: int = 0
    """Entries without a record that ``clp_{dataset}_archives`` lists (CLP's own, typically)."""
    unrecorded: list[str] = field(default_factory=list)
    """Entries with no record that no dataset publishes, and that still exist: reported only."""

    def summary(self) -> str:
        """One line for the log or the terminal."""
        entries = "entry" if self.listed == 1 else "entries"
        line = (
            f"archive storage {self.storage}: {self.listed} {entries}, {self.recorded} recorded, "
            f"{self.published} published without a record, "
            f"{len(self.unrecorded)} without a record"
        )
        if self.unrecorded:
            shown = ", ".join(self.unrecorded[:REPORTED_LOCATIONS])
            more = len(self.unrecorded) - REPORTED_LOCATIONS
            line += f": {shown}{f' and {more} more' if more > 0 else ''}"
            line += " (never removed automatically; see coordinator archives)"
        return line


def reconcile_archive_storage(engine: Engine, output: ArchiveOutputSettings) -> Reconciliation:
    """List the archive storage and report the entries without a record (see the module).

    The listing is taken first and the records read after it: since a record exists before its
    archive does, an archive of this coordinator listed here has its record already, unless
    clean-up removed both in between, which the final existence check tells apart. Raises
    ``OSError``/``ArchiveStorageError`` when the storage cannot be listed, or the driver's errors.
    """
    storage = (
        os.path.abspath(output.directory)
        if isinstance(output, FsArchiveOutput)
        else f"s3://{output.bucket}/{output.key_prefix}"
    )
    listed = list(list_archive_locations(output))
    known = recorded_locations(engine)
    recorded = [location for location in listed if _recorded(location, known)]
    candidates = [location for location in listed if not _recorded(location, known)]
    published = _published(engine, candidates)
    unrecorded = [
        location
        for location in candidates
        if location not in published and archive_exists(output, location)
    ]
    return Reconciliation(
        storage=storage,
        listed=len(listed),
        recorded=len(recorded),
        published=len(published),
        unrecorded=unrecorded,
    )


class ReconciliationLog:
    """Runs ``reconcile_archive_storage`` and logs each run in one line, never a traceback.

    A storage it cannot list (an S3 bucket the coordinator has no credentials or no list permission
    for, a directory it cannot read) is reported once, as a warning naming why and what to do; the
    same problem again is logged at debug level only, until a run lists the storage again. The
    reconciliation only reports, so nothing waits on it.
    """

    def __init__(self) -> None:
        self._reported: str | None = None

    def run(self, engine: Engine, output: ArchiveOutputSettings) -> Reconciliation | None:
        """One reconciliation, logged; ``None`` when it could not be made. Raises nothing."""
        try:
            found = reconcile_archive_storage(engine, output)
        except (OSError, ArchiveStorageError) as error:
            self._report(
                f"cannot reconcile the archive storage with the archive records: {error}; give "
                "the coordinator list access to it for orphan reports (nothing else needs it)"
            )
            return None
        except SQLAlchemyError as error:
            self._report(
                "cannot reconcile the archive storage with the archive records: the database "
                f"failed ({type(error).__name__}); it is tried again in an hour"
            )
            return None
        except Exception as error:
            _log.error(
                "cannot reconcile the archive storage with the archive records: unexpected %s "
                "(a bug: please report it, with the traceback --log-level debug shows)",
                type(error).__name__,
                exc_info=_log.isEnabledFor(logging.DEBUG),
            )
            return None
        self._reported = None
        _log.log(logging.WARNING if found.unrecorded else logging.INFO, "%s", found.summary())
        return found

    def _report(self, problem: str) -> None:
        level = logging.DEBUG if problem == self._reported else logging.WARNING
        _log.log(level, "%s", problem)
        self._reported = problem


def log_reconciliation(engine: Engine, output: ArchiveOutputSettings) -> Reconciliation | None:
    """One ``ReconciliationLog`` run (its problems reported every time)."""
    return ReconciliationLog().run(engine, output)


def _recorded(location: str, known: set[str]) -> bool:
    if location in known:
        return True
    # A temporary file of an interrupted copy: ".<archive id>.tmp" beside the archive.
    path = PurePosixPath(location)
    name = path.name
    if name.startswith(".") and name.endswith(TEMPORARY_SUFFIX):
        archive = str(path.with_name(name[1 : -len(TEMPORARY_SUFFIX)]))
        if location.startswith("s3://"):
            archive = "s3://" + archive.removeprefix("s3:/")
        return archive in known
    return False


def _published(engine: Engine, locations: Iterable[str]) -> set[str]:
    """Those of ``locations`` whose archive id its dataset's ``clp_{dataset}_archives`` lists."""
    by_dataset: dict[str, dict[str, str]] = {}
    for location in locations:
        path = PurePosixPath(location)
        by_dataset.setdefault(path.parent.name, {})[path.name] = location
    published: set[str] = set()
    with reading(engine) as connection:
        for dataset, ids in by_dataset.items():
            try:
                table = archives_table(dataset)
            except InvalidDatasetName:
                continue
            if not inspect(connection).has_table(table.name):
                continue
            names = list(ids)
            for start in range(0, len(names), 1000):
                found = connection.execute(
                    select(table.c.id).where(table.c.id.in_(names[start : start + 1000]))
                ).scalars()
                published.update(ids[archive_id] for archive_id in found)
    return published
