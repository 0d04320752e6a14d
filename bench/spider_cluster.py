"""The ``spider-cluster`` case: this coordinator against CLP's Rust ``compression-coordinator``.

Both drive the same Pending jobs (``bench.cluster.varied_jobs``: 1-3 objects each) on a real Spider
cluster (``../shared/spider-cluster``: storage, scheduler, one execution manager running CLP's
real commit task and a stand-in compress task that returns at once), so the figures measure
orchestration only. The runs alternate, Rust then this coordinator for each size, each run on a
cluster of its own with fresh Spider and CLP databases on the ``--database`` server.

One run:

1. start the cluster, create CLP's tables (``coordinator db upgrade``), start the coordinator and
   let it settle (``SETTLE_SECS``: start-up is excluded from every figure);
2. in the first size only, the **idle window**: the coordinator's CPU (utime + stime of its
   process tree, ``/proc``) over ``Sizes.cluster_idle_secs`` with nothing to do, and its RSS at
   the end;
3. insert every job in **one transaction** (log-ingestor's rows: ingestion job, objects,
   compression job), its ``creation_time`` set to the transaction's last statement, so that all
   jobs appear at the same instant, with the coordinator running and idle;
4. wait until every job is SUCCEEDED (or ended otherwise, which makes the run not valid).

Figures, all from the database's clock:

* **commit time** of a job = ``start_time + duration``: CLP's commit task
  (``clp-tdl-package/src/task/compression/commit.rs``) sets SUCCEEDED and ``duration`` =
  ``TIMESTAMPDIFF(start_time, CURRENT_TIMESTAMP(3))`` in the transaction that publishes the
  archives, whichever coordinator wrote ``start_time``;
* **drain time** = last commit − the insert's commit (so it includes each coordinator's delay to
  notice the jobs: one ``job_polling_interval_millisecs`` at most for both, 200 ms);
* **latency** per job = commit − ``creation_time`` (p50 and p95);
* **CPU per job** = the coordinator's process-tree CPU from just before the insert to the last
  commit, over all sizes, per job;
* **peak RSS** = the coordinator's ``VmHWM`` at the end of the run (start-up included), the
  largest over the sizes.

With ``--cluster-own-cpu 1`` each coordinator runs on a CPU of its own and every other process
(Spider, MariaDB, the bench) on the others (``own_cpu``), as when the coordinator runs on a host
or in a container of its own; the rows say so.

Each row's ratio is this coordinator's figure over Rust's; ``python -m bench --rounds N`` judges
each goal on the median of N rounds.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

from sqlalchemy import Engine, text

from bench.cluster import (
    BUCKET,
    PREFIX,
    JobSpec,
    SpiderCluster,
    cluster_problem,
    job_blob,
    running_cluster,
    varied_jobs,
)
from bench.suite import Goal, Row, Sizes, process_tree_cpu, stop
from coordinator.lifecycle import JobStatus
from coordinator.store.ingestion import (
    S3ScannerJob,
    create_ingestion_job,
    ensure_scanner_state_table,
    register_objects,
    submit_compression_job,
)

CASE = "spider-cluster"
SETTLE_SECS = 3.0
"""From a coordinator's start to the idle window or the insert: this one's start-up (imports,
migrations check, resource group) takes 1-2 s on this machine; Rust's a few milliseconds."""
POLL_SECS = 0.05
"""How often the bench reads the jobs' statuses while they drain (figures come from the rows'
own timestamps, not from these reads)."""

DRAIN_GOAL = Goal("≤ 1.0x", 1.0, shown="{:.2f}x")
LATENCY_GOAL = Goal("≤ 1.0x", 1.0, shown="{:.2f}x")
CPU_GOAL = Goal("≤ 2.5x", 2.5, shown="{:.2f}x")
PEAK_RSS_GOAL = Goal("≤ 64 MB", 64, shown="{:.0f} MB")
IDLE_CPU_GOAL = Goal("≤ 2.0x", 2.0, shown="{:.2f}x")

