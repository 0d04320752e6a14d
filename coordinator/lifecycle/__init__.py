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
from coordinator.lifecycle.storage import (
    CLP_STATUS_VALUES,
    DEFAULT_COMMITTED_STORAGE,
    IN_FLIGHT_STATUS_VALUES,
    STORED_FORMS,
    CommittedStorage,
    StoredForm,
    describe_stored,
    state_of,
    stored_status,
)

__all__ = [
    "CLP_STATUS_VALUES",
    "DEFAULT_COMMITTED_STORAGE",
    "EDGES",
    "IN_FLIGHT_STATUS_VALUES",
    "MACHINE",
    "STORED_FORMS",
    "TERMINAL_STATUSES",
    "Actor",
    "CommittedStorage",
    "Edge",
    "IllegalTransition",
    "JobStatus",
    "Record",
    "RowGuard",
    "StoredForm",
    "describe_status",
    "describe_stored",
    "edges_from",
    "plan_transition",
    "state_of",
    "stored_status",
]
