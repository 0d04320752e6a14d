"""``MeasuredSpider``: the Spider port with every call timed and every error counted.

The runtime wraps whichever engine it built (the embedded engine, or ``GrpcSpider`` for a Spider
cluster) in it, so every call the coordinator makes passes here once: its duration goes to
``clp_coordinator_spider_call_duration_seconds`` and an exception to
``clp_coordinator_spider_call_errors_total`` (``coordinator.metrics``), labelled with Spider's
RPC name. It changes nothing else: results and exceptions pass through as they are, and the
embedded engine's lookup by name (``resource_group_by_name``) stays visible to
``coordinator.service.resource_group.lookup_by_name``, and its start of several jobs at once
(``start_ready_jobs``, ``register_jobs``) to ``coordinator.spider.port``'s helpers.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, ParamSpec, TypeVar, cast

from coordinator import metrics
from coordinator.spider.port import (
    JobState,
    RegisterJobs,
    SpiderPort,
    StartReadyJobs,
)

P = ParamSpec("P")
T = TypeVar("T")

METHODS = (
    "AddResourceGroup",
    "VerifyResourceGroup",
    "RegisterJob",
    "StartJob",
    "CancelJob",
    "GetJobState",
    "GetJobOutputs",
    "GetJobError",
)
"""Spider's RPC names, the ``method`` label of each port call."""
BY_NAME = "ResourceGroupByName"
"""The ``method`` label of the embedded engine's get-or-create of a resource group by name."""
START_READY = "StartReadyJobs"
"""The ``method`` label of the embedded engine's start of several Ready jobs at once."""
REGISTER_SEVERAL = "RegisterJobs"
"""The ``method`` label of the embedded engine's registration of several jobs at once."""

for _method in (*METHODS, BY_NAME, START_READY, REGISTER_SEVERAL):
    metrics.SPIDER_CALL_DURATION.labels(_method)


def measure(method: str, call: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """``call(*args, **kwargs)``, its duration and any exception recorded under ``method``."""
    started = time.perf_counter()
    try:
        return call(*args, **kwargs)
    except Exception as error:
        metrics.SPIDER_CALL_ERRORS.labels(method, type(error).__name__).inc()
        raise
    finally:
        metrics.SPIDER_CALL_DURATION.labels(method).observe(time.perf_counter() - started)


class MeasuredSpider:
    """``inner``, measured (see the module)."""

    def __init__(self, inner: SpiderPort) -> None:
        self.inner = inner

    def __repr__(self) -> str:
        return f"MeasuredSpider({self.inner!r})"

    # The embedded engine's calls beyond Spider's RPCs: each is this wrapper's attribute only
    # when the wrapped engine has it (``AttributeError`` otherwise, as for a Spider cluster), so
    # that the port's helpers find them through ``getattr`` whether or not the engine is wrapped.

    @property
    def resource_group_by_name(self) -> Callable[[str, bytes], int]:
        """The wrapped engine's get-or-create of a resource group by name, measured."""
        return cast(Callable[[str, bytes], int], self._extension("resource_group_by_name", BY_NAME))

    @property
    def register_jobs(self) -> RegisterJobs:
        """The wrapped engine's registration of several jobs at once, measured."""
        return cast(RegisterJobs, self._extension("register_jobs", REGISTER_SEVERAL))

    @property
    def start_ready_jobs(self) -> StartReadyJobs:
        """The wrapped engine's start of several Ready jobs at once, measured."""
        return cast(StartReadyJobs, self._extension("start_ready_jobs", START_READY))

    def _extension(self, name: str, method: str) -> Callable[..., object]:
        """The wrapped engine's ``name``, measured under ``method``; ``AttributeError`` when the
        engine has none."""
        call = getattr(self.inner, name, None)
        if not callable(call):
            raise AttributeError(name)
        return partial(measure, method, call)

    def add_resource_group(self, external_id: str, password: bytes) -> int:
        return measure("AddResourceGroup", self.inner.add_resource_group, external_id, password)

    def verify_resource_group(self, resource_group_id: int, password: bytes) -> None:
        measure(
            "VerifyResourceGroup", self.inner.verify_resource_group, resource_group_id, password
        )

    def register_job(
        self, resource_group_id: int, compressed_task_graph: bytes, compressed_inputs: bytes
    ) -> int:
        return measure(
            "RegisterJob",
            self.inner.register_job,
            resource_group_id,
            compressed_task_graph,
            compressed_inputs,
        )

    def start_job(self, job_id: int) -> JobState:
        return measure("StartJob", self.inner.start_job, job_id)

    def cancel_job(self, job_id: int) -> JobState:
        return measure("CancelJob", self.inner.cancel_job, job_id)

    def get_job_state(self, job_id: int) -> JobState:
        return measure("GetJobState", self.inner.get_job_state, job_id)

    def get_job_outputs(self, job_id: int) -> list[bytes]:
        return measure("GetJobOutputs", self.inner.get_job_outputs, job_id)

    def get_job_error(self, job_id: int) -> str:
        return measure("GetJobError", self.inner.get_job_error, job_id)


if TYPE_CHECKING:

    def _implements_the_port(spider: MeasuredSpider) -> SpiderPort:
        return spider
