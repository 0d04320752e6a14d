"""The container image and its deployment files (``Dockerfile``, ``deploy/``), without Docker.

* ``deploy/docker/entrypoint.sh`` runs against a fake ``coordinator`` first on ``PATH`` that
  records its argv, pid and environment: the exact command of each mode, ``--config``/``-c``,
  CLP's own command (the Rust binary's path first), the translation of ``RUST_LOG`` into
  ``--log-level``, ``exec`` (the same pid; SIGTERM reaches the coordinator; its exit status is the
  container's) and the usage errors (exit 2). ShellCheck lints it.
* The Dockerfile: hadolint, two stages, the wheel built in the first, a non-root user, the
  entrypoint and CLP's binary path, every file it copies present and allowed by ``.dockerignore``.
* The Compose override and the Helm template: parsed, CLP's command, environment and mounts kept,
  the schema step before the service; every command they give the image is run through the
  entrypoint, and every value and helper the Helm template reads exists.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
ENTRYPOINT = ROOT / "deploy" / "docker" / "entrypoint.sh"
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
COMPOSE = ROOT / "deploy" / "compose" / "compose.coordinator.yaml"
HELM = ROOT / "deploy" / "helm"
HELM_VALUES = HELM / "values-coordinator.yaml"
HELM_DEPLOYMENT = HELM / "templates" / "compression-coordinator-deployment.yaml"
HELM_HELPERS = HELM / "templates" / "_coordinator-config.tpl"
TOOLS = Path(sys.executable).parent

CLP_CONFIG = "/etc/clp-config.yaml"
RUST_BINARY = "/opt/clp/bin/compression-coordinator"
CLP_COMMAND = [RUST_BINARY, "--config", CLP_CONFIG]
"""How CLP's Compose file and Helm chart start the Rust coordinator."""
IMAGE_ENTRYPOINT = "/usr/local/bin/coordinator-entrypoint"

RECORDED_ENV = (
    "CLP_DB_USER",
    "CLP_DB_PASS",
    "CLP_LOGS_DIR",
    "OTEL_SERVICE_NAME",
    "RUST_LOG",
    "COORDINATOR_LOG_LEVEL",
)

FAKE_COORDINATOR = """#!{python} -S
import json, os, signal, sys, time

def record(**extra):
    path = os.environ["FAKE_COORDINATOR_RECORD"]
    document = {{
        "pid": os.getpid(),
        "argv": sys.argv[1:],
        "env": {{name: os.environ.get(name) for name in {names!r}}},
        **extra,
    }}
    with open(path + ".tmp", "w") as file:
        json.dump(document, file)
    os.replace(path + ".tmp", path)

if os.environ.get("FAKE_COORDINATOR_WAIT"):
    def stop(number, frame):
        record(signal=signal.Signals(number).name)
        sys.exit(0)
    signal.signal(signal.SIGTERM, stop)
    record(signal=None)
    time.sleep(10)
    sys.exit(3)
record()
sys.exit(int(os.environ.get("FAKE_COORDINATOR_EXIT", "0")))
"""


@dataclass(frozen=True)
class Run:
    """One run of the entrypoint: its status, output, and what the fake coordinator recorded."""

    returncode: int
    stdout: str
    stderr: str
    pid: int
    record: dict[str, Any] | None

    @property
    def argv(self) -> list[str]:
        assert self.record is not None, f"the coordinator did not run: {self.stderr}"
        argv: list[str] = self.record["argv"]
        return argv


@pytest.fixture
def fake_bin(tmp_path: Path) -> Path:
    """A directory holding the fake ``coordinator``."""
    directory = tmp_path / "bin"
    directory.mkdir()
    fake = directory / "coordinator"
    fake.write_text(FAKE_COORDINATOR.format(python=sys.executable, names=RECORDED_ENV))
    fake.chmod(0o755)
    return directory


def _environment(fake_bin: Path, extra: Mapping[str, str]) -> dict[str, str]:
    return {
        "PATH": f"{fake_bin}:/usr/local/bin:/usr/bin:/bin",
        "FAKE_COORDINATOR_RECORD": str(fake_bin.parent / "record.json"),
        **extra,
    }


