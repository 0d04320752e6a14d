"""Spider's task graph: its JSON schema, CLP's compression graph, and the RegisterJob payloads.

``RegisterJobRequest.compressed_serialized_task_graph`` is zstd of the graph's compact JSON
(``docs/spider.md``, Task graph; vector ``vectors/task_graph.json``). ``decode_task_graph`` parses
it as Spider's server does (``TaskGraph::from_zstd_compressed_json``, spider-core task_graph.rs):
the same graphs accepted, the same refused, with Spider's kind of message ("bad request: …"). The
rules (each with its upstream line at "How Spider parses a graph" below):

* top level: a JSON object with exactly ``schema_version``, ``tasks``, ``commit_task``,
  ``cleanup_task`` (the last two may be ``null``); no other key, none repeated; ``schema_version``
  a semver version matching ``>=0.1.0,<0.2.0`` as the ``semver`` crate matches (build metadata
  ignored, every pre-release refused);
* a task: ``tdl_context {package, task_func}`` (any strings, empty ones too), optional
  ``execution_policy`` (absent or ``null``: the default; validated), ``inputs`` and ``outputs``
  (data type descriptors, in any form serde accepts, compared as values), ``input_sources``:
  ``null``/absent for an input task, else one ``{task_idx, position}`` per input (at least one)
  naming an **earlier** task's output with an **equal** descriptor;
* every struct also in array form, unknown keys ignored, repeated keys refused, integers as JSON
  integers within their Rust type (no ``1.0``, ``-0``, ``"1"``), containers nested at most 127 deep;
* at least one task (RegisterJob's check); the job's inputs are the inputs of every input task
  (task order, then position) and must match the number of payloads; the graph outputs are the
  outputs of every task without children.

CLP's graph (``build_compression_job``): one ``clp``/``compression::clp_s_s3_compress`` input task
per partition with inputs ``ClpSCompressionOption``, ``Option<String>``, ``S3InputSource`` and
output ``CompressionTaskOutput``, the ``compression::commit`` commit task; its job inputs are
``[option, dataset, source]`` per task.

**The cleanup task.** CLP's Rust coordinator sends ``cleanup_task: null``; the coordinator's graphs
carry ``clp``/``compression::cleanup`` (``cleanup_task=False`` gives CLP's graph byte for byte).
Spider's CancelJob is unconditional, and without a cleanup task it is fatal in ``CommitReady`` (the
storage server shuts down), a state a Running job enters on its own at any moment: no state read
before the call can make it safe. With a cleanup task Spider cancels ``Running`` and ``CommitReady``
jobs alike (→ ``CleanupReady``, the cleanup runs, → ``Cancelled``; its failure → ``Failed``), so
cancelling is safe in every state a started job can be in; only ``Ready`` becomes fatal, and only
the coordinator moves a job out of ``Ready`` (``coordinator.spider.port``). What it costs
(``docs/spider.md``, Outputs and the termination tasks): Spider gives the cleanup no inputs, and its
own executor rejects an input buffer under 4 bytes, and CLP's Rust package (``clp-tdl-package``) has
no ``compression::cleanup``; on a cluster a cancelled job may therefore end ``Failed`` (the
cleanup's failure) instead of ``Cancelled``, which the coordinator handles as any Spider failure.
The embedded engine and ``coordinator spider serve`` run this package's cleanup
(``coordinator.engine.tasks.cleanup``).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from coordinator.errors import CoordinatorError
from coordinator.spider.policy import (
    DEFAULT_POLICY,
    ExecutionPolicy,
    InvalidExecutionPolicy,
    TimeoutPolicy,
    compression_task_policy,
)
from coordinator.spider.wire import InvalidFrame, compress, decode_job_inputs, decompress
from coordinator.spider.wire import encode_job_inputs as _encode_job_inputs
from coordinator.task_io import ClpSCompressionOption, S3InputSource, encode_dataset

SCHEMA_VERSION = "0.1.0"
CLP_PACKAGE = "clp"
COMPRESS_TASK = "compression::clp_s_s3_compress"
COMMIT_TASK = "compression::commit"
CLEANUP_TASK = "compression::cleanup"
COMPRESS_INPUT_TYPES = ("ClpSCompressionOption", "Option<String>", "S3InputSource")
COMPRESS_OUTPUT_TYPE = "CompressionTaskOutput"

_INT_TYPES = frozenset({"Int8", "Int16", "Int32", "Int64"})
_FLOAT_TYPES = frozenset({"Float32", "Float64"})

DataType = dict[str, Any]
"""A data type descriptor as Spider's JSON writes it, e.g. ``{"Value": {"Struct": "X"}}``."""


class InvalidTaskGraph(CoordinatorError, ValueError):
    """A graph (or its job inputs) Spider would refuse with INVALID_ARGUMENT ("bad request: …")."""


def struct_value(name: str) -> DataType:
    """The descriptor of a by-value struct named ``name`` (names are opaque labels to Spider)."""
    return {"Value": {"Struct": name}}


@dataclass(frozen=True)
class TdlContext:
    """Which task function of which TDL package runs."""

    package: str
    task_func: str

    def to_json(self) -> dict[str, str]:
        """Spider's JSON form."""
        return {"package": self.package, "task_func": self.task_func}


@dataclass(frozen=True)
class InputSource:
    """An input fed by output ``position`` of the earlier task ``task_idx``."""

    task_idx: int
    position: int


