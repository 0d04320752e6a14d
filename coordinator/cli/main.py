"""The ``coordinator`` command line.

Every command takes ``--data-dir DIR`` (default ``$COORDINATOR_HOME``, else ``./var``), the
directory that holds the embedded default's database. ``$COORDINATOR_DATABASE_URL`` points the
commands at another database (MariaDB/MySQL in production).
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import Engine

from coordinator.config.locations import PROJECT_ROOT, resolve_database_url
from coordinator.lifecycle import EDGES
from coordinator.lifecycle import diagrams as lifecycle_diagrams
from coordinator.store import migrate
from coordinator.store.database import create_database_engine

Handler = Callable[[argparse.Namespace], int]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command named in ``argv``; the process exit code."""
    args = build_parser().parse_args(argv)
    handler: Handler = args.handler
    return handler(args)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every command."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="directory of the embedded database (default: $COORDINATOR_HOME, else ./var)",
    )
    parser = argparse.ArgumentParser(
        prog="coordinator", description="The CLP compression coordinator."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = commands.add_parser(
        "demo", parents=[common], help="bring up the embedded database and show the job lifecycle"
    )
    demo.set_defaults(handler=_demo)

    lifecycle = commands.add_parser(
        "lifecycle", parents=[common], help="print the job state machine: edges, actors, reasons"
    )
    lifecycle.set_defaults(handler=_lifecycle)

    diagrams = commands.add_parser(
        "diagrams", parents=[common], help="write the state diagrams into diagrams/"
    )
    diagrams.add_argument(
        "--check", action="store_true", help="fail if the committed diagrams are out of date"
    )
    diagrams.add_argument("--output", type=Path, default=PROJECT_ROOT / "diagrams")
    diagrams.set_defaults(handler=_diagrams)

    database = commands.add_parser("db", help="schema migrations (alembic)")
    db_commands = database.add_subparsers(dest="db_command", required=True, metavar="ACTION")
    upgrade = db_commands.add_parser("upgrade", parents=[common], help="upgrade to a revision")
    upgrade.add_argument("revision", nargs="?", default="head")
    upgrade.set_defaults(handler=_db_upgrade)
    downgrade = db_commands.add_parser(
        "downgrade", parents=[common], help="downgrade to a revision"
    )
    downgrade.add_argument("revision")
    downgrade.set_defaults(handler=_db_downgrade)
    current = db_commands.add_parser("current", parents=[common], help="print the revision")
    current.set_defaults(handler=_db_current)
    return parser


def _demo(args: argparse.Namespace) -> int:
    with _engine(args) as engine:
        migrate.upgrade(engine)
        revision = migrate.current_revision(engine)
    print(f"Database: {engine.url.render_as_string(hide_password=True)} (schema {revision})")
    print()
    _print_lifecycle()
    print()
    print("Diagrams: diagrams/job_lifecycle.mmd (Mermaid), .dot and .svg (Graphviz).")
    return 0


def _lifecycle(_: argparse.Namespace) -> int:
    _print_lifecycle()
    return 0


def _print_lifecycle() -> None:
    print("Compression job lifecycle (status numbers as stored in compression_jobs.status):")
    rows = [
        (
            edge.trigger,
            f"{edge.source.label} ({int(edge.source)})",
            f"{edge.dest.label} ({int(edge.dest)})",
            ", ".join(sorted(actor.value for actor in edge.actors)),
            edge.why,
        )
        for edge in EDGES
    ]
    headers = ("trigger", "from", "to", "fired by", "why")
    widths = [max(len(row[i]) for row in (headers, *rows)) for i in range(4)]
    indent = sum(widths) + 2 * 4
    for row in (headers, *rows):
        cells = "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False))
        why = textwrap.wrap(row[4], width=max(40, 110 - indent)) or [""]
        print(f"  {cells}  {why[0]}")
        for line in why[1:]:
            print(" " * (indent + 2) + line)


def _diagrams(args: argparse.Namespace) -> int:
    output: Path = args.output
    if args.check:
        problems = lifecycle_diagrams.check(output)
        for problem in problems:
            print(f"out of date: {problem}", file=sys.stderr)
        if problems:
            print("Run `coordinator diagrams` and commit the result.", file=sys.stderr)
            return 1
        print(f"{output}: diagrams match the machine definition")
        return 0
    for path in lifecycle_diagrams.write(output):
        print(f"wrote {path}")
    return 0


@contextmanager
def _engine(args: argparse.Namespace) -> Iterator[Engine]:
    engine = create_database_engine(resolve_database_url(args.data_dir))
    try:
        yield engine
    finally:
        engine.dispose()


def _db_upgrade(args: argparse.Namespace) -> int:
    with _engine(args) as engine:
        migrate.upgrade(engine, args.revision)
        print(f"schema at revision {migrate.current_revision(engine)}")
    return 0


def _db_downgrade(args: argparse.Namespace) -> int:
    with _engine(args) as engine:
        migrate.downgrade(engine, args.revision)
        print(f"schema at revision {migrate.current_revision(engine) or 'base'}")
    return 0


def _db_current(args: argparse.Namespace) -> int:
    with _engine(args) as engine:
        print(migrate.current_revision(engine) or "base (no coordinator schema)")
    return 0
