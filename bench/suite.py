"""Issue 14's cases, each measured side by side with its floor: see ``bench/__main__.py``.

Every case makes its own temporary data directory, its own database (the SQLite file of that
directory, or a fresh ``bench_<random>`` database on the ``--database`` server, dropped after) and
its own data (``coordinator.cli.samples.json_log_lines``, deterministic), and returns its table
rows. Sizes come from ``Sizes``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import math
import os
import random
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib.resources import files
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, func, insert, select, text

from bench import partition as partition_bench
from bench.noop import (
    HOLDING_PACKAGE,
    INSTANT_PACKAGE,
    TransactionCounter,
    executor_transactions,
)
from bench.soak import create_database, drop_database
from bench.transitions import moves_per_second_in_processes
from coordinator import metrics
from coordinator.cli.samples import json_log_lines
from coordinator.config.loader import CoordinatorConfig, database_url, load_config
from coordinator.engine.tasks.compress import CLP_S_PACKAGE, clp_s_command
from coordinator.lifecycle import JobStatus
from coordinator.partition import partition_objects
from coordinator.runtime import Runtime, open_runtime
from coordinator.service.ingest import submit_job
from coordinator.store.opening import open_engine
from coordinator.store.schema import compression_jobs as _jobs
from coordinator.store.schema import job_transitions, stored_archives

MIB = 1024 * 1024
TERMINAL = (int(JobStatus.SUCCEEDED), int(JobStatus.FAILED), int(JobStatus.KILLED))


@dataclass
class Sizes:
    jobs: int = 1000
    """P1 and P1b: one-object jobs."""
    events_per_job: int = 20
    big_mib: int = 200
    """P2: the one big job's size."""
    big_rounds: int = 3
    """P2: rounds of (floor, 2-partition job, floor, 1-partition job)."""
    in_flight: int = 1000
    """P3: ``max_concurrent_jobs``."""
    backlog: tuple[int, int] = (1000, 10_000)
    """P3: Pending jobs behind the in-flight ones, small and large."""
    window_secs: float = 5.0
    """P3: how long each backlog is measured."""
    restart_jobs: int = 1000
    partition_objects: int = 100_000
    startup_runs: int = 5
    workers: int = 2
    cluster_jobs: tuple[int, ...] = (200, 1000)
    """spider-cluster: the job counts, each drained by both coordinators."""
    cluster_slots: tuple[int, ...] = (4, 64)
    """spider-cluster: ``max_concurrent_jobs`` values, each with every job count."""
    cluster_idle_secs: float = 30.0
    """spider-cluster: the idle window (CPU and RSS with nothing to do)."""
    cluster_own_cpu: int = 0
    """spider-cluster: 1 runs each coordinator on a CPU of its own, every other process (Spider,
    MariaDB) on the others (``spider_cluster.own_cpu_for``), as when they run on separate hosts."""

    @classmethod
    def smoke(cls) -> Sizes:
        return cls(
            jobs=10,
            events_per_job=10,
            big_mib=2,
            big_rounds=1,
            in_flight=20,
            backlog=(20, 200),
            window_secs=1.0,
            restart_jobs=12,
            partition_objects=10_000,
            startup_runs=1,
            cluster_jobs=(20,),
            cluster_slots=(4,),
            cluster_idle_secs=3.0,
        )


@dataclass(frozen=True)
class Goal:
    """One of the issue's goals: a limit on the one figure of a row it judges."""

    text: str
    """As the issue states it (``≤ 1.5x``): the table's goal column."""
    limit: float
    at_most: bool = True
    """``True``: the figure must be at most ``limit``; ``False``: at least."""
    shown: str = "{:.2f}"
    """How the judged figure is printed beside others (``python -m bench --rounds``)."""

    def met(self, value: float) -> bool:
        return value <= self.limit if self.at_most else value >= self.limit


@dataclass
class Row:
    case: str
    figure: str
    floor: str = "—"
    ratio: str = "—"
    goal: str = ""
    holds: str = "—"
    value: float | None = None
    """The figure ``rule`` judges; ``None`` in a row that judges nothing."""
    rule: Goal | None = None
    valid: bool = True
    """Whether the run met the conditions beside the figure (every job Succeeded, none submitted
    twice …): a row judged over several rounds holds only if every round's did."""

    @classmethod
    def judged(
        cls,
        case: str,
        figure: str,
        floor: str = "—",
        ratio: str = "—",
        *,
        goal: Goal,
        value: float,
        valid: bool = True,
    ) -> Row:
        """A row whose ``holds`` is ``goal`` met by ``value`` in a ``valid`` run."""
        holds = verdict(valid and goal.met(value))
        return cls(case, figure, floor, ratio, goal.text, holds, value, goal, valid)

    @classmethod
    def from_json(cls, fields: Mapping[str, Any]) -> Row:
        """A row as a case's process printed it (``dataclasses.asdict``: its rule a mapping)."""
        rule = fields.get("rule")
        return cls(**{**fields, "rule": None if rule is None else Goal(**rule)})


def verdict(ok: bool) -> str:
    return "yes" if ok else "no"


