"""Several embedded engines on one database: each job has one live owner (issue 10).

Attacks reproduced: every engine re-ran every unfinished job at its start-up (tasks ran on two
engines, a Cancelled job was rewritten to Failed); a job whose engine died mid-run was never taken
over by an engine already running; an executor outlived a SIGKILLed host process.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import zstandard
from sqlalchemy import Engine, insert, select, update

from coordinator.config.loader import CoordinatorConfig
from coordinator.config.locations import PROJECT_ROOT
from coordinator.engine.embedded.engine import UNDECODABLE_STORED_JOB, EmbeddedSpider
from coordinator.lifecycle import JobStatus
from coordinator.runtime import embedded_spider, open_engine, open_runtime
from coordinator.spider.port import JobState, start_if_ready
from coordinator.spider.wire import encode_job_inputs
from coordinator.store.clock import utc_now
from coordinator.store.instances import ENGINE, Presence
from coordinator.store.jobs import JobStore
from coordinator.store.schema import engine_jobs
from tests.engine_support import (
    TEST_PACKAGES,
    graph,
    journal,
    running_engine,
    settings,
    submit,
    task,
    wait_for,
    wait_for_journal,
)
from tests.engine_tasks import release
from tests.paths import new_job_in
from tests.processes import engine_processes, is_running

pytestmark = pytest.mark.slow  # several real engines and their executors

PASSWORD = b"compression-coordinator"
DONE = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


def _start(spider: EmbeddedSpider, inputs: list[bytes], *names: str) -> int:
    group = spider.resource_group_by_name("rg", PASSWORD)
    job_id = submit(spider, group, graph(*(task(name) for name in names)), inputs)
    assert start_if_ready(spider, job_id) is JobState.RUNNING
    return job_id


def _stored(engine: Engine, job_id: int) -> tuple[str, str | None]:
    with engine.connect() as connection:
        row = connection.execute(
            select(engine_jobs.c.state, engine_jobs.c.owner).where(engine_jobs.c.id == job_id)
        ).one()
    return str(row.state), row.owner


def test_a_second_engine_never_runs_a_live_engines_job(
    migrated_engine: Engine, tmp_path: Path
) -> None:
    """Before: the second engine's start-up re-ran the first's Running job (tasks ran twice)."""
    first_dir, second_dir = tmp_path / "first", tmp_path / "second"
    with running_engine(migrated_engine, first_dir, sweep_interval_secs=0.2) as first:
        job_id = _start(first, [b"a"], "wait_for_release")
        wait_for_journal(first_dir, job_id, "start")
        with running_engine(migrated_engine, second_dir, sweep_interval_secs=0.2) as second:
            assert second.get_job_state(job_id) is JobState.RUNNING  # read, not adopted
            release(first_dir, job_id)
            assert wait_for(first, job_id, *DONE) is JobState.SUCCEEDED
            assert second.get_job_state(job_id) is JobState.SUCCEEDED
        assert _stored(migrated_engine, job_id) == ("Succeeded", first.token)
    assert journal(second_dir, job_id) == []  # nothing ran on the second engine
    assert [e["event"] for e in journal(first_dir, job_id)] == ["start", "done", "commit"]


def test_a_cancel_through_another_engine_is_final(migrated_engine: Engine, tmp_path: Path) -> None:
    """Before: the owner's late report rewrote the Cancelled job (to Failed or Succeeded).

    The owner does not sweep here (once an hour), so its task reports while it still believes the
    job Running: the report's write is what must not overwrite the cancel."""
    first_dir, second_dir = tmp_path / "first", tmp_path / "second"
    with running_engine(migrated_engine, first_dir, workers=1, sweep_interval_secs=3600) as first:
        job_id = _start(first, [b"a"], "wait_for_release")
        wait_for_journal(first_dir, job_id, "start")
        with running_engine(migrated_engine, second_dir, sweep_interval_secs=0.2) as second:
            assert second.cancel_job(job_id) is JobState.CANCELLED
            assert first.get_job_state(job_id) is JobState.RUNNING  # not noticed yet
            release(first_dir, job_id)
            wait_for_journal(first_dir, job_id, "done")
            # The owner's one worker reports an instance before it takes the next: once the next
            # job has run, the report has been handled.
            after = _start(first, [b"b"], "echo")
            assert wait_for(first, after, *DONE) is JobState.SUCCEEDED
            assert first.get_job_state(job_id) is JobState.CANCELLED
            assert second.get_job_state(job_id) is JobState.CANCELLED
        assert _stored(migrated_engine, job_id)[0] == "Cancelled"
    events = [e["event"] for e in journal(first_dir, job_id)]
    assert "commit" not in events