@dataclass(frozen=True)
class TaskDescriptor:
    """One regular task of the graph."""

    tdl_context: TdlContext
    inputs: tuple[DataType, ...]
    outputs: tuple[DataType, ...]
    execution_policy: ExecutionPolicy = DEFAULT_POLICY
    input_sources: tuple[InputSource, ...] | None = None

    def to_json(self) -> dict[str, Any]:
        """Spider's JSON form; a policy equal to Spider's default is left out, as Spider does."""
        encoded: dict[str, Any] = {"tdl_context": self.tdl_context.to_json()}
        if self.execution_policy != DEFAULT_POLICY:
            encoded["execution_policy"] = self.execution_policy.to_json()
        encoded["inputs"] = list(self.inputs)
        encoded["outputs"] = list(self.outputs)
        encoded["input_sources"] = (
            None
            if self.input_sources is None
            else [{"task_idx": s.task_idx, "position": s.position} for s in self.input_sources]
        )
        return encoded


@dataclass(frozen=True)
class TerminationTask:
    """The commit or cleanup task."""

    tdl_context: TdlContext
    execution_policy: ExecutionPolicy | None = None

    def to_json(self) -> dict[str, Any]:
        """Spider's JSON form."""
        encoded: dict[str, Any] = {"tdl_context": self.tdl_context.to_json()}
        if self.execution_policy is not None:
            encoded["execution_policy"] = self.execution_policy.to_json()
        return encoded


@dataclass(frozen=True)
class TaskGraph:
    """A Spider task graph: regular tasks in topological order, and the termination tasks."""

    tasks: tuple[TaskDescriptor, ...]
    commit_task: TerminationTask | None = None
    cleanup_task: TerminationTask | None = None
    schema_version: str = SCHEMA_VERSION

    def to_json(self) -> dict[str, Any]:
        """The graph as Spider's JSON value (keys in serde_json's order)."""
        return {
            "schema_version": self.schema_version,
            "tasks": [task.to_json() for task in self.tasks],
            "commit_task": None if self.commit_task is None else self.commit_task.to_json(),
            "cleanup_task": None if self.cleanup_task is None else self.cleanup_task.to_json(),
        }

    def to_json_text(self) -> str:
        """serde_json's compact text of the graph."""
        return json.dumps(self.to_json(), separators=(",", ":"), ensure_ascii=False)

    def compressed(self) -> bytes:
        """``compressed_serialized_task_graph``: zstd of the JSON text (made once per graph)."""
        return self._compressed

    @functools.cached_property
    def _compressed(self) -> bytes:
        return compress(self.to_json_text().encode())

    @property
    def input_tasks(self) -> tuple[int, ...]:
        """Indices of the tasks whose inputs are all job inputs."""
        return tuple(i for i, task in enumerate(self.tasks) if task.input_sources is None)

    @property
    def num_job_inputs(self) -> int:
        """How many payloads RegisterJob must carry."""
        return sum(len(self.tasks[i].inputs) for i in self.input_tasks)

    @property
    def output_tasks(self) -> tuple[int, ...]:
        """Indices of the tasks without children: their outputs are the graph outputs."""
        parents = {source.task_idx for task in self.tasks for source in task.input_sources or ()}
        return tuple(i for i in range(len(self.tasks)) if i not in parents)


@dataclass(frozen=True)
class JobSubmission:
    """What RegisterJob carries: the graph and the job's input payloads, in order."""

    task_graph: TaskGraph
    inputs: tuple[bytes, ...] = field(default=())

    def compressed_task_graph(self) -> bytes:
        """``RegisterJobRequest.compressed_serialized_task_graph`` (made once: the submitter
        weighs it before it registers it)."""
        return self._compressed_task_graph

    def compressed_inputs(self) -> bytes:
        """``RegisterJobRequest.compressed_serialized_inputs`` (made once, as the graph)."""
        return self._compressed_inputs

    @functools.cached_property
    def _compressed_task_graph(self) -> bytes:
        return self.task_graph.compressed()

    @functools.cached_property
    def _compressed_inputs(self) -> bytes:
        return _encode_job_inputs(self.inputs)


def build_compression_job(
    sources: Sequence[S3InputSource],
    option: ClpSCompressionOption,
    dataset: str | None,
    *,
    compression_task_max_retry: int,
    commit_policy: ExecutionPolicy,
    cleanup_task: bool = True,
) -> JobSubmission:
    """CLP's compression job: one compress task per partition (``sources``) and the commit task;
    with ``cleanup_task`` (the default), the ``compression::cleanup`` task with the commit's policy
    (module docstring); without, CLP's graph exactly.

    Raises ``InvalidTaskGraph`` for no partitions, ``InvalidExecutionPolicy`` for a retry count
    outside u32, and ``WireFormatError`` for a source whose authentication tasks cannot receive.
    """
    if not sources:
        raise InvalidTaskGraph("task graph must contain at least one task")
    option_payload, dataset_payload = option.to_msgpack(), encode_dataset(dataset)
    inputs: list[bytes] = []
    for source in sources:
        inputs += [option_payload, dataset_payload, source.to_msgpack()]
    policies = tuple(
        compression_task_policy(len(source.object_keys), compression_task_max_retry)
        for source in sources
    )
    return JobSubmission(_compression_graph(policies, commit_policy, cleanup_task), tuple(inputs))


