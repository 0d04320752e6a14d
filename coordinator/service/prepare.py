"""Preparing a claimed job for Spider: config → objects → partitions → task graph and inputs.

The steps and their failure messages follow CLP's job handle (``docs/clp.md``, Partitioning and
CLP's Rust coordinator); a job that fails here can never run, and ends Failed with the message
(prefixed ``Compression job failed: `` as CLP does, or ``Failed to deserialize CLP I/O config: ``
for a config blob that does not decode).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import Connection, Engine

from coordinator.config.clp import CompressionCoordinator
from coordinator.errors import CoordinatorError
from coordinator.job_config import (
    OutputConfig,
    S3ObjectMetadataInputConfig,
    UndecodableJobConfig,
    decode_clp_io_config,
)
from coordinator.partition import (
    InvalidJobInput,
    S3ObjectRow,
    check_requested_ids,
    objects_in_id_order,
    partition_objects,
    require_partitions,
)
from coordinator.serde import WireFormatError
from coordinator.spider.policy import InvalidExecutionPolicy, commit_task_policy
from coordinator.spider.task_graph import JobSubmission, build_compression_job
from coordinator.store.database import reading
from coordinator.store.datasets import registered_in_any_case
from coordinator.store.ingestion import fetch_objects_of_jobs
from coordinator.store.names import InvalidDatasetName, resolve_dataset_name
from coordinator.task_io import ClpSCompressionOption, S3InputSource

MAX_REGISTER_BYTES = 4 * 1024 * 1024
"""gRPC's default message limit, which a Spider cluster enforces on RegisterJob."""

U64_MAX = 2**64 - 1
"""CLP's Rust ids and sizes are ``u64``; MariaDB's ``BIGINT UNSIGNED`` holds them all."""
SQLITE_INTEGER_MAX = 2**63 - 1
"""SQLite's ``INTEGER`` is a signed 64-bit integer: no row has a larger id."""


class JobRejected(CoordinatorError):
    """The job can never run; ``str()`` is the ``status_msg`` that tells the operator why."""


@dataclass(frozen=True)
class PreparedJob:
    """Everything needed to register the job with Spider."""

    dataset: str
    submission: JobSubmission
    num_objects: int

    @property
    def num_tasks(self) -> int:
        """One compress task per partition."""
        return len(self.submission.task_graph.tasks)


def dataset_of(clp_config: bytes) -> str:
    """The dataset a job writes to, ``default`` when the config names none or cannot be read."""
    return known_dataset_of(clp_config) or resolve_dataset_name(None)


def known_dataset_of(clp_config: bytes) -> str | None:
    """The dataset a job writes to (``default`` when the config names none), or ``None`` when the
    config cannot be read or names an invalid dataset. Never fails."""
    try:
        return resolve_dataset_name(decode_clp_io_config(clp_config).input.dataset)
    except (UndecodableJobConfig, InvalidDatasetName):
        return None


def largest_stored_id(engine: Engine) -> int:
    """The largest id ``ingested_s3_object_metadata`` and ``ingestion_job`` can hold here."""
    return SQLITE_INTEGER_MAX if engine.dialect.name == "sqlite" else U64_MAX


def prepare(
    engine: Engine,
    clp_config: bytes,
    settings: CompressionCoordinator,
    *,
    cleanup_task: bool = True,
    registered_as_named: set[str] | None = None,
) -> PreparedJob:
    """The Spider submission for one job: ``check_request``, ``read_requests`` in a read of its
    own, then ``plan``. Raises ``JobRejected`` with the operator's message.

    ``cleanup_task``: whether the graph carries the coordinator's ``compression::cleanup`` task.
    ``registered_as_named``: the datasets seen registered under exactly their own name, which the
    caller keeps across jobs (see ``_registered_in_other_case``); this call adds to it.

    Database errors propagate (the job stays Pending and is tried again).
    """
    request = check_request(clp_config, largest_stored_id(engine))
    with reading(engine) as connection:
        found = read_requests(connection, [request], registered_as_named)
    return plan(request, found, settings, cleanup_task=cleanup_task)


