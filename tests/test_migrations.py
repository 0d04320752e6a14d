"""Migrations: a fresh schema equal to ``coordinator.store.schema``, adoption of a legacy CLP
database, downgrade."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import datetime

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Engine, inspect, text
from sqlalchemy.exc import OperationalError

from coordinator.config.locations import DATABASE_URL_ENV, PROJECT_ROOT
from coordinator.store import migrate, names
from coordinator.store.database import create_database_engine
from coordinator.store.datasets import ensure_dataset_tables
from coordinator.store.downgrade import DowngradeRefused
from coordinator.store.schema import metadata

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
    names.COORDINATOR_INSTANCES,
}
COORDINATOR_JOB_COLUMNS = {"lease_owner", "lease_expires_at", "lease_epoch", "cancel_requested_at"}
CLP_JOB_COLUMNS = {
    # compression_jobs in CLP's current DDL (initialize-orchestration-db.py)
    "id",
    "status",
    "status_msg",
    "creation_time",
    "start_time",
    "update_time",
    "duration",
    "original_size",
    "uncompressed_size",
    "compressed_size",
    "num_tasks",
    "num_tasks_completed",
    "clp_binary_version",
    "spider_id",
    "dispatch_time",
    "clp_config",
}

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
        return list(compare_metadata(MigrationContext.configure(connection), metadata))


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


def test_downgrade_removes_only_the_coordinator_s_own_and_can_upgrade_again(
    engine: Engine,
) -> None:
    migrate.upgrade(engine)
    migrate.downgrade(engine, "0001")
    columns = {c["name"] for c in inspect(engine).get_columns(names.COMPRESSION_JOBS)}
    assert not columns & (COORDINATOR_JOB_COLUMNS | {"committed_at"})
    assert columns >= CLP_JOB_COLUMNS
    assert names.COMPRESSION_JOB_TRANSITIONS not in inspect(engine).get_table_names()
    migrate.downgrade(engine, "base")
    # CLP's tables are CLP's, even those this coordinator created: they stay.
    assert set(inspect(engine).get_table_names()) == CLP_TABLES | {"alembic_version"}
    assert migrate.current_revision(engine) is None
    migrate.upgrade(engine)
    assert _schema_differences(engine) == []
    assert migrate.current_revision(engine) == migrate.head_revision()


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
    # 0005 gave the registered dataset CLP's three tables; they are CLP's and stay, as do the CLP
    # tables the upgrade created (CLP's from then on).
    assert set(inspect(engine).get_table_names()) == CLP_TABLES | {
        "alembic_version",
        names.archives_table_name("default"),
        names.files_table_name("default"),
        names.column_metadata_table_name("default"),
    }
    assert _legacy_rows(engine) == before


@pytest.mark.slow
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


# --- a downgrade never takes CLP's tables or data ------------------------------------------------

# CLP's own DDL, copied verbatim (but for two trailing spaces) with CLP's constants substituted
# (COMPRESSION_JOBS_TABLE_NAME = compression_jobs, COMPRESSION_TASKS_TABLE_NAME = compression_tasks,
# QUERY_JOBS_TABLE_NAME = query_jobs, QUERY_TASKS_TABLE_NAME = query_tasks, every *Status.PENDING =
# 0), run as CLP runs it at every package start:
# components/clp-py-utils/clp_py_utils/initialize-orchestration-db.py.
CLP_ORCHESTRATION_DDL = (
    """
                CREATE TABLE IF NOT EXISTS `compression_jobs` (
                    `id` INT NOT NULL AUTO_INCREMENT,
                    `status` INT NOT NULL DEFAULT '0',
                    `status_msg` VARCHAR(512) NOT NULL DEFAULT '',
                    `creation_time` DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
                    `start_time` DATETIME(3) NULL DEFAULT NULL,
                    `update_time` DATETIME NOT NULL DEFAULT CURRENT_TIMESTAMP()
                        ON UPDATE CURRENT_TIMESTAMP(),
                    `duration` FLOAT NULL DEFAULT NULL,
                    `original_size` BIGINT NOT NULL DEFAULT '0',
                    `uncompressed_size` BIGINT NOT NULL DEFAULT '0',
                    `compressed_size` BIGINT NOT NULL DEFAULT '0',
                    `num_tasks` INT NOT NULL DEFAULT '0',
                    `num_tasks_completed` INT NOT NULL DEFAULT '0',
                    `clp_binary_version` INT NULL DEFAULT NULL,
                    `spider_id` BIGINT UNSIGNED NULL DEFAULT NULL,
                    `dispatch_time` DATETIME NULL DEFAULT NULL,
                    `clp_config` MEDIUMBLOB NOT NULL,
                    PRIMARY KEY (`id`) USING BTREE,
                    INDEX `JOB_STATUS` (`status`) USING BTREE,
                    INDEX `JOB_UPDATE_TIME` (`update_time`) USING BTREE,
                    INDEX `JOB_START_TIME_STATUS` (`start_time`, `status`) USING BTREE,
                    INDEX `JOB_SPIDER_ID` (`spider_id`) USING BTREE
                ) ROW_FORMAT=DYNAMIC
                """,
    """
                CREATE TABLE IF NOT EXISTS `compression_tasks` (
                    `id` BIGINT NOT NULL AUTO_INCREMENT,
                    `status` INT NOT NULL DEFAULT '0',
                    `creation_time` DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
                    `start_time` DATETIME(3) NULL DEFAULT NULL,
                    `duration` FLOAT NULL DEFAULT NULL,
                    `job_id` INT NOT NULL,
                    `clp_paths_to_compress` MEDIUMBLOB NOT NULL,
                    `partition_original_size` BIGINT NOT NULL,
                    `partition_uncompressed_size` BIGINT NULL DEFAULT NULL,
                    `partition_compressed_size` BIGINT NULL DEFAULT NULL,
                    PRIMARY KEY (`id`) USING BTREE,
                    INDEX `job_id` (`job_id`) USING BTREE,
                    INDEX `TASK_STATUS` (`status`) USING BTREE,
                    INDEX `TASK_START_TIME` (`start_time`) USING BTREE,
                    CONSTRAINT `compression_tasks` FOREIGN KEY (`job_id`)
                    REFERENCES `compression_jobs` (`id`)
                    ON UPDATE NO ACTION ON DELETE NO ACTION
                ) ROW_FORMAT=DYNAMIC
                """,
    """
                CREATE TABLE IF NOT EXISTS `query_jobs` (
                    `id` INT NOT NULL AUTO_INCREMENT,
                    `type` INT NOT NULL,
                    `status` INT NOT NULL DEFAULT '0',
                    `creation_time` DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
                    `num_tasks` INT NOT NULL DEFAULT '0',
                    `num_tasks_completed` INT NOT NULL DEFAULT '0',
                    `start_time` DATETIME(3) NULL DEFAULT NULL,
                    `duration` FLOAT NULL DEFAULT NULL,
                    `job_config` MEDIUMBLOB NOT NULL,
                    PRIMARY KEY (`id`) USING BTREE,
                    INDEX `CREATION_TIME` (`creation_time`) USING BTREE,
                    INDEX `JOB_STATUS` (`status`) USING BTREE
                ) ROW_FORMAT=DYNAMIC
                """,
    """
                CREATE TABLE IF NOT EXISTS `query_tasks` (
                    `id` BIGINT NOT NULL AUTO_INCREMENT,
                    `status` INT NOT NULL DEFAULT '0',
                    `creation_time` DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
                    `start_time` DATETIME(3) NULL DEFAULT NULL,
                    `duration` FLOAT NULL DEFAULT NULL,
                    `job_id` INT NOT NULL,
                    `archive_id` VARCHAR(255) NULL DEFAULT NULL,
                    PRIMARY KEY (`id`) USING BTREE,
                    INDEX `job_id` (`job_id`) USING BTREE,
                    INDEX `TASK_STATUS` (`status`) USING BTREE,
                    INDEX `TASK_START_TIME` (`start_time`) USING BTREE,
                    CONSTRAINT `query_tasks` FOREIGN KEY (`job_id`)
                    REFERENCES `query_jobs` (`id`)
                    ON UPDATE NO ACTION ON DELETE NO ACTION
                ) ROW_FORMAT=DYNAMIC
                """,
)
CLP_ADD_INDEX_JOB_START_TIME_STATUS = """
                    ALTER TABLE `compression_jobs`
                    ADD INDEX `JOB_START_TIME_STATUS`
                    (`start_time`, `status`) USING BTREE
                    """
ER_DUP_KEYNAME = 1061

# components/log-ingestor/src/ingestion_job_manager/clp_ingestion.rs, the create_tables queries
# (ClpIngestionJobStatus / IngestedS3ObjectMetadataStatus::format_as_sql_enum substituted as that
# file's own tests pin them; the compression job table is compression_jobs).
LOG_INGESTOR_DDL = (
    """
