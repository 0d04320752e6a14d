"""The ``coordinator`` command line: one parser, one error boundary, the commands' handlers.

Global options (``coordinator.cli.options``) work before or after the command. Exit status
(``EXIT_CODES``): 0 success; 1 the command ran and failed (a job or a check did not succeed, the
database is unreachable or its schema not current, a job or file does not exist); 2 usage (bad
arguments, an invalid configuration, an unusable database URL). Every failure an operator can cause
is one line on stderr naming the cause and the fix; a traceback only with ``--log-level debug``.

A command imports only what it uses: building the parser needs nothing heavy, and each handler
imports its own parts (the database, the engine, gRPC, the diagrams...) when it runs, so that a
command's start-up does not pay for the others' (issue 14; ``tests/test_cli_imports.py``).
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import coordinator
from coordinator.cli import job_filters
from coordinator.cli.options import (
    UsageError,
    add_global_options,
    config_path,
    debugging,
    log_level,
    refuse_unused_options,
)
from coordinator.config.locations import (
    DATABASE_URL_ENV,
    DEFAULT_BUCKET,
    DEFAULT_PREFIX,
    SOURCE_CHECKOUT,
)

if TYPE_CHECKING:
    from types import FrameType

    from sqlalchemy import Engine

    from coordinator.cli.jobs import SpiderArchives
    from coordinator.config.loader import CoordinatorConfig
    from coordinator.engine.grpc_server import SpiderServer

Handler = Callable[[argparse.Namespace], int]
_log = logging.getLogger("coordinator")

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2
EXIT_CODES = {
    EXIT_OK: "success",
    EXIT_FAILURE: (
        "the command ran and failed: a job or a check did not succeed, the database is "
        "unreachable or its schema not current, a job or file does not exist"
    ),
    EXIT_USAGE: "usage: bad arguments, an invalid configuration, an unusable database URL",
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command named in ``argv``; the process exit code (``EXIT_CODES``)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    command: Command = args.command
    refuse_unused_options(parser, args, uses_database=command.uses_database)
    try:
        return command.handler(args)
    except KeyboardInterrupt:
        return 130
    except Exception as error:
        code, message = _explain(error)
        if debugging(args):
            traceback.print_exc()
        print(f"coordinator: {message}", file=sys.stderr)
        return code


def _explain(error: Exception) -> tuple[int, str]:
    """The exit code and one line for any failure; a bug says it is one."""
    from sqlalchemy.exc import ArgumentError, DBAPIError

    from coordinator.config.loader import ConfigError
    from coordinator.service.ingest import IngestError
    from coordinator.store import migrate
    from coordinator.store.database import NoDatabase
    from coordinator.store.downgrade import DowngradeRefused
    from coordinator.store.jobs import NoSuchJob
    from coordinator.store.names import InvalidDatasetName
    from coordinator.store.outage import describe_error

    match error:
        case ConfigError() | UsageError() | job_filters.InvalidFilter():
            explained = EXIT_USAGE, str(error)
        case (
            migrate.SchemaNotCurrent()
            | NoDatabase()
            | NoSuchJob()
            | IngestError()
            | InvalidDatasetName()
            | DowngradeRefused()
        ):
            explained = EXIT_FAILURE, str(error)
        case ArgumentError():  # an unparsable URL or an unknown dialect
            explained = EXIT_USAGE, f"cannot use the database URL: {describe_error(error)}"
        case ImportError():
            explained = (
                EXIT_USAGE,
                f"cannot use the database URL: its driver is not installed "
                f"({describe_error(error)}); use mysql+pymysql://… or sqlite:///…",
            )
        case DBAPIError():
            explained = EXIT_FAILURE, f"cannot use the database: {describe_error(error)}"
        case OSError():
            where = f" {error.filename}" if error.filename else ""
            explained = EXIT_FAILURE, f"cannot use{where}: {error.strerror or error}"
        case _:
            explained = (
                EXIT_FAILURE,
                f"internal error: {type(error).__name__}: {describe_error(error)} (a bug: run "
                "again with --log-level debug for the traceback, and report it)",
            )
    return explained


# --- the parser -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Command:
    """A command: what runs it and whether it opens the database (takes --config/--data-dir)."""

    name: str
    handler: Handler
    uses_database: bool


class _VersionAction(argparse._VersionAction):
    """argparse's ``--version``, the version read only when asked for (``coordinator``'s
    ``__version__`` reads the installed metadata: no command but this one pays for it)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        self.version = f"%(prog)s {coordinator.__version__}"
        super().__call__(parser, namespace, values, option_string)


