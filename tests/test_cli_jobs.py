"""``coordinator jobs`` and ``show``'s data and text (``coordinator/cli/jobs.py``): the filters on
real rows of both databases (jobs moved by guarded transitions), the parsers of ``--status``,
``--since`` and ``--limit``, and the printed table and job."""

from __future__ import annotations

import json
from dataclasses import asdict
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from sqlalchemy import update

from coordinator.cli import jobs as job_commands
from coordinator.cli.jobs import (
    InvalidFilter,
    cancel_note,
    format_job,
    format_jobs,
    list_jobs,
    parse_limit,
    parse_since,
    parse_statuses,
    show_job,
)
from coordinator.config.clp import ArchiveOutput
from coordinator.errors import CoordinatorError
from coordinator.job_config import (
    ClpIoConfig,
    S3ObjectMetadataInputConfig,
    encode_clp_io_config,
)
from coordinator.lifecycle import Actor, CommittedStorage, JobStatus, Trigger
from coordinator.service.clp_published import ArchivesUnknown, ClpPublished
from coordinator.service.ingest import output_config_of
from coordinator.store.guarded import Applied, TransitionRequest
from coordinator.store.jobs import JobStore
from coordinator.store.schema import compression_jobs as _jobs
from coordinator.task_io import DefaultAuthentication

_UNDECODABLE = b"not a zstd frame"

# --- real rows ----------------------------------------------------------------------------------


def _config(dataset: str | None) -> bytes:
    """A log-ingestor job config naming ``dataset`` (``None``: none, so ``default``)."""
    return encode_clp_io_config(
        ClpIoConfig(
            input=S3ObjectMetadataInputConfig(
                bucket="logs",
                key_prefix="ingest/",
                aws_authentication=DefaultAuthentication(),
                ingestion_job_id=1,
                s3_object_metadata_ids=[1],
                dataset=dataset,
                timestamp_key="timestamp",
                unstructured=False,
            ),
            output=output_config_of(ArchiveOutput()),  # CLP's defaults,
        )
    )


_PATHS: dict[JobStatus, tuple[tuple[Trigger, JobStatus, Actor], ...]] = {
    JobStatus.PENDING: (),
    JobStatus.RUNNING: ((Trigger.SUBMITTED, JobStatus.RUNNING, Actor.COORDINATOR),),
    JobStatus.COMMITTED: (
        (Trigger.SUBMITTED, JobStatus.RUNNING, Actor.COORDINATOR),
        (Trigger.COMMITTED, JobStatus.COMMITTED, Actor.COMMIT_TASK),
    ),
    JobStatus.SUCCEEDED: (
        (Trigger.SUBMITTED, JobStatus.RUNNING, Actor.COORDINATOR),
        (Trigger.COMMITTED, JobStatus.COMMITTED, Actor.COMMIT_TASK),
        (Trigger.FINALISED, JobStatus.SUCCEEDED, Actor.COORDINATOR),
    ),
    JobStatus.FAILED: ((Trigger.REJECTED, JobStatus.FAILED, Actor.COORDINATOR),),
    JobStatus.KILLED: (
        (Trigger.SUBMITTED, JobStatus.RUNNING, Actor.COORDINATOR),
        (Trigger.KILLED, JobStatus.KILLED, Actor.COORDINATOR),
    ),
}


def _job(
    store: JobStore,
    state: JobStatus = JobStatus.PENDING,
    dataset: str | None = "default",
    *,
    config: bytes | None = None,
    created: datetime | None = None,
) -> int:
    """A job inserted as log-ingestor does and moved to ``state`` by guarded transitions (the
    store's Committed storage decides how Committed is written)."""
    job_id = store.create_job(_config(dataset) if config is None else config)
    source = JobStatus.PENDING
    for trigger, target, actor in _PATHS[state]:
        result = store.transition(
            TransitionRequest(
                job_id=job_id,
                trigger=trigger,
                source=source,
                target=target,
                actor=actor,
                reason=f"{trigger} in a test",
                actor_id="test",
                spider_id=None if trigger is Trigger.REJECTED else 1000 + job_id,
                num_tasks=2,
                uncompressed_size=4096,
                compressed_size=512,
            )
        )
        assert isinstance(result, Applied), result
        source = target
    if created is not None:
        with store.engine.begin() as connection:
            connection.execute(
                update(_jobs).where(_jobs.c.id == job_id).values(creation_time=created)
            )
    return job_id


