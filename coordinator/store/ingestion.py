"""``ingested_s3_object_metadata`` and ``ingestion_job``: reading a job's objects, and writing
objects and jobs the way CLP's log-ingestor does (``docs/clp.md``, Ingestion tables and
log-ingestor; Partitioning).

``coordinator submit`` (and ``demo``) write what log-ingestor leaves behind for a **finished** S3
scanner job that ingested the objects and submitted their compression job, so that log-ingestor,
at its next start (``clp_ingestion.rs``, ``load_ingestion_jobs``), neither resumes it as a live
scanner nor fails it:

* ``ingestion_job``: ``config`` is the complete JSON of log-ingestor's serde model
  (``clp-rust-utils/src/job_config/ingestion.rs``, ``S3IngestionJobConfig::S3Scanner``: every
  field of ``BaseConfig`` flattened, ``buffer_config``, ``scanning_interval_sec``, ``start_after``,
  defaults where submit has no value), written as ``serde_json::to_string`` writes it;
  ``status`` is ``finished`` (where ``ClpIngestionState::end`` leaves a job), ``status_msg`` NULL.
  log-ingestor resumes only ``requested`` and ``running`` jobs; a ``finished`` one is merely
  loaded (its config must parse) to re-submit buffered objects, of which there are none.
* ``ingestion_job_s3_scanner_state``: the row log-ingestor inserts with every S3 scanner job, with
  ``last_ingested_key`` the last key ingested (as ``S3ScannerState::ingest`` leaves it). The table
  is log-ingestor's (its ``create_tables`` creates it at every start); it is created here with the
  same shape when missing, as log-ingestor would.
* ``ingested_s3_object_metadata``: the objects, ``submitted`` with their ``compression_job_id``
  (``submit_for_compression``), so log-ingestor's ``get_unfinished_compression_jobs`` waits for the
  compression job and marks them ``compressed``/``failed`` as for its own jobs.
* ``compression_jobs``: ``INSERT (clp_config)``, every other column its default.

Everything is written in one transaction: log-ingestor never sees a finished job with buffered
objects (it would submit them a second time).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from sqlalchemy import (
    Column,
    Connection,
    Engine,
    ForeignKey,
    MetaData,
    String,
    Table,
    bindparam,
    insert,
    select,
    update,
)

from coordinator.partition import FETCH_BATCH_SIZE, S3ObjectRow
from coordinator.store.schema import MYSQL_TABLE_OPTIONS
from coordinator.store.schema import compression_jobs as _jobs
from coordinator.store.schema import ingested_s3_object_metadata as _objects
from coordinator.store.schema import ingestion_jobs as _ingestion_jobs
from coordinator.store.sqltypes import UnsignedBigInt

INGESTION_JOB_S3_SCANNER_STATE = "ingestion_job_s3_scanner_state"
"""log-ingestor's per-S3-scanner progress table (``clp_ingestion.rs``)."""

FINISHED = "finished"
"""``ClpIngestionJobStatus::Finished``: where log-ingestor leaves an ingestion job that ended."""
SUBMITTED = "submitted"
"""``IngestedS3ObjectMetadataStatus::Submitted``: an object whose compression job was inserted."""

# log-ingestor's defaults (ingestion.rs: BufferConfig::default, default_scanning_interval_sec).
BUFFER_FLUSH_THRESHOLD_BYTES = 4 * 1024 * 1024 * 1024
BUFFER_TIMEOUT_SEC = 300
BUFFER_CHANNEL_CAPACITY = 16
SCANNING_INTERVAL_SEC = 30

_state_metadata = MetaData()
# Only for the foreign key's target; never created from here.
Table(_ingestion_jobs.name, _state_metadata, Column("id", UnsignedBigInt, primary_key=True))
_scanner_state = Table(
    INGESTION_JOB_S3_SCANNER_STATE,
    _state_metadata,
    Column(
        "id",
        UnsignedBigInt,
        ForeignKey(
            f"{_ingestion_jobs.name}.id",
            name=f"{INGESTION_JOB_S3_SCANNER_STATE}_ingestion_job_id_ref",
            ondelete="RESTRICT",
            onupdate="RESTRICT",
        ),
        primary_key=True,
        autoincrement=False,
    ),
    Column("last_ingested_key", String(1024), nullable=True),
    **MYSQL_TABLE_OPTIONS,
)


def fetch_objects_of_jobs(
    connection: Connection, wanted: Mapping[int, Sequence[int]]
) -> dict[int, list[S3ObjectRow]]:
    """The object rows of each ingestion job of ``wanted`` (its id → the object ids wanted of
    it), as CLP's Rust coordinator reads one job's (``job_handle.rs``: its own rows ascending by
    id, an id of another ingestion job absent, the caller reporting it missing), for every job
    together: ``FETCH_BATCH_SIZE`` ids a query whatever the jobs they belong to, so a batch of
    small jobs, each with an ingestion job of its own (log-ingestor's), costs one query, not one
    per job. Raises the driver's errors."""
    pairs = sorted((object_id, job) for job, ids in wanted.items() for object_id in ids)
    found: dict[int, list[S3ObjectRow]] = {job: [] for job in wanted}
    for start in range(0, len(pairs), FETCH_BATCH_SIZE):
        batch = pairs[start : start + FETCH_BATCH_SIZE]
        asked = set(batch)
        result = connection.execute(
            _FETCH_OBJECTS_OF_JOBS,
            {
                "ids": [object_id for object_id, _ in batch],
                "jobs": sorted({job for _, job in batch}),
            },
        )
        for row in result:
            if (row.id, row.ingestion_job_id) in asked:
                found[row.ingestion_job_id].append(
                    S3ObjectRow(row.id, row.bucket, row.key, row.size)
                )
    return found


