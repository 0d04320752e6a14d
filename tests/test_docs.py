"""The documentation names only code that exists, and the code cites only the documentation.

* ``README.md`` and ``docs/*.md``: every ``coordinator/…`` path (a ``.py`` file or a folder) exists,
  and every ``tests/test_*.py`` (or bare ``test_*.py``) with an optional ``::name`` exists, the
  name being a function or class defined in that file.
* Every hazard id (``H1`` …) cited in the code, the tests or the documentation has its section in
  ``docs/hazards.md``.
* Files under ``coordinator/`` and ``migrations/`` cite no reference notes kept outside the
  repository (``clp-contract.md``, ``spider-contract.md``, ``database-notes.md``, their ``§``
  sections, ``shared/reference``): what a maintainer needs is in ``docs/``.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


_CODE_PATH = re.compile(r"(?<![\w./-])coordinator/(?:[\w-]+/)*(?:\w+\.py\b|(?=[`\s)]))")
_TEST_REFERENCE = re.compile(r"(?<![\w./-])(?:tests/)?(test_\w+\.py)(?:::(\w+))?")
_HAZARD = re.compile(r"\bH(\d{1,2})\b")
_HAZARD_HEADING = re.compile(r"^## H(\d{1,2}):", re.MULTILINE)
_OUTSIDE_NOTES = re.compile(r"contract\.md|database-notes|shared/reference|§")


def _relative(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


@cache
def _definitions(test_file: Path) -> frozenset[str]:
    tree = ast.parse(test_file.read_text(encoding="utf-8"))
    return frozenset(
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
    )


@pytest.mark.parametrize("document", DOCUMENTS, ids=_relative)
def test_code_paths_named_in_the_documentation_exist(document: Path) -> None:
    named = {match.group(0) for match in _CODE_PATH.finditer(document.read_text(encoding="utf-8"))}
    missing = sorted(path for path in named if not (ROOT / path).exists())
    assert missing == [], f"{_relative(document)} names paths that do not exist: {missing}"


@pytest.mark.parametrize("document", DOCUMENTS, ids=_relative)
def test_tests_named_in_the_documentation_exist(document: Path) -> None:
    text = document.read_text(encoding="utf-8")
    problems = []
    for match in _TEST_REFERENCE.finditer(text):
        file_name, name = match.group(1), match.group(2)
        test_file = ROOT / "tests" / file_name
        if not test_file.is_file():
            problems.append(f"{match.group(0)}: no file tests/{file_name}")
        elif name is not None and name not in _definitions(test_file):
            problems.append(f"{match.group(0)}: tests/{file_name} defines no {name}")
    assert problems == [], f"{_relative(document)}:\n" + "\n".join(sorted(set(problems)))


def _citing_files() -> list[Path]:
    roots = [ROOT / "coordinator", ROOT / "migrations", ROOT / "bench", ROOT / "tests"]
    files = [path for root in roots for path in sorted(root.rglob("*")) if path.is_file()]
    return [
        *DOCUMENTS,
        *(
            path
            for path in files
            if path.suffix in {".py", ".proto", ".md"} and "generated" not in path.parts
        ),
    ]


def test_every_cited_hazard_has_its_section() -> None:
    sections = {int(number) for number in _HAZARD_HEADING.findall(_hazards_text())}
    assert sections == set(range(1, max(sections) + 1)), "hazard sections must be H1, H2, …"
    unknown = sorted(
        f"{_relative(path)}: H{number}"
        for path in _citing_files()
        for number in {int(n) for n in _HAZARD.findall(path.read_text(encoding="utf-8"))}
        if number not in sections
    )
    assert unknown == []


def _hazards_text() -> str:
    return (ROOT / "docs" / "hazards.md").read_text(encoding="utf-8")


def test_the_code_cites_no_notes_kept_outside_the_repository() -> None:
    citing = []
    for root in (ROOT / "coordinator", ROOT / "migrations"):
        for path in sorted(root.rglob("*")):
            relative = _relative(path)
            if not path.is_file() or path.suffix not in {".py", ".proto", ".ini", ".md", ".mako"}:
                continue
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if _OUTSIDE_NOTES.search(line):
                    citing.append(f"{relative}:{number}: {line.strip()}")
    assert citing == [], "cite docs/ instead:\n" + "\n".join(citing)
