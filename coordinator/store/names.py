"""Table names and dataset names: the single definition.

CLP's names (``clp_py_utils/clp_config.py``, ``clp_metadata_db_utils.py``, log-ingestor's DDL) are
reproduced exactly; the coordinator's own tables carry the ``coordinator_`` or
``compression_job_`` prefix. A per-dataset table name is only ever built from a validated dataset.
"""

from __future__ import annotations

import re

from coordinator.errors import CoordinatorError

COMPRESSION_JOBS = "compression_jobs"
COMPRESSION_JOB_TRANSITIONS = "compression_job_transitions"
DATASETS = "clp_datasets"
INGESTION_JOBS = "ingestion_job"
INGESTED_S3_OBJECT_METADATA = "ingested_s3_object_metadata"
SPIDER_RESOURCE_GROUPS = "spider_resource_groups"
ADOPTED_TABLES = "coordinator_adopted_tables"
STORED_ARCHIVES = "compression_stored_archives"
ENGINE_RESOURCE_GROUPS = "spider_engine_resource_groups"
ENGINE_JOBS = "spider_engine_jobs"
COORDINATOR_INSTANCES = "coordinator_instances"

CLP_METADATA_TABLE_PREFIX = "clp_"
DEFAULT_DATASET = "default"

DATASET_NAME_MAX_LENGTH = 44
"""64 (MySQL's identifier limit) - len("clp_") - 1 - len("column_metadata"), as CLP's Python."""

_DATASET_NAME = re.compile(r"[A-Za-z0-9_]+")


class InvalidDatasetName(CoordinatorError, ValueError):
    """A dataset name that CLP's Rust and Python validators would not both accept."""


def validate_dataset_name(name: str) -> str:
    """``name`` when it is a safe dataset name: ASCII letters, digits and ``_``, 1 to 44 characters.

    That is the intersection of CLP's Rust rule (``^[a-zA-Z0-9_]+$``, no length limit) and its
    Python/WebUI rule (``\\w+``, at most 44). Fails with ``InvalidDatasetName`` naming the broken
    rule.
    """
    if not _DATASET_NAME.fullmatch(name):
        raise InvalidDatasetName(
            f"invalid dataset name {name!r}: use only ASCII letters, digits and '_' (at least one)"
        )
    if len(name) > DATASET_NAME_MAX_LENGTH:
        raise InvalidDatasetName(
            f"invalid dataset name {name!r}: {len(name)} characters, "
            f"at most {DATASET_NAME_MAX_LENGTH} are allowed"
        )
    return name


def resolve_dataset_name(dataset: str | None) -> str:
    """The dataset a job writes to: its own (validated) or CLP's ``default``."""
    return validate_dataset_name(DEFAULT_DATASET if dataset is None else dataset)


def archives_table_name(dataset: str) -> str:
    """``clp_{dataset}_archives`` for a validated dataset; raises ``InvalidDatasetName``."""
    return f"{CLP_METADATA_TABLE_PREFIX}{validate_dataset_name(dataset)}_archives"


def files_table_name(dataset: str) -> str:
    """``clp_{dataset}_files`` for a validated dataset; raises ``InvalidDatasetName``."""
    return f"{CLP_METADATA_TABLE_PREFIX}{validate_dataset_name(dataset)}_files"


def column_metadata_table_name(dataset: str) -> str:
    """``clp_{dataset}_column_metadata`` for a validated dataset; raises ``InvalidDatasetName``."""
    return f"{CLP_METADATA_TABLE_PREFIX}{validate_dataset_name(dataset)}_column_metadata"
