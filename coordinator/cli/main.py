"""The ``coordinator`` command line.

Every command takes ``--config FILE`` (CLP's ``clp-config.yaml``; without it, the embedded default)
and ``--data-dir DIR`` (default ``$COORDINATOR_HOME``, else ``./var``): the directory of the
embedded default's database, object store and archives. ``$COORDINATOR_DATABASE_URL`` points any
command at another database.

Exit status: 0 on success, 1 when the work failed (a job did not succeed, a check found a
difference), 2 for a configuration or usage error.
"""

from __future__ import annotations

import argparse
import getpass
import json
import logging
import os
import signal
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.exc import ArgumentError, DBAPIError

import coordinator
from coordinator.cli import jobs as job_commands
from coordinator.cli.demo import run_demo
from coordinator.config.loader import ConfigError, CoordinatorConfig, database_url, load_config
from coordinator.config.locations import PROJECT_ROOT
from coordinator.engine.grpc_server import SpiderServer, run_server
from coordinator.lifecycle import diagrams as lifecycle_diagrams
from coordinator.lifecycle import tables as lifecycle_tables
from coordinator.runtime import (
    archive_output_of,
    embedded_spider,
    open_engine,
    open_runtime,
)
from coordinator.service import logs
from coordinator.service.cleanup import reconcile_archive_storage
from coordinator.service.ingest import (
    DEFAULT_BUCKET,
    DEFAULT_PREFIX,
    IngestError,
    S3Location,
    put_files,
    submit_job,
)
from coordinator.service.operator_cancel import request_cancel
from coordinator.store import migrate
from coordinator.store.database import create_database_engine
from coordinator.store.downgrade import DowngradeRefused
from coordinator.store.jobs import JobStore, NoSuchJob
from coordinator.store.names import InvalidDatasetName
from coordinator.store.outage import describe_error

Handler = Callable[[argparse.Namespace], int]
_log = logging.getLogger("coordinator")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command named in ``argv``; the process exit code."""
    args = build_parser().parse_args(argv)
    handler: Handler = args.handler
    try:
        return handler(args)
    except Exception as error:
        explained = _explain(error)
        if explained is None:
            raise
        code, message = explained
        print(f"coordinator: {message}", file=sys.stderr)
        return code


def _explain(error: Exception) -> tuple[int, str] | None:
    """The exit code and one line for a failure an operator can cause; ``None`` for a bug."""
    match error:
        case ConfigError() | migrate.SchemaNotCurrent():
            return 2, str(error)
        case NoSuchJob() | IngestError() | InvalidDatasetName() | DowngradeRefused():
            explained = 1, str(error)
        case ArgumentError():  # an unparsable URL or an unknown dialect
            explained = 2, f"cannot use the database URL: {describe_error(error)}"
        case ImportError():
            explained = (
                2,
                (
                    f"cannot use the database URL: its driver is not installed "
                    f"({describe_error(error)}); use mysql+pymysql://… or sqlite:///…"
                ),
            )
        case DBAPIError():
            explained = 1, f"cannot use the database: {describe_error(error)}"
        case OSError():
            where = f" {error.filename}" if error.filename else ""
            explained = 1, f"cannot use{where}: {error.strerror or error}"
        case _:
            return None
    return explained


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every command."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", type=Path, default=None, help="CLP's clp-config.yaml")
    common.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="the embedded default's data directory (default: $COORDINATOR_HOME, else ./var)",
    )
    parser = argparse.ArgumentParser(
        prog="coordinator", description="The CLP compression coordinator."
    )
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {coordinator.__version__}"
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, handler: Handler, help_text: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, parents=[common], help=help_text)
        sub.set_defaults(handler=handler)
        return sub

    run = command("run", _run, "run the coordinator service")
    run.add_argument(
        "--until-idle", action="store_true", help="exit once no claimable or in-flight job is left"
    )
    command("demo", _demo, "run one whole job on the embedded default, from nothing")
    submit = command("submit", _submit, "register objects and insert a compression job")
    submit.add_argument("paths", nargs="*", type=Path, help="files to put into the object store")
    submit.add_argument("--bucket", default=DEFAULT_BUCKET)
    submit.add_argument("--prefix", default=DEFAULT_PREFIX, help="key prefix (must not be empty)")
    submit.add_argument("--dataset", default=None, help="dataset (default: default)")
    submit.add_argument("--timestamp-key", default=None)
    submit.add_argument("--endpoint-url", default=None, help="S3 endpoint (logs input of type s3)")
    submit.add_argument("--region", default=None, help="S3 region code")
    listing = command("jobs", _jobs, "list compression jobs")
    listing.add_argument("--json", action="store_true")
    show = command("show", _show, "show a job: status, history, archives")
    show.add_argument("job", type=int)
    show.add_argument("--json", action="store_true")
    cancel = command("cancel", _cancel, "ask for a job to be cancelled")
    cancel.add_argument("job", type=int)
    _add_diagram_arguments(
        command(
            "diagrams", _diagrams, "write the state diagrams, docs/lifecycle.md, README diagram"
        )
    )
    command("lifecycle", _lifecycle, "print the lifecycle: edges, reactions, stored forms")
    archives = command(
        "archives", _archives, "list archive storage entries that have no archive record"
    )
    archives.add_argument("--json", action="store_true")

    spider = commands.add_parser("spider", help="the embedded Spider engine")
    spider_commands = spider.add_subparsers(dest="spider_command", required=True, metavar="ACTION")
    serve = spider_commands.add_parser(
        "serve", parents=[common], help="serve the embedded engine over Spider's gRPC protocol"
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on")
    serve.add_argument("--port", type=int, default=50051, help="port (0: any free port)")
    serve.set_defaults(handler=_spider_serve)

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


def _config(args: argparse.Namespace) -> CoordinatorConfig:
    return load_config(args.config, data_dir=args.data_dir)


@contextmanager
def _database(args: argparse.Namespace) -> Iterator[Engine]:
    """The coordinator's database (migrated on the embedded default)."""
    engine = open_engine(_config(args))
    try:
        yield engine
    finally:
        engine.dispose()


