"""Issue 14's benchmark suite: every case beside its floor, one table.

    .venv/bin/python -m bench                       # every case, SQLite
    .venv/bin/python -m bench --database mysql+pymysql://user:pass@127.0.0.1:3306/
                                                    # the database cases on MariaDB too
    .venv/bin/python -m bench --case p1 [--jobs 200] # one case alone
    .venv/bin/python -m bench --smoke               # tiny sizes (under a minute)
    .venv/bin/python -m bench --rounds 5 --case p1  # goals judged on the median of 5 rounds

Cases (``bench/suite.py``): ``p1`` one-object jobs through a running service after a warm-up job
(real clp-s, embedded engine) vs the same clp-s runs at the same parallelism; ``p1b`` the same jobs
with instant tasks (``bench.noop``: a no-op compress task, the real commit task and transitions),
jobs/s and database transactions per job, against the database's own rate for that many guarded
moves per job (``bench.transitions``); ``p2`` one big job in 2 partitions and in 1, submission →
Succeeded in a running service vs one bare clp-s over the same files; ``p3`` a backlog: peak RSS,
tick cost at a small vs a large backlog, Spider state calls/s vs the back-off's bound; ``p4``
SIGKILL of a running ``coordinator run`` and the time its restart takes to re-attach every job in
flight; ``p5`` partitioning (``bench.partition``'s workloads); ``startup`` ``run --until-idle`` with
nothing to do; ``spider-cluster`` this coordinator against CLP's Rust coordinator on a real Spider
cluster (``bench.spider_cluster``; only with ``--database``, ``--cluster-jobs``/``--cluster-slots``
/``--cluster-idle-secs`` its sizes, ``--cluster-own-cpu`` its placement). Each case runs in a
process of its own (clean metrics and peak RSS) with its own temporary data directory and
database; ``--database`` runs ``p1``, ``p1b``, ``p3`` and ``p4`` again on a fresh database of that
MariaDB server.
"""

from __future__ import annotations

import argparse
import compileall
import dataclasses
import json
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import coordinator
from bench.rounds import RoundRows, median_table
from bench.suite import CASES, DATABASE_CASES, SERVER_ONLY_CASES, Sizes
from coordinator.lifecycle.tables import markdown_table

