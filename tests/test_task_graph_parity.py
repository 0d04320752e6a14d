"""Task graphs registered with Spider's real storage service and with the embedded engine (served
over gRPC, as ``coordinator spider serve`` does): each one accepted by both or refused by both
with INVALID_ARGUMENT ("bad request: …"), and as recorded here (issue 11).

The corpus is the edge cases of ``test_task_graph_rules.py`` and more: semver versions, null and
absent fields, every serde form of a struct and an enum, repeated and unknown keys, integers at
their limits, strings that are not Unicode, nesting at serde_json's recursion limit, zstd frames.
Both sides are sent the same bytes through the same client (``GrpcSpider``). Skipped where Spider's
storage service cannot run (``tests/spider_storage.py``; CI requires it).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import zstandard

from coordinator.engine.grpc_server import serve
from coordinator.spider.grpc.client import GrpcSpider
from coordinator.spider.port import InvalidArgument
from coordinator.store import migrate
from coordinator.store.database import create_database_engine
from tests.engine_support import running_engine
from tests.spider_storage import SpiderStorage
from tests.test_task_graph_rules import BOOL, graph, task, with_policy, zstd

ACCEPT, REFUSE = "accepted", "refused"


@dataclass(frozen=True)
class Case:
    name: str
    graph: bytes  # RegisterJob's compressed_serialized_task_graph
    inputs: int  # payloads sent (each the msgpack nil)
    expected: str


def _lists(depth: int, boolean: str = '{"Primitive":"Boolean"}') -> str:
    return '{"Value":' + '{"List":' * depth + boolean + "}" * depth + "}"


def _maps(depth: int) -> str:
    entry = '{"Map":{"key":{"Int":"Int8"},"value":'
    return '{"Value":' + entry * depth + '{"Primitive":"Boolean"}' + "}}" * depth + "}"


def _chain(second: str, outputs: str = BOOL) -> str:
    return graph(task(outputs=outputs), second)


VERSIONS = {
    ACCEPT: [
        "0.1.0", "0.1.7", "0.1.0+b.01", "0.1.5+x", "0.1.0+-", "0.1.0+00", "0.1.1+x.-",
        "0.1.18446744073709551615", "0.1.0+build-meta",
    ],
    REFUSE: [
        "0.1.0-alpha", "0.1.5-rc.1", "0.2.0-alpha", "0.1.0-0", "0.1.0-alpha+b", "0.1.0--",
        "0.1.0-0a", "0.1.0-00a", "0.1.0+", "0.1.0-", "0.1.0+a..b", "0.1.0-01", "0.1.0-a.01",
        "0.1.0-a.", "0.1.0-.a", "0.1.0-+b", "0.1.0-a!", "0.1.00", "00.1.0", "0.01.0",
        "0.1.18446744073709551616", "0.1.\uff19", "0.1.0+\u03b2", "0.1.0 ", " 0.1.0", "v0.1.0",
        "=0.1.0", "0.1", "0.", "0", "", "0.1.0.0", "0.0.9", "0.2.0", "1.1.0", "0.1.0\u0000",
        "18446744073709551615.1.0", "0.1." + "1" * 5000,
    ],
}  # fmt: skip

POLICY = '{"max_num_retry":0,"max_num_instances":1,"timeout_policy":{"soft_timeout_ms":100,'

TEXTS: list[tuple[str, str, int, str]] = [
    # the top level
    ("a minimal graph", graph(), 0, ACCEPT),
    (
        "whitespace everywhere",
        " \t\r\n" + graph().replace(",", " ,\n ").replace(":", " : "),
        0,
        ACCEPT,
    ),
    ("no task", graph().replace(task(), ""), 0, REFUSE),
    ("a repeated top-level key", graph(extra=',"commit_task":null'), 0, REFUSE),
    (
        "a key repeated through an escape",
        graph().replace('"tasks"', '"schema\\u005fversion":"0.1.0","tasks"'),
        0,
        REFUSE,
    ),
    ("a key written with an escape", graph().replace('"tasks"', '"t\\u0061sks"'), 0, ACCEPT),
    ("an unknown top-level key", graph(extra=',"x":1'), 0, REFUSE),
    ("cleanup_task absent", graph().replace(',"cleanup_task":null', ""), 0, REFUSE),
    ("the top level an array", "[]", 0, REFUSE),
    ("tasks null", graph().replace('"tasks":[', '"tasks":null,"x":[', 1), 0, REFUSE),
    ("the version a number", graph(version="0.1"), 0, REFUSE),
    ("the version null", graph(version="null"), 0, REFUSE),
    ("the version escaped", graph(version='"0.\\u0031.0"'), 0, ACCEPT),
    ("trailing characters", graph() + " x", 0, REFUSE),
    ("a trailing NUL", graph() + "\u0000", 0, REFUSE),
    ("a BOM", "\ufeff" + graph(), 0, REFUSE),
    ("a trailing comma", graph()[:-1] + ",}", 0, REFUSE),
    ("a form feed as whitespace", graph().replace(',"tasks"', ',\f"tasks"'), 0, REFUSE),
    ("a no-break space as whitespace", graph().replace(',"tasks"', ',\u00a0"tasks"'), 0, REFUSE),
    # null and absent
    ("execution_policy null", graph(task(extra=',"execution_policy":null')), 0, ACCEPT),
    ("timeout_policy absent", with_policy('{"max_num_retry":0,"max_num_instances":1}'), 0, ACCEPT),
    (
        "timeout_policy null",
        with_policy('{"max_num_retry":0,"max_num_instances":1,"timeout_policy":null}'),
        0,
        REFUSE,
    ),
    (
        "a termination timeout_policy null",
        graph(
            cleanup='{"tdl_context":["",""],"execution_policy":{"max_num_retry":0,"max_num_instances":1,"timeout_policy":null}}'
        ),
        0,
        REFUSE,
    ),
    ("max_num_instances absent", with_policy('{"max_num_retry":0}'), 0, REFUSE),
    ("an empty policy", with_policy("{}"), 0, REFUSE),
    (
        "input_sources absent on a second input task",
        _chain(
            '{"tdl_context":{"package":"p","task_func":"f"},"inputs":[' + BOOL + '],"outputs":[]}'
        ),
        1,
        ACCEPT,
    ),
    (
        "inputs absent",
        graph('{"tdl_context":{"package":"p","task_func":"f"},"outputs":[]}'),
        0,
        REFUSE,
    ),
    ("inputs null", graph('{"tdl_context":["p","f"],"inputs":null,"outputs":[]}'), 0, REFUSE),
    ("outputs a map", graph('{"tdl_context":["p","f"],"inputs":[],"outputs":{}}'), 0, REFUSE),
    ("commit_task empty", graph(commit="{}"), 0, REFUSE),
    # input sources
    ("input_sources [] without inputs", graph(task(), task(sources="[]")), 0, REFUSE),
    ("a source naming its own task", _chain(task(BOOL, BOOL, sources="[[1,0]]")), 0, REFUSE),
    ("a source naming a missing output", _chain(task(BOOL, sources="[[0,1]]")), 0, REFUSE),
    ("fewer sources than inputs", _chain(task(BOOL + "," + BOOL, sources="[[0,0]]")), 0, REFUSE),
    (
        "a source with an unknown key",
        _chain(task(BOOL, sources='[{"task_idx":0,"position":0,"w":"\\ud800"}]')),
        0,
        ACCEPT,
    ),
    (
        "a source with a repeated key",
        _chain(task(BOOL, sources='[{"task_idx":0,"task_idx":0,"position":0}]')),
        0,
        REFUSE,
    ),
    ("a source without position", _chain(task(BOOL, sources='[{"task_idx":0}]')), 0, REFUSE),
    ("a source array too long", _chain(task(BOOL, sources="[[0,0,1]]")), 0, REFUSE),
    ("input_sources a map", _chain(task(BOOL, sources="{}")), 0, REFUSE),
    ("a float source index", _chain(task(BOOL, sources="[[0.0,0]]")), 0, REFUSE),
    (
        "a source index of u64::MAX",
        _chain(task(BOOL, sources="[[18446744073709551615,0]]")),
        0,
        REFUSE,
    ),
    (
        "a source index past u64",
        _chain(task(BOOL, sources="[[18446744073709551616,0]]")),
        0,
        REFUSE,
    ),
    (
        "two input tasks and a chained one",
        graph(task(BOOL + "," + BOOL, BOOL), task(BOOL), task(BOOL, sources="[[0,0]]")),
        3,
        ACCEPT,
    ),
    (
        "one payload too many",
        graph(task(BOOL + "," + BOOL, BOOL), task(BOOL), task(BOOL, sources="[[0,0]]")),
        4,
        REFUSE,
    ),
    # TdlContext
    (
        "an empty package and task_func",
        graph('{"tdl_context":{"package":"","task_func":""},"inputs":[],"outputs":[]}'),
        0,
        ACCEPT,
    ),
    (
        "tdl_context as an array",
        graph('{"tdl_context":["p","f"],"inputs":[],"outputs":[]}'),
        0,
        ACCEPT,
    ),
    (
        "tdl_context array too long",
        graph('{"tdl_context":["p","f","g"],"inputs":[],"outputs":[]}'),
        0,
        REFUSE,
    ),
    (
        "a repeated package",
        graph(
            '{"tdl_context":{"package":"p","package":"q","task_func":"f"},"inputs":[],"outputs":[]}'
        ),
        0,
        REFUSE,
    ),
    (
        "tdl_context with an unknown key",
        graph('{"tdl_context":{"package":"p","task_func":"f","v":2},"inputs":[],"outputs":[]}'),
        0,
        ACCEPT,
    ),
    (
        "a numeric package",
        graph('{"tdl_context":{"package":1,"task_func":"f"},"inputs":[],"outputs":[]}'),
        0,
        REFUSE,
    ),
    ("a lone surrogate in a package", graph(task().replace('"p"', '"p\\ud800"')), 0, REFUSE),
    (
        "raw UTF-8 and a surrogate pair",
        graph(task('{"Value":{"Struct":"\u00e9\U0001f600\\ud83d\\ude00"}}')),
        1,
        ACCEPT,
    ),
    ("a lone low surrogate", graph(task('{"Value":{"Struct":"\\ude00"}}')), 1, REFUSE),
    ("a high surrogate then A", graph(task('{"Value":{"Struct":"\\ud83d\\u0041"}}')), 1, REFUSE),
    (
        "an encoded surrogate (invalid UTF-8)",
        graph(task('{"Value":{"Struct":"\udced\udca0\udc80"}}')),
        1,
        REFUSE,
    ),
    ("a NUL escape", graph(task('{"Value":{"Struct":"\\u0000"}}')), 1, ACCEPT),
    # data types
    ("Boolean", graph(task(BOOL)), 1, ACCEPT),
    ("Boolean as a map", graph(task('{"Value":{"Primitive":{"Boolean":null}}}')), 1, ACCEPT),
    ("Int32 as a map", graph(task('{"Value":{"Primitive":{"Int":{"Int32":null}}}}')), 1, ACCEPT),
    (
        "Float64 as a map",
        graph(task('{"Value":{"Primitive":{"Float":{"Float64":null}}}}')),
        1,
        ACCEPT,
    ),
    ("Bytes as an array", graph(task('{"Value":{"Bytes":[]}}')), 1, ACCEPT),
    ("Bytes with unknown keys", graph(task('{"Value":{"Bytes":{"a":1,"a":2}}}')), 1, ACCEPT),
    ("Bytes null", graph(task('{"Value":{"Bytes":null}}')), 1, REFUSE),
    ("Bytes [1]", graph(task('{"Value":{"Bytes":[1]}}')), 1, REFUSE),
    ("Map as an array", graph(task('{"Value":{"Map":[{"Int":"Int8"},{"Bytes":{}}]}}')), 1, ACCEPT),
    (
        "Map with an unknown key",
        graph(task('{"Value":{"Map":{"key":{"Int":"Int8"},"value":{"Bytes":{}},"z":[1]}}}')),
        1,
        ACCEPT,
    ),
    (
        "Map with a repeated key",
        graph(
            task(
                '{"Value":{"Map":{"key":{"Int":"Int8"},"key":{"Int":"Int8"},"value":{"Bytes":{}}}}}'
            )
        ),
        1,
        REFUSE,
    ),
    ("Map without value", graph(task('{"Value":{"Map":{"key":{"Int":"Int8"}}}}')), 1, REFUSE),
    (
        "a Float map key",
        graph(task('{"Value":{"Map":{"key":{"Float":"Float32"},"value":{"Bytes":{}}}}}')),
        1,
        REFUSE,
    ),
    (
        "a Bytes map key null",
        graph(task('{"Value":{"Map":{"key":{"Bytes":null},"value":"x"}}}')),
        1,
        REFUSE,
    ),
    ("Map as a string", graph(task('{"Value":"Map"}')), 1, REFUSE),
    ("Value as a string", graph(task('"Value"')), 1, REFUSE),
    ("Value null", graph(task('{"Value":null}')), 1, REFUSE),
    ("an empty descriptor", graph(task("{}")), 1, REFUSE),
    ("an enum with two keys", graph(task('{"Value":{"Primitive":"Boolean"},"x":1}')), 1, REFUSE),
    (
        "Int with two variants",
        graph(task('{"Value":{"Primitive":{"Int":{"Int32":null,"Int64":null}}}}')),
        1,
        REFUSE,
    ),
    ("a unit variant with a map", graph(task('{"Value":{"Primitive":{"Boolean":{}}}}')), 1, REFUSE),
    ("a lowercase variant", graph(task('{"Value":{"Primitive":"boolean"}}')), 1, REFUSE),
    ("Float named Int32", graph(task('{"Value":{"Primitive":{"Float":"Int32"}}}')), 1, REFUSE),
    ("List as a string", graph(task('{"Value":"List"}')), 1, REFUSE),
    ("a Struct named with a space", graph(task('{"Value":{"Struct":" "}}')), 1, ACCEPT),
    ("an empty Struct name", graph(task('{"Value":{"Struct":""}}')), 1, REFUSE),
    ("a numeric Struct name", graph(task('{"Value":{"Struct":1}}')), 1, REFUSE),
    ("a boolean Struct name", graph(task('{"Value":{"Struct":true}}')), 1, REFUSE),
    (
        "spaces inside a descriptor",
        graph(task('{ "Value" : { "Primitive" : { "Boolean" : null } } }')),
        1,
        ACCEPT,
    ),
    (
        "Booleans of both forms chained",
        _chain(task('{"Value":{"Primitive":{"Boolean":null}}}', sources="[[0,0]]")),
        0,
        ACCEPT,
    ),
    (
        "Maps of both forms chained",
        _chain(
            task('{"Value":{"Map":[{"Bytes":[]},{"Bytes":{}}]}}', sources="[[0,0]]"),
            '{"Value":{"Map":{"key":{"Bytes":{}},"value":{"Bytes":{"q":1}}}}}',
        ),
        0,
        ACCEPT,
    ),
    (
        "SharedValue fed by a Value",
        _chain(task('{"SharedValue":{"Primitive":"Boolean"}}', sources="[[0,0]]")),
        0,
        REFUSE,
    ),
    # structs as arrays
    ("a task as an array", graph('[["p","f"],null,[],[],null]'), 0, ACCEPT),
    ("a task array with a policy", graph('[["p","f"],[1,2,[100,200]],[],[],null]'), 0, ACCEPT),
    ("a task array without input_sources", graph('[["p","f"],null,[],[]]'), 0, REFUSE),
    ("a task array too long", graph('[["p","f"],null,[],[],null,1]'), 0, REFUSE),
    ("a policy as an array of two", with_policy("[0,1]"), 0, ACCEPT),
    ("a policy as an array of one", with_policy("[0]"), 0, REFUSE),
    ("a commit task as an array", graph(commit='[["p","c"]]'), 0, ACCEPT),
    ("a commit task array with a policy", graph(commit='[["p","c"],[0,1]]'), 0, ACCEPT),
    ("a commit task array too long", graph(commit='[["p","c"],null,1]'), 0, REFUSE),
    ("an empty commit task array", graph(commit="[]"), 0, REFUSE),
    (
        "a commit task with an unknown key",
        graph(commit='{"tdl_context":["p","c"],"zz":{"a":[]}}'),
        0,
        ACCEPT,
    ),
    # integers and policies
    (
        "u32::MAX retries",
        with_policy('{"max_num_retry":4294967295,"max_num_instances":1}'),
        0,
        ACCEPT,
    ),
    (
        "retries past u32",
        with_policy('{"max_num_retry":4294967296,"max_num_instances":1}'),
        0,
        REFUSE,
    ),
    ("retries 1.0", with_policy('{"max_num_retry":1.0,"max_num_instances":1}'), 0, REFUSE),
    ("retries 1e0", with_policy('{"max_num_retry":1e0,"max_num_instances":1}'), 0, REFUSE),
    ("retries -0", with_policy('{"max_num_retry":-0,"max_num_instances":1}'), 0, REFUSE),
    ("retries -1", with_policy('{"max_num_retry":-1,"max_num_instances":1}'), 0, REFUSE),
    ('retries "1"', with_policy('{"max_num_retry":"1","max_num_instances":1}'), 0, REFUSE),
    (
        "retries of 5,000 digits",
        with_policy('{"max_num_retry":' + "1" * 5000 + ',"max_num_instances":1}'),
        0,
        REFUSE,
    ),
    (
        "a repeated retry count",
        with_policy('{"max_num_retry":0,"max_num_retry":0,"max_num_instances":1}'),
        0,
        REFUSE,
    ),
    ("no instance", with_policy('{"max_num_retry":0,"max_num_instances":0}'), 0, REFUSE),
    (
        "a commit task without instance",
        graph(
            commit='{"tdl_context":["",""],"execution_policy":{"max_num_retry":0,"max_num_instances":0}}'
        ),
        0,
        REFUSE,
    ),
    (
        "timeouts at their bounds",
        with_policy(POLICY + '"hard_timeout_ms":86400000,"x":null}}'),
        0,
        ACCEPT,
    ),
    (
        "a soft timeout of 99 ms",
        with_policy(POLICY.replace(":100,", ":99,") + '"hard_timeout_ms":300}}'),
        0,
        REFUSE,
    ),
    (
        "equal timeouts",
        with_policy(POLICY.replace(":100,", ":300,") + '"hard_timeout_ms":300}}'),
        0,
        REFUSE,
    ),
    ("a hard timeout past 24 h", with_policy(POLICY + '"hard_timeout_ms":86400001}}'), 0, REFUSE),
    (
        "a timeout past u64",
        with_policy(POLICY + '"hard_timeout_ms":18446744073709551616}}'),
        0,
        REFUSE,
    ),
    ("a timeout policy as an array", with_policy("[0,1,[100,200]]"), 0, ACCEPT),
    # skipped values
    ("invalid UTF-8 in an unknown value", graph(task(extra=',"x":"\udcff\udcfe"')), 0, ACCEPT),
    ("a lone surrogate in an unknown value", graph(task(extra=',"x":"\\ud800"')), 0, ACCEPT),
    ("a lone surrogate in an unknown key", graph(task(extra=',"\\ud800":1')), 0, REFUSE),
    ("invalid UTF-8 in an unknown key", graph(task(extra=',"\udcff":1')), 0, REFUSE),
    (
        "a lone surrogate in a key of an unknown value",
        graph(task(extra=',"x":{"\\ud800":1}')),
        0,
        ACCEPT,
    ),
    (
        "invalid UTF-8 in a key of an unknown value",
        graph(task(extra=',"x":{"\udcff":1}')),
        0,
        ACCEPT,
    ),
    ("an empty unknown key", graph(task(extra=',"":1')), 0, ACCEPT),
    ("NaN in an unknown value", graph(task(extra=',"x":NaN')), 0, REFUSE),
    ("1e400 in an unknown value", graph(task(extra=',"x":1e400')), 0, ACCEPT),
    ("-0.0e-5 in an unknown value", graph(task(extra=',"x":-0.0e-5')), 0, ACCEPT),
    ("1E+5 in an unknown value", graph(task(extra=',"x":1E+5')), 0, ACCEPT),
    ("1.e5 in an unknown value", graph(task(extra=',"x":1.e5')), 0, REFUSE),
    ("01 in an unknown value", graph(task(extra=',"x":01')), 0, REFUSE),
    ("- in an unknown value", graph(task(extra=',"x":-')), 0, REFUSE),
    ("tru in an unknown value", graph(task(extra=',"x":tru')), 0, REFUSE),
    ("5,000 digits in an unknown value", graph(task(extra=',"x":' + "1" * 5000)), 0, ACCEPT),
    ("a tab in an unknown string", graph(task(extra=',"x":"a\tb"')), 0, REFUSE),
    ("a bad escape in an unknown string", graph(task(extra=',"x":"\\x"')), 0, REFUSE),
    ("a short hex escape in an unknown string", graph(task(extra=',"x":"\\u12"')), 0, REFUSE),
    (
        "100,000 nested lists in an unknown value",
        graph(task(extra=',"x":' + "[" * 100_000 + "]" * 100_000)),
        0,
        ACCEPT,
    ),
    (
        "20,000 nested maps in an unknown value",
        graph(task(extra=',"x":' + '{"a":' * 20_000 + "[]" + "}" * 20_000)),
        0,
        ACCEPT,
    ),
    # serde_json's recursion limit
    ("121 nested lists", graph(task(_lists(121))), 1, ACCEPT),
    ("122 nested lists", graph(task(_lists(122))), 1, REFUSE),
    (
        "121 nested lists in an array task",
        graph(f'[["p","f"],null,[{_lists(121)}],[],null]'),
        1,
        ACCEPT,
    ),
    (
        "122 nested lists in an array task",
        graph(f'[["p","f"],null,[{_lists(122)}],[],null]'),
        1,
        REFUSE,
    ),
    (
        "120 nested lists, Boolean as a map",
        graph(task(_lists(120, '{"Primitive":{"Boolean":null}}'))),
        1,
        ACCEPT,
    ),
    (
        "121 nested lists, Boolean as a map",
        graph(task(_lists(121, '{"Primitive":{"Boolean":null}}'))),
        1,
        REFUSE,
    ),
    ("60 nested maps", graph(task(_maps(60))), 1, ACCEPT),
    ("61 nested maps", graph(task(_maps(61))), 1, REFUSE),
]


def _corpus() -> list[Case]:
    cases = [Case(name, zstd(text), inputs, expected) for name, text, inputs, expected in TEXTS]
    cases += [
        Case(f"version {version!r}"[:60], zstd(graph(version=json.dumps(version))), 0, expected)
        for expected, versions in VERSIONS.items()
        for version in versions
    ]
    good = graph().encode()
    compressor = zstandard.ZstdCompressor()
    cases += [
        Case("a graph not zstd", b"not zstd", 0, REFUSE),
        Case("an empty graph payload", b"", 0, REFUSE),
        Case(
            "two zstd frames",
            compressor.compress(good[:50]) + compressor.compress(good[50:]),
            0,
            ACCEPT,
        ),
        Case("garbage after the zstd frame", compressor.compress(good) + b"xx", 0, REFUSE),
    ]
    return cases


CORPUS = _corpus()


def _inputs(count: int) -> bytes:
    frame = count.to_bytes(4, "little") + b"\x01\x00\x00\x00\xc0" * count
    return zstandard.ZstdCompressor().compress(frame)


def _outcomes(client: GrpcSpider) -> dict[str, str]:
    group = client.add_resource_group("parity", b"parity")
    outcomes = {}
    for case in CORPUS:
        try:
            client.register_job(group, case.graph, _inputs(case.inputs))
            outcomes[case.name] = ACCEPT
        except InvalidArgument as error:
            assert str(error).startswith("bad request: "), (case.name, str(error))
            outcomes[case.name] = REFUSE
    return outcomes


@pytest.fixture(scope="module")
def served_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GrpcSpider]:
    """The embedded engine behind ``coordinator spider serve``'s gRPC server."""
    directory = tmp_path_factory.mktemp("embedded")
    engine = create_database_engine(f"sqlite:///{directory / 'engine.db'}")
    migrate.upgrade(engine)
    try:
        with running_engine(engine, directory / "work") as embedded:
            server = serve(embedded, "127.0.0.1", 0)
            try:
                with GrpcSpider("127.0.0.1", server.port, max_retries=0) as client:
                    yield client
            finally:
                server.stop(0)
    finally:
        engine.dispose()


def test_the_corpus_names_each_case_once() -> None:
    assert len({case.name for case in CORPUS}) == len(CORPUS)


def test_spider_and_the_embedded_engine_accept_and_refuse_the_same_graphs(
    spider_storage: SpiderStorage, served_engine: GrpcSpider
) -> None:
    with spider_storage.client() as real:
        spider = _outcomes(real)
    embedded = _outcomes(served_engine)
    expected = {case.name: case.expected for case in CORPUS}
    assert {
        name: (spider[name], embedded[name]) for name in expected if spider[name] != embedded[name]
    } == {}
    assert {name: spider[name] for name in expected if spider[name] != expected[name]} == {}
    assert spider_storage.running, "Spider's storage service stopped while parsing the corpus"
