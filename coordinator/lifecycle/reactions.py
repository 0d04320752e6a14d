"""What the coordinator does when Spider ends a job: the reactions, as data.

The loop polls each in-flight job until Spider gives its final word, then reads the row and looks
the pair (``Outcome``, the row's state) up in ``REACTIONS``: which edge to take (if any), the
message for ``status_msg``, and whether the move must withdraw the published archives in its own
transaction or may only be taken on evidence of the publication. ``tests/test_reactions.py`` proves
that every (outcome, state) pair matches exactly one reaction and that each names a legal edge;
``docs/lifecycle.md`` and ``coordinator lifecycle`` show the table as generated from here.

Two rules shape it:

* **A Succeeded job is never overwritten**, nor any terminal row another writer left (CLP's legacy
  scheduler kills RUNNING jobs at its start-up: hazard H2, ``docs/hazards.md``): no reaction
  leaves a terminal state. Whatever ended the job, its archives are settled afterwards
  (``coordinator.service.cleanup``).
* **Nothing stays published unless the job succeeds.** Every reaction out of Committed that does
  not finalise rolls back: the archive rows are deleted in the same transaction as the move.
  Finalising itself requires evidence, read in its transaction, that the job's archives are
  published; without it the job is rolled back instead (``UNPUBLISHED``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from coordinator.lifecycle.machine import Edge, Trigger, edge_for
from coordinator.lifecycle.status import TERMINAL_STATUSES, JobStatus


class Outcome(StrEnum):
    """Spider's final word on a job, as the loop concludes it."""

    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    CANCELLED = "Cancelled"
    UNKNOWN = "unknown"
    """Spider no longer knows the job (its storage was reset)."""


@dataclass(frozen=True)
class Reaction:
    """What the loop does for the outcomes ``outcomes`` of a job in one of ``states``."""

    outcomes: frozenset[Outcome]
    states: frozenset[JobStatus]
    trigger: Trigger | None
    """The edge's trigger; ``None``: no move (the row is left as it is)."""
    target: JobStatus | None
    message: str
    """``status_msg`` (or the history's reason): ``{error}`` is Spider's error text (or what is
    missing, or the last error), ``{spider_id}`` the Spider job id, ``{attempts}`` the attempts
    made. For no move, why nothing moves."""
    withdraws: bool = False
    """The move deletes the job's published archive rows in its own transaction (a rollback)."""
    on_evidence: bool = False
    """The move is taken only when the job's archives are found published in its transaction;
    otherwise ``UNPUBLISHED`` is taken instead."""

    def edge(self, source: JobStatus) -> Edge | None:
        """The edge this reaction takes from ``source`` (``None`` for no move)."""
        if self.trigger is None or self.target is None:
            return None
        return edge_for(self.trigger, source, self.target)

    def status_msg(self, **fields: object) -> str:
        """The message with its fields (``spider_id``, ``error``, ``attempts``) filled in."""
        return self.message.format(**fields)


def _reaction(
    outcomes: Iterable[Outcome],
    states: Iterable[JobStatus],
    trigger: Trigger | None,
    target: JobStatus | None,
    message: str,
    *,
    withdraws: bool = False,
    on_evidence: bool = False,
) -> Reaction:
    return Reaction(
        frozenset(outcomes), frozenset(states), trigger, target, message, withdraws, on_evidence
    )


SPIDER_FAILED = "The Spider compression job failed: {error}"
SPIDER_CANCELLED = "The Spider compression job was cancelled."
CANCELLED_BY_FENCE = (
    "Cancelled by an operator: the job was fenced off instead of being cancelled in Spider, whose "
    "task graph has no cleanup task (cancelling it while it commits would shut Spider's storage "
    "down); no commit can publish it now, and Spider's own outcome is left to it."
)
WITHDRAWN = " The published archives were withdrawn."

_RUNNING = (JobStatus.RUNNING,)
_COMMITTED = (JobStatus.COMMITTED,)

