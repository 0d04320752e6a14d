"""Replicas: a dead coordinator's job is taken over and the stale one is fenced out; the loop
survives a database outage.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine, select, update

from coordinator.config.loader import ConfigError, CoordinatorConfig, load_config
from coordinator.engine.embedded.engine import EmbeddedSpider
from coordinator.engine.embedded.faults import Fault
from coordinator.lifecycle import JobStatus
from coordinator.runtime import (
    archive_output_of,
    open_engine,
    open_runtime,
    worker_settings,
)
from coordinator.service.coordinator import Coordinator
from coordinator.service.ingest import submit_job
from coordinator.spider.port import JobState, SpiderPort
from coordinator.store.database import create_database_engine
from coordinator.store.instances import COORDINATOR, Presence
from coordinator.store.jobs import JobStore
from coordinator.store.schema import coordinator_instances, engine_jobs
from tests.sample_logs import write_json_logs
from tests.service_support import tick_until
from tests.timing import MovableClock, wait_until


def _one_job(
    tmp_path: Path, database_url: str, monkeypatch: pytest.MonkeyPatch, *, workers: int
) -> tuple[CoordinatorConfig, Engine, int, EmbeddedSpider]:
    """The embedded default on the test's database, one submitted job, and a started engine."""
    if not database_url.startswith("sqlite"):
        monkeypatch.setenv("COORDINATOR_DATABASE_URL", database_url)
    config = load_config(None, data_dir=tmp_path / "var")
    engine = open_engine(config)
    write_json_logs(config.object_store_directory / "logs" / "ingest" / "a.jsonl", 300)
    job_id = submit_job(config, engine, timestamp_key="timestamp")
    url = engine.url.render_as_string(hide_password=False)
    spider = EmbeddedSpider(engine, worker_settings(config, url), workers=workers).start()
    return config, engine, job_id, spider


_LEASE = timedelta(seconds=30)


def _coordinator(
    config: CoordinatorConfig,
    engine: Engine,
    spider: SpiderPort,
    name: str,
    clock: MovableClock,
) -> Coordinator:
    """A coordinator whose clocks (monotonic and the database's) are ``clock``: its leases expire
    when the test moves the clock, not after a wait."""
    return Coordinator(
        engine=engine,
        spider=spider,
        settings=config.compression_coordinator,
        archive_output=archive_output_of(config),
        instance_id=name,
        lease_duration=_LEASE,
        clock=clock.monotonic,
        store=JobStore(engine, clock=clock.utc),
    )