def run_entrypoint(
    fake_bin: Path, *args: str, env: Mapping[str, str] | None = None, script: Path = ENTRYPOINT
) -> Run:
    """Run the entrypoint (or a link to it) with ``args``; the fake coordinator's record."""
    record_path = fake_bin.parent / "record.json"
    record_path.unlink(missing_ok=True)
    process = subprocess.Popen(
        [str(script), *args],
        env=_environment(fake_bin, env or {}),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    stdout, stderr = process.communicate(timeout=30)
    record = json.loads(record_path.read_text()) if record_path.exists() else None
    return Run(process.returncode, stdout, stderr, process.pid, record)


# --- the entrypoint: modes and arguments -------------------------------------------------------


def test_clps_command_runs_the_service(fake_bin: Path) -> None:
    """Compose passes CLP's command after the image's entrypoint: the Rust binary's path first."""
    run = run_entrypoint(fake_bin, *CLP_COMMAND)
    assert (run.returncode, run.argv) == (0, ["run", "--config", CLP_CONFIG])


def test_the_rust_binarys_path_is_the_entrypoint(fake_bin: Path, tmp_path: Path) -> None:
    """Kubernetes' ``command`` replaces the entrypoint: the image's link runs the same script."""
    link = tmp_path / "opt" / "clp" / "bin" / "compression-coordinator"
    link.parent.mkdir(parents=True)
    link.symlink_to(ENTRYPOINT)
    run = run_entrypoint(fake_bin, "--config", CLP_CONFIG, script=link)
    assert (run.returncode, run.argv) == (0, ["run", "--config", CLP_CONFIG])


def test_no_arguments_run_the_service_on_clps_configuration(fake_bin: Path) -> None:
    assert run_entrypoint(fake_bin).argv == ["run", "--config", CLP_CONFIG]


@pytest.mark.parametrize(
    ("mode", "command"),
    [
        ("run", ["run"]),
        ("db-upgrade", ["db", "upgrade"]),
        ("upgrade", ["db", "upgrade"]),
        ("health", ["health"]),
    ],
)
def test_each_mode_runs_its_command(fake_bin: Path, mode: str, command: list[str]) -> None:
    run = run_entrypoint(fake_bin, mode)
    assert (run.returncode, run.argv) == (0, [*command, "--config", CLP_CONFIG])
    run = run_entrypoint(fake_bin, mode, "--config", "/srv/clp.yaml")
    assert run.argv == [*command, "--config", "/srv/clp.yaml"]


@pytest.mark.parametrize(
    "options",
    [
        ["-c", "/srv/clp.yaml"],
        ["--config", "/srv/clp.yaml"],
        ["--config=/srv/clp.yaml"],
        ["-c/srv/clp.yaml"],
        ["--config", "/first.yaml", "-c", "/srv/clp.yaml"],
    ],
    ids=["short", "long", "long-equals", "short-attached", "last-wins"],
)
def test_config_option_forms(fake_bin: Path, options: list[str]) -> None:
    assert run_entrypoint(fake_bin, "health", *options).argv == [
        "health",
        "--config",
        "/srv/clp.yaml",
    ]


def test_other_arguments_pass_through_in_order(fake_bin: Path) -> None:
    run = run_entrypoint(
        fake_bin, "run", "--until-idle", "-c", "/srv/clp.yaml", "--data-dir", "/d i r", "*"
    )
    assert run.argv == [
        "run",
        "--config",
        "/srv/clp.yaml",
        "--until-idle",
        "--data-dir",
        "/d i r",
        "*",
    ]


def test_arguments_after_a_double_dash_are_not_options(fake_bin: Path) -> None:
    run = run_entrypoint(fake_bin, "db-upgrade", "--", "--config", "head")
    assert run.argv == ["db", "upgrade", "--config", CLP_CONFIG, "--", "--config", "head"]


def test_the_coordinator_mode_passes_every_argument_unchanged(fake_bin: Path) -> None:
    run = run_entrypoint(fake_bin, "coordinator", "show", "7", "--json", "-c", "/x y.yaml")
    assert run.argv == ["show", "7", "--json", "-c", "/x y.yaml"]


def test_the_environment_passes_through(fake_bin: Path) -> None:
    env = {
        "CLP_DB_USER": "clp-user",
        "CLP_DB_PASS": "p a$$ 'w",
        "CLP_LOGS_DIR": "/var/log/compression_coordinator",
        "OTEL_SERVICE_NAME": "compression-coordinator",
    }
    run = run_entrypoint(fake_bin, *CLP_COMMAND, env=env)
    assert run.record is not None
    assert {name: run.record["env"][name] for name in env} == env


# --- the entrypoint: RUST_LOG ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rust_log", "level"),
    [
        ("INFO", "info"),
        ("info", "info"),
        ("DEBUG", "debug"),
        ("trace", "debug"),
        ("WARN", "warning"),
        ("warning", "warning"),
        ("Error", "error"),
        ("off", "error"),
        ("3", "info"),
        ("info,h2=debug", "info"),
        (" info , tower = trace ", "info"),
        ("warn,compression_coordinator=debug", "debug"),
        ("compression_coordinator::job_handle=error,info", "error"),
        ("compression_coordinator[submit{job=3}]=warn,debug", "warning"),
        ("debug,compression_coordinator", "debug"),
        ("error,compression_coordinator", "debug"),
    ],
)
def test_rust_log_becomes_the_log_level(fake_bin: Path, rust_log: str, level: str) -> None:
    run = run_entrypoint(fake_bin, *CLP_COMMAND, env={"RUST_LOG": rust_log})
    assert run.argv == ["run", "--config", CLP_CONFIG, "--log-level", level]
    assert run.stderr == ""


