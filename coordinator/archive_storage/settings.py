"""Where archives are stored: a directory (``fs``) or an S3 bucket, as tasks and clean-up see it.

The coordinator derives these settings from CLP's ``archive_output``
(``coordinator.runtime.archive_output_of``) and hands them to the tasks inside their worker
settings (``coordinator.engine.tasks.context.WorkerSettings``); the coordinator's clean-up uses the
same settings to remove and list what the tasks stored.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from coordinator.task_io import AwsAuthentication, DefaultAuthentication


class FsArchiveOutput(BaseModel):
    """Archives go to ``<directory>/<dataset>/<archive id>``."""

    model_config = ConfigDict(frozen=True)

    type: Literal["fs"] = "fs"
    directory: Path


class S3ArchiveOutput(BaseModel):
    """Archives go to ``s3://<bucket>/<key_prefix><dataset>/<archive id>`` (CLP's layout)."""

    model_config = ConfigDict(frozen=True)

    type: Literal["s3"] = "s3"
    bucket: str
    key_prefix: str
    region_code: str | None = None
    endpoint_url: str | None = None
    aws_authentication: AwsAuthentication = DefaultAuthentication()


ArchiveOutputSettings = Annotated[FsArchiveOutput | S3ArchiveOutput, Field(discriminator="type")]
