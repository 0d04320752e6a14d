"""RegisterJob's job ids (``coordinator.engine.embedded.engine``, "Job ids are never reused"), now
that CLP's tables are read at the first registration only, and the per-registration costs.

The engines here are not started (no executors): RegisterJob needs only the engine's presence.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, delete, event, insert, select

from coordinator.engine.embedded.engine import EmbeddedSpider
from coordinator.spider import task_graph as task_graph_module
from coordinator.spider.port import JobState
from coordinator.spider.task_graph import InvalidTaskGraph, decode_job_submission
from coordinator.spider.wire import encode_job_inputs
from coordinator.store.clock import utc_now
from coordinator.store.schema import engine_jobs
from coordinator.store.stored_archives import record_stored_archive
from tests.engine_support import graph, record_spider_ids, registrar, submit, task
from tests.paths import stored_record

PASSWORD = b"compression-coordinator"
GRAPH = graph(task("echo"))


def register(spider: EmbeddedSpider, group: int, payload: bytes = b"a") -> int:
    return submit(spider, group, GRAPH, [payload])


def test_the_ids_of_clp_tables_are_read_at_the_first_registration_only(
    migrated_engine: Engine, tmp_path: Path
) -> None:
    """Reading CLP's two columns at every registration was a third of the choice's statements."""
    record_spider_ids(migrated_engine, [7, 40])
    reads: list[str] = []

    def count(_c: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if "max(compression_jobs.spider_id)" in statement.lower():
            reads.append(statement)

    with registrar(migrated_engine, tmp_path, "a") as spider:
        group = spider.add_resource_group("rg", PASSWORD)
        event.listen(migrated_engine, "before_cursor_execute", count)
        try:
            ids = [register(spider, group, bytes([n])) for n in range(5)]
        finally:
            event.remove(migrated_engine, "before_cursor_execute", count)
    assert ids == [41, 42, 43, 44, 45]
    assert len(reads) == 1


def test_stored_archive_records_count_as_recorded_ids(
    migrated_engine: Engine, tmp_path: Path
) -> None:
    """A compress instance of a Spider job that no compression job records (a reset Spider)."""
    record_spider_ids(migrated_engine, [3])
    with migrated_engine.begin() as connection:
        record_stored_archive(
            connection, dataclasses.replace(stored_record("web", "a1", None), spider_job_id=900)
        )
    with registrar(migrated_engine, tmp_path, "a") as spider:
        group = spider.add_resource_group("rg", PASSWORD)
        assert register(spider, group) == 901


def test_ids_another_engine_chose_after_the_first_registration_stay_unused(
    migrated_engine: Engine, tmp_path: Path
) -> None:
    """The argument of the module docstring: an id recorded in CLP's tables after this engine read
    them was chosen by an engine sharing the database, so the engine table's rows cover it."""
    with (
        registrar(migrated_engine, tmp_path / "a", "a") as first,
        registrar(migrated_engine, tmp_path / "b", "b") as second,
    ):
        group = first.add_resource_group("rg", PASSWORD)
        assert register(first, group) == 1  # reads CLP's tables: nothing recorded
        others = [register(second, group, bytes([n])) for n in range(3)]
        record_spider_ids(migrated_engine, others)
        assert others == [2, 3, 4]
        assert register(first, group) == 5
        assert register(second, group) == 6


def test_a_reset_of_the_engine_table_under_a_running_engine_reads_clp_tables_again(
    migrated_engine: Engine, tmp_path: Path
) -> None:
    """The table emptied: CLP's tables are read again, so an id another engine chose before the
    reset (and a coordinator recorded) is not reused."""
    with registrar(migrated_engine, tmp_path, "a") as spider:
        group = spider.add_resource_group("rg", PASSWORD)
        first = register(spider, group)
        record_spider_ids(migrated_engine, [first, first + 10])  # + 10: another engine's
        with migrated_engine.begin() as connection:
            connection.execute(delete(engine_jobs))
        assert register(spider, group) == first + 11


