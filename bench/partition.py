"""Speed of partitioning a job's S3 objects into compression-task inputs (CLP's algorithm).

Builds 100,000 objects with realistic keys (several services and hosts, daily directories, rotated
file names, a mix of ``.gz``, ``.zst`` and plain objects) and times ``partition_objects`` on them,
the best of a few runs, for several workloads:

* mixed sizes (4 KiB to 64 MiB raw) at CLP's default 256 MiB target: many small early passes;
* the same objects at a small target (8 MiB): a partition every few objects;
* small objects (1 KiB to 64 KiB raw) at 256 MiB: few passes over large buffers;
* small heartbeat logs among large ``.gz`` access logs at 256 MiB: every large object triggers a
  pass that takes only itself, so the small ones stay buffered across thousands of passes (the case
  that regrouping the whole buffer on every pass, as CLP does, makes quadratic).

    .venv/bin/python -m bench.partition
"""

from __future__ import annotations

import datetime
import math
import random
import time

from coordinator.partition import partition_objects

OBJECTS = 100_000
RUNS = 3
MIB = 1024 * 1024
DEFAULT_TARGET = 256 * MIB
SMALL_TARGET = 8 * MIB

SERVICES = (
    "api-gateway",
    "auth",
    "billing",
    "checkout",
    "search",
    "ingest-worker",
    "nginx",
    "postgres",
    "kafka-broker",
    "scheduler",
)
HOSTS_PER_SERVICE = 12
FIRST_DAY = datetime.date(2026, 1, 1)


def realistic_keys(rng: random.Random, count: int) -> list[str]:
    """Distinct keys as log shippers write them: per service, host and day, rotated names."""
    keys: list[str] = []
    day = FIRST_DAY
    while len(keys) < count:
        date = day.isoformat()
        for service in SERVICES:
            for host in range(HOSTS_PER_SERVICE):
                directory = f"logs/{service}/{service}-{host:03d}/{date}"
                style = rng.random()
                if style < 0.4:
                    # logrotate: service.log.1.gz, service.log.2.gz, …
                    names = [f"{service}.log.{rotation}.gz" for rotation in range(1, 9)]
                elif style < 0.75:
                    # Hourly zstd chunks.
                    names = [f"{service}-{date}T{hour:02d}.jsonl.zst" for hour in range(0, 24, 3)]
                else:
                    # Plain files cut by size: app.log, app.log.1, …
                    names = ["app.log", *(f"app.log.{index}" for index in range(1, 6))]
                keys.extend(f"{directory}/{name}" for name in names)
        day += datetime.timedelta(days=1)
    return keys[:count]


def small_among_large(rng: random.Random, count: int) -> list[tuple[str, int]]:
    """Every tenth object a 40-64 MiB gzipped access log, the rest 200 B-2 KiB heartbeats."""
    objects: list[tuple[str, int]] = []
    for index in range(count):
        host = f"web-{index % 40:02d}"
        if index % 10 == 0:
            key = f"logs/nginx/{host}/access.log.{index}.gz"
            objects.append((key, rng.randint(40 * MIB, 64 * MIB)))
        else:
            key = f"logs/worker/{host}/heartbeat-{index:06d}.log"
            objects.append((key, rng.randint(200, 2048)))
    return objects


def log_uniform_sizes(rng: random.Random, count: int, low: int, high: int) -> list[int]:
    """Sizes spread evenly on a log scale between ``low`` and ``high`` bytes."""
    low_log, high_log = math.log(low), math.log(high)
    return [int(math.exp(rng.uniform(low_log, high_log))) for _ in range(count)]


def measure(objects: list[tuple[str, int]], target: int) -> tuple[int, float]:
    """The partition count and the best wall time over ``RUNS`` runs."""
    best = math.inf
    partitions = 0
    for _ in range(RUNS):
        started = time.perf_counter()
        partitions = len(partition_objects(objects, target))
        best = min(best, time.perf_counter() - started)
    return partitions, best


def main() -> None:
    rng = random.Random(2026)
    keys = realistic_keys(rng, OBJECTS)
    mixed = list(zip(keys, log_uniform_sizes(rng, OBJECTS, 4 * 1024, 64 * MIB), strict=True))
    small = list(zip(keys, log_uniform_sizes(rng, OBJECTS, 1024, 64 * 1024), strict=True))
    workloads = (
        ("mixed sizes, 256 MiB target", mixed, DEFAULT_TARGET),
        ("mixed sizes, 8 MiB target", mixed, SMALL_TARGET),
        ("small objects, 256 MiB target", small, DEFAULT_TARGET),
        ("small among large, 256 MiB target", small_among_large(rng, OBJECTS), DEFAULT_TARGET),
    )
    print(f"{'workload':<36}{'objects':>10}{'partitions':>12}{'seconds':>10}")
    for label, objects, target in workloads:
        partitions, seconds = measure(objects, target)
        print(f"{label:<36}{len(objects):>10,}{partitions:>12,}{seconds:>10.3f}")


if __name__ == "__main__":
    main()
