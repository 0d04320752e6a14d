"""Evidence that a Committed job's publication is there: what finalising it requires.

A row Committed says the commit published the job's archives; before the coordinator turns that
into Succeeded it reads the archive rows themselves, in the finalising transaction: the job must
have archives in ``clp_{dataset}_archives`` (the job's records, created by its Spider job, as
``published_archives_of_job`` counts them) and together they must weigh what the commit recorded
(``compressed_size`` is the sum of the sizes it published). Published rows deleted behind the
coordinator (all or some), or a commit marker written without archives, leave a gap.

``read_publications`` reads the jobs' records and their published rows (ids and sizes) in one pass
for all the jobs finalised together (one query for the records, one per dataset for the published
rows; ``recorded_sizes`` one for what the commits recorded), so that settling the records in the
same transaction (``coordinator.service.cleanup``) does not read them again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from sqlalchemy import Connection, Select, Table, bindparam, inspect, select
from sqlalchemy.exc import DBAPIError

from coordinator.store.archives import INSERT_BATCH_SIZE
from coordinator.store.database import is_transient
from coordinator.store.datasets import archives_table
from coordinator.store.schema import compression_jobs as _jobs
from coordinator.store.stored_archives import StoredArchiveRecord, records_of_jobs

_COMPRESSED_SIZES = select(_jobs.c.id, _jobs.c.compressed_size).where(
    _jobs.c.id.in_(bindparam("job_ids", expanding=True))
)


@dataclass(frozen=True)
class PublicationEvidence:
    """What of a job is published: its records, and the published rows among them."""

    records: list[StoredArchiveRecord]
    """Every archive recorded for the job, oldest first."""
    sizes: dict[tuple[str, str], int]
    """``(dataset, archive id)`` → size of each of the job's published archive rows."""
    unattributed: bool = True
    """Whether its Spider job stored records that name no job yet (or that was not read): the
    settlement attributes them first (``attribute_unambiguous_records``)."""

    @property
    def published(self) -> set[tuple[str, str]]:
        return set(self.sizes)


def read_publication(
    connection: Connection, job_id: int, spider_job_id: int | None
) -> PublicationEvidence:
    """``read_publications`` of one job."""
    return read_publications(connection, [(job_id, spider_job_id)])[job_id]


def read_publications(
    connection: Connection, jobs: Sequence[tuple[int, int | None]]
) -> dict[int, PublicationEvidence]:
    """Each ``(job id, Spider job id)``'s records and which of them are published (the same rows
    as ``published_archives_of_job``: ``creator_id`` is the Spider job id and the id is recorded
    for the job in that dataset), by job id: one query for the records of them all, and one per
    dataset for the published rows. Raises ``InvalidDatasetName`` (a record with an unsafe
    dataset) or the driver's errors."""
    records = records_of_jobs(connection, jobs)
    spider_jobs = dict(jobs)
    # (dataset) → (creator, archive id) → the jobs that recorded it (a Spider id may be reused).
    recorded: dict[str, dict[tuple[str, str], list[int]]] = {}
    for job_id, found in records.items():
        spider_job_id = spider_jobs[job_id]
        if spider_job_id is None:
            continue
        for record in found.records:
            pairs = recorded.setdefault(record.dataset, {})
            pairs.setdefault((str(spider_job_id), record.archive_id), []).append(job_id)
    sizes: dict[int, dict[tuple[str, str], int]] = {job_id: {} for job_id in records}
    for dataset, pairs in recorded.items():
        table = archives_table(dataset)
        try:
            rows = _published_sizes(connection, table, list(pairs))
        except DBAPIError as error:
            if is_transient(error) or inspect(connection).has_table(table.name):
                raise
            continue  # no such table (never created, or dropped): nothing of it is published
        for (creator, archive_id), size in rows.items():
            for job_id in pairs.get((creator, archive_id), ()):
                sizes[job_id][(dataset, archive_id)] = size
    return {
        job_id: PublicationEvidence(
            found.records, sizes[job_id], found.unattributed and spider_jobs[job_id] is not None
        )
        for job_id, found in records.items()
    }


def _published_sizes(
    connection: Connection, table: Table, pairs: list[tuple[str, str]]
) -> dict[tuple[str, str], int]:
    """``(creator, archive id)`` → size of the published rows of ``table`` among ``pairs``.

    The table is not looked up first (one catalogue query per job): a missing table fails the
    query, which the caller then tells apart from other errors. Either backend keeps the
    transaction usable after a failed statement.
    """
    sizes: dict[tuple[str, str], int] = {}
    query = _published_rows(table)
    wanted = set(pairs)
    for start in range(0, len(pairs), INSERT_BATCH_SIZE):
        batch = pairs[start : start + INSERT_BATCH_SIZE]
        creators = sorted({creator for creator, _ in batch})
        ids = [archive_id for _, archive_id in batch]
        for row in connection.execute(query, {"creators": creators, "ids": ids}):
            pair = (str(row.creator_id), str(row.id))
            if pair in wanted:  # the query's cross product may pair an id with another creator
                sizes[pair] = int(row.size or 0)
    return sizes


@lru_cache(maxsize=512)
def _published_rows(table: Table) -> Select[tuple[str, int]]:
    """The query of a dataset's published rows, built once per table (its compiled form is then
    cached by SQLAlchemy instead of being built anew for every job)."""
    return select(table.c.creator_id, table.c.id, table.c.size).where(
        table.c.creator_id.in_(bindparam("creators", expanding=True)),
        table.c.id.in_(bindparam("ids", expanding=True)),
    )


def recorded_sizes(connection: Connection, job_ids: Sequence[int]) -> dict[int, int | None]:
    """The ``compressed_size`` each job's commit recorded, by job id (absent: no such job), in
    one query per ``INSERT_BATCH_SIZE`` jobs. Raises the driver's errors."""
    sizes: dict[int, int | None] = {}
    for start in range(0, len(job_ids), INSERT_BATCH_SIZE):
        batch = list(job_ids[start : start + INSERT_BATCH_SIZE])
        for row in connection.execute(_COMPRESSED_SIZES, {"job_ids": batch}):
            sizes[int(row.id)] = None if row.compressed_size is None else int(row.compressed_size)
    return sizes


def publication_gap(publication: PublicationEvidence, recorded: int | None) -> str | None:
    """Why the job's publication is not complete, or ``None`` when it is (see the module).

    ``publication`` is what ``read_publications`` read in this transaction, ``recorded`` the
    job's ``compressed_size`` (``recorded_sizes``, read in it too).
    """
    if not publication.sizes:
        return "none of its archives is published"
    total = sum(publication.sizes.values())
    if recorded is None or total != recorded:
        return (
            f"its {len(publication.sizes)} published archive(s) total {total} bytes but the "
            f"commit published {recorded} bytes (some were removed)"
        )
    return None
