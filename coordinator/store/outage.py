"""A database outage: logged once when it starts, summarised while it lasts, once at its end.

A database that is down for 30 s must not produce a traceback every second, nor a line a retry:
the first failure is one warning with the driver's words, later failures are summarised at
growing intervals (attempts 2, 4, 8, ...) when the caller's lines have a summary, and the recovery
says how long it lasted. The pause before the next attempt doubles from ``first_pause`` up to
``max_pause`` (``backoff``).

Each user keeps its own words (``OutageLines``) and this one state machine: the service loop
(``DATABASE_LINES``, with summaries), the embedded engine (one ``Outage`` its threads share, each
write backing off on its own), ``coordinator.engine.tasks.database.wait_out_outages`` (one a wait)
and the presence heartbeat (``coordinator.store.instances``). Which errors are an outage at all is
``coordinator.store.database.is_transient``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field

from sqlalchemy.exc import DBAPIError

_MAX_DOUBLINGS = 64
"""Past this many doublings every pause is ``max_pause`` (and ``2.0 ** n`` would overflow)."""


def describe_error(error: BaseException) -> str:
    """The driver's own words for a database error (never the URL), else the error's first line."""
    original = error.orig if isinstance(error, DBAPIError) else None
    if original is not None and original.args:
        arguments = original.args
        if len(arguments) >= 2 and isinstance(arguments[0], int):
            return f"{arguments[1]} (error {arguments[0]})"
        return (str(original).strip().splitlines() or [type(original).__name__])[0]
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def backoff(attempt: int, first_pause: float, max_pause: float) -> float:
    """The pause after the ``attempt``-th failure in a row (1, 2, ...): ``first_pause``, doubling
    with every attempt, never more than ``max_pause``."""
    return min(max_pause, first_pause * 2.0 ** min(max(attempt - 1, 0), _MAX_DOUBLINGS))


@dataclass(frozen=True)
class OutageLines:
    """What an outage logs (warnings), as ``%``-format strings over named fields.

    The fields: ``what`` (the ``Outage``'s), ``error`` (``describe_error`` of the failure),
    ``seconds`` (since the outage began), ``failures`` (failed attempts so far), ``pause`` (before
    the next attempt), ``max_pause``, and whatever the caller passes to ``Outage.failed``.
    """

    started: str
    """The first failure."""
    ended: str
    """The first success after a failure."""
    ongoing: str | None = None
    """A summary at failures 2, 4, 8, ...; ``None``: nothing between the start and the end."""


DATABASE_LINES = OutageLines(
    started="%(what)s is unavailable (%(error)s); retrying with back-off",
    ongoing=(
        "%(what)s still unavailable after %(seconds).0f s (%(failures)d failed attempts, "
        "next in %(pause).0f s): %(error)s"
    ),
    ended="%(what)s is available again after %(seconds).0f s (%(failures)d failed attempts)",
)
"""The service loop's lines: ``the database is unavailable (...)``, summaries, the end."""


@dataclass(eq=False)
class Outage:
    """Tracks failures of one dependency (``what``: "the database") and logs them sparingly.

    Safe to share between threads: their failures count together, the outage starts at the first
    of them and ends at the first success. The pause after the n-th failure in a row is
    ``backoff(n, first_pause, max_pause)``.
    """

    what: str
    log: logging.Logger
    _: KW_ONLY
    lines: OutageLines = DATABASE_LINES
    clock: Callable[[], float] = time.monotonic
    first_pause: float = 1.0
    max_pause: float = 30.0
    failures: int = field(default=0, init=False)
    started_at: float = field(default=0.0, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def failed(self, error: BaseException, **fields: object) -> float:
        """Record a failed attempt (``fields``: more for the lines); the pause before the next."""
        with self._lock:
            self.failures += 1
            failures = self.failures
            if failures == 1:
                self.started_at = self.clock()
                line: str | None = self.lines.started
            elif failures & (failures - 1) == 0:  # 2, 4, 8, ...: a summary, not a flood
                line = self.lines.ongoing
            else:
                line = None
            seconds = self.clock() - self.started_at
        pause = backoff(failures, self.first_pause, self.max_pause)
        if line is not None:
            self._log(
                line,
                error=describe_error(error),
                seconds=seconds,
                failures=failures,
                pause=pause,
                **fields,
            )
        return pause

    def recovered(self) -> None:
        """Record a successful attempt; logs the end of an outage, if there was one."""
        if not self.failures:
            return
        with self._lock:
            failures = self.failures
            if not failures:
                return  # another thread ended it meanwhile
            self.failures = 0
            seconds = self.clock() - self.started_at
        self._log(self.lines.ended, seconds=seconds, failures=failures)

    def _log(self, line: str, **fields: object) -> None:
        self.log.warning(line, {"what": self.what, "max_pause": self.max_pause, **fields})
