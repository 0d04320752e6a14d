"""Scratch directories of task instances: one per attempt, locked while it lives, swept after.

The compress task writes its object list and clp-s's output into a fresh directory in the staging
directory, named ``compression-{spider job id}-{task id}-{instance id}-XXXXXXXX`` (the random
suffix of ``tempfile.mkdtemp``); the pattern lives here and nowhere else (``scratch_prefix``,
``SCRATCH_NAME``). The instance removes its directory when it ends, but an instance that is
SIGKILLed cannot: the embedded engine kills it at its hard timeout, a crash kills its executor, and
every executor dies with its coordinator (``PR_SET_PDEATHSIG``). Its directory, with clp-s's partial
output, would stay for ever. So:

* **Liveness is a lock.** ``create_scratch`` takes an exclusive ``flock`` on the directory itself
  and the instance holds it until ``remove_scratch``. The kernel releases it when the process dies,
  however it dies, so whether a directory's instance is alive is known to every process on the host
  without any bookkeeping: two instances of one task, several engines or coordinator replicas
  sharing one staging directory, or a process of another version. A lock file inside the directory
  would do the same but be created after the directory, leaving a moment in which a sweep finds a
  directory with no lock to test; the directory itself exists from the start.
* **A sweep removes only the unlocked.** ``sweep_scratch`` looks at the entries of the staging
  directory whose names match the pattern (directories only, never through a symlink), takes each
  one's lock without waiting, and only when it gets it, and the path still names the directory it
  locked, removes the directory while holding the lock. A held lock (a live instance, in this
  process or any other) means the directory is left alone. Nothing else in the staging directory is
  ever touched (CLP's tasks, if they share it, use ``<staging>/<dataset>``; other files stay).
* **Made under another name, named once locked.** ``mkdtemp`` makes the directory as
  ``.compression-…`` (the *making* name), the instance locks it, then renames it to its scratch
  name; the lock is on the directory, so the rename keeps it. A directory under a scratch name is
  therefore locked from the moment it has that name until its instance ends, and no sweep, of this
  process or another replica, ever takes one a live instance is about to use. A directory whose
  maker died between ``mkdtemp`` and the rename stays under its making name; a whole sweep removes
  it once it is unlocked and older than ``MAKING_ABANDONED_AFTER_SECS`` (its maker would have
  renamed it within microseconds), an instance's sweep at once (the caller knows it ended).
* **Races.** Should a sweep still take a making directory's lock first (its maker stopped for a
  long time), the maker finds it gone (or held) and makes another, so an instance never uses a
  directory it has not locked. An instance removes its own directory while holding the lock; a
  sweep that locks it afterwards finds the path gone and leaves it.
* **Who sweeps**: the embedded engine (``coordinator.engine.embedded.engine``), which hosts the
  instances. As soon as an execution manager has reaped an executor it killed (hard timeout) or
  that crashed, the directories of the instance it was running are swept; the whole staging
  directory is swept when the engine starts, every ``scratch_sweep_interval_secs`` and when it
  closes. So a killed instance's directory is gone before its failure is reported; after a
  coordinator was SIGKILLed, at its restart or at the next sweep of another engine sharing the
  staging directory. A staging directory that no engine uses any more is swept at the next start
  of one on it.
* **A file system that cannot lock directories** (``flock`` failing with anything but "held":
  some network file systems): the instance uses its directory unlocked and logs a warning, and
  sweeps, failing the same way, leave the directory alone (removed only by its instance, as before).
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import re
import shutil
import tempfile
import threading
import time
from pathlib import Path

logger = logging.getLogger(__name__)

SCRATCH_NAME = re.compile(r"compression-(\d+)-([0-9A-Za-z_]+)-(\d+)-([0-9A-Za-z_]+)")
"""A scratch directory's full name: job id, task id, instance id, random suffix."""

MAKING_PREFIX = "."
"""Prefixed to a scratch name while its directory is made and not yet locked."""

MAKING_ABANDONED_AFTER_SECS = 60.0
"""Age past which an unlocked directory under its making name is taken for abandoned."""

_CREATE_ATTEMPTS = 20
_REMOVE_ATTEMPTS = 3

_held: dict[Path, int] = {}
"""Scratch directory → the descriptor holding its lock, for the directories this process uses."""
_held_guard = threading.Lock()


class _CannotLock(OSError):
    """``flock`` failed for another reason than the lock being held (not supported here)."""


def scratch_prefix(job_id: int, task_id: str, instance_id: int) -> str:
    """The name of an instance's scratch directories, up to the random suffix."""
    return f"compression-{job_id}-{task_id}-{instance_id}-"


