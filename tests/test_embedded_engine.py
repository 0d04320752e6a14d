"""The embedded engine against Spider's semantics, on SQLite and on MariaDB."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import Engine, delete, event, insert, select

from coordinator.engine.embedded.engine import EmbeddedSpider
from coordinator.engine.embedded.faults import Fault
from coordinator.engine.embedded.protocol import in_task_failure
from coordinator.spider.port import (
    InvalidArgument,
    InvalidJobState,
    JobNotFound,
    JobState,
    ResourceGroupExists,
    ServerError,
    Unauthenticated,
    cancel_if_safe,
    start_if_ready,
)
from coordinator.spider.task_graph import TaskGraph
from coordinator.spider.wire import compress, encode_job_inputs
from coordinator.store.schema import engine_jobs, engine_resource_groups
from tests.engine_support import (
    graph,
    journal,
    policy,
    record_spider_ids,
    running_engine,
    settings,
    submit,
    task,
    wait_for,
    wait_for_journal,
)
from tests.engine_tasks import release
from tests.timing import MovableClock, wait_until

pytestmark = pytest.mark.slow  # every test starts the engine and its executor processes

PASSWORD = b"compression-coordinator"
DONE = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


@pytest.fixture
def spider_dir(tmp_path: Path) -> Path:
    return tmp_path / "worker"


def _run(spider: EmbeddedSpider, task_graph: TaskGraph, inputs: list[bytes], *faults: Fault) -> int:
    """Register and start a job; ``faults`` apply to this job only."""
    group = spider.add_resource_group(f"rg-{time.monotonic_ns()}", PASSWORD)
    job_id = submit(spider, group, task_graph, inputs)
    for fault in faults:
        fault.job_id = job_id
        spider.inject(fault)
    assert start_if_ready(spider, job_id) is JobState.RUNNING
    return job_id


def test_a_graph_runs_to_success_with_commit(migrated_engine: Engine, spider_dir: Path) -> None:
    chained = graph(
        task("echo"),
        task("echo"),
        task("join", inputs=2, sources=[(0, 0), (1, 0)]),
    )
    with running_engine(migrated_engine, spider_dir) as spider:
        job_id = _run(spider, chained, [b"left", b"right"])
        assert wait_for(spider, job_id, *DONE) is JobState.SUCCEEDED
        assert spider.get_job_outputs(job_id) == [b"left+right"]
        with pytest.raises(InvalidJobState):
            spider.get_job_error(job_id)
    commits = [e for e in journal(spider_dir, job_id) if e["event"] == "commit"]
    assert [c["outputs"] for c in commits] == [["left+right"]]


def test_without_a_commit_task_the_job_succeeds_directly(
    migrated_engine: Engine, spider_dir: Path
) -> None:
    with running_engine(migrated_engine, spider_dir) as spider:
        job_id = _run(spider, graph(task("echo"), task("echo"), commit=False), [b"a", b"b"])
        assert wait_for(spider, job_id, *DONE) is JobState.SUCCEEDED
        assert spider.get_job_outputs(job_id) == [b"a", b"b"]


def test_a_failing_task_without_retries_fails_the_job(
    migrated_engine: Engine, spider_dir: Path
) -> None:
    with running_engine(migrated_engine, spider_dir) as spider:
        job_id = _run(spider, graph(task("echo"), task("fail")), [b"a", b"b"])
        assert wait_for(spider, job_id, *DONE) is JobState.FAILED
        assert spider.get_job_error(job_id) == in_task_failure("boom: the input is unusable")
        with pytest.raises(ServerError):  # still retained: INTERNAL, as Spider's cache answers
            spider.get_job_outputs(job_id)
    assert not [e for e in journal(spider_dir, job_id) if e["event"] == "commit"]


@pytest.mark.parametrize(("failures", "outcome"), [(2, JobState.SUCCEEDED), (3, JobState.FAILED)])
def test_retries_absorb_failures_up_to_max_num_retry(
    migrated_engine: Engine, spider_dir: Path, failures: int, outcome: JobState
) -> None:
    with running_engine(migrated_engine, spider_dir) as spider:
        spider.inject(Fault("fail", task=0, times=failures, message="flaky disk"))
        job_id = _run(spider, graph(task("echo", execution=policy(retries=2))), [b"a"])
        assert wait_for(spider, job_id, *DONE) is outcome
        if outcome is JobState.FAILED:
            assert spider.get_job_error(job_id) == in_task_failure("flaky disk")


def test_a_hard_timeout_kills_the_task_and_the_engine_carries_on(
    migrated_engine: Engine, spider_dir: Path
) -> None:
    with running_engine(migrated_engine, spider_dir, workers=1) as spider:
        slow = graph(task("sleep", execution=policy(soft_ms=300, hard_ms=600)))
        started = time.monotonic()
        job_id = _run(spider, slow, [b"30"])
        assert wait_for(spider, job_id, *DONE) is JobState.FAILED
        assert time.monotonic() - started < 20
        assert spider.get_job_error(job_id) == "hard timeout (600 ms) exceeded"
        assert [e["event"] for e in journal(spider_dir, job_id)] == ["start"]
        next_job = _run(spider, graph(task("echo")), [b"x"])
        assert wait_for(spider, next_job, *DONE) is JobState.SUCCEEDED


def test_a_crashing_executor_is_replaced(migrated_engine: Engine, spider_dir: Path) -> None:
    with running_engine(migrated_engine, spider_dir, workers=1) as spider:
        job_id = _run(spider, graph(task("crash")), [b"x"])
        assert wait_for(spider, job_id, *DONE) is JobState.FAILED
        assert spider.get_job_error(job_id) == "executor crashed (exit_status = Some(3))"
        spider.inject(Fault("crash", task=0))
        retried = _run(spider, graph(task("echo", execution=policy(retries=1))), [b"x"])
        assert wait_for(spider, retried, *DONE) is JobState.SUCCEEDED


@pytest.mark.parametrize(("failures", "outcome"), [(1, JobState.SUCCEEDED), (2, JobState.FAILED)])
def test_the_commit_is_retried_then_fails_the_job(
    migrated_engine: Engine, spider_dir: Path, failures: int, outcome: JobState
) -> None:
    with running_engine(migrated_engine, spider_dir) as spider:
        spider.inject(Fault("fail", task="commit", times=failures, message="database gone"))
        job_id = _run(spider, graph(task("echo"), commit=policy(retries=1)), [b"a"])
        assert wait_for(spider, job_id, *DONE) is outcome
        if outcome is JobState.FAILED:
            assert spider.get_job_error(job_id) == in_task_failure("database gone")


def test_cancel_in_ready_and_running(migrated_engine: Engine, spider_dir: Path) -> None:
    with running_engine(migrated_engine, spider_dir, workers=1) as spider:
        group = spider.add_resource_group("rg", PASSWORD)
        ready = submit(spider, group, graph(task("echo")), [b"a"])
        assert spider.cancel_job(ready) is JobState.CANCELLED
        with pytest.raises(ServerError):
            spider.start_job(ready)

        running = _run(spider, graph(task("wait_for_release")), [b"a"])
        wait_for_journal(spider_dir, running, "start")
        assert spider.cancel_job(running) is JobState.CANCELLED
        release(spider_dir, running)
        wait_for_journal(spider_dir, running, "done")  # in-flight instances are not stopped
        # The one worker reports an instance before it takes the next: once the next job has run,
        # the cancelled job's report has arrived (a commit it wrongly released would have run
        # first, commits go ahead of regular tasks).
        after = _run(spider, graph(task("echo"), commit=False), [b"b"])
        assert wait_for(spider, after, *DONE) is JobState.SUCCEEDED
        assert spider.get_job_state(running) is JobState.CANCELLED  # the report was ignored
        assert not [e for e in journal(spider_dir, running) if e["event"] == "commit"]


def test_cancel_in_commit_ready_without_cleanup_is_refused(
    migrated_engine: Engine, spider_dir: Path
) -> None:
    with running_engine(migrated_engine, spider_dir) as spider:
        spider.inject(Fault("hard_timeout", task="commit"))
        quick_commit = policy(soft_ms=1_000, hard_ms=2_000)
        job_id = _run(spider, graph(task("echo"), commit=quick_commit), [b"a"])
        wait_for(spider, job_id, JobState.COMMIT_READY)
        with pytest.raises(ServerError, match="without a cleanup task cannot be cancelled"):
            spider.cancel_job(job_id)
        assert cancel_if_safe(spider, job_id) is JobState.COMMIT_READY  # the safe helper waits
        assert spider.get_job_state(job_id) is JobState.COMMIT_READY
        assert wait_for(spider, job_id, *DONE) is JobState.FAILED


def test_cancel_with_a_cleanup_task(migrated_engine: Engine, spider_dir: Path) -> None:
    with running_engine(migrated_engine, spider_dir) as spider:
        group = spider.add_resource_group("rg", PASSWORD)
        with_cleanup = graph(task("wait_for_release"), cleanup=True)
        ready = submit(spider, group, with_cleanup, [b"a"])
        with pytest.raises(ServerError, match="Ready job with a cleanup task"):
            spider.cancel_job(ready)
        spider.start_job(ready)
        wait_for_journal(spider_dir, ready, "start")
        assert spider.cancel_job(ready) in (JobState.CLEANUP_READY, JobState.CANCELLED)
        assert wait_for(spider, ready, *DONE) is JobState.CANCELLED
        wait_for_journal(spider_dir, ready, "cleanup")
        release(spider_dir, ready)


def test_terminal_jobs_are_final(migrated_engine: Engine, spider_dir: Path) -> None:
    clock = MovableClock()
    retention = 300.0
    with running_engine(
        migrated_engine, spider_dir, retention=retention, clock=clock.monotonic
    ) as spider:
        job_id = _run(spider, graph(task("echo")), [b"a"])
        assert wait_for(spider, job_id, *DONE) is JobState.SUCCEEDED
        with pytest.raises(ServerError):
            spider.cancel_job(job_id)  # still retained: Spider answers INTERNAL
        with pytest.raises(ServerError):
            spider.start_job(job_id)

        def evicted() -> bool:
            try:
                spider.start_job(job_id)
            except JobNotFound:
                return True  # no longer retained: read from the database
            except ServerError:
                return False  # still retained
            raise AssertionError("a terminal job was started")

        clock.advance(retention)
        wait_until(evicted, what="the terminal job's eviction")  # the engine's next round
        assert spider.cancel_job(job_id) is JobState.SUCCEEDED  # evicted: the stored state
        with pytest.raises(JobNotFound):
            spider.start_job(job_id)
        assert spider.get_job_state(job_id) is JobState.SUCCEEDED
        assert start_if_ready(spider, job_id) is JobState.SUCCEEDED


def test_a_name_taken_between_the_look_and_the_insert_is_already_exists(
    migrated_engine: Engine, spider_dir: Path
) -> None:
    """Two AddResourceGroup of one name at once (coordinators starting together over gRPC): the
    later insert meets the unique name. Before, its IntegrityError went out as INTERNAL (seen in
    ``test_resource_group``'s four coordinators registering at once); now it is ALREADY_EXISTS,
    as when the look finds the name."""
    if migrated_engine.dialect.name == "sqlite":
        pytest.skip("SQLite's BEGIN IMMEDIATE serialises the two: the look finds the name")
    spider = EmbeddedSpider(migrated_engine, settings(migrated_engine, spider_dir))  # not started

    inserted: list[str] = []

    def taken_meanwhile(_connection: object, _cursor: object, statement: str, *_: object) -> None:
        if statement.startswith("INSERT INTO spider_engine_resource_groups") and not inserted:
            inserted.append(statement)
            with migrated_engine.begin() as other:  # another session, committed first
                taken = insert(engine_resource_groups).values(external_id="rg", password=b"x")
                other.execute(taken)

    event.listen(migrated_engine, "before_cursor_execute", taken_meanwhile)
    try:
        with pytest.raises(ResourceGroupExists, match="already exists"):
            spider.add_resource_group("rg", PASSWORD)
    finally:
        event.remove(migrated_engine, "before_cursor_execute", taken_meanwhile)
    assert spider.resource_group_by_name("rg", b"x") > 0  # the other session's group


def test_registration_is_checked_like_spider(migrated_engine: Engine, spider_dir: Path) -> None:
    with running_engine(migrated_engine, spider_dir) as spider:
        group = spider.add_resource_group("rg", PASSWORD)
        with pytest.raises(ResourceGroupExists):
            spider.add_resource_group("rg", PASSWORD)
        spider.verify_resource_group(group, PASSWORD)
        with pytest.raises(Unauthenticated):
            spider.verify_resource_group(group, b"wrong")
        with pytest.raises(Unauthenticated):
            spider.verify_resource_group(group + 100, PASSWORD)
        good = graph(task("echo"))
        with pytest.raises(Unauthenticated, match="invalid resource group"):
            submit(spider, group + 100, good, [b"a"])
        with pytest.raises(InvalidArgument, match="input size mismatch"):
            submit(spider, group, good, [b"a", b"b"])
        with pytest.raises(InvalidArgument, match="bad request"):
            spider.register_job(group, compress(b'{"tasks": []}'), encode_job_inputs([]))
        with pytest.raises(JobNotFound):
            spider.get_job_state(424242)
        with pytest.raises(JobNotFound):
            spider.start_job(424242)
        with pytest.raises(JobNotFound):
            spider.cancel_job(424242)


def test_running_jobs_run_again_from_the_start_after_a_restart(
    migrated_engine: Engine, spider_dir: Path
) -> None:
    two_tasks = graph(task("echo"), task("slow_first_run"))
    with running_engine(migrated_engine, spider_dir) as spider:
        job_id = _run(spider, two_tasks, [b"a", b"b"])
        wait_for_journal(spider_dir, job_id, "start")
        wait_for_journal(spider_dir, job_id, "echo")
    with running_engine(migrated_engine, spider_dir) as restarted:
        assert wait_for(restarted, job_id, *DONE) is JobState.SUCCEEDED
        assert restarted.get_job_outputs(job_id) == [b"a", b"second run"]
    events = [e["event"] for e in journal(spider_dir, job_id)]
    assert events.count("echo") == 2  # every task ran again
    assert events.count("commit") == 1


def test_ready_and_commit_ready_jobs_survive_a_restart(
    migrated_engine: Engine, spider_dir: Path
) -> None:
    with running_engine(migrated_engine, spider_dir) as spider:
        group = spider.add_resource_group("rg", PASSWORD)
        ready = submit(spider, group, graph(task("echo")), [b"r"])
        spider.inject(Fault("hard_timeout", task="commit"))
        committing = _run(spider, graph(task("echo"), commit=policy(hard_ms=60_000)), [b"c"])
        wait_for(spider, committing, JobState.COMMIT_READY)
    with running_engine(migrated_engine, spider_dir) as restarted:
        assert restarted.get_job_state(ready) is JobState.READY
        assert wait_for(restarted, committing, *DONE) is JobState.SUCCEEDED
        assert start_if_ready(restarted, ready) is JobState.RUNNING
        assert wait_for(restarted, ready, *DONE) is JobState.SUCCEEDED
    commits = [e for e in journal(spider_dir, committing) if e["event"] == "commit"]
    assert [c["outputs"] for c in commits] == [["c"]]


def test_a_lost_commit_report_runs_the_commit_again(
    migrated_engine: Engine, spider_dir: Path
) -> None:
    with running_engine(migrated_engine, spider_dir) as spider:
        spider.inject(Fault("lose_report", task="commit"))
        job_id = _run(spider, graph(task("echo")), [b"a"])
        assert wait_for(spider, job_id, *DONE) is JobState.SUCCEEDED
    assert len(wait_for_journal(spider_dir, job_id, "commit", 2)) == 2


def test_failed_after_the_commit_took_effect(migrated_engine: Engine, spider_dir: Path) -> None:
    """A1/A2: the commit's effects happen, then the instance is lost; no retries left → Failed."""
    with running_engine(migrated_engine, spider_dir) as spider:
        quick_commit = policy(soft_ms=1_000, hard_ms=1_500)
        timed_out = _run(
            spider,
            graph(task("echo"), commit=quick_commit),
            [b"a"],
            Fault("hard_timeout", task="commit", after_effects=True),
        )
        crashed = _run(
            spider,
            graph(task("echo")),
            [b"b"],
            Fault("crash", task="commit", after_effects=True),
        )
        assert wait_for(spider, timed_out, *DONE) is JobState.FAILED
        assert wait_for(spider, crashed, *DONE) is JobState.FAILED
        assert spider.get_job_error(timed_out) == "hard timeout (1500 ms) exceeded"
        assert spider.get_job_error(crashed) == "executor crashed (exit_status = Some(70))"
    assert len(wait_for_journal(spider_dir, timed_out, "commit")) == 1
    assert len(wait_for_journal(spider_dir, crashed, "commit")) == 1


def test_a_duplicated_commit_runs_twice_at_once(migrated_engine: Engine, spider_dir: Path) -> None:
    with running_engine(migrated_engine, spider_dir, workers=2) as spider:
        spider.inject(Fault("duplicate", task="commit"))
        job_id = _run(spider, graph(task("echo"), commit_function="record_commit_slowly"), [b"a"])
        assert wait_for(spider, job_id, *DONE) is JobState.SUCCEEDED
        # The second instance's report is stale once the first succeeded, but it ran all the same.
        commits = wait_for_journal(spider_dir, job_id, "commit", 2)
    assert len({c["instance"] for c in commits}) == 2


def test_a_soft_timeout_starts_one_duplicate_within_the_instance_limit(
    migrated_engine: Engine, spider_dir: Path
) -> None:
    limited = graph(task("sleep", execution=policy(soft_ms=300, hard_ms=20_000, instances=1)))
    duplicated = graph(task("sleep", execution=policy(soft_ms=300, hard_ms=20_000, instances=2)))
    with running_engine(migrated_engine, spider_dir, workers=2) as spider:
        alone = _run(spider, limited, [b"1.5"])
        assert wait_for(spider, alone, *DONE) is JobState.SUCCEEDED
        twice = _run(spider, duplicated, [b"1.5"])
        assert wait_for(spider, twice, *DONE) is JobState.SUCCEEDED
    assert len([e for e in journal(spider_dir, alone) if e["event"] == "start"]) == 1
    assert len(wait_for_journal(spider_dir, twice, "start", 2)) == 2


def test_a_lost_report_then_a_failing_rerun_fails_the_job_after_the_commit(
    migrated_engine: Engine, spider_dir: Path
) -> None:
    """A4: the first commit took effect but its report was lost; the re-run fails → Failed."""
    with running_engine(migrated_engine, spider_dir) as spider:
        spider.inject(Fault("lose_report", task="commit"))
        spider.inject(Fault("fail", task="commit", message="job is no longer running"))
        job_id = _run(spider, graph(task("echo"), commit=policy(retries=0)), [b"a"])
        assert wait_for(spider, job_id, *DONE) is JobState.FAILED
        assert spider.get_job_error(job_id) == in_task_failure("job is no longer running")
    assert len(wait_for_journal(spider_dir, job_id, "commit")) == 1  # the effects happened once


def test_cancelled_after_the_commit_took_effect(migrated_engine: Engine, spider_dir: Path) -> None:
    """B1: a cancel arrives while the commit runs; its effects stay, the job ends Cancelled."""
    with running_engine(migrated_engine, spider_dir) as spider:
        job_id = _run(spider, graph(task("echo")), [b"a"], Fault("cancelled", task="commit"))
        assert wait_for(spider, job_id, *DONE) is JobState.CANCELLED
    assert len(wait_for_journal(spider_dir, job_id, "commit")) == 1


# --- job ids: never below what compression_jobs already records ----------------------------------


def test_new_job_ids_stay_above_the_spider_ids_compression_jobs_records(
    migrated_engine: Engine, spider_dir: Path
) -> None:
    record_spider_ids(migrated_engine, [1, 2, 3, 4, 5, 1000])
    with running_engine(migrated_engine, spider_dir) as spider:
        group = spider.add_resource_group("rg", PASSWORD)
        first = submit(spider, group, graph(task("echo")), [b"a"])
        second = submit(spider, group, graph(task("echo")), [b"b"])
        assert (first, second) == (1001, 1002)
        assert spider.get_job_state(first) is JobState.READY
    # The engine's records are reset (Spider's storage wiped): still no id compression_jobs holds.
    record_spider_ids(migrated_engine, [first])
    with migrated_engine.begin() as connection:
        connection.execute(delete(engine_jobs))
    with running_engine(migrated_engine, spider_dir) as spider:
        group = spider.add_resource_group("rg2", PASSWORD)
        assert submit(spider, group, graph(task("echo")), [b"c"]) == 1002


def test_engines_sharing_a_database_register_at_once_with_distinct_ids(
    migrated_engine: Engine, tmp_path: Path
) -> None:
    record_spider_ids(migrated_engine, [1, 2, 3, 4, 5, 1000])
    threads_per_engine, jobs_per_thread = 4, 5
    with (
        running_engine(migrated_engine, tmp_path / "a", workers=1) as first,
        running_engine(migrated_engine, tmp_path / "b", workers=1) as second,
    ):
        group = first.add_resource_group("rg", PASSWORD)
        spiders = [first, second] * threads_per_engine
        barrier = threading.Barrier(len(spiders))
        ids: list[int] = []
        errors: list[BaseException] = []

        def register(spider: EmbeddedSpider) -> None:
            try:
                barrier.wait(timeout=10)
                for n in range(jobs_per_thread):
                    ids.append(submit(spider, group, graph(task("echo")), [bytes([n])]))
            except BaseException as error:  # reported in the test's thread
                errors.append(error)

        threads = [threading.Thread(target=register, args=(s,)) for s in spiders]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == []
        assert len(ids) == len(set(ids)) == len(spiders) * jobs_per_thread
        assert min(ids) > 1000
        for job_id in ids:  # each engine knows the jobs it registered, by id, from the database
            assert first.get_job_state(job_id) is JobState.READY
    with migrated_engine.connect() as connection:
        stored = connection.execute(select(engine_jobs.c.id)).scalars().all()
    assert sorted(stored) == sorted(ids)


def test_a_registration_waiting_for_the_database_blocks_neither_the_executors_nor_the_sweep(
    migrated_engine: Engine, spider_dir: Path
) -> None:
    """RegisterJob writes its row without holding the engine's condition: another job is started,
    run and reported while the insert is held; the sweep, meanwhile, never sees the new row
    without its job in memory (it waits for the registration), so the job is not caught up with
    or adopted, and starts as registered."""
    with running_engine(migrated_engine, spider_dir) as spider:
        group = spider.add_resource_group("rg-held", PASSWORD)
        other = submit(spider, group, graph(task("echo")), [b"other"])
        inserted, proceed = threading.Event(), threading.Event()
        insert_jobs = spider._insert_jobs

        def held_insert(*args: object) -> list[int]:
            job_ids = insert_jobs(*args)  # type: ignore[arg-type]
            inserted.set()
            assert proceed.wait(60)
            return job_ids

        caught_up: list[int] = []
        catch_up_with = spider._catch_up_with

        def record_catch_up(job_id: int, job: object) -> None:
            caught_up.append(job_id)
            catch_up_with(job_id, job)  # type: ignore[arg-type]

        spider._insert_jobs = held_insert  # type: ignore[method-assign]
        spider._catch_up_with = record_catch_up  # type: ignore[method-assign]
        held: list[int] = []
        registering = threading.Thread(
            target=lambda: held.append(submit(spider, group, graph(task("echo")), [b"held"]))
        )
        registering.start()
        assert inserted.wait(60)
        assert start_if_ready(spider, other) is JobState.RUNNING
        assert wait_for(spider, other, *DONE) is JobState.SUCCEEDED
        sweeping = threading.Thread(target=spider._sweep)
        sweeping.start()
        proceed.set()
        registering.join(60)
        sweeping.join(60)
        assert not registering.is_alive() and not sweeping.is_alive()
        assert held and held[0] not in caught_up
        assert spider.get_job_state(held[0]) is JobState.READY
        assert start_if_ready(spider, held[0]) is JobState.RUNNING
        assert wait_for(spider, held[0], *DONE) is JobState.SUCCEEDED
