"""The machine definition: every legal move, every illegal one, and the status numbers."""

from __future__ import annotations

import itertools

import pytest

from coordinator.lifecycle import (
    EDGES,
    MACHINE,
    TERMINAL_STATUSES,
    Actor,
    IllegalTransition,
    JobStatus,
    edges_from,
    machine,
    plan_transition,
)
from coordinator.lifecycle.footings import ABSENCES, Footing, footing_rows, occurrence

TRIGGERS = sorted({edge.trigger for edge in EDGES} | {"succeeded", "resumed"})
LEGAL = {(e.trigger, e.source, e.dest, actor): e for e in EDGES for actor in e.actors}


def test_status_numbers_are_clps_plus_committed() -> None:
    assert [(s.name, int(s)) for s in JobStatus] == [
        ("PENDING", 0),
        ("RUNNING", 1),
        ("SUCCEEDED", 2),
        ("FAILED", 3),
        ("KILLED", 4),
        ("COMMITTED", 5),
    ]
    assert {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.KILLED} == TERMINAL_STATUSES


def test_the_required_edges_exist_with_their_actors() -> None:
    moves = {(e.trigger, e.source.label, e.dest.label): e.actors for e in EDGES}
    assert moves == {
        ("submitted", "Pending", "Running"): {Actor.COORDINATOR},
        ("rejected", "Pending", "Failed"): {Actor.COORDINATOR},
        ("cancelled", "Pending", "Killed"): {Actor.COORDINATOR, Actor.OPERATOR},
        ("abandoned", "Pending", "Failed"): {Actor.COORDINATOR},
        ("committed", "Running", "Committed"): {Actor.COMMIT_TASK},
        ("failed", "Running", "Failed"): {Actor.COORDINATOR},
        ("killed", "Running", "Killed"): {Actor.COORDINATOR},
        ("finalised", "Committed", "Succeeded"): {Actor.COORDINATOR},
        ("rolled_back", "Committed", "Failed"): {Actor.COORDINATOR},
        ("rolled_back", "Committed", "Killed"): {Actor.COORDINATOR},
        ("fenced", "Running", "Killed"): {Actor.COORDINATOR},
    }


@pytest.mark.parametrize(("trigger", "source", "dest", "actor"), sorted(LEGAL, key=str))
def test_every_legal_move_is_planned(
    trigger: str, source: JobStatus, dest: JobStatus, actor: Actor
) -> None:
    assert plan_transition(trigger, source, dest, actor) is LEGAL[(trigger, source, dest, actor)]


def test_every_other_move_is_refused() -> None:
    refused = 0
    for move in itertools.product(TRIGGERS, JobStatus, JobStatus, Actor):
        if move in LEGAL:
            continue
        with pytest.raises(IllegalTransition):
            plan_transition(*move)
        refused += 1
    assert refused == len(TRIGGERS) * len(JobStatus) ** 2 * len(Actor) - len(LEGAL)


@pytest.mark.parametrize("terminal", sorted(TERMINAL_STATUSES))
def test_nothing_leaves_a_terminal_state(terminal: JobStatus) -> None:
    assert edges_from(terminal) == ()
    assert MACHINE.get_triggers(terminal) == []
    with pytest.raises(IllegalTransition, match="final"):
        plan_transition("submitted", terminal, JobStatus.RUNNING, Actor.COORDINATOR)


def test_refusals_say_why() -> None:
    with pytest.raises(IllegalTransition, match="may be fired by commit_task, not by coordinator"):
        plan_transition("committed", JobStatus.RUNNING, JobStatus.COMMITTED, Actor.COORDINATOR)
    with pytest.raises(IllegalTransition, match="from Running the lifecycle allows 'committed'"):
        plan_transition("finalised", JobStatus.RUNNING, JobStatus.SUCCEEDED, Actor.COORDINATOR)


def test_the_transitions_machine_holds_exactly_the_edges() -> None:
    # transitions is given the status enum itself: its states are JobStatus's members.
    assert set(MACHINE.states) == {status.name for status in JobStatus}
    assert {MACHINE.get_state(status).label for status in JobStatus} == {
        status.label for status in JobStatus
    }
    in_machine = {
        (name, transition.source, transition.dest, transition.edge)
        for name, event in MACHINE.events.items()
        for transitions in event.transitions.values()
        for transition in transitions
    }
    assert in_machine == {(e.trigger, e.source.name, e.dest.name, e) for e in EDGES}
    assert {s for s in MACHINE.states if MACHINE.get_state(s).final} == {
        status.name for status in TERMINAL_STATUSES
    }


def test_one_lookup_gives_the_edge_with_what_it_must_record() -> None:
    for edge in EDGES:
        assert plan_transition(edge.trigger, edge.source, edge.dest, min(edge.actors)) is edge


def test_every_edge_is_justified_and_the_absent_ones_are_explained() -> None:
    doc = machine.__doc__ or ""
    for edge in EDGES:
        assert len(edge.why) > 40, edge  # the why is the edge's documentation (docs/lifecycle.md)
    assert "Running -> Succeeded" in doc  # the deliberately absent legacy edge is explained


def test_every_edge_a_footing_lacks_is_an_edge_of_the_machine() -> None:
    """``coordinator.lifecycle.footings`` names edges by trigger and states: a renamed or removed
    edge must not leave a stale absence behind (docs/lifecycle.md is generated from both)."""
    defined = {(edge.trigger, edge.source, edge.dest) for edge in EDGES}
    for absence in ABSENCES:
        assert absence.edges <= defined, absence.footing
    # CLP's commit writes SUCCEEDED itself: nothing enters or leaves Committed there.
    clp = [edge for edge in EDGES if occurrence(edge, Footing.CLP) == "yes"]
    assert all(JobStatus.COMMITTED not in (edge.source, edge.dest) for edge in clp)
    assert [row[:2] for row in footing_rows() if row[2] != "yes"] == [
        ("fenced", "Running → Killed")
    ]
