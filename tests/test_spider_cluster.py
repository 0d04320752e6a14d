"""This coordinator against a whole real Spider cluster running CLP's own task package.

The cluster (``tests/spider_cluster.py``, ``../shared/spider-cluster``) is Spider's storage
service, scheduler and execution manager, whose task executors run CLP's real
``compression::commit`` (``clp-tdl-package`` ``src/task/compression/commit.rs``: it selects the
job's row ``FOR UPDATE`` by ``spider_id``, refuses unless it is RUNNING, inserts the archives with
``creator_id`` '' and writes SUCCEEDED with the summed sizes itself) and a stand-in compress that
returns one archive per object at once (``stub-<spider job id>-<key with / as _>``, size 1000,
uncompressed 10000). Each test runs ``coordinator run`` as a process, as a deployment does, and
judges only what lands in CLP's database, where CLP's readers see it.

Tests that leave the cluster alone share one per module (``shared_spider_cluster``); those that
stop, kill or reconfigure its processes get one of their own (``spider_cluster``).
"""

from __future__ import annotations

import json
import signal
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import pytest

from bench.cluster import PREFIX, JobSpec, job_blob, varied_jobs
from coordinator.lifecycle.status import JobStatus
from coordinator.spider.grpc.client import GrpcSpider
from coordinator.store.datasets import ensure_dataset_tables
from tests.spider_cluster import ClusterRun, JobRow

pytestmark = pytest.mark.slow

ARCHIVE_SIZE = 1000
UNCOMPRESSED_SIZE = 10000
"""The stand-in compress task's sizes per object (``../shared/spider-cluster/README.md``)."""
SPIDER_FAILED = "The Spider compression job failed: in-task failure: "
"""How a job failed in Spider reads: the coordinator's prefix (``coordinator.lifecycle.reactions``'s
``SPIDER_FAILED``), then Spider's execution manager's rendering of a task's error
(``spider-execution-manager`` ``runtime.rs``, ``Report::from_outcome``)."""
BATCH = 40
"""Jobs of a batch some process is disturbed under: enough that the disturbance lands mid-batch."""


def archive_id(spider_id: int, key: str) -> str:
    """The stand-in compress task's archive id for ``key`` of Spider job ``spider_id``."""
    return f"stub-{spider_id}-{key.replace('/', '_')}"


def assert_published_once(
    run: ClusterRun, specs: Sequence[JobSpec], rows: dict[int, JobRow], ids: Sequence[int]
) -> None:
    """Each SUCCEEDED job has CLP's commit's sizes and each of its archives exactly once; a job
    that is not has none and a message. No other archive carries these jobs' Spider ids (a
    module's shared cluster holds other tests' archives too)."""
    published = Counter(row.id for row in run.archives())
    duplicated = {archive: n for archive, n in published.items() if n > 1}
    assert not duplicated, f"archives published more than once: {duplicated}"
    for spec, job_id in zip(specs, ids, strict=True):
        row = rows[job_id]
        assert row.spider_id is not None, f"{row}: no spider_id"
        expected = {archive_id(row.spider_id, key) for key in spec.keys}
        present = expected & published.keys()
        if row.status == JobStatus.SUCCEEDED:
            assert present == expected, f"{row}: archives {sorted(present)} of {sorted(expected)}"
            assert row.compressed_size == ARCHIVE_SIZE * len(spec.keys), str(row)
            assert row.uncompressed_size == UNCOMPRESSED_SIZE * len(spec.keys), str(row)
        else:
            assert not present, f"{row}: archives {sorted(present)} published"
            assert row.status_msg, f"{row}: no message"
    expected_all = {
        archive_id(rows[job_id].spider_id or 0, key)
        for spec, job_id in zip(specs, ids, strict=True)
        for key in spec.keys
    }
    prefixes = tuple(f"stub-{row.spider_id}-" for row in rows.values())
    stray = {archive for archive in published if archive.startswith(prefixes)} - expected_all
    assert not stray, f"archives of these Spider jobs that no object of theirs names: {stray}"


def assert_all_succeeded(rows: dict[int, JobRow]) -> None:
    failed = [str(row) for row in rows.values() if row.status != JobStatus.SUCCEEDED]
    assert not failed, "jobs that did not succeed:\n" + "\n".join(failed)


def assert_jobs_fail_in_spider(run: ClusterRun, *fragments: str) -> None:
    """Two jobs run by a coordinator end Failed with Spider's error, naming each of
    ``fragments``, and nothing is published."""
    ids = run.insert_jobs(varied_jobs(2))
    run.coordinator("run")
    for row in run.wait_terminal(ids).values():
        assert row.status == JobStatus.FAILED, str(row)
        assert row.status_msg.startswith(SPIDER_FAILED), str(row)
        assert all(fragment in row.status_msg for fragment in fragments), str(row)
    assert run.archives() == []


