"""RegisterJob and StartJob of a tick's submissions in one transaction each
(``EmbeddedSpider.register_jobs``, ``EmbeddedSpider.start_ready_jobs``).

Before, each registered and each started job cost the engine one commit of its own (on SQLite a
``BEGIN IMMEDIATE`` and a WAL fsync under the one write lock): two of the seven commits per job
that bound P1b. The engine now stores the registrations in one transaction and writes the starts
of the jobs it holds Ready in another, answering each job as RegisterJob and ``start_if_ready``
would. The engines here are not started: no task runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import Engine, event, select

from coordinator.spider.measured import MeasuredSpider
from coordinator.spider.port import (
    InvalidArgument,
    JobNotFound,
    JobState,
    Unauthenticated,
    register_all_jobs,
    start_all_if_ready,
    start_if_ready,
)
from coordinator.spider.wire import encode_job_inputs
from coordinator.store.schema import engine_jobs
from tests.engine_support import graph, registrar, submit, task
from tests.service_support import SpiderProxy
from tests.sql_capture import one_line, statements_sent

PASSWORD = b"compression-coordinator"
GRAPH = graph(task("echo"))


def _commits(database: Engine) -> list[int]:
    commits: list[int] = []

    def count(_connection: Any) -> None:
        commits.append(1)

    event.listen(database, "commit", count)
    return commits


def _stored_states(database: Engine, job_ids: list[int]) -> list[str]:
    with database.connect() as connection:
        states = dict(
            connection.execute(
                select(engine_jobs.c.id, engine_jobs.c.state).where(engine_jobs.c.id.in_(job_ids))
            ).all()
        )
    return [states[job_id] for job_id in job_ids]


def test_the_ready_jobs_are_started_in_one_transaction_each_answered_in_its_place(
    migrated_engine: Engine, tmp_path: Path
) -> None:
    with registrar(migrated_engine, tmp_path, "a") as spider:
        group = spider.add_resource_group("rg", PASSWORD)
        ready = [submit(spider, group, GRAPH, [bytes([n])]) for n in range(4)]
        started_before = submit(spider, group, GRAPH, [b"x"])
        assert start_if_ready(spider, started_before) is JobState.RUNNING
        commits = _commits(migrated_engine)
        with statements_sent(migrated_engine) as sent:
            answers = start_all_if_ready(spider, [*ready, started_before, 9_999])
        updates = [s for s in sent if one_line(s).startswith("update ")]
        assert len(commits) == 1  # before: one per Ready job
        assert len(updates) == 1  # one compare-and-set for the four Ready jobs
        assert answers[:5] == [JobState.RUNNING] * 5  # a started job counts as started
        assert isinstance(answers[5], JobNotFound)
        assert [spider.get_job_state(job_id) for job_id in ready] == [JobState.RUNNING] * 4
        assert _stored_states(migrated_engine, ready) == ["Running"] * 4


def test_a_row_changed_behind_the_engine_is_answered_as_start_job_answers_it(
    migrated_engine: Engine, tmp_path: Path
) -> None:
    """A job whose guarded write matches no row (another engine took it, or an earlier start's
    reply was lost) is answered alone, by ``start_if_ready`` with ``start_job``'s rules."""
    with registrar(migrated_engine, tmp_path, "a") as spider:
        group = spider.add_resource_group("rg", PASSWORD)
        first, second = (submit(spider, group, GRAPH, [bytes([n])]) for n in range(2))
        with migrated_engine.begin() as connection:  # a start that applied, its reply lost
            connection.execute(
                engine_jobs.update().where(engine_jobs.c.id == second).values(state="Running")
            )
        answers = start_all_if_ready(spider, [first, second])
        assert answers == [JobState.RUNNING, JobState.RUNNING]
        assert _stored_states(migrated_engine, [first, second]) == ["Running", "Running"]


def test_the_measured_engine_passes_the_batch_on_and_a_cluster_starts_one_by_one(
    migrated_engine: Engine, tmp_path: Path
) -> None:
    with registrar(migrated_engine, tmp_path, "a") as spider:
        group = spider.add_resource_group("rg", PASSWORD)
        jobs = [submit(spider, group, GRAPH, [bytes([n])]) for n in range(3)]
        measured = MeasuredSpider(spider)
        assert callable(measured.start_ready_jobs)
        assert start_all_if_ready(measured, jobs[:2]) == [JobState.RUNNING] * 2
        started: list[int] = []

        class OneByOne(SpiderProxy):  # no start_ready_jobs: a Spider cluster's client
            def start_job(self, job_id: int) -> JobState:
                started.append(job_id)
                return super().start_job(job_id)

        assert start_all_if_ready(OneByOne(spider), jobs) == [JobState.RUNNING] * 3
        assert started == [jobs[2]]  # the two started ones are only asked for their state


def test_the_jobs_of_a_tick_are_registered_in_one_transaction_each_answered_in_its_place(
    migrated_engine: Engine, tmp_path: Path
) -> None:
    """RegisterJob of several jobs (``register_jobs``): one commit, consecutive ids, a payload
    Spider refuses answered ``InvalidArgument`` in its place while the others are stored."""
    with registrar(migrated_engine, tmp_path, "a") as spider:
        group = spider.add_resource_group("rg", PASSWORD)
        first = submit(spider, group, GRAPH, [b"first"])
        payloads = [(GRAPH.compressed(), encode_job_inputs([bytes([n])])) for n in range(3)]
        commits = _commits(migrated_engine)
        answers = register_all_jobs(spider, group, [payloads[0], (b"junk", b"junk"), *payloads[1:]])
        assert len(commits) == 1  # before: one per job
        assert isinstance(answers[1], InvalidArgument)
        assert [answers[0], *answers[2:]] == [first + 1, first + 2, first + 3]
        assert _stored_states(migrated_engine, [first + 1, first + 2, first + 3]) == ["Ready"] * 3
        assert start_all_if_ready(spider, [first + 1]) == [JobState.RUNNING]  # in memory too
        unknown = register_all_jobs(spider, 9_999, payloads[:2])
        assert [type(answer) for answer in unknown] == [Unauthenticated, Unauthenticated]
