"""The task-graph parser follows Spider's server rule by rule (issue 11).

Each test decodes JSON text written by hand, zstd-compressed here with ``zstandard`` (not with the
coordinator's encoder), and names the line of ``components/spider-core/src/task/task_graph.rs`` in
Spider's source or the serde behaviour it follows. Every graph below was also registered with
Spider's real storage service: the accepted ones were accepted there, the refused ones refused
(INVALID_ARGUMENT); ``test_task_graph_parity.py`` registers them, and more, with both on every run.
"""

from __future__ import annotations

import pytest
import zstandard

from coordinator.spider.policy import DEFAULT_POLICY, ExecutionPolicy, TimeoutPolicy
from coordinator.spider.task_graph import (
    InputSource,
    InvalidTaskGraph,
    TaskGraph,
    TdlContext,
    decode_job_submission,
    decode_task_graph,
)

BOOL = '{"Value":{"Primitive":"Boolean"}}'
BOOL_CANONICAL = {"Value": {"Primitive": "Boolean"}}


def task(inputs: str = "", outputs: str = "", sources: str = "null", extra: str = "") -> str:
    """One task's JSON text (package ``p``, function ``f``)."""
    return (
        '{"tdl_context":{"package":"p","task_func":"f"},'
        f'"inputs":[{inputs}],"outputs":[{outputs}],"input_sources":{sources}{extra}}}'
    )


def graph(
    *tasks: str,
    version: str = '"0.1.0"',
    commit: str = "null",
    cleanup: str = "null",
    extra: str = "",
) -> str:
    """A graph's JSON text around ``tasks`` (one default task when none is given)."""
    return (
        f'{{"schema_version":{version},"tasks":[{",".join(tasks or (task(),))}],'
        f'"commit_task":{commit},"cleanup_task":{cleanup}{extra}}}'
    )


def with_policy(policy: str) -> str:
    return graph(task(extra=f',"execution_policy":{policy}'))


def zstd(text: str | bytes) -> bytes:
    raw = text if isinstance(text, bytes) else text.encode("utf-8", "surrogateescape")
    return zstandard.ZstdCompressor().compress(raw)


def decode(text: str | bytes) -> TaskGraph:
    return decode_task_graph(zstd(text))


def refused(text: str | bytes, message: str) -> None:
    with pytest.raises(InvalidTaskGraph, match=message) as caught:
        decode(text)
    assert str(caught.value).startswith("bad request: ")


# --- schema_version: semver's VersionReq ">=0.1.0,<0.2.0" --------------------------------------


@pytest.mark.parametrize("version", ["0.1.0-alpha", "0.1.5-rc.1", "0.2.0-alpha", "0.1.0-0"])
def test_a_pre_release_version_never_matches(version: str) -> None:
    """task_graph.rs:937 and 1029: semver matches a pre-release only when a comparator with the
    same major.minor.patch has a pre-release; neither ``>=0.1.0`` nor ``<0.2.0`` has one."""
    refused(graph(version=f'"{version}"'), "incompatible task graph schema version")


@pytest.mark.parametrize(
    "version", ["0.1.0", "0.1.7", "0.1.0+b.01", "0.1.5+x", "0.1.0+-", "0.1.18446744073709551615"]
)
def test_build_metadata_is_ignored_and_any_0_1_patch_matches(version: str) -> None:
    """task_graph.rs:1029: ``>=0.1.0,<0.2.0`` ignores build metadata; patch is any u64."""
    assert decode(graph(version=f'"{version}"')).schema_version == version


@pytest.mark.parametrize(
    "version",
    [
        "0.1.0+",  # empty build metadata
        "0.1.0-",  # empty pre-release
        "0.1.0+a..b",  # empty identifier segment
        "0.1.0-01",  # leading zero in a numeric pre-release identifier
        "0.1.00",  # leading zero in a number
        "0.1.18446744073709551616",  # past u64
        "0.1.\uff19",  # a digit, but not an ASCII one
        "0.1.0 ",
        "v0.1.0",
        "0.1",
        "",
    ],
)
def test_the_schema_version_is_parsed_as_semver_does(version: str) -> None:
    """task_graph.rs:1023: ``Version::parse`` (semver 1.x) refuses these before matching."""
    refused(graph(version=f'"{version}"'), "invalid schema version string")


def test_the_schema_version_is_a_string() -> None:
    """task_graph.rs:975: ``schema_version`` is read as a ``String``."""
    refused(graph(version="0.1"), "invalid type: number, expected a string")


# --- the top level: TaskGraphVisitor ----------------------------------------------------------


