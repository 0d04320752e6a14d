"""A kill-heavy replica soak: real ``coordinator run`` processes SIGKILLed and restarted at random.

    .venv/bin/python -m bench.soak --database mysql+pymysql://user:pass@127.0.0.1:3306/ \\
        [--replicas 3] [--jobs 1000] [--kills 20] [--cancels 50] [--seed N] [--data-dir DIR]
    .venv/bin/python -m bench.soak --database mysql+pymysql://user:pass@127.0.0.1:3306/ --quick

What it does:

1. **Its own data.** A fresh database ``soak_<random>`` on the server (or, when the URL names a
   database, that one, which must be empty), migrated to head; a data directory (``--data-dir``,
   else a temporary one) with the shared local object store ``objects/``, the shared archive
   directory ``archives/``, one data directory per replica (its staging directory), one CLP-style
   config file per replica (``package.storage_engine: clp-s``, ``spider``,
   ``compression_coordinator``, an ``fs`` archive output, ``coordinator.engine: embedded`` and its
   own ``coordinator.instance_id``), and M jobs of one generated JSON-lines object each (a few KB,
   deterministic for the seed) submitted as log-ingestor does (``submit_job``).
2. **Chaos.** N ``coordinator run --config …`` processes (``$COORDINATOR_DATABASE_URL`` names the
   database). A seeded loop then SIGKILLs a random live replica whenever the number of finished
   jobs passes the next of ``--kills`` random thresholds (at least ``--kill-gap`` apart) and
   restarts it after a random delay; stops one replica for good once (the scale-down: SIGKILL by
   default, so its leases must expire and another replica takes its jobs and its engine's jobs
   over); and asks an operator cancel (``request_cancel``) of a random unfinished job at
   ``--cancels`` random thresholds. Timing makes a run not exactly reproducible; the choices are
   the seed's.
   ``--crash-at-registration N`` (default 0) makes the first N replica processes started die
   right after their first RegisterJob, before recording it (``COORDINATOR_CRASH_AT=registered``,
   exit 137 as abrupt as a SIGKILL): an interrupted registration every run (the kills make one
   now and then), which the surviving engines must cancel once their grace is over; it costs the
   quick soak about 4 s (one more replica start). ``--unrecorded-grace S`` (5 s in
   ``--quick``; else the engine's default, 60 s) sets that grace
   (``coordinator.embedded_unrecorded_grace_secs``).
   A monitor thread polls ``compression_stored_archives`` and ``coordinator_instances`` every
   0.5 s, so that task instances whose records clean-up later deletes are still counted.
3. **Quiescence and settling.** Once every job is terminal (or ``--timeout`` passed), the soak
   waits, with the replicas still running (and restarted when due), until no engine job is Ready
   without a compression job recording it (at most the grace plus the heartbeat expiry and a
   margin): so an interrupted registration is an orphan only when the engines failed to cancel it.
   Then the archives are settled: ``--settle sweep`` (default) keeps the survivors running until
   the sweep's grace (60 s after the last stored record) has passed and then runs one last
   ``coordinator run --until-idle``, whose first tick sweeps; ``--settle direct`` (``--quick``)
   stops every replica first and then settles in-process with the sweep's own function
   (``settle_archives``), with no grace needed since no task instance can still be running.
   Every replica is stopped with SIGTERM.
4. **The table**, then details of every violation and orphan. Exit status 1 when any violation or
   orphan was found, the jobs did not all end, or a replica exited on its own or ignored SIGTERM.

Violations: a Succeeded job without published archives, with archives published twice, with a
published archive whose file is missing, or whose Spider job did not succeed; a Failed/Killed job
with published archives; a Killed job no operator asked to cancel; a job whose last history row
disagrees with its status (or a terminal job without history); an archive id published twice.
Orphans: embedded-engine jobs (``spider_engine_jobs``) not terminal or recorded on no compression
job (those still Ready whose registrar was SIGKILLed or crashed are listed apart as interrupted
registrations; none is tolerated); archive files that are not published; stored-archive records of
Failed/Killed jobs, or not ``published`` records of Succeeded jobs; scratch directories of task
instances (``coordinator.engine.tasks.scratch``) left in the staging directory of a replica whose
last process stopped cleanly (those of a replica SIGKILLed for good, the full soak's scale-down, are
counted as information: no engine starts on its staging directory again). Duplicate executions: two
instances of the same task of the same Spider job that both stored an archive (record ``stored`` or
``published``); those whose earlier instance ran in a replica process that was SIGKILLed (or
crashed) (told by the engine's instance ids, which start at the engine's start time in µs) are
re-executions after a kill.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

import zstandard
from sqlalchemy import Engine, create_engine, inspect, text
from sqlalchemy.engine import make_url

from coordinator.cli.samples import json_log_lines
from coordinator.config.loader import CoordinatorConfig, load_config
from coordinator.engine.embedded.engine import UNRECORDED_GRACE_SECS, UNRECORDED_REGISTRATION
from coordinator.engine.tasks.scratch import scratch_name
from coordinator.lifecycle import JobStatus
from coordinator.lifecycle.storage import state_of
from coordinator.runtime import INSTANCE_STALE_AFTER_SECS, archive_output_of
from coordinator.service.cleanup import settle_archives, terminal_jobs_with_stored_archives
from coordinator.service.crashpoints import CRASH_ENV, CRASH_EXIT_STATUS
from coordinator.service.ingest import submit_job
from coordinator.service.operator_cancel import request_cancel
from coordinator.store import migrate
from coordinator.store.database import create_database_engine
from coordinator.store.jobs import JobStore

DATASET = "default"
TERMINAL = (int(JobStatus.SUCCEEDED), int(JobStatus.FAILED), int(JobStatus.KILLED))
ENGINE_TERMINAL = ("Succeeded", "Failed", "Cancelled")
SWEEP_GRACE_SECS = 60.0
"""The coordinator's sweep settles records older than this (``SWEEP_INTERVAL_SECS``)."""
MONITOR_INTERVAL_SECS = 0.5
QUICK_UNRECORDED_GRACE_SECS = 5.0
"""The quick soak's ``coordinator.embedded_unrecorded_grace_secs`` (the engine's default: 60 s)."""
UNRECORDED_WAIT_MARGIN_SECS = 10.0
CRASHED_AT_REGISTRATION = "crash after RegisterJob"
"""How an incarnation ended that ``COORDINATOR_CRASH_AT=registered`` made exit."""
ABRUPT_ENDS = ("SIGKILL", CRASHED_AT_REGISTRATION)
"""Ends that leave everything as it was, with no clean-up (the process is simply gone)."""
STOP_TIMEOUT_SECS = 45.0
SETTLER_TIMEOUT_SECS = 180.0
DETAILS_SHOWN = 20


