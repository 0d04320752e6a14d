"""The per-dataset tables are exactly CLP's ``add_dataset`` tables; registration adopts CLP's rows.

CLP's DDL below is copied verbatim from ``components/clp-py-utils/clp_py_utils/
clp_metadata_db_utils.py`` (commit e00317e3; ``_create_archives_table``, ``_create_files_table``,
``_create_column_metadata_table`` and ``add_dataset``'s INSERT): CLP's statements are the real
client the coordinator's tables must be indistinguishable from.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, insert, inspect, select, text

from coordinator.lifecycle import JobStatus
from coordinator.store import migrate, names
from coordinator.store.archives import publish_archives
from coordinator.store.database import create_database_engine
from coordinator.store.datasets import (
    DatasetNameCollision,
    archives_table,
    column_metadata_table,
    dataset_tables,
    ensure_dataset_tables,
    files_table,
    register_dataset,
)
from coordinator.store.jobs import JobStore
from coordinator.task_io import ArchiveMetadata
from tests.paths import new_job_in

# --- CLP's statements, verbatim ---------------------------------------------------------------
# components/clp-py-utils/clp_py_utils/clp_metadata_db_utils.py: _create_archives_table
CLP_CREATE_ARCHIVES_TABLE = """
        CREATE TABLE IF NOT EXISTS `{archives_table_name}` (
            `pagination_id` BIGINT unsigned NOT NULL AUTO_INCREMENT,
            `id` VARCHAR(64) NOT NULL,
            `begin_timestamp` BIGINT NOT NULL,
            `end_timestamp` BIGINT NOT NULL,
            `uncompressed_size` BIGINT NOT NULL,
            `size` BIGINT NOT NULL,
            `creator_id` VARCHAR(64) NOT NULL,
            `creation_ix` INT NOT NULL,
            KEY `archives_creation_order` (`creator_id`,`creation_ix`) USING BTREE,
            UNIQUE KEY `archive_id` (`id`) USING BTREE,
            PRIMARY KEY (`pagination_id`)
        )
        """
# components/clp-py-utils/clp_py_utils/clp_metadata_db_utils.py: _create_files_table
CLP_CREATE_FILES_TABLE = """
        CREATE TABLE IF NOT EXISTS `{files_table_name}` (
            `id` VARCHAR(64) NOT NULL,
            `orig_file_id` VARCHAR(64) NOT NULL,
            `path` VARCHAR(12288) NOT NULL,
            `begin_timestamp` BIGINT NOT NULL,
            `end_timestamp` BIGINT NOT NULL,
            `num_uncompressed_bytes` BIGINT NOT NULL,
            `begin_message_ix` BIGINT NOT NULL,
            `num_messages` BIGINT NOT NULL,
            `archive_id` VARCHAR(64) NOT NULL,
            KEY `files_path` (path(768)) USING BTREE,
            KEY `files_archive_id` (`archive_id`) USING BTREE,
            PRIMARY KEY (`id`)
        ) ROW_FORMAT=DYNAMIC
        """
# components/clp-py-utils/clp_py_utils/clp_metadata_db_utils.py: _create_column_metadata_table
CLP_CREATE_COLUMN_METADATA_TABLE = """
        CREATE TABLE IF NOT EXISTS `{column_metadata_table_name}` (
            `name` VARCHAR(512) NOT NULL,
            `type` TINYINT NOT NULL,
            PRIMARY KEY (`name`, `type`)
        )
        """
# components/clp-py-utils/clp_py_utils/clp_metadata_db_utils.py: add_dataset
CLP_ADD_DATASET_INSERT = """INSERT INTO `{datasets_table_name}`
                (name, archive_storage_directory)
                VALUES (%s, %s)
                """


def clp_add_dataset(connection: Connection, dataset: str, archive_storage_directory: str) -> None:
    """What CLP's ``add_dataset`` runs (pymysql's ``%s`` placeholders, as CLP's connector)."""
    connection.exec_driver_sql(
        CLP_ADD_DATASET_INSERT.format(datasets_table_name="clp_datasets"),
        (dataset, f"{archive_storage_directory}/{dataset}"),
    )
    # create_metadata_db_tables: column metadata, archives, files, in that order.
    connection.exec_driver_sql(
        CLP_CREATE_COLUMN_METADATA_TABLE.format(
            column_metadata_table_name=f"clp_{dataset}_column_metadata"
        )
    )
    connection.exec_driver_sql(
        CLP_CREATE_ARCHIVES_TABLE.format(archives_table_name=f"clp_{dataset}_archives")
    )
    connection.exec_driver_sql(
        CLP_CREATE_FILES_TABLE.format(files_table_name=f"clp_{dataset}_files")
    )
    connection.commit()


