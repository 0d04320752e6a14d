"""The Spider port: the one interface through which the coordinator drives Spider.

It mirrors Spider's ``storage.JobOrchestrationService`` and ``ResourceGroupManagementService``
(``docs/spider.md``, gRPC surface): job states keep Spider's numbers, and failures are the typed
errors Spider's own Rust client raises for each gRPC status. Two engines implement it: the
embedded engine (``coordinator.engine.embedded``) and the gRPC client of a Spider cluster.

Rules of use (``docs/spider.md``, Guarded calls). Spider's calls are not all safe to make at any
time; callers go through the helpers at the bottom of this module, which follow them:

* ``start_job``: not idempotent (a started job answers INTERNAL, an evicted terminal one NOT_FOUND).
  Ask ``get_job_state`` first and start only a ``READY`` job (``start_if_ready``; for several jobs
  ``start_all_if_ready``, one call when the engine starts several at once).
* ``cancel_job``: never in ``COMMIT_READY`` when the graph has no cleanup task (CLP's Rust
  coordinator's never has), never in ``READY`` when it has one: on a real cluster either shuts the
  storage server down. Never on a terminal job. Ask first (``cancel_if_safe``); only a graph with a
  cleanup task makes the state read and the call safe together.
* ``get_job_outputs``: only after ``SUCCEEDED``; ``get_job_error`` only after ``FAILED``.
* ``register_job``: **not idempotent** and there is no lookup; never retry the call after an
  ambiguous failure, and persist the returned id at once (``register_all_jobs`` registers several,
  in one call when the engine can). (The coordinator registers such a job
  anew on a later tick; a registration that did happen stays an orphan Ready job, never started.)
* ``JobNotFound`` from start/cancel may mean "terminal and evicted": confirm with
  ``get_job_state``.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable, Sequence
from enum import IntEnum
from functools import partial
from typing import Protocol, TypeVar

from coordinator.errors import CoordinatorError

_Item = TypeVar("_Item")
_Answer = TypeVar("_Answer")


class JobState(IntEnum):
    """Spider's ``storage.JobState`` (same numbers as the proto enum)."""

    UNSPECIFIED = 0
    READY = 1
    RUNNING = 2
    COMMIT_READY = 3
    CLEANUP_READY = 4
    SUCCEEDED = 5
    FAILED = 6
    CANCELLED = 7

    @property
    def is_terminal(self) -> bool:
        """Succeeded, Failed and Cancelled are final: nothing leaves them."""
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


class SpiderError(CoordinatorError):
    """A Spider call failed. Subclasses follow Spider's client (gRPC status → error)."""


class JobNotFound(SpiderError):
    """NOT_FOUND: no such job (or, for start/cancel, a terminal job no longer cached)."""


class InvalidJobState(SpiderError):
    """FAILED_PRECONDITION: the job is not in a state that allows the call."""


class InvalidArgument(SpiderError):
    """INVALID_ARGUMENT: a malformed task graph or inputs ("bad request: …")."""


class Unauthenticated(SpiderError):
    """UNAUTHENTICATED: an unknown resource group, or a wrong password."""


class Unavailable(SpiderError):
    """UNAVAILABLE or a transport failure: Spider could not be reached. Safe to retry, except
    ``register_job``, whose effect is then unknown."""


class ServerError(SpiderError):
    """Any other status (INTERNAL, ALREADY_EXISTS, …)."""


class ResourceGroupExists(ServerError):
    """ALREADY_EXISTS from ``add_resource_group``: the name is taken (its id cannot be read)."""

    @classmethod
    def named(cls, external_id: str) -> ResourceGroupExists:
        """The error with Spider's text: ``resource group `"name"` already exists``, the name as
        Rust's ``Debug`` of a ``str`` writes it (``rust_debug_str``; measured against Spider's
        storage binary)."""
        return cls(f"resource group `{rust_debug_str(external_id)}` already exists")


_RUST_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\0": "\\0"}


