"""Time in tests: no test waits for the wall clock to pass a lease, a retention or a back-off.

* ``MovableClock``: the coordinators' two clocks (monotonic seconds, the database's UTC time)
  running with real time, plus whatever the test adds with ``advance``. Time that must pass (a
  lease to expire, a retention period) is added, not waited for.
* ``wait_until``: waiting for something another thread or process does (a job ending, a task
  reporting), by polling for the event itself. Its deadline is generous: it only stops a test that
  would otherwise hang, and no test relies on it being long or short.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TypeVar

from coordinator.store.clock import utc_now

T = TypeVar("T")

DEFAULT_TIMEOUT_SECS = 60.0


class MovableClock:
    """Real time plus an offset the test moves forward (``Coordinator(clock=clock.monotonic)``,
    ``JobStore(clock=clock.utc)``, ``EmbeddedSpider(clock=clock.monotonic)``)."""

    def __init__(self) -> None:
        self.offset = 0.0

    def monotonic(self) -> float:
        return time.monotonic() + self.offset

    def utc(self) -> datetime:
        """Naive UTC with millisecond precision, as ``coordinator.store.clock.utc_now``."""
        now = utc_now() + timedelta(seconds=self.offset)
        return now.replace(microsecond=now.microsecond // 1000 * 1000)

    def advance(self, seconds: float) -> None:
        self.offset += seconds


def wait_until(
    condition: Callable[[], T],
    timeout: float = DEFAULT_TIMEOUT_SECS,
    *,
    interval: float = 0.02,
    what: str = "condition",
) -> T:
    """Poll ``condition`` until it returns a true value, and return that value.

    Raises ``AssertionError`` naming ``what`` when it is still false after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {timeout:g} s")
        time.sleep(interval)
