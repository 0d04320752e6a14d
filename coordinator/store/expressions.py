"""SQL expressions the store's statements share."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import ColumnElement, and_, exists, literal_column

from coordinator.lifecycle import IN_FLIGHT_STATUS_VALUES
from coordinator.store.schema import compression_jobs as _jobs
from coordinator.store.schema import stored_archives as _stored


def in_constants(column: ColumnElement[Any], values: Iterable[int]) -> ColumnElement[bool]:
    """``column IN (v1, v2, …)`` with the integers written into the statement's text.

    For a fixed list (the stored forms of a state): SQLAlchemy renders an ``in_`` of Python
    values as an expanding parameter, whose SQL it rewrites on every execution (about 50 µs of a
    statement's 150 here); written as literals, the compiled statement is used as it is. Only for
    integers, which ``int`` renders exactly: never for values a caller or a row supplies.
    """
    return column.in_([literal_column(str(int(value))) for value in values])


def in_flight_recording(spider_id: ColumnElement[Any]) -> ColumnElement[bool]:
    """The rows of the Running or Committed jobs that record the Spider job ``spider_id``.

    A Spider job id alone is not an identity (CLP's Rust coordinator, an earlier engine or a reset
    Spider may have used it before): a terminal row never owns a Spider job's effects.
    """
    return and_(
        _jobs.c.spider_id == spider_id, in_constants(_jobs.c.status, IN_FLIGHT_STATUS_VALUES)
    )


def unattributed_records(spider_id: ColumnElement[Any]) -> ColumnElement[bool]:
    """Whether the Spider job ``spider_id`` stored archive records that name no job yet."""
    return exists().where(_stored.c.spider_job_id == spider_id, _stored.c.job_id.is_(None))