REACTIONS: tuple[Reaction, ...] = (
    _reaction(
        (Outcome.SUCCEEDED,),
        _COMMITTED,
        Trigger.FINALISED,
        JobStatus.SUCCEEDED,
        "Spider reports success.",
        on_evidence=True,
    ),
    _reaction(
        (Outcome.SUCCEEDED,),
        _RUNNING,
        Trigger.FAILED,
        JobStatus.FAILED,
        "Spider reports success but the commit did not publish the archives.",
    ),
    _reaction((Outcome.FAILED,), _RUNNING, Trigger.FAILED, JobStatus.FAILED, SPIDER_FAILED),
    _reaction(
        (Outcome.FAILED,),
        _COMMITTED,
        Trigger.ROLLED_BACK,
        JobStatus.FAILED,
        SPIDER_FAILED + WITHDRAWN,
        withdraws=True,
    ),
    _reaction((Outcome.CANCELLED,), _RUNNING, Trigger.KILLED, JobStatus.KILLED, SPIDER_CANCELLED),
    _reaction(
        (Outcome.CANCELLED,),
        _COMMITTED,
        Trigger.ROLLED_BACK,
        JobStatus.KILLED,
        SPIDER_CANCELLED + WITHDRAWN,
        withdraws=True,
    ),
    _reaction(
        (Outcome.UNKNOWN,),
        _RUNNING,
        Trigger.FAILED,
        JobStatus.FAILED,
        "Spider no longer knows job {spider_id} (its storage may have been reset); nothing was "
        "published",
    ),
    _reaction(
        (Outcome.UNKNOWN,),
        _COMMITTED,
        Trigger.FINALISED,
        JobStatus.SUCCEEDED,
        "Spider no longer knows job {spider_id}; the published commit stands.",
        on_evidence=True,
    ),
    _reaction(
        Outcome,
        TERMINAL_STATUSES,
        None,
        None,
        "Another writer ended the job: a terminal row is never overwritten; its archives are "
        "settled.",
    ),
    _reaction(
        Outcome,
        (JobStatus.PENDING,),
        None,
        None,
        "The row no longer records a submission (another writer's): it is left as it is.",
    ),
)

UNPUBLISHED = _reaction(
    (Outcome.SUCCEEDED, Outcome.UNKNOWN),
    _COMMITTED,
    Trigger.ROLLED_BACK,
    JobStatus.FAILED,
    "Spider reports success but the job's archives are not published: {error}. Whatever of them "
    "was still published was withdrawn.",
    withdraws=True,
)
"""Taken instead of an ``on_evidence`` reaction that finds no evidence; ``{error}`` says what is
missing."""

GAVE_UP = "Compression job failed after {attempts} attempt(s): {error}"
"""The message of a job whose attempts ran out (``GIVING_UP``)."""

GIVING_UP: dict[JobStatus, Reaction] = {
    JobStatus.PENDING: _reaction(
        (), (JobStatus.PENDING,), Trigger.REJECTED, JobStatus.FAILED, GAVE_UP
    ),
    JobStatus.RUNNING: _reaction((), _RUNNING, Trigger.FAILED, JobStatus.FAILED, GAVE_UP),
    JobStatus.COMMITTED: _reaction(
        (), _COMMITTED, Trigger.ROLLED_BACK, JobStatus.FAILED, GAVE_UP + WITHDRAWN, withdraws=True
    ),
}
"""How a job whose attempts ran out (an error that would repeat, not an outage) ends, by state: a
Running job's Spider job is cancelled first; a terminal job is left as it is."""


FENCING: dict[JobStatus, Reaction] = {
    JobStatus.RUNNING: _reaction(
        (), _RUNNING, Trigger.FENCED, JobStatus.KILLED, CANCELLED_BY_FENCE
    ),
    JobStatus.COMMITTED: _reaction(
        (),
        _COMMITTED,
        Trigger.ROLLED_BACK,
        JobStatus.KILLED,
        CANCELLED_BY_FENCE + WITHDRAWN,
        withdraws=True,
    ),
}
"""How an operator's cancel ends a started job whose task graph has no cleanup task, by state,
at once (``coordinator.service.cancels``): Spider is not sent CancelJob, which could reach the job
in CommitReady. A Running job is fenced (its row leaves Running, so every commit refuses); a
Committed one is rolled back (its commit has published: the archives are withdrawn). Spider then
finishes the job on its own; its outcome finds the row terminal and leaves it alone."""


class NoReaction(LookupError):
    """``REACTIONS`` has no entry, or several, for a pair (a defect of the table)."""


def reaction_to(outcome: Outcome, state: JobStatus) -> Reaction:
    """The one reaction to ``outcome`` for a job in ``state``; raises ``NoReaction`` otherwise."""
    found = [r for r in REACTIONS if outcome in r.outcomes and state in r.states]
    if len(found) != 1:
        raise NoReaction(f"{len(found)} reactions to Spider {outcome} for a {state.label} job")
    return found[0]