def test_a_top_level_key_may_not_repeat() -> None:
    """task_graph.rs:980-1011: each key once ("duplicate field"), even written with escapes."""
    refused(graph(extra=',"commit_task":null'), "duplicate field `commit_task`")
    text = graph().replace('"tasks"', '"schema\\u005fversion":"0.1.0","tasks"')
    refused(text, "duplicate field `schema_version`")


def test_the_top_level_has_exactly_four_keys() -> None:
    """task_graph.rs:949 (no catch-all field) and 1017-1041 (each one required)."""
    refused(graph(extra=',"x":1'), "unknown field `x`")
    refused(graph().replace(',"cleanup_task":null', ""), "missing field `cleanup_task`")
    refused("[]", "invalid type: sequence, expected a map")
    assert decode(graph(commit="null", cleanup="null")).commit_task is None


# --- null and absent ---------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["", ',"execution_policy":null'])
def test_an_absent_or_null_execution_policy_is_the_default(policy: str) -> None:
    """task_graph.rs:370 (``#[serde(default)] Option``) and 399 for termination tasks."""
    parsed = decode(graph(task(extra=policy), commit='{"tdl_context":["p","c"]' + policy + "}"))
    assert parsed.tasks[0].execution_policy == DEFAULT_POLICY
    assert parsed.commit_task is not None and parsed.commit_task.execution_policy is None


def test_a_null_timeout_policy_is_refused_an_absent_one_is_the_default() -> None:
    """task_graph.rs:151: ``timeout_policy`` is ``#[serde(default)]`` but not an ``Option``."""
    policy = '{"max_num_retry":2,"max_num_instances":1'
    assert decode(with_policy(policy + "}")).tasks[0].execution_policy == ExecutionPolicy(2, 1)
    refused(with_policy(policy + ',"timeout_policy":null}'), "invalid type: null")
    refused(
        graph(
            commit='{"tdl_context":["p","c"],"execution_policy":'
            + policy
            + ',"timeout_policy":null}}'
        ),
        "invalid type: null",
    )


def test_absent_input_sources_make_an_input_task() -> None:
    """task_graph.rs:385: an ``Option`` without ``#[serde(default)]``; absent from a map: None."""
    second = '{"tdl_context":{"package":"p","task_func":"g"},"inputs":[' + BOOL + '],"outputs":[]}'
    parsed = decode(graph(task(outputs=BOOL), second))
    assert parsed.input_tasks == (0, 1)
    assert decode_job_submission(zstd(graph(task(outputs=BOOL), second)), _inputs(1)).inputs


def test_input_sources_may_not_be_left_off_a_task_in_array_form() -> None:
    """task_graph.rs:385 in serde's ``visit_seq``: only ``#[serde(default)]`` fields may be left
    off the end of an array."""
    refused(graph('[["p","f"],null,[],[]]'), "invalid length 4, expected struct TaskDescriptor")


# --- input sources --------------------------------------------------------------------------------


def test_input_sources_on_a_task_without_inputs_are_refused() -> None:
    """task_graph.rs:761: ``Some([])`` with no inputs: "input task cannot have input sources"."""
    refused(graph(task(), task(sources="[]")), "input task cannot have input sources specified")


def test_a_source_names_an_earlier_tasks_output() -> None:
    """task_graph.rs:774: the task itself and later tasks have no outputs yet."""
    itself = task(BOOL, BOOL, sources="[[1,0]]")
    refused(graph(task(outputs=BOOL), itself), "invalid input source at position 0")
    refused(graph(task(outputs=BOOL), task(BOOL, sources="[[0,1]]")), "invalid input source")
    refused(
        graph(task(outputs=BOOL), task(BOOL + "," + BOOL, sources="[[0,0]]")), "mismatched number"
    )


# --- TdlContext --------------------------------------------------------------------------------


def test_an_empty_package_and_task_func_are_accepted() -> None:
    """task_graph.rs:48: ``package`` and ``task_func`` are plain ``String``s."""
    parsed = decode(graph('{"tdl_context":{"package":"","task_func":""},"inputs":[],"outputs":[]}'))
    assert parsed.tasks[0].tdl_context == TdlContext("", "")


def test_strings_that_are_read_must_be_valid_unicode() -> None:
    """serde_json parse_str: a lone surrogate escape in a read string is refused, a pair is not."""
    refused(graph(task().replace('"p"', '"p\\ud800"')), "lone leading surrogate")
    paired = decode(graph(task().replace('"p"', '"\\ud83d\\ude00"')))
    assert paired.tasks[0].tdl_context.package == "\U0001f600"


