"""Named points where a test can make the coordinator die abruptly, as a SIGKILL would.

``COORDINATOR_CRASH_AT=<point>`` makes the process exit at once (status 137, no clean-up, no
``finally``) the first time it reaches that point. Unset, these calls do nothing. The crash tests
use them to stop the coordinator at each step of a job and check that a restart completes it.
"""

from __future__ import annotations

import os

CRASH_ENV = "COORDINATOR_CRASH_AT"
CRASH_EXIT_STATUS = 137

POINTS = ("claimed", "registered", "submitted", "started", "finalising")
"""After claiming a job; after RegisterJob, before recording it; after recording it, before
StartJob; after StartJob; before applying Spider's final outcome."""


def crashpoint(point: str) -> None:
    """Exit immediately if ``$COORDINATOR_CRASH_AT`` names ``point``."""
    if os.environ.get(CRASH_ENV) == point:
        os._exit(CRASH_EXIT_STATUS)
