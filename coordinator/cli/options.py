"""The global options, which work before or after the command, and where each takes its default.

``--config``, ``--data-dir`` and ``--log-level`` may be written before the command
(``coordinator --config F run``) or after it (``coordinator run --config F``); written twice, the
one after the command wins. ``--config`` and ``--data-dir`` belong only to commands that open the
database (``uses_database``); given to another command they are a usage error, never silently
ignored. A value not given on the command line comes from its environment variable, then from the
configuration (the log level: ``compression_coordinator.logging_level``), then the default.
"""

from __future__ import annotations

import argparse
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from coordinator.config.locations import CONFIG_ENV, DATA_DIR_ENV, DEFAULT_DATA_DIR, LOG_LEVEL_ENV
from coordinator.config.log_level import CHOICES, canonical_level_name, level_number
from coordinator.errors import CoordinatorError


class UsageError(CoordinatorError, ValueError):
    """The command line (or an environment variable standing in for an option) is wrong."""


@dataclass(frozen=True)
class GlobalOption:
    """One global option: its flag, destination, environment variable and help text."""

    flag: str
    dest: str
    env: str
    metavar: str
    help: str
    database_only: bool


GLOBAL_OPTIONS = (
    GlobalOption(
        "--config",
        "config",
        CONFIG_ENV,
        "FILE",
        "CLP's clp-config.yaml (default: none, the embedded default)",
        database_only=True,
    ),
    GlobalOption(
        "--data-dir",
        "data_dir",
        DATA_DIR_ENV,
        "DIR",
        "the data directory of the embedded default's SQLite database, object store and "
        f"archives (default: {DEFAULT_DATA_DIR}; relative paths of --config resolve against it)",
        database_only=True,
    ),
    GlobalOption(
        "--log-level",
        "log_level",
        LOG_LEVEL_ENV,
        "LEVEL",
        f"one of {', '.join(CHOICES)} (default: compression_coordinator.logging_level, else "
        "info for run and spider serve, warning for the others); debug also prints tracebacks",
        database_only=False,
    ),
)


def _log_level_argument(text: str) -> str:
    try:
        return canonical_level_name(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def add_global_options(parser: argparse.ArgumentParser, *, top: bool, uses_database: bool) -> None:
    """Add the global options to the top-level parser (``top``) or a command's parser.

    On a command's parser they default to ``SUPPRESS``, so that a value given before the command
    is not overwritten by the command's own default.
    """
    group = parser.add_argument_group("global options")
    for option in GLOBAL_OPTIONS:
        if option.database_only and not (top or uses_database):
            continue
        group.add_argument(
            option.flag,
            dest=option.dest,
            metavar=option.metavar,
            type=_log_level_argument if option.dest == "log_level" else Path,
            default=None if top else argparse.SUPPRESS,
            help=f"{option.help}; env: ${option.env}",
        )


def refuse_unused_options(
    parser: argparse.ArgumentParser, args: argparse.Namespace, *, uses_database: bool
) -> None:
    """Exit with a usage error (2) when ``--config``/``--data-dir`` went to a command that does
    not open the database (written before it, where argparse cannot tell)."""
    if uses_database:
        return
    given = [
        option.flag
        for option in GLOBAL_OPTIONS
        if option.database_only and getattr(args, option.dest, None) is not None
    ]
    if given:
        parser.error(f"{' and '.join(given)} not used by `coordinator {args.command_name}`")


def config_path(args: argparse.Namespace) -> Path | None:
    """``--config``, else ``$COORDINATOR_CONFIG``, else ``None`` (the embedded default)."""
    given: Path | None = getattr(args, "config", None)
    if given is not None:
        return given
    from_env = os.environ.get(CONFIG_ENV)
    return Path(from_env) if from_env else None


def log_level(args: argparse.Namespace, configured: str | None, default: int) -> int:
    """``--log-level``, else ``$COORDINATOR_LOG_LEVEL``, else ``configured`` (the configuration's
    ``compression_coordinator.logging_level``), else ``default``.

    Fails with ``UsageError`` for an unknown level in the environment variable.
    """
    given: str | None = getattr(args, "log_level", None)
    if given is not None:
        return level_number(given)
    from_env = os.environ.get(LOG_LEVEL_ENV)
    if from_env:
        try:
            return level_number(from_env)
        except ValueError as error:
            raise UsageError(f"${LOG_LEVEL_ENV}: {error}") from None
    if configured is not None:
        return level_number(configured)
    return default


def debugging(args: argparse.Namespace) -> bool:
    """Whether tracebacks are wanted: the log level asked for on the command line or in the
    environment is debug (the configuration may not even load)."""
    try:
        return log_level(args, None, logging.INFO) <= logging.DEBUG
    except UsageError:
        return False