# --- helpers ------------------------------------------------------------------------------------

SUFFIXES = ("archives", "files", "column_metadata")


def _show_create_table(connection: Connection, dataset: str, suffix: str) -> str:
    """``SHOW CREATE TABLE`` with the dataset's name replaced and the counter value dropped."""
    table = f"clp_{dataset}_{suffix}"
    statement = connection.execute(text(f"SHOW CREATE TABLE `{table}`")).one()[1]
    statement = statement.replace(f"`{table}`", "`clp_DATASET_" + suffix + "`")
    return re.sub(r" AUTO_INCREMENT=\d+", "", str(statement))


def _columns_and_keys(connection: Connection, table: str) -> tuple[list[Any], list[Any]]:
    columns = connection.execute(
        text(
            "SELECT COLUMN_NAME, COLUMN_TYPE, IS_NULLABLE, COLUMN_DEFAULT, EXTRA,"
            " CHARACTER_SET_NAME, COLLATION_NAME FROM information_schema.COLUMNS"
            " WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = :t ORDER BY ORDINAL_POSITION"
        ),
        {"t": table},
    ).all()
    keys = connection.execute(
        text(
            "SELECT INDEX_NAME, NON_UNIQUE, SEQ_IN_INDEX, COLUMN_NAME, SUB_PART, INDEX_TYPE"
            " FROM information_schema.STATISTICS"
            " WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = :t"
            " ORDER BY INDEX_NAME, SEQ_IN_INDEX"
        ),
        {"t": table},
    ).all()
    return [tuple(c) for c in columns], [tuple(k) for k in keys]


def _definition(engine: Engine, table: str) -> str:
    """The table's definition as the database stores it (indexes included on SQLite)."""
    with engine.connect() as connection:
        if engine.dialect.name == "sqlite":
            rows = connection.execute(
                text("SELECT sql FROM sqlite_master WHERE tbl_name = :t ORDER BY name"),
                {"t": table},
            )
            return "\n".join(str(row[0]) for row in rows)
        return str(connection.execute(text(f"SHOW CREATE TABLE `{table}`")).one()[1])


@pytest.fixture
def mariadb_engine(mariadb_url: str) -> Iterator[Engine]:
    """A migrated MariaDB database (these tests are about MariaDB's DDL)."""
    engine = create_database_engine(mariadb_url)
    migrate.upgrade(engine)
    yield engine
    engine.dispose()


def _archive(name: str, begin: int = 1, end: int = 2, size: int = 10) -> ArchiveMetadata:
    return ArchiveMetadata(
        id=name, begin_timestamp=begin, end_timestamp=end, size=size, uncompressed_size=size * 10
    )


def _running_job(store: JobStore, spider_id: int) -> int:
    return new_job_in(store, JobStatus.RUNNING, spider_id=spider_id)


def _datasets(engine: Engine) -> list[tuple[str, str]]:
    with engine.connect() as connection:
        rows = connection.execute(text("SELECT name, archive_storage_directory FROM clp_datasets"))
        return sorted((str(name), str(directory)) for name, directory in rows)


# --- names --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["default", "a", "Logs_2026", "x" * 44, "_"])
def test_safe_names_are_accepted(name: str) -> None:
    assert names.validate_dataset_name(name) == name
    assert names.archives_table_name(name) == f"clp_{name}_archives"
    assert names.files_table_name(name) == f"clp_{name}_files"
    assert names.column_metadata_table_name(name) == f"clp_{name}_column_metadata"
    assert [table.name for table in dataset_tables(name)] == [
        f"clp_{name}_column_metadata",
        f"clp_{name}_archives",
        f"clp_{name}_files",
    ]


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
    for build in (archives_table, files_table, column_metadata_table):
        with pytest.raises(names.InvalidDatasetName):
            build(name)