# The goals, one per judged row.
P1_GOAL = Goal("≤ 1.5x", 1.5, shown="{:.2f}x")
P1B_GOAL = Goal("≥ 300 jobs/s", 300, at_most=False, shown="{:.0f} jobs/s")
P2_PARTITIONS_GOAL = Goal("≤ 1.00x", 1.0, shown="{:.2f}x")
P2_ONE_PARTITION_GOAL = Goal("≤ 1.10x", 1.10, shown="{:.2f}x")
P3_RSS_GOAL = Goal("≤ 150 MB", 150, shown="{:.0f} MB")
P3_TICK_GROWTH_GOAL = Goal("≤ 1.25x (backlog-independent)", 1.25, shown="{:.2f}x")
P3_STATE_CALLS_GOAL = Goal("≤ 1.0x", 1.0, shown="{:.2f}x")
P4_GOAL = Goal("≤ 5 s, none twice", 5, shown="{:.2f} s")
P5_GOAL = Goal("≤ 2 s", 2, shown="{:.2f} s")
STARTUP_GOAL = Goal("≤ 0.3 s", 0.3, shown="{:.2f} s")


# --- workspace ---------------------------------------------------------------------------------


@dataclass
class Workspace:
    root: Path
    config_path: Path
    config: CoordinatorConfig
    url: str | None
    """The MariaDB database, or ``None`` for the data directory's SQLite file."""

    @property
    def label(self) -> str:
        return "SQLite" if self.url is None else "MariaDB"

    def environment(self) -> dict[str, str]:
        environment = {
            key: value
            for key, value in os.environ.items()
            if key not in ("COORDINATOR_HOME", "COORDINATOR_DATABASE_URL")
        }
        if self.url is not None:
            environment["COORDINATOR_DATABASE_URL"] = self.url
        return environment

    def command(self, *args: str) -> list[str]:
        return [
            sys.executable,
            "-m",
            "coordinator",
            "run",
            "--config",
            str(self.config_path),
            *args,
        ]

    def engine(self) -> Engine:
        return open_engine(self.config)  # created and migrated when new


@contextlib.contextmanager
def workspace(
    server: str | None,
    sizes: Sizes,
    *,
    max_concurrent_jobs: int = 1000,
    target_archive_size: int = 256 * MIB,
    metrics_port: int | None = None,
) -> Iterator[Workspace]:
    root = Path(tempfile.mkdtemp(prefix="bench-")).absolute()
    url = created = None
    admin = server
    if server is not None:
        url, created, admin = create_database(server)
        os.environ["COORDINATOR_DATABASE_URL"] = url
    else:
        os.environ.pop("COORDINATOR_DATABASE_URL", None)
    os.environ.pop("COORDINATOR_HOME", None)
    path = root / "clp-config.yaml"
    path.write_text(
        "package: {storage_engine: clp-s}\n"
        "spider: {host: 127.0.0.1, port: 50051}\n"
        "compression_coordinator:\n"
        f"  max_concurrent_jobs: {max_concurrent_jobs}\n"
        "archive_output:\n"
        f"  target_archive_size: {target_archive_size}\n"
        f"  storage: {{type: fs, directory: {root / 'archives'}}}\n"
        f"logs_input: {{type: fs, directory: {root / 'objects'}}}\n"
        "coordinator:\n"
        "  engine: embedded\n"
        "  instance_id: bench\n"
        f"  data_dir: {root / 'data'}\n"
        f"  object_store_directory: {root / 'objects'}\n"
        f"  embedded_workers: {sizes.workers}\n"
        + (f"  metrics_port: {metrics_port}\n  metrics_host: 127.0.0.1\n" if metrics_port else "")
    )
    try:
        yield Workspace(root, path, load_config(path), url)
    finally:
        if created is not None and admin is not None:
            drop_database(admin, created)
        shutil.rmtree(root, ignore_errors=True)


def write_objects(ws: Workspace, count: int, events: int) -> list[Path]:
    """One JSON-lines object per job, each in a bucket of its own (listing stays per job)."""
    paths = []
    for index in range(count):
        path = ws.config.object_store_directory / f"b{index:05d}" / "logs" / "app.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(json_log_lines(events, service=f"svc{index}"))
        paths.append(path)
    return paths


def submit_objects(ws: Workspace, engine: Engine, count: int, first: int = 0) -> list[int]:
    """One job for each of ``write_objects``'s objects ``first`` to ``first + count - 1``."""
    return [
        submit_job(
            ws.config, engine, bucket=f"b{index:05d}", prefix="logs/", timestamp_key="timestamp"
        )
        for index in range(first, first + count)
    ]


def clone_jobs(engine: Engine, job_id: int, count: int) -> None:
    """``count`` more Pending jobs with the ``clp_config`` of ``job_id``, in one statement each
    thousand (the no-op tasks never read the objects)."""
    with engine.begin() as connection:
        blob = connection.execute(
            select(_jobs.c.clp_config).where(_jobs.c.id == job_id)
        ).scalar_one()
        for start in range(0, count, 1000):
            rows = [{"clp_config": blob} for _ in range(min(1000, count - start))]
            connection.execute(insert(_jobs), rows)


def statuses(engine: Engine) -> dict[int, int]:
    with engine.connect() as connection:
        rows = connection.execute(select(_jobs.c.status, func.count()).group_by(_jobs.c.status))
        return {int(status): int(count) for status, count in rows}


def server_requests(engine: Engine) -> int | None:
    """What MariaDB has received from every client since it started: statements (``COMMIT`` and
    ``ROLLBACK`` included, ``Questions``) and pings (``Com_admin_commands``); ``None`` on SQLite.
    The executors' requests count too, which the processes' own counters cannot see."""
    if engine.dialect.name not in ("mysql", "mariadb"):
        return None
    with engine.connect() as connection:
        rows = connection.execute(
            text("SHOW GLOBAL STATUS WHERE Variable_name IN ('Questions', 'Com_admin_commands')")
        ).all()
    return sum(int(value) for _, value in rows)


