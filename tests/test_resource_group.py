"""The Spider resource group: get-or-create, a stale id after a Spider reset."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from sqlalchemy import Engine, delete, func, insert, select

from coordinator.service.resource_group import ResourceGroup, ResourceGroupUnavailable
from coordinator.store.schema import EngineResourceGroup, SpiderResourceGroup
from tests.engine_support import running_engine

NAME = "compression-coordinator"


def _rows(engine: Engine) -> list[tuple[str, int]]:
    with engine.connect() as connection:
        return [
            tuple(r)
            for r in connection.execute(
                select(SpiderResourceGroup.rg_name, SpiderResourceGroup.rg_id)
            )
        ]  # type: ignore[misc]


def test_get_or_create_registers_once_and_then_reads_the_row(
    migrated_engine: Engine, tmp_path: Path
) -> None:
    with running_engine(migrated_engine, tmp_path) as spider:
        first = ResourceGroup(migrated_engine, spider, NAME).id()
        assert _rows(migrated_engine) == [(NAME, first)]
        again = ResourceGroup(migrated_engine, spider, NAME)
        assert again.id() == first
        spider.verify_resource_group(first, NAME.encode())  # password = the name's bytes, as CLP


def test_a_stale_id_after_a_spider_reset_is_replaced(
    migrated_engine: Engine, tmp_path: Path
) -> None:
    with running_engine(migrated_engine, tmp_path) as spider:
        group = ResourceGroup(migrated_engine, spider, NAME)
        old = group.id()
        with migrated_engine.begin() as connection:  # Spider's storage loses the group (H11)
            connection.execute(delete(EngineResourceGroup))
        group.invalidate()  # as after RegisterJob answered UNAUTHENTICATED
        new = group.id()  # a reset store may hand out the same number again
        with migrated_engine.connect() as connection:
            in_spider = connection.execute(select(EngineResourceGroup.id)).scalars().all()
        assert in_spider == [new]  # registered anew
        assert _rows(migrated_engine) == [(NAME, new)]
        spider.verify_resource_group(new, NAME.encode())
        assert old > 0


def test_two_coordinators_registering_at_once_agree(
    migrated_engine: Engine, tmp_path: Path
) -> None:
    with running_engine(migrated_engine, tmp_path) as spider:
        barrier = threading.Barrier(4)
        ids: list[int] = []

        def resolve() -> None:
            barrier.wait(timeout=10)
            ids.append(ResourceGroup(migrated_engine, spider, NAME).id())

        threads = [threading.Thread(target=resolve) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(ids) == 4 and len(set(ids)) == 1
        with migrated_engine.connect() as connection:
            in_spider = connection.execute(
                select(func.count()).select_from(EngineResourceGroup)
            ).scalar_one()
        assert in_spider == 1
        assert _rows(migrated_engine) == [(NAME, ids[0])]


def test_a_group_spider_has_but_nobody_recorded_is_a_clear_error(
    migrated_engine: Engine, tmp_path: Path
) -> None:
    with running_engine(migrated_engine, tmp_path) as spider:
        spider.add_resource_group(NAME, NAME.encode())
        with pytest.raises(ResourceGroupUnavailable, match="spider_resource_groups records no id"):
            ResourceGroup(migrated_engine, spider, NAME).id()
        with migrated_engine.begin() as connection:
            connection.execute(insert(SpiderResourceGroup).values(rg_name="other", rg_id=99))
        assert (NAME, 99) not in _rows(migrated_engine)
