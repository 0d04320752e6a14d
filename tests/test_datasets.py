"""Dataset names are validated before any table name is built; tables are created on demand."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine, insert, inspect, select

from coordinator.store import names
from coordinator.store.datasets import archives_table, ensure_dataset_tables


@pytest.mark.parametrize("name", ["default", "a", "Logs_2026", "x" * 44, "_"])
def test_safe_names_are_accepted(name: str) -> None:
    assert names.validate_dataset_name(name) == name
    assert names.archives_table_name(name) == f"clp_{name}_archives"
    assert names.column_metadata_table_name(name) == f"clp_{name}_column_metadata"


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("", "only ASCII letters"),
        ("logs-2026", "only ASCII letters"),
        ("a b", "only ASCII letters"),
        ("x; DROP TABLE compression_jobs", "only ASCII letters"),
        ("données", "only ASCII letters"),
        ("x" * 45, "45 characters, at most 44"),
    ],
)
def test_unsafe_names_are_refused(name: str, reason: str) -> None:
    with pytest.raises(names.InvalidDatasetName, match=reason):
        names.archives_table_name(name)
    with pytest.raises(names.InvalidDatasetName):
        archives_table(name)


def test_a_missing_dataset_is_clps_default() -> None:
    assert names.resolve_dataset_name(None) == "default"
    assert names.resolve_dataset_name("web") == "web"


def test_dataset_tables_are_created_on_demand_and_only_once(migrated_engine: Engine) -> None:
    ensure_dataset_tables(migrated_engine, "web_logs")
    ensure_dataset_tables(migrated_engine, "web_logs")
    inspector = inspect(migrated_engine)
    assert {"clp_web_logs_archives", "clp_web_logs_column_metadata"} <= set(
        inspector.get_table_names()
    )
    unique = inspector.get_unique_constraints("clp_web_logs_archives")
    indexes = {i["name"]: i["column_names"] for i in inspector.get_indexes("clp_web_logs_archives")}
    assert ["id"] in [u["column_names"] for u in unique] or indexes.get("archive_id") == ["id"]
    assert indexes["archives_creation_order"] == ["creator_id", "creation_ix"]

    table = archives_table("web_logs")
    with migrated_engine.begin() as connection:
        connection.execute(
            insert(table).values(
                id="a1",
                begin_timestamp=1,
                end_timestamp=2,
                uncompressed_size=30,
                size=3,
                creator_id="7",
                creation_ix=0,
            )
        )
        ids = connection.execute(select(table.c.id, table.c.pagination_id)).all()
    assert ids == [("a1", 1)]