@pytest.mark.slow
def test_a_dead_coordinators_job_is_taken_over_and_the_old_one_is_fenced_out(
    tmp_path: Path, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    config, engine, job_id, spider = _one_job(tmp_path, database_url, monkeypatch, workers=2)
    clock = MovableClock()

    try:
        first = _coordinator(config, engine, spider, "first", clock)
        second = _coordinator(config, engine, spider, "second", clock)
        first.tick()  # claims and submits, then "dies" (never ticks again in time)
        store = JobStore(engine)
        row = store.get(job_id)
        assert row is not None and row.status == JobStatus.RUNNING and row.lease_owner == "first"
        assert second.tick().claimed == 0  # the lease is live: hands off
        clock.advance(_LEASE.total_seconds() - 10)
        assert second.tick().claimed == 0  # still live (10 s left, however slow this machine)
        clock.advance(10)
        assert second.tick().claimed == 1  # expired: taken over, epoch bumped
        row = store.get(job_id)
        assert row is not None and row.lease_owner == "second"

        tick_until(second, lambda: job_id not in second.driven, timeout=60)
        row = store.get(job_id)
        assert row is not None and row.status == JobStatus.SUCCEEDED
        assert spider.get_job_state(row.spider_id or 0) is JobState.SUCCEEDED

        # The first coordinator wakes up (its lease renewal is long due): its lease is gone and
        # it writes nothing.
        first.tick()
        assert job_id not in first.driven
        history = store.history(job_id)
        assert [(h.trigger, h.actor_id) for h in history] == [
            ("submitted", "first"),
            ("committed", history[1].actor_id),
            ("finalised", "second"),
        ]
    finally:
        spider.close()
        engine.dispose()


def test_the_loop_survives_a_database_outage(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Every tick fails (nothing listens on the port); the loop logs, waits, tries again and stops
    when asked."""
    config = load_config(None, data_dir=tmp_path / "var")
    unreachable = create_database_engine("mysql+pymysql://nobody:nothing@127.0.0.1:9/clp")
    coordinator = Coordinator(
        engine=unreachable,
        spider=object(),  # type: ignore[arg-type]  (never reached: the database fails first)
        settings=config.compression_coordinator,
        archive_output=archive_output_of(config),
        instance_id="outage",
    )
    errors: list[BaseException] = []

    def run() -> None:
        try:
            coordinator.run()
        except BaseException as error:
            errors.append(error)

    thread = threading.Thread(target=run)
    thread.start()
    # The first failure, the back-off's first pause, the second failure (its summary is logged).
    wait_until(lambda: "still unavailable" in caplog.text, what="a second failed tick")
    assert thread.is_alive()  # still trying, not dead
    coordinator.stopping.set()
    thread.join(timeout=10)
    assert not thread.is_alive() and errors == []


def test_foreign_jobs_are_forgotten_once_they_leave_pending(
    tmp_path: Path, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The claim query excludes known foreign jobs; that list must not grow without bound."""
    from sqlalchemy import insert, update

    from coordinator.store.schema import compression_jobs

    if not database_url.startswith("sqlite"):
        monkeypatch.setenv("COORDINATOR_DATABASE_URL", database_url)
    config = load_config(None, data_dir=tmp_path / "var")
    engine = open_engine(config)
    fs_job = b"(\xb5/\xfd"  # not ours either way: the coordinator must leave it alone
    with engine.begin() as connection:
        key = connection.execute(
            insert(compression_jobs).values(clp_config=fs_job)
        ).inserted_primary_key
    assert key is not None
    coordinator = Coordinator(
        engine=engine,
        spider=object(),  # type: ignore[arg-type]  (no job of ours: Spider is never called)
        settings=config.compression_coordinator,
        archive_output=archive_output_of(config),
        instance_id="foreign-test",
    )
    coordinator.tick()
    assert coordinator.leases._foreign == {key[0]}
    with engine.begin() as connection:  # the legacy scheduler takes it
        connection.execute(update(compression_jobs).values(status=1))
    coordinator.outcomes._next_sweep = 0.0
    coordinator.tick()
    assert coordinator.leases._foreign == set()
    engine.dispose()


@pytest.mark.slow
def test_an_unexpected_error_on_one_job_does_not_stop_the_loop(
    tmp_path: Path, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.service_support import SpiderProxy

    class FlakySpider(SpiderProxy):
        """Raises an unexpected exception (not a Spider error) on the first state query."""

        failures = 1

        def get_job_state(self, job_id: int) -> JobState:
            if self.failures:
                self.failures -= 1
                raise RuntimeError("a bug in a Spider client")
            return super().get_job_state(job_id)

    config, engine, job_id, spider = _one_job(tmp_path, database_url, monkeypatch, workers=1)
    try:
        flaky = FlakySpider(spider)
        coordinator = Coordinator(
            engine=engine,
            spider=flaky,
            settings=config.compression_coordinator,
            archive_output=archive_output_of(config),
            instance_id="flaky",
        )
        coordinator.run(until_idle=True)
        row = JobStore(engine).get(job_id)
        assert flaky.failures == 0
        assert row is not None and row.status == JobStatus.SUCCEEDED
    finally:
        spider.close()
        engine.dispose()


# --- issue 10: one live owner per instance id and per Spider job ---------------------------------


@pytest.mark.slow
def test_a_second_coordinator_with_the_same_instance_id_refuses_to_start(
    config: CoordinatorConfig,
) -> None:
    """Before: replicas without a config (same default ``embedded`` id) took each other's live
    leases. Now the second one waits one expiry period for the first's heartbeat, then refuses;
    once the first is closed, the id is free at once."""
    first = open_runtime(config, stale_after_secs=1.0)
    try:
        assert first.coordinator.instance_id == "embedded"
        started = time.monotonic()
        with pytest.raises(ConfigError, match="'embedded' is in use by a live process"):
            open_runtime(config, stale_after_secs=1.0)
        assert 1.0 <= time.monotonic() - started < 10
    finally:
        first.close()
    started = time.monotonic()
    with open_runtime(config, stale_after_secs=30.0) as again:
        assert again.coordinator.instance_id == "embedded"
    assert time.monotonic() - started < 10


@pytest.mark.slow
def test_a_restart_after_a_crash_takes_the_instance_id_over_at_once(
    config: CoordinatorConfig,
) -> None:
    """The row a SIGKILLed coordinator left (its heartbeat still fresh) names a pid that no longer
    runs on this host: the restart takes it over without waiting for it to expire."""
    with open_runtime(config, stale_after_secs=30.0) as crashed:
        engine = crashed.engine
        gone = subprocess.run(
            [sys.executable, "-c", "import os; print(os.getpid())"],
            check=True,
            capture_output=True,
            text=True,
        )
        with engine.begin() as connection:
            connection.execute(
                update(coordinator_instances)
                .where(coordinator_instances.c.name == "embedded")
                .values(pid=int(gone.stdout), token="left-by-the-crashed-process")
            )
        assert crashed.presence is not None
        crashed.presence.stop_beating()
        crashed.presence = None  # its row is the crashed process's now
    started = time.monotonic()
    with open_runtime(config, stale_after_secs=30.0) as restarted:
        assert restarted.coordinator.instance_id == "embedded"
    assert time.monotonic() - started < 10


@pytest.mark.slow
def test_the_survivor_takes_the_spider_job_over_with_the_lease(
    tmp_path: Path, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: the survivor took the lease, but its engine (already running) never loaded the dead
    replica's Spider job: Running forever. Now the engine of whoever holds the lease adopts it,
    and no other engine does while the lease is another coordinator's."""
    if not database_url.startswith("sqlite"):
        monkeypatch.setenv("COORDINATOR_DATABASE_URL", database_url)
    config = load_config(None, data_dir=tmp_path / "var")
    engine = open_engine(config)
    write_json_logs(config.object_store_directory / "logs" / "ingest" / "a.jsonl", 300)
    job_id = submit_job(config, engine, timestamp_key="timestamp")
    url = engine.url.render_as_string(hide_password=False)
    clock = MovableClock()

    def replica(name: str) -> tuple[Presence, EmbeddedSpider, Coordinator]:
        presence = Presence(engine, COORDINATOR, name, stale_after_secs=1.0).register().start()
        spider = EmbeddedSpider(
            engine,
            worker_settings(config, url),
            workers=1,
            presence=presence,
            coordinator_name=name,
            sweep_interval_secs=0.2,
        ).start()
        return presence, spider, _coordinator(config, engine, spider, name, clock)

    def owner_of(spider_id: int) -> str | None:
        with engine.connect() as connection:
            return connection.execute(
                select(engine_jobs.c.owner).where(engine_jobs.c.id == spider_id)
            ).scalar_one()

    def succeeded() -> bool:
        row = JobStore(engine).get(job_id)
        return row is not None and row.status == JobStatus.SUCCEEDED

    dead_presence, dead_spider, dead = replica("dead")
    survivor_presence: Presence | None = None
    survivor_spider: EmbeddedSpider | None = None
    try:
        dead_spider.inject(Fault("hard_timeout", task=0))  # the compression hangs, then it dies
        assert dead.tick().claimed == 1
        row = JobStore(engine).get(job_id)
        assert row is not None and row.status == JobStatus.RUNNING and row.spider_id is not None
        spider_id = row.spider_id
        dead_spider.close()
        # Its heartbeat row is gone (as a SIGKILLed replica's is once it expired and the others
        # saw it expire): the engines take its jobs over, except one leased to a coordinator.
        dead_presence.close()
        survivor_presence, survivor_spider, survivor = replica("survivor")
        # The survivor's engine swept at start: the job's lease is the dead coordinator's (still
        # live), not the survivor's, so it is not adopted.
        assert owner_of(spider_id) == dead_presence.token
        clock.advance(_LEASE.total_seconds())  # the dead coordinator's lease expires
        tick_until(survivor, succeeded, timeout=90)
        assert survivor_spider.get_job_state(spider_id) is JobState.SUCCEEDED
        assert owner_of(spider_id) == survivor_presence.token
    finally:
        if survivor_spider is not None:
            survivor_spider.close()
        if survivor_presence is not None:
            survivor_presence.close()
        dead_spider.close()
        dead_presence.close()
        engine.dispose()