def test_a_missing_dataset_is_clps_default() -> None:
    assert names.resolve_dataset_name(None) == "default"
    assert names.resolve_dataset_name("web") == "web"


# --- creation on both databases -----------------------------------------------------------------


def test_dataset_tables_are_created_on_demand_and_only_once(migrated_engine: Engine) -> None:
    ensure_dataset_tables(migrated_engine, "web_logs")
    ensure_dataset_tables(migrated_engine, "web_logs")
    inspector = inspect(migrated_engine)
    assert {f"clp_web_logs_{suffix}" for suffix in SUFFIXES} <= set(inspector.get_table_names())
    mysql = migrated_engine.dialect.name in ("mysql", "mariadb")
    # CLP's key names on MariaDB; prefixed with the table on SQLite (its index names are global).
    prefix = "" if mysql else "{table}_"
    expected = {
        "clp_web_logs_archives": {"archives_creation_order": ["creator_id", "creation_ix"]},
        "clp_web_logs_files": {"files_path": ["path"], "files_archive_id": ["archive_id"]},
        "clp_web_logs_column_metadata": {},
    }
    for table_name, keys in expected.items():
        indexes = {i["name"]: i["column_names"] for i in inspector.get_indexes(table_name)}
        indexes.pop("archive_id", None)  # MariaDB reports the unique key as an index too
        assert indexes == {
            prefix.format(table=table_name) + name: cols for name, cols in keys.items()
        }
    unique = inspector.get_unique_constraints("clp_web_logs_archives")
    assert [(u["name"], u["column_names"]) for u in unique] == [("archive_id", ["id"])]
    assert inspector.get_pk_constraint("clp_web_logs_files")["constrained_columns"] == ["id"]
    assert inspector.get_pk_constraint("clp_web_logs_column_metadata")["constrained_columns"] == [
        "name",
        "type",
    ]

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


@pytest.mark.slow
def test_three_datasets_get_their_tables_and_publish_without_index_name_clashes(
    store: JobStore, migrated_engine: Engine
) -> None:
    """Before: on SQLite the second dataset's ``archives_creation_order`` clashed with the
    first's, ``ensure_dataset_tables`` failed and the job stayed Pending forever; ``_files`` never
    existed on either database."""
    datasets = ["alpha", "beta", "gamma"]
    for number, dataset in enumerate(datasets):
        spider_id = 100 + number
        _running_job(store, spider_id)
        publish_archives(
            store,
            spider_job_id=spider_id,
            dataset=dataset,
            archive_storage_directory=f"/var/clp/archives/{dataset}",
            archives=[_archive(f"{dataset}-0"), _archive(f"{dataset}-1", size=20)],
        )
    tables = set(inspect(migrated_engine).get_table_names())
    assert {f"clp_{d}_{suffix}" for d in datasets for suffix in SUFFIXES} <= tables
    with migrated_engine.connect() as connection:
        for number, dataset in enumerate(datasets):
            table = archives_table(dataset)
            rows = connection.execute(
                select(table.c.id, table.c.creator_id, table.c.creation_ix).order_by(table.c.id)
            ).all()
            assert [tuple(row) for row in rows] == [
                (f"{dataset}-0", str(100 + number), 0),
                (f"{dataset}-1", str(100 + number), 1),
            ]
    assert _datasets(migrated_engine) == [(d, f"/var/clp/archives/{d}") for d in datasets]


# --- CLP's DDL on MariaDB -----------------------------------------------------------------------


def test_our_tables_are_clps_ddl_on_mariadb(mariadb_engine: Engine) -> None:
    """``SHOW CREATE TABLE`` (and information_schema) of ours equals CLP's, table by table."""
    with mariadb_engine.connect() as connection:
        clp_add_dataset(connection, "clp_ref", "/var/clp/archives")
    ensure_dataset_tables(mariadb_engine, "ours")
    with mariadb_engine.connect() as connection:
        for suffix in SUFFIXES:
            theirs = _show_create_table(connection, "clp_ref", suffix)
            ours = _show_create_table(connection, "ours", suffix)
            assert ours == theirs, f"{suffix}:\n{ours}\n!=\n{theirs}"
            assert _columns_and_keys(connection, f"clp_ours_{suffix}") == _columns_and_keys(
                connection, f"clp_clp_ref_{suffix}"
            )
        files = _show_create_table(connection, "ours", "files")
    assert "KEY `files_path` (`path`(768)) USING BTREE" in files
    assert "ROW_FORMAT=DYNAMIC" in files