def _env(name: str) -> str:
    return f"env: ${name}"


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every command."""
    parser = argparse.ArgumentParser(
        prog="coordinator",
        description=(
            "The CLP compression coordinator: runs CLP compression jobs on Spider through a "
            "persisted state machine. Without --config, the embedded default (SQLite, an "
            "embedded Spider engine, a local object store) under --data-dir."
        ),
        epilog="exit status: "
        + "; ".join(f"{code} {meaning}" for code, meaning in EXIT_CODES.items()),
    )
    parser.add_argument("--version", action=_VersionAction)
    add_global_options(parser, top=True, uses_database=True)
    commands = parser.add_subparsers(dest="command_name", required=True, metavar="COMMAND")

    def command(
        name: str,
        handler: Handler,
        summary: str,
        description: str,
        *,
        uses_database: bool = True,
        within: argparse._SubParsersAction[argparse.ArgumentParser] = commands,
    ) -> argparse.ArgumentParser:
        sub = within.add_parser(name, help=summary, description=description)
        add_global_options(sub, top=False, uses_database=uses_database)
        sub.set_defaults(command=Command(name, handler, uses_database))
        return sub

    run = command(
        "run",
        _run,
        "run the coordinator service",
        "Run the service: claim Pending jobs, submit them to Spider, react to Spider's "
        "outcomes; resumes every unfinished job. Stops on SIGTERM/SIGINT within "
        "compression_coordinator.termination_timeout_secs. With CLP_LOGS_DIR set, also logs to "
        "hourly files there.",
    )
    run.add_argument(
        "--until-idle",
        action="store_true",
        help="exit once no claimable or in-flight job is left (default: run until stopped)",
    )
    command(
        "demo",
        _demo,
        "run one whole job on the embedded default, from nothing",
        "Generate sample logs, submit them as one job, run it with the real clp-s and search "
        "the archive: a whole job on the embedded default.",
    )
    submit = command(
        "submit",
        _submit,
        "register objects and insert a compression job",
        "Put files into the object store (the embedded default's local store) and insert a "
        "Pending compression job for every object under s3://BUCKET/PREFIX; prints the job id.",
    )
    submit.add_argument("paths", nargs="*", type=Path, help="files to put into the object store")
    submit.add_argument(
        "--bucket", default=DEFAULT_BUCKET, help=f"the bucket (default: {DEFAULT_BUCKET})"
    )
    submit.add_argument(
        "--prefix",
        default=DEFAULT_PREFIX,
        help=f"the key prefix, not empty (default: {DEFAULT_PREFIX})",
    )
    submit.add_argument("--dataset", default=None, help="the dataset (default: default)")
    submit.add_argument(
        "--timestamp-key",
        default=None,
        help="the key of the log events' timestamps (default: none)",
    )
    submit.add_argument(
        "--endpoint-url",
        default=None,
        help="the S3 endpoint, for logs_input of type s3 (default: AWS's)",
    )
    submit.add_argument("--region", default=None, help="the S3 region code (default: the client's)")
    listing = command(
        "jobs",
        _jobs,
        "list compression jobs",
        "List compression jobs, newest first. Reads only: never creates or migrates a database.",
    )
    listing.add_argument(
        "--status",
        action="append",
        default=[],
        metavar="STATUS",
        help=(
            f"only jobs in these states ({', '.join(job_filters.STATUS_NAMES)}; any case; "
            "repeatable or comma-separated) (default: all)"
        ),
    )
    listing.add_argument("--dataset", default=None, help="only this dataset's jobs (default: all)")
    listing.add_argument(
        "--since",
        default=None,
        metavar="WHEN",
        help="only jobs created since WHEN: an ISO 8601 date or time (UTC unless it says), or "
        "an age such as 30m, 2h, 7d (default: any time)",
    )
    listing.add_argument(
        "--limit",
        default=str(job_filters.DEFAULT_LIMIT),
        metavar="N",
        help=f"at most N jobs, or `all` (default: {job_filters.DEFAULT_LIMIT})",
    )
    listing.add_argument(
        "--json", action="store_true", help="print every row as a JSON list (default: a table)"
    )
    show = command(
        "show",
        _show,
        "show a job: status, history, archives",
        "Show one job: its status and message, its transition history and its archives. "
        "Reads only.",
    )
    show.add_argument("job", type=int, help="the job's id")
    show.add_argument("--json", action="store_true", help="print a JSON document (default: text)")
    cancel = command(
        "cancel",
        _cancel,
        "ask for a job to be cancelled",
        "Ask for a job to be cancelled: a Pending job nobody holds ends Killed at once; "
        "otherwise the coordinator driving it cancels it on Spider.",
    )
    cancel.add_argument("job", type=int, help="the job's id")
    _add_diagram_arguments(
        command(
            "diagrams",
            _diagrams,
            "write the state diagrams, docs/lifecycle.md, README diagram",
            "Generate the state diagrams (Mermaid, DOT, SVG when graphviz is installed) and "
            "the lifecycle tables from the state machine's one definition; --check compares "
            "instead of writing.",
            uses_database=False,
        )
    )
    command(
        "lifecycle",
        _lifecycle,
        "print the lifecycle: edges, reactions, stored forms",
        "Print the job lifecycle: its edges, the reactions to Spider's outcomes, giving up, "
        "and how each state is stored in compression_jobs.",
        uses_database=False,
    )
    command(
        "health",
        _health,
        "check the database, the schema and Spider; exit 1 if any fails",
        "Check that the database answers, its schema is current, Spider is reachable and the "
        "resource group verified; one line per check, exit 0 when all pass, 1 otherwise (for "
        "container health checks). Reads only.",
    )
    archives = command(
        "archives",
        _archives,
        "list archive storage entries that have no archive record",
        "Reconcile the archive storage with the archive records; exit 1 when an entry has no "
        "record. Reads only.",
    )
    archives.add_argument(
        "--json", action="store_true", help="print a JSON document (default: text)"
    )

    spider = commands.add_parser(
        "spider", help="the embedded Spider engine", description="The embedded Spider engine."
    )
    spider_commands = spider.add_subparsers(dest="spider_command", required=True, metavar="ACTION")
    serve = command(
        "serve",
        _spider_serve,
        "serve the embedded engine over Spider's gRPC protocol",
        "Serve the embedded engine over Spider's storage gRPC protocol, so that a coordinator "
        "configured with `coordinator.engine: spider` can use it.",
        within=spider_commands,
    )
    serve.add_argument(
        "--host", default="127.0.0.1", help="the address to listen on (default: 127.0.0.1)"
    )
    serve.add_argument(
        "--port", type=int, default=50051, help="the port; 0: any free port (default: 50051)"
    )

    database = commands.add_parser(
        "db",
        help="schema migrations (alembic)",
        description=(
            "The coordinator's schema migrations (alembic). The database: "
            f"${DATABASE_URL_ENV}, else the --config file's `database` section (CLP's, with "
            "CLP_DB_USER/CLP_DB_PASS), else the embedded SQLite file. CLP's database is "
            "migrated only here (the deployment's schema step); any other database also by "
            "the commands that write."
        ),
    )
    db_commands = database.add_subparsers(dest="db_command", required=True, metavar="ACTION")
    upgrade = command(
        "upgrade",
        _db_upgrade,
        "upgrade to a revision",
        "Upgrade the schema to a revision (creating a SQLite database if there is none).",
        within=db_commands,
    )
    upgrade.add_argument("revision", nargs="?", default="head", help="the revision (default: head)")
    downgrade = command(
        "downgrade",
        _db_downgrade,
        "downgrade to a revision",
        "Downgrade the schema to a revision; refused while CLP could not read the jobs afterwards.",
        within=db_commands,
    )
    downgrade.add_argument("revision", help="the revision (base: remove the coordinator's schema)")
    command(
        "current",
        _db_current,
        "print the revision",
        "Print the schema's revision. Reads only.",
        within=db_commands,
    )
    return parser


def _config(args: argparse.Namespace) -> CoordinatorConfig:
    from coordinator.config.loader import load_config

    return load_config(config_path(args), data_dir=getattr(args, "data_dir", None))


def _configure_logs(
    args: argparse.Namespace,
    config: CoordinatorConfig | None,
    default: int = logging.WARNING,
    *,
    logs_dir: Path | None = None,
) -> None:
    from coordinator.service import logs

    configured = None if config is None else config.compression_coordinator.logging_level
    log_format = "text" if config is None else config.extras.log_format
    logs.configure(log_format, log_level(args, configured, default), logs_dir)


def _reading(args: argparse.Namespace) -> CoordinatorConfig:
    """The configuration of a command that only reads, its logs configured."""
    config = _config(args)
    _configure_logs(args, config)
    return config


@contextmanager
def _existing_database(
    config: CoordinatorConfig, *, require_current: bool = True
) -> Iterator[Engine]:
    """The database of a command that must not create or migrate one."""
    from coordinator.store.opening import open_existing_engine

    engine = open_existing_engine(config, require_current=require_current)
    try:
        yield engine
    finally:
        engine.dispose()


@contextmanager
def _database(config: CoordinatorConfig) -> Iterator[Engine]:
    """The database of a command that writes jobs (a SQLite one created and migrated)."""
    from coordinator.store.opening import open_engine

    engine = open_engine(config)
    try:
        yield engine
    finally:
        engine.dispose()


# --- the service ------------------------------------------------------------------------------


@contextmanager
def _collector_paused() -> Iterator[None]:
    """A long-lived command's start-up (imports, assembly) with the cyclic garbage collector
    paused: it would run again and again over objects that all live as long as the process (as in
    executors: ``coordinator.engine.embedded.__main__``). What the start-up built is frozen
    after (later full collections skip it) and the collector resumed, whatever happened."""
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()


def _run(args: argparse.Namespace) -> int:
    import signal
    import threading

    with _collector_paused():
        from coordinator.runtime import open_runtime
        from coordinator.service import logs

        config = _config(args)
        logs_dir = os.environ.get(logs.LOGS_DIR_ENV)
        _configure_logs(args, config, logging.INFO, logs_dir=Path(logs_dir) if logs_dir else None)
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
    from coordinator.runtime import archive_output_of
    from coordinator.service.cleanup import reconcile_archive_storage

    config = _reading(args)
    with _existing_database(config) as engine:
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


def _health(args: argparse.Namespace) -> int:
    from coordinator.service import health

    checks = health.run_health_checks(_reading(args))
    for check in checks:
        print(check.line())
    return 0 if health.all_ok(checks) else 1


def _spider_serve(args: argparse.Namespace) -> int:
    import signal
    import threading

    with _collector_paused():
        from coordinator.engine.grpc_server import run_server
        from coordinator.runtime import embedded_spider
        from coordinator.store.opening import open_engine

        config = _config(args)
        _configure_logs(args, config, logging.INFO)
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
    from coordinator.cli.demo import run_demo

    config = _config(args)
    _configure_logs(args, config)
    return run_demo(config)


# --- jobs --------------------------------------------------------------------------------------


def _submit(args: argparse.Namespace) -> int:
    from coordinator.service.ingest import S3Location, put_files, submit_job

    config = _reading(args)
    location = S3Location(endpoint_url=args.endpoint_url, region_code=args.region)
    with _database(config) as engine:
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
    from coordinator.cli import jobs as job_commands

    statuses = job_commands.parse_statuses(args.status)
    since = None if args.since is None else job_commands.parse_since(args.since)
    limit = job_commands.parse_limit(args.limit)
    config = _reading(args)
    with _existing_database(config) as engine:
        rows = job_commands.list_jobs(
            engine, statuses=statuses, dataset=args.dataset, since=since, limit=limit
        )
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    filtered = bool(statuses or args.dataset is not None or since is not None)
    for line in job_commands.format_jobs(rows, filtered=filtered):
        print(line)
    return 0


def _show(args: argparse.Namespace) -> int:
    from coordinator.cli import jobs as job_commands
    from coordinator.store.jobs import JobStore

    config = _reading(args)
    with _existing_database(config) as engine, _spider_archives(config, engine) as archives:
        document = job_commands.show_job(JobStore(engine), args.job, spider_archives=archives)
    if args.json:
        print(json.dumps(document, indent=2))
        return 0
    for line in job_commands.format_job(document):
        print(line)
    return 0


@contextmanager
def _spider_archives(config: CoordinatorConfig, engine: Engine) -> Iterator[SpiderArchives | None]:
    """For a Spider cluster, how ``show`` lists the archives CLP's own commit published (Spider's
    outputs name them); ``None`` with the embedded engine, whose commit is this coordinator's."""
    if config.engine != "spider":
        yield None
        return
    from functools import partial

    from coordinator.config.clp import Spider
    from coordinator.runtime import archive_output_of
    from coordinator.service.clp_published import clp_published_archives
    from coordinator.spider.grpc.client import GrpcSpider

    endpoint = config.clp.spider or Spider()
    # One attempt, briefly: a read command says "unknown" rather than wait out an outage.
    with GrpcSpider(endpoint.host, endpoint.port, deadline_secs=5.0, max_retries=0) as spider:
        yield partial(clp_published_archives, engine, spider, archive_output_of(config))


