"""Archive storage: where compressed archives are stored, on a local directory or in S3.

Below both the service and the engine's tasks: the compress task stores archives here, the
coordinator's clean-up (``coordinator.service.cleanup``) removes and lists them, and ``coordinator
submit`` uses the S3 client factory. It knows nothing of either: it takes only the output settings.

* ``settings``: ``FsArchiveOutput``, ``S3ArchiveOutput`` and their union ``ArchiveOutputSettings``.
* ``storage``: where an archive goes, storing, removing, listing and finding archives.
* ``s3``: the S3 client factory (CLP's authentication) and the bounded retries of S3 calls.
* ``errors``: ``ArchiveStorageError``, raised for every failure an operator can act on (the tasks
  report it as their ``TaskError``).
"""

from coordinator.archive_storage.errors import ArchiveStorageError
from coordinator.archive_storage.settings import (
    ArchiveOutputSettings,
    FsArchiveOutput,
    S3ArchiveOutput,
)

__all__ = ["ArchiveOutputSettings", "ArchiveStorageError", "FsArchiveOutput", "S3ArchiveOutput"]