def test_tables_clp_created_first_are_adopted_untouched(mariadb_engine: Engine) -> None:
    """CLP's ``add_dataset`` ran first (its row, tables and an archive): ensure, register and a
    publication change none of it but add the job's archive rows."""
    with mariadb_engine.connect() as connection:
        clp_add_dataset(connection, "web", "/clp/archives")
        connection.execute(
            text(
                "INSERT INTO clp_web_archives (id, begin_timestamp, end_timestamp,"
                " uncompressed_size, size, creator_id, creation_ix)"
                " VALUES ('clp-archive', 5, 6, 70, 7, 'clp', 0)"
            )
        )
        connection.commit()
        before = [_show_create_table(connection, "web", suffix) for suffix in SUFFIXES]

    store = JobStore(mariadb_engine)
    ensure_dataset_tables(mariadb_engine, "web")
    with mariadb_engine.begin() as connection:
        register_dataset(connection, "web", "/coordinator/elsewhere/web")
    _running_job(store, 77)
    publish_archives(
        store,
        spider_job_id=77,
        dataset="web",
        archive_storage_directory="/coordinator/elsewhere/web",
        archives=[_archive("ours-0")],
    )

    with mariadb_engine.connect() as connection:
        after = [_show_create_table(connection, "web", suffix) for suffix in SUFFIXES]
        ids = connection.execute(text("SELECT id FROM clp_web_archives ORDER BY id")).scalars()
        assert list(ids) == ["clp-archive", "ours-0"]
    assert after == before
    assert _datasets(mariadb_engine) == [("web", "/clp/archives/web")]


# --- registration -------------------------------------------------------------------------------


def test_registration_inserts_clps_row_once_and_never_updates_it(migrated_engine: Engine) -> None:
    with migrated_engine.begin() as connection:
        register_dataset(connection, "web", "/var/clp/archives/web")
    with migrated_engine.begin() as connection:
        register_dataset(connection, "web", "/somewhere/else/web")
    assert _datasets(migrated_engine) == [("web", "/var/clp/archives/web")]


def test_concurrent_registrations_adopt_the_first_row_without_error(
    migrated_engine: Engine,
) -> None:
    """The second registration starts while the first one's insert is uncommitted: it waits (row
    lock on MariaDB, ``BEGIN IMMEDIATE`` on SQLite), then adopts the row without an error."""
    errors: list[BaseException] = []
    second_done = threading.Event()

    def second() -> None:
        try:
            with migrated_engine.begin() as connection:
                register_dataset(connection, "race", "/second/race")
        except BaseException as error:
            errors.append(error)
        finally:
            second_done.set()

    with migrated_engine.begin() as connection:
        register_dataset(connection, "race", "/first/race")
        thread = threading.Thread(target=second)
        thread.start()
        # A window in which a second registration that does not wait would finish: what is checked
        # is an absence, and a waiting statement cannot be observed on SQLite (it can stay short:
        # on a slow machine the check is weaker, never wrong).
        time.sleep(0.5)
        assert not second_done.is_set(), "the second registration did not wait for the first"
    thread.join(timeout=30)
    assert second_done.is_set() and errors == []
    assert _datasets(migrated_engine) == [("race", "/first/race")]


def test_a_name_differing_only_in_case_is_refused_on_mariadb(mariadb_engine: Engine) -> None:
    """MariaDB's collation finds ``web`` for ``Web``: adopting it would publish into
    ``clp_Web_archives``, a table no CLP reader looks at."""
    with mariadb_engine.begin() as connection:
        register_dataset(connection, "web", "/var/clp/archives/web")
    collision = pytest.raises(DatasetNameCollision, match="'Web' collides with the registered")
    with collision, mariadb_engine.begin() as connection:
        register_dataset(connection, "Web", "/var/clp/archives/Web")
    assert _datasets(mariadb_engine) == [("web", "/var/clp/archives/web")]