@pytest.mark.parametrize("rust_log", ["", "h2=debug", "verbose", ","])
def test_rust_log_without_a_level_sets_none(fake_bin: Path, rust_log: str) -> None:
    run = run_entrypoint(fake_bin, *CLP_COMMAND, env={"RUST_LOG": rust_log})
    assert (run.returncode, run.argv) == (0, ["run", "--config", CLP_CONFIG])
    if rust_log:
        assert f"RUST_LOG='{rust_log}' names no log level" in run.stderr


def test_coordinator_log_level_wins_over_rust_log(fake_bin: Path) -> None:
    """The coordinator reads COORDINATOR_LOG_LEVEL itself: no option hides it."""
    env = {"RUST_LOG": "debug", "COORDINATOR_LOG_LEVEL": "error"}
    run = run_entrypoint(fake_bin, *CLP_COMMAND, env=env)
    assert run.record is not None
    assert run.argv == ["run", "--config", CLP_CONFIG]
    assert run.record["env"]["COORDINATOR_LOG_LEVEL"] == "error"


def test_a_log_level_on_the_command_line_comes_last_and_wins(fake_bin: Path) -> None:
    run = run_entrypoint(fake_bin, "run", "--log-level", "error", env={"RUST_LOG": "INFO"})
    assert run.argv == [
        "run",
        "--config",
        CLP_CONFIG,
        "--log-level",
        "info",
        "--log-level",
        "error",
    ]


def test_rust_log_reaches_the_schema_step_but_not_the_health_check(fake_bin: Path) -> None:
    env = {"RUST_LOG": "WARN"}
    assert run_entrypoint(fake_bin, "db-upgrade", env=env).argv == [
        "db",
        "upgrade",
        "--config",
        CLP_CONFIG,
        "--log-level",
        "warning",
    ]
    assert run_entrypoint(fake_bin, "health", env=env).argv == ["health", "--config", CLP_CONFIG]


# --- the entrypoint: exec and errors -----------------------------------------------------------


def test_the_coordinator_replaces_the_script(fake_bin: Path) -> None:
    """``exec``: the coordinator keeps the script's pid (the container's pid 1)."""
    run = run_entrypoint(fake_bin, *CLP_COMMAND)
    assert run.record is not None
    assert run.record["pid"] == run.pid


@pytest.mark.parametrize("status", [0, 1, 2, 3])
def test_the_coordinators_exit_status_is_the_containers(fake_bin: Path, status: int) -> None:
    run = run_entrypoint(fake_bin, "health", env={"FAKE_COORDINATOR_EXIT": str(status)})
    assert run.returncode == status


