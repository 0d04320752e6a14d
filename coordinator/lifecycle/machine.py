"""The compression job lifecycle: the one definition of the state machine.

``EDGES`` below is the whole machine: every edge names its trigger, who may fire it, the row guards
its ``UPDATE`` carries, the columns it must record and why it exists. It is turned into a
``transitions`` machine (``MACHINE``, whose states are ``JobStatus`` itself and whose transitions
carry their ``Edge``; ``coordinator.lifecycle.graph`` builds it on first use) that validates every
requested move; the store builds each guarded ``UPDATE`` from the same edge, and the diagrams in
``diagrams/`` and the tables in ``docs/lifecycle.md`` are generated from it (``coordinator
diagrams``; ``coordinator lifecycle`` prints the tables). The machine never holds a job's state:
the database row does. A request is checked against the definition, then applied by a
compare-and-set on the row.

What the coordinator does for each Spider outcome is data too: ``coordinator.lifecycle.reactions``.

Deliberately absent:

* Running -> Succeeded. CLP's own commit task (``clp-tdl-package``) writes SUCCEEDED directly with a
  compare-and-set on RUNNING. No actor of this coordinator does that; if a deployment still runs the
  upstream commit task, the coordinator observes the terminal row and leaves it alone.
* Running -> Killed by another component. CLP's legacy Celery scheduler kills every RUNNING job on
  its start-up (hazard H2, ``docs/hazards.md``). That write is not ours either; the compare-and-set
  of every edge here sees the foreign terminal status and reports a lost race instead of
  overwriting it.
* Any edge out of Succeeded, Failed or Killed: terminal states are final.
* Self-loops: every edge changes ``status``, so "rows matched" and "rows changed" always agree.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from coordinator.errors import CoordinatorError
from coordinator.lifecycle.status import JobStatus


class Trigger(StrEnum):
    """The name of a move, as the history table records it."""

    SUBMITTED = "submitted"
    REJECTED = "rejected"
    CANCELLED = "cancelled"
    ABANDONED = "abandoned"
    COMMITTED = "committed"
    FAILED = "failed"
    KILLED = "killed"
    FINALISED = "finalised"
    ROLLED_BACK = "rolled_back"
    FENCED = "fenced"


class Actor(StrEnum):
    """Who fires a trigger. Recorded in the transition history."""

    COORDINATOR = "coordinator"
    COMMIT_TASK = "commit_task"
    OPERATOR = "operator"


class RowGuard(StrEnum):
    """A condition the guarded ``UPDATE`` adds to ``id = ? AND status = ?``."""

    SPIDER_ID_UNSET = "spider_id IS NULL"
    """The row has never been submitted: a Spider job id is never overwritten."""

    SPIDER_ID_MATCHES = "spider_id = :spider_id"
    """The request speaks for the Spider job the row records, not an earlier or orphaned one."""


class Record(StrEnum):
    """Columns an edge must write in the same statement as its status change."""

    SUBMISSION = "submission"
    """``spider_id``, ``num_tasks``, ``start_time``."""

    SIZES = "sizes"
    """``uncompressed_size``, ``compressed_size``."""

    DURATION = "duration"
    """``duration`` in seconds since ``start_time`` (CLP's meaning: how long the job ran)."""

    STATUS_MSG = "status_msg"
    """The request's reason, fitted into the 512-character column."""


@dataclass(frozen=True)
class Edge:
    """One legal move of a job, who may make it, and what it must record."""

    trigger: Trigger
    source: JobStatus
    dest: JobStatus
    actors: frozenset[Actor]
    guards: tuple[RowGuard, ...]
    records: frozenset[Record]
    why: str

    @property
    def label(self) -> str:
        """The edge's diagram label: the trigger and who fires it."""
        return f"{self.trigger} ({', '.join(sorted(actor.value for actor in self.actors))})"


def _edge(
    trigger: Trigger,
    source: JobStatus,
    dest: JobStatus,
    actors: Iterable[Actor],
    *,
    why: str,
    guards: tuple[RowGuard, ...] = (),
    records: Iterable[Record] = (),
) -> Edge:
    return Edge(trigger, source, dest, frozenset(actors), guards, frozenset(records), why)


_COORDINATOR = (Actor.COORDINATOR,)
_AFTER_SUBMISSION = (RowGuard.SPIDER_ID_MATCHES,)
_ENDS_BADLY = (Record.STATUS_MSG,)

EDGES: tuple[Edge, ...] = (
    _edge(
        Trigger.SUBMITTED,
        JobStatus.PENDING,
        JobStatus.RUNNING,
        _COORDINATOR,
        guards=(RowGuard.SPIDER_ID_UNSET,),
        records=(Record.SUBMISSION,),
        why=(
            "The task graph is registered with Spider; its job id is recorded with the move, and "
            "only onto a row that records none."
        ),
    ),
    _edge(
        Trigger.REJECTED,
        JobStatus.PENDING,
        JobStatus.FAILED,
        _COORDINATOR,
        guards=(RowGuard.SPIDER_ID_UNSET,),
        records=_ENDS_BADLY,
        why=(
            "The job can never run (a bad config blob, missing objects, an invalid dataset, Spider "
            "refused the graph, or attempts ran out); the message tells the operator what to fix."
        ),
    ),
    _edge(
        Trigger.CANCELLED,
        JobStatus.PENDING,
        JobStatus.KILLED,
        (Actor.COORDINATOR, Actor.OPERATOR),
        guards=(RowGuard.SPIDER_ID_UNSET,),
        records=_ENDS_BADLY,
        why=(
            "Nothing was submitted yet, so nothing runs in Spider for this job; safe for an "
            "operator too (a coordinator that registered meanwhile loses its 'submitted' race)."
        ),
    ),
    _edge(
        Trigger.ABANDONED,
        JobStatus.PENDING,
        JobStatus.FAILED,
        _COORDINATOR,
        guards=(RowGuard.SPIDER_ID_MATCHES,),
        records=_ENDS_BADLY,
        why=(
            "The Pending row already records a Spider job (CLP never leaves one so): it is never "
            "submitted again (the id would be overwritten, and registering anew would lose every "
            "race), so it ends Failed naming that Spider job, guarded by that very id."
        ),
    ),
    _edge(
        Trigger.COMMITTED,
        JobStatus.RUNNING,
        JobStatus.COMMITTED,
        (Actor.COMMIT_TASK,),
        guards=_AFTER_SUBMISSION,
        records=(Record.SIZES, Record.DURATION),
        why="The commit task publishes the archives in the same transaction: the durable decision.",
    ),
    _edge(
        Trigger.FAILED,
        JobStatus.RUNNING,
        JobStatus.FAILED,
        _COORDINATOR,
        guards=_AFTER_SUBMISSION,
        records=(*_ENDS_BADLY, Record.DURATION),
        why="Spider failed (or no longer knows) the job before any commit took effect.",
    ),
    _edge(
        Trigger.KILLED,
        JobStatus.RUNNING,
        JobStatus.KILLED,
        _COORDINATOR,
        guards=_AFTER_SUBMISSION,
        records=(*_ENDS_BADLY, Record.DURATION),
        why="Spider cancelled the job before any commit took effect.",
    ),
    _edge(
        Trigger.FENCED,
        JobStatus.RUNNING,
        JobStatus.KILLED,
        _COORDINATOR,
        guards=_AFTER_SUBMISSION,
        records=(*_ENDS_BADLY, Record.DURATION),
        why=(
            "An operator's cancel of a started job whose graph has no cleanup task (CLP's own "
            "task package): Spider cannot be asked (CancelJob in CommitReady shuts its storage "
            "down), so the row leaves Running instead. Every commit then refuses (CLP's "
            "compression::commit selects the row FOR UPDATE and requires RUNNING; this "
            "coordinator's requires Running too): nothing can be published, and Spider's later "
            "outcome leaves the row as it is. A commit that won the race leaves the job Succeeded."
        ),
    ),
    _edge(
        Trigger.FINALISED,
        JobStatus.COMMITTED,
        JobStatus.SUCCEEDED,
        _COORDINATOR,
        guards=_AFTER_SUBMISSION,
        why="Spider reports Succeeded, so the published commit stands.",
    ),
    _edge(
        Trigger.ROLLED_BACK,
        JobStatus.COMMITTED,
        JobStatus.FAILED,
        _COORDINATOR,
        guards=_AFTER_SUBMISSION,
        records=_ENDS_BADLY,
        why=(
            "Spider failed the job although the commit took effect (a lost success report, a hard "
            "timeout after the commit); the published archives are withdrawn in the same "
            "transaction."
        ),
    ),
    _edge(
        Trigger.ROLLED_BACK,
        JobStatus.COMMITTED,
        JobStatus.KILLED,
        _COORDINATOR,
        guards=_AFTER_SUBMISSION,
        records=_ENDS_BADLY,
        why=(
            "Spider cancelled the job after the commit took effect, or an operator cancelled it "
            "then and its graph has no cleanup task; its archives are withdrawn in the same "
            "transaction."
        ),
    ),
)

if TYPE_CHECKING:
    from coordinator.lifecycle.graph import LifecycleMachine

    MACHINE: LifecycleMachine
    """The validating machine. Model-less: it answers "is this move legal", never "where is job
    N". Built on first use (``coordinator.lifecycle.graph.validating_machine``)."""


def __getattr__(name: str) -> Any:
    # ``MACHINE`` is built on first use: ``transitions``' extensions cost start-up time that a
    # command needing only the edges should not pay (issue 14).
    if name == "MACHINE":
        from coordinator.lifecycle.graph import validating_machine  # noqa: PLC0415

        return validating_machine()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class IllegalTransition(CoordinatorError, ValueError):
    """A requested move that the lifecycle does not allow; raised before any SQL runs."""

    def __init__(self, message: str, *, trigger: str, source: JobStatus, dest: JobStatus) -> None:
        super().__init__(message)
        self.trigger = trigger
        self.source = source
        self.dest = dest


def plan_transition(trigger: str, source: JobStatus, dest: JobStatus, actor: Actor) -> Edge:
    """The edge for moving a job from ``source`` to ``dest`` by ``trigger``, fired by ``actor``.

    One lookup in ``MACHINE`` answers both questions: is the move legal, and which ``Edge`` (what
    it must guard and record). Fails with ``IllegalTransition`` when ``MACHINE`` has no such move
    (which includes every move out of a terminal state) or when ``actor`` may not fire it.
    """
    edge = edge_for(trigger, source, dest)
    if actor not in edge.actors:
        allowed = ", ".join(sorted(a.value for a in edge.actors))
        raise IllegalTransition(
            f"'{trigger}' ({source.label} -> {dest.label}) may be fired by {allowed}, "
            f"not by {actor.value}",
            trigger=trigger,
            source=source,
            dest=dest,
        )
    return edge


def edges_from(source: JobStatus) -> tuple[Edge, ...]:
    """Every edge leaving ``source`` (none for a terminal status)."""
    return tuple(edge for edge in EDGES if edge.source == source)


def edge_for(trigger: str, source: JobStatus, dest: JobStatus) -> Edge:
    """The edge ``trigger`` takes from ``source`` to ``dest``; raises ``IllegalTransition``."""
    from coordinator.lifecycle.graph import EdgeTransition, validating_machine  # noqa: PLC0415

    found = validating_machine().get_transitions(trigger=str(trigger), source=source, dest=dest)
    if not found:
        raise IllegalTransition(
            _explain_missing_move(trigger, source, dest), trigger=trigger, source=source, dest=dest
        )
    transition = found[0]
    assert isinstance(transition, EdgeTransition)
    return transition.edge


def _explain_missing_move(trigger: str, source: JobStatus, dest: JobStatus) -> str:
    if source.is_terminal:
        return (
            f"a {source.label} job is final: nothing moves it "
            f"(requested '{trigger}' to {dest.label})"
        )
    legal = ", ".join(f"'{e.trigger}' to {e.dest.label}" for e in edges_from(source))
    return (
        f"'{trigger}' cannot move a job from {source.label} to {dest.label}; "
        f"from {source.label} the lifecycle allows {legal}"
    )
