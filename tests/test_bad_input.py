"""Nothing a row holds can stop the service, ownership is exact, and a bad job ends precisely.

Each class of malformed job is inserted next to real ingested objects and run through the real
service (embedded default, real clp-s) on SQLite and MariaDB:

* the embedded default owns undecodable jobs and rejects them with ``Failed to deserialize CLP
  I/O config: …``; a coordinator with CLP's configuration leaves them Pending, never written;
* jobs of another input type, whatever their msgpack form, are never written (hazard H1,
  ``docs/hazards.md``);
* a job whose cause of failure is deterministic (ids or sizes no column or Rust type holds) ends
  at once with a precise message, never after retries;
* a Pending row that already records a Spider id is never submitted (nor registered again): it
  ends Failed naming that Spider job, which is cancelled if Spider knows it.

Before these fixes an array used as a msgpack map key stopped ``coordinator run`` at every start
(``TypeError: unhashable type: 'list'``) and crashed ``show``; an ``fs`` job stored as an array
was claimed and failed; ids above 2^63-1 on SQLite and u64-overflowing sizes were retried; a
Pending row with a Spider id was registered with Spider on every tick, without end.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import msgpack
import pytest
import zstandard
from sqlalchemy import Engine, update

from coordinator.cli import jobs as job_commands
from coordinator.cli.main import main
from coordinator.config.loader import ConfigError, CoordinatorConfig
from coordinator.config.locations import local_store_endpoint
from coordinator.job_config import MAX_DECOMPRESSED_BYTES
from coordinator.lifecycle import JobStatus
from coordinator.runtime import Runtime, open_runtime
from coordinator.service.coordinator import SUBMISSION_BATCH, Coordinator
from coordinator.service.ingest import list_objects
from coordinator.service.prepare import prepare
from coordinator.spider.port import JobState
from coordinator.store.ingestion import S3ScannerJob, ingest_and_submit
from coordinator.store.jobs import job_state
from coordinator.store.schema import compression_jobs as _jobs
from tests.service_support import (
    BUCKET,
    PREFIX,
    CountingRegistrations,
    engine_jobs,
    job_row,
    put_logs,
    raw_rows,
    run_until_idle,
    triggers,
    valid_named_config,
)

DESERIALIZE = "Failed to deserialize CLP I/O config: "
FAILED = "Compression job failed: "
U64_MAX = 2**64 - 1


def _zstd(raw: bytes) -> bytes:
    return zstandard.ZstdCompressor(level=3).compress(raw)


def _blob(value: Any) -> bytes:
    return _zstd(msgpack.packb(value, use_bin_type=True))


class Ctx(NamedTuple):
    """What a case's blob and message may depend on."""

    named: dict[str, Any]
    """The valid named config log-ingestor would write for the job's objects."""
    ingestion: int
    ids: list[int]


def _input_array(ctx: Ctx) -> list[Any]:
    """The valid input as ``rmp_serde::to_vec`` writes it: ``[tag, fields…]``."""
    fields = ctx.named["input"]
    auth = fields["aws_authentication"]
    return [
        "s3_object_metadata",
        fields["bucket"],
        fields["region_code"],
        fields["key_prefix"],
        fields["endpoint_url"],
        [auth["type"]],
        fields["ingestion_job_id"],
        fields["s3_object_metadata_ids"],
        fields["dataset"],
        fields["timestamp_key"],
        fields["unstructured"],
    ]


def _output_array(ctx: Ctx) -> list[Any]:
    return list(ctx.named["output"].values())


def _with_input(ctx: Ctx, **changes: Any) -> bytes:
    return _blob({**ctx.named, "input": {**ctx.named["input"], **changes}})


def _with_output(ctx: Ctx, **changes: Any) -> bytes:
    return _blob({**ctx.named, "output": {**ctx.named["output"], **changes}})


