"""The reactions table: complete, unambiguous, legal, and true to the lifecycle's two rules."""

from __future__ import annotations

import itertools

import pytest

from coordinator.lifecycle import (
    FENCING,
    GIVING_UP,
    PUBLISHED_STATUSES,
    REACTIONS,
    TERMINAL_STATUSES,
    UNPUBLISHED,
    Actor,
    JobStatus,
    Outcome,
    Reaction,
    Trigger,
    reaction_to,
)
from coordinator.lifecycle.reactions import NoReaction
from coordinator.lifecycle.tables import reaction_rows


@pytest.mark.parametrize(("outcome", "state"), list(itertools.product(Outcome, JobStatus)))
def test_every_outcome_and_state_has_exactly_one_reaction(
    outcome: Outcome, state: JobStatus
) -> None:
    matching = [r for r in REACTIONS if outcome in r.outcomes and state in r.states]
    assert len(matching) == 1, (outcome, state, matching)
    assert reaction_to(outcome, state) is matching[0]


def test_a_defective_table_is_reported_not_guessed(monkeypatch: pytest.MonkeyPatch) -> None:
    from coordinator.lifecycle import reactions

    monkeypatch.setattr(reactions, "REACTIONS", (*REACTIONS, REACTIONS[0]))
    with pytest.raises(NoReaction, match="2 reactions to Spider Succeeded for a Committed job"):
        reactions.reaction_to(Outcome.SUCCEEDED, JobStatus.COMMITTED)


def _name(reaction: Reaction) -> str:
    fenced = reaction in FENCING.values()
    outcomes = "+".join(sorted(o.name for o in reaction.outcomes)) or (
        "cancel" if fenced else "attempts"
    )
    return f"{outcomes}:{'+'.join(sorted(s.name for s in reaction.states))}"


ALL_REACTIONS = [*REACTIONS, UNPUBLISHED, *GIVING_UP.values(), *FENCING.values()]


def _moves(reaction: Reaction) -> list[tuple[JobStatus, JobStatus]]:
    return [(state, reaction.target) for state in reaction.states if reaction.target is not None]


@pytest.mark.parametrize("reaction", ALL_REACTIONS, ids=_name)
def test_every_move_is_a_legal_edge_the_coordinator_fires(reaction: Reaction) -> None:
    for state, target in _moves(reaction):
        edge = reaction.edge(state)
        assert edge is not None and edge.dest is target
        assert Actor.COORDINATOR in edge.actors


@pytest.mark.parametrize("reaction", ALL_REACTIONS, ids=_name)
def test_nothing_stays_published_unless_the_job_succeeds(reaction: Reaction) -> None:
    for state, target in _moves(reaction):
        leaves_publication = state in PUBLISHED_STATUSES and target not in PUBLISHED_STATUSES
        assert reaction.withdraws is leaves_publication, (state, target)
        assert reaction.on_evidence is (target is JobStatus.SUCCEEDED)


def test_a_terminal_row_is_never_overwritten() -> None:
    for outcome, state in itertools.product(Outcome, TERMINAL_STATUSES):
        assert reaction_to(outcome, state).trigger is None
    assert set(GIVING_UP) == {s for s in JobStatus if not s.is_terminal}


def test_spider_success_is_final_only_with_a_commit() -> None:
    assert reaction_to(Outcome.SUCCEEDED, JobStatus.COMMITTED).target is JobStatus.SUCCEEDED
    assert reaction_to(Outcome.SUCCEEDED, JobStatus.RUNNING).target is JobStatus.FAILED


def test_an_operators_cancel_without_a_cleanup_task_fences_every_started_state() -> None:
    """CancelJob is never sent to a started job of such a graph, so the cancel ends it itself:
    a Running row by the fence (after which every commit refuses), a Committed one by a rollback.
    """
    assert set(FENCING) == {JobStatus.RUNNING, JobStatus.COMMITTED}
    assert FENCING[JobStatus.RUNNING].trigger is Trigger.FENCED
    assert FENCING[JobStatus.COMMITTED].withdraws
    for state, reaction in FENCING.items():
        assert reaction.target is JobStatus.KILLED and state in reaction.states


def test_the_generated_table_has_a_row_per_reaction() -> None:
    rows = reaction_rows()
    assert len(rows) == len(REACTIONS)
    assert rows[1][:3] == ("Succeeded", "Running", "failed → Failed")
    assert rows[-2][:3] == ("any", "Succeeded / Failed / Killed", "no move")
