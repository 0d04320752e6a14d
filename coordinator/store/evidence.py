"""Evidence that a Committed job's publication is there: what finalising it requires.

A row Committed says the commit published the job's archives; before the coordinator turns that
into Succeeded it reads the archive rows themselves, in the finalising transaction: the job must
have archives in ``clp_{dataset}_archives`` (``published_archives_of_job``: the job's records,
created by its Spider job) and together they must weigh what the commit recorded
(``compressed_size`` is the sum of the sizes it published). Published rows deleted behind the
coordinator (all or some), or a commit marker written without archives, leave a gap.
"""

from __future__ import annotations

from typing import cast

from sqlalchemy import Connection, Table, func, select

from coordinator.store.archives import INSERT_BATCH_SIZE, published_archives_of_job
from coordinator.store.datasets import archives_table
from coordinator.store.schema import CompressionJob

_jobs = cast(Table, CompressionJob.__table__)


def publication_gap(connection: Connection, job_id: int, spider_job_id: int | None) -> str | None:
    """Why the job's publication is not complete, or ``None`` when it is (see the module)."""
    published = published_archives_of_job(connection, job_id, spider_job_id)
    if not published:
        return "none of its archives is published"
    count, total = 0, 0
    for dataset, ids in published.items():
        table = archives_table(dataset)
        for start in range(0, len(ids), INSERT_BATCH_SIZE):
            batch = ids[start : start + INSERT_BATCH_SIZE]
            total += int(
                connection.execute(
                    select(func.coalesce(func.sum(table.c.size), 0)).where(
                        table.c.creator_id == str(spider_job_id), table.c.id.in_(batch)
                    )
                ).scalar_one()
            )
        count += len(ids)
    recorded = connection.execute(
        select(_jobs.c.compressed_size).where(_jobs.c.id == job_id)
    ).scalar_one_or_none()
    if recorded is None or total != int(recorded):
        return (
            f"its {count} published archive(s) total {total} bytes but the commit published "
            f"{recorded} bytes (some were removed)"
        )
    return None