# --- data type descriptors: every serde form ------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ('{"Value":{"Primitive":{"Boolean":null}}}', BOOL_CANONICAL),
        (
            '{"Value":{"Primitive":{"Int":{"Int32":null}}}}',
            {"Value": {"Primitive": {"Int": "Int32"}}},
        ),
        (
            '{"SharedValue":{"Primitive":{"Float":"Float64"}}}',
            {"SharedValue": {"Primitive": {"Float": "Float64"}}},
        ),
        ('{"Value":{"Bytes":[]}}', {"Value": {"Bytes": {}}}),
        ('{"Value":{"Bytes":{"ignored":1}}}', {"Value": {"Bytes": {}}}),
        (
            '{"Value":{"Map":[{"Int":"Int8"},{"Struct":" "}]}}',
            {"Value": {"Map": {"key": {"Int": "Int8"}, "value": {"Struct": " "}}}},
        ),
        (
            '{"Value":{"Map":{"value":{"Bytes":{}},"key":{"Bytes":{}},"x":[1]}}}',
            {"Value": {"Map": {"key": {"Bytes": {}}, "value": {"Bytes": {}}}}},
        ),
        ('{ "Value" : { "List" : "Boolean" } }', None),
    ],
)
def test_data_types_in_every_form_serde_accepts(text: str, canonical: object) -> None:
    """type_descriptor.rs (externally tagged enums): a unit variant as ``"Name"`` or
    ``{"Name": null}``, struct bodies as maps (unknown keys ignored) or arrays."""
    if canonical is None:  # ``List`` holds a value type, and ``"Boolean"`` is not one
        refused(graph(task(text)), "unknown variant `Boolean`")
        return
    assert decode(graph(task(text))).tasks[0].inputs == (canonical,)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('"Value"', "invalid type: unit variant"),
        ('{"Value":{"Primitive":"Boolean"},"x":1}', "expected `}`"),
        ('{"Value":{"Primitive":{"Boolean":{}}}}', "invalid type: map, expected unit"),
        ('{"Value":{"Primitive":"boolean"}}', "unknown variant `boolean`"),
        ('{"Value":{"Struct":""}}', "expected a string with a length of more than 0"),
        ('{"Value":{"Bytes":null}}', "invalid type: null, expected struct BytesTypeDescriptor"),
        (
            '{"Value":{"Map":{"key":{"Int":"Int8"},"key":{"Int":"Int8"},"value":"x"}}}',
            "duplicate field `key`",
        ),
        (
            '{"Value":{"Map":{"key":{"Float":"Float32"},"value":{"Bytes":{}}}}}',
            "unknown variant `Float`",
        ),
        ("{}", "expected value"),
    ],
)
def test_data_types_serde_refuses(text: str, message: str) -> None:
    """type_descriptor.rs: one key per enum, no unit variant with content, Struct(NonEmptyString),
    ``MapKeyTypeDescriptor`` has only Int and Bytes."""
    refused(graph(task(text)), message)


def test_types_are_compared_as_values_whatever_their_form() -> None:
    """task_graph.rs:782: ``expected_type == actual_type`` compares descriptors, not JSON text."""
    chained = task(
        '{"Value":{"Primitive":{"Boolean":null}}}', sources='[{"task_idx":0,"position":0}]'
    )
    parsed = decode(graph(task(outputs=BOOL), chained))
    assert parsed.tasks[1].input_sources == (InputSource(0, 0),)
    shared = task('{"SharedValue":{"Primitive":"Boolean"}}', sources="[[0,0]]")
    refused(graph(task(outputs=BOOL), shared), "mismatched input type for input at position 0")


# --- structs: array form, unknown and repeated keys ----------------------------------------------


def test_every_struct_is_accepted_as_an_array_of_its_fields() -> None:
    """serde-derived structs (task_graph.rs:40-400) also deserialize from a sequence."""
    parsed = decode(
        graph(
            '[["p","f"],[1,2,[100,200]],[],[' + BOOL + "],null]",
            '[["p","g"],null,[' + BOOL + "],[],[[0,0]]]",
            commit='[["p","c"]]',
            cleanup='[["p","d"],[0,1]]',
        )
    )
    assert parsed.tasks[0].execution_policy == ExecutionPolicy(1, 2, TimeoutPolicy(100, 200))
    assert parsed.tasks[1].input_sources == (InputSource(0, 0),)
    assert (
        parsed.cleanup_task is not None
        and parsed.cleanup_task.execution_policy == ExecutionPolicy(0, 1)
    )
    refused(graph('[["p","f"],null,[],[],null,1]'), "trailing")
    refused(graph(commit='[["p","c"],null,1]'), "trailing")


def test_a_repeated_field_is_refused() -> None:
    """serde derive: "duplicate field" (a struct read from JSON is no map: no last one wins)."""
    duplicated = (
        '{"tdl_context":{"package":"p","package":"q","task_func":"f"},"inputs":[],"outputs":[]}'
    )
    refused(graph(duplicated), "duplicate field `package`")
    refused(with_policy('{"max_num_retry":0,"max_num_retry":0,"max_num_instances":1}'), "duplicate")


