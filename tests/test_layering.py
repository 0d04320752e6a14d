"""The layout is enforced: the import contracts of ``pyproject.toml`` hold.

``lint-imports`` (import-linter) reads ``[tool.importlinter]`` and checks every import of the
``coordinator`` package, direct or indirect, against the contracts: the layers (the CLI on top, the
engine and the service independent of each other, the lifecycle at the bottom), the Spider port and
the archive storage on base modules only, and the base modules on nothing but each other. It runs
in a fresh interpreter on the ``coordinator`` package of this test's own checkout (its root first
on the import path), so a scratch worktree with a forbidden import makes this test fail there.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
CONTRACTS = ("layers", "port-and-storage", "base", "base-order")
ROOT = PYPROJECT.parent
LINT_IMPORTS = "from importlinter.cli import lint_imports_command; lint_imports_command()"


def test_the_import_contracts_are_kept() -> None:
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", LINT_IMPORTS, "--no-cache", "--no-logo", str(PYPROJECT)],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONPATH": path},
        timeout=120,
    )
    report = done.stdout + done.stderr
    assert done.returncode == 0, report
    assert f"Contracts: {len(CONTRACTS)} kept, 0 broken." in report, report


def test_every_contract_is_checked() -> None:
    text = PYPROJECT.read_text(encoding="utf-8")
    for contract in CONTRACTS:
        assert f'id = "{contract}"' in text, contract
    assert text.count("[[tool.importlinter.contracts]]") == len(CONTRACTS)
