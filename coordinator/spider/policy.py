"""Execution policies of Spider tasks, validated by Spider's rules (``docs/spider.md``).

Rules (checked client-side and again by Spider when it decodes a graph; a violation makes
RegisterJob fail with INVALID_ARGUMENT): ``max_num_instances >= 1``; each timeout within
[100 ms, 24 h]; ``hard_timeout_ms > soft_timeout_ms``.

Compress tasks follow CLP: soft 3 min and hard 5 min per object, ``max_num_instances = 1``,
``max_num_retry = compression_task_max_retry``. CLP's rule makes a partition of more than 288
objects unsubmittable (hard timeout over 24 h) and so fails the whole job (hazard H4,
``docs/hazards.md``). Here the hard timeout is **clamped** at Spider's 24 h maximum and the soft
timeout stays 3/5 of the hard one (= 3 min per object below the clamp), so every partition CLP's
algorithm forms is runnable and up to 288 objects the policy is CLP's exactly. Partitions keep their
CLP shape (archive sizes stay on target) rather than being split to fit a per-object timeout that is
only a safety net.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from coordinator.errors import CoordinatorError

MIN_TIMEOUT_MS = 100
MAX_TIMEOUT_MS = 24 * 60 * 60 * 1000
U32_MAX = 2**32 - 1

COMPRESSION_SOFT_TIMEOUT_PER_OBJECT_MS = 3 * 60 * 1000
COMPRESSION_HARD_TIMEOUT_PER_OBJECT_MS = 5 * 60 * 1000


class InvalidExecutionPolicy(CoordinatorError, ValueError):
    """A policy Spider would reject; the message is Spider's rule."""


@dataclass(frozen=True)
class TimeoutPolicy:
    """Soft timeout (a duplicate instance may start) and hard timeout (the instance is killed)."""

    soft_timeout_ms: int = 150_000
    hard_timeout_ms: int = 300_000

    def __post_init__(self) -> None:
        for name in ("soft_timeout_ms", "hard_timeout_ms"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise InvalidExecutionPolicy(f"`{name}` must be an integer number of milliseconds")
            if value < MIN_TIMEOUT_MS:
                raise InvalidExecutionPolicy(f"`{name}` must be >= {MIN_TIMEOUT_MS}ms")
            if value > MAX_TIMEOUT_MS:
                raise InvalidExecutionPolicy(f"`{name}` must be <= {MAX_TIMEOUT_MS}ms")
        if self.hard_timeout_ms <= self.soft_timeout_ms:
            raise InvalidExecutionPolicy("`hard_timeout_ms` must be greater than `soft_timeout_ms`")

    def to_json(self) -> dict[str, int]:
        """Spider's JSON form."""
        return {"soft_timeout_ms": self.soft_timeout_ms, "hard_timeout_ms": self.hard_timeout_ms}


@dataclass(frozen=True)
class ExecutionPolicy:
    """How often a task may be retried, how many instances may run, and its timeouts."""

    max_num_retry: int = 0
    max_num_instances: int = 1
    timeout_policy: TimeoutPolicy = TimeoutPolicy()

    def __post_init__(self) -> None:
        for name in ("max_num_retry", "max_num_instances"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= U32_MAX:
                raise InvalidExecutionPolicy(f"`{name}` must be an integer from 0 to {U32_MAX}")
        if self.max_num_instances < 1:
            raise InvalidExecutionPolicy("`max_num_instances` must be greater than 0")

    def to_json(self) -> dict[str, Any]:
        """Spider's JSON form (field order as serde_json writes it)."""
        return {
            "max_num_retry": self.max_num_retry,
            "max_num_instances": self.max_num_instances,
            "timeout_policy": self.timeout_policy.to_json(),
        }


DEFAULT_POLICY = ExecutionPolicy()
"""Spider's default; a regular task with exactly this policy is serialized without one."""


def compression_task_policy(num_objects: int, max_retry: int) -> ExecutionPolicy:
    """The policy of a compress task over ``num_objects`` objects (see the module docstring).

    Raises ``InvalidExecutionPolicy`` for ``num_objects < 1`` or a retry count outside u32.
    """
    if num_objects < 1:
        raise InvalidExecutionPolicy("a compression task needs at least one object")
    hard = min(num_objects * COMPRESSION_HARD_TIMEOUT_PER_OBJECT_MS, MAX_TIMEOUT_MS)
    soft = hard * COMPRESSION_SOFT_TIMEOUT_PER_OBJECT_MS // COMPRESSION_HARD_TIMEOUT_PER_OBJECT_MS
    return ExecutionPolicy(max_retry, 1, TimeoutPolicy(soft, hard))


def commit_task_policy(
    max_retry: int, soft_timeout_secs: int, hard_timeout_secs: int
) -> ExecutionPolicy:
    """The commit task's policy from ``compression_coordinator``'s settings (one instance).

    Raises ``InvalidExecutionPolicy`` when the timeouts break Spider's rules (soft must be below
    hard, both within [0.1 s, 24 h]), a check CLP leaves to the first job's submission (H10).
    """
    timeouts = TimeoutPolicy(soft_timeout_secs * 1000, hard_timeout_secs * 1000)
    return ExecutionPolicy(max_retry, 1, timeouts)
