"""The archive outbox: a record before every archive file, clean-up by records, reconciliation.

Real clp-s, real files and moto's S3; the database is SQLite and MariaDB. A killed task instance is
a real process killed with SIGKILL at the named moment.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import uuid
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine, event, insert, inspect, text

from coordinator.archive_storage import FsArchiveOutput, S3ArchiveOutput
from coordinator.archive_storage.storage import remove_archive, store_archive
from coordinator.cli.main import main
from coordinator.config.loader import CoordinatorConfig
from coordinator.engine.tasks.commit import commit
from coordinator.engine.tasks.compress import clp_s_s3_compress
from coordinator.engine.tasks.context import TaskContext, TaskError, WorkerSettings
from coordinator.lifecycle import Actor, JobStatus
from coordinator.service.cleanup import (
    ReconciliationLog,
    log_reconciliation,
    reconcile_archive_storage,
    settle_archives,
    terminal_jobs_with_stored_archives,
)
from coordinator.store import migrate
from coordinator.store.clock import utc_now
from coordinator.store.datasets import archives_table, ensure_dataset_tables
from coordinator.store.jobs import JobStore
from coordinator.store.stored_archives import (
    STORING,
    StoredArchiveRecord,
    record_stored_archive,
    stored_archives_of_job,
    tasks_with_stored_archives,
)
from coordinator.task_io import CompressionTaskOutput
from tests.paths import SPIDER_ID, new_job_in, request, stored_record
from tests.s3_server import s3_client, s3_endpoint
from tests.sample_logs import write_json_logs
from tests.test_compress_task import INPUT_CREDENTIALS, new_bucket, settings_for, task_inputs

__all__ = ["s3_endpoint"]  # the fixture, imported so that pytest finds it here

DATASET = "web_logs"

KILLED_INSTANCE = """
import os, signal
from coordinator.engine.tasks import compress
from coordinator.engine.tasks.context import TaskContext, WorkerSettings

moment = os.environ["KILL_MOMENT"]
real_store = compress.store_archive


def store_then_die(*arguments):
    if moment == "after":
        real_store(*arguments)
    os.kill(os.getpid(), signal.SIGKILL)


