"""Generated JSON-lines logs for tests: the same generator the demo uses."""

from coordinator.cli.samples import ERROR_EVERY, START_MS, STEP_MS, json_log_lines, write_json_logs

__all__ = ["ERROR_EVERY", "START_MS", "STEP_MS", "json_log_lines", "write_json_logs"]
