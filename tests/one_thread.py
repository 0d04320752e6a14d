"""A coordinator that does all of a tick's work on the calling thread (the stateful models).

A tick polls the jobs in flight on a pool of ``ADVANCE_CONCURRENCY`` threads beside its
submissions, and the sweep starts the archive reconciliation on a thread of its own. The models
inject a database outage at the Nth statement of a tick, and hypothesis replays each program
while it generates and shrinks: with threads, which statement is the Nth changes from one run of
the same program to the next, so a replay could take another path and hypothesis stops with
``FlakyStrategyDefinition`` (about once in 3,000 engine-model programs). On one thread, the order
is the code's own: the polls (in the order they are due), then the submissions; the
reconciliation where the sweep starts it. Production runs them concurrently, which allows that
order among others; the models check the outcomes, not the interleavings.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future
from types import SimpleNamespace
from typing import Any, TypeVar
from unittest import mock

from coordinator.service import outcomes
from coordinator.service.coordinator import Coordinator

T = TypeVar("T")


class InlineExecutor(Executor):
    """Runs each submitted call at once, on the caller's thread."""

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        future: Future[T] = Future()
        try:
            result = fn(*args, **kwargs)
        except BaseException as error:
            future.set_exception(error)
        else:
            future.set_result(result)
        return future


class InlineThread:
    """What ``coordinator.service.outcomes`` uses of ``threading.Thread`` (its constructor,
    ``start`` and ``is_alive``); ``start`` runs the target to its end."""

    def __init__(
        self,
        target: Callable[..., object],
        args: tuple[object, ...] = (),
        kwargs: dict[str, object] | None = None,
        name: str | None = None,
        daemon: bool | None = None,
    ) -> None:
        self._run = lambda: target(*args, **(kwargs or {}))

    def start(self) -> None:
        self._run()

    def is_alive(self) -> bool:
        return False


def on_one_thread(coordinator: Coordinator) -> Coordinator:
    """``coordinator``'s polls run on the thread of its tick."""
    coordinator._advancing = InlineExecutor()
    return coordinator


@contextlib.contextmanager
def reconciliation_on_one_thread() -> Iterator[None]:
    """Every coordinator's archive reconciliation runs where its sweep starts it."""
    with mock.patch.object(outcomes, "threading", SimpleNamespace(Thread=InlineThread)):
        yield
