"""Prometheus metrics: real jobs through the loop on the embedded engine (real clp-s) move them.

Counters are read from ``coordinator.metrics.REGISTRY`` before and after a scenario (this process
runs one test at a time, so the difference is the scenario's); ``clp_coordinator_jobs`` and the
whole exposition are read as Prometheus does, from ``/metrics`` of ``coordinator run``'s
monitoring server. The README's metrics table must list exactly what ``coordinator.metrics``
defines.
"""

from __future__ import annotations

import dataclasses
import re
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import select
from sqlalchemy.engine import Engine

from coordinator import metrics
from coordinator.config.loader import CoordinatorConfig
from coordinator.engine.embedded.faults import Fault
from coordinator.lifecycle import Actor, JobStatus, Trigger
from coordinator.runtime import Runtime, archive_output_of, open_runtime
from coordinator.service.coordinator import Coordinator
from coordinator.service.ingest import submit_job
from coordinator.service.resource_group import lookup_by_name
from coordinator.spider.grpc.client import GrpcSpider
from coordinator.spider.measured import MeasuredSpider
from coordinator.spider.port import JobNotFound, Unavailable
from coordinator.store.guarded import Applied, LostRace, TransitionRequest
from coordinator.store.jobs import JobStore
from coordinator.store.schema import compression_jobs as _jobs
from tests.service_support import (
    embedded,
    job_row,
    put_logs,
    run_until_idle,
    set_status_behind_the_coordinator,
    tick_until,
    with_target_archive_size,
)
from tests.timing import MovableClock, wait_until

DATASET = "web"
README = Path(__file__).resolve().parents[1] / "README.md"


# --- reading the metrics ------------------------------------------------------------------------


def value(name: str, **labels: str) -> float:
    """A sample of ``REGISTRY`` (0 when it has none yet)."""
    sample = metrics.REGISTRY.get_sample_value(name, labels)
    return 0.0 if sample is None else sample


class Counts:
    """Samples of the registry taken now, to be compared with later ones (``delta``)."""

    def __init__(self) -> None:
        self.before = _samples()

    def delta(self, name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return value(name, **labels) - self.before.get(key, 0.0)


def _samples() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in metrics.REGISTRY.collect()
        for sample in family.samples
    }


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``/metrics`` as Prometheus reads it: every sample by name and labels."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def jobs_by_status(scraped: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> dict[str, int]:
    return {
        dict(labels)["status"]: int(count)
        for (name, labels), count in scraped.items()
        if name == "clp_coordinator_jobs"
    }


# --- running jobs -------------------------------------------------------------------------------


@pytest.fixture
def config(config: CoordinatorConfig, migrated_engine: Engine) -> CoordinatorConfig:
    """The embedded default on the test's database, whose schema is at the head (a SQLite file
    is migrated by ``open_runtime``, a MariaDB one only by ``coordinator db upgrade``)."""
    del migrated_engine
    return config


@pytest.fixture
def two_objects(config: CoordinatorConfig, tmp_path: Path) -> CoordinatorConfig:
    """``config`` with two log files ingested, one task each, and the metrics port on (any free
    port of 127.0.0.1)."""
    put_logs(config, tmp_path, ["svc0", "svc1"])
    extras = config.extras.model_copy(update={"metrics_port": 0, "metrics_host": "127.0.0.1"})
    return dataclasses.replace(with_target_archive_size(config, 1), extras=extras)


@contextmanager
def monitored(config: CoordinatorConfig) -> Iterator[tuple[Runtime, str]]:
    """``open_runtime``'s runtime and the URL of its monitoring server."""
    with open_runtime(config, lease_secs=5) as rt:
        assert rt.monitor is not None
        yield rt, rt.monitor.url


