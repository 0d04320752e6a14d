"""The ``transitions`` machine built from ``EDGES`` (``coordinator.lifecycle.machine``): its states
the members of ``JobStatus``, its transitions carrying their ``Edge``.

Its own module because ``transitions``' extensions (which ``GraphMachine`` needs for edge labels)
import asyncio and the diagram support: only a move's validation (``edge_for``, at the first move)
and the diagrams import it, so that a command that only needs the edges does not pay for them
(start-up time, issue 14).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import Any, Literal

from transitions import State
from transitions.extensions import GraphMachine
from transitions.extensions.diagrams import TransitionGraphSupport
from transitions.extensions.states import Tags, add_state_features

from coordinator.lifecycle.machine import EDGES, Edge
from coordinator.lifecycle.status import LIFECYCLE_ORDER, JobStatus

TERMINAL_TAG = "terminal"

GraphEngine = Literal["mermaid", "graphviz"]


class LabelledState(State):
    """A state with a display label (``Pending``) beside its enum name (``PENDING``)."""

    def __init__(self, *args: Any, label: str | None = None, **kwargs: Any) -> None:
        self.label = label
        super().__init__(*args, **kwargs)


class EdgeTransition(TransitionGraphSupport):
    """A transition that carries its ``Edge``: one lookup says whether a move is legal and what
    it must record."""

    def __init__(self, *args: Any, edge: Edge, **kwargs: Any) -> None:
        self.edge = edge
        super().__init__(*args, **kwargs)


@add_state_features(Tags, LabelledState)
class LifecycleMachine(GraphMachine):
    """``GraphMachine`` over ``JobStatus``: tagged, labelled states, edge-carrying transitions."""

    transition_cls = EdgeTransition


def build_machine(
    model: object | None = None,
    *,
    graph_engine: GraphEngine = "mermaid",
    edge_labels: Mapping[Edge, str] | None = None,
) -> LifecycleMachine:
    """A ``transitions`` machine for ``EDGES``, its states the members of ``JobStatus``.

    ``GraphMachine`` is used (rather than the plain ``Machine``) because only it carries edge
    labels, which the diagrams need; validation uses it without a model. With ``model``, the
    machine can draw (``model.get_graph()``) using ``graph_engine`` ("mermaid" or "graphviz");
    ``edge_labels`` replaces an edge's default label (its trigger and actors).
    """
    labels = edge_labels or {}
    states = [
        {
            "name": status,
            "label": status.label,
            "final": status.is_terminal,
            "tags": [TERMINAL_TAG] if status.is_terminal else [],
        }
        for status in LIFECYCLE_ORDER
    ]
    transitions = [
        {
            "trigger": str(edge.trigger),
            "source": edge.source,
            "dest": edge.dest,
            "label": labels.get(edge, edge.label),
            "edge": edge,
        }
        for edge in EDGES
    ]
    return LifecycleMachine(
        model=model,
        states=states,
        transitions=transitions,
        initial=JobStatus.PENDING,
        auto_transitions=False,
        graph_engine=graph_engine,
        title="Compression job lifecycle",
        show_state_attributes=True,
    )


@cache
def validating_machine() -> LifecycleMachine:
    """The validating machine (``coordinator.lifecycle.machine.MACHINE``), built once, on first
    use. Model-less: it answers "is this move legal", never "where is job N"."""
    return build_machine()