@functools.lru_cache(maxsize=256)
def _compression_graph(
    policies: tuple[ExecutionPolicy, ...], commit_policy: ExecutionPolicy, cleanup_task: bool
) -> TaskGraph:
    """The graph of ``build_compression_job``, one compress task per policy. Jobs of one shape
    (as many partitions, as many objects in each) share one graph, which they never change
    (frozen): its JSON text and zstd frame are then made once for all (``TaskGraph.compressed``)."""
    tasks = tuple(
        TaskDescriptor(
            tdl_context=TdlContext(CLP_PACKAGE, COMPRESS_TASK),
            inputs=tuple(struct_value(name) for name in COMPRESS_INPUT_TYPES),
            outputs=(struct_value(COMPRESS_OUTPUT_TYPE),),
            execution_policy=policy,
        )
        for policy in policies
    )
    return TaskGraph(
        tasks=tasks,
        commit_task=TerminationTask(TdlContext(CLP_PACKAGE, COMMIT_TASK), commit_policy),
        cleanup_task=TerminationTask(TdlContext(CLP_PACKAGE, CLEANUP_TASK), commit_policy)
        if cleanup_task
        else None,
    )


_GRAPH_REFUSED = "bad request: failed to deserialize the compressed task graph: "
"""Spider's message for a graph it cannot read, then the error's type and text, as its
``TaskGraph::from_zstd_compressed_json`` error displays them (measured against Spider's storage
binary): ``crate::compression::Error`` for zstd, ``serde_json::Error`` for the JSON and every rule
checked while deserializing. The zstd reason is libzstd's; serde_json's text and its ``at line L
column C`` are this module's reading of serde_json's (positions may differ by a character)."""


def decode_task_graph(compressed: bytes) -> TaskGraph:
    """Parse ``compressed_serialized_task_graph`` as Spider's server does (see "How Spider parses
    a graph" below).

    Raises ``InvalidTaskGraph`` with Spider's kind of message for anything it would refuse
    (including an empty task list, which RegisterJob refuses).
    """
    try:
        text = decompress(compressed, "the task graph")
    except InvalidFrame as error:
        raise InvalidTaskGraph(
            f"{_GRAPH_REFUSED}`crate::compression::Error`: {error.reason}"
        ) from error
    graph = _parse_graph(text)
    if not graph.tasks:
        raise InvalidTaskGraph("bad request: task graph must contain at least one task")
    return graph


_decoded_graph = functools.lru_cache(maxsize=32)(decode_task_graph)
"""``decode_task_graph`` for RegisterJob, remembered per payload: a coordinator sends the same graph
for every job of one shape (only the inputs differ), and parsing it was about a quarter of the
embedded engine's CPU per registration. A refused graph raises every time (exceptions are not
cached). The graphs returned are shared: callers must not modify them."""


def decode_job_submission(compressed_graph: bytes, compressed_inputs: bytes) -> JobSubmission:
    """Both RegisterJob payloads, checked against each other as Spider does.

    Raises ``InvalidTaskGraph`` for a bad graph, undecodable inputs, or an input count that differs
    from the graph's ("task graph input size mismatch").
    """
    graph = _decoded_graph(compressed_graph)
    try:
        inputs = decode_job_inputs(compressed_inputs)
    except InvalidFrame as error:
        raise InvalidTaskGraph(
            f"bad request: failed to deserialize the job inputs: {error.reason}"
        ) from error
    if len(inputs) != graph.num_job_inputs:
        raise InvalidTaskGraph(
            f"bad request: task graph input size mismatch: expected {graph.num_job_inputs}, "
            f"got {len(inputs)}"
        )
    return JobSubmission(graph, tuple(inputs))


# --- How Spider parses a graph ------------------------------------------------------------------
#
# Spider's server runs ``TaskGraph::from_zstd_compressed_json`` (task_graph.rs:439): serde_json's
# ``from_slice`` straight into serde-derived types, then the graph's own checks. What that
# accepts, rule by rule (task_graph.rs lines; serde_json's de.rs/read.rs for the JSON level):
#
# * JSON as serde_json reads it: whitespace is space, tab, CR, LF only; no BOM, NaN or Infinity;
#   nothing but whitespace after the graph. Strings that are deserialized (every key and every
#   string value of a known field) must be valid UTF-8 with paired surrogate escapes; values of
#   unknown fields are skipped without that check, and without a depth limit, but must still be
#   well-formed JSON. Known containers nest at most 127 deep (serde_json's recursion limit: each
#   map, list, struct and ``{…}`` enum counts).
# * Structs (TdlContext, ExecutionPolicy, TimeoutPolicy, TaskInputOutputIndex, TaskDescriptor,
#   TerminationTaskDescriptor, BytesTypeDescriptor, the Map variant) are serde-derived without
#   ``deny_unknown_fields``: unknown keys are ignored, a repeated known key is an error
#   ("duplicate field"), and a JSON array of the fields in declaration order is accepted too
#   (fields with ``#[serde(default)]`` may be left off the end; an ``Option`` without it may not).
#   In map form a missing ``Option`` field is ``None``, a missing ``#[serde(default)]`` field its
#   default, and any other missing field an error.
# * The top level is a hand-written visitor (task_graph.rs:969): a JSON object only, its four keys
#   all required (``commit_task``/``cleanup_task`` may be null), unknown or repeated keys refused.
# * Enums are externally tagged: a unit variant is ``"Name"`` or ``{"Name": null}``, a newtype or
#   struct variant ``{"Name": …}`` (exactly one key).
# * Integers: ``u32`` (retries, instances), ``u64`` (timeouts), ``usize`` (source indices): a JSON
#   integer without sign, fraction or exponent, within range (``-0``, ``1.0``, ``1e3``, ``"1"``
#   are refused). Strings (package, task_func) may be empty; a Struct name may not (NonEmptyString).


class _ParseError(Exception):
    """What serde_json (or the graph's own checks) would report; made into ``InvalidTaskGraph``."""


