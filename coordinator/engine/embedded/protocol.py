"""The engine ↔ executor protocol: length-prefixed msgpack messages over the executor's pipes.

Each message is ``u32 little-endian length`` then a msgpack map. The engine sends one ``Request``
and waits (at most the task's hard timeout) for one ``Reply``.
"""

from __future__ import annotations

import os
import select
import struct
import time
from dataclasses import dataclass, field
from typing import IO, Any

import msgpack

_LENGTH = struct.Struct("<I")


class ExecutorGone(Exception):
    """The executor closed its end (it exited or crashed)."""


class ReplyTimeout(Exception):
    """No reply before the deadline."""


@dataclass(frozen=True)
class Request:
    """Run one task instance."""

    package: str
    task_func: str
    job_id: int
    task_id: str
    instance_id: int
    inputs: list[bytes]
    graph_outputs: list[bytes] = field(default_factory=list)
    fault: dict[str, Any] | None = None


@dataclass(frozen=True)
class Reply:
    """The outcome of one task instance: outputs, or an error message."""

    outputs: list[bytes] | None = None
    error: str | None = None


def write_message(stream: IO[bytes], message: Request | Reply) -> None:
    """Write one framed message and flush; raises ``ExecutorGone`` on a broken pipe."""
    body = msgpack.packb(message.__dict__, use_bin_type=True)
    try:
        stream.write(_LENGTH.pack(len(body)) + body)
        stream.flush()
    except (BrokenPipeError, ValueError) as error:
        raise ExecutorGone(str(error)) from error


def read_request(stream: IO[bytes]) -> Request | None:
    """The next request (blocking), or ``None`` when the engine closed the pipe."""
    header = stream.read(_LENGTH.size)
    if len(header) < _LENGTH.size:
        return None
    (length,) = _LENGTH.unpack(header)
    fields = msgpack.unpackb(stream.read(length), raw=False)
    return Request(**fields)


def read_reply(fd: int, deadline: float) -> Reply:
    """The executor's reply from ``fd``, waiting until the monotonic ``deadline``.

    A reply already written is taken even when the deadline has passed (the instance ended in
    time; only the reading thread was late). Raises ``ReplyTimeout`` when the deadline passes
    with the reply incomplete, and ``ExecutorGone`` at end of file.
    """
    (length,) = _LENGTH.unpack(_read_exactly(fd, _LENGTH.size, deadline))
    fields = msgpack.unpackb(_read_exactly(fd, length, deadline), raw=False)
    return Reply(**fields)


def _read_exactly(fd: int, size: int, deadline: float) -> bytes:
    chunks, remaining = [], size
    while remaining:
        readable, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not readable:
            raise ReplyTimeout
        chunk = os.read(fd, min(remaining, 1 << 20))
        if not chunk:
            raise ExecutorGone("end of file")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


# The three shapes of a failed instance's message, as Spider's execution manager reports them
# (spider-execution-manager/src/runtime.rs:532-578, `Report::from_outcome`; docs/spider.md).


def in_task_failure(message: str) -> str:
    """The task raised (or its package/function could not be loaded), as Spider renders it.

    runtime.rs:554-555: ``format!("in-task failure: {}", String::from_utf8_lossy(&error))``, where
    ``error`` is the executor's rmp_serde encoding of its externally tagged error enum; a task's
    error is ``TaskError(ExecutionError(message))`` (docs/spider.md, Job error messages; CLP's
    tasks report every failure so), i.e. ``{"TaskError": {"ExecutionError": message}}``
    with the smallest string headers (msgpack's, as rmp's). Decoding with ``errors="replace"``
    substitutes U+FFFD for each maximal invalid subsequence, as ``from_utf8_lossy`` does: the map
    and fixstr headers (bytes ≥ 0x80) become U+FFFD, and a str8 header (messages of 32 bytes or
    more) leaks its length byte (``�-clp-s exited with …`` for 45 bytes). A package or
    function that cannot be loaded is rendered the same way (Spider's own variants for those are
    not in the reference).
    """
    payload: bytes = msgpack.packb({"TaskError": {"ExecutionError": message}}, use_bin_type=True)
    return "in-task failure: " + payload.decode("utf-8", errors="replace")


def hard_timeout_exceeded(hard_timeout_ms: int) -> str:
    """The instance was killed at its hard timeout."""
    return f"hard timeout ({hard_timeout_ms} ms) exceeded"


def executor_crashed(returncode: int | None) -> str:
    """The executor process died; a signal has no exit status (``None``)."""
    status = f"Some({returncode})" if returncode is not None and returncode >= 0 else "None"
    return f"executor crashed (exit_status = {status})"