@dataclass(frozen=True)
class JobRequest:
    """A job's config, checked as far as it can be without the database: what ``read_requests``
    reads for it, and what ``plan`` builds from."""

    job_input: S3ObjectMetadataInputConfig
    output: OutputConfig
    dataset: str
    target_encoded_size: int
    ids: list[int]
    """The requested object ids, distinct and ascending."""
    fetchable: list[int]
    """Those of ``ids`` a row can have here (``largest_stored_id``); the others are missing."""


@dataclass(frozen=True)
class RequestsRead:
    """What one read found for the requests of several jobs (``read_requests``)."""

    rows: dict[int, list[S3ObjectRow]]
    """The fetched objects, by ingestion job: every job's of that ingestion job together."""
    other_case: dict[str, str | None]
    """By dataset, the registered dataset whose name differs from it only in letter case."""


def check_request(clp_config: bytes, largest_id: int) -> JobRequest:
    """The checked request of a job config: the checks that need no database, in CLP's order.

    ``largest_id``: the largest id ``ingested_s3_object_metadata`` can hold
    (``largest_stored_id``). Raises ``JobRejected`` with the operator's message.
    """
    try:
        config = decode_clp_io_config(clp_config)
    except UndecodableJobConfig as error:
        raise JobRejected(f"Failed to deserialize CLP I/O config: {error}") from error
    job_input = config.input
    if not isinstance(job_input, S3ObjectMetadataInputConfig):
        raise JobRejected(f"Compression job failed: unsupported input type `{job_input.type}`")
    try:
        dataset = resolve_dataset_name(job_input.dataset)
    except InvalidDatasetName as error:
        raise JobRejected(
            f"Compression job failed: invalid dataset: {job_input.dataset} ({error})"
        ) from error
    output = config.output
    if output.target_archive_size <= 0:
        raise JobRejected(
            "Compression job failed: output.target_archive_size must be positive, got 0"
        )
    # clp-s takes one u64 target for segments and dictionaries together; Rust's release build
    # would wrap the sum silently, so a sum past u64 is refused instead.
    target_encoded_size = output.target_segment_size + output.target_dictionaries_size
    if target_encoded_size > U64_MAX:
        raise JobRejected(
            "Compression job failed: output.target_segment_size + "
            f"output.target_dictionaries_size = {target_encoded_size} overflows clp-s's u64 "
            f"target encoded size (at most {U64_MAX})"
        )
    try:
        ids = check_requested_ids(job_input.s3_object_metadata_ids, job_input.ingestion_job_id)
    except InvalidJobInput as error:
        raise JobRejected(f"Compression job failed: {error}") from error
    # An id the database's columns cannot hold names no row (SQLite's INTEGER is signed, so a
    # u64 above 2^63-1 would fail the query itself): it is missing, as on MariaDB.
    fetchable = [object_id for object_id in ids if object_id <= largest_id]
    if job_input.ingestion_job_id > largest_id:
        fetchable = []
    return JobRequest(job_input, output, dataset, target_encoded_size, ids, fetchable)


def read_requests(
    connection: Connection,
    requests: Sequence[JobRequest],
    registered_as_named: set[str] | None = None,
) -> RequestsRead:
    """Read what ``requests`` need, together: the objects of every ingestion job they name in
    one fetch (``fetch_objects_of_jobs``: ``FETCH_BATCH_SIZE`` ids a query, whatever their
    ingestion jobs: log-ingestor makes one per compression job), the letter-case check of each
    dataset they write to once. Raises the driver's errors.
    """
    wanted: dict[int, set[int]] = {}
    for request in requests:
        wanted.setdefault(request.job_input.ingestion_job_id, set()).update(request.fetchable)
    other_case = {
        dataset: _registered_in_other_case(connection, dataset, registered_as_named)
        for dataset in dict.fromkeys(request.dataset for request in requests)
    }
    rows = fetch_objects_of_jobs(connection, {job: sorted(ids) for job, ids in wanted.items()})
    return RequestsRead(rows, other_case)


