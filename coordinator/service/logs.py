"""Logging set-up: human text or JSON lines, every job line naming the job and Spider ids."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, TextIO

from coordinator.store.pool_logs import LostPooledConnections

LogFormat = Literal["text", "json"]
JOB_FIELDS = ("job_id", "spider_id")


class JsonLines(logging.Formatter):
    """One JSON object per line: time, level, logger, message, and the job fields when set."""

    def format(self, record: logging.LogRecord) -> str:
        document: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in JOB_FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                document[name] = value
        if record.exc_info:
            document["exception"] = self.formatException(record.exc_info)
        return json.dumps(document)


class Text(logging.Formatter):
    """``time level [job=N spider=M] message``."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(job)s%(message)s")

    def format(self, record: logging.LogRecord) -> str:
        parts = [
            f"{n.removesuffix('_id')}={getattr(record, n)}"
            for n in JOB_FIELDS
            if getattr(record, n, None) is not None
        ]
        record.job = f"[{' '.join(parts)}] " if parts else ""
        return super().format(record)


LOGS_DIR_ENV = "CLP_LOGS_DIR"
"""CLP's log directory: when set, the service also logs to an hourly file there, as CLP's Rust
coordinator does (``compression_coordinator.log.YYYY-MM-DD-HH``)."""
LOG_FILE_STEM = "compression_coordinator.log"


class HourlyFile(logging.Handler):
    """Appends to ``<directory>/compression_coordinator.log.YYYY-MM-DD-HH`` (UTC), a new file each
    hour, the names CLP's Rust coordinator writes (``tracing_appender``'s hourly rolling); old
    files are left to the operator's retention, as CLP leaves them."""

    def __init__(self, directory: Path) -> None:
        super().__init__()
        self.directory = directory
        self._hour = ""
        self._stream: TextIO | None = None

    def path_for(self, created: float) -> Path:
        """The file a record made at ``created`` (a Unix time) goes to."""
        hour = datetime.fromtimestamp(created, UTC).strftime("%Y-%m-%d-%H")
        return self.directory / f"{LOG_FILE_STEM}.{hour}"

    def emit(self, record: logging.LogRecord) -> None:
        try:
            path = self.path_for(record.created)
            if self._stream is None or path.name != self._hour:
                self._close_stream()
                self._stream = path.open("a", encoding="utf-8")
                self._hour = path.name
            self._stream.write(self.format(record) + "\n")
            self._stream.flush()
        except Exception:
            self.handleError(record)

    def _close_stream(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None

    def close(self) -> None:
        self.acquire()
        try:
            self._close_stream()
        finally:
            self.release()
        super().close()


def configure(
    log_format: LogFormat = "text", level: int = logging.INFO, logs_dir: Path | None = None
) -> None:
    """Send the coordinator's logs to stderr in ``log_format`` at ``level``, and also to the
    hourly files of ``logs_dir`` when given (created if missing; ``OSError`` if it cannot be)."""
    formatter = JsonLines() if log_format == "json" else Text()
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if logs_dir is not None:
        logs_dir.mkdir(parents=True, exist_ok=True)
        handlers.append(HourlyFile(logs_dir))
    root = logging.getLogger()
    for old in root.handlers:
        if isinstance(old, HourlyFile):  # ours, from an earlier call; others are not ours to close
            old.close()
    for handler in handlers:
        handler.setFormatter(formatter)
        handler.addFilter(LostPooledConnections())
    root.handlers[:] = handlers
    root.setLevel(level)
    for noisy in ("werkzeug", "botocore", "urllib3", "alembic"):
        logging.getLogger(noisy).setLevel(max(level, logging.WARNING))


def job_fields(job_id: int, spider_id: int | None = None) -> dict[str, Any]:
    """``extra=`` for a log call about a job."""
    return {"job_id": job_id, "spider_id": spider_id}


LOOP_LOGGER = "coordinator.service.coordinator"
"""The one logger of the loop's parts (lease keeper, submitter, outcomes, cancels), so that an
operator filters or raises the level of the whole loop by one name."""