# --- the service ------------------------------------------------------------------------------


def _run(args: argparse.Namespace) -> int:
    config = _config(args)
    logs.configure(config.extras.log_format)
    runtime = open_runtime(config)
    coordinator = runtime.coordinator
    grace = config.compression_coordinator.termination_timeout_secs

    def stop(signum: int, _: FrameType | None) -> None:
        if coordinator.stopping.is_set():
            return
        _log.info("Received %s; stopping (at most %d s).", signal.Signals(signum).name, grace)
        coordinator.stopping.set()
        watchdog = threading.Timer(grace, _give_up, args=(grace,))
        watchdog.daemon = True
        watchdog.start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    _log.info("Compression coordinator %s started.", coordinator.instance_id)
    try:
        coordinator.run(until_idle=args.until_idle)
    finally:
        runtime.close()
    _log.info("Compression coordinator stopped.")
    return 0


def _give_up(grace: int) -> None:
    # Like CLP's coordinator: past the termination timeout, leave; every job resumes next start.
    _log.warning("Not stopped within %d s; exiting now.", grace)
    logging.shutdown()
    os._exit(0)


def _archives(args: argparse.Namespace) -> int:
    """Reconcile the archive storage with the records; exit 1 when an entry has none."""
    config = _config(args)
    with _database(args) as engine:
        found = reconcile_archive_storage(engine, archive_output_of(config))
    if args.json:
        document = {
            "storage": found.storage,
            "listed": found.listed,
            "recorded": found.recorded,
            "published_without_record": found.published,
            "unrecorded": found.unrecorded,
        }
        print(json.dumps(document, indent=2))
    else:
        print(found.summary())
        for location in found.unrecorded:
            print(location)
    return 1 if found.unrecorded else 0


def _spider_serve(args: argparse.Namespace) -> int:
    config = _config(args)
    logs.configure(config.extras.log_format)
    engine = open_engine(config)
    embedded = embedded_spider(config, engine).start()
    stopped = threading.Event()

    def stop(signum: int, _: FrameType | None) -> None:
        _log.info("Received %s; stopping the Spider server.", signal.Signals(signum).name)
        stopped.set()

    def listening(server: SpiderServer) -> None:
        print(f"Spider (embedded engine) listening on {server.address}", flush=True)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        run_server(embedded, args.host, args.port, stop=stopped, on_listening=listening)
    finally:
        embedded.close()
        engine.dispose()
    return 0


def _demo(args: argparse.Namespace) -> int:
    config = _config(args)
    logs.configure(config.extras.log_format, level=logging.WARNING)
    return run_demo(config)


# --- jobs --------------------------------------------------------------------------------------


def _submit(args: argparse.Namespace) -> int:
    config = _config(args)
    location = S3Location(endpoint_url=args.endpoint_url, region_code=args.region)
    with _database(args) as engine:
        if args.paths:
            put_files(config, args.paths, bucket=args.bucket, prefix=args.prefix, s3=location)
        job_id = submit_job(
            config,
            engine,
            bucket=args.bucket,
            prefix=args.prefix,
            dataset=args.dataset,
            timestamp_key=args.timestamp_key,
            s3=location,
        )
    print(job_id)
    return 0


def _jobs(args: argparse.Namespace) -> int:
    with _database(args) as engine:
        rows = job_commands.list_jobs(engine)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'id':>6}  {'status':<10} {'spider_id':>10} {'tasks':>5}  {'created':<24}  message")
    for row in rows:
        print(
            f"{row['id']:>6}  {row['status']:<10} {row['spider_id'] or '':>10} "
            f"{row['num_tasks']:>5}  {row['creation_time'] or '':<24}  {row['status_msg'][:60]}"
        )
    return 0