@pytest.mark.slow
def test_a_job_that_succeeds_moves_the_counters_and_the_jobs_gauge(
    two_objects: CoordinatorConfig,
) -> None:
    config = two_objects
    counts = Counts()
    with monitored(config) as (rt, url):
        assert jobs_by_status(scrape(url)) == {
            "pending": 0,
            "running": 0,
            "committed": 0,
            "succeeded": 0,
            "failed": 0,
            "killed": 0,
        }
        job_id = submit_job(config, rt.engine, dataset=DATASET, timestamp_key="timestamp")
        assert jobs_by_status(scrape(url))["pending"] == 1  # counted at the scrape
        run_until_idle(rt.coordinator)
        assert job_row(rt, job_id).status == JobStatus.SUCCEEDED
        scraped = scrape(url)

    assert jobs_by_status(scraped) == {
        "pending": 0,
        "running": 0,
        "committed": 0,
        "succeeded": 1,
        "failed": 0,
        "killed": 0,
    }
    coordinator = Actor.COORDINATOR.value
    transitions = "clp_coordinator_transitions_total"
    assert counts.delta(transitions, trigger="submitted", actor=coordinator) == 1
    assert counts.delta(transitions, trigger="finalised", actor=coordinator) == 1
    assert counts.delta(transitions, trigger="failed", actor=coordinator) == 0
    assert counts.delta("clp_coordinator_claims_total", kind="pending") == 1
    assert counts.delta("clp_coordinator_claims_total", kind="taken_over") == 0
    assert counts.delta("clp_coordinator_rollbacks_total", status="failed") == 0

    # Every Spider call of the loop went through the runtime's MeasuredSpider.
    calls = "clp_coordinator_spider_call_duration_seconds_count"
    assert counts.delta(calls, method="ResourceGroupByName") == 1
    # The embedded engine registers and starts a tick's submissions in one call each.
    assert counts.delta(calls, method="RegisterJobs") == 1
    assert counts.delta(calls, method="StartReadyJobs") == 1
    assert counts.delta(calls, method="RegisterJob") == counts.delta(calls, method="StartJob") == 0
    assert counts.delta(calls, method="GetJobState") >= 1  # the polls
    assert (
        counts.delta("clp_coordinator_spider_call_duration_seconds_sum", method="RegisterJobs") > 0
    )

    # The embedded engine ran two compress tasks and the commit.
    instances = "clp_coordinator_engine_task_instances_total"
    assert counts.delta(instances, task="regular", outcome="succeeded") == 2
    assert counts.delta(instances, task="commit", outcome="succeeded") == 1
    assert counts.delta(instances, task="regular", outcome="failed") == 0

    ticks = counts.delta("clp_coordinator_tick_duration_seconds_count")
    assert ticks >= 2
    assert counts.delta("clp_coordinator_tick_duration_seconds_sum") > 0
    assert value("clp_coordinator_jobs_driven") == 0
    assert value("clp_coordinator_last_tick_timestamp_seconds") > 0

    # The scrape served the registry: its counters are the registry's.
    key = (transitions, (("actor", coordinator), ("trigger", "finalised")))
    assert scraped[key] == value(transitions, trigger="finalised", actor=coordinator)


@pytest.mark.slow
def test_a_rollback_counts_the_withdrawn_archives_the_crashes_and_the_clean_up(
    two_objects: CoordinatorConfig,
) -> None:
    config = two_objects
    counts = Counts()
    with monitored(config) as (rt, url):
        job_id = submit_job(config, rt.engine, dataset=DATASET, timestamp_key="timestamp")
        # The commit publishes, then its executor dies, twice: Spider fails the job.
        embedded(rt).inject(Fault("crash", task="commit", after_effects=True, times=2))
        run_until_idle(rt.coordinator)
        assert job_row(rt, job_id).status == JobStatus.FAILED
        scraped = scrape(url)

    assert jobs_by_status(scraped)["failed"] == 1
    assert counts.delta("clp_coordinator_rollbacks_total", status="failed") == 1
    assert counts.delta("clp_coordinator_archives_withdrawn_total", cause="rollback") == 2
    assert counts.delta("clp_coordinator_archives_withdrawn_total", cause="foreign_end") == 0
    assert (
        counts.delta(
            "clp_coordinator_transitions_total",
            trigger=Trigger.ROLLED_BACK.value,
            actor=Actor.COORDINATOR.value,
        )
        == 1
    )
    instances = "clp_coordinator_engine_task_instances_total"
    assert counts.delta(instances, task="commit", outcome="crashed") == 2
    assert counts.delta(instances, task="regular", outcome="succeeded") == 2
    assert counts.delta("clp_coordinator_stored_archives_removed_total", cause="ended_job") == 2
    assert (
        counts.delta("clp_coordinator_spider_call_duration_seconds_count", method="GetJobError")
        == 1
    )


