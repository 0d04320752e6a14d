"""The Spider resource group, per engine.

The embedded engine resolves the group by name from its own records and never reads or writes
CLP's ``spider_resource_groups``; a Spider reached over gRPC keeps the id in that table, as CLP's
Rust coordinator does (get-or-create, a stale id after a Spider reset, concurrent registration).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy import Engine, delete, func, select, text

from coordinator.config.loader import CoordinatorConfig
from coordinator.engine.embedded.engine import EmbeddedSpider
from coordinator.engine.grpc_server import serve
from coordinator.lifecycle import JobStatus
from coordinator.runtime import open_runtime
from coordinator.service.ingest import submit_job
from coordinator.service.resource_group import ResourceGroup, ResourceGroupUnavailable
from coordinator.spider.grpc.client import GrpcSpider
from coordinator.store.schema import engine_resource_groups, spider_resource_groups
from tests.engine_support import running_engine
from tests.service_support import SpiderProxy, job_row, put_logs, run_until_idle

NAME = "compression-coordinator"
CLP_ROW_ID = 987_654_321
"""An id some Spider cluster handed CLP's Rust coordinator; the embedded engine cannot verify it."""


def _rows(engine: Engine) -> list[tuple[str, int]]:
    with engine.connect() as connection:
        rows = connection.execute(
            select(spider_resource_groups.c.rg_name, spider_resource_groups.c.rg_id)
        )
        return [(str(name), int(rg_id)) for name, rg_id in rows]


def _clp_table_bytes(engine: Engine) -> list[tuple[object, ...]]:
    """Every stored byte of CLP's table (names as binary, so a rewrite with another collation or
    padding shows)."""
    hexed = "HEX(rg_name), HEX(CAST(rg_id AS CHAR))"
    with engine.connect() as connection:
        rows = connection.execute(
            text(f"SELECT {hexed} FROM spider_resource_groups ORDER BY rg_name")
        ).all()
    return [tuple(row) for row in rows]


def _engine_groups(engine: Engine) -> list[tuple[int, str]]:
    with engine.connect() as connection:
        rows = connection.execute(
            select(engine_resource_groups.c.id, engine_resource_groups.c.external_id).order_by(
                engine_resource_groups.c.id
            )
        ).all()
    return [(int(r[0]), str(r[1])) for r in rows]


def _insert_clp_row(engine: Engine, rg_id: int = CLP_ROW_ID) -> None:
    # What CLP's Rust coordinator writes (components/compression-coordinator/src/coordination.rs).
    with engine.begin() as connection:
        connection.execute(
            text("INSERT INTO spider_resource_groups (rg_name, rg_id) VALUES (:name, :id)"),
            {"name": NAME, "id": rg_id},
        )


# --- the embedded engine: its own records -----------------------------------------------------


def test_the_embedded_engine_keeps_the_group_in_its_own_records(
    migrated_engine: Engine, tmp_path: Path
) -> None:
    with running_engine(migrated_engine, tmp_path) as spider:
        first = ResourceGroup(migrated_engine, spider, NAME)
        assert not first.uses_clp_table
        group_id = first.id()
        assert ResourceGroup(migrated_engine, spider, NAME).id() == group_id  # a later start
        wrapped = ResourceGroup(migrated_engine, SpiderProxy(spider), NAME)  # tests' wrappers
        assert not wrapped.uses_clp_table and wrapped.id() == group_id
        spider.verify_resource_group(group_id, NAME.encode())  # password = the name, as CLP
    assert _engine_groups(migrated_engine) == [(group_id, NAME)]
    assert _rows(migrated_engine) == []  # CLP's table stays empty


def test_a_clp_row_the_engine_cannot_verify_is_neither_deleted_nor_in_the_way(
    migrated_engine: Engine, tmp_path: Path
) -> None:
    _insert_clp_row(migrated_engine)
    before = _clp_table_bytes(migrated_engine)
    with running_engine(migrated_engine, tmp_path) as spider:
        group = ResourceGroup(migrated_engine, spider, NAME)
        group_id = group.id()
        group.invalidate()  # as after RegisterJob answered UNAUTHENTICATED
        assert group.id() == group_id
    assert group_id != CLP_ROW_ID
    assert _clp_table_bytes(migrated_engine) == before
    assert _rows(migrated_engine) == [(NAME, CLP_ROW_ID)]