def _show(args: argparse.Namespace) -> int:
    with _database(args) as engine:
        document = job_commands.show_job(JobStore(engine), args.job)
    if args.json:
        print(json.dumps(document, indent=2))
        return 0
    _print_job(document)
    return 0


def _print_job(document: dict[str, Any]) -> None:
    print(f"Job {document['id']}: {document['status']}  (Spider job {document['spider_id']})")
    if document["status_msg"]:
        print(f"  {document['status_msg']}")
    print(
        f"  dataset {document['dataset'] or 'unknown (the job config does not decode)'}, "
        f"{document['num_tasks']} task(s), "
        f"{document['uncompressed_size']:,} B -> {document['compressed_size']:,} B"
    )
    print("History:")
    for entry in document["history"]:
        print(
            f"  {entry['at']}  {entry['from']} -> {entry['to']}  "
            f"{entry['trigger']} by {entry['actor']} {entry['actor_id']}: {entry['reason']}"
        )
    print("Archives:")
    for archive in document["archives"]:
        print(
            f"  {archive['id']}  {archive['size']:,} B (from {archive['uncompressed_size']:,} B)"
            f"  {archive['location']}"
        )


def _cancel(args: argparse.Namespace) -> int:
    with _database(args) as engine:
        print(request_cancel(JobStore(engine), args.job, operator=getpass.getuser()).message)
    return 0


# --- the machine and the schema ----------------------------------------------------------------


def _lifecycle(_: argparse.Namespace) -> int:
    _print_lifecycle()
    return 0


def _print_lifecycle() -> None:
    print("Compression job lifecycle: the edges (state numbers in parentheses):")
    _print_table(
        (*lifecycle_tables.EDGE_HEADERS[:4], "why"),
        [(*row[:4], row[6]) for row in lifecycle_tables.edge_rows()],
    )
    print("\nReactions to Spider's final word, by the row's state:")
    _print_table(lifecycle_tables.REACTION_HEADERS, lifecycle_tables.reaction_rows())
    print("\nA job whose attempts ran out:")
    _print_table(lifecycle_tables.GIVING_UP_HEADERS, lifecycle_tables.giving_up_rows())
    print("\nStored in compression_jobs:")
    _print_table(lifecycle_tables.STORED_HEADERS, lifecycle_tables.stored_rows())
    print(
        "  Committed is written as 1 (coordinator.committed_status: running, the default) "
        "or 5 (distinct)"
    )


def _print_table(headers: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    """Aligned columns; the last one wrapped to the terminal's width."""
    fixed = len(headers) - 1
    widths = [max(len(row[i]) for row in (headers, *rows)) for i in range(fixed)]
    indent = sum(widths) + 2 * fixed
    for row in (headers, *rows):
        cells = "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False))
        last = textwrap.wrap(row[fixed], width=max(40, 110 - indent)) or [""]
        print(f"  {cells}  {last[0]}")
        for line in last[1:]:
            print(" " * (indent + 2) + line)


def _add_diagram_arguments(diagrams: argparse.ArgumentParser) -> None:
    diagrams.add_argument(
        "--check", action="store_true", help="fail if the committed diagrams are out of date"
    )
    diagrams.add_argument("--output", type=Path, default=PROJECT_ROOT / "diagrams")
    diagrams.add_argument(
        "--docs",
        type=Path,
        default=PROJECT_ROOT / "docs",
        help="where docs/lifecycle.md (the generated tables) goes",
    )
    diagrams.add_argument(
        "--readme",
        type=Path,
        default=PROJECT_ROOT / "README.md",
        help="the README whose lifecycle diagram (between its markers) is generated",
    )


def _diagrams(args: argparse.Namespace) -> int:
    output: Path = args.output
    if args.check:
        problems = lifecycle_diagrams.check(output, args.docs, args.readme)
        for problem in problems:
            print(f"out of date: {problem}", file=sys.stderr)
        if problems:
            print("Run `coordinator diagrams` and commit the result.", file=sys.stderr)
            return 1
        print(f"{output}, {args.docs}: diagrams and tables match the lifecycle definition")
        return 0
    for path in lifecycle_diagrams.write(output, args.docs, args.readme):
        print(f"wrote {path}")
    return 0


@contextmanager
def _schema_engine(args: argparse.Namespace) -> Iterator[Engine]:
    config = _config(args)
    engine = create_database_engine(database_url(config))
    try:
        yield engine
    finally:
        engine.dispose()


def _db_upgrade(args: argparse.Namespace) -> int:
    with _schema_engine(args) as engine:
        migrate.upgrade(engine, args.revision)
        print(f"schema at revision {migrate.current_revision(engine)}")
    return 0


def _db_downgrade(args: argparse.Namespace) -> int:
    with _schema_engine(args) as engine:
        migrate.downgrade(engine, args.revision)
        print(f"schema at revision {migrate.current_revision(engine) or 'base'}")
    return 0


def _db_current(args: argparse.Namespace) -> int:
    with _schema_engine(args) as engine:
        print(migrate.current_revision(engine) or "base (no coordinator schema)")
    return 0