compress.store_archive = store_then_die
inputs = [bytes.fromhex(part) for part in os.environ["TASK_INPUTS"].split(",")]
context = TaskContext(
    job_id={spider_id}, task_id="0", instance_id=1, settings=WorkerSettings.from_environment()
)
compress.clp_s_s3_compress(context, inputs)
"""


def _inputs(tmp_path: Path, lines: int = 50) -> list[bytes]:
    write_json_logs(tmp_path / "objects" / "logs" / "a.jsonl", lines)
    return task_inputs(["a.jsonl"], dataset=DATASET, store=tmp_path / "objects")


def _run_killed_instance(settings: WorkerSettings, inputs: list[bytes], moment: str) -> None:
    environment = {
        **os.environ,
        **settings.to_environment(),
        "KILL_MOMENT": moment,
        "TASK_INPUTS": ",".join(part.hex() for part in inputs),
    }
    script = textwrap.dedent(KILLED_INSTANCE.format(spider_id=SPIDER_ID))
    finished = subprocess.run(
        [sys.executable, "-c", script], env=environment, capture_output=True, check=False
    )
    assert finished.returncode == -signal.SIGKILL, finished.stderr.decode()


def _records(engine: Engine, job_id: int) -> list[StoredArchiveRecord]:
    with engine.connect() as connection:
        return stored_archives_of_job(connection, job_id)


def _archive_files(tmp_path: Path) -> list[Path]:
    root = tmp_path / "archives"
    return sorted(path for path in root.rglob("*") if path.is_file()) if root.exists() else []


def _fail(store: JobStore, job_id: int) -> None:
    store.transition(
        request(job_id, "failed", JobStatus.RUNNING, JobStatus.FAILED, Actor.COORDINATOR)
    )
    assert store.state(job_id) is JobStatus.FAILED


@pytest.mark.slow
@pytest.mark.parametrize("moment", ["before", "after"])
def test_an_instance_killed_while_storing_leaves_a_record_and_clean_up_removes_its_file(
    store: JobStore, migrated_engine: Engine, tmp_path: Path, moment: str
) -> None:
    """Killed right before or right after the archive is stored: a ``storing`` record names it.

    Before the outbox, the record was written after the file, so a kill there left a file that no
    clean-up could ever find.
    """
    job_id = new_job_in(store, JobStatus.RUNNING)
    settings = settings_for(tmp_path, migrated_engine.url.render_as_string(hide_password=False))

    _run_killed_instance(settings, _inputs(tmp_path), moment)

    [record] = _records(migrated_engine, job_id)
    assert record.state == "storing"
    expected = tmp_path / "archives" / DATASET / record.archive_id
    assert record.location == str(expected)
    assert _archive_files(tmp_path) == ([expected] if moment == "after" else [])

    _fail(store, job_id)
    settled = settle_archives(migrated_engine, job_id, settings.archive_output)

    assert settled.removed == 1
    assert _archive_files(tmp_path) == []
    assert _records(migrated_engine, job_id) == []


def test_clean_up_during_the_upload_makes_the_instance_remove_its_archive(
    store: JobStore, migrated_engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job ended while an instance was storing: clean-up claims the record, so the instance
    cannot mark it stored; it fails and removes the file itself, and nothing is left."""
    job_id = new_job_in(store, JobStatus.RUNNING)
    settings = settings_for(tmp_path, migrated_engine.url.render_as_string(hide_password=False))
    settled: list[int] = []

    def settle_then_store(*arguments: object) -> str:
        _fail(store, job_id)
        settled.append(settle_archives(migrated_engine, job_id, settings.archive_output).removed)
        return store_archive(*arguments)  # type: ignore[arg-type]

    monkeypatch.setattr("coordinator.engine.tasks.compress.store_archive", settle_then_store)
    context = TaskContext(job_id=SPIDER_ID, task_id="0", instance_id=1, settings=settings)

    with pytest.raises(TaskError, match="claimed by the coordinator's clean-up"):
        clp_s_s3_compress(context, _inputs(tmp_path))

    assert settled == [1]  # the storing record's (not yet existing) file
    assert _archive_files(tmp_path) == []
    assert _records(migrated_engine, job_id) == []


def _several_archives(tmp_path: Path) -> list[bytes]:
    write_json_logs(tmp_path / "objects" / "logs" / "big.jsonl", 1500)
    return task_inputs(
        ["big.jsonl"], dataset=DATASET, store=tmp_path / "objects", target_encoded_size=64 * 1024
    )