_FETCH_OBJECTS_OF_JOBS = (
    select(
        _objects.c.id,
        _objects.c.ingestion_job_id,
        _objects.c.bucket,
        _objects.c.key,
        _objects.c.size,
    )
    .where(
        _objects.c.id.in_(bindparam("ids", expanding=True)),
        _objects.c.ingestion_job_id.in_(bindparam("jobs", expanding=True)),
    )
    .order_by(_objects.c.id)
)
"""Built once (``fetch_objects_of_jobs``, every batch of submissions)."""


@dataclass(frozen=True)
class S3ScannerJob:
    """What an S3 scanner ingestion job was asked to ingest (log-ingestor's ``BaseConfig``)."""

    bucket: str
    key_prefix: str
    region: str | None = None
    endpoint_url: str | None = None
    dataset: str | None = None
    timestamp_key: str | None = None
    unstructured: bool = False

    def config_json(self) -> str:
        """``ingestion_job.config``: ``serde_json::to_string(&S3IngestionJobConfig::S3Scanner(…))``
        with every field (serde's order: the flattened ``BaseConfig`` first), no start key."""
        config = {
            "S3Scanner": {
                "bucket_name": self.bucket,
                "key_prefix": self.key_prefix,
                "region": self.region,
                "endpoint_url": self.endpoint_url,
                "dataset": self.dataset,
                "timestamp_key": self.timestamp_key,
                "unstructured": self.unstructured,
                "buffer_config": {
                    "flush_threshold_bytes": BUFFER_FLUSH_THRESHOLD_BYTES,
                    "timeout_sec": BUFFER_TIMEOUT_SEC,
                    "channel_capacity": BUFFER_CHANNEL_CAPACITY,
                },
                "scanning_interval_sec": SCANNING_INTERVAL_SEC,
                "start_after": None,
            }
        }
        return json.dumps(config, separators=(",", ":"), ensure_ascii=False)


def ensure_scanner_state_table(engine: Engine) -> None:
    """Create log-ingestor's ``ingestion_job_s3_scanner_state`` when missing (its DDL's shape)."""
    _scanner_state.create(engine, checkfirst=True)


def create_ingestion_job(connection: Connection, job: S3ScannerJob) -> int:
    """An ``ingestion_job`` row as log-ingestor leaves a finished S3 scanner, with its scanner
    state row (``last_ingested_key`` NULL until ``register_objects``); its id.

    The state table must exist (``ensure_scanner_state_table``).
    """
    key = connection.execute(
        insert(_ingestion_jobs).values(config=job.config_json(), status=FINISHED)
    ).inserted_primary_key
    assert key is not None
    job_id = int(key[0])
    connection.execute(insert(_scanner_state).values(id=job_id))
    return job_id


def register_objects(
    connection: Connection, ingestion_job_id: int, objects: Sequence[tuple[str, str, int]]
) -> list[int]:
    """Insert ``(bucket, key, size)`` rows as ``buffered`` objects of the ingestion job and record
    the last key as the scanner's ``last_ingested_key``; the ids."""
    ids = []
    for bucket, key, size in objects:
        inserted = connection.execute(
            insert(_objects).values(
                bucket=bucket, key=key, size=size, ingestion_job_id=ingestion_job_id
            )
        ).inserted_primary_key
        assert inserted is not None
        ids.append(int(inserted[0]))
    if objects:
        connection.execute(
            update(_scanner_state)
            .where(_scanner_state.c.id == ingestion_job_id)
            .values(last_ingested_key=max(key for _, key, _ in objects))
        )
    return ids


def submit_compression_job(
    connection: Connection, clp_config: bytes, object_ids: Sequence[int]
) -> int:
    """Insert a compression job and mark its objects ``submitted``, as log-ingestor does.

    ``INSERT INTO compression_jobs (clp_config)`` (every other column takes its default: Pending,
    no ``dispatch_time``), then the objects in batches of 1000, each batch having to change every
    row. Raises ``ValueError`` when an object is not ``buffered``, else the driver's errors.
    """
    key = connection.execute(insert(_jobs).values(clp_config=clp_config)).inserted_primary_key
    assert key is not None
    job_id = int(key[0])
    for start in range(0, len(object_ids), FETCH_BATCH_SIZE):
        batch = list(object_ids[start : start + FETCH_BATCH_SIZE])
        changed = connection.execute(
            update(_objects)
            .where(_objects.c.id.in_(batch), _objects.c.status == "buffered")
            .values(compression_job_id=job_id, status=SUBMITTED)
        ).rowcount
        if changed != len(batch):
            raise ValueError(f"{len(batch) - changed} object(s) were not buffered")
    return job_id


@dataclass(frozen=True)
class Ingested:
    """What ``ingest_and_submit`` wrote."""

    ingestion_job_id: int
    compression_job_id: int
    object_ids: list[int]


def ingest_and_submit(
    engine: Engine,
    job: S3ScannerJob,
    objects: Sequence[tuple[str, str, int]],
    clp_config: Callable[[int, list[int]], bytes],
) -> Ingested:
    """The finished ingestion job, its objects and their compression job, in one transaction.

    ``clp_config(ingestion_job_id, object_ids)`` is the compression job's blob. Raises
    ``ValueError`` and the driver's errors; then nothing is written (but the scanner state table,
    which is created first when missing).
    """
    ensure_scanner_state_table(engine)
    with engine.begin() as connection:
        ingestion_job_id = create_ingestion_job(connection, job)
        ids = register_objects(connection, ingestion_job_id, objects)
        compression_job_id = submit_compression_job(
            connection, clp_config(ingestion_job_id, ids), ids
        )
    return Ingested(ingestion_job_id, compression_job_id, ids)
