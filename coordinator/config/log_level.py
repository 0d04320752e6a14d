"""Log levels by name: one reading for ``--log-level``, ``$COORDINATOR_LOG_LEVEL`` and CLP's
``compression_coordinator.logging_level``.

CLP names the coordinator's level in Python's words (its Helm values: ``INFO``) and hands it to the
Rust binary as ``RUST_LOG`` (whose words are ``trace``, ``debug``, ``info``, ``warn``, ``error``).
Both vocabularies are accepted, in any case; ``trace`` is ``debug`` (Python has nothing finer).
"""

from __future__ import annotations

import logging

LEVELS: dict[str, int] = {
    "trace": logging.DEBUG,
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
    "fatal": logging.CRITICAL,
}
CHOICES = ("debug", "info", "warning", "error")
"""The names the help texts offer; every key of ``LEVELS`` is accepted."""


def canonical_level_name(text: str) -> str:
    """``text`` as a lower-case name of ``LEVELS``.

    Fails with ``ValueError`` (saying which names are accepted) for any other text.
    """
    name = text.strip().lower()
    if name not in LEVELS:
        raise ValueError(
            f"unknown log level {text!r}: use one of {', '.join(CHOICES)} "
            f"(also accepted: {', '.join(sorted(set(LEVELS) - set(CHOICES)))})"
        )
    return name


def level_number(text: str) -> int:
    """The ``logging`` level ``text`` names; ``ValueError`` as ``canonical_level_name``."""
    return LEVELS[canonical_level_name(text)]
