"""Generated JSON-lines logs with known, searchable events: the demo's input."""

from __future__ import annotations

import json
import random
from pathlib import Path

START_MS = 1_700_000_000_000
"""The first event's ``timestamp`` (milliseconds since the epoch)."""
STEP_MS = 250
ERROR_EVERY = 10
"""Every tenth event (``sequence % 10 == 0``) is an ERROR; the others are INFO."""


def json_log_lines(
    count: int, *, service: str = "api", start_ms: int = START_MS, seed: int = 0
) -> bytes:
    """``count`` events, one JSON object per line, ``timestamp`` rising by ``STEP_MS``.

    Each event has ``request_id`` ``<service>-<sequence:06d>`` (unique, for searches), a level, and
    random-looking fields so that the data does not compress to nothing.
    """
    rng = random.Random(f"{service}-{seed}")
    lines = []
    for sequence in range(count):
        event = {
            "timestamp": start_ms + sequence * STEP_MS,
            "level": "ERROR" if sequence % ERROR_EVERY == 0 else "INFO",
            "service": service,
            "request_id": f"{service}-{sequence:06d}",
            "latency_ms": rng.randint(1, 5000),
            "user": f"{rng.getrandbits(64):016x}",
            "message": f"{rng.choice(['GET', 'PUT', 'POST'])} /items/{rng.randint(1, 10**6)}",
        }
        lines.append(json.dumps(event, separators=(",", ":")))
    return ("\n".join(lines) + "\n").encode()


def write_json_logs(path: Path, count: int, **options: object) -> bytes:
    """Write ``json_log_lines(count, **options)`` to ``path`` (parents created); the bytes."""
    data = json_log_lines(count, **options)  # type: ignore[arg-type]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return data
