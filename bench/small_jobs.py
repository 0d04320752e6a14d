"""Small jobs: N one-object jobs through ``coordinator run --until-idle`` against N bare clp-s runs.

    .venv/bin/python -m bench.small_jobs [--jobs 200] [--events 20] [--workers W]
        [--database URL] [--data-dir DIR] [--profile DIR] [--repeat R]

What it does (issue 14, the per-job overhead):

1. **Its own data.** A fresh data directory (``--data-dir``, else a temporary one) for the
   embedded default (no configuration file); N generated JSON-lines objects of ``--events``
   lines each (deterministic), each submitted as its own job the way log-ingestor does
   (``submit_job``).
   ``--database URL`` (a MariaDB server URL, like ``bench.soak``'s) runs on a fresh database
   ``small_<random>`` there instead of the data directory's SQLite file; it is dropped at the end.
2. **The floor.** The same N objects compressed by N bare ``clp-s`` runs with the compress task's
   arguments, ``W`` at a time (``--workers``, default: the CPU count, which is also the embedded
   default's number of executors).
3. **The coordinator.** ``coordinator run --until-idle --data-dir DIR`` (a subprocess, as a user
   runs it, start-up included), timed until it exits; every job must end
   Succeeded. ``--repeat R`` submits and runs the jobs R times (the floor too) and prints each run.
4. **One line per run**: jobs/s of each, the ratio (the coordinator's wall time over the
   floor's), and the CPU time per job of each (user + system of the processes and their
   children: steadier than wall time on a shared machine).

``--profile DIR`` runs the coordinator under ``py-spy record`` (``--subprocesses``, raw folded
stacks per process in ``DIR``) when ``py-spy`` is on ``PATH`` or ``$PY_SPY``; without it, with
cProfile in-process on the loop's thread (``DIR/loop.prof``). ``docs/performance.md`` reads them.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import create_engine, select, text
from sqlalchemy.engine import make_url

from bench.suite import children_cpu, run_clp_s
from coordinator.cli.samples import json_log_lines
from coordinator.config.loader import CoordinatorConfig, database_url, load_config
from coordinator.service.ingest import submit_job
from coordinator.store import migrate
from coordinator.store.database import create_database_engine
from coordinator.store.schema import compression_jobs

SUCCEEDED = 2


@dataclass(frozen=True)
class Options:
    jobs: int
    events: int
    workers: int
    database: str | None
    data_dir: Path | None
    profile: Path | None
    repeat: int


def parse_options(argv: list[str] | None) -> Options:
    parser = argparse.ArgumentParser(prog="python -m bench.small_jobs", description=__doc__)
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--events", type=int, default=20, help="JSON lines per object")
    parser.add_argument(
        "--workers", type=int, default=os.cpu_count() or 1, help="the floor's parallelism"
    )
    parser.add_argument("--database", default=None, help="a MariaDB server URL (default: SQLite)")
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--profile", type=Path, default=None, metavar="DIR")
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args(argv)
    return Options(
        jobs=args.jobs,
        events=args.events,
        workers=args.workers,
        database=args.database,
        data_dir=args.data_dir,
        profile=args.profile,
        repeat=args.repeat,
    )


def create_database(server: str) -> tuple[str, str]:
    """A fresh database on ``server``: its URL and its name."""
    name = f"small_{uuid.uuid4().hex[:8]}"
    admin = create_engine(server)
    with admin.begin() as connection:
        connection.execute(text(f"CREATE DATABASE {name}"))
    admin.dispose()
    return str(make_url(server).set(database=name).render_as_string(hide_password=False)), name


def drop_database(server: str, name: str) -> None:
    admin = create_engine(server)
    with admin.begin() as connection:
        connection.execute(text(f"DROP DATABASE IF EXISTS {name}"))
    admin.dispose()


def submit_round(
    config: CoordinatorConfig, url: str, root: Path, options: Options, round_: int
) -> list[Path]:
    """Write and submit ``options.jobs`` one-object jobs; the objects' paths."""
    engine = create_database_engine(url)
    migrate.upgrade(engine)
    paths = []
    for index in range(options.jobs):
        prefix = f"r{round_}j{index:05d}/"
        path = root / "objects" / "logs" / prefix / "app.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(json_log_lines(options.events, service=f"svc{index}", seed=round_))
        submit_job(config, engine, prefix=prefix, timestamp_key="timestamp")
        paths.append(path)
    engine.dispose()
    return paths


