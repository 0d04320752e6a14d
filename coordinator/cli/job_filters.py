"""``jobs``'s filters, read from the command line (``coordinator.cli.jobs`` applies them): light, so
that building the parser imports no database code.

Lifecycle statuses (``parse_statuses``: case-insensitive, repeatable or comma-separated), a creation
time (``parse_since``: an ISO 8601 date or time, naive meaning UTC, or an age such as ``30m``,
``2h``, ``7d``) and a limit (``parse_limit``: a positive number or ``all``). A mistyped filter
raises ``InvalidFilter``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

from coordinator.errors import CoordinatorError
from coordinator.lifecycle.status import LIFECYCLE_ORDER, JobStatus
from coordinator.store.clock import utc_now

DEFAULT_LIMIT = 100
"""How many jobs ``jobs`` lists without ``--limit``."""

STATUS_NAMES: tuple[str, ...] = tuple(state.label for state in LIFECYCLE_ORDER)
"""The names ``--status`` accepts (in any case), in the lifecycle's order."""

_AGE = re.compile(r"(\d+)\s*([smhdw])", re.IGNORECASE)
_AGE_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


class InvalidFilter(CoordinatorError, ValueError):
    """A ``jobs`` filter that names no status, no time, no valid dataset or no valid limit."""


def parse_statuses(values: Iterable[str]) -> tuple[str, ...]:
    """The lifecycle names in ``values`` (each one name or a comma-separated list, in any case),
    without repeats, in the order given; raises ``InvalidFilter`` naming the valid names."""
    names: list[str] = []
    given = False
    for value in values:
        given = True
        for part in value.split(","):
            word = part.strip()
            if not word:
                continue
            try:
                label = JobStatus.from_label(word).label
            except KeyError:
                raise InvalidFilter(
                    f"unknown status {word!r}: use one of {', '.join(STATUS_NAMES)} "
                    "(any case; repeat --status or separate names with commas)"
                ) from None
            if label not in names:
                names.append(label)
    if given and not names:
        raise InvalidFilter(f"no status given: use one of {', '.join(STATUS_NAMES)}")
    return tuple(names)


def parse_since(text: str, *, now: datetime | None = None) -> datetime:
    """The instant ``text`` names, as naive UTC: an ISO 8601 date (``2024-05-01``: its midnight)
    or date and time (``2024-05-01T12:30``, ``…Z``, ``…+02:00``; without an offset: UTC), or an
    age before ``now`` (default: the clock's now) such as ``90s``, ``30m``, ``2h``, ``7d``,
    ``1w``. Raises ``InvalidFilter``."""
    word = text.strip()
    age = _AGE.fullmatch(word)
    if age is not None:
        amount, unit = int(age.group(1)), age.group(2).lower()
        try:
            return (now or utc_now()) - timedelta(**{_AGE_UNITS[unit]: amount})
        except OverflowError:
            raise InvalidFilter(f"--since {text!r} reaches back before year 1") from None
    try:
        instant = datetime.fromisoformat(word)
    except ValueError:
        raise InvalidFilter(
            f"cannot read --since {text!r}: use an ISO 8601 date or time (2024-05-01, "
            "2024-05-01T12:30, 2024-05-01T12:30+02:00; without an offset: UTC) or an age "
            "(30m, 2h, 7d; units s, m, h, d, w)"
        ) from None
    return naive_utc(instant)


def parse_limit(text: str) -> int | None:
    """``--limit``: a positive number of jobs, or ``all`` (any case) for ``None``, no limit.
    Raises ``InvalidFilter`` (0 too: it would list nothing; ``all`` says what is meant)."""
    word = text.strip()
    if word.lower() == "all":
        return None
    if not word.isdigit() or int(word) < 1:
        raise InvalidFilter(f"invalid --limit {text!r}: use a positive number of jobs, or 'all'")
    return int(word)


def naive_utc(instant: datetime) -> datetime:
    """The stored form of an instant: naive UTC (a naive ``instant`` is UTC already)."""
    if instant.tzinfo is None:
        return instant
    return instant.astimezone(UTC).replace(tzinfo=None)
