"""Spider payloads: execution policies, wire frames, and the task graph (vector + strict parser)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import zstandard

from coordinator.spider.policy import (
    DEFAULT_POLICY,
    MAX_TIMEOUT_MS,
    ExecutionPolicy,
    InvalidExecutionPolicy,
    TimeoutPolicy,
    commit_task_policy,
    compression_task_policy,
)
from coordinator.spider.task_graph import (
    COMPRESS_TASK,
    InputSource,
    InvalidTaskGraph,
    JobSubmission,
    TaskDescriptor,
    TaskGraph,
    TdlContext,
    build_compression_job,
    decode_job_submission,
    decode_task_graph,
    struct_value,
)
from coordinator.spider.wire import (
    InvalidFrame,
    compress,
    decode_frame,
    decode_job_inputs,
    decode_job_outputs,
    encode_frame,
    encode_job_inputs,
    encode_job_outputs,
)
from coordinator.task_io import (
    ClpSCompressionOption,
    CompressionTaskOutput,
    DefaultAuthentication,
    S3InputSource,
    decode_dataset,
)
from tests.vectors import load_vector

GRAPH_VECTOR = load_vector("task_graph.json")
TASK_IO = load_vector("task_io.json")["vectors"]
OPTION = ClpSCompressionOption(
    target_encoded_size=301989888, compression_level=3, timestamp_key="ts", unstructured=False
)


def _source(num_objects: int) -> S3InputSource:
    return S3InputSource(
        region_code="us-east-2",
        bucket="yscope",
        aws_authentication=DefaultAuthentication(),
        object_keys=[f"logs/{i}.json" for i in range(num_objects)],
    )


def _vector_job(*, cleanup_task: bool = True) -> JobSubmission:
    inputs = GRAPH_VECTOR["inputs"]
    return build_compression_job(
        [_source(p["num_objects"]) for p in inputs["partitions"]],
        OPTION,
        "default",
        compression_task_max_retry=inputs["compression_task_max_retry"],
        commit_policy=commit_task_policy(
            inputs["commit_task_max_retry"],
            inputs["commit_task_soft_timeout_secs"],
            inputs["commit_task_hard_timeout_secs"],
        ),
        cleanup_task=cleanup_task,
    )


def test_the_two_task_graph_is_identical_to_the_vector() -> None:
    graph = _vector_job(cleanup_task=False).task_graph
    assert graph.to_json_text() == GRAPH_VECTOR["task_graph_json_text"]
    assert graph.to_json() == GRAPH_VECTOR["task_graph"]
    assert json.dumps(GRAPH_VECTOR["task_graph"], separators=(",", ":")) == graph.to_json_text()


def test_the_coordinators_graph_is_clps_plus_a_cleanup_task() -> None:
    value = json.loads(_vector_job().task_graph.to_json_text())
    expected = json.loads(GRAPH_VECTOR["task_graph_json_text"])
    expected["cleanup_task"] = {
        "tdl_context": {"package": "clp", "task_func": "compression::cleanup"},
        "execution_policy": expected["commit_task"]["execution_policy"],
    }
    assert value == expected
    assert decode_task_graph(_vector_job().compressed_task_graph()).cleanup_task is not None


def test_jobs_of_one_shape_share_one_graph_and_its_zstd_frame() -> None:
    """The graph depends only on the partitions' object counts and the policies: jobs of one
    shape share it (and its compressed form, made once); another shape gets its own."""
    first, second = _vector_job(), _vector_job()
    assert first.task_graph is second.task_graph
    assert first.compressed_task_graph() is second.compressed_task_graph()
    fresh = zstandard.ZstdCompressor(level=3).compress(first.task_graph.to_json_text().encode())
    assert first.compressed_task_graph() == fresh
    assert first.inputs == second.inputs
    assert _vector_job(cleanup_task=False).task_graph is not first.task_graph
    other = build_compression_job(
        [_source(3)],
        OPTION,
        "default",
        compression_task_max_retry=2,
        commit_policy=commit_task_policy(2, 10, 20),
    )
    assert other.task_graph is not first.task_graph
    assert decode_task_graph(other.compressed_task_graph()).tasks == other.task_graph.tasks


def test_job_inputs_are_option_dataset_source_per_task() -> None:
    job = _vector_job()
    assert job.task_graph.num_job_inputs == len(job.inputs) == 6
    payloads = decode_job_inputs(job.compressed_inputs())
    assert payloads[0] == payloads[3] == bytes.fromhex(TASK_IO["TASKIN_CLP_S_OPTION_HEX"]["hex"])
    assert payloads[1] == payloads[4] == bytes.fromhex(TASK_IO["TASKIN_DATASET_SOME_HEX"]["hex"])
    assert S3InputSource.from_msgpack(payloads[2]) == _source(2)
    assert S3InputSource.from_msgpack(payloads[5]) == _source(1)
    assert decode_dataset(payloads[1]) == "default"
    assert job.task_graph.output_tasks == (0, 1)


def test_the_payloads_decode_as_a_spider_server_would() -> None:
    job = _vector_job()
    assert decode_job_submission(job.compressed_task_graph(), job.compressed_inputs()) == job


def test_the_contracts_frame_example() -> None:
    one_task = encode_frame(
        [
            bytes.fromhex("94ce1200000003a27473c2"),
            bytes.fromhex("a764656661756c74"),
            bytes.fromhex(TASK_IO["TASKIN_S3_INPUT_SOURCE_DEFAULT_HEX"]["hex"]),
        ]
    )
    source_hex = TASK_IO["TASKIN_S3_INPUT_SOURCE_DEFAULT_HEX"]["hex"]
    assert one_task.hex() == (  # docs/spider.md, Wire formats: one task
        "03000000"
        + "0b000000"
        + "94ce1200000003a27473c2"
        + "08000000"
        + "a764656661756c74"
        + "38000000"
        + source_hex
    )
    assert encode_frame([]) == bytes.fromhex("00000000")
    assert decode_frame(one_task)[2].hex() == TASK_IO["TASKIN_S3_INPUT_SOURCE_DEFAULT_HEX"]["hex"]


def test_job_outputs_carry_an_option_byte_and_compress_past_one_kib() -> None:
    output = bytes.fromhex(TASK_IO["TASKOUT_COMPRESSION_TASK_OUTPUT_HEX"]["hex"])
    small = encode_job_outputs([output])
    assert small.hex() == "00" + "01000000" + "13000000" + output.hex()
    large_payloads = [output] * 100
    large = encode_job_outputs(large_payloads)
    assert large[0] == 1
    assert decode_job_outputs(large) == large_payloads
    assert CompressionTaskOutput.from_msgpack(decode_job_outputs(small)[0]).dataset == "default"


@pytest.mark.parametrize(
    ("frame", "message"),
    [
        (b"\x01\x00", "at least 4 bytes"),
        (bytes.fromhex("01000000"), "truncated before the length"),
        (bytes.fromhex("0100000005000000abcd"), "truncated inside payload 0"),
    ],
)
def test_malformed_frames_are_rejected(frame: bytes, message: str) -> None:
    with pytest.raises(InvalidFrame, match=message):
        decode_frame(frame)


def test_malformed_outputs_and_inputs_are_rejected() -> None:
    with pytest.raises(InvalidFrame, match="option byte"):
        decode_job_outputs(b"")
    with pytest.raises(InvalidFrame, match="unknown job-outputs option byte 2"):
        decode_job_outputs(b"\x02\x00\x00\x00\x00")
    with pytest.raises(InvalidFrame, match="not zstd"):
        decode_job_inputs(b"\x00\x00\x00\x00")
    assert decode_job_inputs(encode_job_inputs([])) == []


# Execution policies ---------------------------------------------------------------------------


@pytest.mark.parametrize("num_objects", [1, 2, 100, 288])
def test_compress_policies_are_clps_up_to_288_objects(num_objects: int) -> None:
    policy = compression_task_policy(num_objects, max_retry=2)
    assert policy == ExecutionPolicy(
        2, 1, TimeoutPolicy(num_objects * 180_000, num_objects * 300_000)
    )


@pytest.mark.parametrize("num_objects", [289, 480, 481, 10_000, 1_000_000])
def test_larger_partitions_stay_submittable(num_objects: int) -> None:
    policy = compression_task_policy(num_objects, max_retry=1)
    assert policy.timeout_policy.hard_timeout_ms == MAX_TIMEOUT_MS
    assert policy.timeout_policy.soft_timeout_ms == MAX_TIMEOUT_MS * 3 // 5
    job = build_compression_job(
        [_source(num_objects)],
        OPTION,
        None,
        compression_task_max_retry=1,
        commit_policy=commit_task_policy(1, 45, 60),
    )
    decode_task_graph(job.compressed_task_graph())  # Spider's checks accept it


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: TimeoutPolicy(99, 300_000), "`soft_timeout_ms` must be >= 100ms"),
        (lambda: TimeoutPolicy(100, MAX_TIMEOUT_MS + 1), "`hard_timeout_ms` must be <= 86400000ms"),
        (lambda: TimeoutPolicy(5_000, 5_000), "must be greater than `soft_timeout_ms`"),
        (
            lambda: ExecutionPolicy(max_num_instances=0),
            "`max_num_instances` must be greater than 0",
        ),
        (lambda: ExecutionPolicy(max_num_retry=-1), "`max_num_retry` must be an integer"),
        (lambda: commit_task_policy(1, 60, 45), "must be greater than `soft_timeout_ms`"),
        (lambda: commit_task_policy(1, 45, 90_000), "`hard_timeout_ms` must be <= 86400000ms"),
        (lambda: compression_task_policy(0, 1), "at least one object"),
    ],
)
def test_spiders_rules_reject_bad_policies(make: Any, message: str) -> None:
    with pytest.raises(InvalidExecutionPolicy, match=message):
        make()


def test_a_default_policy_is_left_out_of_a_regular_task() -> None:
    task = TaskDescriptor(TdlContext("clp", COMPRESS_TASK), (struct_value("A"),), ())
    assert "execution_policy" not in task.to_json()
    assert task.execution_policy == DEFAULT_POLICY


# The graph parser -----------------------------------------------------------------------------


def _graph_with(**changes: Any) -> bytes:
    value = json.loads(GRAPH_VECTOR["task_graph_json_text"])
    value.update(changes)
    return compress(json.dumps(value).encode())


def _task(**changes: Any) -> dict[str, Any]:
    task: dict[str, Any] = json.loads(GRAPH_VECTOR["task_graph_json_text"])["tasks"][0]
    task.update(changes)
    return task


@pytest.mark.parametrize(
    ("graph", "message"),
    [
        (b"not zstd", "failed to decompress zstd bytes: Unknown frame descriptor"),
        (compress(b"[1]"), "invalid type: sequence, expected a map"),
        (_graph_with(extra=1), "unknown field"),
        (_graph_with(schema_version="0.2.0"), "incompatible task graph schema version"),
        (_graph_with(schema_version="zero"), "invalid schema version string"),
        (_graph_with(tasks=[]), "at least one task"),
        (
            _graph_with(tasks=[_task(inputs=[{"Value": {"Struct": ""}}])]),
            "expected a string with a length of more than 0",
        ),
        (
            _graph_with(tasks=[_task(inputs=[{"Value": {"Primitive": {"Int": "Int128"}}}])]),
            "unknown variant `Int128`",
        ),
        (_graph_with(tasks=[_task(tdl_context={"package": "clp"})]), "missing field `task_func`"),
        (
            _graph_with(
                tasks=[_task(execution_policy={"max_num_retry": 1, "max_num_instances": 0})]
            ),
            "`max_num_instances` must be greater than 0",
        ),
        (
            _graph_with(tasks=[_task(input_sources=[{"task_idx": 0, "position": 0}] * 3)]),
            "invalid input source at position 0",
        ),
        (_graph_with(commit_task={"execution_policy": None}), "missing field `tdl_context`"),
    ],
)
def test_the_parser_refuses_what_spider_refuses(graph: bytes, message: str) -> None:
    with pytest.raises(InvalidTaskGraph, match=message):
        decode_task_graph(graph)


def test_missing_top_level_keys_are_refused() -> None:
    value = json.loads(GRAPH_VECTOR["task_graph_json_text"])
    del value["cleanup_task"]
    with pytest.raises(InvalidTaskGraph, match="missing field"):
        decode_task_graph(compress(json.dumps(value).encode()))


def test_chained_tasks_define_inputs_and_outputs() -> None:
    produce = TaskDescriptor(TdlContext("p", "make"), (struct_value("In"),), (struct_value("Mid"),))
    consume = TaskDescriptor(
        TdlContext("p", "use"),
        (struct_value("Mid"),),
        (struct_value("Out"),),
        input_sources=(InputSource(0, 0),),
    )
    graph = TaskGraph((produce, consume))
    parsed = decode_task_graph(graph.compressed())
    assert parsed == graph
    assert (parsed.num_job_inputs, parsed.output_tasks) == (1, (1,))
    mismatched = json.loads(graph.to_json_text())
    mismatched["tasks"][1]["inputs"] = [struct_value("Other")]
    with pytest.raises(InvalidTaskGraph, match="mismatched input type for input at position 0"):
        decode_task_graph(compress(json.dumps(mismatched).encode()))


def test_an_input_count_that_differs_from_the_graph_is_refused() -> None:
    job = _vector_job()
    with pytest.raises(InvalidTaskGraph, match="task graph input size mismatch"):
        decode_job_submission(job.compressed_task_graph(), encode_job_inputs(job.inputs[:5]))
    with pytest.raises(InvalidTaskGraph, match="bad request"):
        decode_job_submission(job.compressed_task_graph(), b"garbage")


def test_a_job_needs_a_partition() -> None:
    with pytest.raises(InvalidTaskGraph, match="at least one task"):
        build_compression_job(
            [], OPTION, None, compression_task_max_retry=1, commit_policy=DEFAULT_POLICY
        )
