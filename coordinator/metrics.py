"""The coordinator's Prometheus metrics: every one is defined here, once.

A base module (it imports nothing of the coordinator), so every part counts its own events where
they happen: the store its guarded moves and lost races, the loop its claims, lost leases, ticks
and rollbacks, the clean-up the archives it removes, the Spider port's wrapper
(``coordinator.spider.measured``) every call, the embedded engine its task instances. ``METRICS``
is the table of them (name, type, labels, help), which the README's "Metrics" section repeats
(a test compares the two); ``REGISTRY`` holds them, with prometheus_client's standard process
and platform collectors, and is what ``/metrics`` serves (``coordinator.service.monitoring``).

Counters count what *this process* did since it started (Prometheus' ``rate()`` and
``increase()`` handle restarts). The commit task's ``committed`` moves are made in the task
processes (the embedded engine's executors, or a Spider cluster's workers), which export nothing,
so they are not among the transitions. ``clp_coordinator_jobs`` is read from the database at
each scrape (one ``GROUP BY``), so replicas sharing a database all report the same numbers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

_log = logging.getLogger(__name__)

PREFIX = "clp_coordinator_"

MetricType = Literal["counter", "gauge", "histogram"]


@dataclass(frozen=True)
class MetricSpec:
    """One row of the metrics table: the exposed name, its type, its labels and its help text."""

    name: str
    type: MetricType
    labels: tuple[str, ...]
    help: str


REGISTRY = CollectorRegistry()
"""Every metric below, plus prometheus_client's standard ``process_*``, ``python_gc_*`` and
``python_info``."""
ProcessCollector(registry=REGISTRY)
PlatformCollector(registry=REGISTRY)
GCCollector(registry=REGISTRY)

METRICS: list[MetricSpec] = []
"""The table of the coordinator's own metrics, in definition order."""


def _spec(name: str, kind: MetricType, labels: tuple[str, ...], documentation: str) -> str:
    assert name.startswith(PREFIX), name
    METRICS.append(MetricSpec(name, kind, labels, documentation))
    return name


def _counter(name: str, documentation: str, labels: tuple[str, ...] = ()) -> Counter:
    assert name.endswith("_total"), name
    _spec(name, "counter", labels, documentation)
    return Counter(name, documentation, labels, registry=REGISTRY)


def _gauge(name: str, documentation: str, labels: tuple[str, ...] = ()) -> Gauge:
    _spec(name, "gauge", labels, documentation)
    return Gauge(name, documentation, labels, registry=REGISTRY)


def _histogram(
    name: str, documentation: str, buckets: tuple[float, ...], labels: tuple[str, ...] = ()
) -> Histogram:
    assert name.endswith("_seconds"), name
    _spec(name, "histogram", labels, documentation)
    return Histogram(name, documentation, labels, registry=REGISTRY, buckets=buckets)


class JobsByStatus(Collector):
    """``clp_coordinator_jobs``: the rows of ``compression_jobs`` by lifecycle state, counted in
    the database when scraped. ``source`` returns the counts by status label; while it is unset
    (no database open) or fails (the database is down), the family has no samples."""

    def __init__(self, name: str, documentation: str) -> None:
        self.name = name
        self.documentation = documentation
        self.source: Callable[[], Mapping[str, int]] | None = None
        _spec(name, "gauge", ("status",), documentation)

    def describe(self) -> Iterable[Metric]:
        yield GaugeMetricFamily(self.name, self.documentation, labels=["status"])

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily(self.name, self.documentation, labels=["status"])
        source = self.source
        if source is not None:
            try:
                counts = source()
            except Exception as error:
                _log.warning("cannot count the jobs by status for /metrics: %s", error)
                counts = {}
            for status, count in counts.items():
                family.add_metric([status], count)
        yield family


# --- the jobs -------------------------------------------------------------------------------

JOBS = JobsByStatus(
    "clp_coordinator_jobs",
    "Compression jobs in compression_jobs by lifecycle status (pending, running, committed, "
    "succeeded, failed, killed; unknown for a status no one defines), counted in the database "
    "at each scrape",
)
REGISTRY.register(JOBS)

JOBS_DRIVEN = _gauge(
    "clp_coordinator_jobs_driven",
    "Jobs whose lease this coordinator holds, after its last tick",
)

# --- moves and leases -----------------------------------------------------------------------

