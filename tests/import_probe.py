"""Which modules a fresh interpreter holds after running a ``coordinator`` command (or another
action): start-up time checked without timing (issue 14)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence

from coordinator.config.locations import CONFIG_ENV, DATA_DIR_ENV, DATABASE_URL_ENV

RUN_COMMAND = "runpy.run_module('coordinator', run_name='__main__')"
"""The default action: the ``coordinator`` command with the probe's arguments."""

_REPORT = """
import json, runpy, sys
watched = json.loads(sys.argv[2])
sys.argv = ["coordinator", *json.loads(sys.argv[1])]
try:
    {action}
except SystemExit as exit:
    code = exit.code
else:
    code = 0
loaded = sorted(name for name in watched if name in sys.modules)
print("IMPORTED " + json.dumps([code, loaded]), file=sys.stderr)
"""


def imported_after(
    argv: Sequence[str], watched: Sequence[str], *, action: str = RUN_COMMAND
) -> tuple[object, set[str]]:
    """The exit code of ``action`` (default: ``coordinator *argv``) in a fresh interpreter, with
    no configuration from the environment, and which of ``watched`` it had imported."""
    environment = {
        name: value
        for name, value in os.environ.items()
        if name not in {CONFIG_ENV, DATA_DIR_ENV, DATABASE_URL_ENV}
    }
    finished = subprocess.run(
        [
            sys.executable,
            "-c",
            _REPORT.format(action=action),
            json.dumps(list(argv)),
            json.dumps(list(watched)),
        ],
        capture_output=True,
        text=True,
        env=environment,
        timeout=120,
        check=False,
    )
    lines = [line for line in finished.stderr.splitlines() if line.startswith("IMPORTED ")]
    assert lines, finished.stderr
    code, imported = json.loads(lines[-1].removeprefix("IMPORTED "))
    return code, set(imported)
