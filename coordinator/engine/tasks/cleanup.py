"""The cleanup task (``clp`` / ``compression::cleanup``): Spider's termination task of a cancel.

The coordinator's graphs carry it so that Spider may cancel a job in every state a started job can
be in (``coordinator.spider.task_graph``): Spider runs it only after CancelJob moved the job to
``CleanupReady``, and its success makes the job ``Cancelled`` (its failure past the retries makes
it ``Failed``). Spider gives it no inputs and no graph outputs.

It deliberately removes nothing. A cancelled job's archives are settled by the coordinator once
the job is terminal (``coordinator.service.cleanup.settle_archives``: a Killed job keeps no
published row and no stored file). Removing them here would race what Spider does not stop: a
commit instance still running when the cancel arrived (``docs/spider.md``, Restarts) can publish
rows for files removed under it, and compress instances keep storing after the cancel; the
coordinator's settling, after the job ended and again in its periodic sweep, sees both.
"""

from __future__ import annotations

from collections.abc import Sequence

from coordinator.engine.tasks.context import TaskContext, TaskError


def cleanup(ctx: TaskContext, inputs: Sequence[bytes]) -> list[bytes]:
    """Acknowledge the cancel of Spider job ``ctx.job_id``; no outputs (see the module)."""
    if inputs:
        raise TaskError(f"the cleanup task takes no inputs, got {len(inputs)}")
    return []
