"""CLP's own readers of the per-dataset tables, run after real jobs published to three datasets.

Real jobs (the service in-process, the embedded engine, real ``clp-s``) compress one log file into
each of three datasets. Then the statements CLP's components run over every dataset of
``clp_datasets`` are executed verbatim against the coordinator's database, with the driver's own
placeholders (``%s`` for pymysql, as CLP's connector; rewritten to ``?`` only for SQLite's driver):

* the archive garbage collector (``job-orchestration/job_orchestration/garbage_collector/
  archive_garbage_collector.py``: ``_delete_expired_archives``), deleting through
  ``clp-py-utils/clp_py_utils/clp_metadata_db_utils.py``: ``delete_archives_from_metadata_db``;
* ``clp-package-utils/clp_package_utils/scripts/native/archive_manager.py``: ``_find_archives``
  and ``_delete_archives`` with ``IdDeleteHandler`` and ``FilterDeleteHandler``;
* the WebUI's ingest page (``webui/packages/client/src/pages/IngestPage/SpaceSavings/sql.ts``,
  ``Details/sql.ts``, ``sqlConfig.ts``) and its server's ``routes/api/compress-metadata/sql.ts``.

Before ``clp_{dataset}_files`` was created, every one of these that touches it failed with "table
doesn't exist" (the GC's and archive_manager's deletes, the WebUI's Details), and on SQLite the
second dataset never got its tables at all.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, select

from coordinator.config.loader import CoordinatorConfig, load_config
from coordinator.config.locations import DATA_DIR_ENV, DATABASE_URL_ENV
from coordinator.lifecycle import JobStatus
from coordinator.service.ingest import put_files, submit_job
from coordinator.store.datasets import archives_table
from tests.sample_logs import START_MS, STEP_MS, write_json_logs
from tests.service_support import job_row, run_until_idle, runtime_over

pytestmark = pytest.mark.slow  # every test reads the rows of real jobs

DATASETS = ("web", "api", "billing_2026")
EVENTS = 400
BUCKET = "logs"
SECOND_TO_MILLISECOND = 1000  # garbage_collector/constants.py
TABLE_PREFIX = "clp_"


# --- CLP's code, verbatim (only the cursor is ours) ---------------------------------------------


class ClpCursor:
    """A dictionary cursor as CLP opens one (``db_conn.cursor(dictionary=True)``)."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self._sqlite = connection.dialect.name == "sqlite"
        self._rows: list[dict[str, Any]] = []

    def execute(self, query: str, params: Sequence[Any] = ()) -> None:
        if self._sqlite:
            query = query.replace("%s", "?")  # sqlite3's paramstyle; the SQL is CLP's
        result = self._connection.exec_driver_sql(query, tuple(params))
        self._rows = [dict(row) for row in result.mappings()] if result.returns_rows else []

    def fetchall(self) -> list[dict[str, Any]]:
        return self._rows


# clp_py_utils/clp_metadata_db_utils.py
ARCHIVES_TABLE_SUFFIX = "archives"
DATASETS_TABLE_SUFFIX = "datasets"
FILES_TABLE_SUFFIX = "files"


def _get_table_name(prefix: str, suffix: str, dataset: str | None) -> str:
    table_name = prefix
    if dataset is not None:
        table_name += f"{dataset}_"
    table_name += suffix
    return table_name


def get_archives_table_name(table_prefix: str, dataset: str | None) -> str:
    return _get_table_name(table_prefix, ARCHIVES_TABLE_SUFFIX, dataset)


def get_datasets_table_name(table_prefix: str) -> str:
    return _get_table_name(table_prefix, DATASETS_TABLE_SUFFIX, None)


def get_files_table_name(table_prefix: str, dataset: str | None) -> str:
    return _get_table_name(table_prefix, FILES_TABLE_SUFFIX, dataset)


def fetch_existing_datasets(db_cursor: ClpCursor, table_prefix: str) -> set[str]:
    db_cursor.execute(f"SELECT name FROM `{get_datasets_table_name(table_prefix)}`")
    rows = db_cursor.fetchall()
    return {row["name"] for row in rows}


