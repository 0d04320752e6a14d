"""Spider's task graph: its JSON schema, CLP's compression graph, and the RegisterJob payloads.

``RegisterJobRequest.compressed_serialized_task_graph`` is zstd of the graph's compact JSON
(``spider-contract.md`` §11.1; vector ``vectors/task_graph.json``). Spider's parser is strict:

* top level: exactly ``schema_version``, ``tasks``, ``commit_task``, ``cleanup_task`` (the last two
  may be ``null``); any other top-level key is rejected; ``schema_version`` must satisfy
  ``>=0.1.0,<0.2.0``;
* a task: ``tdl_context {package, task_func}``, optional ``execution_policy`` (validated),
  ``inputs`` and ``outputs`` (data type descriptors), ``input_sources``: ``null``/absent for an
  input task, else one ``{task_idx, position}`` per input naming an **earlier** task's output with
  an **equal** descriptor; unknown keys inside a task are ignored;
* at least one task; the job's inputs are the inputs of every input task (task order, then
  position) and must match the number of payloads; the graph outputs are the outputs of every task
  without children.

CLP's graph (``build_compression_job``): one ``clp``/``compression::clp_s_s3_compress`` input task
per partition with inputs ``ClpSCompressionOption``, ``Option<String>``, ``S3InputSource`` and
output ``CompressionTaskOutput``, the ``compression::commit`` commit task; its job inputs are
``[option, dataset, source]`` per task.

**The cleanup task.** CLP's Rust coordinator sends ``cleanup_task: null``; the coordinator's graphs
carry ``clp``/``compression::cleanup`` (``cleanup_task=False`` gives CLP's graph byte for byte).
Spider's CancelJob is unconditional, and without a cleanup task it is fatal in ``CommitReady``
(the storage server shuts down), a state a Running job enters on its own at any moment: no state
read before the call can make it safe. With a cleanup task Spider cancels ``Running`` and
``CommitReady`` jobs alike (→ ``CleanupReady``, the cleanup runs, → ``Cancelled``; its failure →
``Failed``), so cancelling is safe in every state a started job can be in; only ``Ready`` becomes
fatal, and only the coordinator moves a job out of ``Ready`` (``coordinator.spider.port``). What
it costs (``spider-contract.md`` §5, §8): Spider gives the cleanup no inputs, and its own executor
rejects an input buffer under 4 bytes, and CLP's Rust package (``clp-tdl-package``) has no
``compression::cleanup``; on a cluster a cancelled job may therefore end ``Failed`` (the cleanup's
failure) instead of ``Cancelled``, which the coordinator handles as any Spider failure. The
embedded engine and ``coordinator spider serve`` run this package's cleanup
(``coordinator.tasks.cleanup``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from coordinator.spider.policy import (
    DEFAULT_POLICY,
    ExecutionPolicy,
    InvalidExecutionPolicy,
    compression_task_policy,
    parse_execution_policy,
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

_TOP_LEVEL_KEYS = frozenset({"schema_version", "tasks", "commit_task", "cleanup_task"})
_SEMVER = re.compile(r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:[-+][0-9A-Za-z.+-]*)?")
_INT_TYPES = frozenset({"Int8", "Int16", "Int32", "Int64"})
_FLOAT_TYPES = frozenset({"Float32", "Float64"})

DataType = dict[str, Any]
"""A data type descriptor as Spider's JSON writes it, e.g. ``{"Value": {"Struct": "X"}}``."""


class InvalidTaskGraph(ValueError):
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
        """``compressed_serialized_task_graph``: zstd of the JSON text."""
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
        """``RegisterJobRequest.compressed_serialized_task_graph``."""
        return self.task_graph.compressed()

    def compressed_inputs(self) -> bytes:
        """``RegisterJobRequest.compressed_serialized_inputs``."""
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
    tasks, inputs = [], []
    for source in sources:
        tasks.append(
            TaskDescriptor(
                tdl_context=TdlContext(CLP_PACKAGE, COMPRESS_TASK),
                inputs=tuple(struct_value(name) for name in COMPRESS_INPUT_TYPES),
                outputs=(struct_value(COMPRESS_OUTPUT_TYPE),),
                execution_policy=compression_task_policy(
                    len(source.object_keys), compression_task_max_retry
                ),
            )
        )
        inputs += [option_payload, dataset_payload, source.to_msgpack()]
    graph = TaskGraph(
        tasks=tuple(tasks),
        commit_task=TerminationTask(TdlContext(CLP_PACKAGE, COMMIT_TASK), commit_policy),
        cleanup_task=TerminationTask(TdlContext(CLP_PACKAGE, CLEANUP_TASK), commit_policy)
        if cleanup_task
        else None,
    )
    return JobSubmission(graph, tuple(inputs))


