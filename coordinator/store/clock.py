"""The coordinator's notion of "now": naive UTC, millisecond precision.

Every timestamp the coordinator writes comes from here (not from the database server) so that both
backends store the same values and tests can freeze time. Milliseconds match ``DATETIME(3)``, so a
value read back equals the value written. The database server is expected to run in UTC, as CLP's
containers do; its own ``CURRENT_TIMESTAMP`` defaults then agree with these values.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

Clock = Callable[[], datetime]


def utc_now() -> datetime:
    """The current UTC time, naive, truncated to milliseconds."""
    now = datetime.now(UTC).replace(tzinfo=None)
    return now.replace(microsecond=now.microsecond // 1000 * 1000)
