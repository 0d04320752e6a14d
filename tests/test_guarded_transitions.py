"""Guarded transitions on SQLite and MariaDB: moves, refusals, lost races, atomic effects."""

from __future__ import annotations

from dataclasses import fields
from datetime import datetime, timedelta

import pytest
from freezegun import freeze_time
from sqlalchemy import Connection, Engine, insert, select, text, update

from coordinator.lifecycle import (
    EDGES,
    Actor,
    Edge,
    IllegalTransition,
    JobStatus,
    Record,
    RowGuard,
    edges_from,
)
from coordinator.store.guarded import (
    Applied,
    InvalidTransitionRequest,
    LockedRow,
    LostRace,
    NotFound,
)
from coordinator.store.jobs import JobRow, JobStore, TransitionRow, job_state
from coordinator.store.schema import compression_jobs, datasets, job_transitions
from tests.paths import SPIDER_ID, new_job_in, request
from tests.sql_capture import one_line, statements_sent

START = datetime(2026, 11, 30, 12, 0, 0, 123000)


def _edge_id(edge: Edge) -> str:
    return f"{edge.trigger}-{edge.dest.label}"


def _new_job_for(store: JobStore, edge: Edge) -> int:
    """A new job in ``edge.source`` that the edge's guards match."""
    job_id = new_job_in(store, edge.source)
    if edge.source is JobStatus.PENDING and RowGuard.SPIDER_ID_MATCHES in edge.guards:
        # 'abandoned': a Pending row that some other writer gave a Spider id.
        with store.engine.begin() as connection:
            connection.execute(
                update(compression_jobs)
                .where(compression_jobs.c.id == job_id)
                .values(spider_id=SPIDER_ID)
            )
    return job_id


@pytest.mark.parametrize("edge", EDGES, ids=_edge_id)
def test_every_legal_transition_applies_and_records(store: JobStore, edge: Edge) -> None:
    with freeze_time(START) as clock:
        job_id = _new_job_for(store, edge)
        before = store.get(job_id)
        assert before is not None
        clock.tick(timedelta(seconds=90))
        actor = sorted(edge.actors)[0]
        result = store.transition(
            request(job_id, edge.trigger, edge.source, edge.dest, actor, actor_id="instance-1")
        )
        now = START + timedelta(seconds=90)

    assert isinstance(result, Applied)
    assert result.edge is edge
    job = store.get(job_id)
    assert job is not None
    assert job_state(job) == edge.dest
    assert job.update_time == now.replace(microsecond=0) or job.update_time == now
    if Record.SUBMISSION in edge.records:
        assert (job.spider_id, job.num_tasks, job.start_time) == (SPIDER_ID, 3, now)
        assert job.dispatch_time is not None
    else:
        assert (job.spider_id, job.num_tasks, job.start_time) == (
            before.spider_id,
            before.num_tasks,
            before.start_time,
        )
    if Record.SIZES in edge.records:
        assert (job.uncompressed_size, job.compressed_size) == (1000, 100)
    if Record.DURATION in edge.records:
        assert job.duration == pytest.approx(90.0)
    expected_msg = f"test: {edge.trigger}" if Record.STATUS_MSG in edge.records else ""
    assert job.status_msg == expected_msg

    last = store.history(job_id)[-1]
    assert last.id == result.history_id
    assert (last.from_status, last.to_status, last.trigger) == (
        edge.source,
        edge.dest,
        edge.trigger,
    )
    assert (last.actor, last.actor_id, last.reason) == (
        actor.value,
        "instance-1",
        expected_msg or f"test: {edge.trigger}",
    )
    assert (last.spider_id, last.lease_epoch, last.at) == (SPIDER_ID, 0, now)


def _illegal_requests() -> list[tuple[JobStatus, str, JobStatus, Actor]]:
    triggers = sorted({edge.trigger for edge in EDGES})
    legal = {(e.trigger, e.source, e.dest, a) for e in EDGES for a in e.actors}
    return [
        (source, trigger, dest, actor)
        for source in JobStatus
        for trigger in triggers
        for dest in JobStatus
        for actor in Actor
        if (trigger, source, dest, actor) not in legal
    ]