def decode_task_graph(compressed: bytes) -> TaskGraph:
    """Parse ``compressed_serialized_task_graph`` as Spider's server does.

    Raises ``InvalidTaskGraph`` with Spider's kind of message for anything it would refuse
    (including an empty task list, which RegisterJob refuses).
    """
    try:
        value = json.loads(decompress(compressed, "the task graph"))
    except (InvalidFrame, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise InvalidTaskGraph(f"bad request: task graph is not zstd JSON: {error}") from error
    try:
        return _parse_graph(value)
    except InvalidExecutionPolicy as error:
        raise InvalidTaskGraph(f"bad request: {error}") from error


def decode_job_submission(compressed_graph: bytes, compressed_inputs: bytes) -> JobSubmission:
    """Both RegisterJob payloads, checked against each other as Spider does.

    Raises ``InvalidTaskGraph`` for a bad graph, undecodable inputs, or an input count that differs
    from the graph's ("task graph input size mismatch").
    """
    graph = decode_task_graph(compressed_graph)
    try:
        inputs = decode_job_inputs(compressed_inputs)
    except InvalidFrame as error:
        raise InvalidTaskGraph(f"bad request: {error}") from error
    if len(inputs) != graph.num_job_inputs:
        raise InvalidTaskGraph(
            f"bad request: task graph input size mismatch: the graph takes {graph.num_job_inputs} "
            f"job inputs, {len(inputs)} were given"
        )
    return JobSubmission(graph, tuple(inputs))


def _parse_graph(value: Any) -> TaskGraph:
    if not isinstance(value, dict):
        raise InvalidTaskGraph("bad request: the task graph must be a JSON object")
    unknown, missing = value.keys() - _TOP_LEVEL_KEYS, _TOP_LEVEL_KEYS - value.keys()
    if unknown:
        raise InvalidTaskGraph(f"bad request: unknown field(s) {', '.join(sorted(unknown))}")
    if missing:
        raise InvalidTaskGraph(f"bad request: missing field(s) {', '.join(sorted(missing))}")
    version = value["schema_version"]
    if not isinstance(version, str) or not _supported_version(version):
        raise InvalidTaskGraph(
            f"bad request: schema_version {version!r} does not satisfy >=0.1.0,<0.2.0"
        )
    raw_tasks = value["tasks"]
    if not isinstance(raw_tasks, list):
        raise InvalidTaskGraph("bad request: tasks must be a list")
    if not raw_tasks:
        raise InvalidTaskGraph("bad request: task graph must contain at least one task")
    tasks: list[TaskDescriptor] = []
    for index, raw in enumerate(raw_tasks):
        tasks.append(_parse_task(raw, index, tasks))
    return TaskGraph(
        tasks=tuple(tasks),
        commit_task=_parse_termination(value["commit_task"], "commit_task"),
        cleanup_task=_parse_termination(value["cleanup_task"], "cleanup_task"),
        schema_version=version,
    )


def _supported_version(version: str) -> bool:
    match = _SEMVER.fullmatch(version)
    return match is not None and (int(match[1]), int(match[2])) == (0, 1)


def _parse_task(raw: Any, index: int, earlier: list[TaskDescriptor]) -> TaskDescriptor:
    where = f"tasks[{index}]"
    if not isinstance(raw, dict):
        raise InvalidTaskGraph(f"bad request: {where} must be an object")
    for key in ("tdl_context", "inputs", "outputs"):
        if key not in raw:
            raise InvalidTaskGraph(f"bad request: {where} lacks {key}")
    inputs = _parse_types(raw["inputs"], f"{where}.inputs")
    outputs = _parse_types(raw["outputs"], f"{where}.outputs")
    policy = raw.get("execution_policy")
    sources = _parse_sources(raw.get("input_sources"), inputs, earlier, where)
    return TaskDescriptor(
        tdl_context=_parse_tdl_context(raw["tdl_context"], where),
        inputs=inputs,
        outputs=outputs,
        execution_policy=DEFAULT_POLICY
        if policy is None
        else parse_execution_policy(policy, where),
        input_sources=sources,
    )


def _parse_sources(
    raw: Any, inputs: tuple[DataType, ...], earlier: list[TaskDescriptor], where: str
) -> tuple[InputSource, ...] | None:
    if raw is None:
        return None
    if not isinstance(raw, list) or len(raw) != len(inputs):
        raise InvalidTaskGraph(f"bad request: {where}.input_sources must name one source per input")
    sources = []
    for position, source in enumerate(raw):
        if not isinstance(source, dict) or not all(
            isinstance(source.get(k), int) and not isinstance(source.get(k), bool)
            for k in ("task_idx", "position")
        ):
            raise InvalidTaskGraph(f"bad request: {where}.input_sources[{position}] is malformed")
        parent, output = source["task_idx"], source["position"]
        if not 0 <= parent < len(earlier) or not 0 <= output < len(earlier[parent].outputs):
            raise InvalidTaskGraph(
                f"bad request: {where}.input_sources[{position}] names no earlier task's output"
            )
        if earlier[parent].outputs[output] != inputs[position]:
            raise InvalidTaskGraph(
                f"bad request: {where}.inputs[{position}] type differs from its source's output"
            )
        sources.append(InputSource(parent, output))
    return tuple(sources)


def _parse_termination(raw: Any, where: str) -> TerminationTask | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or "tdl_context" not in raw:
        raise InvalidTaskGraph(f"bad request: {where} must be null or an object with tdl_context")
    policy = raw.get("execution_policy")
    return TerminationTask(
        _parse_tdl_context(raw["tdl_context"], where),
        None if policy is None else parse_execution_policy(policy, where),
    )


def _parse_tdl_context(raw: Any, where: str) -> TdlContext:
    if not isinstance(raw, dict) or not all(
        isinstance(raw.get(k), str) and raw.get(k) for k in ("package", "task_func")
    ):
        raise InvalidTaskGraph(f"bad request: {where}.tdl_context needs package and task_func")
    return TdlContext(raw["package"], raw["task_func"])


def _parse_types(raw: Any, where: str) -> tuple[DataType, ...]:
    if not isinstance(raw, list):
        raise InvalidTaskGraph(f"bad request: {where} must be a list")
    for position, descriptor in enumerate(raw):
        if not (
            isinstance(descriptor, dict)
            and len(descriptor) == 1
            and next(iter(descriptor)) in ("Value", "SharedValue")
            and _is_value_type(next(iter(descriptor.values())))
        ):
            raise InvalidTaskGraph(f"bad request: {where}[{position}] is not a data type")
    return tuple(raw)


def _is_value_type(value: Any) -> bool:
    """Spider's ``V``: Primitive, Bytes, Struct, List or Map, recursively."""
    if value in ({"Primitive": "Boolean"}, {"Bytes": {}}):
        return True
    if not isinstance(value, dict) or len(value) != 1:
        return False
    kind, body = next(iter(value.items()))
    checks = {
        "Primitive": _is_number_type,
        "Struct": lambda name: isinstance(name, str) and bool(name),
        "List": _is_value_type,
        "Map": _is_map_type,
    }
    check = checks.get(kind)
    return check is not None and check(body)


def _is_map_type(body: Any) -> bool:
    return (
        isinstance(body, dict)
        and body.keys() == {"key", "value"}
        and (body["key"] == {"Bytes": {}} or _is_int_type(body["key"]))
        and _is_value_type(body["value"])
    )


def _is_number_type(value: Any) -> bool:
    return _is_int_type(value) or (
        isinstance(value, dict) and len(value) == 1 and value.get("Float") in _FLOAT_TYPES
    )


def _is_int_type(value: Any) -> bool:
    return isinstance(value, dict) and len(value) == 1 and value.get("Int") in _INT_TYPES
