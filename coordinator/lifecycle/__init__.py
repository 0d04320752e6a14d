"""The job lifecycle: status numbers and the state machine, defined once."""

from coordinator.lifecycle.machine import (
    EDGES,
    MACHINE,
    Actor,
    Edge,
    IllegalTransition,
    Record,
    RowGuard,
    edges_from,
    plan_transition,
)
from coordinator.lifecycle.status import TERMINAL_STATUSES, JobStatus, describe_status

__all__ = [
    "EDGES",
    "MACHINE",
    "TERMINAL_STATUSES",
    "Actor",
    "Edge",
    "IllegalTransition",
    "JobStatus",
    "Record",
    "RowGuard",
    "describe_status",
    "edges_from",
    "plan_transition",
]