def rust_debug_str(text: str) -> str:
    """``format!("{text:?}")`` of a Rust ``str``: in double quotes, ``"`` and ``\\`` escaped,
    ``\\n \\r \\t \\0``, and any other character that is not printable or extends a grapheme as
    ``\\u{hex}``. Python's ``isprintable`` and the categories Mn/Me stand in for Rust's tables
    (the same on the characters measured: controls, no-break and zero-width spaces, BOM, U+2028,
    combining marks; a rare character may differ)."""
    out = ['"']
    for char in text:
        escaped = _RUST_ESCAPES.get(char)
        if escaped is not None:
            out.append(escaped)
        elif not char.isprintable() or unicodedata.category(char) in ("Mn", "Me"):
            out.append(f"\\u{{{ord(char):x}}}")
        else:
            out.append(char)
    out.append('"')
    return "".join(out)


class SpiderPort(Protocol):
    """Spider's job orchestration and resource-group calls, engine-neutral."""

    def add_resource_group(self, external_id: str, password: bytes) -> int:
        """Create a resource group; its id. Raises ``ResourceGroupExists`` for a taken name."""
        ...

    def verify_resource_group(self, resource_group_id: int, password: bytes) -> None:
        """Check a stored id; raises ``Unauthenticated`` for an unknown id or a wrong password."""
        ...

    def register_job(
        self, resource_group_id: int, compressed_task_graph: bytes, compressed_inputs: bytes
    ) -> int:
        """Create a job in ``READY`` (not started) from RegisterJob's payloads; its id.

        Raises ``InvalidArgument`` for a graph or inputs Spider refuses, ``Unauthenticated`` for an
        unknown resource group. Not idempotent.
        """
        ...

    def start_job(self, job_id: int) -> JobState:
        """``READY`` → ``RUNNING``; raises ``JobNotFound``, or ``ServerError`` unless ``READY``."""
        ...

    def cancel_job(self, job_id: int) -> JobState:
        """Cancel; the resulting state (see Spider's table). Raises as Spider does (see module)."""
        ...

    def get_job_state(self, job_id: int) -> JobState:
        """The job's state; raises ``JobNotFound``."""
        ...

    def get_job_outputs(self, job_id: int) -> list[bytes]:
        """The graph outputs (one payload each) of a ``SUCCEEDED`` job. Otherwise
        ``ServerError`` while Spider still caches the job (on a real Spider a fatal error that
        shuts its storage server down), ``InvalidJobState`` once it no longer does."""
        ...

    def get_job_error(self, job_id: int) -> str:
        """The last failure's message of a ``FAILED`` job; else ``InvalidJobState``."""
        ...


def start_if_ready(spider: SpiderPort, job_id: int) -> JobState:
    """Start the job if (and only if) it is ``READY``; the state it is in afterwards.

    A job that is already past ``READY`` counts as started. Raises ``JobNotFound`` and the
    transport errors of ``get_job_state``/``start_job``.
    """
    state = spider.get_job_state(job_id)
    if state is not JobState.READY:
        return state
    return spider.start_job(job_id)


RegisterJobs = Callable[[int, Sequence[tuple[bytes, bytes]]], list["int | SpiderError"]]
"""An engine's ``register_jobs``: RegisterJob of several ``(task graph, inputs)`` payloads in one
call (the embedded engine stores them in one transaction), each one's id or error in its place."""


def register_all_jobs(
    spider: SpiderPort, resource_group_id: int, submissions: Sequence[tuple[bytes, bytes]]
) -> list[int | SpiderError]:
    """RegisterJob of each ``(compressed task graph, compressed inputs)`` of ``submissions``, in
    order: the new job's id, or its ``SpiderError`` in its place. One call when ``spider`` has
    ``register_jobs`` (the embedded engine, or a wrapper passing it on); otherwise one job after
    another, each attempted once (a Spider cluster has no such RPC). Raises the errors that are not
    Spider's, after which the jobs already registered stay orphan Ready jobs (see the module)."""
    batch: RegisterJobs | None = getattr(spider, "register_jobs", None)
    if batch is not None and callable(batch):
        return batch(resource_group_id, submissions)
    return _each(lambda item: spider.register_job(resource_group_id, *item), submissions)


StartReadyJobs = Callable[[Sequence[int]], list["JobState | SpiderError"]]
"""An engine's ``start_ready_jobs``: ``start_if_ready`` of several jobs in one call (the embedded
engine writes their starts in one transaction), each one's answer or error in its place."""


