"""How each lifecycle state is stored in ``compression_jobs``: the one mapping.

CLP's readers (log-ingestor's ``wait_for_compression_result``, ``compress.py``'s
``handle_job_update``, the WebUI) know only the status numbers 0-4 and fail on anything else. The
machine's Committed state therefore has two stored forms, chosen by a setting
(``coordinator.committed_status``):

==========  =====================  ==============  ==============================================
state       ``status``             ``committed_at`` why
==========  =====================  ==============  ==============================================
Pending     0                      (any)
Running     1                      NULL            CLP's RUNNING
Committed   1 (``running``,        set             the default: every CLP reader sees a job still
            default) or 5                          in progress; the marker column is the
            (``distinct``)                         coordinator's own (migration 0004)
Succeeded   2                      (kept)          a finalised job keeps the instant of its commit
Failed      3                      (kept)
Killed      4                      (kept)
==========  =====================  ==============  ==============================================

Reading accepts both forms of Committed whatever the setting, so the setting can change while jobs
are in flight. Every guarded ``UPDATE`` derives its source condition from ``STORED_FORMS`` and its
written values from ``stored_status``; nothing else spells these numbers.

A consequence worth knowing: a foreign writer that updates RUNNING rows (CLP's legacy scheduler
kills every RUNNING job at its start-up) also hits Committed rows in the default form. The
coordinator then withdraws the job's published archives (``coordinator.service.cleanup``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from coordinator.lifecycle.status import (
    ENDED_BADLY_STATUSES,
    IN_FLIGHT_STATUSES,
    TERMINAL_STATUSES,
    JobStatus,
)


class CommittedStorage(StrEnum):
    """Which ``status`` value a Committed job is stored with."""

    RUNNING = "running"
    """CLP's RUNNING (1) plus the ``committed_at`` marker: invisible to CLP's readers (default)."""

    DISTINCT = "distinct"
    """A status of its own (5) plus the marker: only for a CLP whose readers know the value."""


DEFAULT_COMMITTED_STORAGE = CommittedStorage.RUNNING


@dataclass(frozen=True)
class StoredForm:
    """The rows that hold a state: ``status`` in ``statuses`` and the marker as ``committed``."""

    statuses: tuple[int, ...]
    committed: bool | None
    """``True``: ``committed_at`` is set; ``False``: it is NULL; ``None``: either."""


STORED_FORMS: dict[JobStatus, StoredForm] = {
    JobStatus.PENDING: StoredForm((int(JobStatus.PENDING),), None),
    JobStatus.RUNNING: StoredForm((int(JobStatus.RUNNING),), False),
    JobStatus.COMMITTED: StoredForm((int(JobStatus.RUNNING), int(JobStatus.COMMITTED)), True),
    JobStatus.SUCCEEDED: StoredForm((int(JobStatus.SUCCEEDED),), None),
    JobStatus.FAILED: StoredForm((int(JobStatus.FAILED),), None),
    JobStatus.KILLED: StoredForm((int(JobStatus.KILLED),), None),
}

CLP_STATUS_VALUES: frozenset[int] = frozenset(
    int(status) for status in JobStatus if status is not JobStatus.COMMITTED
)
"""The ``status`` values CLP's own readers understand (0-4)."""


def stored_values(states: Iterable[JobStatus]) -> tuple[int, ...]:
    """Every ``status`` value a row in one of ``states`` may hold, ascending."""
    return tuple(sorted({value for state in states for value in STORED_FORMS[state].statuses}))


IN_FLIGHT_STATUS_VALUES = stored_values(IN_FLIGHT_STATUSES)
"""``status`` values of a submitted job that is not terminal (Running or Committed)."""

TERMINAL_STATUS_VALUES = stored_values(TERMINAL_STATUSES)
"""``status`` values of an ended job."""

ENDED_BADLY_STATUS_VALUES = stored_values(ENDED_BADLY_STATUSES)
"""``status`` values of a Failed or Killed job."""


def stored_status(state: JobStatus, storage: CommittedStorage) -> int:
    """The ``status`` value written for ``state``."""
    if state is JobStatus.COMMITTED and storage is CommittedStorage.RUNNING:
        return int(JobStatus.RUNNING)
    return int(state)


def state_of(status: int, committed_at: datetime | None) -> JobStatus:
    """The lifecycle state a row holds; raises ``ValueError`` for a status no one defines."""
    if status == JobStatus.COMMITTED:
        return JobStatus.COMMITTED
    state = JobStatus(status)
    if state is JobStatus.RUNNING and committed_at is not None:
        return JobStatus.COMMITTED
    return state


def describe_stored(status: int, committed_at: datetime | None) -> str:
    """A row's state as a name for messages, tolerating values no CLP component defines."""
    try:
        return state_of(status, committed_at).label
    except ValueError:
        return f"unknown status {status}"
