"""Submitting compression jobs the way CLP's log-ingestor does (``submit`` and ``demo``).

1. Optionally put files into the object store: the local object store
   (``<objects>/<bucket>/<prefix><name>``) when ``logs_input`` is not S3 (the embedded default,
   or a CLP file with ``fs`` logs input), else S3 (``s3://<bucket>/<prefix><name>``).
2. Register every object under the prefix as ``ingested_s3_object_metadata`` of a new
   ``ingestion_job``, written as log-ingestor leaves a finished S3 scanner job
   (``coordinator.store.ingestion``).
3. Insert the compression job with the ``clp_config`` log-ingestor writes (every key, ``type``
   ``s3_object_metadata``, ``dataset`` always set) and mark the objects ``submitted``; all three
   steps in one transaction.

A job whose objects are in the local object store says so itself: its input's (and its ingestion
job's) ``endpoint_url`` is ``file://<the store's absolute directory>``
(``coordinator.config.locations.local_store_endpoint``), which is what makes the compress task
read that directory and the embedded default claim the job. Objects in S3 get the S3 endpoint and
region given (``--endpoint-url``, ``--region``), exactly as log-ingestor's would.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from coordinator.archive_storage.s3 import s3_client
from coordinator.config.clp import ArchiveOutput, S3IngestionConfig
from coordinator.config.loader import CoordinatorConfig
from coordinator.config.locations import DEFAULT_BUCKET, DEFAULT_PREFIX, local_store_endpoint
from coordinator.errors import CoordinatorError
from coordinator.job_config import (
    ClpIoConfig,
    OutputConfig,
    S3ObjectMetadataInputConfig,
    encode_clp_io_config,
)
from coordinator.store.ingestion import S3ScannerJob, ingest_and_submit
from coordinator.store.names import DEFAULT_DATASET, validate_dataset_name
from coordinator.task_io import (
    AwsAuthentication,
    AwsCredentials,
    CredentialsAuthentication,
    DefaultAuthentication,
)

__all__ = [
    "DEFAULT_BUCKET",
    "DEFAULT_PREFIX",
    "IngestError",
    "S3Location",
    "list_objects",
    "output_config_of",
    "put_files",
    "submit_job",
    "uses_s3",
]


class IngestError(CoordinatorError, ValueError):
    """Nothing to submit, or a file or object that cannot be ingested; the message says which."""


@dataclass(frozen=True)
class S3Location:
    """Where ``submit`` reads objects when the logs input is S3 (not the local object store)."""

    endpoint_url: str | None = None
    region_code: str | None = None


def _authentication(config: CoordinatorConfig) -> AwsAuthentication:
    logs_input = config.clp.logs_input
    if isinstance(logs_input, S3IngestionConfig) and logs_input.aws_authentication.credentials:
        credentials = logs_input.aws_authentication.credentials
        return CredentialsAuthentication(
            credentials=AwsCredentials(
                access_key_id=credentials.access_key_id,
                secret_access_key=credentials.secret_access_key,
                session_token=credentials.session_token,
            )
        )
    return DefaultAuthentication()


def uses_s3(config: CoordinatorConfig) -> bool:
    """Whether logs come from S3 (else from the local object store)."""
    return isinstance(config.clp.logs_input, S3IngestionConfig)


def put_files(
    config: CoordinatorConfig,
    paths: Sequence[Path],
    *,
    bucket: str,
    prefix: str,
    s3: S3Location = S3Location(),
) -> list[str]:
    """Copy or upload ``paths`` to ``<bucket>/<prefix><file name>``; the keys written.

    Raises ``IngestError`` for a path that is not a readable file.
    """
    keys = []
    for path in paths:
        if not path.is_file():
            raise IngestError(f"{path} is not a file")
        key = f"{prefix}{path.name}"
        if uses_s3(config):
            _s3_client(config, s3).upload_file(str(path), bucket, key)
        else:
            target = config.object_store_directory / bucket / key
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
        keys.append(key)
    return keys


def list_objects(
    config: CoordinatorConfig, *, bucket: str, prefix: str, s3: S3Location = S3Location()
) -> list[tuple[str, str, int]]:
    """``(bucket, key, size)`` of every object under the prefix, in key order."""
    if uses_s3(config):
        client = _s3_client(config, s3)
        found = []
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            found += [(bucket, item["Key"], int(item["Size"])) for item in page.get("Contents", [])]
        return sorted(found)
    root = config.object_store_directory / bucket
    return sorted(
        (bucket, str(path.relative_to(root)), path.stat().st_size)
        for path in root.rglob("*")
        if path.is_file() and str(path.relative_to(root)).startswith(prefix)
    )


def output_config_of(output: ArchiveOutput) -> OutputConfig:
    """The job config's ``output`` from CLP's ``archive_output``, as log-ingestor writes it."""
    return OutputConfig(
        target_archive_size=output.target_archive_size,
        target_dictionaries_size=output.target_dictionaries_size,
        target_encoded_file_size=output.target_encoded_file_size,
        target_segment_size=output.target_segment_size,
        compression_level=output.compression_level,
    )


def submit_job(
    config: CoordinatorConfig,
    engine: Engine,
    *,
    bucket: str = DEFAULT_BUCKET,
    prefix: str = DEFAULT_PREFIX,
    dataset: str | None = None,
    timestamp_key: str | None = None,
    s3: S3Location = S3Location(),
) -> int:
    """Register the objects under ``<bucket>/<prefix>`` and insert their compression job; its id.

    Raises ``IngestError`` when there are no objects or the prefix is empty (CLP requires one),
    ``InvalidDatasetName``, and the database's errors.
    """
    if not prefix:
        raise IngestError("the key prefix must not be empty (CLP requires one)")
    dataset = validate_dataset_name(dataset or DEFAULT_DATASET)
    objects = list_objects(config, bucket=bucket, prefix=prefix, s3=s3)
    if not objects:
        raise IngestError(f"no objects under {bucket}/{prefix}")
    if uses_s3(config):
        endpoint_url, region_code = s3.endpoint_url, s3.region_code
    else:
        endpoint_url, region_code = local_store_endpoint(config.object_store_directory), None
    scanner = S3ScannerJob(
        bucket=bucket,
        key_prefix=prefix,
        region=region_code,
        endpoint_url=endpoint_url,
        dataset=dataset,
        timestamp_key=timestamp_key,
    )
    output = config.clp.archive_output

    def clp_config(ingestion_job: int, ids: list[int]) -> bytes:
        return encode_clp_io_config(
            ClpIoConfig(
                input=S3ObjectMetadataInputConfig(
                    bucket=bucket,
                    region_code=region_code,
                    key_prefix=prefix,
                    endpoint_url=endpoint_url,
                    aws_authentication=_authentication(config),
                    ingestion_job_id=ingestion_job,
                    s3_object_metadata_ids=ids,
                    dataset=dataset,
                    timestamp_key=timestamp_key,
                    unstructured=False,
                ),
                output=output_config_of(output),
            )
        )

    return ingest_and_submit(engine, scanner, objects, clp_config).compression_job_id


def _s3_client(config: CoordinatorConfig, s3: S3Location) -> Any:
    return s3_client(s3.endpoint_url, s3.region_code, _authentication(config))