@pytest.mark.slow
def test_a_failed_task_is_counted_by_outcome(two_objects: CoordinatorConfig) -> None:
    config = dataclasses.replace(two_objects, embedded_workers=1)
    counts = Counts()
    with monitored(config) as (rt, _):
        job_id = submit_job(config, rt.engine, dataset=DATASET, timestamp_key="timestamp")
        embedded(rt).inject(Fault("fail", task=1, times=2, message="object store unreachable"))
        run_until_idle(rt.coordinator)
        assert job_row(rt, job_id).status == JobStatus.FAILED

    instances = "clp_coordinator_engine_task_instances_total"
    assert counts.delta(instances, task="regular", outcome="failed") == 2  # a retry, then the end
    assert counts.delta(instances, task="regular", outcome="succeeded") == 1
    assert counts.delta(instances, task="commit", outcome="succeeded") == 0
    assert (
        counts.delta("clp_coordinator_transitions_total", trigger="failed", actor="coordinator")
        == 1
    )
    assert counts.delta("clp_coordinator_rollbacks_total", status="failed") == 0
    # Task 0's archive, stored before task 1 failed, removed by the clean-up.
    assert counts.delta("clp_coordinator_stored_archives_removed_total", cause="ended_job") == 1


@pytest.mark.slow
def test_archives_a_foreign_writer_left_published_are_withdrawn_and_counted(
    two_objects: CoordinatorConfig,
) -> None:
    config = two_objects
    counts = Counts()
    with monitored(config) as (rt, _):
        job_id = submit_job(config, rt.engine, dataset=DATASET, timestamp_key="timestamp")
        tick_until(rt.coordinator, lambda: job_row(rt, job_id).status == JobStatus.RUNNING)
        # The commit task publishes while the loop is not ticking; then CLP's legacy scheduler
        # kills every RUNNING row at its start-up (a Committed job is stored as RUNNING).
        wait_until(lambda: job_row(rt, job_id).committed_at is not None, what="the commit")
        assert set_status_behind_the_coordinator(rt.engine, 1, 4, "killed by a restart") == 1
        run_until_idle(rt.coordinator)
        assert job_row(rt, job_id).status == JobStatus.KILLED

    assert counts.delta("clp_coordinator_archives_withdrawn_total", cause="foreign_end") == 2
    assert counts.delta("clp_coordinator_rollbacks_total", status="killed") == 0
    assert counts.delta("clp_coordinator_stored_archives_removed_total", cause="ended_job") == 2


def test_a_lost_race_is_counted_and_an_applied_move_once(store: JobStore) -> None:
    counts = Counts()
    job_id = store.create_job(b"blob")
    request = TransitionRequest(
        job_id, Trigger.CANCELLED, JobStatus.PENDING, JobStatus.KILLED, Actor.OPERATOR
    )
    assert isinstance(store.transition(request), Applied)
    assert isinstance(store.transition(request), LostRace)  # the row is Killed now

    assert counts.delta("clp_coordinator_lost_races_total", trigger="cancelled") == 1
    transitions = "clp_coordinator_transitions_total"
    assert counts.delta(transitions, trigger="cancelled", actor="operator") == 1
    with store.engine.connect() as connection:
        total = connection.execute(select(_jobs.c.status).where(_jobs.c.id == job_id)).scalar()
    assert total == JobStatus.KILLED


def test_a_move_whose_effects_fail_is_not_counted(store: JobStore) -> None:
    counts = Counts()
    job_id = store.create_job(b"blob")
    request = TransitionRequest(
        job_id, Trigger.CANCELLED, JobStatus.PENDING, JobStatus.KILLED, Actor.OPERATOR
    )

    def fail(*_: object) -> None:
        raise RuntimeError("rolled back")

    with pytest.raises(RuntimeError):
        store.transition(request, effects=fail)
    assert (
        counts.delta("clp_coordinator_transitions_total", trigger="cancelled", actor="operator")
        == 0
    )


def _replica(rt: Runtime, name: str, clock: MovableClock, engine: Engine) -> Coordinator:
    return Coordinator(
        engine=engine,
        spider=rt.spider,
        settings=rt.config.compression_coordinator,
        archive_output=archive_output_of(rt.config),
        instance_id=name,
        lease_duration=timedelta(seconds=30),
        clock=clock.monotonic,
        store=JobStore(engine, clock=clock.utc),
    )


@pytest.mark.slow
def test_a_take_over_counts_a_claim_and_the_old_holder_a_lost_lease(
    two_objects: CoordinatorConfig,
) -> None:
    config = two_objects
    clock = MovableClock()
    counts = Counts()
    with monitored(config) as (rt, _):
        submit_job(config, rt.engine, dataset=DATASET, timestamp_key="timestamp")
        first = _replica(rt, "first", clock, rt.engine)
        second = _replica(rt, "second", clock, rt.engine)
        assert first.tick().claimed == 1  # claims and submits, then stops ticking
        clock.advance(31)  # its lease expires
        assert second.tick().claimed == 1  # taken over
        first.tick()  # its renewal finds the lease gone
        assert not first.driven

    assert counts.delta("clp_coordinator_claims_total", kind="pending") == 1
    assert counts.delta("clp_coordinator_claims_total", kind="taken_over") == 1
    assert counts.delta("clp_coordinator_leases_lost_total") == 1


