"""Throughput of guarded transitions: jobs driven Pending -> Running -> Committed -> Succeeded.

Each move is one transaction: compare-and-set, row-count check, history row (and, for the duration
edges, a read of start_time). Prints moves per second for one writer and for several concurrent
writers on distinct jobs. ``moves_per_second_in_processes`` is P1b's floor in ``bench.suite``: the
same moves from several processes at once, as the coordinator's process and its executors write.

    .venv/bin/python -m bench.transitions                      # embedded SQLite in a temp dir
    .venv/bin/python -m bench.transitions mysql+pymysql://u:p@127.0.0.1:3306/bench   # existing DB
"""

from __future__ import annotations

import multiprocessing
import queue
import sys
import tempfile
import threading
import time
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier

from coordinator.lifecycle import Actor, JobStatus, Trigger
from coordinator.store import migrate
from coordinator.store.database import create_database_engine
from coordinator.store.guarded import Applied, TransitionRequest
from coordinator.store.jobs import JobStore

JOBS_PER_WRITER = 300
MOVES = (
    (Trigger.SUBMITTED, JobStatus.PENDING, JobStatus.RUNNING, Actor.COORDINATOR),
    (Trigger.COMMITTED, JobStatus.RUNNING, JobStatus.COMMITTED, Actor.COMMIT_TASK),
    (Trigger.FINALISED, JobStatus.COMMITTED, JobStatus.SUCCEEDED, Actor.COORDINATOR),
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


def _drive_in_process(
    url: str, jobs: int, barrier: Barrier, spans: Queue[tuple[float, float, int]]
) -> None:
    engine = create_database_engine(url, pool_size=1)
    store = JobStore(engine)
    job_ids = [store.create_job(b"bench") for _ in range(jobs)]
    barrier.wait(timeout=300)  # every process's imports and inserts done: only the moves are timed
    started = time.perf_counter()
    drive(store, job_ids)
    spans.put((started, time.perf_counter(), jobs * len(MOVES)))
    engine.dispose()


FLOOR_TIMEOUT_SECS = 600.0
"""How long ``moves_per_second_in_processes`` waits for its processes' figures."""


def moves_per_second_in_processes(url: str, processes: int, jobs_per_process: int) -> float:
    """Guarded moves per second of ``processes`` processes at once on the (migrated) database at
    ``url``, each driving ``jobs_per_process`` jobs of its own from Pending to Succeeded, from the
    first process's first move to the last one's last (``perf_counter`` is the system's monotonic
    clock, shared by the processes). Raises ``RuntimeError`` when a process fails, or when they
    have not all reported within ``FLOOR_TIMEOUT_SECS`` (a process stuck on the database)."""
    context = multiprocessing.get_context("spawn")  # a fresh interpreter, as an executor is
    barrier = context.Barrier(processes)
    spans: Queue[tuple[float, float, int]] = context.Queue()
    workers = [
        context.Process(target=_drive_in_process, args=(url, jobs_per_process, barrier, spans))
        for _ in range(processes)
    ]
    for worker in workers:
        worker.start()
    results: list[tuple[float, float, int]] = []
    deadline = time.monotonic() + FLOOR_TIMEOUT_SECS
    try:
        while len(results) < processes:
            try:
                results.append(spans.get(timeout=1))
            except queue.Empty:
                failed = [w.exitcode for w in workers if w.exitcode not in (None, 0)]
                if failed:
                    raise RuntimeError(f"a floor process failed (exit codes {failed})") from None
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"the floor's processes did not report within {FLOOR_TIMEOUT_SECS:.0f} s"
                    ) from None
    except BaseException:
        for worker in workers:  # the others would wait at the barrier for the one that failed
            worker.kill()
        raise
    finally:
        for worker in workers:
            worker.join(timeout=60)
    first = min(started for started, _, _ in results)
    last = max(ended for _, ended, _ in results)
    return sum(moves for _, _, moves in results) / (last - first)


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