class Case(NamedTuple):
    """A class of bad input: its blob, and how the embedded default must end it.

    ``status`` ``None`` means foreign: the row is never written. ``undecodable`` jobs are foreign
    to a coordinator with CLP's configuration.
    """

    name: str
    blob: Callable[[Ctx], bytes]
    status: JobStatus | None
    message: Callable[[Ctx], str]
    undecodable: bool = False


def _undecodable(name: str, blob: Callable[[Ctx], bytes], why: str) -> Case:
    return Case(name, blob, JobStatus.FAILED, lambda _: DESERIALIZE + why, undecodable=True)


def _invalid_config(name: str, blob: Callable[[Ctx], bytes], why: str) -> Case:
    """An ``s3_object_metadata`` job (so the coordinator's, whatever its configuration) that does
    not decode."""
    return Case(name, blob, JobStatus.FAILED, lambda _: DESERIALIZE + why)


def _foreign(name: str, blob: Callable[[Ctx], bytes]) -> Case:
    return Case(name, blob, None, lambda _: "")


def _nested_array_key(ctx: Ctx) -> bytes:
    job_input = dict(ctx.named["input"])
    job_input[(1,)] = 2  # msgpack writes a tuple key as an array key
    return _blob({**ctx.named, "input": job_input})


def _invalid(field: str, detail: str) -> str:
    return f"ClpIoConfig.input.s3_object_metadata.{field}: {detail}"


