"""Fault injection for tests: make chosen task instances misbehave the ways Spider's can.

A ``Fault`` matches task instances by job and task; the next ``times`` matching instances get it.

=================  ===========================================================================
kind               what the instance does
=================  ===========================================================================
``fail``           raises ``TaskError(message)`` instead of running (an in-task failure)
``hard_timeout``   hangs until the engine kills it at its hard timeout; with ``after_effects``
                   it runs the task first (a commit whose transaction committed, scenario A1)
``crash``          the executor process dies (exit status 70); with ``after_effects`` after
                   the task ran (scenario A2)
``lose_report``    runs normally but its report never reaches the engine: as with an execution
                   manager declared dead, the task is queued again without using a retry (A4)
``duplicate``      a second instance of the same task starts at the same time, whatever the
                   task's ``max_num_instances`` (scenario A6: a commit running twice at once)
``cancelled``      runs normally, but a cancel arrives meanwhile: the job ends ``Cancelled``
                   and the instance's report is rejected (scenario B1: cancelled after the
                   commit took effect)
=================  ===========================================================================
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

FaultKind = Literal["fail", "hard_timeout", "crash", "lose_report", "duplicate", "cancelled"]
CRASH_EXIT_STATUS = 70
EXECUTOR_SIDE = frozenset({"fail", "hard_timeout", "crash"})


@dataclass
class Fault:
    """What to inject, where, and how many times."""

    kind: FaultKind
    task: int | Literal["commit", "cleanup"] | None = None
    """The task index, ``"commit"``, ``"cleanup"``, or ``None`` for any task."""
    job_id: int | None = None
    """Only instances of this Spider job; ``None``: any job."""
    times: int = 1
    after_effects: bool = False
    message: str = "injected failure"

    def matches(self, job_id: int, task_id: str) -> bool:
        """Whether this fault applies to an instance of task ``task_id`` of job ``job_id``."""
        return (
            self.times > 0
            and (self.job_id is None or self.job_id == job_id)
            and (self.task is None or str(self.task) == task_id)
        )

    def for_executor(self) -> dict[str, Any] | None:
        """The directive the executor acts on, or ``None`` for an engine-side fault."""
        if self.kind not in EXECUTOR_SIDE:
            return None
        return {"kind": self.kind, "after_effects": self.after_effects, "message": self.message}
