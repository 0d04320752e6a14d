"""Spider's ``(package, task_func)`` → Python callable.

A task function takes its context and its input payloads (msgpack, in input order) and returns its
output payloads. It signals an operator-facing failure with ``TaskError``; any other exception is a
bug and is reported with its type.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from coordinator.engine.tasks.cleanup import cleanup
from coordinator.engine.tasks.commit import commit
from coordinator.engine.tasks.compress import clp_s_s3_compress
from coordinator.engine.tasks.context import TaskContext

TaskFunction = Callable[[TaskContext, Sequence[bytes]], list[bytes]]

CLP_PACKAGE = "clp"
COMPRESS = "compression::clp_s_s3_compress"
COMMIT = "compression::commit"
CLEANUP = "compression::cleanup"


@dataclass(frozen=True)
class TaskPackage:
    """A named set of task functions (Spider's TDL package)."""

    name: str
    functions: Mapping[str, TaskFunction]

    def function(self, task_func: str) -> TaskFunction:
        """The function named ``task_func``; raises ``KeyError`` naming what exists."""
        try:
            return self.functions[task_func]
        except KeyError:
            known = ", ".join(sorted(self.functions))
            raise KeyError(
                f"package {self.name!r} has no task {task_func!r} (it has: {known})"
            ) from None


def clp_package() -> TaskPackage:
    """CLP's package: compress and commit, and the coordinator's cleanup (not in CLP's)."""
    return TaskPackage(CLP_PACKAGE, {COMPRESS: clp_s_s3_compress, COMMIT: commit, CLEANUP: cleanup})
