"""``coordinator demo``: one whole compression job on the embedded default, from nothing.

Generates sample JSON logs into the local object store, registers them and inserts a job as CLP's
log-ingestor would, runs the coordinator until the job is terminal while printing each transition
and the compress tasks as they finish, then shows the archives, the compression ratio and an event
read back from an archive by a search.
"""

from __future__ import annotations

import json
import tempfile
import threading
import time
from pathlib import Path

from yscope_clp_core import KqlQuery, search_archive

from coordinator.cli.jobs import show_job
from coordinator.cli.samples import write_json_logs
from coordinator.config.loader import CoordinatorConfig
from coordinator.lifecycle import describe_status
from coordinator.runtime import Runtime, open_runtime
from coordinator.service.ingest import DEFAULT_BUCKET, put_files, submit_job
from coordinator.store.database import reading
from coordinator.store.jobs import job_state
from coordinator.store.stored_archives import tasks_with_stored_archives

SERVICES = ("api", "auth", "billing", "search")
EVENTS_PER_FILE = 25_000


def run_demo(config: CoordinatorConfig) -> int:
    """Run the demo; 0 when the job succeeded."""
    prefix = f"demo/{time.strftime('%Y%m%dT%H%M%S')}/"
    print(f"Data directory: {config.data_dir}")
    with tempfile.TemporaryDirectory() as scratch:
        files = []
        for service in SERVICES:
            path = Path(scratch) / f"{service}.jsonl"
            write_json_logs(path, EVENTS_PER_FILE, service=service)
            files.append(path)
        keys = put_files(config, files, bucket=DEFAULT_BUCKET, prefix=prefix)
    total = sum(
        (config.object_store_directory / DEFAULT_BUCKET / key).stat().st_size for key in keys
    )
    print(f"Generated {len(keys)} log files ({total / 1e6:.1f} MB) in {DEFAULT_BUCKET}/{prefix}")

    with open_runtime(config) as runtime:
        job_id = submit_job(config, runtime.engine, prefix=prefix, timestamp_key="timestamp")
        print(f"Inserted compression job {job_id} (as CLP's log-ingestor does); running it...")
        worker = threading.Thread(target=runtime.coordinator.run, kwargs={"until_idle": True})
        worker.start()
        _follow(runtime, job_id, worker)
        worker.join()
        document = show_job(runtime.store, job_id)
    return _report(document)


def _follow(runtime: Runtime, job_id: int, worker: threading.Thread) -> None:
    shown, tasks_done = 0, -1
    while True:
        history = runtime.store.history(job_id)
        for entry in history[shown:]:
            print(
                f"  {describe_status(entry.from_status)} -> {describe_status(entry.to_status)}"
                f"  [{entry.trigger} by {entry.actor}] {entry.reason}"
            )
        shown = len(history)
        job = runtime.store.get(job_id)
        assert job is not None
        if job.spider_id is not None and job.num_tasks:
            with reading(runtime.engine) as connection:
                done = tasks_with_stored_archives(connection, job.id)
            if done != tasks_done:
                tasks_done = done
                print(f"  compress tasks done: {done}/{job.num_tasks}")
        if job_state(job).is_terminal and not worker.is_alive():
            return
        time.sleep(0.1)


def _report(document: dict[str, object]) -> int:
    print(f"\nJob {document['id']}: {document['status']}  {document['status_msg']}")
    archives = document["archives"]
    assert isinstance(archives, list)
    for archive in archives:
        print(
            f"  archive {archive['id']}: {archive['size']:,} B "
            f"(from {archive['uncompressed_size']:,} B)  {archive['location']}"
        )
    compressed, uncompressed = document["compressed_size"], document["uncompressed_size"]
    assert isinstance(compressed, int) and isinstance(uncompressed, int)
    if compressed:
        print(
            f"Compression ratio: {uncompressed / compressed:.1f}x "
            f"({uncompressed:,} B -> {compressed:,} B)"
        )
    for archive in archives:
        location = archive["location"]
        if location and Path(location).is_file():
            with search_archive(Path(location), KqlQuery('level: "ERROR"')) as results:
                for event in results:
                    print(f"Search 'level: \"ERROR\"' -> {json.dumps(event.get_kv_pairs())}")
                    break
            break
    return 0 if document["status"] == "Succeeded" else 1