def submissions(run: ClusterRun, ids: Sequence[int]) -> Counter[int]:
    """How many 'submitted' transitions each job has (``compression_job_transitions``)."""
    rows = run.query(
        "SELECT job_id FROM compression_job_transitions WHERE `trigger` = 'submitted'"
        f" AND job_id IN ({', '.join(str(i) for i in ids)})"
    )
    return Counter(row.job_id for row in rows)


def state_requests(run: ClusterRun, spider_id: int | None = None) -> int:
    """How often the running storage service logged a job state request (for ``spider_id``, or
    any job): Spider's storage ``grpc.rs`` logs "Job state request received." with the job id at
    INFO (``cluster.sh``'s default ``SPIDER_STORAGE_LOG``), and its ``grpc_server.rs`` "Starting
    storage gRPC server." at each start, after which alone this counts (``restart`` appends to
    the same log)."""
    log = run.cluster.directory / "logs" / "storage.log"
    lines = log.read_text(errors="replace").splitlines()
    starts = [i for i, line in enumerate(lines) if "Starting storage gRPC server." in line]
    marker = "" if spider_id is None else f'"job_id":{spider_id}}}'
    return sum(
        1
        for line in lines[starts[-1] if starts else 0 :]
        if "Job state request received." in line and marker in line
    )


def in_flight(run: ClusterRun, ids: Sequence[int], succeeded: int = 4) -> None:
    """Wait until ``succeeded`` jobs are SUCCEEDED and at least one is RUNNING: a disturbance
    then lands mid-batch, with a job in Spider."""

    def landed() -> bool:
        statuses = Counter(run.statuses(ids))
        return statuses[JobStatus.SUCCEEDED] >= succeeded and statuses[JobStatus.RUNNING] >= 1

    run.wait_until(landed, f"{succeeded} jobs SUCCEEDED and one RUNNING", ids=ids)


# --- the whole path ----------------------------------------------------------------------------


def test_varied_jobs_succeed_with_clps_commit(shared_spider_cluster: ClusterRun) -> None:
    """A batch of 1-3-object jobs ends SUCCEEDED through CLP's own commit: its sizes, the Spider
    job recorded, each archive once, the dataset registered, and ``coordinator show`` agrees."""
    run = shared_spider_cluster
    specs = varied_jobs(9, first=1000)
    ids = run.insert_jobs(specs)
    coordinator = run.coordinator("run", "--until-idle")
    rows = run.wait_terminal(ids)
    assert_all_succeeded(rows)
    assert_published_once(run, specs, rows, ids)
    assert len({row.spider_id for row in rows.values()}) == len(ids)
    datasets = [row.name for row in run.query("SELECT name FROM clp_datasets")]
    assert "default" in datasets
    assert coordinator.wait(60) == 0, run.context(ids)
    shown = run.cli("show", str(ids[0]), "--json")
    assert shown.returncode == 0, shown.stderr
    document = json.loads(shown.stdout)
    assert (document["status"], document["status_code"]) == ("Succeeded", 2)
    assert document["spider_id"] == rows[ids[0]].spider_id


def test_missing_objects_fail_without_submission(shared_spider_cluster: ClusterRun) -> None:
    """A job naming object metadata ids that do not exist ends Failed with the coordinator's
    precise message and never reaches Spider (no ``spider_id``, no 'submitted' transition)."""
    run = shared_spider_cluster
    ingestion_job_id, missing = 987654, [424242, 424243]
    blob = job_blob(JobSpec((f"{PREFIX}missing.jsonl",)), ingestion_job_id, missing)
    with run.engine.begin() as connection:
        key = connection.exec_driver_sql(
            "INSERT INTO compression_jobs (clp_config) VALUES (%s)", (blob,)
        ).lastrowid
    job_id = int(key)
    coordinator = run.coordinator("run", "--until-idle")
    row = run.wait_terminal([job_id])[job_id]
    assert row.status == JobStatus.FAILED, str(row)
    assert row.status_msg == (
        "Compression job failed: "
        f"missing S3 object metadata {missing[0]} for ingestion job {ingestion_job_id}"
    ), str(row)
    assert row.spider_id is None, str(row)
    assert submissions(run, [job_id])[job_id] == 0
    assert coordinator.wait(60) == 0, run.context([job_id])


