"""An outage, logged once when it starts, summarised with back-off while it lasts, and at its end.

A database that is down for 30 s must not produce a traceback every second: the first failure is
one warning line with the driver's words, later failures are summarised at growing intervals
(attempts 2, 4, 8, ... ), and the recovery says how long it lasted. The pause before the next
attempt doubles from ``first_pause`` up to ``max_pause``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from sqlalchemy.exc import DBAPIError


def describe_error(error: BaseException) -> str:
    """The driver's own words for a database error (never the URL), else the error's first line."""
    original = error.orig if isinstance(error, DBAPIError) else None
    if original is not None and original.args:
        arguments = original.args
        if len(arguments) >= 2 and isinstance(arguments[0], int):
            return f"{arguments[1]} (error {arguments[0]})"
        return (str(original).strip().splitlines() or [type(original).__name__])[0]
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


class Outage:
    """Tracks failures of one dependency (``what``: "the database") and logs them sparingly."""

    def __init__(
        self,
        what: str,
        log: logging.Logger,
        *,
        clock: Callable[[], float] = time.monotonic,
        first_pause: float = 1.0,
        max_pause: float = 30.0,
    ) -> None:
        self.what = what
        self.log = log
        self.clock = clock
        self.first_pause = first_pause
        self.max_pause = max_pause
        self.failures = 0
        self.started_at = 0.0

    def failed(self, error: BaseException) -> float:
        """Record a failed attempt; the pause before the next one."""
        self.failures += 1
        pause = min(self.max_pause, self.first_pause * 2.0 ** (self.failures - 1))
        if self.failures == 1:
            self.started_at = self.clock()
            self.log.warning(
                "%s is unavailable (%s); retrying with back-off", self.what, describe_error(error)
            )
        elif self.failures & (self.failures - 1) == 0:  # 2, 4, 8, ...: a summary, not a flood
            self.log.warning(
                "%s still unavailable after %.0f s (%d failed attempts, next in %.0f s): %s",
                self.what,
                self.clock() - self.started_at,
                self.failures,
                pause,
                describe_error(error),
            )
        return pause

    def recovered(self) -> None:
        """Record a successful attempt; logs the end of an outage, if there was one."""
        if self.failures:
            self.log.warning(
                "%s is available again after %.0f s (%d failed attempts)",
                self.what,
                self.clock() - self.started_at,
                self.failures,
            )
        self.failures = 0
