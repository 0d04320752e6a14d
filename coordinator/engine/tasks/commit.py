"""The commit task (``clp`` / ``compression::commit``): publish the job's archives, durably.

Spider runs it once every compress task has succeeded (job ``CommitReady``), possibly more than
once and possibly concurrently (``docs/spider.md``). It takes no inputs; it reads the graph
outputs (one ``CompressionTaskOutput`` per compress task) from its context, checks them as CLP's
commit does (one dataset; at least one archive; a valid dataset name), and calls
``coordinator.store.archives.publish_archives``, which moves the job Running → Committed in the same
transaction as the archive rows. A job already committed makes it a no-op; a job that is no longer
running (killed by CLP's legacy scheduler, say) makes it fail with a message saying so. A database
outage is waited out (``coordinator.engine.tasks.database.wait_out_outages``), not a failure.

Unlike CLP's commit task, which writes SUCCEEDED directly, this one stops at COMMITTED: the
coordinator finalises the job when Spider confirms success, and rolls the publication back if
Spider ends the job Failed or Cancelled after all.
"""

from __future__ import annotations

import posixpath
from collections.abc import Sequence

from coordinator.archive_storage import ArchiveOutputSettings, FsArchiveOutput
from coordinator.engine.tasks.context import TaskContext, TaskError
from coordinator.engine.tasks.database import task_engine, wait_out_outages
from coordinator.serde import WireFormatError
from coordinator.store.archives import CommitRefused, publish_archives
from coordinator.store.jobs import JobStore
from coordinator.store.names import InvalidDatasetName, resolve_dataset_name
from coordinator.task_io import CompressionTaskOutput


def commit(ctx: TaskContext, inputs: Sequence[bytes]) -> list[bytes]:
    """Publish the archives the compress tasks reported; no outputs.

    Raises ``TaskError`` with CLP's messages: undecodable outputs, more than one dataset, no
    archives, an invalid dataset, or a job the commit must not touch.
    """
    if inputs:
        raise TaskError(f"the commit task takes no inputs, got {len(inputs)}")
    outputs = []
    for position, payload in enumerate(ctx.graph_outputs):
        try:
            outputs.append(CompressionTaskOutput.from_msgpack(payload))
        except WireFormatError as error:
            message = f"graph output {position} is not a CompressionTaskOutput: {error}"
            raise TaskError(message) from error
    if len({output.dataset for output in outputs}) > 1:
        raise TaskError("compression task outputs belong to more than one dataset")
    archives = [archive for output in outputs for archive in output.archives]
    if not archives:
        raise TaskError("commit received no archives to publish")
    try:
        dataset = resolve_dataset_name(outputs[0].dataset)
    except InvalidDatasetName as error:
        raise TaskError(str(error)) from error
    store = JobStore(task_engine(ctx.settings), committed_storage=ctx.settings.committed_storage)
    directory = archive_storage_directory(ctx.settings.archive_output, dataset)
    try:
        wait_out_outages(  # a repeat after an ambiguous failure finds the job Committed: a no-op
            lambda: publish_archives(
                store,
                spider_job_id=ctx.job_id,
                dataset=dataset,
                archive_storage_directory=directory,
                archives=archives,
                actor_id=f"spider job {ctx.job_id} commit instance {ctx.instance_id}",
            ),
            doing=f"commit task {ctx.job_id}#{ctx.instance_id} publishing {len(archives)} archives",
        )
    except CommitRefused as error:
        raise TaskError(str(error)) from error
    return []


def archive_storage_directory(output: ArchiveOutputSettings, dataset: str) -> str:
    """``clp_datasets.archive_storage_directory``: where the dataset's archives live.

    CLP writes the archive output's ``key_prefix`` (S3) or directory (fs) joined with the dataset.
    """
    if isinstance(output, FsArchiveOutput):
        return str(output.directory / dataset)
    return posixpath.join(output.key_prefix, dataset)
