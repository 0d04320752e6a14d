"""The job lifecycle, defined once: status numbers, the machine's edges, the reactions to Spider's
outcomes, how each state is stored, and the diagrams and tables generated from them."""

from typing import TYPE_CHECKING, Any

from coordinator.lifecycle.machine import (
    EDGES,
    Actor,
    Edge,
    IllegalTransition,
    Record,
    RowGuard,
    Trigger,
    edge_for,
    edges_from,
    plan_transition,
)
from coordinator.lifecycle.reactions import (
    FENCING,
    GIVING_UP,
    REACTIONS,
    UNPUBLISHED,
    Outcome,
    Reaction,
    reaction_to,
)
from coordinator.lifecycle.status import (
    ENDED_BADLY_STATUSES,
    IN_FLIGHT_STATUSES,
    LIFECYCLE_ORDER,
    PUBLISHED_STATUSES,
    TERMINAL_STATUSES,
    JobStatus,
    describe_status,
)
from coordinator.lifecycle.storage import (
    CLP_STATUS_VALUES,
    DEFAULT_COMMITTED_STORAGE,
    ENDED_BADLY_STATUS_VALUES,
    IN_FLIGHT_STATUS_VALUES,
    STORED_FORMS,
    TERMINAL_STATUS_VALUES,
    CommittedStorage,
    StoredForm,
    describe_stored,
    state_of,
    stored_status,
    stored_values,
)

if TYPE_CHECKING:
    from coordinator.lifecycle.machine import MACHINE


def __getattr__(name: str) -> Any:
    # ``MACHINE`` is built on first use (``coordinator.lifecycle.machine``; issue 14).
    if name == "MACHINE":
        from coordinator.lifecycle import machine  # noqa: PLC0415

        return machine.MACHINE
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CLP_STATUS_VALUES",
    "DEFAULT_COMMITTED_STORAGE",
    "EDGES",
    "ENDED_BADLY_STATUSES",
    "ENDED_BADLY_STATUS_VALUES",
    "FENCING",
    "GIVING_UP",
    "IN_FLIGHT_STATUSES",
    "IN_FLIGHT_STATUS_VALUES",
    "LIFECYCLE_ORDER",
    "MACHINE",
    "PUBLISHED_STATUSES",
    "REACTIONS",
    "STORED_FORMS",
    "TERMINAL_STATUSES",
    "TERMINAL_STATUS_VALUES",
    "UNPUBLISHED",
    "Actor",
    "CommittedStorage",
    "Edge",
    "IllegalTransition",
    "JobStatus",
    "Outcome",
    "Reaction",
    "Record",
    "RowGuard",
    "StoredForm",
    "Trigger",
    "describe_status",
    "describe_stored",
    "edge_for",
    "edges_from",
    "plan_transition",
    "reaction_to",
    "state_of",
    "stored_status",
    "stored_values",
]
