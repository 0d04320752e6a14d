"""Compression job status numbers: the single definition.

The numbers 0-4 are CLP's ``CompressionJobStatus`` (Python ``scheduler/constants.py``, Rust
``job_config/compression.rs``) and must never change: the log-ingestor, the legacy Celery scheduler
and the WebUI read them from ``compression_jobs.status``. ``COMMITTED`` (5) is the coordinator's own
non-terminal state between the commit task's publication and Spider's final word; by default it is
*stored* as RUNNING plus a marker column, so CLP's readers never see 5 (``storage.py``).
"""

from __future__ import annotations

from enum import IntEnum


class JobStatus(IntEnum):
    """The value stored in ``compression_jobs.status``."""

    PENDING = 0
    RUNNING = 1
    SUCCEEDED = 2
    FAILED = 3
    KILLED = 4
    COMMITTED = 5

    @property
    def is_terminal(self) -> bool:
        """Whether nothing may ever move a job out of this status."""
        return self in TERMINAL_STATUSES

    @property
    def label(self) -> str:
        """The state's name as the machine and the diagrams spell it (``Pending``)."""
        return self.name.capitalize()

    @classmethod
    def from_label(cls, label: str) -> JobStatus:
        """The status named ``label`` (``Pending``); raises ``KeyError`` for an unknown name."""
        return cls[label.upper()]


TERMINAL_STATUSES: frozenset[JobStatus] = frozenset(
    {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.KILLED}
)


def describe_status(value: int) -> str:
    """A status number as a name for messages, tolerating values no CLP component defines."""
    try:
        return JobStatus(value).label
    except ValueError:
        return f"unknown status {value}"
