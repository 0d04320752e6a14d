"""The byte-exact test vectors of ``shared/reference/vectors`` (beside the checkout)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

VECTORS_DIR = Path(__file__).resolve().parents[2] / "shared" / "reference" / "vectors"


def load_vector(name: str) -> Any:
    """The parsed vector file ``name``; a missing file fails the test (it is a contract)."""
    path = VECTORS_DIR / name
    assert path.is_file(), f"test vector {path} is missing"
    return json.loads(path.read_text(encoding="utf-8"))
