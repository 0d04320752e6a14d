"""``coordinator run`` imports the monitoring server only with a metrics port (start-up time,
issue 14), checked without timing: the modules a fresh process holds after the command."""

from __future__ import annotations

from pathlib import Path

from tests.import_probe import imported_after

MONITORING = ("coordinator.service.monitoring", "coordinator.service.health")


def _run_imports(*argv: str) -> tuple[object, set[str]]:
    """The exit code of ``coordinator *argv`` and which of ``MONITORING`` it imported."""
    return imported_after(argv, MONITORING)


def test_run_without_a_metrics_port_does_not_import_the_monitoring_server(tmp_path: Path) -> None:
    code, imported = _run_imports("--data-dir", str(tmp_path / "data"), "run", "--until-idle")
    assert code == 0
    assert imported == set()


def test_run_with_a_metrics_port_imports_the_monitoring_server(tmp_path: Path) -> None:
    config = tmp_path / "coordinator.yaml"
    config.write_text(
        "coordinator:\n"
        "  legacy_scheduler: absent\n"
        f"  data_dir: {tmp_path / 'data'}\n"
        "  metrics_port: 0\n"
        "  metrics_host: 127.0.0.1\n"
    )
    code, imported = _run_imports("--config", str(config), "run", "--until-idle")
    assert code == 0
    assert imported == set(MONITORING)