def test_replicas_each_job_claimed_once(shared_spider_cluster: ClusterRun) -> None:
    """Two coordinators with their own instance ids over one cluster and database drain a batch:
    every job SUCCEEDED exactly once, submitted by exactly one of them."""
    run = shared_spider_cluster
    specs = varied_jobs(BATCH, first=2000)
    configs = [run.write_config(f"replica-{name}.yaml", instance_id=name) for name in "ab"]
    for config in configs:
        run.coordinator("run", config=config)
    log = run.cluster.directory / "logs" / "coordinator.log"
    run.wait_until(
        lambda: all(f"coordinator {name} started." in log.read_text() for name in "ab"),
        "both replicas started",  # else a slow start under load leaves the batch to one
    )
    ids = run.insert_jobs(specs)
    rows = run.wait_terminal(ids)
    assert_all_succeeded(rows)
    assert_published_once(run, specs, rows, ids)
    assert submissions(run, ids) == Counter({job_id: 1 for job_id in ids})
    actors = Counter(
        row.actor_id
        for row in run.query(
            "SELECT actor_id FROM compression_job_transitions WHERE `trigger` = 'submitted'"
            f" AND job_id IN ({', '.join(str(i) for i in ids)})"
        )
    )
    assert set(actors) == {"a", "b"}, f"not both replicas submitted jobs: {actors}"


# --- failures ----------------------------------------------------------------------------------


def test_compress_failure_fails_the_job(spider_cluster: ClusterRun, tmp_path: Path) -> None:
    """With no task package in the execution manager's package directory every compress task
    fails in Spider; the job ends Failed with Spider's error and publishes nothing."""
    run = spider_cluster
    empty = tmp_path / "no-packages"
    empty.mkdir()
    worker = run.cluster.directory / "worker.yaml"
    run.cluster.em_stop()
    lines = worker.read_text().splitlines()
    worker.write_text(
        "\n".join(
            f'  package_dir: "{empty}"' if line.strip().startswith("package_dir:") else line
            for line in lines
        )
        + "\n"
    )
    run.cluster.em_start()
    # Spider's execution manager renders the executor's error lossily (msgpack headers as
    # U+FFFD); the variant and the loader's message are what a reader can use.
    assert_jobs_fail_in_spider(run, "InvalidLibrary", "libclp.so: cannot open shared object file")


def test_commit_refused_fails_the_job(spider_cluster: ClusterRun) -> None:
    """CLP's commit failing (a trigger refuses its archive insert) fails the job; its transaction
    rolls back, so nothing is published and the job is not SUCCEEDED."""
    run = spider_cluster
    ensure_dataset_tables(run.engine, "default")
    run.execute(
        "CREATE TRIGGER refuse_archives BEFORE INSERT ON clp_default_archives FOR EACH ROW"
        " SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'archives refused by the test'"
    )
    assert_jobs_fail_in_spider(
        run, "failed to insert archives into `clp_default_archives`", "archives refused by the test"
    )


# --- processes disturbed mid-batch ---------------------------------------------------------------


def test_coordinator_killed_mid_batch_resumes(spider_cluster: ClusterRun) -> None:
    """SIGKILL the coordinator when some but not all jobs are SUCCEEDED (one RUNNING); another
    with the same config finishes every job, none Failed, no archive published twice. A job the
    dead one had claimed but not yet recorded in Spider waits for its lease to lapse (30 s,
    ``coordinator.runtime.open_runtime``), so this test takes 5-35 s."""
    run = spider_cluster
    specs = varied_jobs(BATCH)
    ids = run.insert_jobs(specs)
    first = run.coordinator("run")
    in_flight(run, ids)
    first.send_signal(signal.SIGKILL)
    first.wait()
    done = run.count(ids, JobStatus.SUCCEEDED)
    assert done < len(ids), "the batch finished before the kill: nothing was disturbed"
    run.coordinator("run")
    rows = run.wait_terminal(ids)
    assert_all_succeeded(rows)
    assert_published_once(run, specs, rows, ids)