def _cancel(args: argparse.Namespace) -> int:
    import getpass

    from coordinator.service.operator_cancel import request_cancel
    from coordinator.store.jobs import JobStore

    config = _reading(args)
    with _existing_database(config) as engine:
        print(request_cancel(JobStore(engine), args.job, operator=getpass.getuser()).message)
    return 0


# --- the machine and the schema ----------------------------------------------------------------


def _lifecycle(args: argparse.Namespace) -> int:
    from coordinator.cli.lifecycle import print_lifecycle

    _configure_logs(args, None)
    print_lifecycle()
    return 0


def _add_diagram_arguments(diagrams: argparse.ArgumentParser) -> None:
    # The rule: run from the source checkout, the defaults are the files committed there; an
    # installed package has no such files to keep current, so its diagrams go to ./diagrams and the
    # document and the README diagram are written (or checked) only when a path is given.
    checkout = SOURCE_CHECKOUT
    diagrams.epilog = (
        "Defaults: run from the source checkout, its diagrams/, docs/ and README.md; run from an "
        "installed package, ./diagrams only (--docs and --readme add the document and the README "
        "diagram). The SVG needs Graphviz (the extra [svg] and the dot program): without it, it "
        "is skipped with a notice, and --check still checks an existing one."
    )
    diagrams.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 if a file differs from the lifecycle definition (the SVG by "
        "the DOT source it was drawn from, which needs no Graphviz)",
    )
    diagrams.add_argument(
        "--output",
        type=Path,
        default=checkout / "diagrams" if checkout else Path("diagrams"),
        metavar="DIR",
        help="where job_lifecycle.mmd, .dot and .svg go (default: the source checkout's "
        "diagrams/ when run from one, else ./diagrams; here: %(default)s)",
    )
    diagrams.add_argument(
        "--docs",
        type=Path,
        default=checkout / "docs" if checkout else None,
        metavar="DIR",
        help="where lifecycle.md (the generated tables) goes (default: the source checkout's "
        "docs/, else none: not written, not checked)",
    )
    diagrams.add_argument(
        "--readme",
        type=Path,
        default=checkout / "README.md" if checkout else None,
        metavar="FILE",
        help="the README whose lifecycle diagram (between its markers) is generated (default: "
        "the source checkout's README.md, else none: not written, not checked)",
    )


