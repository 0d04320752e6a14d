"""P4, the restart: a coordinator dies with ``--in-flight`` jobs in flight; how soon does the next
start (the same ``instance_id``) re-attach every job (poll it once), and does it submit any again?

In-process: a first coordinator claims and submits the jobs against ``bench.backlog.NeverDone``
(an in-memory Spider whose jobs never finish) and is then dropped without releasing its leases,
as SIGKILL leaves them. A second coordinator with the same name starts over the same database and
Spider; the figure is the time from its start until Spider was asked the state of every job, and
the number of RegisterJob calls it made (must be 0). The database part (the take-over) is
measured apart.

    .venv/bin/python -m bench.restart [--in-flight 1000] [--database SERVER_URL]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from tempfile import TemporaryDirectory

from sqlalchemy import Engine

from bench.backlog import NeverDone, database, insert_pending, spider_calls
from coordinator.archive_storage import FsArchiveOutput
from coordinator.config.clp import CompressionCoordinator
from coordinator.service.coordinator import Coordinator
from coordinator.spider.measured import MeasuredSpider

INSTANCE = "bench-restart"


@dataclass(frozen=True)
class RestartFigures:
    backend: str
    in_flight: int
    take_over_secs: float
    reattach_secs: float
    registered_again: int
    polled: int

    def lines(self) -> list[str]:
        return [
            f"backend {self.backend}: {self.in_flight} jobs in flight at the kill",
            f"take-over (claims): {self.take_over_secs:.2f} s",
            f"every job polled once after: {self.reattach_secs:.2f} s ({self.polled} polled)",
            f"submitted twice: {self.registered_again}",
        ]


def _coordinator(engine: Engine, spider: NeverDone, in_flight: int, out: Path) -> Coordinator:
    return Coordinator(
        engine=engine,
        spider=MeasuredSpider(spider),
        settings=CompressionCoordinator(max_concurrent_jobs=in_flight),
        archive_output=FsArchiveOutput(directory=out),
        instance_id=INSTANCE,
        lease_duration=timedelta(seconds=30),
    )


def measure(server_url: str | None = None, *, in_flight: int = 1000) -> RestartFigures:
    """Run the case once; its figures."""
    with database(server_url) as engine, TemporaryDirectory() as scratch:
        insert_pending(engine, in_flight)
        spider = NeverDone()
        first = _coordinator(engine, spider, in_flight, Path(scratch))
        while sum(1 for job in first.driven.values() if job.spider_id is not None) < in_flight:
            first.tick()
        del first  # killed: its leases stay held until they expire
        spider.polled.clear()
        registered = spider_calls().get("RegisterJob", 0)
        started = time.monotonic()
        second = _coordinator(engine, spider, in_flight, Path(scratch))
        claimed = second.leases.claim()
        take_over = time.monotonic() - started
        interval = second.settings.job_polling_interval_millisecs / 1000
        while len(spider.polled) < in_flight and time.monotonic() - started < 60:
            second.tick()
            second.stopping.wait(second._pause(interval))
        reattach = max(spider.polled.values(), default=started) - started
        second.release_leases()
        assert claimed == in_flight, claimed
        return RestartFigures(
            backend=engine.dialect.name,
            in_flight=in_flight,
            take_over_secs=take_over,
            reattach_secs=reattach,
            registered_again=int(spider_calls().get("RegisterJob", 0) - registered),
            polled=len(spider.polled),
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.restart", description=__doc__)
    parser.add_argument("--database", help="a MariaDB server URL (default: SQLite)")
    parser.add_argument("--in-flight", type=int, default=1000)
    args = parser.parse_args(argv)
    for line in measure(args.database, in_flight=args.in_flight).lines():
        print(line)


if __name__ == "__main__":
    main()
