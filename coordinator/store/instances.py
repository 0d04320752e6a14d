"""Live coordinator processes and their heartbeats (``coordinator_instances``, migration 0006).

A process announces itself with a :class:`Presence`: one row per coordinator ``instance_id``
(kind ``coordinator``) or per standalone embedded engine (kind ``engine``, named after its token),
holding a random ``token`` new at every process start, the host and pid, and an expiry that a
heartbeat thread keeps moving forward. The token is what owns the embedded engine's jobs
(``spider_engine_jobs.owner``): an owner whose token has no row (it was closed, or a restart of the
same instance replaced it) is gone at once; one whose row expired is gone too, once the observer
has itself been in touch with the database for a whole expiry period (after an outage every
heartbeat lapsed, and the live ones are renewed within one period).

Two live processes cannot share an ``instance_id``: registering finds the other's fresh row and
waits up to one expiry period for it to lapse, then refuses (:class:`InstanceInUse`). A row is
taken over at once when its process is provably gone: it was written on this host (same host name,
boot and pid namespace) by a pid that no longer runs, or by this very pid in an earlier life (a
container restarted with pid 1). So a coordinator restarted after a crash continues its jobs at
once, while a second one started with the same name elsewhere is refused.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Engine, Select, Update, bindparam, delete, insert, select, update
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from coordinator.errors import CoordinatorError
from coordinator.store.clock import Clock, utc_now
from coordinator.store.kept_connection import KeptConnection
from coordinator.store.outage import Outage, OutageLines
from coordinator.store.schema import coordinator_instances as _instances

_log = logging.getLogger(__name__)
_HEARTBEAT_LINES = OutageLines(
    started="heartbeat of %(what)s failed (database unavailable: %(error)s); retrying every "
    "%(interval).1f s",
    ended="heartbeat of %(what)s resumed after %(seconds).1f s (%(failures)d failed attempts)",
)
"""A failing heartbeat: one line when it starts failing, one when it beats again."""

COORDINATOR = "coordinator"
ENGINE = "engine"
DEFAULT_STALE_AFTER_SECS = 10.0
"""A process whose heartbeat is older than this is gone."""
_FORGET_AFTER = timedelta(hours=1)
"""Expired rows of standalone engines (named after their token, never reused) are deleted then."""

_RENEWAL: Update = (
    update(_instances)
    .where(
        _instances.c.kind == bindparam("w_kind"),
        _instances.c.name == bindparam("w_name"),
        _instances.c.token == bindparam("w_token"),
    )
    .values(heartbeat_at=bindparam("heartbeat"), expires_at=bindparam("expires"))
)
"""A heartbeat: the row of (kind, name) still this process's (its token) moves on."""

_tokens_of_this_process: set[str] = set()
_tokens_lock = threading.Lock()


class InstanceInUse(CoordinatorError, RuntimeError):
    """Another live process holds this instance id."""