CASES = [
    _undecodable(
        "not_zstd",
        lambda _: b"compression job config, not a zstd frame",
        "the job config is not a zstd frame: zstd decompress error: Unknown frame descriptor",
    ),
    _undecodable(
        "empty_blob", lambda _: b"", "the job config is not a zstd frame: incomplete frame"
    ),
    _undecodable(
        "bytes_after_the_frame",
        lambda ctx: _blob(ctx.named) + b"\x00",
        "the job config is not a zstd frame: zstd decompress error: Unknown frame descriptor",
    ),
    _undecodable(
        "empty_msgpack",
        lambda _: _zstd(b""),
        "ClpIoConfig: truncated or empty msgpack (0 bytes)",
    ),
    _undecodable(
        "zstd_of_not_msgpack",
        lambda _: _zstd(b"\xc1"),
        "ClpIoConfig: not valid msgpack (FormatError)",
    ),
    _undecodable(
        "msgpack_too_deep",
        lambda _: _zstd(b"\x91" * 3000 + b"\xc0"),
        "ClpIoConfig: not valid msgpack (StackError)",
    ),
    _undecodable(
        "msgpack_not_a_map",
        lambda _: _blob(42),
        "ClpIoConfig: invalid type: integer `42`, expected struct ClpIoConfig",
    ),
    _undecodable(
        "map_without_input",
        lambda ctx: _blob({"output": ctx.named["output"]}),
        "ClpIoConfig: missing field `input`",
    ),
    _undecodable(
        "input_not_a_map",
        lambda ctx: _blob({**ctx.named, "input": "s3_object_metadata"}),
        'ClpIoConfig.input: invalid type: string "s3_object_metadata", expected internally '
        "tagged enum InputConfig",
    ),
    _undecodable(
        "type_not_a_string",
        lambda ctx: _with_input(ctx, type=5),
        "ClpIoConfig.input.type: invalid value: integer `5`, expected variant index 0 <= i < 2",
    ),
    _undecodable(
        "array_key_at_the_top",
        lambda _: _blob({(1,): 2}),
        "ClpIoConfig: invalid type: sequence, expected field identifier",
    ),
    _undecodable(
        "array_key_in_the_input",
        _nested_array_key,
        "ClpIoConfig.input.s3_object_metadata: invalid type: sequence, expected field identifier",
    ),
    _undecodable(
        "map_key",
        lambda _: _zstd(b"\x81\x80\x01"),
        "ClpIoConfig: invalid type: map, expected field identifier",
    ),
    _undecodable(
        "huge_inflation",
        lambda _: _zstd(b"\x00" * (MAX_DECOMPRESSED_BYTES + 1)),
        f"the job config inflates past {MAX_DECOMPRESSED_BYTES} bytes; refusing to decode it",
    ),
    _invalid_config(
        "negative_id",
        lambda ctx: _with_input(ctx, s3_object_metadata_ids=[-1]),
        _invalid("s3_object_metadata_ids.0", "invalid value: integer `-1`, expected u64"),
    ),
    _invalid_config(
        "id_beyond_u64_as_a_float",
        lambda ctx: _with_input(ctx, s3_object_metadata_ids=[2.0**64]),
        _invalid(
            "s3_object_metadata_ids.0",
            "invalid type: floating point `18446744073709552000.0`, expected u64",
        ),
    ),
    _invalid_config(
        "negative_ingestion_job",
        lambda ctx: _with_input(ctx, ingestion_job_id=-3),
        _invalid("ingestion_job_id", "invalid value: integer `-3`, expected u64"),
    ),
    _invalid_config(
        "ingestion_job_as_a_string",
        lambda ctx: _with_input(ctx, ingestion_job_id="7"),
        _invalid("ingestion_job_id", 'invalid type: string "7", expected u64'),
    ),
    _invalid_config(
        "bucket_as_a_number",
        lambda ctx: _with_input(ctx, bucket=5),
        _invalid(
            "bucket", "invalid type: integer `5`, expected a string with a length of more than 0"
        ),
    ),
    _invalid_config(
        "unstructured_missing",
        lambda ctx: _blob(
            {
                **ctx.named,
                "input": {k: v for k, v in ctx.named["input"].items() if k != "unstructured"},
            }
        ),
        "ClpIoConfig.input.s3_object_metadata: missing field `unstructured`",
    ),
    _invalid_config(
        "compression_level_beyond_u8",
        lambda ctx: _with_output(ctx, compression_level=256),
        "ClpIoConfig.output.compression_level: invalid value: integer `256`, expected u8",
    ),
    _foreign(
        "input_without_type",  # CLP's Python CLI writes its s3 jobs so
        lambda ctx: _blob(
            {**ctx.named, "input": {k: v for k, v in ctx.named["input"].items() if k != "type"}}
        ),
    ),
    _foreign("unknown_type", lambda ctx: _with_input(ctx, type="future")),
    _foreign(
        "fs_as_an_array",
        lambda ctx: _blob(
            [["fs", ["/mnt/logs/a.log"], None, None, None, False], _output_array(ctx)]
        ),
    ),
    _foreign(
        "s3_as_an_array",
        lambda ctx: _blob(
            [
                ["s3", BUCKET, None, PREFIX, None, ["default"], None, None, None, False],
                _output_array(ctx),
            ]
        ),
    ),
    _foreign("fs_as_an_integer_keyed_map", lambda ctx: _blob({0: {0: "fs", 1: ["/a"]}, 1: {}})),
    _invalid_config(  # rmp_serde::to_vec's positional input: CLP's Rust decoder refuses it
        "s3_object_metadata_as_an_array",
        lambda ctx: _blob([_input_array(ctx), _output_array(ctx)]),
        "ClpIoConfig.input: invalid type: sequence, expected struct variant "
        "InputConfig::S3ObjectMetadataInputConfig",
    ),
    _invalid_config(
        "s3_object_metadata_as_an_integer_keyed_map",
        lambda ctx: _blob({0: dict(enumerate(_input_array(ctx))), 1: ctx.named["output"]}),
        "ClpIoConfig.input: missing field `type`",
    ),
    Case(  # the positional form of ClpIoConfig itself (not of its flattened input) runs
        "clp_io_config_as_an_array",
        lambda ctx: _blob([ctx.named["input"], _output_array(ctx)]),
        JobStatus.SUCCEEDED,
        lambda _: "",
    ),
    Case(
        "missing_objects",
        lambda ctx: _with_input(ctx, s3_object_metadata_ids=[*ctx.ids, 987_654]),
        JobStatus.FAILED,
        lambda ctx: f"{FAILED}missing S3 object metadata 987654 for ingestion job {ctx.ingestion}",
    ),
    Case(
        "no_objects",
        lambda ctx: _with_input(ctx, s3_object_metadata_ids=[]),
        JobStatus.FAILED,
        lambda ctx: (
            f"{FAILED}no S3 object metadata was requested for ingestion job {ctx.ingestion}"
        ),
    ),
    Case(
        "id_beyond_a_signed_64_bit_integer",  # SQLite's INTEGER cannot even be queried with it
        lambda ctx: _with_input(ctx, s3_object_metadata_ids=[*ctx.ids, 2**63]),
        JobStatus.FAILED,
        lambda ctx: f"{FAILED}missing S3 object metadata {2**63} for ingestion job {ctx.ingestion}",
    ),
    Case(
        "id_at_u64_max",
        lambda ctx: _with_input(ctx, s3_object_metadata_ids=[U64_MAX]),
        JobStatus.FAILED,
        lambda ctx: (
            f"{FAILED}missing S3 object metadata {U64_MAX} for ingestion job {ctx.ingestion}"
        ),
    ),
    Case(
        "ingestion_job_beyond_a_signed_64_bit_integer",
        lambda ctx: _with_input(ctx, ingestion_job_id=2**63),
        JobStatus.FAILED,
        lambda ctx: f"{FAILED}missing S3 object metadata {ctx.ids[0]} for ingestion job {2**63}",
    ),
    Case(
        "target_sizes_overflow_u64_when_added",
        lambda ctx: _with_output(ctx, target_segment_size=U64_MAX, target_dictionaries_size=1),
        JobStatus.FAILED,
        lambda _: (
            f"{FAILED}output.target_segment_size + output.target_dictionaries_size = {2**64} "
            f"overflows clp-s's u64 target encoded size (at most {U64_MAX})"
        ),
    ),
]


