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
"""Final: no edge leaves them."""

IN_FLIGHT_STATUSES: frozenset[JobStatus] = frozenset({JobStatus.RUNNING, JobStatus.COMMITTED})
"""Submitted to Spider and not ended: the states the loop polls Spider for."""

PUBLISHED_STATUSES: frozenset[JobStatus] = frozenset({JobStatus.COMMITTED, JobStatus.SUCCEEDED})
"""The states in which the job's archives are published (its commit took effect and stands)."""

ENDED_BADLY_STATUSES: frozenset[JobStatus] = frozenset({JobStatus.FAILED, JobStatus.KILLED})
"""Terminal without success: such a job keeps nothing published and no stored archive."""

LIFECYCLE_ORDER = (
    JobStatus.PENDING,
    JobStatus.RUNNING,
    JobStatus.COMMITTED,
    JobStatus.SUCCEEDED,
    JobStatus.FAILED,
    JobStatus.KILLED,
)
"""The states in the order the diagrams and tables show them."""


def describe_status(value: int) -> str:
    """A status number as a name for messages, tolerating values no CLP component defines."""
    try:
        return JobStatus(value).label
    except ValueError:
        return f"unknown status {value}"