# --- the Spider port's wrapper ------------------------------------------------------------------


def test_spider_errors_are_counted_by_method_and_error(config: CoordinatorConfig) -> None:
    counts = Counts()
    with open_runtime(config, lease_secs=5) as rt:
        assert isinstance(rt.spider, MeasuredSpider)
        assert lookup_by_name(rt.spider) is not None  # the embedded engine's, passed on
        with pytest.raises(JobNotFound):
            rt.spider.get_job_state(10**9)
    assert (
        counts.delta(
            "clp_coordinator_spider_call_errors_total", method="GetJobState", error="JobNotFound"
        )
        == 1
    )
    assert (
        counts.delta("clp_coordinator_spider_call_duration_seconds_count", method="GetJobState")
        == 1
    )


def test_a_grpc_spider_is_measured_the_same_way() -> None:
    counts = Counts()
    client = GrpcSpider("127.0.0.1", 1, max_retries=0, deadline_secs=5)  # nothing listens
    try:
        spider = MeasuredSpider(client)
        assert lookup_by_name(spider) is None  # a cluster keeps the group in CLP's table
        # ... and registers and starts jobs one by one.
        assert not hasattr(spider, "start_ready_jobs") and not hasattr(spider, "register_jobs")
        with pytest.raises(Unavailable):
            spider.start_job(7)
    finally:
        client.close()
    errors = "clp_coordinator_spider_call_errors_total"
    assert counts.delta(errors, method="StartJob", error="Unavailable") == 1
    assert (
        counts.delta("clp_coordinator_spider_call_duration_seconds_count", method="StartJob") == 1
    )


# --- the definitions ----------------------------------------------------------------------------


def _families() -> dict[str, tuple[str, str, set[frozenset[str]]]]:
    """The registry's families of the coordinator: exposed name → type, help, label sets."""
    found: dict[str, tuple[str, str, set[frozenset[str]]]] = {}
    for family in metrics.REGISTRY.collect():
        if not family.name.startswith(metrics.PREFIX):
            continue
        name = f"{family.name}_total" if family.type == "counter" else family.name
        labels = {frozenset(set(sample.labels) - {"le"}) for sample in family.samples}
        found[name] = (family.type, family.documentation, labels)
    return found


def test_the_table_is_what_the_registry_exposes() -> None:
    families = _families()
    assert sorted(families) == sorted(spec.name for spec in metrics.METRICS)
    for spec in metrics.METRICS:
        kind, documentation, labels = families[spec.name]
        assert (kind, documentation) == (spec.type, spec.help), spec.name
        assert labels <= {frozenset(spec.labels)}, spec.name  # every sample has the labels
    for spec in metrics.METRICS:
        assert re.fullmatch(r"clp_coordinator_[a-z_]+", spec.name), spec.name
        if spec.type == "counter":
            assert spec.name.endswith("_total"), spec.name
        if spec.type == "histogram":
            assert spec.name.endswith("_seconds"), spec.name
    assert len({spec.name for spec in metrics.METRICS}) == len(metrics.METRICS)


def _readme_metrics() -> list[tuple[str, str, tuple[str, ...], str]]:
    text = README.read_text(encoding="utf-8")
    section = text.split("\n## Metrics\n", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 4 or not cells[0].startswith("`clp_coordinator_"):
            continue
        name, kind, labels, meaning = cells
        rows.append(
            (
                name.strip("`"),
                kind,
                tuple(label.strip().strip("`") for label in labels.split(",") if label != "–"),
                meaning,
            )
        )
    return rows


def test_the_readme_lists_every_metric_as_defined() -> None:
    assert _readme_metrics() == [
        (spec.name, spec.type, spec.labels, spec.help) for spec in metrics.METRICS
    ]


def test_label_values_are_initialised_at_zero() -> None:
    families = {family.name: family for family in metrics.REGISTRY.collect()}
    claims = {sample.labels["kind"] for sample in families["clp_coordinator_claims"].samples}
    assert claims >= {"pending", "recorded", "taken_over"}
    transitions = {
        (sample.labels["trigger"], sample.labels["actor"])
        for sample in families["clp_coordinator_transitions"].samples
        if sample.name.endswith("_total")
    }
    assert ("submitted", "coordinator") in transitions
    assert ("rolled_back", "coordinator") in transitions