@pytest.mark.parametrize("status", list(JobStatus), ids=lambda s: s.label)
def test_every_illegal_transition_is_refused_before_any_sql(
    store: JobStore, migrated_engine: Engine, status: JobStatus
) -> None:
    job_id = new_job_in(store, status)
    before = store.get(job_id)
    history_before = len(store.history(job_id))
    cases = [case for case in _illegal_requests() if case[0] == status]
    assert cases
    with statements_sent(migrated_engine) as statements:
        for source, trigger, dest, actor in cases:
            with pytest.raises(IllegalTransition):
                store.transition(request(job_id, trigger, source, dest, actor))
    assert statements == []
    after = store.get(job_id)
    assert after is not None and before is not None
    assert (after.status, after.update_time, after.status_msg) == (
        before.status,
        before.update_time,
        before.status_msg,
    )
    assert len(store.history(job_id)) == history_before


def test_a_stale_source_loses_the_race_and_changes_nothing(store: JobStore) -> None:
    job_id = new_job_in(store, JobStatus.RUNNING)
    history = len(store.history(job_id))
    result = store.transition(
        request(job_id, "submitted", JobStatus.PENDING, JobStatus.RUNNING, Actor.COORDINATOR)
    )
    assert result == LostRace(job_id, JobStatus.PENDING, JobStatus.RUNNING, SPIDER_ID, 0)
    assert "expected Pending but is Running" in result.describe()
    assert len(store.history(job_id)) == history


def test_a_foreign_terminal_write_is_never_overwritten(
    store: JobStore, migrated_engine: Engine
) -> None:
    """CLP's legacy scheduler kills every RUNNING job on start-up (hazard H2)."""
    job_id = new_job_in(store, JobStatus.RUNNING)
    with migrated_engine.begin() as connection:
        connection.execute(
            text("UPDATE compression_jobs SET status = 4, duration = 0 WHERE status = 1")
        )
    result = store.transition(
        request(job_id, "failed", JobStatus.RUNNING, JobStatus.FAILED, Actor.COORDINATOR)
    )
    assert isinstance(result, LostRace)
    assert result.actual_status == JobStatus.KILLED
    job = store.get(job_id)
    assert job is not None
    assert (job.status, job.status_msg) == (JobStatus.KILLED, "")


def test_the_spider_id_guards(store: JobStore, migrated_engine: Engine) -> None:
    running = new_job_in(store, JobStatus.RUNNING)
    other_spider_job = store.transition(
        request(
            running, "failed", JobStatus.RUNNING, JobStatus.FAILED, Actor.COORDINATOR, spider_id=7
        )
    )
    assert isinstance(other_spider_job, LostRace)
    assert other_spider_job.actual_status == JobStatus.RUNNING

    pending = new_job_in(store, JobStatus.PENDING)
    with migrated_engine.begin() as connection:
        connection.execute(
            update(compression_jobs).where(compression_jobs.c.id == pending).values(spider_id=9)
        )
    resubmitted = store.transition(
        request(pending, "submitted", JobStatus.PENDING, JobStatus.RUNNING, Actor.COORDINATOR)
    )
    assert resubmitted == LostRace(pending, JobStatus.PENDING, JobStatus.PENDING, 9, 0)
    job = store.get(pending)
    assert job is not None and job.spider_id == 9


def test_a_fenced_write_needs_the_current_lease_epoch(
    store: JobStore, migrated_engine: Engine
) -> None:
    job_id = new_job_in(store, JobStatus.PENDING)
    with migrated_engine.begin() as connection:
        connection.execute(
            update(compression_jobs).where(compression_jobs.c.id == job_id).values(lease_epoch=3)
        )
    submit = ("submitted", JobStatus.PENDING, JobStatus.RUNNING, Actor.COORDINATOR)
    stale = store.transition(request(job_id, *submit, fence=2))
    assert stale == LostRace(job_id, JobStatus.PENDING, JobStatus.PENDING, None, 3)
    current = store.transition(request(job_id, *submit, fence=3))
    assert isinstance(current, Applied)
    assert store.history(job_id)[-1].lease_epoch == 3