def test_a_dead_engines_job_is_adopted_by_a_running_engine(
    migrated_engine: Engine, tmp_path: Path
) -> None:
    """Before: an engine adopted jobs only at its own start-up, so a job whose engine died later
    stayed Running forever. Here the first engine stops heartbeating (its process "dies") and the
    second, already running, adopts and finishes the job within a few expiry periods."""
    work = tmp_path / "work"  # shared: ``slow_first_run`` hangs only on its first run ever
    dying = Presence(migrated_engine, ENGINE, stale_after_secs=1.0).register().start()
    with running_engine(
        migrated_engine, work, sweep_interval_secs=0.2, stale_after_secs=1.0
    ) as second:
        with running_engine(migrated_engine, work, presence=dying) as first:
            job_id = _start(first, [b"a", b"b"], "echo", "slow_first_run")
            deadline = time.monotonic() + 30
            while len(journal(work, job_id)) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert _stored(migrated_engine, job_id) == ("Running", dying.token)
            assert second.get_job_state(job_id) is JobState.RUNNING
        dying.stop_beating()  # the first engine is gone; its row expires (as after a SIGKILL)
        started = time.monotonic()
        assert wait_for(second, job_id, *DONE, timeout=30) is JobState.SUCCEEDED
        assert time.monotonic() - started < 15
        assert second.get_job_outputs(job_id) == [b"a", b"second run"]
        assert _stored(migrated_engine, job_id) == ("Succeeded", second.token)
    events = [e["event"] for e in journal(work, job_id)]
    assert events.count("echo") == 2 and events.count("commit") == 1


_HOST = textwrap.dedent(
    """
    import sys, time
    from coordinator.engine.embedded.engine import EmbeddedSpider
    from coordinator.spider.port import start_if_ready
    from coordinator.store.database import create_database_engine
    from tests.engine_support import graph, settings, submit, task, TEST_PACKAGES
    from pathlib import Path

    engine = create_database_engine(sys.argv[1])
    spider = EmbeddedSpider(
        engine, settings(engine, Path(sys.argv[2])), packages=TEST_PACKAGES, workers=2,
        executor_environment={"PYTHONPATH": sys.argv[3]},
    ).start()
    group = spider.resource_group_by_name("rg", b"pw")
    job = submit(spider, group, graph(task("sleep"), task("sleep")), [b"3600", b"3600"])
    start_if_ready(spider, job)
    print("started", flush=True)
    time.sleep(3600)
    """
)


