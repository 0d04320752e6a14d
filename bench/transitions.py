"""Throughput of guarded transitions: jobs driven Pending -> Running -> Committed -> Succeeded.

Each move is one transaction: compare-and-set, row-count check, history row (and, for the duration
edges, a read of start_time). Prints moves per second for one writer and for several concurrent
writers on distinct jobs.

    .venv/bin/python -m bench.transitions                      # embedded SQLite in a temp dir
    .venv/bin/python -m bench.transitions mysql+pymysql://u:p@127.0.0.1:3306/bench   # existing DB
"""

from __future__ import annotations

import sys
import tempfile
import threading
import time

from coordinator.lifecycle import Actor, JobStatus
from coordinator.store import migrate
from coordinator.store.database import create_database_engine
from coordinator.store.guarded import Applied, TransitionRequest
from coordinator.store.jobs import JobStore

JOBS_PER_WRITER = 300
MOVES = (
    ("submitted", JobStatus.PENDING, JobStatus.RUNNING, Actor.COORDINATOR),
    ("committed", JobStatus.RUNNING, JobStatus.COMMITTED, Actor.COMMIT_TASK),
    ("finalised", JobStatus.COMMITTED, JobStatus.SUCCEEDED, Actor.COORDINATOR),
)


def drive(store: JobStore, job_ids: list[int]) -> None:
    for job_id in job_ids:
        for trigger, source, target, actor in MOVES:
            result = store.transition(
                TransitionRequest(
                    job_id,
                    trigger,
                    source,
                    target,
                    actor,
                    spider_id=job_id,
                    num_tasks=1,
                    uncompressed_size=10,
                    compressed_size=1,
                )
            )
            assert isinstance(result, Applied), result


def measure(store: JobStore, writers: int) -> float:
    jobs = [[store.create_job(b"bench") for _ in range(JOBS_PER_WRITER)] for _ in range(writers)]
    threads = [threading.Thread(target=drive, args=(store, ids)) for ids in jobs]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return writers * JOBS_PER_WRITER * len(MOVES) / (time.perf_counter() - started)


def main() -> None:
    with tempfile.TemporaryDirectory() as directory:
        url = sys.argv[1] if len(sys.argv) > 1 else f"sqlite:///{directory}/bench.db"
        engine = create_database_engine(url, pool_size=8)
        migrate.upgrade(engine)
        store = JobStore(engine)
        print(f"backend: {engine.dialect.name}")
        for writers in (1, 4):
            print(f"{writers} writer(s): {measure(store, writers):8.0f} guarded moves/s")
        engine.dispose()


if __name__ == "__main__":
    main()