def delete_archives_from_metadata_db(
    db_cursor: ClpCursor, archive_ids: list[str], table_prefix: str, dataset: str | None
) -> None:
    ids_list_string = ", ".join(["%s"] * len(archive_ids))

    db_cursor.execute(
        f"""
        DELETE FROM `{get_files_table_name(table_prefix, dataset)}`
        WHERE archive_id in ({ids_list_string})
        """,
        archive_ids,
    )

    db_cursor.execute(
        f"""
        DELETE FROM `{get_archives_table_name(table_prefix, dataset)}`
        WHERE id in ({ids_list_string})
        """,
        archive_ids,
    )


# job_orchestration/garbage_collector/archive_garbage_collector.py: _delete_expired_archives
def gc_expired_archive_ids(
    db_cursor: ClpCursor, table_prefix: str, archive_expiry_epoch_secs: int, dataset: str | None
) -> list[str]:
    archives_table = get_archives_table_name(table_prefix, dataset)
    archive_end_ts_upper_bound = archive_expiry_epoch_secs * SECOND_TO_MILLISECOND

    db_cursor.execute(
        f"""
        SELECT id FROM `{archives_table}`
        WHERE end_timestamp < %s
        AND end_timestamp != 0
        """,
        [archive_end_ts_upper_bound],
    )

    results = db_cursor.fetchall()
    archive_ids = [result["id"] for result in results]
    if len(archive_ids) != 0:
        delete_archives_from_metadata_db(db_cursor, archive_ids, table_prefix, dataset)
    return archive_ids


# clp_package_utils/scripts/native/archive_manager.py: _find_archives
def find_archives(
    db_cursor: ClpCursor, table_prefix: str, dataset: str | None, begin_ts: int, end_ts: int | None
) -> list[str]:
    query_params: list[int] = [begin_ts]
    query: str = f"""
                SELECT id FROM `{get_archives_table_name(table_prefix, dataset)}`
                WHERE begin_timestamp >= %s
                """
    if end_ts is not None:
        query += " AND end_timestamp <= %s"
        query_params.append(end_ts)

    db_cursor.execute(query, query_params)
    results = db_cursor.fetchall()
    return [result["id"] for result in results]


# archive_manager.py: FilterDeleteHandler.get_criteria, IdDeleteHandler.get_criteria
def filter_criteria() -> str:
    return "begin_timestamp >= %s AND end_timestamp <= %s"


def id_criteria(params: Sequence[str]) -> str:
    placeholders: str = ",".join(["%s"] * len(params))
    return f"id in ({placeholders})"


# archive_manager.py: _delete_archives (the database half)
def archive_manager_delete(
    db_cursor: ClpCursor,
    table_prefix: str,
    dataset: str | None,
    query_criteria: str,
    query_params: Sequence[Any],
) -> list[str]:
    db_cursor.execute(
        f"""
                SELECT id FROM `{get_archives_table_name(table_prefix, dataset)}`
                WHERE {query_criteria}
                """,
        query_params,
    )
    results = db_cursor.fetchall()
    archive_ids: list[str] = [result["id"] for result in results]
    if archive_ids:
        delete_archives_from_metadata_db(db_cursor, archive_ids, table_prefix, dataset)
    return archive_ids


# webui/packages/client/src/pages/IngestPage/SpaceSavings/sql.ts: buildMultiDatasetSpaceSavingsSql
# (sqlConfig.ts's column names and the ARCHIVES suffix substituted)
def space_savings_sql(dataset_names: Sequence[str]) -> str:
    archive_queries = [
        f"""
    SELECT
        uncompressed_size,
        size
    FROM {TABLE_PREFIX}{name}_archives
    """
        for name in dataset_names
    ]
    union_all = "\nUNION ALL\n"
    return f"""
    SELECT
        CAST(
            COALESCE(
                SUM(uncompressed_size),
                0
            ) AS UNSIGNED
        ) AS total_uncompressed_size,
        CAST(
            COALESCE(
                SUM(size),
                0
            ) AS UNSIGNED
        ) AS total_compressed_size
    FROM (
        {union_all.join(archive_queries)}
    ) AS archives_combined
    """