def test_sigterm_reaches_the_coordinator(fake_bin: Path) -> None:
    record_path = fake_bin.parent / "record.json"
    process = subprocess.Popen(
        [str(ENTRYPOINT), *CLP_COMMAND],
        env=_environment(fake_bin, {"FAKE_COORDINATOR_WAIT": "1"}),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 20
        while not record_path.exists():
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "the coordinator never started"
            time.sleep(0.02)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate()
    assert json.loads(record_path.read_text())["signal"] == "SIGTERM"


def test_an_unknown_mode_is_a_usage_error(fake_bin: Path) -> None:
    run = run_entrypoint(fake_bin, "serve", "--config", CLP_CONFIG)
    assert (run.returncode, run.record) == (2, None)
    assert "unknown mode 'serve'" in run.stderr
    assert "run, db-upgrade, upgrade, health, coordinator, help" in run.stderr


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--config"], "--config needs a path"),
        (["run", "-c"], "-c needs a path"),
        (["health", "--config="], "--config needs a path"),
        (["db-upgrade", "--config", ""], "--config needs a path"),
    ],
)
def test_a_config_option_without_a_path_is_a_usage_error(
    fake_bin: Path, options: list[str], message: str
) -> None:
    run = run_entrypoint(fake_bin, *options)
    assert (run.returncode, run.record) == (2, None)
    assert message in run.stderr


def test_help_lists_the_modes(fake_bin: Path) -> None:
    run = run_entrypoint(fake_bin, "help")
    assert (run.returncode, run.record, run.stderr) == (0, None, "")
    for mode in ("run", "db-upgrade|upgrade", "health", "coordinator ARG...", "help"):
        assert re.search(rf"^  {re.escape(mode)} ", run.stdout, re.MULTILINE), mode
    assert "RUST_LOG" in run.stdout
    assert "set -euo pipefail" not in run.stdout


def test_the_entrypoint_is_executable_strict_bash() -> None:
    text = ENTRYPOINT.read_text()
    assert os.access(ENTRYPOINT, os.X_OK)
    assert text.startswith("#!/usr/bin/env bash\n")
    assert "\nset -euo pipefail\n" in text