# --- options ----------------------------------------------------------------------------------


@dataclass
class Options:
    database: str
    replicas: int
    jobs: int
    kills: int
    cancels: int
    seed: int
    data_dir: Path | None
    timeout: float
    events_per_job: int
    max_concurrent_jobs: int
    workers: int
    restart_delay: tuple[float, float]
    kill_gap: float
    scale_down: str
    settle: str
    keep: bool
    quick: bool
    unrecorded_grace: float | None
    """``coordinator.embedded_unrecorded_grace_secs`` of every replica; ``None``: the default."""
    crash_at_registration: int


def parse_options(argv: list[str] | None) -> Options:
    parser = argparse.ArgumentParser(
        prog="python -m bench.soak", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--database", required=True, help="MariaDB/MySQL server URL (or database)")
    parser.add_argument("--replicas", type=int, default=None)
    parser.add_argument("--jobs", type=int, default=None)
    parser.add_argument("--kills", type=int, default=None, help="chaos kills (scale-down apart)")
    parser.add_argument("--cancels", type=int, default=None)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--data-dir", type=Path, default=None, help="default: a temporary one")
    parser.add_argument("--timeout", type=float, default=None, help="seconds to quiescence")
    parser.add_argument("--events-per-job", type=int, default=20, help="JSON lines per object")
    parser.add_argument("--max-concurrent-jobs", type=int, default=None, help="per replica")
    parser.add_argument("--workers", type=int, default=2, help="embedded workers per replica")
    parser.add_argument(
        "--restart-delay", type=float, nargs=2, default=None, metavar=("MIN", "MAX")
    )
    parser.add_argument("--kill-gap", type=float, default=None, help="min seconds between kills")
    parser.add_argument("--scale-down", choices=("kill", "term", "none"), default=None)
    parser.add_argument("--settle", choices=("sweep", "direct"), default=None)
    parser.add_argument("--keep", action="store_true", help="keep the database and data directory")
    parser.add_argument("--quick", action="store_true", help="2 replicas × 30 jobs × 3 kills")
    parser.add_argument(
        "--unrecorded-grace",
        type=float,
        default=None,
        metavar="SECS",
        help="the engines' grace before cancelling a gone replica's unrecorded registration "
        f"(default: {QUICK_UNRECORDED_GRACE_SECS:g} with --quick, else the engine's "
        f"{UNRECORDED_GRACE_SECS:g})",
    )
    parser.add_argument(
        "--crash-at-registration",
        type=int,
        default=0,
        metavar="N",
        help="the first N replica processes started die right after their first RegisterJob "
        "(default: 0)",
    )
    args = parser.parse_args(argv)
    quick = bool(args.quick)

    def pick(value: Any, full: Any, fast: Any) -> Any:
        return value if value is not None else (fast if quick else full)

    return Options(
        database=args.database,
        replicas=pick(args.replicas, 3, 2),
        jobs=pick(args.jobs, 1000, 30),
        kills=pick(args.kills, 20, 3),
        cancels=pick(args.cancels, 50, 5),
        seed=args.seed,
        data_dir=args.data_dir,
        timeout=pick(args.timeout, 900.0, 120.0),
        events_per_job=args.events_per_job,
        max_concurrent_jobs=pick(args.max_concurrent_jobs, 40, 8),
        workers=args.workers,
        restart_delay=tuple(pick(args.restart_delay, (0.5, 8.0), (0.2, 1.5))),
        kill_gap=pick(args.kill_gap, 1.0, 0.5),
        scale_down=pick(args.scale_down, "kill", "term"),
        settle=pick(args.settle, "sweep", "direct"),
        keep=bool(args.keep),
        quick=quick,
        unrecorded_grace=pick(args.unrecorded_grace, None, QUICK_UNRECORDED_GRACE_SECS),
        crash_at_registration=args.crash_at_registration,
    )


# --- set-up -----------------------------------------------------------------------------------


@dataclass
class Setup:
    url: str
    created_database: str | None
    server_url: str | None
    root: Path
    temporary_root: bool
    objects: Path
    archives: Path
    configs: dict[str, Path]
    config: CoordinatorConfig
    job_ids: list[int]


def create_database(server_or_database: str) -> tuple[str, str | None, str]:
    """The soak's database URL, the name of the database created (None: given), the server URL."""
    url = make_url(server_or_database)
    if url.database:
        return server_or_database, None, url.set(database="").render_as_string(False)
    name = f"soak_{uuid.uuid4().hex[:10]}"
    admin = create_engine(url)
    try:
        with admin.begin() as connection:
            connection.execute(text(f"CREATE DATABASE `{name}`"))
    finally:
        admin.dispose()
    return (
        url.set(database=name).render_as_string(hide_password=False),
        name,
        str(server_or_database),
    )


def drop_database(server: str, name: str) -> None:
    admin = create_engine(server)
    try:
        with admin.begin() as connection:
            connection.execute(text(f"DROP DATABASE IF EXISTS `{name}`"))
    finally:
        admin.dispose()


def replica_name(index: int) -> str:
    return f"soak-r{index}"


def write_config(path: Path, root: Path, name: str, options: Options) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "package: {storage_engine: clp-s}\n"
        "spider: {host: 127.0.0.1, port: 50051}\n"
        "compression_coordinator:\n"
        f"  max_concurrent_jobs: {options.max_concurrent_jobs}\n"
        "  job_polling_interval_millisecs: 100\n"
        "  result_polling: {init_backoff_millisecs: 100, max_backoff_millisecs: 500}\n"
        f"archive_output:\n  storage: {{type: fs, directory: {root / 'archives'}}}\n"
        f"logs_input: {{type: fs, directory: {root / 'objects'}}}\n"
        "coordinator:\n"
        "  engine: embedded\n"
        f"  instance_id: {name}\n"
        f"  data_dir: {root / 'replicas' / name}\n"
        f"  object_store_directory: {root / 'objects'}\n"
        f"  embedded_workers: {options.workers}\n"
        + (
            f"  embedded_unrecorded_grace_secs: {options.unrecorded_grace}\n"
            if options.unrecorded_grace is not None
            else ""
        )
    )