def _diagrams(args: argparse.Namespace) -> int:
    from coordinator.lifecycle import diagrams as lifecycle_diagrams

    output: Path = args.output
    targets = ", ".join(str(path) for path in (output, args.docs, args.readme) if path is not None)
    if args.check:
        problems = lifecycle_diagrams.check(output, args.docs, args.readme)
        for problem in problems:
            print(f"out of date: {problem}", file=sys.stderr)
        for unchecked in lifecycle_diagrams.unchecked(output):
            print(f"not checked: {unchecked}", file=sys.stderr)
        if problems:
            print(
                "Run `coordinator diagrams` to regenerate them (in the source checkout: and "
                "commit the result).",
                file=sys.stderr,
            )
            return 1
        print(f"{targets}: match the lifecycle definition")
        return 0
    for path in lifecycle_diagrams.write(output, args.docs, args.readme):
        print(f"wrote {path}")
    svg_unavailable = lifecycle_diagrams.svg_unavailable()
    if svg_unavailable is not None:
        print(f"skipped {output / lifecycle_diagrams.SVG_FILE}: {svg_unavailable}", file=sys.stderr)
    return 0


def _db_upgrade(args: argparse.Namespace) -> int:
    from coordinator.config.loader import database_url
    from coordinator.store import migrate
    from coordinator.store.database import create_database_engine, create_sqlite_directory

    config = _reading(args)
    url = database_url(config)
    create_sqlite_directory(url)
    engine = create_database_engine(url)
    try:
        migrate.upgrade(engine, args.revision)
        print(f"schema at revision {migrate.current_revision(engine)}")
    finally:
        engine.dispose()
    return 0


def _db_downgrade(args: argparse.Namespace) -> int:
    from coordinator.store import migrate

    config = _reading(args)
    with _existing_database(config, require_current=False) as engine:
        migrate.downgrade(engine, args.revision)
        print(f"schema at revision {migrate.current_revision(engine) or 'base'}")
    return 0


def _db_current(args: argparse.Namespace) -> int:
    from coordinator.store import migrate

    config = _reading(args)
    with _existing_database(config, require_current=False) as engine:
        print(migrate.current_revision(engine) or "base (no coordinator schema)")
    return 0