def start_all_if_ready(spider: SpiderPort, job_ids: Sequence[int]) -> list[JobState | SpiderError]:
    """``start_if_ready`` of each of ``job_ids``, in order: the state each is in afterwards, or
    its ``SpiderError`` in its place. One call when ``spider`` has ``start_ready_jobs`` (the
    embedded engine, or a wrapper passing it on); otherwise one job after another (a Spider
    cluster has no such RPC). Raises the errors that are not Spider's (the embedded engine's
    database errors), after which the jobs not yet answered may be unstarted."""
    batch: StartReadyJobs | None = getattr(spider, "start_ready_jobs", None)
    if batch is not None and callable(batch):
        return batch(job_ids)
    return _each(partial(start_if_ready, spider), job_ids)


def start_all_registered(
    spider: SpiderPort, job_ids: Sequence[int]
) -> list[JobState | SpiderError]:
    """``start_all_if_ready`` of jobs this coordinator registered and has not started (Ready when
    it last knew): StartJob first, GetJobState only when StartJob fails.

    Saves the state read of ``start_if_ready`` per job on a Spider cluster (a round trip each,
    one job after another) without loosening its rule: StartJob is never fatal, only not
    idempotent (``docs/spider.md``, Guarded calls). A job that was not Ready after all (started
    meanwhile: INTERNAL), or is terminal and evicted (NOT_FOUND), or whose answer was lost, is
    then answered by ``start_if_ready``, which reads its state first, as before. An engine that
    starts several jobs at once (``start_ready_jobs``) is called as ``start_all_if_ready`` does.
    """
    batch: StartReadyJobs | None = getattr(spider, "start_ready_jobs", None)
    if batch is not None and callable(batch):
        return batch(job_ids)
    return _each(partial(_start_registered, spider), job_ids)


def _start_registered(spider: SpiderPort, job_id: int) -> JobState:
    try:
        return spider.start_job(job_id)
    except SpiderError:
        return start_if_ready(spider, job_id)


def _each(call: Callable[[_Item], _Answer], items: Sequence[_Item]) -> list[_Answer | SpiderError]:
    """``call`` of each of ``items`` in turn (an engine without the call for several at once):
    each answer, or its ``SpiderError``, in its place. Raises the errors that are not Spider's."""
    answers: list[_Answer | SpiderError] = []
    for item in items:
        try:
            answers.append(call(item))
        except SpiderError as error:
            answers.append(error)
    return answers


def cancel_if_safe(spider: SpiderPort, job_id: int, *, cleanup_task: bool = False) -> JobState:
    """Cancel the job when no race can make CancelJob fatal; the state it is in afterwards.

    Spider's CancelJob is not conditional: between the state read here and the call, the job may
    move on (its last task succeeds: ``RUNNING`` → ``COMMIT_READY``), so what is safe depends on
    the graph (``docs/spider.md``, Cancellation):

    * ``cleanup_task=True`` (the coordinator's graphs carry ``compression::cleanup``): cancels in
      ``RUNNING`` and ``COMMIT_READY`` (both → ``CLEANUP_READY``). Whatever the job does between
      the read and the call leaves CancelJob harmless: ``COMMIT_READY``, ``CLEANUP_READY``
      (a non-fatal INTERNAL) or terminal (a non-fatal INTERNAL, or its state once evicted); no
      state leads back to ``READY``, where it would be fatal. ``READY`` is never cancelled: the
      caller starts the job first (``start_if_ready``) or leaves it, an orphan Spider tolerates.
    * ``cleanup_task=False`` (CLP's own graphs, for workers running CLP's task package): cancels
      in ``READY`` only (→ ``CANCELLED``), which only StartJob moves on. A started job is **not**
      cancelled: it may reach ``COMMIT_READY`` between the read and the call, where CancelJob
      shuts a real Spider's storage down, and nothing a client can do closes that window. The
      caller lets such a job finish and honours the cancel at its outcome (the coordinator ends it
      Killed and withdraws what it published).

    Every other state is returned as it is. Raises ``JobNotFound``, transport errors, and
    ``ServerError`` when the job became terminal (or was cancelled by someone else) meanwhile.
    """
    state = spider.get_job_state(job_id)
    cancellable = (JobState.RUNNING, JobState.COMMIT_READY) if cleanup_task else (JobState.READY,)
    if state in cancellable:
        return spider.cancel_job(job_id)
    return state