def _insert(config: CoordinatorConfig, engine: Engine, case: Case) -> tuple[int, Ctx]:
    """The case's job, inserted as log-ingestor would, with its objects registered."""
    scanner = S3ScannerJob(
        bucket=BUCKET,
        key_prefix=PREFIX,
        endpoint_url=local_store_endpoint(config.object_store_directory),
        dataset="default",
    )
    contexts: list[Ctx] = []

    def blob(ingestion: int, ids: list[int]) -> bytes:
        contexts.append(Ctx(valid_named_config(config, ingestion, ids), ingestion, ids))
        return case.blob(contexts[0])

    objects = list_objects(config, bucket=BUCKET, prefix=PREFIX)
    written = ingest_and_submit(engine, scanner, objects, blob)
    return written.compression_job_id, contexts[0]


def _as_deployment(rt: Runtime) -> None:
    """Make the runtime's coordinator behave as one given CLP's configuration (no local store)."""
    rt.coordinator.leases.owns_undecodable_jobs = False
    rt.coordinator.leases.leaves_job = None


# With CLP's configuration, only the cases whose ownership differs (and one that does not). A case
# whose job runs to its end (real clp-s) is slow.
RUNS = [
    pytest.param(
        case,
        False,
        id=f"embedded_default-{case.name}",
        marks=[pytest.mark.slow] if case.status is JobStatus.SUCCEEDED else [],
    )
    for case in CASES
] + [
    pytest.param(case, True, id=f"clp_config-{case.name}")
    for case in CASES
    if case.undecodable or case.status is None or case.name == "negative_id"
]


