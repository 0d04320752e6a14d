"""Building test graphs and driving the embedded engine in tests."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, text

from coordinator.archive_storage import FsArchiveOutput
from coordinator.config.locations import PROJECT_ROOT
from coordinator.engine.embedded.engine import EmbeddedSpider
from coordinator.engine.tasks.context import WorkerSettings
from coordinator.spider.policy import ExecutionPolicy, TimeoutPolicy
from coordinator.spider.port import JobState, SpiderPort
from coordinator.spider.task_graph import (
    InputSource,
    TaskDescriptor,
    TaskGraph,
    TdlContext,
    TerminationTask,
    struct_value,
)
from coordinator.spider.wire import encode_job_inputs
from coordinator.store.instances import ENGINE, Presence

TEST_PACKAGES = {"test": "tests.engine_tasks:package"}


def policy(
    retries: int = 0, soft_ms: int = 20_000, hard_ms: int = 30_000, instances: int = 1
) -> ExecutionPolicy:
    return ExecutionPolicy(retries, instances, TimeoutPolicy(soft_ms, hard_ms))


def task(
    function: str,
    inputs: int = 1,
    outputs: int = 1,
    *,
    execution: ExecutionPolicy | None = None,
    sources: Sequence[tuple[int, int]] | None = None,
) -> TaskDescriptor:
    return TaskDescriptor(
        TdlContext("test", function),
        tuple(struct_value("Bytes") for _ in range(inputs)),
        tuple(struct_value("Bytes") for _ in range(outputs)),
        execution or policy(),
        None if sources is None else tuple(InputSource(t, p) for t, p in sources),
    )


def graph(
    *tasks: TaskDescriptor,
    commit: ExecutionPolicy | bool | None = True,
    cleanup: bool = False,
    commit_function: str = "record_commit",
) -> TaskGraph:
    commit_task = None
    if commit is not False:
        commit_policy = policy() if commit is True or commit is None else commit
        commit_task = TerminationTask(TdlContext("test", commit_function), commit_policy)
    cleanup_task = (
        TerminationTask(TdlContext("test", "record_cleanup"), policy()) if cleanup else None
    )
    return TaskGraph(tuple(tasks), commit_task, cleanup_task)


def settings(engine: Engine, directory: Path) -> WorkerSettings:
    directory.mkdir(parents=True, exist_ok=True)
    return WorkerSettings(
        database_url=engine.url.render_as_string(hide_password=False),
        archive_output=FsArchiveOutput(directory=directory / "archives"),
        staging_directory=directory,
    )


@contextmanager
def running_engine(
    engine: Engine, directory: Path, *, workers: int = 2, retention: float = 300.0, **extra: Any
) -> Iterator[EmbeddedSpider]:
    spider = EmbeddedSpider(
        engine,
        settings(engine, directory),
        packages=TEST_PACKAGES,
        workers=workers,
        executor_environment={"PYTHONPATH": str(PROJECT_ROOT)},
        terminated_job_retention_secs=retention,
        **extra,
    )
    with spider:
        yield spider


def submit(
    spider: SpiderPort, resource_group: int, task_graph: TaskGraph, inputs: Sequence[bytes]
) -> int:
    return spider.register_job(resource_group, task_graph.compressed(), encode_job_inputs(inputs))


def wait_for(spider: SpiderPort, job_id: int, *states: JobState, timeout: float = 60) -> JobState:
    deadline = time.monotonic() + timeout
    while True:
        state = spider.get_job_state(job_id)
        if state in states:
            return state
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id} stayed {state.name}, expected {states}")
        time.sleep(0.02)


def journal(directory: Path, job_id: int) -> list[dict[str, Any]]:
    path = directory / f"journal-{job_id}.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def wait_for_journal(
    directory: Path, job_id: int, event: str, count: int = 1, timeout: float = 30
) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        entries = [e for e in journal(directory, job_id) if e["event"] == event]
        if len(entries) >= count:
            return entries
        if time.monotonic() > deadline:
            raise AssertionError(
                f"job {job_id}: {len(entries)} {event!r} entries, expected {count}"
            )
        time.sleep(0.02)


def record_spider_ids(engine: Engine, spider_ids: list[int]) -> None:
    """Jobs CLP's Rust coordinator (or a Spider since reset) submitted under these ids."""
    with engine.begin() as connection:
        for spider_id in spider_ids:
            connection.execute(
                text(
                    "INSERT INTO compression_jobs (clp_config, status, spider_id) "
                    "VALUES (:c, 2, :s)"
                ),
                {"c": b"earlier", "s": spider_id},
            )


@contextmanager
def registrar(database: Engine, directory: Path, name: str) -> Iterator[EmbeddedSpider]:
    """An engine that is not started: it registers and starts jobs, runs no task."""
    presence = Presence(database, ENGINE, name=name).register()
    try:
        yield EmbeddedSpider(database, settings(database, directory), presence=presence, workers=1)
    finally:
        presence.close()