def floor(config: CoordinatorConfig, paths: list[Path], root: Path, workers: int) -> float:
    """Seconds for one bare clp-s run per path, ``workers`` at a time (the compress task's
    command, ``bench.suite.run_clp_s``).

    The outputs stay until the next round's floor or the end (as in ``bench.suite``'s P1):
    removed right after, they made the coordinator's run that follows pay for them, on a file
    system that searches past recently freed inodes (``docs/performance.md``, rounds 14 and 15).
    """
    scratch = root / "floor"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)

    def one(index: int) -> None:
        run_clp_s(config, [paths[index]], scratch / str(index))

    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        list(pool.map(one, range(len(paths))))
    return time.perf_counter() - started


def py_spy() -> str | None:
    return os.environ.get("PY_SPY") or shutil.which("py-spy")


def run_coordinator(root: Path, environment: dict[str, str], profile: Path | None) -> float:
    command = [str(Path(sys.executable).parent / "coordinator"), "run", "--until-idle"]
    command += ["--data-dir", str(root), "--log-level", "warning"]
    if profile is not None:
        profile.mkdir(parents=True, exist_ok=True)
        spy = py_spy()
        if spy is not None:
            command = [
                spy, "record", "--subprocesses", "--format", "raw", "--rate", "250",
                "--output", str(profile / "coordinator.folded"), "--", *command,
            ]  # fmt: skip
        else:
            command = [
                sys.executable, "-m", "cProfile", "-o", str(profile / "loop.prof"), *command,
            ]  # fmt: skip
    started = time.perf_counter()
    subprocess.run(command, check=True, env=environment, stdin=subprocess.DEVNULL)
    return time.perf_counter() - started


def succeeded(url: str) -> tuple[int, int]:
    engine = create_database_engine(url)
    with engine.connect() as connection:
        statuses = [row[0] for row in connection.execute(select(compression_jobs.c.status))]
    engine.dispose()
    return sum(1 for status in statuses if status == SUCCEEDED), len(statuses)


def main(argv: list[str] | None = None) -> int:
    options = parse_options(argv)
    temporary = options.data_dir is None
    root = Path(tempfile.mkdtemp(prefix="small-jobs-")) if temporary else options.data_dir
    assert root is not None
    root = root.absolute()
    root.mkdir(parents=True, exist_ok=True)
    environment = {**os.environ}
    environment.pop("COORDINATOR_HOME", None)
    created: str | None = None
    if options.database is not None:
        url, created = create_database(options.database)
        environment["COORDINATOR_DATABASE_URL"] = url
        os.environ["COORDINATOR_DATABASE_URL"] = url
    config = load_config(None, data_dir=root)
    url = database_url(config)
    failed = False
    try:
        for round_ in range(options.repeat):
            paths = submit_round(config, url, root, options, round_)
            cpu = children_cpu()
            floor_secs = floor(config, paths, root, options.workers)
            floor_cpu, cpu = children_cpu() - cpu, children_cpu()
            profile = options.profile / f"run{round_}" if options.profile else None
            coordinator_secs = run_coordinator(root, environment, profile)
            coordinator_cpu = children_cpu() - cpu
            done, total = succeeded(url)
            expected = options.jobs * (round_ + 1)
            if done != expected or total != expected:
                print(f"run {round_}: only {done} of {total} jobs succeeded", file=sys.stderr)
                failed = True
            jobs = options.jobs
            print(
                f"run {round_}: {jobs} jobs, {options.workers} workers, "
                f"{'MariaDB' if created else 'SQLite'}: "
                f"coordinator {coordinator_secs:.2f} s ({jobs / coordinator_secs:.1f} jobs/s), "
                f"clp-s floor {floor_secs:.2f} s ({jobs / floor_secs:.1f}/s), "
                f"ratio {coordinator_secs / floor_secs:.2f}x; CPU per job: coordinator "
                f"{coordinator_cpu / jobs * 1000:.1f} ms, clp-s {floor_cpu / jobs * 1000:.1f} ms",
                flush=True,
            )
    finally:
        if created is not None and options.database is not None:
            drop_database(options.database, created)
        shutil.rmtree(root if temporary else root / "floor", ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
