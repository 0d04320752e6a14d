"""What a task knows when it runs: its identity in Spider and the worker's settings.

A Spider worker gives CLP's tasks their environment through ``CLP_CONFIG_PATH``/``CLP_HOME``; here
the engine hands each task process one JSON document, ``WorkerSettings``, in the environment
variable ``COORDINATOR_WORKER_SETTINGS``: the database the commit task writes to, where archives are
stored (``coordinator.archive_storage``), where inputs are read from when there is no S3, and
scratch space.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from coordinator.archive_storage import ArchiveOutputSettings
from coordinator.errors import CoordinatorError
from coordinator.lifecycle.storage import DEFAULT_COMMITTED_STORAGE, CommittedStorage

WORKER_SETTINGS_ENV = "COORDINATOR_WORKER_SETTINGS"
S3_READ_ATTEMPTS = 5
"""Runs of clp-s in all while each fails only reading S3 for a transient reason."""
S3_READ_FIRST_DELAY_SECS = 1.0
S3_READ_MAX_DELAY_SECS = 8.0


class TaskError(CoordinatorError):
    """A task failed for a reason an operator can act on; the message says what and why."""


class S3ReadRetries(BaseModel):
    """How the compress task reruns clp-s after it failed only reading S3 for a transient reason.

    ``attempts`` runs in all, ``first_delay_secs`` doubling to at most ``max_delay_secs`` apart
    (by default 5 runs, 1 s doubling to 8 s: 15 s of waiting in all).
    """

    model_config = ConfigDict(frozen=True)

    attempts: int = Field(default=S3_READ_ATTEMPTS, ge=1)
    first_delay_secs: float = Field(default=S3_READ_FIRST_DELAY_SECS, ge=0)
    max_delay_secs: float = Field(default=S3_READ_MAX_DELAY_SECS, ge=0)


class WorkerSettings(BaseModel):
    """The environment of a task process (one JSON document)."""

    model_config = ConfigDict(frozen=True)

    database_url: SecretStr
    """Where the commit task publishes, and where tasks record what they stored."""
    archive_output: ArchiveOutputSettings
    staging_directory: Path
    """Scratch space for clp-s's output before an archive is stored."""
    object_store_directory: Path | None = None
    """The local object store this worker serves: for a job whose input ``endpoint_url`` names it
    (``file://<dir>``), the object ``s3://<bucket>/<key>`` is the file ``<dir>/<bucket>/<key>``
    and S3 is not contacted. Other jobs are read from S3 whatever this is."""
    clp_s_path: Path | None = None
    """The ``clp-s`` binary; unset: the one ``yscope-clp-core`` ships."""
    committed_storage: CommittedStorage = DEFAULT_COMMITTED_STORAGE
    """How the commit task stores a Committed job (``coordinator.committed_status``)."""
    s3_read_retries: S3ReadRetries = S3ReadRetries()
    """The bound on rerunning clp-s through a short S3 outage
    (``coordinator.engine.tasks.compress``)."""

    def to_environment(self) -> dict[str, str]:
        """The variable that carries these settings (secrets included) to a task process."""
        return {WORKER_SETTINGS_ENV: json.dumps(_revealed(self.model_dump()))}

    @classmethod
    def from_environment(cls) -> WorkerSettings:
        """The settings of this process; raises ``TaskError`` when the variable is absent/bad."""
        document = os.environ.get(WORKER_SETTINGS_ENV)
        if not document:
            raise TaskError(f"${WORKER_SETTINGS_ENV} is not set: this process is not a task worker")
        try:
            return cls.model_validate_json(document)
        except ValueError as error:
            raise TaskError(f"${WORKER_SETTINGS_ENV} is invalid: {error}") from error


def _revealed(value: Any) -> Any:
    # model_dump keeps SecretStr objects (and pydantic's JSON dump would mask them); a task process
    # needs the real values, so they are written out for its environment only.
    if isinstance(value, dict):
        return {key: _revealed(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_revealed(item) for item in value]
    if isinstance(value, SecretStr):
        return value.get_secret_value()
    if isinstance(value, Path):
        return str(value)
    return value


@dataclass(frozen=True)
class TaskContext:
    """One task instance's identity and environment."""

    job_id: int
    """The Spider job id (CLP's ``compression_jobs.spider_id``)."""
    task_id: str
    """The task's index in the graph (``"0"``, ``"1"``, …), or ``"commit"`` / ``"cleanup"``."""
    instance_id: int
    settings: WorkerSettings
    graph_outputs: tuple[bytes, ...] = field(default=())
    """For the commit task: every graph output (one ``CompressionTaskOutput`` per task)."""