TRANSITIONS = _counter(
    "clp_coordinator_transitions_total",
    "Guarded moves this process applied (each with its history row), by trigger and actor",
    ("trigger", "actor"),
)
LOST_RACES = _counter(
    "clp_coordinator_lost_races_total",
    "Guarded moves that lost their compare-and-set (the row had moved on or the lease was "
    "taken over): nothing written, by trigger",
    ("trigger",),
)
ROLLBACKS = _counter(
    "clp_coordinator_rollbacks_total",
    "Committed jobs rolled back (their published archives withdrawn in the move's "
    "transaction), by the status they ended in",
    ("status",),
)
ARCHIVES_WITHDRAWN = _counter(
    "clp_coordinator_archives_withdrawn_total",
    "Published archive rows withdrawn, by cause: rollback (a rollback's move), foreign_end (the "
    "clean-up of a Committed job another writer ended)",
    ("cause",),
)
for _cause in ("rollback", "foreign_end"):
    ARCHIVES_WITHDRAWN.labels(_cause)
for _status in ("failed", "killed"):
    ROLLBACKS.labels(_status)
CLAIMS = _counter(
    "clp_coordinator_claims_total",
    "Jobs this coordinator took the lease of, by kind: pending (to submit), recorded (a Pending "
    "row that already records a Spider job, to end), taken_over (an in-flight job whose lease "
    "expired)",
    ("kind",),
)
for _kind in ("pending", "recorded", "taken_over"):
    CLAIMS.labels(_kind)
LEASES_LOST = _counter(
    "clp_coordinator_leases_lost_total",
    "Driven jobs dropped at a lease renewal because another coordinator took their lease over",
)

# --- the loop -------------------------------------------------------------------------------

TICK_DURATION = _histogram(
    "clp_coordinator_tick_duration_seconds",
    "Duration of one tick of the loop (renew, serve cancels, claim, submit and poll, sweep), "
    "failed ticks included",
    (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0),
)
TICK_FAILURES = _counter(
    "clp_coordinator_tick_failures_total",
    "Ticks that failed and were retried after a pause, by cause: database (an outage or another "
    "database error), unexpected (any other exception)",
    ("cause",),
)
for _cause in ("database", "unexpected"):
    TICK_FAILURES.labels(_cause)
LAST_TICK = _gauge(
    "clp_coordinator_last_tick_timestamp_seconds",
    "When the last tick ended (Unix time), failed ones included",
)

# --- Spider ---------------------------------------------------------------------------------

SPIDER_CALL_DURATION = _histogram(
    "clp_coordinator_spider_call_duration_seconds",
    "Duration of the coordinator's Spider calls (gRPC retries included), by method "
    "(Spider's RPC name; ResourceGroupByName for the embedded engine's lookup, RegisterJobs and "
    "StartReadyJobs for its registration and start of a tick's submissions in one call), failed "
    "calls included",
    (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
    ("method",),
)
SPIDER_CALL_ERRORS = _counter(
    "clp_coordinator_spider_call_errors_total",
    "Spider calls that raised, by method and error (the port's error class: JobNotFound, "
    "InvalidJobState, InvalidArgument, Unauthenticated, Unavailable, ServerError, "
    "ResourceGroupExists; or the exception's class)",
    ("method", "error"),
)

# --- archives -------------------------------------------------------------------------------

STORED_ARCHIVES_REMOVED = _counter(
    "clp_coordinator_stored_archives_removed_total",
    "Stored archive files removed by the clean-up, by cause: ended_job (a Failed or Killed job's "
    "archives, or a Succeeded job's unpublished duplicates), unattributed (records no job can "
    "publish any more)",
    ("cause",),
)
for _cause in ("ended_job", "unattributed"):
    STORED_ARCHIVES_REMOVED.labels(_cause)
STORED_ARCHIVE_REMOVAL_ERRORS = _counter(
    "clp_coordinator_stored_archive_removal_errors_total",
    "Stored archive files the clean-up could not remove (their records stay and are retried)",
)

# --- the embedded engine --------------------------------------------------------------------

ENGINE_TASK_INSTANCES = _counter(
    "clp_coordinator_engine_task_instances_total",
    "Task instances the embedded engine's executors ran to an end, by task (regular, commit, "
    "cleanup) and outcome (succeeded, failed, timed_out: killed at the hard timeout, crashed: "
    "the executor died)",
    ("task", "outcome"),
)
for _task in ("regular", "commit", "cleanup"):
    for _outcome in ("succeeded", "failed", "timed_out", "crashed"):
        ENGINE_TASK_INSTANCES.labels(_task, _outcome)