def test_executors_die_with_the_process_hosting_the_engine(
    migrated_engine: Engine, tmp_path: Path
) -> None:
    """Before: SIGKILL the host while tasks hang, and its executors lived on for as long as the
    tasks did, with their database connections. ``test_service_processes`` does the same to a
    real ``coordinator run``."""
    url = migrated_engine.url.render_as_string(hide_password=False)
    host = subprocess.Popen(
        [sys.executable, "-c", _HOST, url, str(tmp_path / "work"), str(PROJECT_ROOT)],
        cwd=PROJECT_ROOT,
        env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert host.stdout is not None and host.stdout.readline().strip() == "started"
        deadline = time.monotonic() + 30
        while len(journal(tmp_path / "work", 1)) < 2:
            assert time.monotonic() < deadline, "the tasks did not start"
            time.sleep(0.1)
        servers, forked = engine_processes(host.pid)
        assert len(servers) == 1 and len(forked) == 2  # both executors forked by one server
    finally:
        host.send_signal(signal.SIGKILL)
        host.wait()
    deadline = time.monotonic() + 5
    while any(is_running(pid) for pid in servers + forked) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(is_running(pid) for pid in servers + forked)


def test_a_closed_engines_jobs_are_adopted_at_once(migrated_engine: Engine, tmp_path: Path) -> None:
    """A clean close deletes the registration: the next engine adopts without waiting."""
    work = tmp_path / "work"
    with running_engine(migrated_engine, work) as first:
        job_id = _start(first, [b"a", b"b"], "echo", "slow_first_run")
        deadline = time.monotonic() + 30
        while len(journal(work, job_id)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    started = time.monotonic()
    with running_engine(migrated_engine, work, stale_after_secs=60.0) as second:
        assert wait_for(second, job_id, *DONE, timeout=20) is JobState.SUCCEEDED
    assert time.monotonic() - started < 15


def test_a_gone_owners_unrecorded_ready_job_is_cancelled_not_adopted(
    migrated_engine: Engine, tmp_path: Path
) -> None:
    """The soak's orphan: a coordinator registered a job and died before recording it.

    Before, the next engine adopted it and it stayed Ready for ever. A Ready job a compression
    job records is still adopted (its coordinator's successor starts it).
    """
    work = tmp_path / "work"
    with running_engine(migrated_engine, work) as first:
        group = first.add_resource_group("rg", b"rg")
        unrecorded = submit(first, group, graph(task("echo")), [b"a"])
        recorded = submit(first, group, graph(task("echo")), [b"b"])
    store = JobStore(migrated_engine)
    new_job_in(store, JobStatus.RUNNING, spider_id=recorded)

    def owners() -> dict[int, str | None]:
        with migrated_engine.connect() as connection:
            return dict(
                connection.execute(
                    select(engine_jobs.c.id, engine_jobs.c.owner).where(
                        engine_jobs.c.id.in_([unrecorded, recorded])
                    )
                ).all()
            )

    with running_engine(migrated_engine, work, unrecorded_grace_secs=3.0) as second:
        deadline = time.monotonic() + 20
        while owners()[recorded] != second.token:  # adopted by the first sweep
            assert time.monotonic() < deadline, "the recorded job was never adopted"
            time.sleep(0.05)
        assert owners()[unrecorded] != second.token  # not adopted: within its grace
        while second.get_job_state(unrecorded) is not JobState.CANCELLED:
            assert time.monotonic() < deadline, "the unrecorded registration was never cancelled"
            time.sleep(0.05)
        assert second.get_job_state(recorded) is JobState.READY
        assert start_if_ready(second, recorded) is JobState.RUNNING
        assert wait_for(second, recorded, *DONE, timeout=20) is JobState.SUCCEEDED


def test_the_unrecorded_registration_grace_is_a_setting(config: CoordinatorConfig) -> None:
    """``coordinator.embedded_unrecorded_grace_secs`` reaches the engine ``coordinator run``
    starts: with 1 s, a gone coordinator's unrecorded registration is cancelled within seconds
    (the default, 60 s, would leave it Ready far longer than this test waits)."""
    engine = open_engine(config)
    try:
        with embedded_spider(config, engine) as first:  # closed: its registration is deleted
            group = first.resource_group_by_name("rg", PASSWORD)
            unrecorded = submit(first, group, graph(task("echo")), [b"a"])
    finally:
        engine.dispose()
    assert config.extras.embedded_unrecorded_grace_secs is None
    short = dataclasses.replace(
        config, extras=config.extras.model_copy(update={"embedded_unrecorded_grace_secs": 1.0})
    )
    with open_runtime(short) as runtime:
        assert runtime.embedded is not None
        started = time.monotonic()
        while runtime.embedded.get_job_state(unrecorded) is not JobState.CANCELLED:
            assert time.monotonic() - started < 15, "the registration was not cancelled"
            time.sleep(0.05)


def test_a_gone_owners_job_whose_stored_graph_no_longer_decodes_is_failed_not_stranded(
    migrated_engine: Engine, tmp_path: Path
) -> None:
    """A graph an earlier version stored and Spider's rules refuse (here a pre-release schema
    version, which the parser of before accepted). Before: the adopting engine took the job's
    ownership, then failed to decode it: the job stayed Running for ever, owned by a live engine
    that never ran it, and its compression job with it."""
    work = tmp_path / "work"
    with running_engine(migrated_engine, work) as first:
        job_id = _start(first, [b"10"], "sleep")
    stored_graph = json.dumps(
        {**json.loads(_stored_graph_json(migrated_engine, job_id)), "schema_version": "0.1.5-rc.1"}
    ).encode()
    with migrated_engine.begin() as connection:
        connection.execute(
            update(engine_jobs)
            .where(engine_jobs.c.id == job_id)
            .values(task_graph=zstandard.ZstdCompressor().compress(stored_graph))
        )

    with running_engine(migrated_engine, work) as second:
        assert wait_for(second, job_id, *DONE, timeout=20) is JobState.FAILED
        error = second.get_job_error(job_id)
    assert error.startswith(f"{UNDECODABLE_STORED_JOB}: bad request:"), error
    assert "0.1.5-rc.1" in error or "version" in error, error
    state, owner = _stored(migrated_engine, job_id)
    assert state == "Failed" and owner is not None


def _stored_graph_json(engine: Engine, job_id: int) -> bytes:
    with engine.connect() as connection:
        compressed = connection.execute(
            select(engine_jobs.c.task_graph).where(engine_jobs.c.id == job_id)
        ).scalar_one()
    return zstandard.ZstdDecompressor().decompressobj().decompress(bytes(compressed))


def test_every_gone_owners_job_is_adopted_at_start_a_page_at_a_time(
    migrated_engine: Engine, tmp_path: Path
) -> None:
    """Issue 14 (P4): a restart found 1,000 jobs of its own gone engine; the start adopted 100,
    one transaction each, and the coordinator's polls adopted the rest one by one under the
    engine's lock. Now the start adopts them all, each page of 100 in one transaction."""
    with running_engine(migrated_engine, tmp_path / "first", workers=1) as first:
        group = first.resource_group_by_name("rg", PASSWORD)
    now = utc_now()
    rows = [
        {
            "id": job_id,
            "resource_group_id": group,
            "state": "Running",
            "task_graph": graph(task("echo")).compressed(),
            "inputs": encode_job_inputs([b"a"]),
            "created_at": now,
            "updated_at": now,
            "owner": None,
        }
        for job_id in range(5001, 5231)
    ]
    with migrated_engine.begin() as connection:
        connection.execute(insert(engine_jobs), rows)
    spider = EmbeddedSpider(
        migrated_engine,
        settings(migrated_engine, tmp_path / "second"),
        packages=TEST_PACKAGES,
        workers=1,
        executor_environment={"PYTHONPATH": str(PROJECT_ROOT)},
        sweep_interval_secs=3600,
    )
    with spider, migrated_engine.connect() as connection:
        owners = connection.execute(
            select(engine_jobs.c.owner).where(engine_jobs.c.id.between(5001, 5230))
        ).scalars()
        assert set(owners) == {spider.token}