def test_concurrent_creators_of_the_same_tables_all_succeed(migrated_engine: Engine) -> None:
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def create() -> None:
        try:
            start.wait()
            ensure_dataset_tables(migrated_engine, "crowd")
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=create) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    assert {f"clp_crowd_{suffix}" for suffix in SUFFIXES} <= set(
        inspect(migrated_engine).get_table_names()
    )


# --- migration 0005 -----------------------------------------------------------------------------


def test_migration_0005_completes_the_datasets_an_earlier_version_registered(
    engine: Engine,
) -> None:
    """A database of the previous version: ``old`` has ``_archives`` (with a row) and
    ``_column_metadata`` as that version created them, ``bare`` is registered without tables, and
    ``bad-name`` is unsafe. 0005 creates exactly the missing tables; its downgrade keeps them."""
    migrate.upgrade(engine, "0004")
    mysql = engine.dialect.name in ("mysql", "mariadb")
    with engine.begin() as connection:
        # The previous version's DDL for ``clp_old_archives`` (its index name was CLP's, also on
        # SQLite) and ``clp_old_column_metadata``.
        connection.execute(
            text(
                "CREATE TABLE clp_old_archives ("
                + (
                    "pagination_id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT, "
                    if mysql
                    else "pagination_id INTEGER NOT NULL, "
                )
                + "id VARCHAR(64) NOT NULL, begin_timestamp BIGINT NOT NULL, "
                "end_timestamp BIGINT NOT NULL, uncompressed_size BIGINT NOT NULL, "
                "size BIGINT NOT NULL, creator_id VARCHAR(64) NOT NULL, "
                "creation_ix INTEGER NOT NULL, PRIMARY KEY (pagination_id), "
                "CONSTRAINT archive_id UNIQUE (id))"
            )
        )
        connection.execute(
            text(
                "CREATE INDEX archives_creation_order ON clp_old_archives (creator_id, creation_ix)"
            )
        )
        connection.execute(
            text(
                "CREATE TABLE clp_old_column_metadata (name VARCHAR(512) NOT NULL, "
                "type SMALLINT NOT NULL, PRIMARY KEY (name, type))"
            )
        )
        connection.execute(
            text(
                "INSERT INTO clp_old_archives (id, begin_timestamp, end_timestamp,"
                " uncompressed_size, size, creator_id, creation_ix)"
                " VALUES ('a', 1, 2, 30, 3, '9', 0)"
            )
        )
        for name in ("old", "bare", "bad-name"):
            connection.execute(
                text("INSERT INTO clp_datasets VALUES (:n, :d)"), {"n": name, "d": f"/a/{name}"}
            )
    old_definitions = [_definition(engine, f"clp_old_{s}") for s in ("archives", "column_metadata")]

    migrate.upgrade(engine, "0005")
    migrate.upgrade(engine, "0005")  # at 0005: nothing to do

    tables = set(inspect(engine).get_table_names())
    assert {"clp_old_archives", "clp_old_files", "clp_old_column_metadata"} <= tables
    assert {f"clp_bare_{suffix}" for suffix in SUFFIXES} <= tables
    assert not [table for table in tables if "bad" in table]
    assert [_definition(engine, f"clp_old_{s}") for s in ("archives", "column_metadata")] == (
        old_definitions
    )  # not altered
    with engine.connect() as connection:
        assert connection.execute(text("SELECT id FROM clp_old_archives")).scalars().all() == ["a"]
        # CLP's garbage collector's deletion now works for the old dataset
        # (clp_metadata_db_utils.delete_archives_from_metadata_db's statements).
        connection.execute(text("DELETE FROM `clp_old_files` WHERE archive_id in ('a')"))
        connection.execute(text("DELETE FROM `clp_old_archives` WHERE id in ('a')"))
        connection.rollback()

    migrate.downgrade(engine, "0004")
    assert tables <= set(inspect(engine).get_table_names()) | {"alembic_version"}
    assert _datasets(engine) == [
        ("bad-name", "/a/bad-name"),
        ("bare", "/a/bare"),
        ("old", "/a/old"),
    ]