def test_a_group_the_engine_has_is_found_by_name_without_any_clp_row(
    migrated_engine: Engine, tmp_path: Path
) -> None:
    """The case that used to wedge: the engine knows the name, CLP's table records no id."""
    with running_engine(migrated_engine, tmp_path) as spider:
        existing = spider.add_resource_group(NAME, NAME.encode())
        assert ResourceGroup(migrated_engine, spider, NAME).id() == existing
    assert _rows(migrated_engine) == []


def test_the_engine_losing_its_groups_registers_the_group_anew(
    migrated_engine: Engine, tmp_path: Path
) -> None:
    _insert_clp_row(migrated_engine)
    with running_engine(migrated_engine, tmp_path) as spider:
        group = ResourceGroup(migrated_engine, spider, NAME)
        group.id()
        with migrated_engine.begin() as connection:  # the engine's storage is reset (H11)
            connection.execute(delete(engine_resource_groups))
        group.invalidate()
        new = group.id()
        spider.verify_resource_group(new, NAME.encode())
    assert _engine_groups(migrated_engine) == [(new, NAME)]
    assert _rows(migrated_engine) == [(NAME, CLP_ROW_ID)]


def test_a_group_of_the_same_name_with_another_password_is_a_clear_error(
    migrated_engine: Engine, tmp_path: Path
) -> None:
    with running_engine(migrated_engine, tmp_path) as spider:
        spider.add_resource_group(NAME, b"someone else's")
        with pytest.raises(ResourceGroupUnavailable, match="another password"):
            ResourceGroup(migrated_engine, spider, NAME).id()


def test_replicas_sharing_a_database_agree_on_one_group(
    migrated_engine: Engine, tmp_path: Path
) -> None:
    with (
        running_engine(migrated_engine, tmp_path / "a", workers=1) as first,
        running_engine(migrated_engine, tmp_path / "b", workers=1) as second,
    ):
        ids = _resolve_at_once([first, second, first, second], migrated_engine)
    assert len(set(ids)) == 1
    assert _engine_groups(migrated_engine) == [(ids[0], NAME)]
    assert _rows(migrated_engine) == []


def _resolve_at_once(spiders: list[EmbeddedSpider] | list[GrpcSpider], engine: Engine) -> list[int]:
    barrier = threading.Barrier(len(spiders))
    ids: list[int] = []
    errors: list[BaseException] = []

    def resolve(spider: EmbeddedSpider | GrpcSpider) -> None:
        try:
            barrier.wait(timeout=10)
            ids.append(ResourceGroup(engine, spider, NAME).id())
        except BaseException as error:  # reported below, in the test's thread
            errors.append(error)

    threads = [threading.Thread(target=resolve, args=(spider,)) for spider in spiders]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(ids) == len(spiders)
    return ids


# --- a whole job on the embedded default --------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("clp_row", [True, False], ids=["clp-row", "empty"])
def test_a_whole_job_on_the_embedded_engine_leaves_clp_s_table_untouched(
    config: CoordinatorConfig, tmp_path: Path, clp_row: bool
) -> None:
    put_logs(config, tmp_path, ["rg0"])
    with open_runtime(config, lease_secs=5) as rt:
        if clp_row:
            _insert_clp_row(rt.engine)
        before = _clp_table_bytes(rt.engine)
        job = submit_job(config, rt.engine, timestamp_key="timestamp")
        run_until_idle(rt.coordinator, timeout=60)
        row = job_row(rt, job)
        assert (row.status, row.status_msg) == (JobStatus.SUCCEEDED, "")
        assert _clp_table_bytes(rt.engine) == before
        assert [name for _, name in _engine_groups(rt.engine)] == [NAME]


# --- a Spider over gRPC: CLP's table, as CLP's Rust coordinator ---------------------------------


