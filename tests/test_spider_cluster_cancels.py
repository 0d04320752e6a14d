"""An operator's cancel on a whole real Spider cluster running CLP's own task package.

CLP's ``compression::commit`` (``clp-tdl-package`` ``src/task/compression/commit.rs``, ``commit``)
selects the job's row ``FOR UPDATE`` by ``spider_id`` and bails unless it is RUNNING; its graphs
have no cleanup task, so the coordinator never sends CancelJob to a started job (in CommitReady it
would shut Spider's storage down). Before, a cancel of a Running job was left to Spider's outcome,
and CLP's commit then published and wrote SUCCEEDED itself: the cancel was lost. Now the row is
fenced (Running → Killed) and the commit refuses. The execution manager is stopped while the job
is Running, so that the cancel lands before any task runs, whatever the machine's speed.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from bench.cluster import JobSpec
from coordinator.lifecycle.reactions import CANCELLED_BY_FENCE
from coordinator.lifecycle.status import JobStatus
from coordinator.service.outcomes import MISSING_CLEANUP_HINT
from coordinator.spider.grpc.client import GrpcSpider
from coordinator.spider.port import JobState
from tests.spider_cluster import ClusterRun

pytestmark = pytest.mark.slow

TWO_OBJECTS = JobSpec(("in/cancel/a.jsonl", "in/cancel/b.jsonl"))


@pytest.fixture
def spider(spider_cluster: ClusterRun) -> Iterator[GrpcSpider]:
    """A gRPC client of the cluster's storage service, to read the Spider job's own state."""
    with GrpcSpider("127.0.0.1", spider_cluster.cluster.storage_port) as client:
        yield client


def _running_job(run: ClusterRun) -> tuple[int, int]:
    """A job the coordinator has submitted while no execution manager runs: Running in the row
    and in Spider, no task started. Its id and Spider id."""
    run.cluster.em_stop()
    (job_id,) = run.insert_jobs([TWO_OBJECTS])
    run.wait_until(
        lambda: run.job_rows([job_id])[job_id].status == JobStatus.RUNNING,
        "the job's submission",
        ids=[job_id],
    )
    spider_id = run.job_rows([job_id])[job_id].spider_id
    assert spider_id is not None
    return job_id, spider_id


def _triggers(run: ClusterRun, job_id: int) -> list[str]:
    rows = run.query(
        "SELECT `trigger` FROM compression_job_transitions WHERE job_id = :job ORDER BY id",
        {"job": job_id},
    )
    return [row.trigger for row in rows]


def _published(run: ClusterRun, spider_id: int) -> list[str]:
    if not run.query("SHOW TABLES LIKE 'clp_default_archives'"):
        return []
    rows = run.query(
        "SELECT id FROM clp_default_archives WHERE id LIKE :prefix",
        {"prefix": f"stub-{spider_id}-%"},
    )
    return [row.id for row in rows]


def _spider_ends(run: ClusterRun, spider: GrpcSpider, spider_id: int) -> JobState:
    run.wait_until(
        lambda: spider.get_job_state(spider_id).is_terminal, "the Spider job's end", timeout=60
    )
    return spider.get_job_state(spider_id)


def test_a_cancel_of_a_running_job_ends_it_killed_with_nothing_published(
    spider_cluster: ClusterRun, spider: GrpcSpider
) -> None:
    run = spider_cluster
    run.coordinator()
    job_id, spider_id = _running_job(run)

    cancelled = run.cli("cancel", str(job_id))
    assert cancelled.returncode == 0, cancelled.stderr
    run.wait_until(
        lambda: run.job_rows([job_id])[job_id].status == JobStatus.KILLED,
        "the fence",
        ids=[job_id],
    )
    assert _triggers(run, job_id) == ["submitted", "fenced"]
    assert spider.get_job_state(spider_id) is JobState.RUNNING  # no CancelJob to a started job

    # Spider runs the job's tasks; CLP's commit finds the row Killed and refuses.
    run.cluster.em_start()
    assert _spider_ends(run, spider, spider_id) is JobState.FAILED
    assert "is no longer running; refusing to commit" in spider.get_job_error(spider_id)
    row = run.job_rows([job_id])[job_id]
    assert (row.status, row.status_msg) == (JobStatus.KILLED, CANCELLED_BY_FENCE)
    assert _triggers(run, job_id) == ["submitted", "fenced"]
    assert _published(run, spider_id) == []
    shown = json.loads(run.cli("show", str(job_id), "--json").stdout)
    assert (shown["status"], shown["cancel"], shown["archives"]) == (
        "Killed",
        "cancelled by an operator",
        [],
    )


def test_a_cancel_the_commit_beat_leaves_the_job_succeeded_and_says_so(
    spider_cluster: ClusterRun, spider: GrpcSpider
) -> None:
    """The request is recorded while no coordinator runs; CLP's commit then publishes and writes
    SUCCEEDED before any coordinator could fence the row: the commit won the race."""
    run = spider_cluster
    coordinator = run.coordinator()
    job_id, spider_id = _running_job(run)
    run.stop_coordinators()
    assert coordinator.poll() is not None

    assert run.cli("cancel", str(job_id)).returncode == 0
    run.cluster.em_start()
    assert _spider_ends(run, spider, spider_id) is JobState.SUCCEEDED
    run.coordinator("run", "--until-idle").wait(timeout=60)

    row = run.job_rows([job_id])[job_id]
    assert row.status == JobStatus.SUCCEEDED
    assert sorted(_published(run, spider_id)) == [
        f"stub-{spider_id}-in_cancel_a.jsonl",
        f"stub-{spider_id}-in_cancel_b.jsonl",
    ]
    shown = json.loads(run.cli("show", str(job_id), "--json").stdout)
    assert shown["cancel"] == "the cancel came after the commit had published it: Succeeded"
    # The archives CLP's commit published, as Spider's outputs name them.
    assert sorted(archive["id"] for archive in shown["archives"]) == sorted(
        _published(run, spider_id)
    )
    assert all(archive["location"].endswith(archive["id"]) for archive in shown["archives"])
    listed = run.cli("jobs").stdout.splitlines()
    assert any(
        line.endswith("the cancel came after the commit had published it: Succeeded")
        for line in listed
    ), listed


def test_cleanup_task_with_clps_package_is_warned_of_and_named_in_the_failure(
    spider_cluster: ClusterRun, spider: GrpcSpider
) -> None:
    """``coordinator.cleanup_task: true`` is for workers running this coordinator's package:
    CLP's has no ``compression::cleanup``, so Spider fails every cancelled job (TaskNotFound)."""
    run = spider_cluster
    config = run.write_config("cleanup.yaml", cleanup_task=True)
    log = run.cluster.directory / "logs" / "cleanup-coordinator.log"
    run.coordinator(config=config, log=log)
    job_id, spider_id = _running_job(run)
    assert "coordinator.cleanup_task is true" in log.read_text()

    assert run.cli("cancel", str(job_id)).returncode == 0
    run.wait_until(
        lambda: spider.get_job_state(spider_id) is JobState.CLEANUP_READY,
        "CancelJob",
        ids=[job_id],
    )
    run.cluster.em_start()
    rows = run.wait_terminal([job_id])
    assert rows[job_id].status == JobStatus.FAILED
    assert "TaskNotFound" in rows[job_id].status_msg
    assert rows[job_id].status_msg.endswith(MISSING_CLEANUP_HINT)
