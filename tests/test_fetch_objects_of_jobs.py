"""``fetch_objects_of_jobs`` reads the objects of several ingestion jobs together and answers each
job exactly as CLP's Rust coordinator's own query answers it alone: its own rows ascending by id,
an id that belongs to another ingestion job (or to none) absent."""

from __future__ import annotations

from sqlalchemy import Connection, Engine, bindparam, text

from coordinator.partition import S3ObjectRow
from coordinator.store.ingestion import (
    S3ScannerJob,
    create_ingestion_job,
    ensure_scanner_state_table,
    fetch_objects_of_jobs,
    register_objects,
)
from tests.sql_capture import statements_sent

# CLP's statement, copied from clp-upstream/components/compression-coordinator/src/job_handle.rs
# (``JobHandle``'s fetch of a job's S3 object metadata; one chunk of ids).
_CLP_FETCH = text(
    "SELECT `id`, `bucket`, `key`, `size` FROM `ingested_s3_object_metadata` WHERE `id` IN "
    ":ids AND `ingestion_job_id` = :job ORDER BY `id` ASC"
).bindparams(bindparam("ids", expanding=True))


def _clp_fetch(connection: Connection, ids: list[int], job: int) -> list[S3ObjectRow]:
    if not ids:
        return []
    rows = connection.execute(_CLP_FETCH, {"ids": ids, "job": job})
    return [S3ObjectRow(row.id, row.bucket, row.key, row.size) for row in rows]


def test_each_job_gets_what_fetching_it_alone_gets(migrated_engine: Engine) -> None:
    engine = migrated_engine
    ensure_scanner_state_table(engine)
    with engine.begin() as connection:
        first = create_ingestion_job(connection, S3ScannerJob("b", "p/"))
        first_ids = register_objects(connection, first, [("b", "p/a", 1), ("b", "p/b", 2)])
        second = create_ingestion_job(connection, S3ScannerJob("b", "p/"))
        second_ids = register_objects(connection, second, [("b", "p/c", 3)])
        idle = create_ingestion_job(connection, S3ScannerJob("b", "p/"))
    # The first job also names the second's object and an id no row has: both absent from it.
    wanted = {
        first: sorted([*first_ids, second_ids[0], 10_000]),
        second: list(second_ids),
        idle: [],
    }
    with engine.connect() as connection:
        alone = {job: _clp_fetch(connection, ids, job) for job, ids in wanted.items()}
        with statements_sent(engine) as sent:
            together = fetch_objects_of_jobs(connection, wanted)
    assert together == alone
    assert [row.id for row in together[first]] == first_ids
    assert [row.key for row in together[second]] == ["p/c"]
    assert together[idle] == []
    assert len(sent) == 1
