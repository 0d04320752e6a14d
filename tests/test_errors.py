"""One exception root: every public exception class of the package derives from CoordinatorError.

``CoordinatorError`` (``coordinator.errors``) is the root of everything a user or an operator can
cause. Each module of the package is imported and every exception class it defines is checked,
except internal ones (a name starting with ``_``) and those listed in ``EXCLUDED`` with the reason.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import coordinator
from coordinator.errors import CoordinatorError

EXCLUDED = {
    "coordinator.engine.embedded.protocol.ExecutorGone": (
        "the embedded engine's signal that its executor process is gone; the execution manager "
        "catches it and fails or retries the task, it never reaches a user"
    ),
    "coordinator.engine.embedded.protocol.ReplyTimeout": (
        "the embedded engine's signal that an executor did not answer in time; caught by the "
        "execution manager like ExecutorGone"
    ),
    "coordinator.lifecycle.reactions.NoReaction": (
        "a defect of the reactions table (no entry, or several, for a pair), a bug that "
        "tests/test_reactions.py rules out, not something a user or an operator can cause"
    ),
    "coordinator.spider.grpc.generate.GenerationError": (
        "a developer's tool (regenerating the gRPC stubs with protoc), not the coordinator's"
    ),
}
NOT_IMPORTED = {"coordinator.__main__", "coordinator.engine.embedded.__main__"}  # run when imported


def _exception_classes() -> dict[str, type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    modules = pkgutil.walk_packages(coordinator.__path__, prefix="coordinator.")
    for info in modules:
        if info.name in NOT_IMPORTED:
            continue
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if (
                inspect.isclass(value)
                and issubclass(value, BaseException)
                and value.__module__ == module.__name__
                and not name.startswith("_")
            ):
                found[f"{module.__name__}.{name}"] = value
    return found


def test_every_public_exception_class_derives_from_coordinator_error() -> None:
    classes = _exception_classes()
    outside = sorted(
        name
        for name, cls in classes.items()
        if not issubclass(cls, CoordinatorError) and name not in EXCLUDED
    )
    assert outside == [], f"derive these from coordinator.errors.CoordinatorError: {outside}"


def test_the_exclusions_are_real_and_still_outside_the_root() -> None:
    classes = _exception_classes()
    for name in EXCLUDED:
        assert name in classes, f"{name} is excluded but no longer exists"
        assert not issubclass(classes[name], CoordinatorError), f"{name} needs no exclusion"


def test_the_walk_finds_the_known_roots() -> None:
    classes = _exception_classes()
    for name in (
        "coordinator.archive_storage.errors.ArchiveStorageError",
        "coordinator.config.loader.ConfigError",
        "coordinator.engine.tasks.context.TaskError",
        "coordinator.lifecycle.machine.IllegalTransition",
        "coordinator.spider.port.SpiderError",
        "coordinator.store.migrate.SchemaNotCurrent",
    ):
        assert issubclass(classes[name], CoordinatorError), name