@pytest.mark.parametrize(("case", "deployment"), RUNS)
def test_a_bad_job_ends_as_its_class_requires_and_nothing_else_is_written(
    config: CoordinatorConfig, tmp_path: Path, case: Case, deployment: bool
) -> None:
    put_logs(config, tmp_path, ["svc0"])
    with open_runtime(config, lease_secs=5) as rt:
        if deployment:
            _as_deployment(rt)
        job_id, ctx = _insert(config, rt.engine, case)
        before = raw_rows(rt.engine, [job_id])
        rt.coordinator.run(until_idle=True)
        run_until_idle(rt.coordinator, timeout=60)

        runs = case.status is JobStatus.SUCCEEDED
        foreign = case.status is None or (deployment and case.undecodable)
        if foreign:
            assert raw_rows(rt.engine, [job_id]) == before  # never written, not even claimed
            assert triggers(rt, job_id) == []
        else:
            row = job_row(rt, job_id)
            assert (job_state(row), row.status_msg) == (case.status, case.message(ctx))
            # A bad job ends at once: no attempt was repeated.
            expected = ["submitted", "committed", "finalised"] if runs else ["rejected"]
            assert triggers(rt, job_id) == expected
        assert engine_jobs(rt.engine) == (1 if runs else 0)  # registered only if it runs


# --- a row that can stop nothing ----------------------------------------------------------------


def _array_key_job(config: CoordinatorConfig, engine: Engine) -> int:
    job_id, _ = _insert(
        config, engine, next(c for c in CASES if c.name == "array_key_in_the_input")
    )
    return job_id


@pytest.mark.parametrize("deployment", [False, True], ids=["embedded_default", "clp_config"])
def test_an_array_key_neither_stops_the_start_nor_the_loop(
    config: CoordinatorConfig, tmp_path: Path, deployment: bool
) -> None:
    """The job is in the database before the service starts (start-up reads every Pending job)."""
    put_logs(config, tmp_path, ["svc0"])
    with open_runtime(config, lease_secs=5) as rt:
        poisoned = _array_key_job(config, rt.engine)
    with open_runtime(config, lease_secs=5) as rt:
        if deployment:
            _as_deployment(rt)
        before = raw_rows(rt.engine, [poisoned])
        rt.coordinator.run(until_idle=True)
        if deployment:
            assert raw_rows(rt.engine, [poisoned]) == before
        else:
            assert job_state(job_row(rt, poisoned)) is JobStatus.FAILED


def test_an_endpoint_that_is_not_a_url_is_a_refusal_at_start_not_a_traceback(
    config: CoordinatorConfig, tmp_path: Path
) -> None:
    """``urlsplit`` raises on ``http://[::1``, and so did the embedded default's start-up check."""
    put_logs(config, tmp_path, ["svc0"])
    with open_runtime(config, lease_secs=5) as rt:
        case = Case(
            "not_a_url",
            lambda ctx: _with_input(ctx, endpoint_url="http://[::1"),
            None,
            lambda _: "",
        )
        job_id, _ = _insert(config, rt.engine, case)
        before = raw_rows(rt.engine, [job_id])
        rt.coordinator.run(until_idle=True)  # left Pending: it names no local store
        assert raw_rows(rt.engine, [job_id]) == before
    with pytest.raises(
        ConfigError, match=f"Pending log-ingestor compression job\\(s\\) \\(id {job_id}\\)"
    ):
        open_runtime(config, lease_secs=5)