CLOCK_TICK = 1 / os.sysconf("SC_CLK_TCK")
"""``/proc``'s CPU resolution: an idle CPU below one tick is counted as one (a ratio's floor)."""


@dataclass
class Run:
    """One coordinator's run of one size."""

    who: str
    jobs: int
    slots: int
    drain_secs: float = float("nan")
    latencies: list[float] = field(default_factory=list)
    cpu_secs: float = float("nan")
    peak_rss_mb: float = float("nan")
    idle_rss_mb: float | None = None
    idle_cpu_secs: float | None = None
    succeeded: int = 0

    @property
    def valid(self) -> bool:
        return self.succeeded == self.jobs

    def latency(self, fraction: float) -> float:
        ordered = sorted(self.latencies)
        if not ordered:
            return float("nan")
        return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def proc_status_mb(pid: int, key: str) -> float:
    """``key`` (``VmHWM``, ``VmRSS``) of ``/proc/PID/status``, in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def insert_at_once(engine: Engine, jobs: Sequence[JobSpec]) -> datetime:
    """Insert ``jobs`` as log-ingestor does, all in one transaction, each job's ``creation_time``
    the moment of the transaction's last statement; that moment (the database's clock)."""
    ensure_scanner_state_table(engine)
    with engine.begin() as connection:
        first = None
        for job in jobs:
            objects = [(BUCKET, key, 1000 + index) for index, key in enumerate(job.keys)]
            scanner = S3ScannerJob(bucket=BUCKET, key_prefix=PREFIX, dataset=job.dataset)
            ingestion_job_id = create_ingestion_job(connection, scanner)
            ids = register_objects(connection, ingestion_job_id, objects)
            job_id = submit_compression_job(connection, job_blob(job, ingestion_job_id, ids), ids)
            first = job_id if first is None else first
        now: datetime = connection.execute(text("SELECT CURRENT_TIMESTAMP(3)")).scalar_one()
        connection.execute(
            text("UPDATE compression_jobs SET creation_time = :now WHERE id >= :first"),
            {"now": now, "first": first},
        )
    return now


def wait_drained(
    engine: Engine, jobs: int, process: subprocess.Popen[bytes], timeout: float
) -> None:
    """Until every job is terminal, the coordinator exits, or ``timeout`` passes."""
    terminal = tuple(int(status) for status in JobStatus if status.is_terminal)
    deadline = time.monotonic() + timeout
    query = text(
        "SELECT COUNT(*) FROM compression_jobs WHERE status IN ("
        + ", ".join(str(status) for status in terminal)
        + ")"
    )
    while time.monotonic() < deadline and process.poll() is None:
        with engine.connect() as connection:
            if connection.execute(query).scalar_one() >= jobs:
                return
        time.sleep(POLL_SECS)


def measure(
    server: str,
    who: str,
    jobs: Sequence[JobSpec],
    slots: int,
    idle_secs: float,
    *,
    own_cpu: bool = False,
) -> Run:
    """One run of ``who`` (``rust`` or ``ours``) on a fresh cluster; see the module docstring."""
    run = Run(who, len(jobs), slots)
    with (
        tempfile.TemporaryDirectory(prefix="bench-cluster-") as directory,
        running_cluster(Path(directory), server) as cluster,
    ):
        ours = cluster.coordinator_config(cluster.directory / "clp.yaml", max_concurrent_jobs=slots)
        cluster.upgrade_schema(ours)
        process = start(cluster, who, ours, slots)
        engine = cluster.clp_engine()
        undo_pinning = own_cpu_for(process.pid) if own_cpu else None
        try:
            time.sleep(SETTLE_SECS)
            if idle_secs > 0:
                before = process_tree_cpu(process.pid)
                time.sleep(idle_secs)
                run.idle_cpu_secs = process_tree_cpu(process.pid) - before
                run.idle_rss_mb = proc_status_mb(process.pid, "VmRSS")
            before = process_tree_cpu(process.pid)
            inserted = insert_at_once(engine, jobs)
            wait_drained(engine, len(jobs), process, timeout=60 + len(jobs) * 0.5)
            run.cpu_secs = process_tree_cpu(process.pid) - before
            run.peak_rss_mb = proc_status_mb(process.pid, "VmHWM")
            with engine.connect() as connection:
                rows = connection.execute(
                    text(
                        "SELECT creation_time, start_time, duration FROM compression_jobs "
                        "WHERE status = :succeeded"
                    ),
                    {"succeeded": int(JobStatus.SUCCEEDED)},
                ).all()
        finally:
            if undo_pinning is not None:
                undo_pinning()
            stop(process)
            engine.dispose()
    commits = [
        (created, start_time + timedelta(seconds=float(duration)))
        for created, start_time, duration in rows
    ]
    run.succeeded = len(commits)
    if commits:
        run.latencies = [(commit - created).total_seconds() for created, commit in commits]
        run.drain_secs = (max(commit for _, commit in commits) - inserted).total_seconds()
    return run


def start(cluster: SpiderCluster, who: str, ours: Path, slots: int) -> subprocess.Popen[bytes]:
    if who == "rust":
        config = cluster.rust_config(cluster.directory / "rust.yaml", max_concurrent_jobs=slots)
        return cluster.rust_coordinator(config)
    return cluster.coordinator(ours)


def spider_cluster(server: str | None, sizes: Sizes) -> list[Row]:
    """Both coordinators, alternated, for each size of ``sizes.cluster_jobs`` ×
    ``sizes.cluster_slots``; the rows comparing them (see the module docstring)."""
    problem = "needs a MariaDB server (--database URL)" if server is None else cluster_problem()
    if server is None or problem is not None:
        return [Row(f"Spider cluster vs CLP's Rust coordinator: skipped, {problem}", "—")]
    runs: dict[tuple[str, int, int], Run] = {}
    first = True
    for count in sizes.cluster_jobs:
        specs = varied_jobs(count)
        for slots in sizes.cluster_slots:
            for who in ("rust", "ours"):
                idle = sizes.cluster_idle_secs if first else 0.0
                runs[who, count, slots] = measure(
                    server, who, specs, slots, idle, own_cpu=bool(sizes.cluster_own_cpu)
                )
            first = False
    return rows_of(runs, sizes)


def own_cpu_for(pid: int) -> Callable[[], None]:
    """Pin every thread of process ``pid`` to the machine's last CPU and every other thread of the
    machine to the other CPUs (threads made later inherit their maker's); a function that puts
    every thread touched back on the CPUs it had. Threads that cannot be pinned (kernel threads,
    gone ones) are left as they are."""
    cpus = sorted(os.sched_getaffinity(0))
    own, others = {cpus[-1]}, set(cpus[:-1]) or {cpus[-1]}
    before: dict[int, set[int]] = {}
    for task in Path("/proc").glob("[0-9]*/task/[0-9]*"):
        thread, process = int(task.name), int(task.parent.parent.name)
        try:
            had = os.sched_getaffinity(thread)
            os.sched_setaffinity(thread, own if process == pid else others)
        except OSError:
            continue
        before[thread] = had

    def undo() -> None:
        for thread, had in before.items():
            try:
                os.sched_setaffinity(thread, had)
            except OSError:
                continue

    return undo


def rows_of(runs: dict[tuple[str, int, int], Run], sizes: Sizes) -> list[Row]:
    where = ", coordinator on a CPU of its own" if sizes.cluster_own_cpu else ""
    rows = []
    for count in sizes.cluster_jobs:
        for slots in sizes.cluster_slots:
            rust, ours = runs["rust", count, slots], runs["ours", count, slots]
            valid = rust.valid and ours.valid
            note = "" if valid else f" (Succeeded: ours {ours.succeeded}, Rust {rust.succeeded})"
            rows.append(
                Row.judged(
                    f"Spider cluster{where}: drain {count:,} jobs, {slots} slots",
                    f"{ours.drain_secs:.2f} s ({count / ours.drain_secs:.1f} jobs/s){note}",
                    f"Rust {rust.drain_secs:.2f} s ({count / rust.drain_secs:.1f} jobs/s)",
                    f"{ours.drain_secs / rust.drain_secs:.2f}x",
                    goal=DRAIN_GOAL,
                    value=ours.drain_secs / rust.drain_secs,
                    valid=valid,
                )
            )
            if slots != min(sizes.cluster_slots):
                continue
            for name, fraction in (("p50", 0.5), ("p95", 0.95)):
                mine, theirs = ours.latency(fraction), rust.latency(fraction)
                rows.append(
                    Row.judged(
                        f"Spider cluster{where}: latency {name}, {count:,} jobs, {slots} slots",
                        f"{mine:.2f} s (creation → commit)",
                        f"Rust {theirs:.2f} s",
                        f"{mine / theirs:.2f}x",
                        goal=LATENCY_GOAL,
                        value=mine / theirs,
                        valid=valid,
                    )
                )
    ours_runs = [run for (who, _, _), run in runs.items() if who == "ours"]
    rust_runs = [run for (who, _, _), run in runs.items() if who == "rust"]
    jobs = sum(run.jobs for run in ours_runs)
    ours_cpu = sum(run.cpu_secs for run in ours_runs) / jobs * 1000
    rust_cpu = sum(run.cpu_secs for run in rust_runs) / jobs * 1000
    valid = all(run.valid for run in runs.values())
    rows.append(
        Row.judged(
            f"Spider cluster{where}: coordinator CPU per job ({jobs:,} jobs over every size)",
            f"{ours_cpu:.2f} ms/job",
            f"Rust {rust_cpu:.2f} ms/job",
            f"{ours_cpu / rust_cpu:.2f}x",
            goal=CPU_GOAL,
            value=ours_cpu / rust_cpu,
            valid=valid,
        )
    )
    ours_peak = max(run.peak_rss_mb for run in ours_runs)
    rust_peak = max(run.peak_rss_mb for run in rust_runs)
    rows.append(
        Row.judged(
            f"Spider cluster{where}: coordinator peak RSS (VmHWM, largest over the sizes)",
            f"{ours_peak:.0f} MB",
            f"Rust {rust_peak:.0f} MB",
            f"{ours_peak / rust_peak:.2f}x",
            goal=PEAK_RSS_GOAL,
            value=ours_peak,
            valid=valid,
        )
    )
    idle = [run for run in ours_runs + rust_runs if run.idle_cpu_secs is not None]
    if len(idle) == 2:  # no idle window with --cluster-idle-secs 0
        ours_idle, rust_idle = sorted(idle, key=lambda run: run.who != "ours")
        rows.append(_idle_row(ours_idle, rust_idle, sizes))
    return rows


def _idle_row(ours: Run, rust: Run, sizes: Sizes) -> Row:
    assert ours.idle_cpu_secs is not None and rust.idle_cpu_secs is not None
    mine, theirs = ours.idle_cpu_secs, max(rust.idle_cpu_secs, CLOCK_TICK)
    return Row.judged(
        f"Spider cluster: idle CPU over {sizes.cluster_idle_secs:.0f} s (one /proc tick at "
        "least), idle RSS",
        f"{mine:.2f} s, {ours.idle_rss_mb:.0f} MB",
        f"Rust {rust.idle_cpu_secs:.2f} s, {rust.idle_rss_mb:.0f} MB",
        f"{mine / theirs:.2f}x",
        goal=IDLE_CPU_GOAL,
        value=mine / theirs,
    )