def set_up(options: Options) -> Setup:
    url, created, server = create_database(options.database)
    engine = create_database_engine(url)
    migrate.upgrade(engine)
    temporary = options.data_dir is None
    root = Path(tempfile.mkdtemp(prefix="soak-")) if temporary else options.data_dir
    assert root is not None
    root = root.absolute()
    root.mkdir(parents=True, exist_ok=True)
    configs = {}
    for index in range(options.replicas + 1):  # the last one is the settler's
        name = replica_name(index) if index < options.replicas else "soak-settler"
        configs[name] = root / "configs" / f"{name}.yaml"
        write_config(configs[name], root, name, options)
    os.environ.pop("COORDINATOR_HOME", None)
    os.environ["COORDINATOR_DATABASE_URL"] = url
    config = load_config(configs[replica_name(0)])
    job_ids = []
    for index in range(options.jobs):
        target = root / "objects" / "logs" / f"job{index:05d}" / "app.jsonl"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(
            json_log_lines(options.events_per_job, service=f"svc{index}", seed=options.seed)
        )
        job_ids.append(
            submit_job(config, engine, prefix=f"job{index:05d}/", timestamp_key="timestamp")
        )
    engine.dispose()
    return Setup(
        url=url,
        created_database=created,
        server_url=server,
        root=root,
        temporary_root=temporary,
        objects=root / "objects",
        archives=root / "archives",
        configs=configs,
        config=config,
        job_ids=job_ids,
    )


# --- replica processes ------------------------------------------------------------------------


@dataclass
class Incarnation:
    replica: str
    pid: int
    spawned: float
    ended: float | None = None
    how: str | None = None
    """``SIGKILL``, ``SIGTERM``, ``CRASHED_AT_REGISTRATION``, or ``exit N`` (it exited on its
    own)."""
    crash_at: str | None = None
    """The crash point armed in this incarnation (``$COORDINATOR_CRASH_AT``)."""


