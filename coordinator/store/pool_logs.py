"""SQLAlchemy's pool records about connections an outage dropped, as one warning line.

Used by every process that talks to the database and logs: the service (``service.logs``) and the
embedded engine's executors. Importing this module imports no part of SQLAlchemy: configuring the
logs of a command without a database must stay cheap (issue 14).
"""

from __future__ import annotations

import logging


class LostPooledConnections(logging.Filter):
    """SQLAlchemy's pool logs an ERROR with a traceback when it cannot roll back a connection it
    takes back after the database dropped it (an outage begins while a transaction is open). The
    connection is discarded either way and whoever met the outage logs it once, so such a record
    becomes one WARNING line without the traceback; any other record passes unchanged."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if not record.name.startswith("sqlalchemy.pool") or error is None:
            return True
        # Imported here: configuring the logs must not import SQLAlchemy (start-up time of the
        # commands without a database, issue 14); a pool's record means it is imported already.
        from coordinator.store.database import is_transient_driver_error  # noqa: PLC0415
        from coordinator.store.outage import describe_error  # noqa: PLC0415

        if is_transient_driver_error(error):
            record.msg, record.args = (
                "discarded a pooled database connection: %s",
                (describe_error(error),),
            )
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            record.exc_info = record.exc_text = None
        return True


def install(handlers: list[logging.Handler]) -> None:
    """Put ``LostPooledConnections`` on each of ``handlers``."""
    for handler in handlers:
        handler.addFilter(LostPooledConnections())