# webui/packages/client/src/pages/IngestPage/Details/sql.ts: buildMultiDatasetDetailsSql
def details_sql(dataset_names: Sequence[str]) -> str:
    archive_queries = [
        f"""
    SELECT
      MIN(begin_timestamp) AS begin_timestamp,
      MAX(end_timestamp) AS end_timestamp
    FROM {TABLE_PREFIX}{name}_archives
  """
        for name in dataset_names
    ]
    file_queries = [
        f"""
    SELECT
      COUNT(DISTINCT orig_file_id) AS num_files,
      CAST(
        COALESCE(SUM(num_messages), 0) AS UNSIGNED
      ) AS num_messages
    FROM {TABLE_PREFIX}{name}_files
  """
        for name in dataset_names
    ]
    union_all = "\nUNION ALL\n"
    return f"""
    SELECT
      a.begin_timestamp,
      a.end_timestamp,
      b.num_files,
      b.num_messages
    FROM
    (
      SELECT
        MIN(begin_timestamp) AS begin_timestamp,
        MAX(end_timestamp)   AS end_timestamp
      FROM (
        {union_all.join(archive_queries)}
      ) AS archives_combined
    ) a,
    (
      SELECT
        SUM(num_files)    AS num_files,
        SUM(num_messages) AS num_messages
      FROM (
        {union_all.join(file_queries)}
      ) AS files_combined
    ) b;
  """


# webui/packages/server/src/routes/api/compress-metadata/sql.ts: getCompressionMetadataQuery
COMPRESSION_METADATA_QUERY = """
    SELECT
        id as _id,
        status,
        status_msg,
        start_time,
        update_time,
        duration,
        uncompressed_size,
        compressed_size,
        clp_config
    FROM compression_jobs
    ORDER BY _id DESC
    LIMIT 1000;
"""


# --- three datasets published by real jobs ------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Published:
    """What the jobs published: the engine and, per dataset, the archive rows."""

    engine: Engine
    job_ids: list[int]
    archives: dict[str, list[tuple[str, int, int, int, int]]]
    """dataset → (id, begin_timestamp, end_timestamp, uncompressed_size, size), by id."""

    def ids(self, dataset: str) -> list[str]:
        return [archive[0] for archive in self.archives[dataset]]


@pytest.fixture
def published(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Published]:
    """One job per dataset, run to Succeeded by the service on the embedded default."""
    if database_url.startswith("sqlite"):
        monkeypatch.delenv(DATABASE_URL_ENV, raising=False)
    else:
        monkeypatch.setenv(DATABASE_URL_ENV, database_url)
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    config: CoordinatorConfig = dataclasses.replace(
        load_config(None, data_dir=tmp_path / "var"), embedded_workers=2
    )
    with runtime_over("embedded", config, lease_secs=5) as rt:
        job_ids = []
        for number, dataset in enumerate(DATASETS):
            path = tmp_path / "input" / f"{dataset}.jsonl"
            write_json_logs(path, EVENTS, service=dataset, start_ms=START_MS + number * 3_600_000)
            put_files(config, [path], bucket=BUCKET, prefix=f"{dataset}/")
            job_ids.append(
                submit_job(
                    config,
                    rt.engine,
                    bucket=BUCKET,
                    prefix=f"{dataset}/",
                    dataset=dataset,
                    timestamp_key="timestamp",
                )
            )
        run_until_idle(rt.coordinator, timeout=120)
        for job_id in job_ids:
            row = job_row(rt, job_id)
            assert (row.status, row.status_msg) == (JobStatus.SUCCEEDED, "")
        archives: dict[str, list[tuple[str, int, int, int, int]]] = {}
        with rt.engine.connect() as connection:
            for dataset in DATASETS:
                table = archives_table(dataset)
                rows = connection.execute(
                    select(
                        table.c.id,
                        table.c.begin_timestamp,
                        table.c.end_timestamp,
                        table.c.uncompressed_size,
                        table.c.size,
                    ).order_by(table.c.id)
                ).all()
                archives[dataset] = [
                    (str(r[0]), int(r[1]), int(r[2]), int(r[3]), int(r[4])) for r in rows
                ]
        assert all(archives.values()), archives
        yield Published(rt.engine, job_ids, archives)


def _time_range(number: int) -> tuple[int, int]:
    begin = START_MS + number * 3_600_000
    return begin, begin + (EVENTS - 1) * STEP_MS


# --- the readers --------------------------------------------------------------------------------