def test_a_reset_that_leaves_the_smallest_id_is_noticed_by_the_largest(
    migrated_engine: Engine, tmp_path: Path
) -> None:
    """Rows deleted above the smallest: the table's largest id is below one this engine stored."""
    with registrar(migrated_engine, tmp_path, "a") as spider:
        group = spider.add_resource_group("rg", PASSWORD)
        first, second = register(spider, group), register(spider, group, b"b")
        record_spider_ids(migrated_engine, [second, second + 10])
        with migrated_engine.begin() as connection:
            connection.execute(delete(engine_jobs).where(engine_jobs.c.id > first))
        assert register(spider, group) == second + 11


def test_a_reset_that_leaves_larger_ids_is_noticed_by_the_smallest_id(
    migrated_engine: Engine, tmp_path: Path
) -> None:
    """A reset that replaced the rows (a restore, say) with some above this engine's ids: the
    table's smallest id changed, so CLP's tables are read again."""
    with registrar(migrated_engine, tmp_path, "a") as spider:
        group = spider.add_resource_group("rg", PASSWORD)
        first = register(spider, group)
        record_spider_ids(migrated_engine, [first + 50])
        with migrated_engine.begin() as connection:
            row = connection.execute(select(engine_jobs)).one()._asdict()
            connection.execute(delete(engine_jobs))
            connection.execute(insert(engine_jobs), {**row, "id": first + 1})
        assert register(spider, group) == first + 51


def test_an_id_collision_chooses_again_above_the_winner(
    migrated_engine: Engine, tmp_path: Path
) -> None:
    """The id is chosen from what the transaction reads; a row written between that read and the
    insert (another engine's) makes the insert fail on the primary key, and the next attempt
    reads it. Simulated by inserting the row from the first attempt's statement hook."""
    if migrated_engine.dialect.name == "sqlite":
        pytest.skip("SQLite serialises the writers: the other insert would wait for this one")
    with registrar(migrated_engine, tmp_path, "a") as spider:
        group = spider.add_resource_group("rg", PASSWORD)
        assert register(spider, group) == 1
        raced: list[int] = []

        def race(connection: Any, _cursor: Any, statement: str, *_: Any) -> None:
            if (
                statement.lstrip().upper().startswith("INSERT INTO SPIDER_ENGINE_JOBS")
                and not raced
            ):
                raced.append(2)
                with migrated_engine.begin() as other:  # another engine's committed row
                    now = utc_now()
                    other.execute(
                        insert(engine_jobs),
                        {
                            "id": 2,
                            "resource_group_id": group,
                            "state": "Ready",
                            "task_graph": GRAPH.compressed(),
                            "inputs": encode_job_inputs([b"x"]),
                            "created_at": now,
                            "updated_at": now,
                            "owner": "another-engine",
                        },
                    )

        event.listen(migrated_engine, "before_cursor_execute", race)
        try:
            assert register(spider, group) == 3
        finally:
            event.remove(migrated_engine, "before_cursor_execute", race)
        assert raced == [2]
        assert spider.get_job_state(3) is JobState.READY


def test_a_graph_is_parsed_once_per_payload_and_a_refused_one_every_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """RegisterJob parses the same graph bytes once (the parse was a quarter of its CPU); the
    answers do not change: a refused graph still raises at every registration."""
    parsed: list[bytes] = []
    parse = task_graph_module._parse_graph

    def counting(text: bytes) -> Any:
        parsed.append(text)
        return parse(text)

    monkeypatch.setattr(task_graph_module, "_parse_graph", counting)
    task_graph_module._decoded_graph.cache_clear()
    shape = graph(task("echo"), task("echo"))
    for n in range(3):
        submission = decode_job_submission(
            shape.compressed(), encode_job_inputs([bytes([n]), b"b"])
        )
        assert submission.task_graph == shape
        assert submission.inputs == (bytes([n]), b"b")
    assert len(parsed) == 1
    for _ in range(2):
        with pytest.raises(InvalidTaskGraph, match="input size mismatch"):
            decode_job_submission(shape.compressed(), encode_job_inputs([b"a"]))
    empty = graph()
    for _ in range(2):
        with pytest.raises(InvalidTaskGraph, match="at least one task"):
            decode_job_submission(empty.compressed(), encode_job_inputs([]))
    assert len(parsed) == 3  # the refused graph each time, the other not again