class Replica:
    def __init__(
        self, name: str, config: Path, log: Path, url: str, extra_args: tuple[str, ...] = ()
    ) -> None:
        self.name = name
        self.extra_args = extra_args
        self.config = config
        self.log_path = log
        self.url = url
        self.process: subprocess.Popen[bytes] | None = None
        self.current: Incarnation | None = None
        self.retired = False
        self.restart_at: float | None = None
        self.crash_at: str | None = None
        """A crash point to arm in the next incarnation only."""
        self._log: TextIO | None = None

    def environment(self) -> dict[str, str]:
        environment = {
            k: v
            for k, v in os.environ.items()
            if k not in ("COORDINATOR_HOME", "COORDINATOR_CRASH_AT", "COORDINATOR_DATABASE_URL")
        }
        environment["COORDINATOR_DATABASE_URL"] = self.url
        environment["PYTHONFAULTHANDLER"] = "1"  # SIGABRT dumps every thread's stack
        if self.crash_at is not None:
            environment[CRASH_ENV] = self.crash_at
        return environment

    def start(self) -> Incarnation:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        if self._log is None:
            self._log = self.log_path.open("a")
        self._log.write(f"=== soak: start at {time.time():.3f}\n")
        self._log.flush()
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "coordinator",
                "run",
                "--config",
                str(self.config),
                *self.extra_args,
            ],
            env=self.environment(),
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        self.current = Incarnation(self.name, self.process.pid, time.time(), crash_at=self.crash_at)
        self.restart_at, self.crash_at = None, None
        return self.current

    @property
    def up(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def exited_on_its_own(self) -> Incarnation | None:
        if self.process is None or self.process.poll() is None or self.current is None:
            return None
        incarnation = self.current
        returncode = self.process.returncode
        crashed = incarnation.crash_at == "registered" and returncode == CRASH_EXIT_STATUS
        incarnation.ended = time.time()
        incarnation.how = CRASHED_AT_REGISTRATION if crashed else f"exit {returncode}"
        self.process, self.current = None, None
        return incarnation

    def kill(self) -> Incarnation:
        assert self.process is not None and self.current is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()
        incarnation = self.current
        incarnation.ended, incarnation.how = time.time(), "SIGKILL"
        self.process, self.current = None, None
        return incarnation

    def terminate(self) -> tuple[Incarnation, bool]:
        """SIGTERM and wait; whether it stopped by itself (else it was SIGKILLed)."""
        assert self.process is not None and self.current is not None
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=STOP_TIMEOUT_SECS)
            stopped = True
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            stopped = False
        incarnation = self.current
        incarnation.ended = time.time()
        incarnation.how = "SIGTERM" if stopped else "SIGTERM ignored, SIGKILL"
        self.process, self.current = None, None
        return incarnation, stopped

    def close(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None


# --- the monitor ------------------------------------------------------------------------------


@dataclass
class SeenRecord:
    spider_job_id: int
    task_id: str
    instance_id: int
    job_id: int | None
    archive_id: str
    states: set[str] = field(default_factory=set)


class Monitor(threading.Thread):
    """Polls the stored-archive records and the coordinator instances while the soak runs."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(name="soak-monitor", daemon=True)
        self.engine = engine
        self.records: dict[int, SeenRecord] = {}
        self.instances: dict[str, tuple[str, int, float]] = {}
        """token → (name, pid, started_at as epoch seconds)."""
        self.first_owner: dict[int, str] = {}
        """Engine job → the owner it had when first seen (a restart's engine adopts a dead
        owner's Ready jobs, so the current owner may not be the process that registered it)."""
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.errors = 0

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.poll()
            except Exception:
                self.errors += 1
            self.stop.wait(MONITOR_INTERVAL_SECS)

    def poll(self) -> None:
        with self.engine.connect() as connection:
            records = connection.execute(
                text(
                    "SELECT id, spider_job_id, task_id, instance_id, job_id, archive_id, state "
                    "FROM compression_stored_archives"
                )
            ).all()
            instances = connection.execute(
                text(
                    "SELECT token, name, pid, started_at FROM coordinator_instances "
                    "WHERE kind = 'coordinator'"
                )
            ).all()
            engine_jobs = connection.execute(
                text("SELECT id, owner FROM spider_engine_jobs WHERE owner IS NOT NULL")
            ).all()
        with self.lock:
            for row in records:
                seen = self.records.get(row.id)
                if seen is None:
                    seen = self.records[row.id] = SeenRecord(
                        int(row.spider_job_id),
                        str(row.task_id),
                        int(row.instance_id),
                        row.job_id,
                        str(row.archive_id),
                    )
                seen.states.add(str(row.state))
                seen.job_id = seen.job_id if row.job_id is None else row.job_id
            for row in instances:
                self.instances[row.token] = (row.name, int(row.pid), epoch(row.started_at))
            for row in engine_jobs:
                self.first_owner.setdefault(int(row.id), str(row.owner))


def epoch(value: datetime) -> float:
    return value.replace(tzinfo=UTC).timestamp()


# --- the chaos loop ---------------------------------------------------------------------------


@dataclass
class CancelRequest:
    job_id: int
    at_status: str
    outcome: str


@dataclass
class Chaos:
    kills: int = 0
    registration_crashes: int = 0
    restarts: int = 0
    scale_down: str | None = None
    unexpected_exits: list[Incarnation] = field(default_factory=list)
    incarnations: list[Incarnation] = field(default_factory=list)
    cancels: list[CancelRequest] = field(default_factory=list)
    quiescent_after: float | None = None
    started: float = 0.0


def thresholds(rng: random.Random, count: int, jobs: int, low: float, high: float) -> list[int]:
    return sorted(int(rng.uniform(low, high) * jobs) for _ in range(count))


def registered_pids(loop: ChaosLoop) -> set[int]:
    """The pids of the replica processes that have registered their coordinator instance."""
    with loop.engine.connect() as connection:
        rows = connection.execute(
            text("SELECT pid FROM coordinator_instances WHERE kind = 'coordinator'")
        ).all()
    return {int(row.pid) for row in rows}


def unrecorded_ready_jobs(engine: Engine) -> list[int]:
    """Ready engine jobs no compression job records (an interrupted registration, or one whose
    record is under way)."""
    with engine.connect() as connection:
        rows = connection.execute(
            text(
                "SELECT id FROM spider_engine_jobs WHERE state = 'Ready' AND id NOT IN "
                "(SELECT spider_id FROM compression_jobs WHERE spider_id IS NOT NULL)"
            )
        ).all()
    return [int(row.id) for row in rows]


def count_terminal(engine: Engine) -> int:
    with engine.connect() as connection:
        return int(
            connection.execute(
                text(f"SELECT COUNT(*) FROM compression_jobs WHERE status IN {TERMINAL}")
            ).scalar_one()
        )


def unfinished_jobs(engine: Engine) -> list[tuple[int, int]]:
    with engine.connect() as connection:
        rows = connection.execute(
            text(f"SELECT id, status FROM compression_jobs WHERE status NOT IN {TERMINAL}")
        ).all()
    return [(int(row.id), int(row.status)) for row in rows]


class ChaosLoop:
    def __init__(
        self, options: Options, setup: Setup, replicas: list[Replica], engine: Engine
    ) -> None:
        self.options = options
        self.setup = setup
        self.replicas = replicas
        self.engine = engine
        self.store = JobStore(engine)
        self.rng = random.Random(options.seed)
        self.result = Chaos()
        jobs = options.jobs
        self.kill_at = thresholds(self.rng, options.kills, jobs, 0.02, 0.85)
        self.cancel_at = thresholds(self.rng, options.cancels, jobs, 0.0, 0.8)
        self.scale_down_at = int(self.rng.uniform(0.15, 0.45) * jobs)
        self.cancelled: set[int] = set()
        self.last_kill = 0.0
        self.crashes_to_arm = options.crash_at_registration

    def start(self, replica: Replica) -> None:
        if self.crashes_to_arm > 0:
            self.crashes_to_arm -= 1
            replica.crash_at = "registered"
        self.result.incarnations.append(replica.start())

    def ended(self, incarnation: Incarnation) -> None:
        """An incarnation armed to crash that ended otherwise (killed before its first
        RegisterJob, say): the next start is armed instead."""
        if incarnation.crash_at is not None and incarnation.how != CRASHED_AT_REGISTRATION:
            self.crashes_to_arm += 1

    def run(self) -> Chaos:
        result = self.result
        result.started = time.monotonic()
        for replica in self.replicas:
            self.start(replica)
        deadline = result.started + self.options.timeout
        while time.monotonic() < deadline:
            now = time.monotonic()
            self._restarts(now)
            done = count_terminal(self.engine)
            if done >= self.options.jobs:
                result.quiescent_after = now - result.started
                break
            if self.options.scale_down != "none" and result.scale_down is None:
                self._maybe_scale_down(done)
            self._maybe_kill(done, now)
            while len(result.cancels) < self.options.cancels and (
                done >= self.cancel_at[len(result.cancels)]
            ):
                self._cancel()
            time.sleep(0.1)
        return result

    def _restarts(self, now: float) -> None:
        for replica in self.replicas:
            exited = replica.exited_on_its_own()
            if exited is not None and exited.how == CRASHED_AT_REGISTRATION:
                self.result.registration_crashes += 1
                if not replica.retired:
                    replica.restart_at = now  # as a supervisor would; the kills have delays
            elif exited is not None:
                self.ended(exited)
                self.result.unexpected_exits.append(exited)
                if not replica.retired:
                    replica.restart_at = now + 1.0
            if replica.retired or replica.up or replica.restart_at is None:
                continue
            if now >= replica.restart_at:
                self.start(replica)
                self.result.restarts += 1

    def wait_out_unrecorded(self) -> str:
        """Keep the replicas running (restarted when due) until no engine job is Ready without a
        compression job recording it, for at most the grace, the heartbeat expiry and a margin;
        what happened, for the table."""
        grace = self.options.unrecorded_grace or UNRECORDED_GRACE_SECS
        limit = grace + INSTANCE_STALE_AFTER_SECS + UNRECORDED_WAIT_MARGIN_SECS
        began = time.monotonic()
        first: list[int] | None = None
        while True:
            self._restarts(time.monotonic())
            pending = unrecorded_ready_jobs(self.engine)
            first = pending if first is None else first
            waited = time.monotonic() - began
            if not pending:
                return f"{len(first)} at quiescence, none after {waited:.1f} s (grace {grace:g} s)"
            if waited > limit:
                return f"{len(pending)} still Ready after {waited:.0f} s (grace {grace:g} s)"
            time.sleep(0.2)

    def _live(self) -> list[Replica]:
        return [r for r in self.replicas if r.up and not r.retired]

    def _maybe_kill(self, done: int, now: float) -> None:
        result = self.result
        if result.kills >= len(self.kill_at) or now - self.last_kill < self.options.kill_gap:
            return
        # Progress paces the kills; a long stall (replicas waiting on leases) does not stop them.
        if done < self.kill_at[result.kills] and now - self.last_kill < 30.0:
            return
        live = self._live()
        if not live:
            return
        victim = self.rng.choice(live)
        self.ended(victim.kill())
        result.kills += 1
        self.last_kill = now
        low, high = self.options.restart_delay
        victim.restart_at = now + self.rng.uniform(low, high)

    def _maybe_scale_down(self, done: int) -> None:
        # Only a replica that has registered since it started: one stopped before it took its
        # killed predecessor's leases over would leave them to expire (30 s), which the kills
        # and the SIGKILL scale-down already cover.
        live = [r for r in self._live() if r.process and r.process.pid in registered_pids(self)]
        if done < self.scale_down_at or len(self.replicas) < 2 or not live:
            return
        victim = self.rng.choice(live)
        victim.retired = True
        if self.options.scale_down == "kill":
            incarnation = victim.kill()
        else:
            incarnation, _ = victim.terminate()
        self.ended(incarnation)
        self.result.scale_down = (
            f"{victim.name} ({incarnation.how}) at {done}/{self.options.jobs} jobs done, "
            f"{time.monotonic() - self.result.started:.0f} s in"
        )

    def _cancel(self) -> None:
        candidates = [(j, s) for j, s in unfinished_jobs(self.engine) if j not in self.cancelled]
        if candidates and self.rng.random() < 0.9:
            job_id, status = self.rng.choice(candidates)
            at = JobStatus(status).label
        else:
            job_id = self.rng.choice(self.setup.job_ids)
            at = "any"
        self.cancelled.add(job_id)
        try:
            outcome = request_cancel(self.store, job_id, "soak-operator").message
        except Exception as error:
            outcome = f"error: {type(error).__name__}: {error}"
        self.result.cancels.append(CancelRequest(job_id, at, outcome))


# --- settling and stopping --------------------------------------------------------------------


def last_record_time(engine: Engine) -> float | None:
    with engine.connect() as connection:
        value = connection.execute(
            text("SELECT MAX(stored_at) FROM compression_stored_archives")
        ).scalar_one()
    return None if value is None else epoch(value)


def stop_all(replicas: list[Replica], problems: list[str], chaos: Chaos) -> None:
    for replica in replicas:
        exited = replica.exited_on_its_own()
        if exited is not None and exited.how == CRASHED_AT_REGISTRATION:
            chaos.registration_crashes += 1
        elif exited is not None:
            chaos.unexpected_exits.append(exited)
        if replica.up:
            incarnation, stopped = replica.terminate()
            if not stopped:
                problems.append(f"{replica.name} (pid {incarnation.pid}) ignored SIGTERM")
        replica.close()


def settle_by_sweep(
    setup: Setup, engine: Engine, problems: list[str], timeout: float = SETTLER_TIMEOUT_SECS
) -> str:
    """Survivors run until the grace passed; then one ``run --until-idle`` sweeps (its first tick
    does). If it does not return, its threads' stacks are dumped into its log (SIGABRT with
    faulthandler on) before it is killed, and that is a problem."""
    last = last_record_time(engine)
    if last is not None:
        wait = last + SWEEP_GRACE_SECS + 2.0 - time.time()
        if wait > 0:
            print(f"soak: waiting {wait:.0f} s for the sweep's grace period", flush=True)
            time.sleep(wait)
    log = setup.root / "logs" / "soak-settler.log"
    settler = Replica(
        "soak-settler", setup.configs["soak-settler"], log, setup.url, ("--until-idle",)
    )
    settler.start()
    process = settler.process
    assert process is not None
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGABRT)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            settler.kill()
        settler.close()
        problems.append(
            f"the last `coordinator run --until-idle` did not return within {timeout:.0f} s "
            f"(every job terminal); its thread stacks are in {log}"
        )
        return f"the last run --until-idle did not return within {timeout:.0f} s"
    settler.close()
    return f"last run --until-idle exited {process.returncode}"


def settle_directly(setup: Setup, engine: Engine) -> str:
    """What the sweep does, without its grace: no task instance runs any more."""
    output = archive_output_of(setup.config)
    future = datetime(9999, 1, 1)
    jobs = terminal_jobs_with_stored_archives(engine, future)
    for job_id in jobs:
        settle_archives(engine, job_id, output)
    return f"settled {len(jobs)} job(s) in-process with settle_archives"


# --- checks -----------------------------------------------------------------------------------


@dataclass
class Findings:
    statuses: Counter[str] = field(default_factory=Counter)
    violations: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    orphans: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    failed_messages: Counter[str] = field(default_factory=Counter)
    unfinished: list[str] = field(default_factory=list)
    duplicates: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    tasks_with_several_instances: int = 0
    registrations_cancelled: int = 0
    """Engine jobs an engine cancelled as interrupted registrations (not orphans: resolved)."""
    archives_published: int = 0
    scratch_of_killed: int = 0
    """Scratch directories left in the staging directory of a replica whose last process was
    killed (no engine has started on that staging directory since, so nothing removed them)."""
    final: dict[int, str] = field(default_factory=dict)
    errors: Counter[str] = field(default_factory=Counter)
    """ERROR lines of the replicas' logs (information)."""
    """Each job's final state."""


VIOLATION_KINDS = (
    "Succeeded without published archives",
    "Succeeded with archives published twice",
    "Succeeded with a published archive file missing",
    "Succeeded but its Spider job did not succeed",
    "Failed/Killed with published archives",
    "Killed without a cancel request",
    "last history row disagrees with status",
    "archive id published twice",
)
INTERRUPTED_REGISTRATIONS = "interrupted registrations (Ready, unrecorded, registrar killed)"
SCRATCH_LEFT = "scratch directories of replicas stopped cleanly"
ORPHAN_KINDS = (
    INTERRUPTED_REGISTRATIONS,
    "engine jobs not terminal",
    "engine jobs recorded on no compression job",
    "archive files not published",
    "records of Failed/Killed jobs",
    "records of Succeeded jobs not published",
    SCRATCH_LEFT,
)
DUPLICATE_KINDS = ("re-executions after a kill", "re-executions after a stop", "other duplicates")


def fetch(connection: Any, sql: str) -> list[Any]:
    return list(connection.execute(text(sql)).all())


def check(setup: Setup, engine: Engine, monitor: Monitor, chaos: Chaos) -> Findings:
    findings = Findings()
    with engine.connect() as connection:
        jobs = fetch(
            connection,
            "SELECT id, status, committed_at, spider_id, status_msg, cancel_requested_at, "
            "lease_owner FROM compression_jobs ORDER BY id",
        )
        history = fetch(
            connection,
            "SELECT job_id, to_status, `trigger`, actor_id FROM compression_job_transitions "
            "ORDER BY job_id, id",
        )
        has_archives = inspect(connection).has_table(f"clp_{DATASET}_archives")
        archives = (
            fetch(connection, f"SELECT id, creator_id, creation_ix FROM clp_{DATASET}_archives")
            if has_archives
            else []
        )
        records = fetch(
            connection,
            "SELECT id, spider_job_id, task_id, instance_id, job_id, archive_id, state, location "
            "FROM compression_stored_archives",
        )
        engine_jobs = fetch(
            connection,
            "SELECT id, state, owner, created_at, inputs, error_message FROM spider_engine_jobs "
            "ORDER BY id",
        )
    by_job: dict[int, list[Any]] = defaultdict(list)
    for row in history:
        by_job[int(row.job_id)].append(row)
    check_jobs(
        findings,
        setup=setup,
        jobs=jobs,
        history=by_job,
        archives=archives,
        engine_jobs=engine_jobs,
    )
    check_archives(findings, setup, jobs, archives, records)
    check_engine_jobs(
        findings, setup=setup, jobs=jobs, engine_jobs=engine_jobs, monitor=monitor, chaos=chaos
    )
    check_duplicates(findings, monitor, records, chaos)
    for log in sorted((setup.root / "logs").glob("*.log")):
        for line in log.read_text(errors="replace").splitlines():
            if " ERROR " in line or " CRITICAL " in line:
                findings.errors[f"{log.stem}: {line.split(' ', 3)[-1][:200]}"] += 1
    check_scratch(findings, setup, chaos)
    return findings


def check_scratch(findings: Findings, setup: Setup, chaos: Chaos) -> None:
    """Scratch directories of task instances left in the replicas' staging directories: orphans
    when the replica's last process stopped cleanly (its engine removes them when it closes, and
    when it starts after a kill), else information."""
    last = {incarnation.replica: incarnation for incarnation in chaos.incarnations}
    for data_dir in sorted((setup.root / "replicas").glob("*")):
        staging = data_dir / "staging"
        if not staging.is_dir():
            continue
        ended = last.get(data_dir.name)  # the settler has none: its run ended by itself
        clean = ended is None or ended.how == "SIGTERM"
        for path in sorted(staging.iterdir()):
            # Under its making name too: one whose maker was killed as well.
            if not (scratch_name(path.name) and path.is_dir()):
                continue
            if not clean:
                findings.scratch_of_killed += 1
                continue
            size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
            findings.orphans[SCRATCH_LEFT].append(f"{data_dir.name}: {path.name} ({size} B)")


def check_jobs(
    findings: Findings,
    *,
    setup: Setup,
    jobs: list[Any],
    history: dict[int, list[Any]],
    archives: list[Any],
    engine_jobs: list[Any],
) -> None:
    by_creator: dict[str, list[Any]] = defaultdict(list)
    for row in archives:
        by_creator[str(row.creator_id)].append(row)
    engine_state = {int(row.id): str(row.state) for row in engine_jobs}
    violations = findings.violations
    for job in jobs:
        state = state_of(int(job.status), job.committed_at)
        findings.statuses[state.label] += 1
        findings.final[int(job.id)] = state.label
        where = f"job {job.id} (spider {job.spider_id})"
        if not state.is_terminal:
            findings.unfinished.append(f"{where}: {state.label}, lease {job.lease_owner}")
        published = by_creator.get(str(job.spider_id), []) if job.spider_id is not None else []
        moves = history.get(int(job.id), [])
        if not moves:
            if state is not JobStatus.PENDING:
                violations["last history row disagrees with status"].append(
                    f"{where}: {state.label} without any history row"
                )
        elif JobStatus(int(moves[-1].to_status)) is not state:
            violations["last history row disagrees with status"].append(
                f"{where}: status {state.label}, last history row → "
                f"{JobStatus(int(moves[-1].to_status)).label} ({moves[-1].trigger} by "
                f"{moves[-1].actor_id})"
            )
        if state is JobStatus.SUCCEEDED:
            check_succeeded(
                findings,
                setup=setup,
                job=job,
                where=where,
                published=published,
                moves=moves,
                engine_state=engine_state,
            )
        elif state in (JobStatus.FAILED, JobStatus.KILLED):
            if published:
                violations["Failed/Killed with published archives"].append(
                    f"{where}: {state.label} ({job.status_msg!r}) with "
                    f"{len(published)} archive row(s): {[r.id for r in published]}"
                )
            if state is JobStatus.FAILED:
                findings.failed_messages[str(job.status_msg)[:120]] += 1
            if state is JobStatus.KILLED and job.cancel_requested_at is None:
                violations["Killed without a cancel request"].append(
                    f"{where}: {job.status_msg!r}, history "
                    f"{[(m.trigger, m.actor_id) for m in moves]}"
                )


def check_succeeded(
    findings: Findings,
    *,
    setup: Setup,
    job: Any,
    where: str,
    published: list[Any],
    moves: list[Any],
    engine_state: dict[int, str],
) -> None:
    violations = findings.violations
    if not published:
        violations["Succeeded without published archives"].append(where)
    indexes = Counter(int(row.creation_ix) for row in published)
    commits = sum(1 for move in moves if move.trigger == "committed")
    if any(count > 1 for count in indexes.values()) or commits > 1:
        violations["Succeeded with archives published twice"].append(
            f"{where}: archives {sorted((r.creation_ix, r.id) for r in published)}, "
            f"{commits} commit(s) in its history"
        )
    for row in published:
        if not (setup.archives / DATASET / str(row.id)).is_file():
            violations["Succeeded with a published archive file missing"].append(
                f"{where}: {setup.archives / DATASET / str(row.id)}"
            )
    spider_state = engine_state.get(int(job.spider_id))
    if spider_state != "Succeeded":
        violations["Succeeded but its Spider job did not succeed"].append(
            f"{where}: engine job {spider_state}"
        )


def check_archives(
    findings: Findings, setup: Setup, jobs: list[Any], archives: list[Any], records: list[Any]
) -> None:
    findings.archives_published = len(archives)
    ids = Counter(str(row.id) for row in archives)
    published_records: dict[str, set[int]] = defaultdict(set)
    for record in records:
        if record.state == "published" and record.job_id is not None:
            published_records[str(record.archive_id)].add(int(record.job_id))
    for archive_id, count in ids.items():
        if count > 1:
            findings.violations["archive id published twice"].append(f"{archive_id}: {count} rows")
    for archive_id, owners in published_records.items():
        if len(owners) > 1:
            findings.violations["archive id published twice"].append(
                f"{archive_id}: published records of jobs {sorted(owners)}"
            )
    status = {int(job.id): state_of(int(job.status), job.committed_at) for job in jobs}
    record_of = {str(r.archive_id): r for r in records}
    for path in sorted(setup.archives.rglob("*")):
        if not path.is_file():
            continue
        name = path.name
        archive_id = name[1:-4] if name.startswith(".") and name.endswith(".tmp") else name
        if name == archive_id and archive_id in ids:
            continue
        record = record_of.get(archive_id)
        about = (
            f"record: job {record.job_id} ({status.get(record.job_id, JobStatus.PENDING).label}), "
            f"spider {record.spider_job_id}, task {record.task_id}, instance {record.instance_id}, "
            f"state {record.state}"
            if record is not None
            else "no record"
        )
        findings.orphans["archive files not published"].append(
            f"{path.relative_to(setup.archives)} ({path.stat().st_size} B; {about})"
        )
    for record in records:
        job_status = status.get(int(record.job_id)) if record.job_id is not None else None
        line = (
            f"record {record.id}: job {record.job_id} ({job_status and job_status.label}), "
            f"spider {record.spider_job_id}, task {record.task_id}, instance "
            f"{record.instance_id}, archive {record.archive_id}, state {record.state}"
        )
        if job_status in (JobStatus.FAILED, JobStatus.KILLED):
            findings.orphans["records of Failed/Killed jobs"].append(line)
        elif job_status is JobStatus.SUCCEEDED and record.state != "published":
            findings.orphans["records of Succeeded jobs not published"].append(line)


def check_engine_jobs(
    findings: Findings,
    *,
    setup: Setup,
    jobs: list[Any],
    engine_jobs: list[Any],
    monitor: Monitor,
    chaos: Chaos,
) -> None:
    recorded = {int(job.spider_id): job for job in jobs if job.spider_id is not None}
    by_id = {int(job.id): job for job in jobs}
    with monitor.lock:
        owners = dict(monitor.instances)
        first_owner = dict(monitor.first_owner)
    how_ended = {inc.pid: inc for inc in chaos.incarnations}
    for row in engine_jobs:
        job = recorded.get(int(row.id))
        registrar_token = first_owner.get(int(row.id), str(row.owner))
        owner = owners.get(registrar_token)
        ended = how_ended.get(owner[1]) if owner else None
        registrar = (
            f"{owner[0]} pid {owner[1]}, {ended.how if ended and ended.how else 'alive'}"
            if owner
            else "an unknown process"
        )
        about = (
            f"engine job {row.id} {row.state}, created {row.created_at} by {registrar_token} "
            f"({registrar}), owner now {row.owner}"
        )
        if job is not None:
            about += f"; job {job.id} {state_of(int(job.status), job.committed_at).label}"
        else:
            about += f"; recorded on no compression job; {registered_for(setup, row, by_id)}"
        interrupted = (
            job is None and row.state == "Ready" and ended is not None and ended.how in ABRUPT_ENDS
        )
        if interrupted:
            findings.orphans[INTERRUPTED_REGISTRATIONS].append(about)
            continue
        cancelled = row.state == "Cancelled" and row.error_message == UNRECORDED_REGISTRATION
        if job is None and cancelled:
            findings.registrations_cancelled += 1  # resolved: it never ran, nothing is left
            continue
        if row.state not in ENGINE_TERMINAL:
            findings.orphans["engine jobs not terminal"].append(about)
        if job is None:
            findings.orphans["engine jobs recorded on no compression job"].append(about)


def registered_for(setup: Setup, row: Any, jobs: dict[int, Any]) -> str:
    """Which compression job an unrecorded engine job was registered for, from its inputs (the
    object key names the job's prefix)."""
    data = bytes(row.inputs or b"")
    with contextlib.suppress(zstandard.ZstdError):
        data = zstandard.ZstdDecompressor().decompress(data, max_output_size=1 << 24)
    found = re.search(rb"job(\d{5})/", data)
    if found is None:
        return "its inputs name no soak job"
    index = int(found.group(1))
    job = jobs.get(setup.job_ids[index]) if index < len(setup.job_ids) else None
    if job is None:
        return f"its inputs name object prefix job{index:05d}/ (no such job)"
    return (
        f"registered for job {job.id} (prefix job{index:05d}/), which records Spider job "
        f"{job.spider_id} and is {state_of(int(job.status), job.committed_at).label}"
    )


def check_duplicates(
    findings: Findings, monitor: Monitor, records: list[Any], chaos: Chaos
) -> None:
    with monitor.lock:
        seen = dict(monitor.records)
        instances = dict(monitor.instances)
    for record in records:  # the final state too (the monitor may have stopped before it)
        entry = seen.setdefault(
            int(record.id),
            SeenRecord(
                int(record.spider_job_id),
                str(record.task_id),
                int(record.instance_id),
                record.job_id,
                str(record.archive_id),
            ),
        )
        entry.states.add(str(record.state))
    tasks: dict[tuple[int, str], dict[int, bool]] = defaultdict(dict)
    for entry in seen.values():
        did_store = bool(entry.states & {"stored", "published"})
        key = (entry.spider_job_id, entry.task_id)
        tasks[key][entry.instance_id] = tasks[key].get(entry.instance_id, False) or did_store
    how_ended = {inc.pid: inc for inc in chaos.incarnations}
    starts = sorted((start, pid, name) for name, pid, start in instances.values())
    for (spider_job, task), by_instance in sorted(tasks.items()):
        if len(by_instance) > 1:
            findings.tasks_with_several_instances += 1
        stored = sorted(i for i, ok in by_instance.items() if ok)
        for first, second in itertools.pairwise(stored):
            one, two = attribute(first, starts), attribute(second, starts)
            ended = how_ended.get(one[1]) if one else None
            kind = "other duplicates"
            if one is not None and two is not None and one != two and ended is not None:
                if ended.how in ABRUPT_ENDS:
                    kind = "re-executions after a kill"
                elif ended.how and ended.how.startswith("SIGTERM"):
                    kind = "re-executions after a stop"
            findings.duplicates[kind].append(
                f"spider job {spider_job} task {task}: instances {first} "
                f"({describe(one, how_ended)}) and {second} ({describe(two, how_ended)})"
            )


def attribute(
    instance_id: int, starts: list[tuple[float, int, str]]
) -> tuple[float, int, str] | None:
    """The coordinator process whose engine made ``instance_id`` (its counter starts at its start
    time in µs, after the process registered)."""
    moment = instance_id / 1e6
    found = None
    for start in starts:
        if start[0] <= moment + 0.5:
            found = start
    return found


def describe(incarnation: tuple[float, int, str] | None, how_ended: dict[int, Incarnation]) -> str:
    if incarnation is None:
        return "process unknown"
    ended = how_ended.get(incarnation[1])
    return f"{incarnation[2]} pid {incarnation[1]}, {ended.how if ended and ended.how else 'alive'}"


# --- the report -------------------------------------------------------------------------------


def report(
    options: Options,
    *,
    setup: Setup,
    chaos: Chaos,
    findings: Findings,
    notes: dict[str, str],
    problems: list[str],
) -> bool:
    """Print the table and the details; whether the soak passed."""
    violations = sum(len(findings.violations[k]) for k in VIOLATION_KINDS)
    orphans = sum(len(findings.orphans[k]) for k in ORPHAN_KINDS)
    duplicates = sum(len(findings.duplicates[k]) for k in DUPLICATE_KINDS)
    ends = Counter(findings.final.get(c.job_id, "?") for c in chaos.cancels)
    already = sum(1 for c in chaos.cancels if "already" in c.outcome)
    rows: list[tuple[str, str]] = [
        ("replicas × jobs", f"{options.replicas} × {options.jobs} (seed {options.seed})"),
        ("jobs", str(sum(findings.statuses.values()))),
    ]
    rows += [(f"  {s}", str(findings.statuses[s])) for s in ("Succeeded", "Failed", "Killed")]
    rows += [
        (f"  {s} (not terminal)", str(n))
        for s, n in findings.statuses.items()
        if s not in ("Succeeded", "Failed", "Killed")
    ]
    shortfall = "" if chaos.kills >= options.kills else f" (target {options.kills} not reached)"
    rows += [
        ("kills (SIGKILL)", f"{chaos.kills}{shortfall}"),
        ("crashes after RegisterJob", str(chaos.registration_crashes)),
        ("interrupted registrations cancelled", str(findings.registrations_cancelled)),
        ("scale-down", chaos.scale_down or "none"),
        ("restarts", str(chaos.restarts)),
        ("replica exits on their own", str(len(chaos.unexpected_exits))),
        (
            "cancels requested / honoured",
            f"{len(chaos.cancels)} / {ends['Killed']} (not: {ends['Succeeded']} Succeeded, "
            f"{ends['Failed']} Failed; {already} already terminal when asked)",
        ),
        (
            "time to quiescence",
            f"{chaos.quiescent_after:.1f} s"
            if chaos.quiescent_after is not None
            else "NOT REACHED",
        ),
        ("unrecorded registrations", notes.get("unrecorded", "not waited for")),
        ("settling", notes.get("settle", "")),
        ("archives published", str(findings.archives_published)),
        ("violations", str(violations)),
    ]
    rows += [(f"  {k}", str(len(findings.violations[k]))) for k in VIOLATION_KINDS]
    rows += [("orphans", str(orphans))]
    rows += [(f"  {k}", str(len(findings.orphans[k]))) for k in ORPHAN_KINDS]
    rows += [("duplicate executions", str(duplicates))]
    rows += [(f"  {k}", str(len(findings.duplicates[k]))) for k in DUPLICATE_KINDS]
    rows += [
        ("tasks run by several instances", str(findings.tasks_with_several_instances)),
        ("scratch directories of replicas killed for good (info)", str(findings.scratch_of_killed)),
        ("ERROR log lines (info)", str(sum(findings.errors.values()))),
    ]
    width = max(len(name) for name, _ in rows)
    print()
    print("SOAK RESULTS")
    print(f"{'-' * width}--{'-' * 40}")
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    print(f"{'-' * width}--{'-' * 40}")
    details(findings, chaos)
    passed = violations == 0 and orphans == 0 and not findings.unfinished
    passed = passed and not chaos.unexpected_exits and not problems
    for problem in problems:
        print(f"problem: {problem}")
    print(f"soak: {'PASSED' if passed else 'FAILED'}", flush=True)
    return passed


def details(findings: Findings, chaos: Chaos) -> None:
    sections: list[tuple[str, list[str]]] = []
    sections += [(f"VIOLATION {k}", findings.violations[k]) for k in VIOLATION_KINDS]
    sections += [(f"ORPHAN {k}", findings.orphans[k]) for k in ORPHAN_KINDS]
    sections += [(f"DUPLICATE {k}", findings.duplicates[k]) for k in DUPLICATE_KINDS]
    sections += [("NOT TERMINAL", findings.unfinished)]
    sections += [
        (
            "REPLICA EXITED ON ITS OWN",
            [f"{i.replica} pid {i.pid}: {i.how}" for i in chaos.unexpected_exits],
        ),
        ("FAILED JOBS by status_msg", [f"{n} × {m}" for m, n in findings.failed_messages.items()]),
        ("ERROR LOG LINES", [f"{n} × {m}" for m, n in findings.errors.most_common()]),
    ]
    for title, lines in sections:
        if not lines:
            continue
        print(f"{title} ({len(lines)}):")
        for line in lines[:DETAILS_SHOWN]:
            print(f"  {line}")
        if len(lines) > DETAILS_SHOWN:
            print(f"  … and {len(lines) - DETAILS_SHOWN} more")


# --- main -------------------------------------------------------------------------------------


@dataclass
class Run:
    setup: Setup
    replicas: list[Replica]
    engine: Engine
    monitor: Monitor


def soak(options: Options) -> bool:
    began = time.monotonic()
    setup = set_up(options)
    print(
        f"soak: {options.jobs} jobs submitted in {time.monotonic() - began:.1f} s; "
        f"data in {setup.root}",
        flush=True,
    )
    engine = create_database_engine(setup.url, pool_size=4)
    replicas = [
        Replica(
            replica_name(i),
            setup.configs[replica_name(i)],
            setup.root / "logs" / f"{replica_name(i)}.log",
            setup.url,
        )
        for i in range(options.replicas)
    ]
    monitor = Monitor(engine)
    monitor.start()
    problems: list[str] = []
    notes: dict[str, str] = {}
    try:
        loop = ChaosLoop(options, setup, replicas, engine)
        chaos = loop.run()
        print(
            f"soak: chaos done ({chaos.kills} kills, {len(chaos.cancels)} cancels); "
            f"quiescent after {chaos.quiescent_after}",
            flush=True,
        )
        if chaos.quiescent_after is not None:
            notes["unrecorded"] = loop.wait_out_unrecorded()
        settle_began = time.monotonic()
        if options.settle == "sweep" and chaos.quiescent_after is not None:
            notes["settle"] = settle_by_sweep(setup, engine, problems)
            stop_all(replicas, problems, chaos)
        else:
            stop_all(replicas, problems, chaos)
            notes["settle"] = settle_directly(setup, engine)
        notes["settle"] += f" ({time.monotonic() - settle_began:.0f} s)"
    finally:
        for replica in replicas:
            if replica.up:
                replica.kill()
            replica.close()
        monitor.stop.set()
        monitor.join(timeout=5)
    findings = check(setup, engine, monitor, chaos)
    passed = report(
        options, setup=setup, chaos=chaos, findings=findings, notes=notes, problems=problems
    )
    engine.dispose()
    if not passed or options.keep:
        print(f"soak: kept {setup.root} and database {make_url(setup.url).database}", flush=True)
    else:
        cleanup(setup)
    return passed


def cleanup(setup: Setup) -> None:
    if setup.created_database is not None and setup.server_url is not None:
        drop_database(setup.server_url, setup.created_database)
    if setup.temporary_root:
        shutil.rmtree(setup.root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    options = parse_options(argv)
    return 0 if soak(options) else 1


if __name__ == "__main__":
    sys.exit(main())
