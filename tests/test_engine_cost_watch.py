"""The embedded engine's watch thread, now that a tick looks only at running instances
(``_duplicate_overdue``) and at the terminal jobs due for eviction (``_evict_terminated``) instead
of every task of every job in memory."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Engine

from coordinator.spider.port import JobState, start_if_ready
from tests.engine_support import graph, policy, running_engine, submit, task, wait_for
from tests.engine_support import wait_for_journal as journal_entries
from tests.engine_tasks import release
from tests.timing import MovableClock, wait_until

pytestmark = pytest.mark.slow  # real executors

PASSWORD = b"compression-coordinator"
DONE = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


def test_an_overdue_instance_gets_one_duplicate_among_retained_jobs_and_evicted_ones(
    migrated_engine: Engine, tmp_path: Path
) -> None:
    clock = MovableClock()
    held = graph(task("wait_for_release", execution=policy(soft_ms=1_000, instances=2)))
    with running_engine(
        migrated_engine, tmp_path, workers=2, retention=30.0, clock=clock.monotonic
    ) as spider:
        group = spider.add_resource_group("rg", PASSWORD)
        finished = []
        for n in range(10):
            job_id = submit(spider, group, graph(task("echo")), [bytes([n])])
            assert start_if_ready(spider, job_id) is JobState.RUNNING
            finished.append(job_id)
        for job_id in finished:
            assert wait_for(spider, job_id, *DONE) is JobState.SUCCEEDED
        running = submit(spider, group, held, [b"a"])
        assert start_if_ready(spider, running) is JobState.RUNNING
        journal_entries(tmp_path, running, "start")

        clock.advance(2.0)  # past the soft deadline, not the retention
        starts = journal_entries(tmp_path, running, "start", 2)
        assert len({entry["instance"] for entry in starts}) == 2
        assert all(job_id in spider._jobs for job_id in finished)

        clock.advance(60.0)  # past the retention: the ended jobs leave memory, the held one stays
        wait_until(lambda: not any(job_id in spider._jobs for job_id in finished))
        assert running in spider._jobs
        assert spider.get_job_state(finished[0]) is JobState.SUCCEEDED  # from its row

        release(tmp_path, running)
        assert wait_for(spider, running, *DONE) is JobState.SUCCEEDED
        wait_until(lambda: not spider._running)  # the ended instances are forgotten
    assert len(journal_entries(tmp_path, running, "start", 2)) == 2  # one duplicate only
