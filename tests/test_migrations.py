"""Migrations: a fresh schema equal to the models, adoption of a legacy CLP database, downgrade."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import datetime

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Engine, inspect, text

from coordinator.config.locations import DATABASE_URL_ENV, PROJECT_ROOT
from coordinator.store import migrate, names
from coordinator.store.schema import Base

CLP_TABLES = {
    names.COMPRESSION_JOBS,
    names.INGESTION_JOBS,
    names.INGESTED_S3_OBJECT_METADATA,
    names.DATASETS,
    names.SPIDER_RESOURCE_GROUPS,
}
COORDINATOR_TABLES = {
    names.COMPRESSION_JOB_TRANSITIONS,
    names.ADOPTED_TABLES,
    names.STORED_ARCHIVES,
    names.ENGINE_RESOURCE_GROUPS,
    names.ENGINE_JOBS,
}
COORDINATOR_JOB_COLUMNS = {"lease_owner", "lease_expires_at", "lease_epoch", "cancel_requested_at"}

# compression_jobs as CLP created it before #2421 (2026-07-27): no spider_id, no dispatch_time, no
# JOB_SPIDER_ID, no ON UPDATE; JOB_START_TIME_STATUS only exists where CLP's one upgrade step ran.
LEGACY_COMPRESSION_JOBS = {
    "mysql": """
        CREATE TABLE IF NOT EXISTS compression_jobs (
            id INT NOT NULL AUTO_INCREMENT,
            status INT NOT NULL DEFAULT '0',
            status_msg VARCHAR(512) NOT NULL DEFAULT '',
            creation_time DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
            start_time DATETIME(3) NULL DEFAULT NULL,
            update_time DATETIME NOT NULL DEFAULT CURRENT_TIMESTAMP(),
            duration FLOAT NULL DEFAULT NULL,
            original_size BIGINT NOT NULL DEFAULT '0',
            uncompressed_size BIGINT NOT NULL DEFAULT '0',
            compressed_size BIGINT NOT NULL DEFAULT '0',
            num_tasks INT NOT NULL DEFAULT '0',
            num_tasks_completed INT NOT NULL DEFAULT '0',
            clp_binary_version INT NULL DEFAULT NULL,
            clp_config MEDIUMBLOB NOT NULL,
            PRIMARY KEY (id) USING BTREE,
            INDEX JOB_STATUS (status) USING BTREE,
            INDEX JOB_UPDATE_TIME (update_time) USING BTREE
        ) ROW_FORMAT=DYNAMIC
    """,
    "sqlite": """
        CREATE TABLE compression_jobs (
            id INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT,
            status INT NOT NULL DEFAULT '0',
            status_msg VARCHAR(512) NOT NULL DEFAULT '',
            creation_time DATETIME NOT NULL DEFAULT CURRENT_TIMESTAMP,
            start_time DATETIME NULL DEFAULT NULL,
            update_time DATETIME NOT NULL DEFAULT CURRENT_TIMESTAMP,
            duration FLOAT NULL DEFAULT NULL,
            original_size BIGINT NOT NULL DEFAULT '0',
            uncompressed_size BIGINT NOT NULL DEFAULT '0',
            compressed_size BIGINT NOT NULL DEFAULT '0',
            num_tasks INT NOT NULL DEFAULT '0',
            num_tasks_completed INT NOT NULL DEFAULT '0',
            clp_binary_version INT NULL DEFAULT NULL,
            clp_config BLOB NOT NULL
        )
    """,
}
LEGACY_INDEXES_SQLITE = (
    "CREATE INDEX JOB_STATUS ON compression_jobs (status)",
    "CREATE INDEX JOB_UPDATE_TIME ON compression_jobs (update_time)",
)
LEGACY_COLUMNS = (
    "id, status, status_msg, creation_time, start_time, update_time, duration, original_size, "
    "uncompressed_size, compressed_size, num_tasks, num_tasks_completed, clp_binary_version, "
    "clp_config"
)
LEGACY_ROWS = [
    # id, status, status_msg, creation, start, update, duration, sizes..., tasks, done, version, cfg
    (
        1,
        2,
        "",
        "2026-01-02 03:04:05.678",
        "2026-01-02 03:04:06.000",
        "2026-01-02 03:05:00",
        54.5,
        10,
        100,
        20,
        2,
        2,
        None,
        b"\x28\xb5\x2f\xfd legacy 1",
    ),
    (
        2,
        3,
        "Failed to decompress job config.",
        "2026-01-03 00:00:00.001",
        None,
        "2026-01-03 00:00:01",
        None,
        0,
        0,
        0,
        0,
        0,
        7,
        b"legacy 2",
    ),
    (
        3,
        0,
        "",
        "2026-01-04 00:00:00.000",
        None,
        "2026-01-04 00:00:00",
        None,
        0,
        0,
        0,
        0,
        0,
        None,
        b"legacy 3",
    ),
]


def _dialect(engine: Engine) -> str:
    return "mysql" if engine.dialect.name in ("mysql", "mariadb") else "sqlite"


def _create_legacy_clp_database(engine: Engine) -> None:
    with engine.begin() as connection:
        connection.execute(text(LEGACY_COMPRESSION_JOBS[_dialect(engine)]))
        if _dialect(engine) == "sqlite":
            for statement in LEGACY_INDEXES_SQLITE:
                connection.execute(text(statement))
        placeholders = ", ".join(f":c{i}" for i in range(14))
        for row in LEGACY_ROWS:
            connection.execute(
                text(f"INSERT INTO compression_jobs ({LEGACY_COLUMNS}) VALUES ({placeholders})"),
                {f"c{i}": value for i, value in enumerate(row)},
            )
        connection.execute(
            text(
                "CREATE TABLE clp_datasets (name VARCHAR(255) NOT NULL PRIMARY KEY, "
                "archive_storage_directory VARCHAR(4096) NOT NULL)"
            )
        )
        connection.execute(text("INSERT INTO clp_datasets VALUES ('default', 'archives/default')"))


def _legacy_rows(engine: Engine) -> list[tuple[object, ...]]:
    with engine.connect() as connection:
        rows = connection.execute(
            text(f"SELECT {LEGACY_COLUMNS} FROM compression_jobs ORDER BY id")
        ).all()
    return [tuple(row) for row in rows]


def _schema_differences(engine: Engine) -> list[object]:
    with engine.connect() as connection:
        return list(compare_metadata(MigrationContext.configure(connection), Base.metadata))


def test_a_fresh_database_gets_exactly_the_modelled_schema(engine: Engine) -> None:
    migrate.upgrade(engine)
    assert migrate.current_revision(engine) == migrate.head_revision()
    assert set(inspect(engine).get_table_names()) == CLP_TABLES | COORDINATOR_TABLES | {
        "alembic_version"
    }
    assert _schema_differences(engine) == []
    with engine.connect() as connection:
        adopted = connection.execute(text("SELECT COUNT(*) FROM coordinator_adopted_tables"))
        assert adopted.scalar_one() == 0


def test_downgrade_removes_what_the_upgrade_created_and_can_upgrade_again(engine: Engine) -> None:
    migrate.upgrade(engine)
    migrate.downgrade(engine, "0001")
    columns = {c["name"] for c in inspect(engine).get_columns(names.COMPRESSION_JOBS)}
    assert not columns & COORDINATOR_JOB_COLUMNS
    assert names.COMPRESSION_JOB_TRANSITIONS not in inspect(engine).get_table_names()
    migrate.downgrade(engine, "base")
    assert set(inspect(engine).get_table_names()) == {"alembic_version"}
    migrate.upgrade(engine)
    assert _schema_differences(engine) == []


def test_a_legacy_clp_database_is_upgraded_in_place_idempotently(engine: Engine) -> None:
    _create_legacy_clp_database(engine)
    before = _legacy_rows(engine)

    migrate.upgrade(engine)
    migrate.upgrade(engine)  # at head: nothing to do
    # Forget the revision and run every step again: each one checks before it changes anything.
    with engine.begin() as connection:
        connection.execute(text("DELETE FROM alembic_version"))
    migrate.upgrade(engine)

    inspector = inspect(engine)
    columns = {c["name"]: c for c in inspector.get_columns(names.COMPRESSION_JOBS)}
    assert {"spider_id", "dispatch_time"} | COORDINATOR_JOB_COLUMNS <= set(columns)
    indexes = {i["name"]: i["column_names"] for i in inspector.get_indexes(names.COMPRESSION_JOBS)}
    assert indexes["JOB_SPIDER_ID"] == ["spider_id"]
    assert indexes["JOB_START_TIME_STATUS"] == ["start_time", "status"]
    assert _legacy_rows(engine) == before
    with engine.connect() as connection:
        assert connection.execute(text("SELECT * FROM clp_datasets")).all() == [
            ("default", "archives/default")
        ]
        new_columns = connection.execute(
            text("SELECT spider_id, dispatch_time, lease_epoch FROM compression_jobs")
        ).all()
        assert new_columns == [(None, None, 0)] * len(before)
        adopted = (
            connection.execute(
                text("SELECT table_name FROM coordinator_adopted_tables ORDER BY table_name")
            )
            .scalars()
            .all()
        )
    assert adopted == [names.DATASETS, names.COMPRESSION_JOBS]

    if _dialect(engine) == "mysql":
        with engine.connect() as connection:
            extra = connection.execute(
                text(
                    "SELECT EXTRA FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() "
                    "AND TABLE_NAME = 'compression_jobs' AND COLUMN_NAME = 'update_time'"
                )
            ).scalar_one()
        assert "on update" in extra.lower()

    migrate.downgrade(engine, "base")
    # 0005 gave the registered dataset CLP's three tables; they are CLP's and stay.
    assert set(inspect(engine).get_table_names()) == {
        names.COMPRESSION_JOBS,
        names.DATASETS,
        "alembic_version",
        names.archives_table_name("default"),
        names.files_table_name("default"),
        names.column_metadata_table_name("default"),
    }
    assert _legacy_rows(engine) == before


def test_alembic_command_line_reads_the_database_url_from_the_environment(
    tmp_path: os.PathLike[str],
) -> None:
    url = f"sqlite:///{tmp_path}/cli.db"
    environment = {**os.environ, DATABASE_URL_ENV: url}
    completed = subprocess.run(
        [sys.executable, "-m", "alembic", "upgrade", "head"],
        cwd=PROJECT_ROOT,
        env=environment,
        capture_output=True,
        text=True,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    current = subprocess.run(
        [sys.executable, "-m", "alembic", "current"],
        cwd=PROJECT_ROOT,
        env=environment,
        capture_output=True,
        text=True,
        check=True,
    )
    assert f"{migrate.head_revision()} (head)" in current.stdout


def test_the_timestamps_keep_milliseconds(engine: Engine) -> None:
    migrate.upgrade(engine)
    with engine.begin() as connection:
        connection.execute(
            text("INSERT INTO compression_jobs (clp_config, start_time) VALUES (:c, :s)"),
            {"c": b"x", "s": datetime(2026, 1, 2, 3, 4, 5, 678000)},
        )
        start = connection.execute(text("SELECT start_time FROM compression_jobs")).scalar_one()
    if isinstance(start, str):
        start = datetime.fromisoformat(start)
    assert start == datetime(2026, 1, 2, 3, 4, 5, 678000)
