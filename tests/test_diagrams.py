"""The committed diagrams are generated from the machine, and the check catches stale ones."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from coordinator.cli.main import main
from coordinator.config.locations import PROJECT_ROOT
from coordinator.lifecycle import EDGES, JobStatus, diagrams

COMMITTED = PROJECT_ROOT / "diagrams"
DOCS = PROJECT_ROOT / "docs"


def test_the_committed_diagrams_are_current() -> None:
    assert diagrams.check(COMMITTED, DOCS) == []
    assert main(["diagrams", "--check"]) == 0


def test_the_diagrams_show_every_state_trigger_and_actor() -> None:
    rendered = diagrams.render()
    for text in (rendered.mermaid, rendered.dot):
        for status in JobStatus:
            assert status.label in text
        for edge in EDGES:
            assert edge.label in text
    for terminal in ("SUCCEEDED", "FAILED", "KILLED"):
        assert f"{terminal} --> [*]" in rendered.mermaid


@pytest.fixture
def copy_of_diagrams(tmp_path: Path) -> Path:
    target = tmp_path / "diagrams"
    shutil.copytree(COMMITTED, target)
    return target


def test_an_edited_mermaid_file_is_reported(copy_of_diagrams: Path) -> None:
    mermaid = copy_of_diagrams / "job_lifecycle.mmd"
    mermaid.write_text(mermaid.read_text().replace("finalised", "finished"))
    assert diagrams.check(copy_of_diagrams, DOCS) == [
        f"{mermaid} differs from the machine definition"
    ]
    assert main(["diagrams", "--check", "--output", str(copy_of_diagrams)]) == 1


def test_a_missing_file_is_reported(copy_of_diagrams: Path) -> None:
    (copy_of_diagrams / "job_lifecycle.dot").unlink()
    assert diagrams.check(copy_of_diagrams, DOCS) == [
        f"{copy_of_diagrams / 'job_lifecycle.dot'} is missing"
    ]


def test_an_svg_drawn_from_another_machine_is_reported(copy_of_diagrams: Path) -> None:
    svg = copy_of_diagrams / "job_lifecycle.svg"
    if not svg.exists():
        pytest.skip("no SVG committed")
    svg.write_text(svg.read_text().replace("dot-source-sha256: ", "dot-source-sha256: 00"))
    assert diagrams.check(copy_of_diagrams, DOCS) == [
        f"{svg} was drawn from another version of the machine"
    ]


def test_writing_regenerates_what_the_check_expects(tmp_path: Path) -> None:
    assert main(["diagrams", "--output", str(tmp_path), "--docs", str(tmp_path / "docs")]) == 0
    assert diagrams.check(tmp_path, tmp_path / "docs") == []
    assert (tmp_path / "docs" / "lifecycle.md").read_text() == (DOCS / "lifecycle.md").read_text()
    assert (tmp_path / "job_lifecycle.mmd").read_text() == (
        COMMITTED / "job_lifecycle.mmd"
    ).read_text()


def test_the_diagrams_show_which_spider_outcomes_take_each_edge() -> None:
    mermaid = diagrams.render().mermaid
    assert (
        "COMMITTED --> SUCCEEDED: finalised (coordinator) on Spider Succeeded / unknown" in mermaid
    )
    assert "RUNNING --> COMMITTED: committed (commit_task)\n" in mermaid  # not a reaction


def test_an_edited_lifecycle_document_is_reported(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    shutil.copytree(DOCS, docs)
    document = docs / "lifecycle.md"
    document.write_text(document.read_text().replace("rolled_back", "rolled back", 1))
    assert diagrams.check(COMMITTED, docs) == [f"{document} differs from the machine definition"]
    args = ["diagrams", "--check", "--docs", str(docs)]
    assert main(args) == 1