def _assert_linter_finds_nothing(tool: str, *arguments: str) -> None:
    result = subprocess.run(
        [str(TOOLS / tool), *arguments], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_shellcheck_finds_nothing_in_the_entrypoint() -> None:
    _assert_linter_finds_nothing("shellcheck", "--severity=style", str(ENTRYPOINT))


# --- the Dockerfile ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Instruction:
    keyword: str
    arguments: str


def _instructions() -> list[Instruction]:
    """The Dockerfile's instructions, continuation lines joined and comments dropped."""
    logical, pending = [], ""
    for line in DOCKERFILE.read_text().splitlines():
        if line.lstrip().startswith("#") or not line.strip():
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    assert pending == "", "the Dockerfile ends in a continuation"
    result = []
    for text in logical:
        keyword, _, arguments = text.strip().partition(" ")
        result.append(Instruction(keyword.upper(), " ".join(arguments.split())))
    return result


def _stages() -> list[list[Instruction]]:
    stages: list[list[Instruction]] = []
    for instruction in _instructions():
        if instruction.keyword == "FROM":
            stages.append([])
        if stages:
            stages[-1].append(instruction)
    return stages


def _copies(stage: list[Instruction]) -> list[tuple[list[str], list[str], str]]:
    """Each COPY of ``stage``: its flags, sources and destination."""
    copies = []
    for instruction in stage:
        if instruction.keyword == "COPY":
            words = shlex.split(instruction.arguments)
            flags = [word for word in words if word.startswith("--")]
            paths = [word for word in words if not word.startswith("--")]
            copies.append((flags, paths[:-1], paths[-1]))
    return copies


def _exec_form(instruction: Instruction) -> list[str]:
    value: list[str] = json.loads(instruction.arguments)
    return value


def _final(keyword: str) -> Instruction:
    matches = [i for i in _stages()[-1] if i.keyword == keyword]
    assert matches, f"the runtime stage has no {keyword}"
    return matches[-1]


def test_hadolint_finds_nothing_in_the_dockerfile() -> None:
    _assert_linter_finds_nothing("hadolint", "--no-color", str(DOCKERFILE))


def test_the_wheel_is_built_in_a_stage_of_its_own() -> None:
    build, *_, runtime = _stages()
    assert build[0].arguments.endswith(" AS build")
    assert any(i.keyword == "RUN" and "pip wheel" in i.arguments for i in build)
    install = [i for i in runtime if i.keyword == "RUN" and "pip " in i.arguments]
    assert len(install) == 1
    assert "from=build" in install[0].arguments  # the wheels come from the build stage
    assert "--no-index" in install[0].arguments  # and from nowhere else
    runtime_text = " ".join(i.arguments for i in runtime)
    for tool in ("apt-get", "gcc", "build-essential", "pip wheel"):
        assert tool not in runtime_text


def test_the_build_stage_copies_what_the_wheel_needs() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text()
    readme = re.search(r'^readme = "([^"]+)"', pyproject, re.MULTILINE)
    assert readme is not None
    copied = {source.rstrip("/") for _, sources, _ in _copies(_stages()[0]) for source in sources}
    needed = {"pyproject.toml", readme.group(1), "LICENSE", "coordinator", "migrations"}
    if (ROOT / "setup.py").exists():
        needed.add("setup.py")
    assert needed <= copied


def test_the_runtime_runs_as_a_user_who_is_not_root() -> None:
    user = _final("USER").arguments.split(":")[0]
    assert user not in {"root", "0"}


def test_the_image_runs_the_entrypoint_and_links_the_rust_binarys_path() -> None:
    assert _exec_form(_final("ENTRYPOINT")) == [IMAGE_ENTRYPOINT]
    copies = {dest: sources for _, sources, dest in _copies(_stages()[-1])}
    assert copies[IMAGE_ENTRYPOINT] == [ENTRYPOINT.relative_to(ROOT).as_posix()]
    link = f"ln -s {IMAGE_ENTRYPOINT} {RUST_BINARY}"
    assert any(i.keyword == "RUN" and link in i.arguments for i in _stages()[-1])


def test_every_file_the_dockerfile_copies_exists_and_is_in_the_context() -> None:
    ignore = [
        line.strip()
        for line in DOCKERIGNORE.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert ignore[0] == "*", ".dockerignore is an allow-list"
    for stage in _stages():
        for flags, sources, _ in _copies(stage):
            if any(flag.startswith("--from") for flag in flags):
                continue
            for source in sources:
                assert (ROOT / source).exists(), source
                assert {f"!{source}", f"!{source.rstrip('/')}/"} & set(ignore), source
    for kept_out in (".git", ".venv", "var", "tests", ".pytest_cache", "bench"):
        assert not any(line.lstrip("!").startswith(kept_out) for line in ignore[1:]), kept_out
    assert "**/__pycache__" in ignore


def test_the_images_own_commands_go_through_the_entrypoint(fake_bin: Path) -> None:
    cmd = _exec_form(_final("CMD"))
    assert run_entrypoint(fake_bin, *cmd).argv == ["run", "--config", CLP_CONFIG]
    healthcheck = _final("HEALTHCHECK").arguments
    probe = json.loads(healthcheck[healthcheck.index("CMD ") + 4 :])
    assert probe[0] == IMAGE_ENTRYPOINT
    assert run_entrypoint(fake_bin, *probe[1:]).argv == ["health", "--config", CLP_CONFIG]


# --- Compose -----------------------------------------------------------------------------------


def _compose_services() -> dict[str, Any]:
    services: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())["services"]
    return services


def test_compose_keeps_clps_command_environment_and_mount() -> None:
    service = _compose_services()["compression-coordinator"]
    assert service["command"] == CLP_COMMAND
    assert service["entrypoint"] == [IMAGE_ENTRYPOINT]
    assert service["environment"] == {
        "CLP_DB_PASS": "${CLP_DB_PASS:?Please set a value.}",
        "CLP_DB_USER": "${CLP_DB_USER:-clp-user}",
        "OTEL_SERVICE_NAME": "compression-coordinator",
        "RUST_LOG": "${CLP_COMPRESSION_COORDINATOR_LOGGING_LEVEL:-INFO}",
    }
    [mount] = service["volumes"]
    assert (mount["target"], mount["read_only"]) == (CLP_CONFIG, True)
    assert service["stop_grace_period"] == "60s"


def test_compose_runs_the_schema_step_before_the_service() -> None:
    services = _compose_services()
    step = services["compression-coordinator-db-upgrade"]
    assert services["compression-coordinator"]["depends_on"] == {
        "compression-coordinator-db-upgrade": {"condition": "service_completed_successfully"}
    }
    assert step["depends_on"] == {
        "db-table-creator": {"condition": "service_completed_successfully"}
    }
    assert step["image"] == services["compression-coordinator"]["image"]
    assert set(step["environment"]) >= {"CLP_DB_USER", "CLP_DB_PASS"}
    assert step["healthcheck"] == {"disable": True}


def test_composes_commands_go_through_the_entrypoint(fake_bin: Path) -> None:
    services = _compose_services()
    service, step = (
        services["compression-coordinator"],
        services["compression-coordinator-db-upgrade"],
    )
    assert run_entrypoint(fake_bin, *service["command"]).argv == ["run", "--config", CLP_CONFIG]
    assert run_entrypoint(fake_bin, *step["command"]).argv == [
        "db",
        "upgrade",
        "--config",
        CLP_CONFIG,
    ]
    kind, binary, *arguments = service["healthcheck"]["test"]
    assert (kind, binary) == ("CMD", RUST_BINARY)
    assert run_entrypoint(fake_bin, *arguments).argv == ["health", "--config", CLP_CONFIG]


# --- Helm --------------------------------------------------------------------------------------

CLP_CHART_VALUES = {"spider.enabled"}
"""Values the template reads from CLP's chart rather than from values-coordinator.yaml."""
CLP_CHART_HELPERS = {"clp.fullname", "clp.labels", "clp.selectorLabels", "clp.waitFor"}
"""Helpers of CLP's chart (its ``_helpers.tpl``) the template uses."""
_TEMPLATE_ACTION = re.compile(r"\{\{-?\s*(.*?)\s*-?\}\}", re.DOTALL)
_CONTROL = ("/*", "if ", "else", "end", "range ", "with ", "define ")


def _values() -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load(HELM_VALUES.read_text())
    return values


def _lookup(values: Mapping[str, Any], dotted: str) -> Any:
    node: Any = values
    for key in dotted.split("."):
        assert isinstance(node, Mapping) and key in node, f"values-coordinator.yaml has no {dotted}"
        node = node[key]
    return node


def _skeleton(template: str) -> Any:
    """The template as YAML: control actions, blocks and assignments dropped, each expression
    replaced by ``TEMPLATED`` (both branches of an ``if`` stay)."""

    def replace(action: re.Match[str]) -> str:
        body = action.group(1)
        if body.startswith(_CONTROL) or ":=" in body or "nindent" in body:
            return ""
        return "TEMPLATED"

    lines = _TEMPLATE_ACTION.sub(replace, template).splitlines()
    return yaml.safe_load("\n".join(line for line in lines if line.strip()))


def _deployment() -> dict[str, Any]:
    skeleton: dict[str, Any] = _skeleton(HELM_DEPLOYMENT.read_text())
    assert (skeleton["apiVersion"], skeleton["kind"]) == ("apps/v1", "Deployment")
    return skeleton


def _env(container: Mapping[str, Any]) -> dict[str, Any]:
    return {variable["name"]: variable for variable in container["env"]}


def test_every_value_the_helm_templates_read_exists() -> None:
    values = _values()
    template = HELM_DEPLOYMENT.read_text() + HELM_HELPERS.read_text()
    read = set(re.findall(r"\.Values\.([\w.]+)", template))
    read |= {
        f"compressionCoordinator.{path}"
        for path in re.findall(r"\$coordinator\.([\w.]+)", template)
    }
    assert read - CLP_CHART_VALUES
    for path in sorted(read - CLP_CHART_VALUES):
        _lookup(values, path)
    for keys, source in re.findall(r"dig ((?:\"\w+\" )+)\"?\w*\"? \.Values\.([\w.]+)", template):
        parent = [source, *(key.strip('"') for key in keys.split()[:-1])]
        assert isinstance(_lookup(values, ".".join(parent)), Mapping)


def test_the_helm_templates_use_only_clps_helpers_and_their_own() -> None:
    template = HELM_DEPLOYMENT.read_text() + HELM_HELPERS.read_text()
    defined = set(re.findall(r'define "([\w.]+)"', template))
    used = set(re.findall(r'include "([\w.]+)"', template))
    assert used - defined == CLP_CHART_HELPERS


def test_helm_values_name_the_image_and_clps_logging_level() -> None:
    values = _values()
    assert set(values["image"]["compressionCoordinator"]) == {"repository", "tag", "pullPolicy"}
    assert values["clpConfig"]["compression_coordinator"]["logging_level"] == "INFO"
    assert values["clpConfig"]["coordinator"] == {}
    assert values["compressionCoordinator"]["schemaUpgrade"]["enabled"] is True


def test_helm_keeps_clps_command_environment_and_grace_period() -> None:
    template = HELM_DEPLOYMENT.read_text()
    assert template.lstrip().startswith("{{- /*")
    assert "{{- if .Values.spider.enabled }}" in template
    spec = _deployment()["spec"]["template"]["spec"]
    assert spec["terminationGracePeriodSeconds"] == 60
    assert spec["securityContext"]["runAsNonRoot"] is True
    [container] = spec["containers"]
    assert container["command"] == CLP_COMMAND
    env = _env(container)
    assert set(env) == {"CLP_DB_PASS", "CLP_DB_USER", "OTEL_SERVICE_NAME", "RUST_LOG"}
    for name, key in (("CLP_DB_USER", "username"), ("CLP_DB_PASS", "password")):
        assert env[name]["valueFrom"]["secretKeyRef"]["key"] == key
    assert env["OTEL_SERVICE_NAME"]["value"] == "compression-coordinator"
    assert 'dig "compression_coordinator" "logging_level" "INFO" .Values.clpConfig' in template
    mount = next(m for m in container["volumeMounts"] if m["name"] == "config")
    assert (mount["mountPath"], mount["subPath"], mount["readOnly"]) == (
        CLP_CONFIG,
        "clp-config.yaml",
        True,
    )


def test_helm_runs_the_schema_step_first(fake_bin: Path) -> None:
    spec = _deployment()["spec"]["template"]["spec"]
    [step] = [c for c in spec["initContainers"] if c]  # the others come from clp.waitFor
    assert step["name"] == "compression-coordinator-db-upgrade"
    assert set(_env(step)) >= {"CLP_DB_USER", "CLP_DB_PASS", "RUST_LOG"}
    assert run_entrypoint(fake_bin, *step["args"]).argv == [
        "db",
        "upgrade",
        "--config",
        CLP_CONFIG,
    ]


@pytest.mark.parametrize("probe", ["startupProbe", "livenessProbe", "readinessProbe"])
def test_helm_probes_use_http_with_a_metrics_port_else_the_health_mode(
    fake_bin: Path, probe: str
) -> None:
    [container] = _deployment()["spec"]["template"]["spec"]["containers"]
    check = container[probe]
    path = "/readyz" if probe == "readinessProbe" else "/healthz"
    assert check["httpGet"] == {"path": path, "port": "metrics"}
    assert container["ports"] == [{"name": "metrics", "containerPort": "TEMPLATED"}]
    binary, *arguments = check["exec"]["command"]
    assert binary == RUST_BINARY
    assert run_entrypoint(fake_bin, *arguments).argv == ["health", "--config", CLP_CONFIG]


def test_the_deploy_readme_links_only_files_that_exist() -> None:
    readme = ROOT / "deploy" / "README.md"
    links = re.findall(r"\]\(([^)#\s]+)\)", readme.read_text())
    assert links
    missing = [link for link in links if not (readme.parent / link).exists()]
    assert missing == []