def _ids(rows: list[dict[str, Any]]) -> list[int]:
    return [row["id"] for row in rows]


def _stored(store: JobStore, job_id: int) -> tuple[int, bool]:
    job = store.get(job_id)
    assert job is not None
    return job.status, job.committed_at is not None


# --- list_jobs ----------------------------------------------------------------------------------


def test_every_status_filters_on_its_stored_forms(store: JobStore) -> None:
    distinct = JobStore(store.engine, committed_storage=CommittedStorage.DISTINCT)
    ids = {state: _job(store, state) for state in _PATHS}
    committed_distinct = _job(distinct, JobStatus.COMMITTED)
    # Committed stored both ways; Succeeded keeps its commit marker.
    assert _stored(store, ids[JobStatus.COMMITTED]) == (int(JobStatus.RUNNING), True)
    assert _stored(store, committed_distinct) == (int(JobStatus.COMMITTED), True)
    assert _stored(store, ids[JobStatus.SUCCEEDED]) == (int(JobStatus.SUCCEEDED), True)

    every = list_jobs(store.engine)
    assert _ids(every) == sorted([*ids.values(), committed_distinct], reverse=True)
    for state, job_id in ids.items():
        expected = [job_id] if state is not JobStatus.COMMITTED else [committed_distinct, job_id]
        rows = list_jobs(store.engine, statuses=[state.label])
        assert _ids(rows) == expected, state
        assert {row["status"] for row in rows} == {state.label}
    assert _ids(list_jobs(store.engine, statuses=["running", "FAILED"])) == [
        ids[JobStatus.FAILED],
        ids[JobStatus.RUNNING],
    ]
    assert _ids(list_jobs(store.engine, statuses=["Running,Committed"])) == [
        committed_distinct,
        ids[JobStatus.COMMITTED],
        ids[JobStatus.RUNNING],
    ]


def test_every_row_names_its_dataset(store: JobStore) -> None:
    named = _job(store, dataset="web")
    unnamed = _job(store, dataset=None)
    broken = _job(store, config=_UNDECODABLE)
    rows = list_jobs(store.engine)
    assert [(row["id"], row["dataset"]) for row in rows] == [
        (broken, None),
        (unnamed, "default"),
        (named, "web"),
    ]
    assert set(rows[0]) == {
        "id",
        "status",
        "spider_id",
        "dataset",
        "num_tasks",
        "creation_time",
        "status_msg",
        "cancel",
    }
    # --json prints every row as it is.
    assert json.loads(json.dumps(rows)) == rows


def test_the_dataset_filter_reads_each_config(store: JobStore) -> None:
    web = _job(store, dataset="web")
    unnamed = _job(store, dataset=None)
    _job(store, config=_UNDECODABLE)
    other = _job(store, dataset="Web")  # another dataset: names are compared exactly
    assert _ids(list_jobs(store.engine, dataset="web")) == [web]
    assert _ids(list_jobs(store.engine, dataset="default")) == [unnamed]
    assert _ids(list_jobs(store.engine, dataset="Web")) == [other]
    assert list_jobs(store.engine, dataset="nothing_here") == []


