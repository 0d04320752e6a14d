"""What went wrong in the archive storage, said by its cause."""

from __future__ import annotations

import os

from coordinator.errors import CoordinatorError


class ArchiveStorageError(CoordinatorError):
    """An archive could not be stored, removed, listed or looked at; the message says which
    archive, where, and why (``no space left on device (errno 28)``, ``bucket b does not exist
    (NoSuchBucket, HTTP 404)``, unusable credentials, …)."""


def describe_os_error(error: OSError) -> str:
    """``no space left on device (errno 28)``: the cause of a failed file operation, by errno."""
    if error.errno is None:
        return str(error)
    reason = os.strerror(error.errno)
    reason = reason[:1].lower() + reason[1:]
    return f"{reason} (errno {error.errno})"