def succeeded_note(engine: Engine, expected: int) -> str:
    done = statuses(engine).get(int(JobStatus.SUCCEEDED), 0)
    return "" if done == expected else f" ({done}/{expected} Succeeded)"


# --- clp-s, the floor --------------------------------------------------------------------------


def clp_s_binary() -> Path:
    return Path(str(files(CLP_S_PACKAGE) / "bin" / "clp-s"))


def run_clp_s(config: CoordinatorConfig, inputs: Sequence[Path], output: Path) -> None:
    """clp-s as the compress task runs it (same flags), over local files."""
    output.mkdir(parents=True)
    listing = output.with_suffix(".txt")
    listing.write_text("".join(f"{path}\n" for path in inputs))
    archive = config.clp.archive_output
    command = clp_s_command(
        clp_s_binary(),
        output,
        listing,
        target_encoded_size=archive.target_encoded_file_size,
        compression_level=archive.compression_level,
        timestamp_key="timestamp",
    )
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)


def timed(function: Callable[[], Any]) -> float:
    started = time.perf_counter()
    function()
    return time.perf_counter() - started


def children_cpu() -> float:
    """CPU seconds (user + system) of every child process waited for so far, with the children
    they waited for (a ``coordinator run``: its fork server, executors and their clp-s runs)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


# --- P1: small jobs ----------------------------------------------------------------------------


def p1(server: str | None, sizes: Sizes) -> list[Row]:
    """The floor, then the same jobs through a running service: as P1b and P2, after one warm-up
    job (the executors' start is not per job; the process's own start is the start-up row's)."""
    with workspace(server, sizes) as ws:
        # One object more than the jobs: the warm-up job's, so no job reads what another did.
        paths = write_objects(ws, sizes.jobs + 1, sizes.events_per_job)
        engine = ws.engine()
        scratch = ws.root / "floor"

        def floor() -> None:
            with ThreadPoolExecutor(sizes.workers) as pool:
                runs = [
                    pool.submit(run_clp_s, ws.config, [path], scratch / str(index))
                    for index, path in enumerate(paths[: sizes.jobs])
                ]
                for run in runs:
                    run.result()

        before_floor = children_cpu()
        floor_secs = timed(floor)
        floor_cpu = children_cpu() - before_floor
        with open_runtime(ws.config) as runtime:
            submit_objects(ws, engine, 1, first=sizes.jobs)
            warm_up_secs = warmed_up(runtime)
            submit_objects(ws, engine, sizes.jobs)
            cpu_before = process_tree_cpu(os.getpid())
            seconds = timed(lambda: runtime.coordinator.run(until_idle=True))
            service_cpu = process_tree_cpu(os.getpid()) - cpu_before
        note = succeeded_note(engine, sizes.jobs + 1)
        engine.dispose()
    ratio = seconds / floor_secs
    per_job = 1000 / sizes.jobs
    apart = "; MariaDB's server apart" if server is not None else ""
    return [
        Row.judged(
            f"P1 {sizes.jobs:,} one-object jobs, {ws.label}",
            f"{sizes.jobs / seconds:.1f} jobs/s ({seconds:.2f} s){note} after a warm-up job of "
            f"{warm_up_secs:.2f} s, the executors' start "
            f"({(sizes.jobs + 1) / (warm_up_secs + seconds):.1f} jobs/s counting it); CPU "
            f"{service_cpu * per_job:.1f} ms/job ({service_cpu / floor_cpu:.2f}x the floor's: "
            f"every process of the service, its clp-s runs included{apart})",
            f"{sizes.jobs / floor_secs:.1f} clp-s/s, {sizes.workers} at a time "
            f"({floor_secs:.2f} s); CPU {floor_cpu * per_job:.1f} ms/run",
            f"{ratio:.2f}x",
            goal=P1_GOAL,
            value=ratio,
            valid=not note,
        )
    ]


def warmed_up(runtime: Runtime) -> float:
    """Run the jobs waiting (the warm-up job) until idle; its seconds. Then, as ``coordinator run``
    does once started (``cli.main._collector_paused``), freeze what start-up built, so that the
    measured run's full collections do not walk it again."""
    seconds = timed(lambda: runtime.coordinator.run(until_idle=True))
    gc.collect()
    gc.freeze()
    return seconds


# --- P1b: lifecycle only -----------------------------------------------------------------------


def p1b(server: str | None, sizes: Sizes) -> list[Row]:
    with workspace(server, sizes) as ws:
        write_objects(ws, 1, sizes.events_per_job)
        engine = ws.engine()
        first = submit_objects(ws, engine, 1)[0]
        staging = ws.config.data_dir / "staging"
        with open_runtime(ws.config, packages=INSTANT_PACKAGE) as runtime:
            # One job first, as P2's warm-up: the executors' start (the fork server imports the
            # task packages) and each process's first-use work stay out of the figure, as the
            # floor's processes' imports do; the row gives that job's time and the rate counting it.
            warm_up_secs = warmed_up(runtime)
            clone_jobs(engine, first, sizes.jobs)
            counter = TransactionCounter()
            requests_before = server_requests(engine)
            warm_up_commits, warm_up_rollbacks = executor_transactions(staging)
            seconds = timed(lambda: runtime.coordinator.run(until_idle=True))
            counter.close()
            requests_after = server_requests(engine)
            task_commits, task_rollbacks = executor_transactions(staging)
        task_commits -= warm_up_commits
        task_rollbacks -= warm_up_rollbacks
        note = succeeded_note(engine, sizes.jobs + 1)
        engine.dispose()
        per_job = (counter.commits + task_commits) / sizes.jobs
        # Done once the run's jobs were counted: the floor's own jobs end Succeeded too.
        writers = sizes.workers + 1  # the coordinator's process and each executor write
        moves_per_sec = moves_per_second_in_processes(
            database_url(ws.config), writers, math.ceil(sizes.jobs / writers)
        )
    rate = sizes.jobs / seconds
    cold_secs = warm_up_secs + seconds
    floor_rate = moves_per_sec / per_job
    requests = (
        ""
        if requests_before is None or requests_after is None
        else f"; {(requests_after - requests_before) / sizes.jobs:.1f} requests/job received by "
        "MariaDB from every process (statements, COMMIT and ROLLBACK, pings)"
    )
    texts = (
        f"P1b lifecycle only, {sizes.jobs:,} jobs with instant tasks, {ws.label}",
        f"{rate:.0f} jobs/s ({seconds:.2f} s){note} after a warm-up job of "
        f"{warm_up_secs:.2f} s, the executors' start ({(sizes.jobs + 1) / cold_secs:.0f} "
        f"jobs/s counting it); {per_job:.1f} commits/job "
        f"(coordinator and engine {counter.commits / sizes.jobs:.1f}, tasks "
        f"{task_commits / sizes.jobs:.1f}) + "
        f"{(counter.rollbacks + task_rollbacks) / sizes.jobs:.1f} read-only/job; "
        f"{counter.statements / sizes.jobs:.1f} statements/job in the coordinator and engine"
        f"{requests}",
        f"{floor_rate:.0f} jobs/s: the database's {moves_per_sec:,.0f} guarded moves/s "
        f"from {writers} processes at once, over the run's {per_job:.1f} commits/job",
        f"{floor_rate / rate:.2f}x",
    )
    if server is None:
        # The issue sets P1b's goal on MariaDB: on SQLite the row is measured, not judged.
        return [Row(*texts, goal=f"none on SQLite ({P1B_GOAL.text} on MariaDB)", valid=not note)]
    return [Row.judged(*texts, goal=P1B_GOAL, value=rate, valid=not note)]


# --- P2: one big job ---------------------------------------------------------------------------


def write_big(ws: Workspace, total_mib: int, parts: int = 4) -> list[Path]:
    """``parts`` objects of ``total_mib / parts`` MiB each under ``big/``."""
    paths = []
    each = total_mib * MIB // parts
    for part in range(parts):
        path = ws.config.object_store_directory / "big" / "logs" / f"part-{part}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as file:
            chunk = 0
            while file.tell() < each:
                file.write(json_log_lines(5000, service=f"svc{part}", seed=chunk))
                chunk += 1
        paths.append(path)
    return paths


def wait_for(condition: Callable[[], bool], timeout: float, poll: float = 0.01) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(poll)
    return condition()


def job_row(engine: Engine, job_id: int) -> Any:
    with engine.connect() as connection:
        return connection.execute(
            select(_jobs.c.status, _jobs.c.num_tasks).where(_jobs.c.id == job_id)
        ).one()


def with_target(config: CoordinatorConfig, target: int) -> CoordinatorConfig:
    output = config.clp.archive_output.model_copy(update={"target_archive_size": target})
    return dataclasses.replace(config, clp=config.clp.model_copy(update={"archive_output": output}))


BIG_TWO_PARTITIONS = 0.45
"""P2's target archive size for two partitions, as a share of the job: CLP's partitioning fills a
partition while it is below the target, so with four equal objects 45 % cuts 2 + 2 (the 55 % used
before cut 3 + 1, and the job then waited on one clp-s over 75 % of the data)."""


def _proc_table(*, waited_for: bool = False) -> dict[int, tuple[str, int, float]]:
    """Every process: ``pid → (name, parent pid, CPU seconds of its own)``, with ``waited_for``
    those of the children it waited for too."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # Fields 14-17: utime, stime, and the waited-for children's cutime, cstime.
        fields = stat.rsplit(")", 1)[1].split()
        cpu = sum(map(int, fields[11 : 15 if waited_for else 13])) / os.sysconf("SC_CLK_TCK")
        table[int(entry)] = (stat[stat.index("(") + 1 : stat.rindex(")")], int(fields[1]), cpu)
    return table


def process_tree_cpu(root: int) -> float:
    """CPU seconds of ``root`` and every live process under it, each with the children it waited
    for (an executor's clp-s runs; an executor reaped, in its server's)."""
    table = _proc_table(waited_for=True)
    return sum(cpu for pid, (_, _, cpu) in table.items() if _descends(table, pid, root))


def _descends(table: dict[int, tuple[str, int, float]], pid: int, root: int) -> bool:
    for _ in range(8):
        if pid == root:
            return True
        if pid not in table:
            return False
        pid = table[pid][1]
    return False


@dataclass
class ClpSWatch:
    """The clp-s processes under ``root`` (the service), seen every 50 ms in ``/proc``: when each
    was first and last seen and its CPU time; and the CPU time of the service's other processes."""

    root: int
    started: float
    runs: dict[int, list[float]] = dataclasses.field(default_factory=dict)
    command: str = ""
    _stop: threading.Event = dataclasses.field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def service_cpu(self) -> float:
        table = _proc_table()
        return sum(
            cpu
            for pid, (name, _, cpu) in table.items()
            if name not in ("clp-s", "setpriv") and _descends(table, pid, self.root)
        )

    def __enter__(self) -> ClpSWatch:
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _watch(self) -> None:
        # Cheap, as it runs beside what it measures: a process is read once to learn whether it
        # descends from the service (its parent is known to), and only the service's are read again.
        table = _proc_table()
        ours = {pid for pid in table if _descends(table, pid, self.root)}
        foreign = set(table) - ours
        while not self._stop.is_set():
            now = time.perf_counter() - self.started
            for entry in os.listdir("/proc"):
                if not entry.isdigit() or int(entry) in foreign:
                    continue
                pid = int(entry)
                try:
                    stat = Path(f"/proc/{entry}/stat").read_text()
                except OSError:
                    continue
                fields = stat.rsplit(")", 1)[1].split()
                if pid not in ours:
                    if int(fields[1]) not in ours:
                        foreign.add(pid)
                        continue
                    ours.add(pid)
                if stat[stat.index("(") + 1 : stat.rindex(")")] == "clp-s":
                    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
                    run = self.runs.setdefault(pid, [now, now, cpu])
                    run[1], run[2] = now, cpu
                    if not self.command:
                        with contextlib.suppress(OSError):
                            self.command = (
                                Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
                            )
            time.sleep(0.05)


@dataclass
class P2Run:
    label: str
    tasks: int
    status: int
    seconds: float
    """Submission → the Succeeded move (its history row), or until the job was seen ended."""
    floor_secs: float
    floor_cpu: float
    clp_s: list[tuple[float, float, float]]
    """Each partition's clp-s: first seen, last seen (s after submission), CPU seconds."""
    service_cpu: float
    """CPU of the coordinator's process and its executors while the job ran (clp-s apart)."""
    phases: dict[str, float]
    """The job's marks, in s after submission: ``submitted`` (RegisterJob/StartJob done),
    ``stored`` (the last archive's record), ``committed``, ``finalised``."""
    bench_cpu: float
    """This process's CPU meanwhile (its polling of the job and of ``/proc``)."""
    parallel_secs: float | None = None
    """The same partitions' bare clp-s runs, all at once (no coordinator): the machine's own
    parallel gain, the best any orchestration could reach."""

    def breakdown(self) -> str:
        marks = self.phases
        first = min((start for start, _, _ in self.clp_s), default=float("nan"))
        last = max((end for _, end, _ in self.clp_s), default=float("nan"))
        clp_s = ", ".join(
            f"{end - start:.2f} s ({cpu:.2f} s CPU)" for start, end, cpu in self.clp_s
        )
        parallel = (
            ""
            if self.parallel_secs is None
            else f" (its partitions' bare clp-s in parallel: {self.parallel_secs:.2f} s = "
            f"{self.parallel_secs / self.floor_secs:.2f}x)"
        )
        return (
            f"{self.label}: {self.seconds:.2f} s vs floor {self.floor_secs:.2f} s "
            f"({self.floor_cpu:.2f} s CPU){parallel} = {self.seconds / self.floor_secs:.2f}x; "
            f"submission → submitted to the engine {marks.get('submitted', float('nan')):.3f} s"
            f" → clp-s started {first:.3f} s; clp-s per partition {clp_s}; "
            f"last clp-s end {last:.3f} s → last archive recorded "
            f"{marks.get('stored', float('nan')):.3f} s → committed "
            f"{marks.get('committed', float('nan')):.3f} s → finalised (Succeeded) "
            f"{marks.get('finalised', float('nan')):.3f} s; "
            f"coordinator + executors CPU meanwhile {self.service_cpu:.2f} s, the bench's own "
            f"{self.bench_cpu:.2f} s"
        )


def _marks(engine: Engine, job_id: int, submitted_at: float) -> dict[str, float]:
    """The job's history and stored archives, in s after ``submitted_at`` (a ``time.time()``)."""

    def since(value: Any) -> float:
        moment = datetime.fromisoformat(value) if isinstance(value, str) else value
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        return float(moment.timestamp() - submitted_at)

    marks: dict[str, float] = {}
    with engine.connect() as connection:
        for trigger, at in connection.execute(
            select(job_transitions.c.trigger, job_transitions.c.at).where(
                job_transitions.c.job_id == job_id
            )
        ):
            marks[str(trigger)] = since(at)
        stored = connection.execute(
            select(func.max(stored_archives.c.stored_at)).where(stored_archives.c.job_id == job_id)
        ).scalar_one()
    if stored is not None:
        marks["stored"] = since(stored)
    return marks


def _p2_run(
    ws: Workspace,
    engine: Engine,
    service: subprocess.Popen[bytes],
    paths: Sequence[Path],
    *,
    label: str,
    target: int,
    index: int,
) -> P2Run:
    """The floor (one bare clp-s over ``paths``), then the job with ``target``, back to back."""
    before_floor = children_cpu()
    floor_secs = timed(lambda: run_clp_s(ws.config, paths, ws.root / f"floor-{index}"))
    floor_cpu = children_cpu() - before_floor
    shutil.rmtree(ws.root / f"floor-{index}", ignore_errors=True)
    parallel_secs = None
    parts = partition_objects([(str(path), path.stat().st_size) for path in paths], target)
    if len(parts) > 1:
        scratch = ws.root / f"parallel-{index}"

        def parallel() -> None:
            with ThreadPoolExecutor(len(parts)) as pool:
                runs = [
                    pool.submit(run_clp_s, ws.config, [Path(key) for key in part], scratch / str(i))
                    for i, part in enumerate(parts)
                ]
                for run in runs:
                    run.result()

        parallel_secs = timed(parallel)
        shutil.rmtree(scratch, ignore_errors=True)
    config = with_target(ws.config, target)
    started = time.perf_counter()
    submitted_at = time.time()
    with ClpSWatch(service.pid, started) as watch:
        cpu_before = watch.service_cpu()
        job_id = submit_job(config, engine, bucket="big", prefix="logs/", timestamp_key="timestamp")
        own = resource.getrusage(resource.RUSAGE_SELF)
        # Polled slowly: the job's end is read from its history (the Succeeded move's time).
        wait_for(lambda: int(job_row(engine, job_id).status) in TERMINAL, 600, 0.1)
        seen = time.perf_counter() - started
        service_cpu = watch.service_cpu() - cpu_before
        own_after = resource.getrusage(resource.RUSAGE_SELF)
    status, tasks = job_row(engine, job_id)
    marks = _marks(engine, job_id, submitted_at)
    run = P2Run(
        label,
        int(tasks),
        int(status),
        marks.get("finalised", seen),
        floor_secs,
        floor_cpu,
        sorted((start, end, cpu) for start, end, cpu in watch.runs.values()),
        service_cpu,
        marks,
        own_after.ru_utime + own_after.ru_stime - own.ru_utime - own.ru_stime,
        parallel_secs,
    )
    print(f"bench p2: {run.breakdown()}", file=sys.stderr, flush=True)
    if index == 0 and watch.command:
        print(f"bench p2: the task's clp-s: {watch.command}", file=sys.stderr, flush=True)
    return run


def warm_up(ws: Workspace, engine: Engine) -> None:
    """One small 2-partition job through the running service before anything is measured: the
    executors' start and what each process does once at its first job (imports, the lifecycle's
    machine) are not per job, and "inside a running service" means after them."""
    for part in range(2):
        path = ws.config.object_store_directory / "warm" / "logs" / f"part-{part}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(json_log_lines(100, service=f"warm{part}"))
    config = with_target(ws.config, 1)
    job_id = submit_job(config, engine, bucket="warm", prefix="logs/", timestamp_key="timestamp")
    wait_for(lambda: int(job_row(engine, job_id).status) in TERMINAL, 120)


def p2(server: str | None, sizes: Sizes) -> list[Row]:
    """Each round: the floor, the 2-partition job, the floor, the 1-partition job, alternately (the
    load of a shared machine changes by the second); the ratio is the median of each job's time
    over the floor measured just before it."""
    runs: dict[str, list[P2Run]] = {"2 partitions": [], "1 partition": []}
    with workspace(server, sizes) as ws:
        paths = write_big(ws, sizes.big_mib)
        total = sum(path.stat().st_size for path in paths)
        engine = ws.engine()
        service = subprocess.Popen(
            ws.command(), env=ws.environment(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            wait_for(lambda: _instance_up(engine), 60, 0.05)
            warm_up(ws, engine)
            targets = {"2 partitions": int(total * BIG_TWO_PARTITIONS), "1 partition": total * 2}
            for index in range(sizes.big_rounds * len(targets)):
                label = list(targets)[index % len(targets)]
                runs[label].append(
                    _p2_run(
                        ws, engine, service, paths, label=label, target=targets[label], index=index
                    )
                )
        finally:
            stop(service)
        engine.dispose()
    rows = []
    for label, measured in runs.items():
        ratios = sorted(run.seconds / run.floor_secs for run in measured)
        ratio = statistics.median(ratios)
        seconds = statistics.median(run.seconds for run in measured)
        floor_secs = statistics.median(run.floor_secs for run in measured)
        tasks = measured[0].tasks
        failed = [run.status for run in measured if run.status != int(JobStatus.SUCCEEDED)]
        overhead = statistics.median(
            run.service_cpu / run.floor_cpu for run in measured if run.floor_cpu > 0
        )
        goal = P2_PARTITIONS_GOAL if tasks >= 2 else P2_ONE_PARTITION_GOAL
        rounds = f"median of {len(measured)}, " if len(measured) > 1 else ""
        parallel = [run.parallel_secs for run in measured if run.parallel_secs is not None]
        beside = (
            f"; its {tasks} partitions' bare clp-s in parallel: "
            f"{statistics.median(parallel):.2f} s ("
            + ", ".join(
                f"{run.parallel_secs / run.floor_secs:.2f}x"
                for run in measured
                if run.parallel_secs is not None
            )
            + " of the floor: the machine's own parallel gain; the job took "
            + ", ".join(
                f"{run.seconds / run.parallel_secs:.2f}x"
                for run in measured
                if run.parallel_secs is not None
            )
            + " of it)"
            if parallel
            else ""
        )
        rows.append(
            Row.judged(
                f"P2 one {total / MIB:.0f} MiB job, {label} ({tasks} tasks), {ws.label}",
                f"{seconds:.2f} s submission → Succeeded ({rounds}ratios "
                f"{', '.join(f'{r:.2f}' for r in ratios)}); coordinator CPU meanwhile "
                f"{overhead:.0%} of the floor's" + (f" (statuses {failed})" if failed else ""),
                f"one bare clp-s over the same files (the task's flags), measured before each "
                f"job: {floor_secs:.2f} s{beside}",
                f"{ratio:.2f}x",
                goal=goal,
                value=ratio,
                valid=not failed,
            )
        )
    return rows


def _instance_up(engine: Engine) -> bool:
    with engine.connect() as connection:
        return bool(
            connection.execute(
                text("SELECT COUNT(*) FROM coordinator_instances WHERE name = 'bench'")
            ).scalar_one()
        )


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# --- P3: backlog -------------------------------------------------------------------------------


def peak_rss_reset() -> None:
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def peak_rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def sample(name: str, **labels: str) -> float:
    return metrics.REGISTRY.get_sample_value(name, labels or None) or 0.0


def p3(server: str | None, sizes: Sizes) -> list[Row]:
    small, large = sizes.backlog
    with workspace(server, sizes, max_concurrent_jobs=sizes.in_flight) as ws:
        write_objects(ws, 1, sizes.events_per_job)
        engine = ws.engine()
        first = submit_objects(ws, engine, 1)[0]
        clone_jobs(engine, first, sizes.in_flight + small - 1)
        peak_rss_reset()
        windows = {}
        with open_runtime(ws.config, packages=HOLDING_PACKAGE) as runtime:
            loop = threading.Thread(target=runtime.coordinator.run, daemon=True)
            loop.start()
            try:
                for backlog in (small, large):
                    if backlog > small:
                        clone_jobs(engine, first, backlog - small)
                    wait_for(
                        lambda: sample("clp_coordinator_jobs_driven") >= sizes.in_flight, 300, 0.1
                    )
                    before = _loop_samples()
                    time.sleep(sizes.window_secs)
                    after = _loop_samples()
                    windows[backlog] = [b - a for a, b in zip(before, after, strict=True)]
            finally:
                runtime.coordinator.stopping.set()
                loop.join(60)
        rss = peak_rss_mb()
        engine.dispose()
    ticks = {backlog: count / sizes.window_secs for backlog, (count, _, _) in windows.items()}
    cost = {backlog: total / max(count, 1) * 1000 for backlog, (count, total, _) in windows.items()}
    calls = windows[large][2] / sizes.window_secs
    max_backoff = ws.config.compression_coordinator.result_polling.max_backoff_millisecs / 1000
    bound = sizes.in_flight / max_backoff
    growth = cost[large] / cost[small]
    label = f"{sizes.in_flight:,} in flight, {ws.label}"
    return [
        Row.judged(
            f"P3 backlog: peak RSS, {large:,} Pending + {label}",
            f"{rss:.0f} MB (the coordinator's process, tasks apart)",
            goal=P3_RSS_GOAL,
            value=rss,
        ),
        Row.judged(
            f"P3 backlog: tick cost at {large:,} vs {small:,} Pending, {label}",
            f"{cost[large]:.1f} ms/tick, {ticks[large]:.1f} ticks/s",
            f"{cost[small]:.1f} ms/tick, {ticks[small]:.1f} ticks/s at {small:,} Pending",
            f"{growth:.2f}x",
            goal=P3_TICK_GROWTH_GOAL,
            value=growth,
        ),
        Row.judged(
            f"P3 backlog: Spider state calls, {label}",
            f"{calls:.0f} GetJobState/s",
            f"back-off bound: {bound:.0f}/s ({sizes.in_flight:,} jobs / {max_backoff:g} s)",
            f"{calls / bound:.2f}x",
            goal=P3_STATE_CALLS_GOAL,
            value=calls / bound,
        ),
    ]


def _loop_samples() -> tuple[float, float, float]:
    return (
        sample("clp_coordinator_tick_duration_seconds_count"),
        sample("clp_coordinator_tick_duration_seconds_sum"),
        sample("clp_coordinator_spider_call_duration_seconds_count", method="GetJobState"),
    )


# --- P4: restart -------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def scrape(port: int, name: str) -> float:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
            body = response.read().decode()
    except OSError:
        return -1.0
    for line in body.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


def p4(server: str | None, sizes: Sizes) -> list[Row]:
    port = free_port()
    with workspace(server, sizes, metrics_port=port) as ws:
        write_objects(ws, sizes.restart_jobs, sizes.events_per_job)
        engine = ws.engine()
        submit_objects(ws, engine, sizes.restart_jobs)
        first = subprocess.Popen(
            ws.command(), env=ws.environment(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        pending = int(JobStatus.PENDING)
        wait_for(lambda: statuses(engine).get(pending, 0) == 0, 300, 0.05)
        first.send_signal(signal.SIGKILL)
        first.wait()
        with engine.connect() as connection:
            in_flight = dict(
                connection.execute(
                    select(_jobs.c.id, _jobs.c.lease_epoch).where(_jobs.c.status.not_in(TERMINAL))
                ).all()
            )
        started = time.perf_counter()
        second = subprocess.Popen(
            ws.command(), env=ws.environment(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        polls = 'clp_coordinator_spider_call_duration_seconds_count{method="GetJobState"}'
        try:

            def reattached() -> bool:
                with engine.connect() as connection:
                    rows = connection.execute(
                        select(_jobs.c.id, _jobs.c.status, _jobs.c.lease_epoch).where(
                            _jobs.c.id.in_(list(in_flight))
                        )
                    ).all()
                waiting = [
                    row
                    for row in rows
                    if row.status not in TERMINAL and row.lease_epoch <= in_flight[row.id]
                ]
                open_jobs = sum(row.status not in TERMINAL for row in rows)
                return not waiting and scrape(port, polls) >= open_jobs

            done = wait_for(reattached, 120, 0.05) if in_flight else True
            seconds = time.perf_counter() - started
            wait_for(
                lambda: sum(statuses(engine).get(s, 0) for s in TERMINAL) == sizes.restart_jobs,
                300,
                0.2,
            )
        finally:
            stop(second)
        with engine.connect() as connection:
            twice = connection.execute(
                text(
                    "SELECT COUNT(*) FROM (SELECT job_id FROM compression_job_transitions "
                    "WHERE spider_id IS NOT NULL GROUP BY job_id "
                    "HAVING COUNT(DISTINCT spider_id) > 1) AS twice"
                )
            ).scalar_one()
        note = succeeded_note(engine, sizes.restart_jobs)
        engine.dispose()
    return [
        Row.judged(
            f"P4 restart after SIGKILL, {len(in_flight):,} of {sizes.restart_jobs:,} jobs in "
            f"flight, {ws.label}",
            f"{seconds:.2f} s to re-attach (lease taken, polled) every one; "
            f"{twice} submitted twice{note}" + ("" if done else " (not all re-attached)"),
            goal=P4_GOAL,
            value=seconds,
            valid=done and twice == 0 and not note,
        )
    ]


# --- P5: partitioning, start-up ---------------------------------------------------------------


def p5(server: str | None, sizes: Sizes) -> list[Row]:
    count = sizes.partition_objects
    rng = random.Random(2026)
    keys = partition_bench.realistic_keys(rng, count)
    sizes_of = partition_bench.log_uniform_sizes
    workloads = [
        (list(zip(keys, sizes_of(rng, count, 4 * 1024, 64 * MIB), strict=True)), 256 * MIB),
        (list(zip(keys, sizes_of(rng, count, 4 * 1024, 64 * MIB), strict=True)), 8 * MIB),
        (list(zip(keys, sizes_of(rng, count, 1024, 64 * 1024), strict=True)), 256 * MIB),
        (partition_bench.small_among_large(rng, count), 256 * MIB),
    ]
    worst = max(partition_bench.measure(objects, target)[1] for objects, target in workloads)
    return [
        Row.judged(
            f"P5 partitioning {count:,} objects (worst of bench.partition's 4 workloads)",
            f"{worst:.2f} s",
            goal=P5_GOAL,
            value=worst,
        )
    ]


STARTUP_LIBRARIES = (
    "import gc; gc.disable(); "
    "import sqlalchemy, sqlalchemy.dialects.sqlite, sqlalchemy.dialects.mysql, pydantic.main, "
    "yaml, prometheus_client"
)
"""What any idle run imports before it can do anything, imported as the run imports (the cyclic
collector paused: ``cli.main._collector_paused``): the store's library with the embedded default's
dialect and the MySQL one its columns' types come from (CLP's DDL), pydantic's models (the
configuration), PyYAML (CLP's configuration file) and the metrics' client (every guarded move
counts): the design card's packages, the start-up's floor."""


def startup(server: str | None, sizes: Sizes) -> list[Row]:
    with workspace(server, sizes) as ws:
        environment = ws.environment()

        def idle_run() -> None:
            subprocess.run(
                ws.command("--until-idle"),
                env=environment,
                check=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )

        def libraries_only() -> None:
            subprocess.run([sys.executable, "-c", STARTUP_LIBRARIES], check=True)

        idle_run()  # creates and migrates
        # Alternated, so that both medians see the same moments of this machine's load.
        pairs = [(timed(idle_run), timed(libraries_only)) for _ in range(sizes.startup_runs)]
        runs = sorted(run for run, _ in pairs)
        libraries = sorted(floor for _, floor in pairs)
        interpreter = min(
            timed(lambda: subprocess.run([sys.executable, "-c", "pass"], check=True))
            for _ in range(3)
        )
    seconds = runs[len(runs) // 2]
    floor = libraries[len(libraries) // 2]
    return [
        Row.judged(
            f"Start-up: `run --until-idle` with nothing to do, {ws.label} (median of {len(runs)})",
            f"{seconds:.2f} s",
            f"importing the libraries alone (SQLAlchemy, pydantic, PyYAML, prometheus_client; "
            f"`STARTUP_LIBRARIES`): {floor:.2f} s (median of "
            f"{len(libraries)}); `python -c pass`: {interpreter:.2f} s",
            f"{seconds / floor:.2f}x",
            goal=STARTUP_GOAL,
            value=seconds,
        )
    ]


def spider_cluster(server: str | None, sizes: Sizes) -> list[Row]:
    """``bench.spider_cluster``'s case, imported when it runs (it imports this module)."""
    from bench.spider_cluster import spider_cluster as case  # noqa: PLC0415

    return case(server, sizes)


CASES: dict[str, Callable[[str | None, Sizes], list[Row]]] = {
    "p1": p1,
    "p1b": p1b,
    "p2": p2,
    "p3": p3,
    "p4": p4,
    "p5": p5,
    "startup": startup,
    "spider-cluster": spider_cluster,
}
DATABASE_CASES = ("p1", "p1b", "p3", "p4", "spider-cluster")
"""Run on the ``--database`` server too (the others do not depend on the database)."""
SERVER_ONLY_CASES = ("spider-cluster",)
"""Run only on the ``--database`` server when one is given (without one: a row saying so)."""