def create_scratch(staging: Path, job_id: int, task_id: str, instance_id: int) -> Path:
    """A new scratch directory for this instance in ``staging``, locked until ``remove_scratch``.

    Creates ``staging`` when missing. Raises ``OSError`` when it cannot create a directory there.
    """
    staging.mkdir(parents=True, exist_ok=True)
    prefix = MAKING_PREFIX + scratch_prefix(job_id, task_id, instance_id)
    for _ in range(_CREATE_ATTEMPTS):
        making = Path(tempfile.mkdtemp(prefix=prefix, dir=staging))
        path = making.with_name(making.name.removeprefix(MAKING_PREFIX))
        try:
            descriptor = _lock(making)
        except _CannotLock as error:
            logger.warning(
                "cannot lock the scratch directory %s (%s): it is used unlocked, and sweeps leave "
                "it alone",
                path,
                error,
            )
            making.rename(path)
            return path
        if descriptor is None:
            continue  # a sweep locked it first and removes it: make another
        try:
            making.rename(path)
        except OSError:
            os.close(descriptor)
            raise
        with _held_guard:
            _held[path] = descriptor
        return path
    raise OSError(
        errno.EAGAIN,
        f"{_CREATE_ATTEMPTS} new scratch directories were swept away before they could be locked",
        str(staging),
    )


def remove_scratch(path: Path) -> None:
    """Remove a directory ``create_scratch`` made, then release its lock.

    Raises ``OSError`` when it cannot be removed; its lock is released anyway, so a later sweep
    removes it.
    """
    with _held_guard:
        descriptor = _held.pop(path, None)
    try:
        _remove_tree(path)
    finally:
        if descriptor is not None:
            os.close(descriptor)


def sweep_scratch(
    staging: Path,
    *,
    instance: tuple[int, str, int] | None = None,
) -> list[Path]:
    """Remove the scratch directories in ``staging`` whose instance is gone; the paths removed.

    ``instance`` (job id, task id, instance id): only that instance's directories, which the
    caller knows ended (so those under their making name go too, whatever their age). A directory
    whose lock is held is left alone, and so is every entry that is not a scratch directory, and,
    in a whole sweep, one under its making name younger than ``MAKING_ABANDONED_AFTER_SECS``.
    Never raises: a directory that cannot be removed is logged and left to the next sweep.
    """
    prefix = scratch_prefix(*instance) if instance is not None else "compression-"
    made_before = None if instance is not None else time.time() - MAKING_ABANDONED_AFTER_SECS
    try:
        with os.scandir(staging) as listing:
            candidates = [
                Path(entry.path) for entry in listing if _sweepable(entry, prefix, made_before)
            ]
    except FileNotFoundError:
        return []
    except OSError as error:
        logger.warning("cannot list the staging directory %s to sweep it: %s", staging, error)
        return []
    removed: list[Path] = []
    for path in candidates:
        try:
            descriptor = _lock(path)
        except OSError as error:  # cannot tell whether its instance lives: leave it
            logger.debug("scratch directory %s left alone: %s", path, error)
            continue
        if descriptor is None:
            continue  # its instance is alive (or it is gone already)
        try:
            _remove_tree(path)
            removed.append(path)
            logger.info("removed the scratch directory %s of a task instance that is gone", path)
        except OSError as error:
            logger.warning("cannot remove the scratch directory %s: %s", path, error)
        finally:
            os.close(descriptor)
    return removed


def scratch_name(name: str) -> str | None:
    """The scratch name ``name`` is or is made under (``MAKING_PREFIX`` removed); ``None`` for a
    name that is neither."""
    scratch = name.removeprefix(MAKING_PREFIX)
    return scratch if SCRATCH_NAME.fullmatch(scratch) else None


def _sweepable(entry: os.DirEntry[str], prefix: str, made_before: float | None) -> bool:
    """Whether a sweep looks at ``entry``: a directory (not a symlink) under a scratch name that
    starts with ``prefix``, or under its making name and, unless ``made_before`` is ``None``, last
    changed before it. Raises ``OSError`` when ``entry`` cannot be looked at."""
    name = scratch_name(entry.name)
    if name is None or not name.startswith(prefix):
        return False
    making = name != entry.name
    if not entry.is_dir(follow_symlinks=False):
        return False
    return not making or made_before is None or _changed_at(entry) < made_before


def _changed_at(entry: os.DirEntry[str]) -> float:
    """When ``entry`` last changed; now when it is gone (a gone entry is nothing to sweep)."""
    try:
        return entry.stat(follow_symlinks=False).st_mtime
    except FileNotFoundError:
        return time.time()


def _lock(path: Path) -> int | None:
    """A descriptor holding the exclusive lock of the directory ``path`` names (never through a
    symlink); ``None`` when another holds it or ``path`` is gone or names another directory since.

    Raises ``_CannotLock`` when ``flock`` fails otherwise, and ``OSError`` when ``path`` cannot be
    opened as a directory.
    """
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    keep = False
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None
        except OSError as error:
            raise _CannotLock(error.errno, error.strerror) from error
        try:
            named = os.lstat(path)
        except FileNotFoundError:
            return None
        locked = os.fstat(descriptor)
        keep = (named.st_dev, named.st_ino) == (locked.st_dev, locked.st_ino)
        return descriptor if keep else None
    finally:
        if not keep:
            os.close(descriptor)


def _remove_tree(path: Path) -> None:
    """``shutil.rmtree``, tried again when a dying process added an entry meanwhile."""
    for attempt in range(_REMOVE_ATTEMPTS):
        try:
            shutil.rmtree(path)
            return
        except OSError as error:
            if error.errno != errno.ENOTEMPTY or attempt == _REMOVE_ATTEMPTS - 1:
                raise