def test_every_archive_is_recorded_storing_before_the_first_is_stored_in_two_commits(
    store: JobStore, migrated_engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Several archives: one transaction records them all ``storing`` (attributed to the job)
    before any file exists, one marks them all ``stored`` after the last file; two commits in
    all, whatever the number of archives."""
    job_id = new_job_in(store, JobStatus.RUNNING)
    settings = settings_for(tmp_path, migrated_engine.url.render_as_string(hide_password=False))
    seen: list[list[tuple[str, str]]] = []
    commits: list[int] = []

    def look_then_store(*arguments: object) -> str:
        seen.append([(r.archive_id, r.state) for r in _records(migrated_engine, job_id)])
        return store_archive(*arguments)  # type: ignore[arg-type]

    def count(_: object) -> None:
        commits.append(1)

    monkeypatch.setattr("coordinator.engine.tasks.compress.store_archive", look_then_store)
    context = TaskContext(job_id=SPIDER_ID, task_id="0", instance_id=1, settings=settings)
    event.listen(Engine, "commit", count)
    try:
        [payload] = clp_s_s3_compress(context, _several_archives(tmp_path))
    finally:
        event.remove(Engine, "commit", count)

    archives = CompressionTaskOutput.from_msgpack(payload).archives
    assert len(archives) >= 2
    ids = sorted(a.id for a in archives)
    assert len(seen) == len(archives)
    assert sorted(seen[0]) == [(archive_id, "storing") for archive_id in ids]
    assert sorted((r.archive_id, r.state) for r in _records(migrated_engine, job_id)) == [
        (archive_id, "stored") for archive_id in ids
    ]
    assert len(commits) == 2


def test_clean_up_while_the_second_archive_is_stored_makes_the_instance_remove_them_all(
    store: JobStore, migrated_engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job ended between two archives: clean-up claims every record (the first archive's
    file exists, the second's not yet); the instance fails, removes both, and nothing is left."""
    job_id = new_job_in(store, JobStatus.RUNNING)
    settings = settings_for(tmp_path, migrated_engine.url.render_as_string(hide_password=False))
    settled: list[int] = []

    def settle_then_store(*arguments: object) -> str:
        if len(settled) == 0 and _archive_files(tmp_path):
            _fail(store, job_id)
            settled.append(
                settle_archives(migrated_engine, job_id, settings.archive_output).removed
            )
        return store_archive(*arguments)  # type: ignore[arg-type]

    monkeypatch.setattr("coordinator.engine.tasks.compress.store_archive", settle_then_store)
    context = TaskContext(job_id=SPIDER_ID, task_id="0", instance_id=1, settings=settings)

    with pytest.raises(TaskError, match="claimed by the coordinator's clean-up"):
        clp_s_s3_compress(context, _several_archives(tmp_path))

    assert len(settled) == 1 and settled[0] >= 2
    assert _archive_files(tmp_path) == []
    assert _records(migrated_engine, job_id) == []


def test_a_succeeded_job_keeps_what_it_published_and_loses_a_duplicate_stored_before_the_commit(
    store: JobStore, migrated_engine: Engine, tmp_path: Path
) -> None:
    """Two instances of one task stored archives before the commit; the commit published one.

    Before the outbox, the sweep looked only at records stored after the commit, so the
    duplicate's file stayed for good unless the coordinator that finished the job settled it.
    """
    job_id = new_job_in(store, JobStatus.RUNNING)
    settings = settings_for(tmp_path, migrated_engine.url.render_as_string(hide_password=False))
    inputs = _inputs(tmp_path)
    outputs = []
    for instance in (1, 2):
        context = TaskContext(SPIDER_ID, "0", instance, settings)
        [payload] = clp_s_s3_compress(context, inputs)
        outputs.append(CompressionTaskOutput.from_msgpack(payload))
    commit(
        TaskContext(
            job_id=SPIDER_ID,
            task_id="commit",
            instance_id=1,
            settings=settings,
            graph_outputs=(outputs[0].to_msgpack(),),
        ),
        [],
    )
    store.transition(
        request(job_id, "finalised", JobStatus.COMMITTED, JobStatus.SUCCEEDED, Actor.COORDINATOR)
    )
    assert store.state(job_id) is JobStatus.SUCCEEDED
    later = utc_now() + timedelta(seconds=1)

    assert terminal_jobs_with_stored_archives(migrated_engine, later) == [job_id]
    assert settle_archives(migrated_engine, job_id, settings.archive_output).removed == 1

    [published] = outputs[0].archives
    assert _archive_files(tmp_path) == [tmp_path / "archives" / DATASET / published.id]
    assert [(r.archive_id, r.state) for r in _records(migrated_engine, job_id)] == [
        (published.id, "published")
    ]
    assert terminal_jobs_with_stored_archives(migrated_engine, later) == []
    assert settle_archives(migrated_engine, job_id, settings.archive_output).removed == 0
    assert _archive_files(tmp_path) == [tmp_path / "archives" / DATASET / published.id]


def test_removing_an_fs_location_removes_an_interrupted_copy_too(tmp_path: Path) -> None:
    output = FsArchiveOutput(directory=tmp_path / "archives")
    directory = tmp_path / "archives" / DATASET
    directory.mkdir(parents=True)
    (directory / ".archive-9.tmp").write_bytes(b"half an arch")

    remove_archive(output, str(directory / "archive-9"))

    assert list(directory.iterdir()) == []


# --- reconciliation ----------------------------------------------------------------------------


def test_reconciliation_reports_only_files_without_a_record_and_removes_nothing(
    store: JobStore,
    migrated_engine: Engine,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    new_job_in(store, JobStatus.RUNNING)
    settings = settings_for(tmp_path, migrated_engine.url.render_as_string(hide_password=False))
    context = TaskContext(job_id=SPIDER_ID, task_id="0", instance_id=1, settings=settings)
    [payload] = clp_s_s3_compress(context, _inputs(tmp_path))
    [ours] = CompressionTaskOutput.from_msgpack(payload).archives
    directory = tmp_path / "archives" / DATASET
    (directory / f".{ours.id}.tmp").write_bytes(b"an interrupted copy of a recorded archive")
    (directory / "clp-own-archive").write_bytes(b"published by CLP, never recorded here")
    ensure_dataset_tables(migrated_engine, DATASET)
    with migrated_engine.begin() as connection:
        connection.execute(
            insert(archives_table(DATASET)).values(
                id="clp-own-archive",
                begin_timestamp=1,
                end_timestamp=2,
                uncompressed_size=10,
                size=1,
                creator_id="legacy",
                creation_ix=0,
            )
        )
    unknown = tmp_path / "archives" / "other" / "unknown-archive"
    unknown.parent.mkdir()
    unknown.write_bytes(b"nobody recorded this")

    found = reconcile_archive_storage(migrated_engine, settings.archive_output)

    assert found.unrecorded == [str(unknown)]
    assert (found.listed, found.recorded, found.published) == (4, 2, 1)
    assert unknown.exists()
    with caplog.at_level(logging.INFO, logger="coordinator.service.cleanup"):
        log_reconciliation(migrated_engine, settings.archive_output)
    [line] = [r for r in caplog.records if r.name == "coordinator.service.cleanup"]
    assert line.levelno == logging.WARNING
    assert line.getMessage() == (
        f"archive storage {tmp_path / 'archives'}: 4 entries, 2 recorded, 1 published without a "
        f"record, 1 without a record: {unknown} (never removed automatically; see coordinator "
        "archives)"
    )


def test_reconciliation_lists_the_s3_prefix(
    store: JobStore, migrated_engine: Engine, tmp_path: Path, s3_endpoint: str
) -> None:
    client = s3_client(s3_endpoint)
    bucket = new_bucket(client)
    output = S3ArchiveOutput(
        bucket=bucket,
        key_prefix="clp/archives",
        endpoint_url=s3_endpoint,
        aws_authentication=INPUT_CREDENTIALS,
    )
    job_id = new_job_in(store, JobStatus.RUNNING)
    settings = settings_for(
        tmp_path, migrated_engine.url.render_as_string(hide_password=False), output
    )
    context = TaskContext(job_id=SPIDER_ID, task_id="0", instance_id=1, settings=settings)
    clp_s_s3_compress(context, _inputs(tmp_path))
    stray = f"clp/archives/{DATASET}/{uuid.uuid4()}"
    client.put_object(Bucket=bucket, Key=stray, Body=b"no record")
    client.put_object(Bucket=bucket, Key="elsewhere/x/y", Body=b"outside the prefix")

    found = reconcile_archive_storage(migrated_engine, output)

    assert found.storage == f"s3://{bucket}/clp/archives"
    assert (found.listed, found.recorded) == (2, 1)
    assert found.unrecorded == [f"s3://{bucket}/{stray}"]
    assert [r.state for r in _records(migrated_engine, job_id)] == ["stored"]


def test_a_storage_the_reconciliation_cannot_list_is_reported_once_in_one_line(
    migrated_engine: Engine, s3_endpoint: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An archive bucket the coordinator cannot list (here: one that does not exist; in the field,
    one it has no credentials for) was logged as an ERROR with a traceback at every hourly run."""
    output = S3ArchiveOutput(
        bucket=f"missing-{uuid.uuid4().hex[:8]}",
        key_prefix="clp/archives",
        endpoint_url=s3_endpoint,
        aws_authentication=INPUT_CREDENTIALS,
    )
    reconciliation = ReconciliationLog()
    with caplog.at_level(logging.DEBUG, logger="coordinator.service.cleanup"):
        assert reconciliation.run(migrated_engine, output) is None
        assert reconciliation.run(migrated_engine, output) is None
    first, second = [r for r in caplog.records if r.name == "coordinator.service.cleanup"]
    assert (first.levelno, second.levelno) == (logging.WARNING, logging.DEBUG)
    message = first.getMessage()
    assert message.startswith(
        f"cannot reconcile the archive storage with the archive records: cannot list the "
        f"archives of s3://{output.bucket}/clp/archives/: "
    )
    assert message.endswith(
        "give the coordinator list access to it for orphan reports (nothing else needs it)"
    )
    assert "\n" not in message and first.exc_info is None and second.getMessage() == message


# --- migration 0007 ----------------------------------------------------------------------------


def _insert_record(engine: Engine, job_id: int, archive_id: str, stored_at: str) -> None:
    """A record as revisions before 0007 wrote it (no state)."""
    with engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO compression_stored_archives (spider_job_id, task_id, instance_id,"
                " dataset, archive_id, location, size, stored_at, job_id) VALUES (:spider, '0', 1,"
                " 'web', :archive, :location, 1, :stored_at, :job)"
            ),
            {
                "spider": SPIDER_ID,
                "archive": archive_id,
                "location": f"/archives/web/{archive_id}",
                "stored_at": stored_at,
                "job": job_id,
            },
        )


def _states(engine: Engine) -> dict[str, str]:
    with engine.connect() as connection:
        rows = connection.execute(
            text("SELECT archive_id, state FROM compression_stored_archives")
        ).all()
    return {str(row[0]): str(row[1]) for row in rows}


def test_migration_0007_keeps_what_the_earlier_version_settled_and_downgrades(
    engine: Engine,
) -> None:
    migrate.upgrade(engine, "0006")
    store = JobStore(engine)
    succeeded, failed = new_job_in(store, JobStatus.SUCCEEDED), new_job_in(store, JobStatus.FAILED)
    with engine.begin() as connection:
        connection.execute(
            text("UPDATE compression_jobs SET committed_at = :at WHERE id = :id"),
            {"at": "2026-12-01 10:00:00.000", "id": succeeded},
        )
    _insert_record(engine, succeeded, "published-before-commit", "2026-12-01 09:59:59.000")
    _insert_record(engine, succeeded, "late-after-commit", "2026-12-01 10:00:01.000")
    _insert_record(engine, failed, "of-a-failed-job", "2026-12-01 09:00:00.000")

    migrate.upgrade(engine)

    expected = {
        "published-before-commit": "published",
        "late-after-commit": "stored",
        "of-a-failed-job": "stored",
    }
    assert _states(engine) == expected
    migrate.downgrade(engine, "0006")
    with engine.connect() as connection:
        columns = inspect(connection).get_columns("compression_stored_archives")
    assert "state" not in {column["name"] for column in columns}
    migrate.downgrade(engine, "0006")  # nothing left to do
    migrate.upgrade(engine)
    assert _states(engine) == expected


def test_coordinator_archives_prints_the_entries_without_a_record(
    config: CoordinatorConfig, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = ["--data-dir", str(tmp_path / "var")]
    assert main(["db", "upgrade", *data]) == 0  # `archives` only reads: it creates no database
    capsys.readouterr()
    assert main(["archives", *data]) == 0
    assert capsys.readouterr().out.startswith(
        f"archive storage {config.archive_directory}: 0 entries, 0 recorded"
    )
    stray = Path(config.archive_directory) / "default" / "stray"
    stray.parent.mkdir(parents=True)
    stray.write_bytes(b"no record")

    assert main(["archives", "--json", *data]) == 1

    document = json.loads(capsys.readouterr().out)
    assert (document["listed"], document["unrecorded"]) == (1, [str(stray)])
    assert stray.exists()


def test_the_tasks_with_stored_archives_are_counted_per_job(store: JobStore) -> None:
    """The demo's progress: tasks of the job that recorded an archive, each counted once."""
    job_id, other = new_job_in(store, JobStatus.RUNNING), new_job_in(store, JobStatus.RUNNING)
    recorded = [(job_id, "0", 1, "a"), (job_id, "0", 2, "b"), (job_id, "1", 1, "c")]
    recorded += [(other, "2", 1, "d")]
    with store.engine.begin() as connection:
        assert tasks_with_stored_archives(connection, job_id) == 0
        for owner, task_id, instance_id, archive_id in recorded:
            record = stored_record(
                DATASET, archive_id, owner, task_id=task_id, instance_id=instance_id
            )
            record_stored_archive(connection, replace(record, state=STORING))
        assert tasks_with_stored_archives(connection, job_id) == 2
        assert tasks_with_stored_archives(connection, other) == 1
