"""Evidence that a Committed job's publication is there: what finalising it requires.

A row Committed says the commit published the job's archives; before the coordinator turns that
into Succeeded it reads the archive rows themselves, in the finalising transaction: the job must
have archives in ``clp_{dataset}_archives`` (the job's records, created by its Spider job, as
``published_archives_of_job`` counts them) and together they must weigh what the commit recorded
(``compressed_size`` is the sum of the sizes it published). Published rows deleted behind the
coordinator (all or some), or a commit marker written without archives, leave a gap.

``read_publication`` reads the job's records and its published rows (ids and sizes) in one pass,
so that settling the records in the same transaction (``coordinator.service.cleanup``) does not
read them again.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from sqlalchemy import Connection, Select, Table, bindparam, inspect, select
from sqlalchemy.exc import DBAPIError

from coordinator.store.archives import INSERT_BATCH_SIZE
from coordinator.store.database import is_transient
from coordinator.store.datasets import archives_table
from coordinator.store.schema import compression_jobs as _jobs
from coordinator.store.stored_archives import (
    StoredArchiveRecord,
    stored_archives_of_job,
    stored_archives_of_job_and_spider_job,
)

_COMPRESSED_SIZE = select(_jobs.c.compressed_size).where(_jobs.c.id == bindparam("job_id"))


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
    """The job's records and which of them are published (the same rows as
    ``published_archives_of_job``: ``creator_id`` is the Spider job id and the id is recorded for
    the job in that dataset). Raises ``InvalidDatasetName`` (a record with an unsafe dataset) or
    the driver's errors."""
    sizes: dict[tuple[str, str], int] = {}
    if spider_job_id is None:
        return PublicationEvidence(stored_archives_of_job(connection, job_id), sizes, False)
    records, unattributed = stored_archives_of_job_and_spider_job(connection, job_id, spider_job_id)
    recorded: dict[str, list[str]] = {}
    for record in records:
        recorded.setdefault(record.dataset, []).append(record.archive_id)
    for dataset, archive_ids in recorded.items():
        table = archives_table(dataset)
        try:
            found = _published_sizes(connection, table, spider_job_id, archive_ids)
        except DBAPIError as error:
            if is_transient(error) or inspect(connection).has_table(table.name):
                raise
            continue  # no such table (never created, or dropped): nothing of it is published
        sizes.update(((dataset, archive_id), size) for archive_id, size in found.items())
    return PublicationEvidence(records, sizes, unattributed)


def _published_sizes(
    connection: Connection, table: Table, spider_job_id: int, archive_ids: list[str]
) -> dict[str, int]:
    """Archive id → size of the Spider job's published rows among ``archive_ids`` in ``table``.

    The table is not looked up first (one catalogue query per job): a missing table fails the
    query, which the caller then tells apart from other errors. Either backend keeps the
    transaction usable after a failed statement.
    """
    sizes: dict[str, int] = {}
    query = _published_rows(table)
    for start in range(0, len(archive_ids), INSERT_BATCH_SIZE):
        batch = archive_ids[start : start + INSERT_BATCH_SIZE]
        rows = connection.execute(query, {"creator": str(spider_job_id), "ids": batch})
        sizes.update((str(row.id), int(row.size or 0)) for row in rows)
    return sizes


@lru_cache(maxsize=512)
def _published_rows(table: Table) -> Select[tuple[str, int]]:
    """The query of a dataset's published rows, built once per table (its compiled form is then
    cached by SQLAlchemy instead of being built anew for every job)."""
    return select(table.c.id, table.c.size).where(
        table.c.creator_id == bindparam("creator"),
        table.c.id.in_(bindparam("ids", expanding=True)),
    )


def publication_gap(
    connection: Connection,
    job_id: int,
    publication: PublicationEvidence,
) -> str | None:
    """Why the job's publication is not complete, or ``None`` when it is (see the module).

    ``publication`` is what ``read_publication`` read in this transaction. Raises the driver's
    errors.
    """
    if not publication.sizes:
        return "none of its archives is published"
    total = sum(publication.sizes.values())
    recorded = connection.execute(_COMPRESSED_SIZE, {"job_id": job_id}).scalar_one_or_none()
    if recorded is None or total != int(recorded):
        return (
            f"its {len(publication.sizes)} published archive(s) total {total} bytes but the "
            f"commit published {recorded} bytes (some were removed)"
        )
    return None
