"""Which of the lifecycle's edges can occur on each footing, and why the others cannot.

The machine (``coordinator.lifecycle.machine.EDGES``) is one for every footing, but what runs the
tasks decides which edges a job can take:

* the **embedded engine** runs this coordinator's task package, whose graphs carry the cleanup
  task (``coordinator.cleanup_task`` unset), so Spider itself cancels a started job;
* a **Spider cluster running this coordinator's package** (``coordinator spider serve``): its
  commit stops at Committed as the embedded engine's does; without ``coordinator.cleanup_task:
  true`` (the default on a cluster) its graphs carry no cleanup task and a cancel fences;
* a **Spider cluster running CLP's own package** (``clp-tdl-package``): CLP's
  ``compression::commit`` (``commit.rs``, ``commit`` and ``mark_job_succeeded``) publishes and
  writes SUCCEEDED in one transaction, a foreign writer's move from Running straight to Succeeded
  that the machine deliberately lacks. So no job is ever Committed there, the edges into and out
  of Committed never occur, and a Succeeded row is left as CLP's commit wrote it (the reactions
  never overwrite a terminal row). Its graphs have no cleanup task: an operator's cancel fences.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from coordinator.lifecycle.machine import EDGES, Edge, Trigger
from coordinator.lifecycle.status import JobStatus


class Footing(StrEnum):
    """What runs the tasks: the engine and its task package."""

    EMBEDDED = "embedded engine"
    SERVED = "Spider cluster, this coordinator's package"
    CLP = "Spider cluster, CLP's package"


@dataclass(frozen=True)
class Absence:
    """Edges that cannot occur on a footing, and why."""

    footing: Footing
    edges: frozenset[tuple[Trigger, JobStatus, JobStatus]]
    why: str
    unless: str | None = None
    """The setting under which the edges do occur there after all."""


ABSENCES: tuple[Absence, ...] = (
    Absence(
        Footing.EMBEDDED,
        frozenset({(Trigger.FENCED, JobStatus.RUNNING, JobStatus.KILLED)}),
        "its graphs carry the cleanup task unless `coordinator.cleanup_task: false`, so an "
        "operator's cancel goes through Spider (CancelJob, then Cancelled ends the job) and "
        "nothing is fenced",
        unless="`cleanup_task: false`",
    ),
    Absence(
        Footing.CLP,
        frozenset(
            {
                (Trigger.COMMITTED, JobStatus.RUNNING, JobStatus.COMMITTED),
                (Trigger.FINALISED, JobStatus.COMMITTED, JobStatus.SUCCEEDED),
                (Trigger.ROLLED_BACK, JobStatus.COMMITTED, JobStatus.FAILED),
                (Trigger.ROLLED_BACK, JobStatus.COMMITTED, JobStatus.KILLED),
            }
        ),
        "CLP's commit writes SUCCEEDED itself with its archives, so no job is ever Committed; "
        "once it has, the job is Succeeded for good and nothing it published is withdrawn",
    ),
)


def occurrence(edge: Edge, footing: Footing) -> str:
    """Whether ``edge`` occurs on ``footing``: ``yes``, ``no``, or ``only with`` a setting."""
    key = (edge.trigger, edge.source, edge.dest)
    for absence in ABSENCES:
        if absence.footing is footing and key in absence.edges:
            return "no" if absence.unless is None else f"only with {absence.unless}"
    return "yes"


def footing_rows() -> list[tuple[str, ...]]:
    """One row per edge: trigger, from → to, and whether it occurs on each footing."""
    return [
        (
            str(edge.trigger),
            f"{edge.source.label} → {edge.dest.label}",
            *(occurrence(edge, footing) for footing in Footing),
        )
        for edge in EDGES
    ]


FOOTING_HEADERS = ("trigger", "move", *(footing.value for footing in Footing))