def test_execution_manager_restarted_under_load(spider_cluster: ClusterRun) -> None:
    """Stop the execution manager while jobs are in flight; while a job stays RUNNING in the
    database the coordinator keeps asking Spider about it (three more state requests in the
    storage service's log) and fails nothing; start the execution manager again: every job ends
    SUCCEEDED."""
    run = spider_cluster
    specs = varied_jobs(BATCH)
    ids = run.insert_jobs(specs)
    run.coordinator("run")
    in_flight(run, ids, succeeded=2)
    run.cluster.em_stop()
    run.wait_until(
        lambda: run.count(ids, JobStatus.RUNNING) >= 1, "a job RUNNING without an EM", ids=ids
    )
    stuck = next(row for row in run.job_rows(ids).values() if row.status == JobStatus.RUNNING)
    assert stuck.spider_id is not None, str(stuck)
    asked = state_requests(run, stuck.spider_id)
    run.wait_until(
        lambda: state_requests(run, stuck.spider_id or 0) >= asked + 3,
        f"three more state requests for Spider job {stuck.spider_id}",
        ids=ids,
    )
    rows = run.job_rows(ids)
    assert rows[stuck.id].status == JobStatus.RUNNING, str(rows[stuck.id])
    assert not [row for row in rows.values() if row.status == JobStatus.FAILED], run.context(ids)
    run.cluster.em_start()
    # A task the stopped execution manager had already taken may stay with it: Spider gives it to
    # the new one only once its storage declares the old one stale (cluster.sh's storage.yaml:
    # ``execution_manager_stale_cutoff_sec`` 60 s, checked every ``gc_interval_sec`` 30 s), and
    # in some runs not within minutes. Every other job ends SUCCEEDED; such a job stays RUNNING
    # while Spider has not ended it (its compress task held: RUNNING; its commit task held:
    # COMMIT_READY), and is never failed by the coordinator.
    with GrpcSpider("127.0.0.1", run.cluster.storage_port) as spider:

        def settled() -> bool:
            rows = run.job_rows(ids).values()
            return all(
                row.status == JobStatus.SUCCEEDED
                or (
                    row.status == JobStatus.RUNNING
                    and row.spider_id is not None
                    and not spider.get_job_state(row.spider_id).is_terminal
                )
                for row in rows
            )

        run.wait_until(settled, "every job SUCCEEDED or not yet ended by Spider", ids=ids)
    # The archives first, then the rows: a held job may still be committed meanwhile, and CLP's
    # commit publishes and writes SUCCEEDED in one transaction, so a job whose archives are
    # listed here is SUCCEEDED in the rows read after.
    published = {row.id for row in run.archives()}
    rows = run.job_rows(ids)
    # At most the in-flight jobs (max_concurrent_jobs: 4) can be held by the stopped manager.
    assert sum(row.status == JobStatus.SUCCEEDED for row in rows.values()) >= len(ids) - 4
    assert not [row for row in rows.values() if row.status == JobStatus.FAILED], run.context(ids)
    done = [
        (spec, job_id)
        for spec, job_id in zip(specs, ids, strict=True)
        if rows[job_id].status == JobStatus.SUCCEEDED
    ]
    assert_published_once(
        run,
        [spec for spec, _ in done],
        {job_id: rows[job_id] for _, job_id in done},
        [job_id for _, job_id in done],
    )
    for job_id in set(ids) - {job_id for _, job_id in done}:
        assert not {a for a in published if a.startswith(f"stub-{rows[job_id].spider_id}-")}


def test_scheduler_restarted_under_load(spider_cluster: ClusterRun) -> None:
    """Restart Spider's scheduler mid-batch (the execution manager reconnects to it): every job
    ends SUCCEEDED, each archive once."""
    run = spider_cluster
    specs = varied_jobs(BATCH)
    ids = run.insert_jobs(specs)
    run.coordinator("run")
    in_flight(run, ids)
    run.cluster.restart("scheduler")
    assert run.count(ids, JobStatus.SUCCEEDED) < len(ids)
    rows = run.wait_terminal(ids)
    assert_published_once(run, specs, rows, ids)
    assert_all_succeeded(rows)


def test_storage_restarted_under_load(spider_cluster: ClusterRun) -> None:
    """Restart Spider's storage service mid-batch. Spider's scheduler and execution manager exit
    when their storage connection breaks (``spider-scheduler`` ``runtime.rs``: "Scheduler core
    exited on error"; ``spider-execution-manager`` ``execution_manager.rs``: "Execution manager
    exited on error"), so they are restarted after it as a supervisor would; meanwhile the
    coordinator reconnects to the restarted storage service (it asks it about jobs) and fails
    nothing. Every job ends SUCCEEDED (Spider's storage keeps its jobs in its database), each
    archive once."""
    run = spider_cluster
    specs = varied_jobs(BATCH)
    ids = run.insert_jobs(specs)
    run.coordinator("run")
    in_flight(run, ids)
    run.cluster.restart("storage")
    assert run.count(ids, JobStatus.SUCCEEDED) < len(ids)
    run.wait_until(
        lambda: state_requests(run) >= 3, "3 state requests to the restarted storage", ids=ids
    )
    assert run.count(ids, JobStatus.FAILED) == 0, run.context(ids)
    run.cluster.restart("scheduler")
    run.cluster.restart("em")
    rows = run.wait_terminal(ids, timeout=60)
    assert_published_once(run, specs, rows, ids)
    assert_all_succeeded(rows)
