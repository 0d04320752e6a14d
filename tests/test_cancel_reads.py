"""The loop's read of the cancel requests of the jobs it drives (``leases.cancel_requests``).

Every ``job_polling_interval_millisecs`` the loop asks which of its jobs (up to 1,000 in flight)
an operator asked to cancel. Sent as a list, the ids cost one primary-key lookup each, and on
MariaDB the read grew with the table (issue 14, P3: 1.1 ms at 2,000 rows, 1.95 ms at 11,000, 2.3
ms at 51,000, for 1,000 ids). Jobs are claimed oldest first, so the ids in flight are usually
dense: their range is read instead, two parameters whatever their number, and the requests of
other jobs in that range are left out. Sparse ids are still sent as a list.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Engine, event

from coordinator.lifecycle import JobStatus
from coordinator.store.jobs import JobStore
from coordinator.store.leases import DENSE_IDS_SPAN, cancel_requests, request_cancel
from tests.paths import new_job_in
from tests.sql_capture import one_line

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)


@contextmanager
def _cancel_reads(engine: Engine) -> Iterator[list[tuple[str, Any]]]:
    """Each read of the cancel requests the block sends: its text on one line, its parameters."""
    reads: list[tuple[str, Any]] = []

    def record(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        if "cancel_requested_at is not null" in one_line(statement):
            reads.append((one_line(statement), parameters))

    event.listen(engine, "before_cursor_execute", record)
    try:
        yield reads
    finally:
        event.remove(engine, "before_cursor_execute", record)


def _jobs(store: JobStore, count: int) -> list[int]:
    return [new_job_in(store, JobStatus.RUNNING) for _ in range(count)]


def _request(store: JobStore, job_ids: list[int]) -> None:
    for job_id in job_ids:
        assert request_cancel(store.engine, job_id, NOW)


def test_dense_ids_are_read_as_one_range_and_others_requests_are_left_out(
    store: JobStore,
) -> None:
    ids = _jobs(store, 40)
    asked = [job_id for position, job_id in enumerate(ids) if position % 4 != 1]  # 30 of 40
    assert max(asked) - min(asked) < DENSE_IDS_SPAN * len(asked)
    not_asked = [ids[1], ids[5]]  # inside the range, requested, not this coordinator's
    _request(store, [asked[0], asked[7], asked[-1], *not_asked])
    with _cancel_reads(store.engine) as reads:
        found = cancel_requests(store.engine, asked)
    assert found == {asked[0], asked[7], asked[-1]}
    [(statement, parameters)] = reads
    assert " between " in statement and " in (" not in statement
    assert len(parameters) == 2  # the range's ends, whatever the number of ids


def test_sparse_ids_are_sent_as_a_list(store: JobStore) -> None:
    ids = _jobs(store, 30)
    asked = [ids[0], ids[14], ids[29]]  # a span of 30 for 3 ids
    assert max(asked) - min(asked) >= DENSE_IDS_SPAN * len(asked)
    _request(store, [ids[14], ids[15]])
    with _cancel_reads(store.engine) as reads:
        found = cancel_requests(store.engine, asked)
    assert found == {ids[14]}
    [(statement, parameters)] = reads
    assert " in (" in statement and " between " not in statement
    assert len(parameters) >= len(asked)


def test_any_set_of_ids_gets_exactly_its_requests(store: JobStore) -> None:
    """Dense or sparse, ids of jobs that do not exist included: the answer is the requests
    among the ids asked about, and only those."""
    ids = _jobs(store, 60)
    requested = set(ids[::3])
    _request(store, sorted(requested))
    randomness = random.Random(14)
    for size in (1, 2, 5, 15, 30, 59):
        for _ in range(4):
            asked = [*randomness.sample(ids, size), max(ids) + 1]  # one id no job has
            assert cancel_requests(store.engine, asked) == requested.intersection(asked)
    assert cancel_requests(store.engine, []) == set()
