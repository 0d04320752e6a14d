"""Looking at real processes from tests: whether one still runs, its parent, its CPU time, its
children."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def is_running(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie (a killed child not yet reaped still exists)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return not (Path(f"/proc/{pid}/stat").exists() and _stat_fields(pid)[0] == "Z")


def parent_of(pid: int) -> int:
    """``pid``'s parent pid (``/proc``)."""
    return int(_stat_fields(pid)[1])


def cpu_seconds(pid: int) -> float:
    """The CPU time (user + system) ``pid`` itself used so far, its children apart (``/proc``)."""
    fields = _stat_fields(pid)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[str]:
    """``/proc/<pid>/stat`` after the command name (which may hold spaces): the state first."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def children(pid: int) -> list[int]:
    """The pids of ``pid``'s children."""
    listing = subprocess.run(
        ["ps", "-o", "pid=", "--ppid", str(pid)], check=False, capture_output=True, text=True
    )
    return [int(line) for line in listing.stdout.split()]


def engine_processes(host_pid: int) -> tuple[list[int], list[int]]:
    """The fork servers of the embedded engine hosted by ``host_pid`` (its children), and the
    executors they forked (their children)."""
    servers = children(host_pid)
    return servers, [pid for server in servers for pid in children(server)]
