"""One database engine per task process (tasks of a worker share it)."""

from __future__ import annotations

from functools import lru_cache

from sqlalchemy import Engine

from coordinator.store.database import create_database_engine
from coordinator.tasks.context import WorkerSettings


def task_engine(settings: WorkerSettings) -> Engine:
    """The engine for ``settings.database_url``, created once per process and URL."""
    return _engine_for(settings.database_url.get_secret_value())


@lru_cache(maxsize=4)
def _engine_for(url: str) -> Engine:
    return create_database_engine(url, pool_size=2)
