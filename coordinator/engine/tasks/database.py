"""One database engine per task process (tasks of a worker share it), its one-statement writes
(``task_writes``), and outages waited out.

A task that meets a database outage waits for the database (``wait_out_outages``) instead of
failing: a failure would use up one of its few retries at once, the retry would fail the same way,
and the whole job would end Failed although nothing was wrong with it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from functools import lru_cache
from typing import TypeVar

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from coordinator.engine.tasks.context import WorkerSettings
from coordinator.store.database import AutocommitWrites, create_database_engine, is_transient
from coordinator.store.outage import Outage, OutageLines

_log = logging.getLogger(__name__)
_T = TypeVar("_T")

FIRST_PAUSE_SECS = 0.5
MAX_PAUSE_SECS = 5.0
_LINES = OutageLines(
    started="%(what)s: the database is unavailable (%(error)s); waiting for it",
    ended="%(what)s: the database is available again after %(seconds).1f s (%(failures)d failed "
    "attempts)",
)
"""One line when an outage starts and one when it ends, per wait (``what`` is ``doing``)."""


def task_engine(settings: WorkerSettings) -> Engine:
    """The engine for ``settings.database_url``, created once per process and URL."""
    return _engine_for(settings.database_url.get_secret_value())


@lru_cache(maxsize=4)
def _engine_for(url: str) -> Engine:
    return create_database_engine(url, pool_size=2)


def task_writes(settings: WorkerSettings) -> AutocommitWrites:
    """The one-statement writes of ``task_engine(settings)`` (the compress task's records),
    created once per process and URL."""
    return _writes_for(settings.database_url.get_secret_value())


@lru_cache(maxsize=4)
def _writes_for(url: str) -> AutocommitWrites:
    return AutocommitWrites(_engine_for(url), pool_size=1)


def wait_out_outages(
    action: Callable[[], _T], *, doing: str, sleep: Callable[[float], None] = time.sleep
) -> _T:
    """``action()``, tried again for as long as the database is unavailable; its result.

    Fails how: before, a compress or commit task that met a database outage (MariaDB stopped or
    killed; connection refused or lost, ``coordinator.store.database.is_transient``) failed at once
    ("cannot look up the job of Spider job 10: … Connection refused"); Spider retried it at once,
    the retry failed alike, and the job ended Failed. Now the task waits, 0.5 s doubling to 5 s
    between attempts, with one line when the outage starts and one when it ends
    (``coordinator.store.outage.Outage``; ``doing`` names the task and the step). Spider's hard
    timeout bounds the wait, as for any task. ``action`` must be safe to repeat after an error, an
    ambiguous commit included. Other errors are raised at once.
    """
    outage = Outage(
        doing, _log, lines=_LINES, first_pause=FIRST_PAUSE_SECS, max_pause=MAX_PAUSE_SECS
    )
    while True:
        try:
            result = action()
        except SQLAlchemyError as error:
            if not is_transient(error):
                raise
            sleep(outage.failed(error))
            continue
        outage.recovered()
        return result
