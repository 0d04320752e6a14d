"""Issue 14's P2 case cuts the job it measures as it says: 2 partitions of 2 objects, then 1.

CLP's partitioning fills a partition while it is below the target, so the share of the job used
as target decides the split; 55 % cut the four objects 3 + 1, and the job then waited on one clp-s
over 75 % of the data. No timing here (benchmarks are not tests).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.suite import BIG_TWO_PARTITIONS, MIB, Sizes, workspace, write_big
from coordinator.partition import partition_objects


@pytest.fixture(scope="module")
def big_objects() -> list[tuple[str, int]]:
    """The objects ``write_big`` writes for a small P2 job (sizes differ by a chunk's rounding)."""
    with workspace(None, Sizes()) as ws:
        paths: list[Path] = write_big(ws, 4)
        return [(f"logs/{path.name}", path.stat().st_size) for path in paths]


def test_two_partitions_of_two_objects_each(big_objects: list[tuple[str, int]]) -> None:
    total = sum(size for _, size in big_objects)

    partitions = partition_objects(big_objects, int(total * BIG_TWO_PARTITIONS))

    assert [len(partition) for partition in partitions] == [2, 2]


def test_the_former_target_cut_three_and_one(big_objects: list[tuple[str, int]]) -> None:
    total = sum(size for _, size in big_objects)

    assert [len(p) for p in partition_objects(big_objects, int(total * 0.55))] == [3, 1]
    assert len(partition_objects(big_objects, total * 2)) == 1
    assert total >= 4 * MIB