def host_key() -> str:
    """This host as a pid is meaningful on it: host name, boot id and pid namespace."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as boot:
            boot_id = boot.read().strip()[:8]
    except OSError:
        boot_id = "-"
    try:
        namespace = str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        namespace = "-"
    return f"{socket.gethostname()[:200]}/{boot_id}/{namespace}"


def _pid_runs(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return True
    return True


def provably_gone(host: str, pid: int, token: str) -> bool:
    """Whether the process that wrote a row with ``host``/``pid``/``token`` is certainly gone."""
    if host != host_key():
        return False
    if pid == os.getpid():
        with _tokens_lock:
            return token not in _tokens_of_this_process
    return not _pid_runs(pid)


def live_tokens(now: datetime) -> Select[tuple[str]]:
    """The tokens of processes whose heartbeat has not expired at ``now``."""
    return select(_instances.c.token).where(_instances.c.expires_at >= now)


def known_tokens() -> Select[tuple[str]]:
    """The tokens that have a row at all (expired or not)."""
    return select(_instances.c.token)


@dataclass
class _Holder:
    token: str
    host: str
    pid: int
    heartbeat_at: datetime
    expires_at: datetime


class Presence:
    """This process's row in ``coordinator_instances``, kept alive by a heartbeat thread."""

    def __init__(
        self,
        database: Engine,
        kind: str,
        name: str | None = None,
        *,
        stale_after_secs: float = DEFAULT_STALE_AFTER_SECS,
        clock: Clock = utc_now,
    ) -> None:
        self.clock = clock
        self.token = uuid.uuid4().hex
        self.kind = kind
        self.name = name if name is not None else self.token
        self.stale_after = timedelta(seconds=stale_after_secs)
        self.interval = max(stale_after_secs / 4, 0.05)
        self._db = database
        self._beats = KeptConnection(database)
        self._renewal = self._beats.prepare(_RENEWAL)
        self._host = host_key()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._healthy_since: float | None = None
        self._lost = False
        self._outage = Outage(f"{kind} {self.name!r}", _log, lines=_HEARTBEAT_LINES)

    # --- registration -------------------------------------------------------------------------

    def register(self, *, wait_secs: float | None = None) -> Presence:
        """Take the row for (kind, name); raises ``InstanceInUse`` if a live process keeps it for
        ``wait_secs`` (default: one expiry period and a heartbeat), and the database's errors."""
        with _tokens_lock:
            _tokens_of_this_process.add(self.token)
        wait = self.stale_after.total_seconds() + self.interval if wait_secs is None else wait_secs
        deadline = time.monotonic() + wait
        logged = False
        while True:
            holder = self._try_take()
            if holder is None:
                self._healthy_since = time.monotonic()
                self._forget_old_engines()
                _log.info("registered as %s %r (token %s)", self.kind, self.name, self.token)
                return self
            if time.monotonic() >= deadline:
                with _tokens_lock:
                    _tokens_of_this_process.discard(self.token)
                raise InstanceInUse(
                    f"{self.kind} instance id {self.name!r} is in use by a live process (pid "
                    f"{holder.pid} on {holder.host.split('/')[0]}, last heartbeat "
                    f"{holder.heartbeat_at:%Y-%m-%d %H:%M:%S} UTC); give each coordinator sharing "
                    "this database its own instance_id, or stop the other one"
                )
            if not logged:
                _log.warning(
                    "%s instance id %r is held by pid %d on %s; waiting up to %.0f s for it to "
                    "lapse",
                    self.kind,
                    self.name,
                    holder.pid,
                    holder.host.split("/")[0],
                    wait,
                )
                logged = True
            time.sleep(min(self.interval, max(deadline - time.monotonic(), 0.01)))

    def _try_take(self) -> _Holder | None:
        """Insert or take over the row; the live holder when another process keeps it."""
        for _ in range(5):
            try:
                return self._take_once()
            except IntegrityError:
                continue  # another process inserted it meanwhile: look again
        raise InstanceInUse(f"{self.kind} instance id {self.name!r}: cannot take its row")

    def _take_once(self) -> _Holder | None:
        now = self.clock()
        values = {
            "token": self.token,
            "host": self._host,
            "pid": os.getpid(),
            "started_at": now,
            "heartbeat_at": now,
            "expires_at": now + self.stale_after,
        }
        key = (_instances.c.kind == self.kind, _instances.c.name == self.name)
        with self._db.begin() as connection:
            row = connection.execute(select(_instances).where(*key).with_for_update()).first()
            if row is None:
                connection.execute(
                    insert(_instances).values(kind=self.kind, name=self.name, **values)
                )
                return None
            if (
                row.token != self.token
                and row.expires_at >= now
                and not provably_gone(row.host, row.pid, row.token)
            ):
                return _Holder(row.token, row.host, row.pid, row.heartbeat_at, row.expires_at)
            connection.execute(
                update(_instances).where(*key, _instances.c.token == row.token).values(**values)
            )
            if row.token != self.token:
                _log.info(
                    "%s %r: took over from its previous process (pid %d on %s)",
                    self.kind,
                    self.name,
                    row.pid,
                    row.host.split("/")[0],
                )
            return None

    def _forget_old_engines(self) -> None:
        """Delete rows of standalone engines that are certainly gone (best effort)."""
        now = self.clock()
        try:
            with self._db.begin() as connection:
                rows = connection.execute(
                    select(
                        _instances.c.token,
                        _instances.c.host,
                        _instances.c.pid,
                        _instances.c.expires_at,
                    ).where(_instances.c.kind == ENGINE)
                ).all()
                gone = [
                    row.token
                    for row in rows
                    if row.token != self.token
                    and (
                        row.expires_at < now - _FORGET_AFTER
                        or provably_gone(row.host, row.pid, row.token)
                    )
                ]
                if gone:
                    connection.execute(delete(_instances).where(_instances.c.token.in_(gone)))
        except SQLAlchemyError:
            _log.debug("could not forget old engine rows", exc_info=True)

    # --- heartbeat ----------------------------------------------------------------------------

    def start(self) -> Presence:
        """Start the heartbeat thread (after ``register``)."""
        self._thread = threading.Thread(
            target=self._beat_forever, name=f"presence-{self.kind}", daemon=True
        )
        self._thread.start()
        return self

    def beat(self) -> bool:
        """One heartbeat; ``False`` when it failed (the database is unavailable) or the row was
        taken by another process. Never raises. The heartbeat thread's alone (its connection is
        one thread's at a time)."""
        now = self.clock()
        renewal = {
            "w_kind": self.kind,
            "w_name": self.name,
            "w_token": self.token,
            "heartbeat": now,
            "expires": now + self.stale_after,
        }
        try:
            # One request on a connection kept for it (``KeptConnection``): a beat every 2.5 s
            # through the pool cost 1.9 ms of CPU, most of an idle coordinator's.
            if self._beats.changes(self._renewal, renewal) != 1:
                self._renew_in_transaction(renewal)
        except SQLAlchemyError as error:
            self._healthy_since = None
            self._outage.failed(error, interval=self.interval)
            return False
        self._outage.recovered()
        if self._healthy_since is None:
            self._healthy_since = time.monotonic()
        return not self._lost

    def _renew_in_transaction(self, renewal: dict[str, object]) -> None:
        """The heartbeat found no row of this process: renew it in one transaction with reading
        who holds it, and take it again if nobody does (an operator deleted it). Raises the
        database's errors."""
        now = renewal["heartbeat"]
        with self._db.begin() as connection:
            renewed = connection.execute(_RENEWAL, renewal).rowcount
            if renewed != 1:
                holder = connection.execute(
                    select(_instances.c.token).where(
                        _instances.c.kind == self.kind, _instances.c.name == self.name
                    )
                ).scalar_one_or_none()
                if holder is None:  # deleted (by an operator): ours again
                    connection.execute(
                        insert(_instances).values(
                            kind=self.kind,
                            name=self.name,
                            token=self.token,
                            host=self._host,
                            pid=os.getpid(),
                            started_at=now,
                            heartbeat_at=now,
                            expires_at=renewal["expires"],
                        )
                    )
                elif not self._lost:
                    self._lost = True
                    _log.error(
                        "%s instance id %r was taken over by another process while this one "
                        "looked gone; this process's jobs now belong to others",
                        self.kind,
                        self.name,
                    )

    def _beat_forever(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.beat()
            except Exception:  # never let the heartbeat die
                _log.exception("heartbeat failed unexpectedly")

    @property
    def lost(self) -> bool:
        """Another process took this instance id over (this one looked gone)."""
        return self._lost

    def sees_the_living(self) -> bool:
        """Whether this process has been in touch with the database for a whole expiry period,
        so that an expired row it reads is one whose process really stopped renewing it."""
        since = self._healthy_since
        return (
            not self._lost
            and since is not None
            and time.monotonic() - since >= self.stale_after.total_seconds()
        )

    def stop_beating(self) -> None:
        """Stop the heartbeat and leave the row to expire, as a killed process does (tests)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._beats.close()

    def close(self) -> None:
        """Stop beating and delete the row (best effort): what this process owned is free now."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._beats.close()
        try:
            with self._db.begin() as connection:
                connection.execute(delete(_instances).where(_instances.c.token == self.token))
        except SQLAlchemyError:
            _log.warning("could not delete the row of %s %r", self.kind, self.name)
        with _tokens_lock:
            _tokens_of_this_process.discard(self.token)