ROW_MARK = "BENCH-ROW "
HEADERS = ("case", "coordinator", "floor", "ratio", "goal", "holds")
ROW_FIELDS = ("case", "figure", "floor", "ratio", "goal", "holds")
"""``bench.suite.Row``'s fields under ``HEADERS``."""


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    parser.add_argument("--case", choices=sorted(CASES), action="append", help="default: all")
    parser.add_argument("--database", metavar="URL", help="a MariaDB server URL")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes")
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run the cases N times, alternated; then judge each goal on the median (bench.rounds)",
    )
    parser.add_argument("--jobs", type=int, help="P1/P1b jobs (default 1,000)")
    parser.add_argument("--big-mib", type=int, help="P2 job size (default 200)")
    parser.add_argument("--big-rounds", type=int, help="P2 rounds, floor and job alternately (3)")
    parser.add_argument("--in-flight", type=int, help="P3 max_concurrent_jobs (default 1,000)")
    parser.add_argument("--backlog", type=int, nargs=2, metavar=("SMALL", "LARGE"))
    parser.add_argument("--restart-jobs", type=int, help="P4 jobs (default 1,000)")
    parser.add_argument("--partition-objects", type=int, help="P5 (default 100,000)")
    parser.add_argument("--workers", type=int, help="embedded workers and floor parallelism")
    parser.add_argument(
        "--cluster-jobs", type=int, nargs="+", help="spider-cluster job counts (200 1000)"
    )
    parser.add_argument(
        "--cluster-slots", type=int, nargs="+", help="spider-cluster max_concurrent_jobs (4 64)"
    )
    parser.add_argument("--cluster-idle-secs", type=float, help="spider-cluster idle window (30)")
    parser.add_argument(
        "--cluster-own-cpu",
        type=int,
        choices=(0, 1),
        help="spider-cluster: 1 gives each coordinator a CPU of its own, the cluster the rest (0)",
    )
    parser.add_argument("--on", metavar="URL", help=argparse.SUPPRESS)  # one case's database
    parser.add_argument("--rows", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


SIZE_OPTIONS = (
    "jobs",
    "big_mib",
    "big_rounds",
    "in_flight",
    "restart_jobs",
    "partition_objects",
    "workers",
    "cluster_idle_secs",
    "cluster_own_cpu",
)
"""The size options (``--jobs`` …), each a field of ``Sizes``, passed on to each case's process."""
LIST_OPTIONS = ("cluster_jobs", "cluster_slots")
"""The size options of several values (``--cluster-jobs 200 1000``), each a tuple of ``Sizes``."""


def sizes_of(args: argparse.Namespace) -> Sizes:
    sizes = Sizes.smoke() if args.smoke else Sizes()
    for name in SIZE_OPTIONS:
        if getattr(args, name) is not None:
            setattr(sizes, name, getattr(args, name))
    if args.backlog is not None:
        sizes.backlog = tuple(args.backlog)
    for name in LIST_OPTIONS:
        if getattr(args, name) is not None:
            setattr(sizes, name, tuple(getattr(args, name)))
    return sizes


def size_options(args: argparse.Namespace) -> list[str]:
    options = ["--smoke"] if args.smoke else []
    for name in SIZE_OPTIONS:
        if getattr(args, name) is not None:
            options += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    if args.backlog is not None:
        options += ["--backlog", *map(str, args.backlog)]
    for name in LIST_OPTIONS:
        if getattr(args, name) is not None:
            options += [f"--{name.replace('_', '-')}", *map(str, getattr(args, name))]
    return options


def run_one(args: argparse.Namespace) -> int:
    """Inside a case's process: run it and print its rows as JSON lines."""
    (case,) = args.case
    for row in CASES[case](args.on, sizes_of(args)):
        print(ROW_MARK + json.dumps(dataclasses.asdict(row)), flush=True)
    return 0


def table(rows: Sequence[Mapping[str, Any]]) -> str:
    return markdown_table(
        HEADERS, [[str(row.get(field, "—")) for field in ROW_FIELDS] for row in rows]
    )


def compile_package() -> None:
    """Write the coordinator's bytecode, as installing the package does.

    The cases measure an installed coordinator: with ``PYTHONDONTWRITEBYTECODE`` set (as on this
    machine) and the package installed editable, every process the cases start would otherwise
    compile the modules edited since their bytecode was last written (~0.1 s each time the
    package starts: start-up's figure would measure the compiler).
    """
    compileall.compile_dir(Path(coordinator.__file__).parent, quiet=1)


def measure_round(
    args: argparse.Namespace, runs: list[tuple[str, str | None]]
) -> tuple[RoundRows, int]:
    """Every run of ``runs`` in a process of its own: the rows each printed (a failed run: one row
    saying so), and how many failed."""
    rows: dict[str, list[dict[str, Any]]] = {}
    failed = 0
    for case, database in runs:
        command = [sys.executable, "-m", "bench", "--rows", "--case", case, *size_options(args)]
        if database is not None:
            command += ["--on", database]
        name = f"{case} ({'MariaDB' if database else 'SQLite'})"
        print(f"bench: {name} ...", file=sys.stderr, flush=True)
        started = time.perf_counter()
        result = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=False)
        found = [
            json.loads(line[len(ROW_MARK) :])
            for line in result.stdout.splitlines()
            if line.startswith(ROW_MARK)
        ]
        if result.returncode != 0 or not found:
            failed += 1
            found.append(
                {
                    "case": name,
                    "figure": f"failed (exit {result.returncode})",
                    "holds": "no",
                    "valid": False,
                }
            )
        rows[name] = found
        print(f"bench: {name} took {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return rows, failed


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    if args.rows:
        return run_one(args)
    if args.rounds < 1:
        raise SystemExit("python -m bench: --rounds must be 1 or more")
    compile_package()
    cases = args.case or list(CASES)
    runs: list[tuple[str, str | None]] = [
        (case, None) for case in cases if not (args.database and case in SERVER_ONLY_CASES)
    ]
    if args.database:
        runs += [(case, args.database) for case in cases if case in DATABASE_CASES]
    rounds: list[RoundRows] = []
    failed = 0
    for number in range(1, args.rounds + 1):
        measured, failed_now = measure_round(args, runs)
        rounds.append(measured)
        failed += failed_now
        if args.rounds > 1:
            print(f"Round {number} of {args.rounds}\n")
        print(table([row for rows in measured.values() for row in rows]))
        if args.rounds > 1:
            print()
    if args.rounds > 1:
        print(f"Each goal on the median of {args.rounds} rounds\n")
        print(median_table(rounds))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