_RECURSION_LIMIT = 128
"""serde_json's ``remaining_depth``: the 128th nested container is refused (check_recursion)."""
_U32_MAX = 2**32 - 1
_U64_MAX = 2**64 - 1
_WHITESPACE = re.compile(rb"[ \t\n\r]*")
_STRING = re.compile(rb'"((?:[^"\\\x00-\x1f]++|\\(?:["\\/bfnrt]|u[0-9A-Fa-f]{4}))*+)"')
_NUMBER = re.compile(rb"-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")
_SURROGATE = re.compile("[\ud800-\udfff]")
_DIGITS = frozenset(b"-0123456789")
_LITERALS = {ord("n"): b"null", ord("t"): b"true", ord("f"): b"false"}
_QUOTE, _COMMA, _COLON, _SPACE = ord('"'), ord(","), ord(":"), ord(" ")
_OPEN_LIST, _CLOSE_LIST, _OPEN_MAP, _CLOSE_MAP = ord("["), ord("]"), ord("{"), ord("}")
_KINDS = {_QUOTE: "string", _OPEN_LIST: "sequence", _OPEN_MAP: "map", ord("n"): "null"}


class _Reader:
    """serde_json's deserializer over one JSON text, for the types the graph is made of."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0
        self.remaining_depth = _RECURSION_LIMIT
        self.key_end = 0
        """Where the last map key read ends: at the colon (whitespace after the key skipped)."""

    def error(self, message: str) -> _ParseError:
        line = self.data.count(b"\n", 0, self.pos) + 1
        column = self.pos - (self.data.rfind(b"\n", 0, self.pos) + 1)
        return _ParseError(f"{message} at line {line} column {column}")

    def key_error(self, message: str) -> _ParseError:
        """An error about the key just read (unknown, repeated): serde_json reports it at the
        colon after the key (raised before the value is read; the map's end, looked for on the way
        out, skips the whitespace before the position is fixed)."""
        pos, self.pos = self.pos, self.key_end
        try:
            return self.error(message)
        finally:
            self.pos = pos

    def peek(self) -> int | None:
        """The next byte after whitespace (consumed), ``None`` at the end."""
        data, pos = self.data, self.pos
        if pos < len(data) and data[pos] > _SPACE:  # every JSON whitespace byte is <= space
            return data[pos]
        match = _WHITESPACE.match(data, pos)
        assert match is not None  # the pattern matches the empty string
        self.pos = pos = match.end()
        return data[pos] if pos < len(data) else None

    def invalid_type(self, expected: str) -> _ParseError:
        byte = self.peek()
        if byte is None:
            return self.error("EOF while parsing a value")
        if byte in _DIGITS:
            kind = "number"
        elif byte in (ord("t"), ord("f")):
            kind = "boolean"
        else:
            kind = _KINDS.get(byte, "")
        if not kind:
            return self.error("expected value")
        return self.error(f"invalid type: {kind}, expected {expected}")

    def enter(self) -> None:
        """A container of a known type opens (``[`` or ``{`` at ``pos``)."""
        self.remaining_depth -= 1
        if self.remaining_depth == 0:
            raise self.error("recursion limit exceeded")
        self.pos += 1

    def leave(self) -> None:
        self.remaining_depth += 1

    def end(self) -> None:
        if self.peek() is not None:
            raise self.error("trailing characters")

    # --- sequences and maps ----------------------------------------------------------------------

    def has_next_element(self, first: bool) -> bool:
        """serde_json's ``SeqAccess``: is there another element (``pos`` at it when there is)?"""
        byte = self.peek()
        if byte is None:
            raise self.error("EOF while parsing a list")
        if byte == _CLOSE_LIST:
            return False
        if first:
            return True
        if byte != _COMMA:
            raise self.error("expected `,` or `]`")
        self.pos += 1
        following = self.peek()
        if following == _CLOSE_LIST:
            raise self.error("trailing comma")
        if following is None:
            raise self.error("EOF while parsing a value")
        return True

    def end_seq(self) -> None:
        byte = self.peek()
        if byte == _CLOSE_LIST:
            self.pos += 1
            return
        if byte is None:
            raise self.error("EOF while parsing a list")
        raise self.error("trailing characters" if byte != _COMMA else "trailing comma")

    def map_keys(self) -> Iterator[str]:
        """serde_json's ``MapAccess`` after ``{``: each key (``pos`` then at its value); consumes
        the closing ``}``."""
        first = True
        while True:
            byte = self.peek()
            if byte == _CLOSE_MAP:
                self.pos += 1
                return
            if byte is None:
                raise self.error("EOF while parsing an object")
            if not first:
                if byte != _COMMA:
                    raise self.error("expected `,` or `}`")
                self.pos += 1
                byte = self.peek()
                if byte == _CLOSE_MAP:
                    raise self.error("trailing comma")
            first = False
            if byte != _QUOTE:
                raise self.error("key must be a string")
            key = self.string_here()
            self.peek()
            self.key_end = self.pos
            self.colon()
            yield key

    def colon(self) -> None:
        if self.peek() != _COLON:
            raise self.error("expected `:`")
        self.pos += 1

    # --- scalars -------------------------------------------------------------------------------

    def string(self, expected: str = "a string") -> str:
        if self.peek() != _QUOTE:
            raise self.invalid_type(expected)
        return self.string_here()

    def string_here(self) -> str:
        """A deserialized string at ``pos``: valid UTF-8, surrogate escapes paired (read.rs
        parse_str)."""
        match = _STRING.match(self.data, self.pos)
        if match is None:
            raise self.error("invalid string (control character, invalid escape or EOF)")
        raw = match[1]
        try:
            text = raw.decode()
        except UnicodeDecodeError as error:
            # serde_json reports it just past the first byte that is not UTF-8
            self.pos = match.start(1) + error.start + 1
            raise self.error("invalid unicode code point") from error
        if b"\\" in raw:
            text = json.loads(f'"{text}"')
            if _SURROGATE.search(text):
                raise self.error("lone leading surrogate in hex escape")
        self.pos = match.end()
        return text

    def unsigned(self, limit: int, name: str) -> int:
        """A ``u32``/``u64``/``usize``: serde_json hands a fraction, an exponent, ``-0`` or a value
        past u64 over as a float and a negative value as an i64, both refused."""
        byte = self.peek()
        if byte is None or byte not in _DIGITS:
            raise self.invalid_type(name)
        match = _NUMBER.match(self.data, self.pos)
        if match is None:
            raise self.error("invalid number")
        token = match[0]
        if token[0] == ord("-") or match[1] or match[2] or len(token) > 20 or int(token) > _U64_MAX:
            raise self.error(f"invalid type: {token.decode()!r} is not a {name}")
        value = int(token)
        if value > limit:
            raise self.error(f"invalid value: integer `{value}`, expected {name}")
        self.pos = match.end()
        return value

    def null(self, expected: str) -> None:
        if self.peek() != ord("n") or not self.data.startswith(b"null", self.pos):
            raise self.invalid_type(expected)
        self.pos += 4

    def ignore(self) -> None:
        """serde_json's ``ignore_value``: any well-formed value, no depth limit, strings unchecked
        beyond their escapes (de.rs ignore_value, read.rs ignore_str)."""
        open_containers: list[int] = []
        while True:
            byte = self.peek()
            if byte in (_OPEN_LIST, _OPEN_MAP):
                assert byte is not None
                self.pos += 1
                closing = _CLOSE_LIST if byte == _OPEN_LIST else _CLOSE_MAP
                if self.peek() != closing:
                    open_containers.append(closing)
                    if closing == _CLOSE_MAP:
                        self._ignore_key()
                    continue
                self.pos += 1
            else:
                self._ignore_scalar(byte)
            while True:
                if not open_containers:
                    return
                byte = self.peek()
                if byte == _COMMA:
                    self.pos += 1
                    if open_containers[-1] == _CLOSE_MAP:
                        self._ignore_key()
                    break
                if byte != open_containers[-1]:
                    raise self.error("expected `,` or the container's end")
                self.pos += 1
                open_containers.pop()

    def _ignore_key(self) -> None:
        if self.peek() != _QUOTE:
            raise self.error("key must be a string")
        self._ignore_scalar(_QUOTE)
        self.colon()

    def _ignore_scalar(self, byte: int | None) -> None:
        if byte is None:
            raise self.error("EOF while parsing a value")
        if byte == _QUOTE:
            match = _STRING.match(self.data, self.pos)
        elif byte in _DIGITS:
            match = _NUMBER.match(self.data, self.pos)
        else:
            literal = _LITERALS.get(byte)
            if literal is None or not self.data.startswith(literal, self.pos):
                raise self.error("expected value")
            self.pos += len(literal)
            return
        if match is None:
            raise self.error("invalid string" if byte == _QUOTE else "invalid number")
        self.pos = match.end()


Decode = Callable[[_Reader], Any]

_REQUIRED, _OPTION, _DEFAULT = "required", "option", "default"
"""What a serde-derived struct does with a field that is absent: error; ``None`` in map form but an
error in array form (an ``Option`` without ``#[serde(default)]``); its default (with it)."""


@dataclass(frozen=True)
class _Field:
    name: str
    decode: Decode
    when_absent: str = _REQUIRED


class _Struct:
    """A serde-derived struct without ``deny_unknown_fields``: a map (unknown keys ignored,
    repeated ones refused) or an array of the fields in declaration order; what is absent becomes
    ``None`` or an error per ``_Field.when_absent``."""

    def __init__(self, name: str, *fields: _Field) -> None:
        self.name = name
        self.fields = fields
        self.by_name = {spec.name: spec for spec in fields}

    def __call__(self, reader: _Reader) -> dict[str, Any]:
        byte = reader.peek()
        if byte == _OPEN_MAP:
            return self._map(reader)
        if byte == _OPEN_LIST:
            return self._seq(reader)
        raise reader.invalid_type(f"struct {self.name}")

    def _map(self, reader: _Reader) -> dict[str, Any]:
        values: dict[str, Any] = {}
        reader.enter()
        for key in reader.map_keys():
            spec = self.by_name.get(key)
            if spec is None:
                reader.ignore()
            elif key in values:
                raise reader.key_error(f"duplicate field `{key}`")
            else:
                values[key] = spec.decode(reader)
        reader.leave()
        if len(values) < len(self.fields):
            for spec in self.fields:
                if spec.name not in values:
                    if spec.when_absent == _REQUIRED:
                        raise reader.error(f"missing field `{spec.name}`")
                    values[spec.name] = None
        return values

    def _seq(self, reader: _Reader) -> dict[str, Any]:
        values: dict[str, Any] = {}
        reader.enter()
        first = True
        for index, spec in enumerate(self.fields):
            if reader.has_next_element(first):
                first = False
                values[spec.name] = spec.decode(reader)
            elif spec.when_absent == _DEFAULT:
                values[spec.name] = None
            else:
                raise reader.error(
                    f"invalid length {index}, expected struct {self.name} with "
                    f"{len(self.fields)} elements"
                )
        reader.end_seq()
        reader.leave()
        return values


class _Enum:
    """An externally tagged enum: ``"Unit"``, ``{"Unit": null}`` or ``{"Variant": content}``
    (exactly one key). ``variants`` maps each name to its content's decoder, ``None`` for a unit
    variant; the result is serde's canonical form: ``"Unit"`` or ``{"Variant": content}``."""

    def __init__(self, name: str, variants: dict[str, Decode | None]) -> None:
        self.name = name
        self.variants = variants

    def __call__(self, reader: _Reader) -> Any:
        byte = reader.peek()
        if byte == _QUOTE:
            variant = reader.string_here()
            if variant not in self.variants:
                raise reader.error(f"unknown variant `{variant}` of {self.name}")
            if self.variants[variant] is not None:
                raise reader.error(f"invalid type: unit variant, expected {self.name}::{variant}")
            return variant
        if byte != _OPEN_MAP:
            raise reader.invalid_type(f"enum {self.name}")
        reader.enter()
        variant = reader.string("variant identifier")
        if variant not in self.variants:
            raise reader.error(f"unknown variant `{variant}` of {self.name}")
        reader.colon()
        decode = self.variants[variant]
        if decode is None:
            reader.null("unit")
            result: Any = variant
        else:
            result = {variant: decode(reader)}
        if reader.peek() != _CLOSE_MAP:
            raise reader.error(f"expected `}}` after the {self.name} variant")
        reader.pos += 1
        reader.leave()
        return result


def _option(decode: Decode) -> Decode:
    def option(reader: _Reader) -> Any:
        if reader.peek() == ord("n"):
            reader.null("an option")
            return None
        return decode(reader)

    return option


def _vec(decode: Decode) -> Decode:
    def vec(reader: _Reader) -> list[Any]:
        if reader.peek() != _OPEN_LIST:
            raise reader.invalid_type("a sequence")
        reader.enter()
        items, first = [], True
        while reader.has_next_element(first):
            first = False
            items.append(decode(reader))
        reader.end_seq()
        reader.leave()
        return items

    return vec


def _u32(reader: _Reader) -> int:
    return reader.unsigned(_U32_MAX, "u32")


def _u64(reader: _Reader) -> int:
    return reader.unsigned(_U64_MAX, "u64")


def _string(reader: _Reader) -> str:
    return reader.string()


def _non_empty_string(reader: _Reader) -> str:
    """A Struct name (type_descriptor.rs: ``Struct(NonEmptyString)``)."""
    name = reader.string("a string with a length of more than 0")
    if not name:
        raise reader.error(
            'invalid value: string "", expected a string with a length of more than 0'
        )
    return name


# Data type descriptors (spider-core type_descriptor.rs), built in serde's canonical form so that
# equal types compare equal whatever form the JSON used (task_graph.rs:782 compares the values).

_int_type = _Enum("IntTypeDescriptor", dict.fromkeys(sorted(_INT_TYPES)))
_float_type = _Enum("FloatTypeDescriptor", dict.fromkeys(sorted(_FLOAT_TYPES)))
_primitive_type = _Enum(
    "PrimitiveTypeDescriptor", {"Int": _int_type, "Float": _float_type, "Boolean": None}
)
_bytes_struct = _Struct("BytesTypeDescriptor")


def _bytes_type(reader: _Reader) -> dict[str, Any]:
    return _bytes_struct(reader)  # no fields: {}


def _value_type(reader: _Reader) -> Any:
    return _VALUE_TYPE(reader)


_map_key_type = _Enum("MapKeyTypeDescriptor", {"Int": _int_type, "Bytes": _bytes_type})
_map_type = _Struct(
    "ValueTypeDescriptor::Map", _Field("key", _map_key_type), _Field("value", _value_type)
)
_VALUE_TYPE = _Enum(
    "ValueTypeDescriptor",
    {
        "Primitive": _primitive_type,
        "Bytes": _bytes_type,
        "Struct": _non_empty_string,
        "List": _value_type,
        "Map": _map_type,
    },
)
_data_type = _Enum("DataTypeDescriptor", {"Value": _value_type, "SharedValue": _value_type})


# The graph's structs (task_graph.rs), fields in declaration order (their order in array form).

_timeout_policy = _Struct(
    "TimeoutPolicy", _Field("soft_timeout_ms", _u64), _Field("hard_timeout_ms", _u64)
)
# task_graph.rs:151: ``timeout_policy`` is ``#[serde(default)]`` but no ``Option``: null is refused.
_execution_policy = _Struct(
    "ExecutionPolicy",
    _Field("max_num_retry", _u32),
    _Field("max_num_instances", _u32),
    _Field("timeout_policy", _timeout_policy, _DEFAULT),
)
# task_graph.rs:48: plain ``String``s, so empty ones are accepted.
_tdl_context = _Struct("TdlContext", _Field("package", _string), _Field("task_func", _string))
_input_source = _Struct("TaskInputOutputIndex", _Field("task_idx", _u64), _Field("position", _u64))
# task_graph.rs:370: ``execution_policy`` is a ``#[serde(default)] Option`` (absent or null: none);
# task_graph.rs:385: ``input_sources`` an ``Option`` without ``#[serde(default)]`` (absent or null
# in map form: an input task; it may not be left off an array).
_task = _Struct(
    "TaskDescriptor",
    _Field("tdl_context", _tdl_context),
    _Field("execution_policy", _option(_execution_policy), _DEFAULT),
    _Field("inputs", _vec(_data_type)),
    _Field("outputs", _vec(_data_type)),
    _Field("input_sources", _option(_vec(_input_source)), _OPTION),
)
_termination_task = _Struct(
    "TerminationTaskDescriptor",
    _Field("tdl_context", _tdl_context),
    _Field("execution_policy", _option(_execution_policy), _DEFAULT),
)
_TOP_LEVEL: dict[str, Decode] = {
    "schema_version": _string,
    "tasks": _vec(_task),
    "commit_task": _option(_termination_task),
    "cleanup_task": _option(_termination_task),
}


def _parse_graph(text: bytes) -> TaskGraph:
    reader = _Reader(text)
    try:
        graph = _read_graph(reader)
        reader.end()
    except _ParseError as error:
        raise InvalidTaskGraph(f"{_GRAPH_REFUSED}`serde_json::Error`: {error}") from error
    return graph


def _read_graph(reader: _Reader) -> TaskGraph:
    """``TaskGraphVisitor::visit_map`` (task_graph.rs:969), in its order of checks."""
    values = _read_top_level(reader)
    for key in ("schema_version", "tasks"):
        if key not in values:
            raise reader.error(f"missing field `{key}`")
    version = values["schema_version"]
    try:
        compatible = _schema_version_compatible(version)
    except _SemverError as error:
        raise reader.error(f"invalid schema version string '{version}': {error}") from error
    if not compatible:
        raise reader.error(
            f"incompatible task graph schema version: found {version}, compatible requirement: "
            f"{SCHEMA_REQUIREMENT}"
        )
    for key in ("commit_task", "cleanup_task"):
        if key not in values:
            raise reader.error(f"missing field `{key}`")
    try:
        # TaskGraph::new (task_graph.rs:470) validates the termination tasks' policies first.
        commit_task = _termination(values["commit_task"])
        cleanup_task = _termination(values["cleanup_task"])
    except _ParseError as error:
        raise reader.error(
            f"failed to create task graph during deserialization: {error}"
        ) from error
    tasks: list[TaskDescriptor] = []
    for index, raw in enumerate(values["tasks"]):
        try:
            tasks.append(_insert_task(raw, tasks))
        except _ParseError as error:
            raise reader.error(
                f"failed to insert task (index={index}) during deserialization: {error}"
            ) from error
    return TaskGraph(tuple(tasks), commit_task, cleanup_task, version)


def _read_top_level(reader: _Reader) -> dict[str, Any]:
    if reader.peek() != _OPEN_MAP:
        raise reader.invalid_type(
            "a map with fields: schema_version,tasks,commit_task,cleanup_task"
        )
    reader.enter()
    values: dict[str, Any] = {}
    for key in reader.map_keys():
        decode = _TOP_LEVEL.get(key)
        if decode is None:
            raise reader.key_error(
                f"unknown field `{key}`, expected one of `schema_version`, `tasks`, "
                "`commit_task`, `cleanup_task`"
            )
        if key in values:
            raise reader.key_error(f"duplicate field `{key}`")
        # Spider defers an error inside ``tasks`` until after the version check (task_graph.rs:996);
        # the outcome is the same refusal, so it is raised at once here.
        values[key] = decode(reader)
    reader.leave()
    return values


def _validated_policy(raw: dict[str, Any]) -> ExecutionPolicy:
    """``ExecutionPolicy::validate`` (task_graph.rs:165): instances first, then the timeouts.
    Spider checks a policy only when it builds the graph (``TaskGraph::new``, ``insert_task``)."""
    if raw["max_num_instances"] == 0:
        raise _ParseError("invalid execution policy: `max_num_instances` must be greater than 0")
    timeouts = raw["timeout_policy"]
    try:
        timeout_policy = (
            TimeoutPolicy()
            if timeouts is None
            else TimeoutPolicy(timeouts["soft_timeout_ms"], timeouts["hard_timeout_ms"])
        )
    except InvalidExecutionPolicy as error:
        raise _ParseError(f"invalid timeout policy: {error}") from error
    return ExecutionPolicy(raw["max_num_retry"], raw["max_num_instances"], timeout_policy)


def _termination(raw: dict[str, Any] | None) -> TerminationTask | None:
    if raw is None:
        return None
    policy = raw["execution_policy"]
    return TerminationTask(
        TdlContext(raw["tdl_context"]["package"], raw["tdl_context"]["task_func"]),
        None if policy is None else _validated_policy(policy),
    )


def _insert_task(raw: dict[str, Any], earlier: list[TaskDescriptor]) -> TaskDescriptor:
    """``TaskGraph::insert_task`` (task_graph.rs:551) with
    ``validate_and_retrieve_input_dep_indices`` (task_graph.rs:754)."""
    policy = raw["execution_policy"]
    execution_policy = DEFAULT_POLICY if policy is None else _validated_policy(policy)
    inputs, raw_sources = tuple(raw["inputs"]), raw["input_sources"]
    sources = None
    if raw_sources is not None:
        sources = tuple(InputSource(s["task_idx"], s["position"]) for s in raw_sources)
        _check_sources(inputs, sources, earlier)
    return TaskDescriptor(
        tdl_context=TdlContext(raw["tdl_context"]["package"], raw["tdl_context"]["task_func"]),
        inputs=inputs,
        outputs=tuple(raw["outputs"]),
        execution_policy=execution_policy,
        input_sources=sources,
    )


def _check_sources(
    inputs: tuple[DataType, ...], sources: tuple[InputSource, ...], earlier: list[TaskDescriptor]
) -> None:
    # task_graph.rs:761: ``Some([])`` is refused on a task without inputs too.
    if not inputs:
        raise _ParseError("invalid task inputs: input task cannot have input sources specified")
    if len(inputs) != len(sources):
        raise _ParseError(
            f"invalid task inputs: mismatched number of positional inputs ({len(inputs)}) "
            f"and input sources ({len(sources)})."
        )
    for position, source in enumerate(sources):
        # task_graph.rs:774: only a task inserted before (a lower index) has outputs to name.
        if source.task_idx >= len(earlier) or source.position >= len(
            earlier[source.task_idx].outputs
        ):
            raise _ParseError(
                f"invalid task inputs: invalid input source at position {position} with "
                f"task output index: TaskInputOutputIndex {{ task_idx: {source.task_idx}, "
                f"position: {source.position} }}"
            )
        found = earlier[source.task_idx].outputs[source.position]
        # task_graph.rs:782: descriptors are compared as values, not as JSON text.
        if found != inputs[position]:
            raise _ParseError(
                f"invalid task inputs: mismatched input type for input at position "
                f"{position}: expected {_debug(inputs[position])}, found {_debug(found)}"
            )


def _debug(descriptor: Any) -> str:
    """A canonical descriptor as Rust's ``Debug`` writes it (``Value(List(Primitive(Boolean)))``),
    for Spider's "mismatched input type" message."""
    if isinstance(descriptor, str):
        return descriptor
    ((variant, content),) = descriptor.items()
    if variant == "Bytes":
        return "Bytes(BytesTypeDescriptor)"
    if variant == "Struct":
        return f"Struct({json.dumps(content, ensure_ascii=False)})"
    if variant == "Map":
        return f"Map {{ key: {_debug(content['key'])}, value: {_debug(content['value'])} }}"
    return f"{variant}({_debug(content)})"


# --- The schema version: the semver crate's Version::parse and VersionReq::matches ------------

SCHEMA_REQUIREMENT = ">=0.1.0,<0.2.0"
"""task_graph.rs:937 ``TASK_GRAPH_SCHEMA_COMPATIBLE_VERSION``."""
_COMPARATORS = ((">=", (0, 1, 0)), ("<", (0, 2, 0)))
"""The requirement's comparators: each names major, minor and patch, none a pre-release."""
_IDENTIFIER_BYTES = frozenset("0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz-")
_ASCII_DIGITS = frozenset("0123456789")


class _SemverError(Exception):
    """``semver::Error``'s message."""


def _schema_version_compatible(text: str) -> bool:
    """``VersionReq::parse(">=0.1.0,<0.2.0").matches(&Version::parse(text)?)``
    (task_graph.rs:1023-1029); raises ``_SemverError`` when ``text`` is no version.

    semver's rule for pre-releases: a version with one (``0.1.5-rc.1``) matches only if some
    comparator has the same major.minor.patch **and** a pre-release itself. No comparator here has
    one, so every pre-release version is refused, ``0.2.0-alpha`` (below ``0.2.0``) included.
    Build metadata (``+…``) is ignored.
    """
    major, minor, patch, pre = _parse_version(text)
    for op, comparator in _COMPARATORS:
        numbers = (major, minor, patch)
        # semver's matches_greater/matches_less: equal numbers are ordered by the pre-release, and
        # the comparator's empty one sorts above any other.
        if op == ">=":
            matches = numbers > comparator or (numbers == comparator and not pre)
        else:
            matches = numbers < comparator or (numbers == comparator and bool(pre))
        if not matches:
            return False
    return not pre  # no comparator has a pre-release (semver's pre_is_compatible)


def _parse_version(text: str) -> tuple[int, int, int, tuple[str, ...]]:
    """semver 1.x ``Version::from_str``: ``MAJOR.MINOR.PATCH[-PRE][+BUILD]``, ASCII digits, no
    leading zeros, each number within u64; identifiers ``[0-9A-Za-z-]``, non-empty, numeric
    pre-release ones without a leading zero."""
    if not text:
        raise _SemverError("empty string, expected a semver version")
    numbers = []
    rest = text
    for index, position in enumerate(("major", "minor", "patch")):
        number, rest = _version_number(rest, f"{position} version number", last=index == 2)
        numbers.append(number)
    last = "patch version number"
    pre: tuple[str, ...] = ()
    if rest.startswith("-"):
        last = "pre-release identifier"
        pre, rest = _identifiers(rest[1:], last)
    if rest.startswith("+"):
        last = "build metadata"
        _, rest = _identifiers(rest[1:], last)
    if rest:
        raise _SemverError(f"unexpected character {rest[0]!r} after {last}")
    return numbers[0], numbers[1], numbers[2], pre


def _version_number(text: str, where: str, *, last: bool) -> tuple[int, str]:
    """A number at the start of ``text`` and what follows (its ``.`` consumed unless ``last``)."""
    length = 0
    while length < len(text) and text[length] in _ASCII_DIGITS:
        if length == 1 and text[0] == "0":
            raise _SemverError(f"invalid leading zero in {where}")
        length += 1
    if length == 0:
        if text:
            raise _SemverError(f"unexpected character {text[0]!r} while parsing {where}")
        raise _SemverError(f"unexpected end of input while parsing {where}")
    if length > 20 or int(text[:length]) > _U64_MAX:
        raise _SemverError(f"value of {where} exceeds u64::MAX")
    rest = text[length:]
    if not last:
        if not rest:
            raise _SemverError(f"unexpected end of input while parsing {where}")
        if rest[0] != ".":
            raise _SemverError(f"unexpected character {rest[0]!r} after {where}")
        rest = rest[1:]
    return int(text[:length]), rest


def _identifiers(text: str, where: str) -> tuple[tuple[str, ...], str]:
    """Dot-separated identifiers at the start of ``text`` (semver's ``identifier``); the rest."""
    end = 0
    while end < len(text) and (text[end] in _IDENTIFIER_BYTES or text[end] == "."):
        end += 1
    segments = text[:end].split(".")
    for segment in segments:
        if not segment:
            raise _SemverError(f"empty identifier segment in {where}")
        if where.startswith("pre") and len(segment) > 1 and segment[0] == "0" and segment.isdigit():
            raise _SemverError(f"invalid leading zero in {where}")
    return tuple(segments), text[end:]