@pytest.mark.parametrize("fenced", [False, True], ids=["unfenced", "fenced"])
@pytest.mark.parametrize("edge", EDGES, ids=_edge_id)
def test_a_move_reads_its_row_at_most_once_and_records_the_epoch_it_was_made_under(
    store: JobStore, migrated_engine: Engine, edge: Edge, fenced: bool
) -> None:
    """One locking read ahead of the compare-and-set, for the start time (duration) and the
    epoch (an unfenced move's history row), and none for a fenced move recording no duration."""
    job_id = _new_job_for(store, edge)
    with migrated_engine.begin() as connection:
        connection.execute(
            update(compression_jobs).where(compression_jobs.c.id == job_id).values(lease_epoch=7)
        )
    actor = sorted(edge.actors)[0]
    with statements_sent(migrated_engine) as sent:
        result = store.transition(
            request(
                job_id, edge.trigger, edge.source, edge.dest, actor, fence=7 if fenced else None
            )
        )
    assert isinstance(result, Applied)
    reads = [
        one_line(s) for s in sent if one_line(s).startswith("select compression_jobs.")
    ]  # (a status_msg's first move also reads its column's character set, once per engine)
    assert len(reads) == (0 if fenced and Record.DURATION not in edge.records else 1)
    if reads and migrated_engine.dialect.name != "sqlite":
        assert reads[0].endswith("for update")
    assert store.history(job_id)[-1].lease_epoch == 7


def test_moves_applied_together_write_their_history_rows_in_one_statement(
    store: JobStore, migrated_engine: Engine
) -> None:
    """``transition_all`` (a tick's submissions; the finalisations likewise): each move keeps its
    own compare-and-set and row count, and the applied ones' history rows, each with its own
    values, are written in one INSERT (issue 14; before, one per move)."""
    job_ids = [new_job_in(store, JobStatus.PENDING) for _ in range(4)]
    taken = job_ids[2]  # another writer submits it first: its move loses its race
    store.transition(
        request(taken, "submitted", JobStatus.PENDING, JobStatus.RUNNING, Actor.COORDINATOR)
    )
    moves = [
        request(
            job_id,
            "submitted",
            JobStatus.PENDING,
            JobStatus.RUNNING,
            Actor.COORDINATOR,
            spider_id=100 + index,
            actor_id=f"c-{index}",
            fence=0,
        )
        for index, job_id in enumerate(job_ids)
    ]
    with statements_sent(migrated_engine) as sent:
        results = store.transition_all(moves)
    assert [type(result) for result in results] == [Applied, Applied, LostRace, Applied]
    inserts = [s for s in sent if one_line(s).startswith("insert into compression_job_transitions")]
    assert len(inserts) == 1
    for index, job_id in enumerate(job_ids):
        rows = [(row.trigger, row.spider_id, row.actor_id) for row in store.history(job_id)]
        if job_id == taken:
            assert rows == [("submitted", SPIDER_ID, "")]  # the other writer's only
        else:
            assert rows == [("submitted", 100 + index, f"c-{index}")]
            assert store.get(job_id).spider_id == 100 + index  # type: ignore[union-attr]


def test_a_locked_row_of_another_job_is_refused_before_any_sql(
    store: JobStore, migrated_engine: Engine
) -> None:
    job_id, other = (new_job_in(store, JobStatus.RUNNING) for _ in range(2))
    move = request(job_id, "committed", JobStatus.RUNNING, JobStatus.COMMITTED, Actor.COMMIT_TASK)
    refused = pytest.raises(InvalidTransitionRequest, match=f"given job {other}'s row")
    with migrated_engine.begin() as connection, statements_sent(migrated_engine) as sent, refused:
        store.apply(connection, move, LockedRow(other, None, 0))
    assert sent == []
    assert store.state(job_id) is JobStatus.RUNNING


def test_an_unknown_job_is_not_found(store: JobStore) -> None:
    for trigger, source, dest in (
        ("submitted", JobStatus.PENDING, JobStatus.RUNNING),
        ("failed", JobStatus.RUNNING, JobStatus.FAILED),
    ):
        result = store.transition(request(999, trigger, source, dest, Actor.COORDINATOR))
        assert result == NotFound(999)
    assert store.get(999) is None
    assert store.history(999) == []


def test_the_row_snapshots_name_every_column_of_their_tables() -> None:
    """``JobStore.get`` and ``history`` build these from every column of the row."""
    assert [field.name for field in fields(JobRow)] == compression_jobs.c.keys()
    assert [field.name for field in fields(TransitionRow)] == job_transitions.c.keys()


