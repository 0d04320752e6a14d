"""The package as a user gets it: a wheel, installed into a fresh virtual environment outside the
checkout, gives a ``coordinator`` whose commands work with no source checkout at hand.

How, and why so:

* The wheel is built by ``pip wheel --no-deps --no-build-isolation``: offline, with the test
  environment's setuptools as the build backend (the test extra requires the version
  ``[build-system]`` does). It is built from a copy of the files a build reads (``BUILD_INPUTS``):
  an in-tree build would leave ``build/`` and ``*.egg-info`` in the checkout, which others share.
* The environment is made by ``venv --without-pip`` in a temporary directory, and the wheel is
  installed into it by this environment's pip (``pip --python``) with its dependencies resolved
  from the package registry, as a user's install would: that is what shows the declared
  dependencies suffice (graphviz, only an extra, is not installed, so the SVG is skipped). Measured
  on a CI-sized machine (2 cores) without a pip cache: 30-40 s for the build and the install, 45 s
  for the whole module. Past ~90 s, installing ``--no-deps`` and borrowing the test environment's
  site-packages through a ``.pth`` line would be the better trade; it is not needed.
* Every command runs from a temporary working directory, with ``COORDINATOR_HOME`` in it, without
  ``PYTHONPATH`` or any other ``COORDINATOR_*`` variable, and the ``coordinator`` it imports is
  checked to be the environment's copy.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from coordinator.config.locations import DATA_DIR_ENV, PROJECT_ROOT
from coordinator.store import migrate

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

BUILD_INPUTS = ("pyproject.toml", "setup.py", "README.md", "LICENSE", "coordinator", "migrations")
_PIP = (sys.executable, "-m", "pip", "-q", "--disable-pip-version-check")


@dataclass(frozen=True)
class Installed:
    """A virtual environment with the wheel installed, and where its commands run."""

    bin: Path
    cwd: Path
    home: Path
    environment: dict[str, str]

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        completed = subprocess.run(
            [str(self.bin / args[0]), *args[1:]],
            cwd=self.cwd,
            env=self.environment,
            capture_output=True,
            text=True,
            check=False,
            timeout=300,
        )
        if check:
            assert completed.returncode == 0, (args, completed.stdout, completed.stderr)
        return completed


def _build_wheel(work: Path) -> Path:
    source = work / "source"
    source.mkdir()
    for name in BUILD_INPUTS:
        origin = PROJECT_ROOT / name
        if origin.is_dir():
            shutil.copytree(origin, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(origin, source / name)
    dist = work / "dist"
    subprocess.run(
        [*_PIP, "wheel", "--no-deps", "--no-build-isolation", "-w", str(dist), str(source)],
        check=True,
        capture_output=True,
        text=True,
    )
    (wheel,) = dist.glob("*.whl")
    return wheel


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    work = tmp_path_factory.mktemp("wheel")
    assert not work.resolve().is_relative_to(PROJECT_ROOT)
    wheel = _build_wheel(work)
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    install = subprocess.run(
        [*_PIP, "--python", str(python), "install", str(wheel)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    cwd = work / "cwd"
    cwd.mkdir()
    home = work / "home"
    environment = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("COORDINATOR_", "PYTHON", "VIRTUAL_ENV"))
    }
    environment[DATA_DIR_ENV] = str(home)
    environment["PATH"] = os.pathsep.join([str(venv / "bin"), environment.get("PATH", "")])
    return Installed(bin=venv / "bin", cwd=cwd, home=home, environment=environment)


def test_the_environment_runs_its_own_copy_of_the_package(installed: Installed) -> None:
    imported = installed.run(
        "python",
        "-c",
        "import coordinator; from coordinator.store import migrate;"
        "print(coordinator.__file__); print(migrate.migrations_location())",
    ).stdout.splitlines()
    package = Path(imported[0]).resolve()
    assert package.is_relative_to(installed.bin.parent.resolve()), package
    assert not package.is_relative_to(PROJECT_ROOT)
    assert imported[1] == migrate.PACKAGED_MIGRATIONS
    version = installed.run("coordinator", "--version").stdout
    assert version.startswith("coordinator ")
    # Graphviz is only an extra: the base install goes without it.
    assert installed.run("python", "-c", "import graphviz", check=False).returncode != 0


def test_the_commands_work_from_the_installed_wheel(installed: Installed) -> None:
    upgraded = installed.run("coordinator", "db", "upgrade")
    assert f"schema at revision {migrate.head_revision()}" in upgraded.stdout
    assert (installed.home / "coordinator.db").is_file()
    demo = installed.run("coordinator", "demo")
    assert "Job 1: Succeeded" in demo.stdout, demo.stdout
    assert "Compression ratio:" in demo.stdout
    jobs = installed.run("coordinator", "jobs").stdout
    assert "Succeeded" in jobs, jobs


def test_the_diagrams_are_written_and_checked_outside_a_checkout(installed: Installed) -> None:
    written = installed.run("coordinator", "diagrams")
    diagrams = installed.cwd / "diagrams"
    assert sorted(path.name for path in installed.cwd.iterdir()) == ["diagrams"]
    assert sorted(path.name for path in diagrams.iterdir()) == [
        "job_lifecycle.dot",
        "job_lifecycle.mmd",
    ]
    assert "skipped diagrams/job_lifecycle.svg: the graphviz Python package" in written.stderr
    for name in ("job_lifecycle.dot", "job_lifecycle.mmd"):
        assert (diagrams / name).read_text() == (PROJECT_ROOT / "diagrams" / name).read_text()
    checked = installed.run("coordinator", "diagrams", "--check")
    assert "match the lifecycle definition" in checked.stdout
    assert "not checked: diagrams/job_lifecycle.svg" in checked.stderr
    dot = diagrams / "job_lifecycle.dot"
    dot.write_text(dot.read_text().replace("finalised", "finished"))
    stale = installed.run("coordinator", "diagrams", "--check", check=False)
    assert stale.returncode == 1
    assert "out of date: diagrams/job_lifecycle.dot differs" in stale.stderr