def test_the_limit_counts_only_jobs_of_the_dataset(
    store: JobStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(job_commands, "_BATCH", 2)  # the older matches lie several reads back
    old = [_job(store, dataset="old") for _ in range(3)]
    for _ in range(5):
        _job(store, dataset="new")
    assert _ids(list_jobs(store.engine, dataset="old", limit=2)) == [old[2], old[1]]
    assert _ids(list_jobs(store.engine, dataset="old", limit=None)) == old[::-1]
    assert _ids(list_jobs(store.engine, dataset="old")) == old[::-1]
    assert len(list_jobs(store.engine, limit=None)) == 8
    assert len(list_jobs(store.engine, limit=3)) == 3
    assert len(list_jobs(store.engine, limit=7)) == 7


def test_the_limit_is_100_by_default_and_none_lists_all(store: JobStore) -> None:
    with store.engine.begin() as connection:
        connection.execute(_jobs.insert(), [{"clp_config": _config("bulk")}] * 101)
    rows = list_jobs(store.engine)
    assert len(rows) == 100 and rows[0]["id"] > rows[-1]["id"]
    assert len(list_jobs(store.engine, limit=None)) == 101
    assert len(list_jobs(store.engine, dataset="bulk", limit=None)) == 101


def test_since_keeps_jobs_created_at_or_after_it(store: JobStore) -> None:
    base = datetime(2024, 5, 1, 12, 0)
    older = _job(store, created=base - timedelta(milliseconds=1))
    exact = _job(store, created=base)
    newer = _job(store, created=base + timedelta(days=1))
    assert _ids(list_jobs(store.engine, since=base)) == [newer, exact]
    assert _ids(list_jobs(store.engine, since=base + timedelta(hours=1))) == [newer]
    assert _ids(list_jobs(store.engine, since=base - timedelta(days=1))) == [newer, exact, older]
    # An aware instant is converted: 14:00 at +02:00 is 12:00 UTC.
    plus_two = datetime(2024, 5, 1, 14, 0, tzinfo=timezone(timedelta(hours=2)))
    assert _ids(list_jobs(store.engine, since=plus_two)) == [newer, exact]
    assert _ids(list_jobs(store.engine, since=parse_since("2024-05-01T12:00Z"))) == [newer, exact]


def test_filters_combine(store: JobStore) -> None:
    base = datetime(2024, 5, 1)
    _job(store, JobStatus.FAILED, "web", created=base - timedelta(days=2))  # too old
    recent_failed = _job(store, JobStatus.FAILED, "web", created=base + timedelta(hours=1))
    api_failed = _job(store, JobStatus.FAILED, "api", created=base + timedelta(hours=2))
    recent_killed = _job(store, JobStatus.KILLED, "web", created=base + timedelta(hours=3))
    _job(store, JobStatus.SUCCEEDED, "web", created=base + timedelta(hours=4))  # other status
    latest_failed = _job(store, JobStatus.FAILED, "web", created=base + timedelta(hours=5))

    def listed(**filters: Any) -> list[int]:
        return _ids(
            list_jobs(store.engine, statuses=["failed", "killed"], dataset="web", **filters)
        )

    assert listed(since=base) == [latest_failed, recent_killed, recent_failed]
    assert listed(since=base, limit=2) == [latest_failed, recent_killed]
    assert listed(since=base, limit=1) == [latest_failed]
    assert listed(since=base + timedelta(hours=4)) == [latest_failed]
    since_two = base + timedelta(hours=2)
    assert _ids(list_jobs(store.engine, statuses=["Failed"], since=since_two)) == [
        latest_failed,
        api_failed,
    ]
    assert _ids(list_jobs(store.engine, dataset="web", since=since_two, limit=2)) == [
        latest_failed,
        _ids(list_jobs(store.engine, statuses=["succeeded"]))[0],
    ]


def test_bad_filters_are_refused(store: JobStore) -> None:
    _job(store)
    with pytest.raises(InvalidFilter, match="unknown status 'Done'"):
        list_jobs(store.engine, statuses=["Done"])
    with pytest.raises(InvalidFilter, match="invalid dataset name 'web logs'"):
        list_jobs(store.engine, dataset="web logs")
    with pytest.raises(InvalidFilter, match="invalid limit 0"):
        list_jobs(store.engine, limit=0)


# --- the parsers --------------------------------------------------------------------------------


def test_statuses_parse_in_any_case_repeated_or_comma_separated() -> None:
    assert parse_statuses([]) == ()
    assert parse_statuses(["running"]) == ("Running",)
    assert parse_statuses(["RUNNING, committed", "Failed", "running", "killed,"]) == (
        "Running",
        "Committed",
        "Failed",
        "Killed",
    )


@pytest.mark.parametrize(
    "values", [["Done"], ["running,Sucess"], ["pending", "Done"], [""], [" , "]]
)
def test_an_unknown_status_is_refused_with_the_valid_names(values: list[str]) -> None:
    with pytest.raises(InvalidFilter) as raised:
        parse_statuses(values)
    message = str(raised.value)
    for name in ("Pending", "Running", "Committed", "Succeeded", "Failed", "Killed"):
        assert name in message
    assert isinstance(raised.value, CoordinatorError) and isinstance(raised.value, ValueError)


_NOW = datetime(2024, 5, 10, 8, 0)


@pytest.mark.parametrize(
    ("text", "instant"),
    [
        ("2024-05-01", datetime(2024, 5, 1)),
        ("2024-05-01T12:30", datetime(2024, 5, 1, 12, 30)),
        ("2024-05-01 12:30:15.250", datetime(2024, 5, 1, 12, 30, 15, 250000)),
        ("2024-05-01T12:30Z", datetime(2024, 5, 1, 12, 30)),
        ("2024-05-01T12:30+02:00", datetime(2024, 5, 1, 10, 30)),
        ("2024-05-01T00:30-01:00", datetime(2024, 5, 1, 1, 30)),
        ("30m", _NOW - timedelta(minutes=30)),
        ("2h", _NOW - timedelta(hours=2)),
        ("7d", _NOW - timedelta(days=7)),
        ("7D", _NOW - timedelta(days=7)),
        ("90s", _NOW - timedelta(seconds=90)),
        ("1w", _NOW - timedelta(weeks=1)),
        (" 0m ", _NOW),
    ],
)
def test_since_reads_iso_times_as_utc_and_ages(text: str, instant: datetime) -> None:
    parsed = parse_since(text, now=_NOW)
    assert parsed == instant and parsed.tzinfo is None


def test_since_ages_count_back_from_the_clock() -> None:
    before = datetime.now(UTC).replace(tzinfo=None)
    parsed = parse_since("1h")
    after = datetime.now(UTC).replace(tzinfo=None)
    hour = timedelta(hours=1)
    assert before - hour - timedelta(milliseconds=1) <= parsed <= after - hour


@pytest.mark.parametrize(
    "text", ["", "yesterday", "30 minutes", "-5m", "5y", "2024-13-01", "1.5h", "m"]
)
def test_an_unreadable_since_is_refused(text: str) -> None:
    with pytest.raises(InvalidFilter, match="cannot read --since .*ISO 8601.*30m, 2h, 7d"):
        parse_since(text, now=_NOW)


def test_an_age_before_year_one_is_refused() -> None:
    with pytest.raises(InvalidFilter, match="before year 1"):
        parse_since("999999999d", now=_NOW)


def test_limit_is_a_positive_number_or_all() -> None:
    assert parse_limit("25") == 25
    assert parse_limit("all") is None
    assert parse_limit("ALL") is None
    for bad in ("0", "-1", "+3", "ten", "", "2.5"):
        with pytest.raises(InvalidFilter, match="positive number of jobs, or 'all'"):
            parse_limit(bad)


# --- the printed table and job ------------------------------------------------------------------


def test_the_table_has_a_dataset_column_and_never_none(store: JobStore) -> None:
    pending = _job(store, dataset="web")
    broken = _job(store, config=_UNDECODABLE)
    running = _job(store, JobStatus.RUNNING, dataset=None)
    lines = format_jobs(list_jobs(store.engine))
    assert lines[0].split() == [
        "id",
        "status",
        "spider_id",
        "tasks",
        "created",
        "dataset",
        "message",
    ]
    assert len(lines) == 4
    created = [row["creation_time"] for row in list_jobs(store.engine)]
    assert [line.split() for line in lines[1:]] == [
        [str(running), "Running", str(1000 + running), "2", created[0], "default"],
        [str(broken), "Pending", "0", created[1], "unknown"],
        [str(pending), "Pending", "0", created[2], "web"],
    ]
    assert lines[3].startswith(f"{pending:>6}  Pending")
    # The columns line up: each value starts where its header does.
    assert {line.index("Running" if line is lines[1] else "Pending") for line in lines[1:]} == {
        lines[0].index("status")
    }
    assert {line.rindex(" ") + 1 for line in lines[1:]} == {lines[0].index("dataset")}
    assert not any("None" in line for line in lines)


def test_the_table_says_when_there_is_no_job(store: JobStore) -> None:
    assert format_jobs(list_jobs(store.engine)) == ["no jobs"]
    _job(store)
    assert format_jobs(list_jobs(store.engine, statuses=["Killed"]), filtered=True) == [
        "no jobs match"
    ]


def test_a_long_or_multiline_message_is_one_short_cell() -> None:
    row = {
        "id": 1,
        "status": "Failed",
        "spider_id": None,
        "dataset": "default",
        "num_tasks": 0,
        "creation_time": "2024-05-01T12:00:00.000Z",
        "status_msg": "first line\nsecond " + "x" * 100,
    }
    last = format_jobs([row])[1]
    assert "\n" not in last and last.endswith("…")
    assert last.split("  ")[-1].startswith("first line second x")


def test_a_fresh_pending_job_shows_no_empty_heading_and_no_none(store: JobStore) -> None:
    job_id = _job(store, dataset="web")
    lines = format_job(show_job(store, job_id))
    assert lines[0] == f"Job {job_id}: Pending"
    assert lines[1] == "  dataset web"
    assert lines[2].startswith("  created 20") and "started" not in lines[2]
    assert len(lines) == 3
    text = "\n".join(lines)
    for absent in ("None", "History:", "Archives:", "Spider job", " B", "task(s)", "took"):
        assert absent not in text


def test_a_job_with_history_shows_it(store: JobStore) -> None:
    rejected = _job(store, JobStatus.FAILED, config=_UNDECODABLE)
    lines = format_job(show_job(store, rejected))
    assert lines[:2] == [f"Job {rejected}: Failed", "  rejected in a test"]
    assert "  dataset unknown (the job config does not decode)" in lines
    assert lines[-2] == "History:"
    assert lines[-1].endswith(
        "  Pending -> Failed  rejected by coordinator test: rejected in a test"
    )
    assert not any(line == "Archives:" or "None" in line for line in lines)

    succeeded = _job(store, JobStatus.SUCCEEDED, dataset="web")
    lines = format_job(show_job(store, succeeded))
    assert lines[0] == f"Job {succeeded}: Succeeded  (Spider job {1000 + succeeded})"
    assert lines[1] == "  dataset web, 2 task(s), 4,096 B -> 512 B"
    assert "committed 20" in lines[2] and "took " in lines[2]
    assert lines[-4] == "History:"
    assert [line.split("  ")[2] for line in lines[-3:]] == [
        "Pending -> Running",
        "Running -> Committed",
        "Committed -> Succeeded",
    ]
    assert lines[-3].endswith("submitted by coordinator test: submitted in a test")
    assert not any(line == "Archives:" or "None" in line for line in lines)


def test_a_job_document_prints_its_archives_and_what_is_known() -> None:
    document = {
        "id": 7,
        "status": "Committed",
        "status_code": 1,
        "committed_at": "2024-05-01T12:00:05.000Z",
        "spider_id": 12,
        "status_msg": "",
        "dataset": "default",
        "num_tasks": 1,
        "creation_time": "2024-05-01T12:00:00.000Z",
        "start_time": "2024-05-01T12:00:01.000Z",
        "duration": None,
        "uncompressed_size": 10_000,
        "compressed_size": 900,
        "cancel_requested": True,
        "cancel": cancel_note("Committed", requested=True),
        "history": [],
        "archives": [
            {
                "id": "a1",
                "size": 900,
                "uncompressed_size": 10_000,
                "begin_timestamp": 1,
                "end_timestamp": 2,
                "location": None,
            }
        ],
    }
    assert format_job(document) == [
        "Job 7: Committed  (Spider job 12)",
        "  dataset default, 1 task(s), 10,000 B -> 900 B",
        "  created 2024-05-01T12:00:00.000Z, started 2024-05-01T12:00:01.000Z, "
        "committed 2024-05-01T12:00:05.000Z",
        "  cancel requested: the coordinator driving it acts on it",
        "Archives:",
        "  a1  900 B (from 10,000 B)",
    ]
    unknown = {**document, "archives": [], "archives_unknown": "Spider cannot list job 12"}
    assert format_job(unknown)[-1] == "Archives: unknown (Spider cannot list job 12)"


@pytest.mark.parametrize(
    ("status", "note"),
    [
        (
            "Succeeded",
            "the cancel came after the commit had published it: Succeeded",
        ),
        ("Failed", "the cancel came after the job had failed"),
        ("Killed", "cancelled by an operator"),
        ("Running", "cancel requested: the coordinator driving it acts on it"),
    ],
)
def test_what_became_of_a_cancel_is_said_plainly(status: str, note: str) -> None:
    """CLP's commit writes SUCCEEDED itself: a cancel that came after it leaves the job
    Succeeded, which ``show`` and ``jobs`` say rather than a bare 'cancel requested'."""
    assert cancel_note(status, requested=True) == note
    assert cancel_note(status, requested=False) is None
    row = {
        "id": 3,
        "status": status,
        "spider_id": 4,
        "num_tasks": 1,
        "creation_time": "2024-05-01T12:00:00.000Z",
        "dataset": "default",
        "status_msg": "",
        "cancel": cancel_note(status, requested=True),
    }
    assert format_jobs([row])[1].endswith(note)


def test_a_succeeded_job_without_records_lists_what_spider_names(store: JobStore) -> None:
    """CLP's own commit publishes without a record of this coordinator: ``show`` asks Spider for
    the job's outputs (``spider_archives``), and says in one line why when it cannot."""
    job_id = _job(store, JobStatus.SUCCEEDED, dataset="web")
    asked: list[tuple[int, str]] = []
    archive = ClpPublished("a1", 900, 10_000, 1, 2, "/archives/web/a1")

    def listing(spider_id: int, dataset: str) -> list[ClpPublished]:
        asked.append((spider_id, dataset))
        return [archive]

    document = show_job(store, job_id, spider_archives=listing)
    assert asked == [(1000 + job_id, "web")]
    assert document["archives"] == [asdict(archive)] and document["archives_unknown"] is None

    def unreachable(spider_id: int, dataset: str) -> list[ClpPublished]:
        raise ArchivesUnknown(f"Spider cannot list job {spider_id}'s outputs: down")

    document = show_job(store, job_id, spider_archives=unreachable)
    assert document["archives"] == []
    assert document["archives_unknown"] == f"Spider cannot list job {1000 + job_id}'s outputs: down"
    assert format_job(document)[-1].startswith("Archives: unknown (Spider cannot list job")
    # A job that did not succeed published nothing: Spider is not asked.
    failed = _job(store, JobStatus.FAILED, dataset="web")
    assert show_job(store, failed, spider_archives=unreachable)["archives_unknown"] is None