def test_the_archive_garbage_collector_expires_every_datasets_archives(
    published: Published,
) -> None:
    """The GC walks ``clp_datasets`` and, per dataset, selects the expired archives and deletes
    them from ``_files`` then ``_archives``. Before: the ``_files`` delete failed, for every
    dataset, and the GC exited with failure."""
    for number, dataset in enumerate(DATASETS):
        assert [a[1:3] for a in published.archives[dataset]] == [_time_range(number)]
    expiry_epoch_secs = int(time.time()) - 60  # a retention period of one minute
    with published.engine.connect() as db_conn:
        db_cursor = ClpCursor(db_conn)
        datasets = fetch_existing_datasets(db_cursor, TABLE_PREFIX)
        assert datasets == set(DATASETS)
        deleted = {
            dataset: gc_expired_archive_ids(db_cursor, TABLE_PREFIX, expiry_epoch_secs, dataset)
            for dataset in sorted(datasets)
        }
        db_conn.commit()
    assert {d: sorted(ids) for d, ids in deleted.items()} == {d: published.ids(d) for d in DATASETS}
    with published.engine.connect() as connection:
        for dataset in DATASETS:
            table = archives_table(dataset)
            assert connection.execute(select(table.c.id)).all() == []


def test_archive_manager_finds_and_deletes_by_time_range_and_by_ids(published: Published) -> None:
    """``archive_manager.py find`` and ``del by-filter`` / ``del by-ids``, dataset by dataset.
    Before: both deletes failed on the missing ``_files`` table."""
    with published.engine.connect() as db_conn:
        db_cursor = ClpCursor(db_conn)
        for number, dataset in enumerate(DATASETS):
            begin, end = _time_range(number)
            ids = published.ids(dataset)
            assert sorted(find_archives(db_cursor, TABLE_PREFIX, dataset, 0, None)) == ids
            assert sorted(find_archives(db_cursor, TABLE_PREFIX, dataset, begin, end)) == ids
            assert find_archives(db_cursor, TABLE_PREFIX, dataset, begin + 1, end) == []

        # del by-ids (dry run first: CLP rolls the deletion back)
        web_ids = published.ids("web")
        deleted = archive_manager_delete(
            db_cursor, TABLE_PREFIX, "web", id_criteria(web_ids), web_ids
        )
        assert sorted(deleted) == web_ids
        db_conn.rollback()
        assert sorted(find_archives(db_cursor, TABLE_PREFIX, "web", 0, None)) == web_ids
        deleted = archive_manager_delete(
            db_cursor, TABLE_PREFIX, "web", id_criteria(web_ids), web_ids
        )
        db_conn.commit()
        assert sorted(deleted) == web_ids
        assert find_archives(db_cursor, TABLE_PREFIX, "web", 0, None) == []

        # del by-filter
        begin, end = _time_range(DATASETS.index("api"))
        deleted = archive_manager_delete(
            db_cursor, TABLE_PREFIX, "api", filter_criteria(), [begin, end]
        )
        db_conn.commit()
        assert sorted(deleted) == published.ids("api")
        assert find_archives(db_cursor, TABLE_PREFIX, "api", 0, None) == []
        assert sorted(find_archives(db_cursor, TABLE_PREFIX, "billing_2026", 0, None)) == (
            published.ids("billing_2026")
        )


def test_the_webuis_ingest_page_queries_sum_every_dataset(published: Published) -> None:
    """SpaceSavings and Details union every dataset of ``clp_datasets``; the server lists the jobs.
    Before: Details failed on the missing ``_files`` tables (so the ingest page showed an error)."""
    everything = [a for archives in published.archives.values() for a in archives]
    with published.engine.connect() as db_conn:
        db_cursor = ClpCursor(db_conn)
        names = sorted(fetch_existing_datasets(db_cursor, TABLE_PREFIX))

        db_cursor.execute(space_savings_sql(names))
        [savings] = db_cursor.fetchall()
        assert (
            int(savings["total_uncompressed_size"]),
            int(savings["total_compressed_size"]),
        ) == (sum(a[3] for a in everything), sum(a[4] for a in everything))

        db_cursor.execute(details_sql(names))
        [details] = db_cursor.fetchall()
        assert (int(details["begin_timestamp"]), int(details["end_timestamp"])) == (
            min(a[1] for a in everything),
            max(a[2] for a in everything),
        )
        # clp-s records no files (CLP's own clp-s jobs leave ``_files`` empty as well).
        assert (int(details["num_files"]), int(details["num_messages"])) == (0, 0)

        db_cursor.execute(COMPRESSION_METADATA_QUERY)
        jobs = db_cursor.fetchall()
    assert [(job["_id"], job["status"]) for job in jobs] == [
        (job_id, int(JobStatus.SUCCEEDED)) for job_id in reversed(published.job_ids)
    ]
    assert all(job["compressed_size"] > 0 for job in jobs)