def test_effects_commit_with_the_move_or_not_at_all(store: JobStore) -> None:
    def publish(connection: Connection, applied: Applied) -> None:
        connection.execute(
            insert(datasets).values(name=f"ds{applied.job_id}", archive_storage_directory="d")
        )

    def publish_then_fail(connection: Connection, applied: Applied) -> None:
        publish(connection, applied)
        raise RuntimeError("the archive insert failed")

    commit = ("committed", JobStatus.RUNNING, JobStatus.COMMITTED, Actor.COMMIT_TASK)
    failing = new_job_in(store, JobStatus.RUNNING)
    history = len(store.history(failing))
    with pytest.raises(RuntimeError, match="archive insert failed"):
        store.transition(request(failing, *commit), effects=publish_then_fail)
    job = store.get(failing)
    assert job is not None and job.status == JobStatus.RUNNING
    assert len(store.history(failing)) == history

    succeeding = new_job_in(store, JobStatus.RUNNING)
    assert isinstance(store.transition(request(succeeding, *commit), effects=publish), Applied)
    lost = store.transition(request(succeeding, *commit), effects=publish)
    assert isinstance(lost, LostRace)
    with store.engine.connect() as connection:
        names = connection.execute(select(datasets.c.name)).scalars().all()
    assert names == [f"ds{succeeding}"]


@pytest.mark.parametrize(
    ("trigger", "source", "dest", "actor", "missing", "message"),
    [
        (
            "submitted",
            JobStatus.PENDING,
            JobStatus.RUNNING,
            Actor.COORDINATOR,
            {"spider_id": None},
            "needs the Spider job id",
        ),
        (
            "submitted",
            JobStatus.PENDING,
            JobStatus.RUNNING,
            Actor.COORDINATOR,
            {"num_tasks": 0},
            "task count",
        ),
        (
            "submitted",
            JobStatus.PENDING,
            JobStatus.RUNNING,
            Actor.COORDINATOR,
            {"spider_id": 2**64},
            "64 unsigned bits",
        ),
        (
            "committed",
            JobStatus.RUNNING,
            JobStatus.COMMITTED,
            Actor.COMMIT_TASK,
            {"compressed_size": None},
            "archive sizes",
        ),
        (
            "failed",
            JobStatus.RUNNING,
            JobStatus.FAILED,
            Actor.COORDINATOR,
            {"spider_id": None},
            "needs the Spider job id",
        ),
    ],
)
def test_incomplete_requests_are_refused_before_any_sql(
    store: JobStore,
    migrated_engine: Engine,
    trigger: str,
    source: JobStatus,
    dest: JobStatus,
    actor: Actor,
    missing: dict[str, object],
    message: str,
) -> None:
    job_id = new_job_in(store, source)
    with (
        statements_sent(migrated_engine) as statements,
        pytest.raises(InvalidTransitionRequest, match=message),
    ):
        store.transition(request(job_id, trigger, source, dest, actor, **missing))
    assert statements == []


def test_a_long_or_exotic_status_msg_is_fitted_not_rejected(store: JobStore) -> None:
    """On MariaDB's strict sql_mode an over-long value would fail the whole UPDATE (H7)."""
    job_id = new_job_in(store, JobStatus.RUNNING)
    reason = "clp-s exited with 1: " + "disk full 💾 " * 100
    result = store.transition(
        request(
            job_id, "failed", JobStatus.RUNNING, JobStatus.FAILED, Actor.COORDINATOR, reason=reason
        )
    )
    assert isinstance(result, Applied)
    job = store.get(job_id)
    assert job is not None
    assert job.status == JobStatus.FAILED
    assert len(job.status_msg) == 512
    assert job.status_msg.startswith("clp-s exited with 1: disk full 💾")
    assert job.status_msg.endswith("…")
    assert store.history(job_id)[-1].reason == reason


def test_moves_out_of_each_status_match_the_definition(store: JobStore) -> None:
    """From every status, exactly the edges the lifecycle lists apply."""
    for status in JobStatus:
        for edge in edges_from(status):
            job_id = _new_job_for(store, edge)
            actor = sorted(edge.actors)[0]
            result = store.transition(request(job_id, edge.trigger, status, edge.dest, actor))
            assert isinstance(result, Applied), (edge, result)