@contextmanager
def _over_grpc(engine: Engine, directory: Path) -> Iterator[Callable[[], GrpcSpider]]:
    """The embedded engine served over Spider's protocol; a factory of clients (one per caller)."""
    clients: list[GrpcSpider] = []
    with running_engine(engine, directory) as spider:
        server = serve(spider, "127.0.0.1", 0)

        def client() -> GrpcSpider:
            clients.append(GrpcSpider("127.0.0.1", server.port, deadline_secs=30))
            return clients[-1]

        try:
            yield client
        finally:
            for each in clients:
                each.close()
            server.stop(0)


def test_over_grpc_the_group_is_get_or_created_in_clp_s_table(
    migrated_engine: Engine, tmp_path: Path
) -> None:
    with _over_grpc(migrated_engine, tmp_path) as client:
        spider = client()
        group = ResourceGroup(migrated_engine, spider, NAME)
        assert group.uses_clp_table
        assert ResourceGroup(migrated_engine, SpiderProxy(spider), NAME).uses_clp_table
        first = group.id()
        assert _rows(migrated_engine) == [(NAME, first)]
        assert ResourceGroup(migrated_engine, spider, NAME).id() == first
        spider.verify_resource_group(first, NAME.encode())


def test_over_grpc_a_stale_id_after_a_spider_reset_is_replaced(
    migrated_engine: Engine, tmp_path: Path
) -> None:
    with _over_grpc(migrated_engine, tmp_path) as client:
        spider = client()
        group = ResourceGroup(migrated_engine, spider, NAME)
        old = group.id()
        with migrated_engine.begin() as connection:  # Spider's storage loses the group (H11)
            connection.execute(delete(engine_resource_groups))
        group.invalidate()  # as after RegisterJob answered UNAUTHENTICATED
        new = group.id()  # a reset store may hand out the same number again
        with migrated_engine.connect() as connection:
            in_spider = connection.execute(select(engine_resource_groups.c.id)).scalars().all()
        assert in_spider == [new]  # registered anew
        assert _rows(migrated_engine) == [(NAME, new)]
        spider.verify_resource_group(new, NAME.encode())
        assert old > 0


def test_over_grpc_coordinators_registering_at_once_agree(
    migrated_engine: Engine, tmp_path: Path
) -> None:
    with _over_grpc(migrated_engine, tmp_path) as client:
        ids = _resolve_at_once([client() for _ in range(4)], migrated_engine)
    assert len(set(ids)) == 1
    with migrated_engine.connect() as connection:
        in_spider = connection.execute(
            select(func.count()).select_from(engine_resource_groups)
        ).scalar_one()
    assert in_spider == 1
    assert _rows(migrated_engine) == [(NAME, ids[0])]


def test_over_grpc_a_registration_whose_id_was_never_recorded_is_found_and_recorded(
    migrated_engine: Engine, tmp_path: Path
) -> None:
    """A coordinator died (or the database went away) between AddResourceGroup and recording the
    id: Spider has the name, nothing records its id. Before, every later submission failed until
    an operator inserted the id; now VerifyResourceGroup (password = name) finds it."""
    with _over_grpc(migrated_engine, tmp_path) as client:
        spider = client()
        spider.add_resource_group("another-deployment", b"another-deployment")
        spider.add_resource_group("a-third", NAME.encode()[::-1])
        lost = spider.add_resource_group(NAME, NAME.encode())
        spider.add_resource_group("registered-later", b"registered-later")
        assert ResourceGroup(migrated_engine, spider, NAME).id() == lost
        assert _rows(migrated_engine) == [(NAME, lost)]
        assert ResourceGroup(migrated_engine, spider, NAME).id() == lost  # from the row now


@pytest.mark.slow
def test_over_grpc_a_group_spider_has_under_another_password_is_a_clear_error(
    migrated_engine: Engine, tmp_path: Path
) -> None:
    with _over_grpc(migrated_engine, tmp_path) as client:
        spider = client()
        spider.add_resource_group(NAME, b"not the name")
        with pytest.raises(ResourceGroupUnavailable, match="spider_resource_groups records no id"):
            ResourceGroup(migrated_engine, spider, NAME).id()
        assert _rows(migrated_engine) == []
