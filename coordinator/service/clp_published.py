"""The archives CLP's own commit task published for a job, as Spider's outputs name them.

With CLP's task package on a Spider cluster, CLP's ``compression::commit``
(``clp-tdl-package/src/task/compression/commit.rs``, ``commit`` and ``insert_archives``) inserts
the archives into ``clp_<dataset>_archives`` with ``creator_id`` '' and ``creation_ix`` 0 and
writes SUCCEEDED itself, in one transaction. Nothing in CLP's tables ties those rows to the job,
and this coordinator's own compress task, which records every archive it stores
(``compression_stored_archives``), did not run. Only Spider knows which archives the job made: the
graph outputs, one ``CompressionTaskOutput`` per compress task, which GetJobOutputs returns once
the job is Succeeded. ``coordinator show`` reads them here, for one job at a time; the service's
loop never does (it costs a Spider call per job).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Engine, inspect, select

from coordinator.archive_storage import ArchiveOutputSettings
from coordinator.archive_storage.storage import archive_location
from coordinator.errors import CoordinatorError
from coordinator.serde import WireFormatError
from coordinator.spider.port import JobState, SpiderError, SpiderPort
from coordinator.store.database import reading
from coordinator.store.datasets import archives_table
from coordinator.task_io import CompressionTaskOutput

ID_BATCH = 1000


@dataclass(frozen=True)
class ClpPublished:
    """One published archive row of the job, with where CLP's compress task stored it."""

    id: str
    size: int
    uncompressed_size: int | None
    begin_timestamp: int | None
    end_timestamp: int | None
    location: str | None


class ArchivesUnknown(CoordinatorError):
    """Spider cannot say which archives the job made; the message says why, in one line."""


def clp_published_archives(
    engine: Engine,
    spider: SpiderPort,
    output: ArchiveOutputSettings,
    spider_job_id: int,
    dataset: str,
) -> list[ClpPublished]:
    """The rows of ``clp_<dataset>_archives`` that Spider job ``spider_job_id``'s compress tasks
    reported, in their reported order.

    GetJobOutputs is called only after GetJobState answered Succeeded (``docs/spider.md``: on a
    job that is not, a real Spider's storage may shut down). Raises ``ArchivesUnknown`` when
    Spider is unreachable, no longer knows the job, reports it not Succeeded, or returns outputs
    that are not CLP's; the database's errors otherwise.
    """
    try:
        state = spider.get_job_state(spider_job_id)
        if state is not JobState.SUCCEEDED:
            raise ArchivesUnknown(
                f"Spider reports job {spider_job_id} {state.name.title()}, not Succeeded"
            )
        payloads = spider.get_job_outputs(spider_job_id)
    except SpiderError as error:
        raise ArchivesUnknown(
            f"Spider cannot list job {spider_job_id}'s outputs: {error}"
        ) from None
    reported: list[str] = []
    for position, payload in enumerate(payloads):  # one per compress task
        try:
            task_output = CompressionTaskOutput.from_msgpack(payload)
        except WireFormatError as error:
            raise ArchivesUnknown(
                f"Spider job {spider_job_id}'s output {position} is not CLP's "
                f"CompressionTaskOutput: {error}"
            ) from None
        reported += [archive.id for archive in task_output.archives]
    table = archives_table(dataset)
    found = {}
    with reading(engine) as connection:
        if not inspect(connection).has_table(table.name):
            return []
        for start in range(0, len(reported), ID_BATCH):
            rows = connection.execute(
                select(table).where(table.c.id.in_(reported[start : start + ID_BATCH]))
            ).all()
            found.update({row.id: row for row in rows})
    published = [found[archive_id] for archive_id in dict.fromkeys(reported) if archive_id in found]
    return [
        ClpPublished(
            id=row.id,
            size=row.size,
            uncompressed_size=row.uncompressed_size,
            begin_timestamp=row.begin_timestamp,
            end_timestamp=row.end_timestamp,
            location=_location(output, dataset, row.id),
        )
        for row in published
    ]


def _location(output: ArchiveOutputSettings, dataset: str, archive_id: str) -> str | None:
    try:
        return archive_location(output, dataset, archive_id)
    except CoordinatorError:  # an id that is not a plain name names no location
        return None
