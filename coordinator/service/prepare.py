"""Preparing a claimed job for Spider: config → objects → partitions → task graph and inputs.

The steps and their failure messages follow CLP's job handle (``clp-contract.md`` §7.1, §11.4); a
job that fails here can never run, and ends Failed with the message (prefixed
``Compression job failed: `` as CLP does, or ``Failed to deserialize CLP I/O config: `` for a
config blob that does not decode).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Engine

from coordinator.config.clp import CompressionCoordinator
from coordinator.job_config import (
    S3ObjectMetadataInputConfig,
    UndecodableJobConfig,
    decode_clp_io_config,
)
from coordinator.partition import (
    InvalidJobInput,
    check_requested_ids,
    objects_in_id_order,
    partition_objects,
    require_partitions,
)
from coordinator.serde import WireFormatError
from coordinator.spider.policy import InvalidExecutionPolicy, commit_task_policy
from coordinator.spider.task_graph import JobSubmission, build_compression_job
from coordinator.store.datasets import registered_with_other_case
from coordinator.store.ingestion import fetch_objects
from coordinator.store.names import InvalidDatasetName, resolve_dataset_name
from coordinator.task_io import ClpSCompressionOption, S3InputSource

MAX_REGISTER_BYTES = 4 * 1024 * 1024
"""gRPC's default message limit, which a Spider cluster enforces on RegisterJob."""


class JobRejected(Exception):
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
    try:
        job_input = decode_clp_io_config(clp_config).input
    except UndecodableJobConfig:
        return resolve_dataset_name(None)
    dataset = job_input.dataset
    try:
        return resolve_dataset_name(dataset)
    except InvalidDatasetName:
        return resolve_dataset_name(None)


def prepare(engine: Engine, clp_config: bytes, settings: CompressionCoordinator) -> PreparedJob:
    """The Spider submission for a job; raises ``JobRejected`` with the operator's message.

    Database errors propagate (the job stays Pending and is tried again).
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
    try:
        ids = check_requested_ids(job_input.s3_object_metadata_ids, job_input.ingestion_job_id)
        with engine.connect() as connection:
            registered = registered_with_other_case(connection, dataset)
            rows = fetch_objects(connection, ids, job_input.ingestion_job_id)
        objects = objects_in_id_order(
            ids,
            job_input.ingestion_job_id,
            rows,
            bucket=job_input.bucket,
            key_prefix=job_input.key_prefix,
        )
        partitions = require_partitions(partition_objects(objects, output.target_archive_size))
    except InvalidJobInput as error:
        raise JobRejected(f"Compression job failed: {error}") from error
    if registered is not None:
        # MariaDB compares dataset names without letter case but table names with it: CLP's
        # readers would look for the registered name's tables and never see this job's archives.
        raise JobRejected(
            f"Compression job failed: invalid dataset: {dataset} (the registered dataset "
            f"{registered!r} differs only in letter case; use {registered!r})"
        )
    option = ClpSCompressionOption(
        target_encoded_size=output.target_segment_size + output.target_dictionaries_size,
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