def plan(
    request: JobRequest,
    found: RequestsRead,
    settings: CompressionCoordinator,
    *,
    cleanup_task: bool = True,
) -> PreparedJob:
    """The Spider submission for ``request`` from what ``read_requests`` found for it: its objects
    checked and partitioned, its task graph built and weighed. Raises ``JobRejected`` with the
    operator's message."""
    job_input, output, dataset = request.job_input, request.output, request.dataset
    try:
        objects = objects_in_id_order(
            request.ids,
            job_input.ingestion_job_id,
            found.rows.get(job_input.ingestion_job_id, []),
            bucket=job_input.bucket,
            key_prefix=job_input.key_prefix,
        )
        partitions = require_partitions(partition_objects(objects, output.target_archive_size))
    except InvalidJobInput as error:
        raise JobRejected(f"Compression job failed: {error}") from error
    registered = found.other_case.get(dataset)
    if registered is not None:
        # MariaDB compares dataset names without letter case but table names with it: CLP's
        # readers would look for the registered name's tables and never see this job's archives.
        raise JobRejected(
            f"Compression job failed: invalid dataset: {dataset} (the registered dataset "
            f"{registered!r} differs only in letter case; use {registered!r})"
        )
    option = ClpSCompressionOption(
        target_encoded_size=request.target_encoded_size,
        compression_level=output.compression_level,
        timestamp_key=job_input.timestamp_key,
        unstructured=job_input.unstructured,
    )
    sources = [
        S3InputSource(
            endpoint_url=job_input.endpoint_url,
            region_code=job_input.region_code,
            bucket=job_input.bucket,
            aws_authentication=job_input.aws_authentication,
            object_keys=keys,
        )
        for keys in partitions
    ]
    try:
        submission = build_compression_job(
            sources,
            option,
            job_input.dataset,
            compression_task_max_retry=settings.compression_task_max_retry,
            commit_policy=commit_task_policy(
                settings.commit_task_max_retry,
                settings.commit_task_soft_timeout_secs,
                settings.commit_task_hard_timeout_secs,
            ),
            cleanup_task=cleanup_task,
        )
    except (InvalidExecutionPolicy, WireFormatError) as error:
        raise JobRejected(
            f"Compression job failed: failed to build the compression task graph: {error}"
        ) from error
    size = len(submission.compressed_task_graph()) + len(submission.compressed_inputs())
    if size > MAX_REGISTER_BYTES:
        raise JobRejected(
            f"Compression job failed: the job is too large for Spider: its task graph and inputs "
            f"take {size} bytes compressed, over the {MAX_REGISTER_BYTES}-byte message limit; "
            "submit its objects as several jobs"
        )
    return PreparedJob(dataset, submission, len(objects))


def _registered_in_other_case(
    connection: Connection, dataset: str, registered_as_named: set[str] | None
) -> str | None:
    """The registered dataset whose name differs from ``dataset`` only in letter case, if any.

    Not read again once ``dataset`` was seen registered under exactly its name (and alone): no
    other case can be registered beside it where names compare without case (MariaDB's key on
    ``clp_datasets.name``), nor matter where they do not (SQLite, whose table names compare without
    case). Should the row be deleted and another case registered meanwhile, the commit still
    refuses the job (``register_dataset``'s ``DatasetNameCollision``). Raises the driver's errors.
    """
    if registered_as_named is not None and dataset in registered_as_named:
        return None
    names = registered_in_any_case(connection, dataset)
    if registered_as_named is not None and names == [dataset]:
        registered_as_named.add(dataset)
    return next((name for name in names if name != dataset), None)
