"""``ingested_s3_object_metadata`` and ``ingestion_job``: reading a job's objects, and writing
objects and jobs the way CLP's log-ingestor does (``clp-contract.md`` §1.6, §1.7, §7.1).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import cast

from sqlalchemy import Connection, Engine, Table, insert, select, update

from coordinator.partition import FETCH_BATCH_SIZE, S3ObjectRow
from coordinator.store.schema import CompressionJob, IngestedS3ObjectMetadata, IngestionJob

_objects = cast(Table, IngestedS3ObjectMetadata.__table__)
_ingestion_jobs = cast(Table, IngestionJob.__table__)
_jobs = cast(Table, CompressionJob.__table__)


def fetch_objects(
    connection: Connection, sorted_ids: Sequence[int], ingestion_job_id: int
) -> list[S3ObjectRow]:
    """The rows of ``sorted_ids`` that belong to ``ingestion_job_id``, ascending by id.

    Fetched ``FETCH_BATCH_SIZE`` ids at a time, as CLP does; an id of another ingestion job is
    simply absent (the caller reports it missing). Raises the driver's errors.
    """
    rows: list[S3ObjectRow] = []
    for start in range(0, len(sorted_ids), FETCH_BATCH_SIZE):
        batch = list(sorted_ids[start : start + FETCH_BATCH_SIZE])
        result = connection.execute(
            select(_objects.c.id, _objects.c.bucket, _objects.c.key, _objects.c.size)
            .where(_objects.c.id.in_(batch), _objects.c.ingestion_job_id == ingestion_job_id)
            .order_by(_objects.c.id)
        )
        rows += [S3ObjectRow(row.id, row.bucket, row.key, row.size) for row in result]
    return rows


def create_ingestion_job(engine: Engine, *, bucket: str, key_prefix: str, dataset: str) -> int:
    """An ``ingestion_job`` row for objects registered by hand (an ``S3Scanner`` config)."""
    config = {"S3Scanner": {"bucket_name": bucket, "key_prefix": key_prefix, "dataset": dataset}}
    with engine.begin() as connection:
        key = connection.execute(
            insert(_ingestion_jobs).values(config=json.dumps(config), status="running")
        ).inserted_primary_key
    assert key is not None
    return int(key[0])


def register_objects(
    engine: Engine, ingestion_job_id: int, objects: Sequence[tuple[str, str, int]]
) -> list[int]:
    """Insert ``(bucket, key, size)`` rows as ``buffered`` objects of the ingestion job; ids."""
    ids = []
    with engine.begin() as connection:
        for bucket, key, size in objects:
            inserted = connection.execute(
                insert(_objects).values(
                    bucket=bucket, key=key, size=size, ingestion_job_id=ingestion_job_id
                )
            ).inserted_primary_key
            assert inserted is not None
            ids.append(int(inserted[0]))
    return ids


def submit_compression_job(engine: Engine, clp_config: bytes, object_ids: Sequence[int]) -> int:
    """Insert a compression job and mark its objects ``submitted``, as log-ingestor does.

    One transaction: ``INSERT INTO compression_jobs (clp_config)`` (every other column takes its
    default: Pending, no ``dispatch_time``), then the objects in batches of 1000, each batch having
    to change every row. Raises ``ValueError`` (and inserts nothing) when an object is not
    ``buffered``, else the driver's errors.
    """
    with engine.begin() as connection:
        key = connection.execute(insert(_jobs).values(clp_config=clp_config)).inserted_primary_key
        assert key is not None
        job_id = int(key[0])
        for start in range(0, len(object_ids), FETCH_BATCH_SIZE):
            batch = list(object_ids[start : start + FETCH_BATCH_SIZE])
            changed = connection.execute(
                update(_objects)
                .where(_objects.c.id.in_(batch), _objects.c.status == "buffered")
                .values(compression_job_id=job_id, status="submitted")
            ).rowcount
            if changed != len(batch):
                raise ValueError(f"{len(batch) - changed} object(s) were not buffered")
    return job_id