def test_show_and_jobs_display_an_undecodable_row(
    config: CoordinatorConfig, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    put_logs(config, tmp_path, ["svc0"])
    with open_runtime(config, lease_secs=5) as rt:
        poisoned = _array_key_job(config, rt.engine)
        document = job_commands.show_job(rt.store, poisoned)
        assert (document["status"], document["dataset"]) == ("Pending", None)
        assert [row["id"] for row in job_commands.list_jobs(rt.engine)] == [poisoned]
    data = ["--data-dir", str(config.data_dir)]
    assert main(["show", str(poisoned), *data]) == 0
    assert "dataset unknown (the job config does not decode)" in capsys.readouterr().out
    assert main(["jobs", *data]) == 0
    assert f"{poisoned:>6}  Pending" in capsys.readouterr().out


class _FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _fail_the_first_claim(coordinator: Coordinator) -> None:
    """A claim that hits an error no check foresaw (a bug), once."""
    claim = coordinator.leases.claim
    failures = []

    def claim_failing_once() -> int:
        if not failures:
            failures.append(1)
            raise RuntimeError("a bug in the claim")
        return claim()

    coordinator.leases.claim = claim_failing_once  # type: ignore[method-assign]


def test_an_unexpected_error_in_the_claim_backs_off_instead_of_stopping_the_loop(
    config: CoordinatorConfig, tmp_path: Path
) -> None:
    put_logs(config, tmp_path, ["svc0"])
    clock = _FakeClock()
    with open_runtime(config, lease_secs=5) as rt:
        job_id, _ = _insert(config, rt.engine, CASES[0])
        inner = rt.coordinator
        coordinator = Coordinator(
            engine=inner.engine,
            spider=inner.spider,
            settings=inner.settings,
            archive_output=inner.archive_output,
            instance_id=inner.instance_id,
            owns_undecodable_jobs=True,
            clock=clock,
        )
        _fail_the_first_claim(coordinator)
        assert coordinator.tick().claimed == 0  # the error is logged, not raised
        assert coordinator.tick().claimed == 0  # claiming backs off
        clock.now += 1.5
        assert coordinator.tick().claimed == 1
        assert job_state(job_row(rt, job_id)) is JobStatus.FAILED


# --- a Pending row that already records a Spider id ------------------------------------------


def _record_spider_id(engine: Engine, job_id: int, spider_id: int) -> None:
    """What some other writer did: a Spider id on a row it left Pending."""
    with engine.begin() as connection:
        connection.execute(update(_jobs).where(_jobs.c.id == job_id).values(spider_id=spider_id))


def _valid_job(config: CoordinatorConfig, engine: Engine) -> tuple[int, Ctx]:
    case = Case("valid", lambda ctx: _blob(ctx.named), JobStatus.SUCCEEDED, lambda _: "")
    return _insert(config, engine, case)


def test_a_pending_row_with_an_unknown_spider_id_ends_failed_without_any_registration(
    config: CoordinatorConfig, tmp_path: Path
) -> None:
    put_logs(config, tmp_path, ["svc0"])
    with open_runtime(config, lease_secs=5) as rt:
        job_id, _ = _valid_job(config, rt.engine)
        _record_spider_id(rt.engine, job_id, 987_654)
        run_until_idle(rt.coordinator, timeout=10)
        row = job_row(rt, job_id)
        assert (job_state(row), row.spider_id, row.status_msg) == (
            JobStatus.FAILED,
            987_654,
            f"{FAILED}the Pending job already records Spider job 987654, so it is not submitted "
            "again; Spider does not know it.",
        )
        assert triggers(rt, job_id) == ["abandoned"]
        assert rt.store.history(job_id)[0].spider_id == 987_654
        assert engine_jobs(rt.engine) == 0


def test_a_pending_row_recording_a_live_spider_job_ends_failed_and_that_job_is_cancelled(
    config: CoordinatorConfig, tmp_path: Path
) -> None:
    put_logs(config, tmp_path, ["svc0"])
    with open_runtime(config, lease_secs=5) as rt:
        job_id, _ = _valid_job(config, rt.engine)
        submission = prepare(rt.engine, job_row(rt, job_id).clp_config, rt.coordinator.settings)
        orphan = rt.spider.register_job(
            rt.coordinator.resource_group.id(),
            submission.submission.compressed_task_graph(),
            submission.submission.compressed_inputs(),
        )
        _record_spider_id(rt.engine, job_id, orphan)
        run_until_idle(rt.coordinator, timeout=10)
        # Spider's rules decide whether a Ready job may be cancelled; never is it started.
        state = rt.spider.get_job_state(orphan)
        outcome = {
            JobState.CANCELLED: "it is cancelled",
            JobState.READY: "it was never started and is left so",
        }[state]
        row = job_row(rt, job_id)
        assert (job_state(row), row.status_msg) == (
            JobStatus.FAILED,
            f"{FAILED}the Pending job already records Spider job {orphan}, so it is not "
            f"submitted again; {outcome}.",
        )
        assert engine_jobs(rt.engine) == 1  # the test's own registration, none by the service


class _AnotherWriterRecordsASpiderId(CountingRegistrations):
    """Between RegisterJob and the record, another writer puts a Spider id on the Pending row."""

    def __init__(self, rt: Runtime, job_id: int) -> None:
        super().__init__(rt.spider)
        self.engine = rt.engine
        self.job_id = job_id

    def register_job(
        self, resource_group_id: int, compressed_task_graph: bytes, compressed_inputs: bytes
    ) -> int:
        spider_id = super().register_job(
            resource_group_id, compressed_task_graph, compressed_inputs
        )
        _record_spider_id(self.engine, self.job_id, 555_555)
        return spider_id


def test_a_lost_submitted_race_is_never_registered_again(
    config: CoordinatorConfig, tmp_path: Path
) -> None:
    """Before: the row was claimed again, registered again and lost again, on every tick."""
    put_logs(config, tmp_path, ["svc0"])
    with open_runtime(config, lease_secs=5) as rt:
        job_id, _ = _valid_job(config, rt.engine)
        spider = _AnotherWriterRecordsASpiderId(rt, job_id)
        inner = rt.coordinator
        coordinator = Coordinator(
            engine=inner.engine,
            spider=spider,
            settings=inner.settings,
            archive_output=inner.archive_output,
            instance_id=inner.instance_id,
            owns_undecodable_jobs=True,
        )
        run_until_idle(coordinator, timeout=10)
        (registered,) = spider.registered  # once
        assert rt.spider.get_job_state(registered) in (JobState.READY, JobState.CANCELLED)
        row = job_row(rt, job_id)
        assert (job_state(row), row.spider_id, row.status_msg) == (
            JobStatus.FAILED,
            555_555,
            f"{FAILED}the Pending job already records Spider job 555555, so it is not submitted "
            "again; Spider does not know it.",
        )
        assert triggers(rt, job_id) == ["abandoned"]


def test_bad_jobs_submitted_together_end_as_each_does_alone(
    config: CoordinatorConfig, tmp_path: Path
) -> None:
    """A tick reads what its batch of jobs needs in one read (``Submitter.read_ahead``, issue 14):
    every bad job of the batch still ends exactly as it does alone, the valid ones run."""
    put_logs(config, tmp_path, ["svc0"])
    with open_runtime(config, lease_secs=5) as rt:
        valid, valid_ctx = _valid_job(config, rt.engine)
        # The batch reads the valid job's object; a job naming it under its own ingestion job
        # must still find it missing, as CLP's query filters on the ingestion job.
        borrowed = valid_ctx.ids[0]
        borrower = Case(
            "object_of_another_ingestion_job_in_the_batch",
            lambda ctx: _with_input(ctx, s3_object_metadata_ids=[borrowed]),
            JobStatus.FAILED,
            lambda ctx: (
                f"{FAILED}missing S3 object metadata {borrowed} for ingestion job {ctx.ingestion}"
            ),
        )
        cases = [borrower] + [case for case in CASES if case.status]  # borrower beside valid
        bad = [(case, *_insert(config, rt.engine, case)) for case in cases]
        valid_ids = [valid, _valid_job(config, rt.engine)[0]]
        assert len(bad) + len(valid_ids) > SUBMISSION_BATCH  # read in more than one batch
        rt.coordinator.run(until_idle=True)
        run_until_idle(rt.coordinator, timeout=60)
        for case, job_id, ctx in bad:
            row = job_row(rt, job_id)
            assert (job_state(row), row.status_msg) == (case.status, case.message(ctx)), case.name
        states = [job_state(job_row(rt, job_id)) for job_id in valid_ids]
        assert states == [JobStatus.SUCCEEDED] * 2