CREATE TABLE IF NOT EXISTS `ingestion_job` (
    `id` BIGINT unsigned NOT NULL AUTO_INCREMENT,
    `config` TEXT NOT NULL,
    `status` ENUM('requested', 'running', 'paused', 'failed', 'finished') NOT NULL DEFAULT 'requested',
    `status_msg` TEXT NULL DEFAULT NULL,
    `num_files_compressed` BIGINT unsigned NOT NULL DEFAULT '0',
    `creation_ts` DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
    `last_update_ts` DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)
        ON UPDATE CURRENT_TIMESTAMP(3),
    PRIMARY KEY (`id`)
);""",  # noqa: E501
    """
CREATE TABLE IF NOT EXISTS `ingestion_job_s3_scanner_state` (
    `id` BIGINT unsigned NOT NULL,
    `last_ingested_key` VARCHAR(1024) NULL DEFAULT NULL,
    PRIMARY KEY (`id`),
    CONSTRAINT `ingestion_job_s3_scanner_state_ingestion_job_id_ref`
        FOREIGN KEY (`id`) REFERENCES `ingestion_job` (`id`)
        ON DELETE RESTRICT ON UPDATE RESTRICT
);""",
    """
CREATE TABLE IF NOT EXISTS `ingested_s3_object_metadata` (
    `id` BIGINT unsigned NOT NULL AUTO_INCREMENT,
    `bucket` VARCHAR(1024) NOT NULL,
    `key` VARCHAR(1024) NOT NULL,
    `size` BIGINT unsigned NOT NULL,
    `status` ENUM('buffered', 'submitted', 'compressed', 'failed') NOT NULL DEFAULT 'buffered',
    `ingestion_job_id` BIGINT unsigned NOT NULL,
    `compression_job_id` INT NULL DEFAULT NULL,
    `creation_ts` DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
    `last_update_ts` DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)
        ON UPDATE CURRENT_TIMESTAMP(3),
    PRIMARY KEY (`id`),
    INDEX `index_ingestion_job_id` (`ingestion_job_id`) USING BTREE,
    INDEX `index_compression_job_id` (`compression_job_id`) USING BTREE,
    CONSTRAINT `ingested_s3_object_metadata_ingestion_job_id_ref`
        FOREIGN KEY (`ingestion_job_id`) REFERENCES `ingestion_job` (`id`)
        ON DELETE RESTRICT ON UPDATE RESTRICT,
    CONSTRAINT `ingested_s3_object_metadata_compression_job_id_ref`
        FOREIGN KEY (`compression_job_id`) REFERENCES `compression_jobs` (`id`)
        ON DELETE RESTRICT ON UPDATE RESTRICT
);""",
)

# components/clp-py-utils/clp_py_utils/initialize-clp-metadata-db.py (clp-s: create_datasets_table)
# and add_dataset's tables for dataset "web" (clp_metadata_db_utils.py, table prefix "clp_").
CLP_METADATA_DDL = (
    """
        CREATE TABLE IF NOT EXISTS `clp_datasets` (
            `name` VARCHAR(255) NOT NULL,
            `archive_storage_directory` VARCHAR(4096) NOT NULL,
            PRIMARY KEY (`name`)
        )
        """,
    """
        CREATE TABLE IF NOT EXISTS `clp_web_column_metadata` (
            `name` VARCHAR(512) NOT NULL,
            `type` TINYINT NOT NULL,
            PRIMARY KEY (`name`, `type`)
        )
        """,
    """
        CREATE TABLE IF NOT EXISTS `clp_web_archives` (
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
        """,
    """
        CREATE TABLE IF NOT EXISTS `clp_web_files` (
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
        """,
)

# CLP-style rows: each statement as its CLP writer issues it (named below), values bound.
CLP_WRITES: tuple[tuple[str, dict[str, object]], ...] = (
    # log-ingestor (clp_ingestion.rs): an ingestion job, its objects, its compression job
    ("INSERT INTO `ingestion_job` (`config`) VALUES (:config)", {"config": '{"S3Scanner":{}}'}),
    (
        "INSERT INTO `ingested_s3_object_metadata` (`bucket`, `key`, `size`, `ingestion_job_id`) "
        "VALUES (:b, :k, :s, 1)",
        {"b": "logs", "k": "a/1.jsonl", "s": 123},
    ),
    (
        "INSERT INTO `ingested_s3_object_metadata` (`bucket`, `key`, `size`, `ingestion_job_id`) "
        "VALUES (:b, :k, :s, 1)",
        {"b": "logs", "k": "a/2.jsonl", "s": 456},
    ),
    ("INSERT INTO compression_jobs (`clp_config`) VALUES (:c)", {"c": b"\x28\xb5\x2f\xfd clp"}),
    (
        "UPDATE `ingested_s3_object_metadata` SET `compression_job_id` = 1, `status` = 'submitted' "
        "WHERE `id` IN (1, 2) AND `status` = 'buffered'",
        {},
    ),
    # the legacy scheduler's finished job and CLP's Rust coordinator's running one
    (
        "INSERT INTO compression_jobs (`clp_config`, `status`, `spider_id`) VALUES (:c, 2, 7)",
        {"c": b"done"},
    ),
    (
        "INSERT INTO compression_jobs (`clp_config`, `status`, `spider_id`) VALUES (:c, 1, 8)",
        {"c": b"running"},
    ),
    # add_dataset (clp_metadata_db_utils.py) and a published archive (clp-tdl-package commit)
    (
        "INSERT INTO `clp_datasets` (name, archive_storage_directory) VALUES (:n, :d)",
        {"n": "web", "d": "/var/data/archives/web"},
    ),
    (
        "INSERT INTO `clp_web_archives` (id, begin_timestamp, end_timestamp, uncompressed_size, "
        "size, creator_id, creation_ix) VALUES ('arch-1', 1, 2, 300, 30, '7', 0)",
        {},
    ),
    ("INSERT INTO `clp_web_column_metadata` (name, type) VALUES ('message', 3)", {}),
    # CLP's Rust coordinator (compression-coordinator, get_or_create_resource_group_id)
    (
        "INSERT INTO spider_resource_groups (rg_name, rg_id) VALUES (:n, :i)",
        {"n": "compression-coordinator", "i": 41},
    ),
)
CLP_WRITES_MYSQL_ONLY: tuple[tuple[str, dict[str, object]], ...] = (
    ("INSERT INTO `ingestion_job_s3_scanner_state` (`id`) VALUES (1)", {}),
    # the legacy scheduler (compression_scheduler.py)
    (
        "INSERT INTO compression_tasks (job_id, partition_original_size, clp_paths_to_compress) "
        "VALUES (2, 579, :p)",
        {"p": b"paths"},
    ),
    ("INSERT INTO query_jobs (type, job_config) VALUES (0, :c)", {"c": b"query"}),
    ("INSERT INTO query_tasks (job_id, archive_id) VALUES (1, 'arch-1')", {}),
    (
        "INSERT INTO `clp_web_files` (id, orig_file_id, path, begin_timestamp, end_timestamp, "
        "num_uncompressed_bytes, begin_message_ix, num_messages, archive_id) "
        "VALUES ('f1', 'o1', 'a/1.jsonl', 1, 2, 300, 0, 10, 'arch-1')",
        {},
    ),
)


def _fill_like_clp(engine: Engine) -> None:
    """CLP's start-up DDL, then CLP's writers, on a database the coordinator migrated first."""
    mysql = _dialect(engine) == "mysql"
    if mysql:
        with engine.begin() as connection:
            for statement in (*CLP_ORCHESTRATION_DDL, *LOG_INGESTOR_DDL, *CLP_METADATA_DDL):
                connection.exec_driver_sql(statement)
            try:
                connection.exec_driver_sql(CLP_ADD_INDEX_JOB_START_TIME_STATUS)
            except OperationalError as error:  # CLP ignores exactly this error
                assert error.orig is not None and error.orig.args[0] == ER_DUP_KEYNAME
    else:
        ensure_dataset_tables(engine, "web")  # SQLite cannot run CLP's MySQL DDL
    with engine.begin() as connection:
        for statement, values in (*CLP_WRITES, *(CLP_WRITES_MYSQL_ONLY if mysql else ())):
            connection.execute(text(statement), values)


def _clp_tables(engine: Engine) -> set[str]:
    tables = set(inspect(engine).get_table_names())
    return {t for t in tables if t in CLP_TABLES or t in CLP_ONLY_TABLES or t.startswith("clp_")}


CLP_ONLY_TABLES = {
    "compression_tasks",
    "query_jobs",
    "query_tasks",
    "ingestion_job_s3_scanner_state",
}


def _clp_data(engine: Engine) -> dict[str, list[tuple[object, ...]]]:
    """Every row of every CLP table, in CLP's columns (the coordinator's own columns left out)."""
    data = {}
    tables = _clp_tables(engine)
    with engine.connect() as connection:
        inspector = inspect(connection)
        for table in sorted(tables):
            columns = [c["name"] for c in inspector.get_columns(table)]
            if table == names.COMPRESSION_JOBS:
                columns = [c for c in columns if c in CLP_JOB_COLUMNS]
            listed = ", ".join(
                f"`{c}`" if _dialect(engine) == "mysql" else f'"{c}"' for c in columns
            )
            rows = connection.execute(text(f"SELECT {listed} FROM {table} ORDER BY 1")).all()
            data[table] = [tuple(row) for row in rows]
    return data


def _compression_jobs_schema(engine: Engine) -> tuple[set[str], dict[str, list[str]]]:
    inspector = inspect(engine)
    columns = {c["name"] for c in inspector.get_columns(names.COMPRESSION_JOBS)}
    indexes = {
        str(i["name"]): [str(column) for column in i["column_names"]]
        for i in inspector.get_indexes(names.COMPRESSION_JOBS)
    }
    return columns, indexes


@pytest.mark.slow
def test_downgrade_to_base_keeps_every_clp_table_and_row_and_can_upgrade_again(
    engine: Engine,
) -> None:
    migrate.upgrade(engine)  # the coordinator came first and created CLP's tables
    _fill_like_clp(engine)
    before = _clp_data(engine)
    tables = _clp_tables(engine)
    assert CLP_TABLES | {"clp_web_archives", "clp_web_column_metadata"} <= tables
    assert all(before[table] for table in CLP_TABLES)
    if _dialect(engine) == "mysql":
        assert tables >= CLP_ONLY_TABLES
        assert all(before[table] for table in CLP_ONLY_TABLES)

    migrate.downgrade(engine, "base")

    assert migrate.current_revision(engine) is None
    assert _clp_tables(engine) == tables
    assert _clp_data(engine) == before
    columns, indexes = _compression_jobs_schema(engine)
    assert columns == CLP_JOB_COLUMNS  # CLP's current columns, no more and no fewer
    assert indexes["JOB_SPIDER_ID"] == ["spider_id"]
    assert indexes["JOB_START_TIME_STATUS"] == ["start_time", "status"]
    left = set(inspect(engine).get_table_names()) - tables
    assert left == {"alembic_version"}  # the coordinator's own are gone

    migrate.downgrade(engine, "base")  # nothing left to do: no error
    migrate.upgrade(engine)
    assert migrate.current_revision(engine) == migrate.head_revision()
    assert _clp_data(engine) == before
    with engine.begin() as connection:  # and the coordinator can write again
        connection.execute(text("UPDATE compression_jobs SET lease_epoch = 1 WHERE id = 1"))


def test_a_downgrade_interrupted_half_way_can_run_again(engine: Engine) -> None:
    migrate.upgrade(engine)
    _fill_like_clp(engine)
    before = _clp_data(engine)
    head = migrate.head_revision()
    migrate.downgrade(engine, "0001")
    # As if the steps ran but their revision marks were lost (MariaDB commits DDL at once).
    with engine.begin() as connection:
        connection.execute(text("UPDATE alembic_version SET version_num = :head"), {"head": head})
    migrate.downgrade(engine, "base")
    assert migrate.current_revision(engine) is None
    assert _clp_data(engine) == before
    migrate.upgrade(engine)
    # CLP's per-dataset tables and its tables the coordinator never creates are not modelled.
    unmodelled = ("clp_web_", *CLP_ONLY_TABLES)
    differences = _schema_differences(engine)
    assert [d for d in differences if not any(name in str(d) for name in unmodelled)] == []


def _schema(engine: Engine) -> dict[str, tuple[list[str], list[str]]]:
    inspector = inspect(engine)
    return {
        table: (
            sorted(c["name"] for c in inspector.get_columns(table)),
            sorted(str(i["name"]) for i in inspector.get_indexes(table)),
        )
        for table in sorted(inspector.get_table_names())
    }


@pytest.mark.parametrize(
    ("status", "committed", "shown"),
    [(1, True, "(Committed)"), (5, False, "(Committed)"), (9, False, "(status 9)")],
    ids=["committed-marker", "committed-status-5", "unknown-status"],
)
def test_downgrade_refuses_while_a_job_is_in_a_state_clp_cannot_read(
    engine: Engine, status: int, committed: bool, shown: str
) -> None:
    migrate.upgrade(engine)
    _fill_like_clp(engine)
    with engine.begin() as connection:
        job = connection.execute(
            text(
                "INSERT INTO compression_jobs (clp_config, status, spider_id, committed_at) "
                "VALUES (:c, :s, 99, :at)"
            ),
            {"c": b"x", "s": status, "at": datetime(2026, 1, 2) if committed else None},
        ).lastrowid
    schema, data = _schema(engine), _clp_data(engine)

    for target in ("base", "0003", "-1"):
        with pytest.raises(DowngradeRefused) as refused:
            migrate.downgrade(engine, target)
        message = str(refused.value)
        assert f"compression job(s) {job} {shown}" in message
        assert "Nothing was changed." in message
        assert migrate.current_revision(engine) == migrate.head_revision()
        assert _schema(engine) == schema
        assert _clp_data(engine) == data

    # Once the job is finished the same downgrade goes through.
    with engine.begin() as connection:
        connection.execute(
            text("UPDATE compression_jobs SET status = 2, committed_at = NULL WHERE id = :id"),
            {"id": job},
        )
    migrate.downgrade(engine, "base")
    assert migrate.current_revision(engine) is None


@pytest.mark.slow
def test_alembic_s_own_command_line_refuses_the_downgrade_too(tmp_path: os.PathLike[str]) -> None:
    url = f"sqlite:///{tmp_path}/cli.db"
    environment = {**os.environ, DATABASE_URL_ENV: url}
    engine = create_database_engine(url)
    try:
        migrate.upgrade(engine)
        with engine.begin() as connection:
            connection.execute(
                text("INSERT INTO compression_jobs (clp_config, status) VALUES (:c, 5)"),
                {"c": b"x"},
            )
        completed = subprocess.run(
            [sys.executable, "-m", "alembic", "downgrade", "base"],
            cwd=PROJECT_ROOT,
            env=environment,
            capture_output=True,
            text=True,
            check=False,
        )
        assert completed.returncode != 0
        assert "cannot downgrade: compression job(s) 1 (Committed)" in completed.stderr
        assert migrate.current_revision(engine) == migrate.head_revision()
    finally:
        engine.dispose()


# --- the schema check without alembic (start-up time, issue 14) ---------------------------------


def test_the_head_read_from_the_revision_files_is_alembic_s_head() -> None:
    from alembic.script import ScriptDirectory

    alembic_head = ScriptDirectory.from_config(migrate.alembic_config()).get_current_head()
    assert migrate.plain_chain_head(PROJECT_ROOT / "migrations" / "versions") == alembic_head
    assert migrate.head_revision() == alembic_head


def _revision_file(revision: str, down: str | None, extra: str = "") -> str:
    return f'revision: str = "{revision}"\ndown_revision: str | None = {down!r}\n{extra}'


@pytest.mark.parametrize(
    ("files", "head"),
    [
        ({"a.py": _revision_file("a", None), "b.py": _revision_file("b", "a")}, "b"),
        # alembic's listing: neither __init__.py nor editor droppings are revisions
        (
            {
                "a.py": _revision_file("a", None),
                "__init__.py": "",
                ".#b.py": "x",
                "notes.txt": "x",
            },
            "a",
        ),
        # anything but one plain chain is alembic's to answer
        (
            {
                "a.py": _revision_file("a", None),
                "b.py": _revision_file("b", "a"),
                "c.py": _revision_file("c", "a"),
            },
            None,
        ),
        (
            {
                "a.py": _revision_file("a", None),
                "b.py": 'revision = "b"\ndown_revision = ("a", "x")\n',
            },
            None,
        ),
        ({"a.py": _revision_file("a", None, 'branch_labels = ("x",)\n')}, None),
        ({"a.py": _revision_file("a", None, 'depends_on = "y"\n')}, None),
        ({"a.py": 'revision = "a" + "b"\ndown_revision = None\n'}, None),
        ({"a.py": _revision_file("a", None), "b.py": _revision_file("b", "missing")}, None),
        (
            {
                "a.py": _revision_file("a", None),
                "b.py": _revision_file("b", "c"),
                "c.py": _revision_file("c", "b"),
                "d.py": _revision_file("d", "a"),
            },
            None,
        ),
        ({"a.py": _revision_file("a", None), "b.py": _revision_file("a", None)}, None),
        ({"a.py": "def (:"}, None),
        ({}, None),
    ],
)
def test_the_head_is_read_only_from_a_plain_chain_of_revisions(
    tmp_path: os.PathLike[str], files: dict[str, str], head: str | None
) -> None:
    from pathlib import Path

    versions = Path(tmp_path)
    for name, source in files.items():
        (versions / name).write_text(source)
    assert migrate.plain_chain_head(versions) == head


def test_the_current_revision_is_read_as_alembic_reads_it(engine: Engine) -> None:
    def alembic_current() -> str | None:
        with engine.connect() as connection:
            return MigrationContext.configure(connection).get_current_revision()

    assert migrate.current_revision(engine) is None  # no version table
    migrate.upgrade(engine, "0003")
    assert migrate.current_revision(engine) == alembic_current() == "0003"
    migrate.upgrade(engine)
    assert migrate.current_revision(engine) == alembic_current() == migrate.head_revision()
    migrate.downgrade(engine, "base")
    assert migrate.current_revision(engine) is None  # an empty version table
    assert alembic_current() is None


def test_upgrading_a_current_schema_runs_no_migration(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    migrate.upgrade(engine)

    def refuse(*_: object) -> None:
        raise AssertionError("alembic ran on a current schema")

    monkeypatch.setattr(migrate, "_run", refuse)
    migrate.upgrade(engine)
    migrate.upgrade(engine, "head")
    with pytest.raises(AssertionError):
        migrate.upgrade(engine, migrate.head_revision())  # an explicit one is alembic's