def test_unknown_fields_are_ignored_in_every_struct() -> None:
    """No ``deny_unknown_fields`` anywhere in task_graph.rs: unknown keys (repeated or not) are
    skipped, and their values are not checked beyond being well-formed JSON."""
    text = graph(
        task(outputs=BOOL, extra=',"x":1,"x":"\\ud800","y":"\udcff","z":1e400'),
        task(BOOL, sources='[{"task_idx":0,"position":0,"w":null}]'),
        commit='{"tdl_context":{"package":"p","task_func":"c","v":2},"zz":{"a":[]}}',
    )
    assert decode(text).tasks[1].input_sources == (InputSource(0, 0),)
    refused(graph(task(extra=',"x":NaN')), "expected value")
    refused(graph(task(extra=',"\\ud800":1')), "lone leading surrogate")  # a key is always read


# --- integers ----------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["-0", "1.0", "1e0", '"1"', "-1", "4294967296", "true", "null"])
def test_a_u32_is_a_json_integer_within_range(value: str) -> None:
    """task_graph.rs:143 (``u32``): serde_json reads ``-0``, fractions and exponents as floats."""
    refused(with_policy(f'{{"max_num_retry":{value},"max_num_instances":1}}'), "invalid")


def test_integer_limits() -> None:
    """task_graph.rs:143/72/42: u32 up to 4294967295; u64 and usize beyond 2**64 - 1 refused."""
    policy = '{"max_num_retry":4294967295,"max_num_instances":1}'
    assert decode(with_policy(policy)).tasks[0].execution_policy.max_num_retry == 2**32 - 1
    timeouts = '{"max_num_retry":0,"max_num_instances":1,"timeout_policy":{"soft_timeout_ms":100,'
    refused(with_policy(timeouts + '"hard_timeout_ms":18446744073709551616}}'), "u64")
    refused(with_policy(timeouts + '"hard_timeout_ms":86400001}}'), "invalid timeout policy")
    big = "1" * 5000  # past Python's int-from-string limit: refused, not a crash
    refused(with_policy(f'{{"max_num_retry":{big},"max_num_instances":1}}'), "u32")
    refused(graph(task(outputs=BOOL), task(BOOL, sources="[[0.0,0]]")), "usize|u64")


def test_policies_are_validated_when_the_graph_is_built() -> None:
    """task_graph.rs:470 (termination tasks, TaskGraph::new) and 551 (insert_task)."""
    zero = '{"max_num_retry":0,"max_num_instances":0}'
    refused(with_policy(zero), r"failed to insert task \(index=0\).*`max_num_instances` must be")
    refused(
        graph(cleanup='{"tdl_context":["p","c"],"execution_policy":' + zero + "}"),
        "failed to create task graph during deserialization",
    )


# --- JSON as serde_json reads it ----------------------------------------------------------------


def test_nesting_is_limited_for_read_values_only() -> None:
    """serde_json's recursion limit (128, de.rs check_recursion): 121 nested ``List``s of a
    Boolean reach depth 127 (accepted), 122 reach 128 (refused); skipped values have no limit."""

    def nested(depth: int) -> str:
        return '{"Value":' + '{"List":' * depth + '{"Primitive":"Boolean"}' + "}" * depth + "}"

    assert decode(graph(task(nested(121)))).tasks[0].inputs
    refused(graph(task(nested(122))), "recursion limit exceeded")
    deep = "[" * 100_000 + "]" * 100_000
    assert decode(graph(task(extra=f',"x":{deep}'))).tasks


def test_only_json_whitespace_and_nothing_after_the_graph() -> None:
    """serde_json from_slice: whitespace is space, tab, CR and LF; then the end of input."""
    assert decode(" \t\r\n" + graph() + " \t\r\n").tasks
    refused("\ufeff" + graph(), "expected value")
    refused(graph() + " x", "trailing characters")
    refused(graph().replace(',"tasks"', ',\f"tasks"'), "key must be a string")


def test_an_empty_graph_and_a_wrong_input_count_are_refused() -> None:
    """RegisterJob (spider-storage): at least one task, and one payload per graph input."""
    refused(graph().replace(task(), ""), "task graph must contain at least one task")
    two_inputs = zstd(graph(task(BOOL + "," + BOOL)))
    with pytest.raises(InvalidTaskGraph, match="input size mismatch: expected 2, got 1"):
        decode_job_submission(two_inputs, _inputs(1))


def _inputs(count: int) -> bytes:
    frame = count.to_bytes(4, "little") + b"".join(b"\x01\x00\x00\x00\xc0" for _ in range(count))
    return zstandard.ZstdCompressor().compress(frame)
