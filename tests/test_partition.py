"""Partitioning S3 objects into compression-task inputs as CLP does (docs/clp.md, Partitioning)."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest

import coordinator.partition as partition_module
from coordinator.partition import (
    FETCH_BATCH_SIZE,
    SIMILAR_NAME_THRESHOLD,
    DuplicateS3ObjectMetadata,
    EmptyS3ObjectMetadataField,
    InvalidJobInput,
    InvalidTargetArchiveSize,
    MissingS3ObjectMetadata,
    NegativeObjectSize,
    NoS3ObjectMetadata,
    NoTaskInputs,
    PartitionBuilder,
    RoundRobin,
    S3BucketMismatch,
    S3KeyPrefixMismatch,
    S3ObjectRow,
    check_requested_ids,
    estimate_size,
    file_name,
    group_by_similar_name,
    name_similarity,
    objects_in_id_order,
    partition_objects,
    require_partitions,
)
from tests.vectors import load_vector

VECTOR_SECTIONS = {"FLUSH_CASE", "GROUPS", "LEV"}


@pytest.fixture(scope="module")
def vectors() -> dict[str, Any]:
    """The shared vectors; a missing file fails the vector tests rather than skipping them."""
    loaded: dict[str, Any] = load_vector("partition.json")
    return loaded


# --- the shared vectors ---------------------------------------------------------------------------


def test_every_vector_section_has_a_test(vectors: dict[str, Any]) -> None:
    assert set(vectors) - {"description"} == VECTOR_SECTIONS


def test_flush_case_vector(vectors: dict[str, Any]) -> None:
    case = vectors["FLUSH_CASE"]
    objects = [(key, size) for key, size in case["objects"]]
    builder = PartitionBuilder(case["target_archive_size"])
    for key, size in objects:
        builder.add(key, size)
    assert len(builder.emitted) == case["expected_partitions_emitted_before_final_flush"]
    assert builder.finish() == case["expected_partitions"]
    assert partition_objects(objects, case["target_archive_size"]) == case["expected_partitions"]


def test_groups_vector(vectors: dict[str, Any]) -> None:
    case = vectors["GROUPS"]
    assert group_by_similar_name(case["keys"]) == case["expected_groups"]
    # The grouping must not depend on the order the keys arrive in (the names are all distinct).
    assert group_by_similar_name(reversed(case["keys"])) == case["expected_groups"]


def test_groups_vector_round_robin(vectors: dict[str, Any]) -> None:
    case = vectors["GROUPS"]
    draw = RoundRobin(group_by_similar_name(case["keys"]))
    first_three = [next(draw) for _ in range(3)]
    assert first_three == case["round_robin"]["first_three_yields"]
    assert sorted(draw.remaining()) == sorted(
        case["round_robin"]["remaining_after_three_yields_as_set"]
    )


def test_lev_vector(vectors: dict[str, Any]) -> None:
    cases = vectors["LEV"]["cases"]
    assert cases
    for case in cases:
        similarity = name_similarity(case["a"], case["b"])
        assert abs(similarity - case["normalized_levenshtein"]) <= 1e-12, case
        assert (similarity >= SIMILAR_NAME_THRESHOLD) == case["same_group_at_threshold_0_6"], case
        # Grouping is what the threshold is for: two keys named a and b share a group or not.
        same_group = len(group_by_similar_name([case["a"], case["b"]])) == 1
        assert same_group == case["same_group_at_threshold_0_6"], case


# --- size estimates, file names, similarity -------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "ratio"),
    [
        ("logs/a.gz", 13),
        ("logs/a.GZ", 13),
        ("logs/a.Gz", 13),
        ("logs/a.tar.gz", 13),
        ("logs/a.gzip", 13),
        ("logs/a.GZIP", 13),
        ("logs/a.tgz", 13),
        ("logs/a.TGZ", 13),
        ("logs/a.zst", 8),
        ("logs/a.ZST", 8),
        ("logs/a.tar.zst", 8),
        ("logs/a.zstd", 1),
        ("logs/a.zstandard", 1),
        ("logs/a.log", 1),
        ("logs/a.gz.log", 1),
        ("logs/agz", 1),
        ("gz", 1),
        (".gz", 13),
        ("", 1),
        ("logs/a.\N{FULLWIDTH LATIN SMALL LETTER G}z", 1),
    ],
)
def test_estimate_from_suffix(key: str, ratio: int) -> None:
    assert estimate_size(key, 1000) == 1000 * ratio
    assert estimate_size(key, 0) == 0


def test_negative_size_is_refused() -> None:
    with pytest.raises(NegativeObjectSize, match="has a negative size -1"):
        estimate_size("logs/a.log", -1)
    with pytest.raises(NegativeObjectSize):
        partition_objects([("logs/a.log", -1)], 100)


@pytest.mark.parametrize(
    ("key", "name"),
    [
        ("logs/app.log", "app.log"),
        ("app.log", "app.log"),
        ("a/b/", "b"),
        ("a/b//", "b"),
        ("a/./b", "b"),
        ("a/b/.", "b"),
        ("a/b/./", "b"),
        ("a//b", "b"),
        ("./a", "a"),
        ("/a", "a"),
        ("a/..", "a/.."),
        ("a/../", "a/../"),
        ("a/../b", "b"),
        ("..", ".."),
        (".", "."),
        ("./", "./"),
        ("/", "/"),
        ("//", "//"),
        ("", ""),
        ("a/.hidden", ".hidden"),
        ("a/...", "..."),
        ("a\\b", "a\\b"),
    ],
)
def test_file_name_follows_rust_path_file_name(key: str, name: str) -> None:
    assert file_name(key) == name


def test_similarity_exactly_at_the_threshold_groups_together() -> None:
    # Two edits over five characters: exactly 0.6, which is "similar" (>=), a boundary that
    # rapidfuzz's score_cutoff would get wrong.
    assert name_similarity("abcde", "abcxy") == 0.6
    assert group_by_similar_name(["abcde", "abcxy"]) == [["abcde", "abcxy"]]
    assert group_by_similar_name(["abcde", "abxyz"]) == [["abcde"], ["abxyz"]]


def test_similarity_counts_characters_not_bytes() -> None:
    assert name_similarity("é", "e") == 0.0
    assert name_similarity("日志.log", "日记.log") == 1 - 1 / 6


def test_similarity_matches_the_strsim_formula_on_random_names() -> None:
    rng = random.Random(7)
    alphabet = "ab.1-é😀"
    for _ in range(3000):
        first = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 9)))
        second = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 9)))
        assert name_similarity(first, second) == _strsim_normalized_levenshtein(first, second)


def test_grouping_is_a_chain_against_the_previous_name() -> None:
    # "ab" ~ "abc" ~ "abcd" ~ "abcde" pairwise along the chain although "ab" vs "abcde" is 0.4.
    assert name_similarity("ab", "abcde") < SIMILAR_NAME_THRESHOLD
    assert group_by_similar_name(["abcde", "ab", "abcd", "abc"]) == [["ab", "abc", "abcd", "abcde"]]


def test_grouping_sort_is_stable_for_equal_names() -> None:
    keys = ["svc-b/app.log", "svc-a/app.log", "svc-c/app.log", "svc-a/zz.log"]
    assert group_by_similar_name(keys) == [keys[:3], ["svc-a/zz.log"]]


def test_grouping_sorts_by_code_point() -> None:
    # Upper case sorts before lower case, and "Z" (U+005A) before "a" (U+0061).
    assert group_by_similar_name(["a1", "Z1", "B1"]) == [["B1"], ["Z1"], ["a1"]]


def test_round_robin_drains_and_reports_rotation_order() -> None:
    draw = RoundRobin([[1, 2, 3], [], [10], [20, 21]])
    assert [next(draw) for _ in range(4)] == [1, 10, 20, 2]
    # The group that produced 2 went to the back: [3] after [21].
    assert draw.remaining() == [21, 3]
    assert list(draw) == [21, 3]
    assert draw.remaining() == []
    assert next(draw, None) is None


# --- partitioning ---------------------------------------------------------------------------------


def test_no_objects_give_no_partitions() -> None:
    assert partition_objects([], 100) == []


def test_nothing_is_emitted_below_twice_the_target() -> None:
    builder = PartitionBuilder(100)
    builder.add("logs/a.log", 150)
    # 150 is past the target but below 2 x 100: no pass yet.
    assert builder.emitted == ()
    builder.add("logs/b.log", 49)
    assert builder.emitted == ()
    assert builder.finish() == [["logs/a.log"], ["logs/b.log"]]


def test_early_pass_when_the_buffer_reaches_twice_the_target() -> None:
    builder = PartitionBuilder(100)
    builder.add("logs/a.log", 150)
    builder.add("logs/b.log", 50)  # 200 = 2 x target: a pass runs inside add()
    # a.log and b.log are one group; a.log alone reaches the target, 50 left is below it.
    assert builder.emitted == (("logs/a.log",),)
    builder.add("logs/c.log", 10)
    assert builder.emitted == (("logs/a.log",),)
    assert builder.finish() == [["logs/a.log"], ["logs/b.log", "logs/c.log"]]


def test_early_pass_leftovers_are_regrouped_with_later_objects() -> None:
    target = 100
    builder = PartitionBuilder(target)
    for key in ("logs/b.log", "logs/kernel.7", "logs/b.log.1"):
        builder.add(key, 70)
    # 210 >= 200: groups [b.log, b.log.1] and [kernel.7]; draw b.log, kernel.7 -> one partition,
    # then 70 < 100 is left: b.log.1.
    assert builder.emitted == (("logs/b.log", "logs/kernel.7"),)
    builder.add("logs/a.log", 10)
    # The final pass re-sorts the leftover with the new object: a.log comes before b.log.1.
    assert builder.finish() == [["logs/b.log", "logs/kernel.7"], ["logs/a.log", "logs/b.log.1"]]


def test_an_object_larger_than_the_target_forms_its_own_partition_when_drawn_first() -> None:
    partitions = partition_objects([("logs/big.gz", 10), ("logs/small.txt", 10)], 100)
    # big.gz is estimated at 130 >= 100; the names are far apart, so two groups.
    assert partitions == [["logs/big.gz"], ["logs/small.txt"]]


def test_an_object_larger_than_the_target_closes_the_current_partition() -> None:
    partitions = partition_objects(
        [("logs/a.log", 10), ("logs/b.log", 5000), ("logs/c.log", 1)], 100
    )
    assert partitions == [["logs/a.log", "logs/b.log"], ["logs/c.log"]]


def test_estimates_decide_the_cut_not_raw_sizes() -> None:
    # Raw 40 + 40 would not reach 100; as .zst both count 320.
    assert partition_objects([("logs/a.zst", 40), ("logs/b.zst", 40)], 100) == [
        ["logs/a.zst"],
        ["logs/b.zst"],
    ]
    assert partition_objects([("logs/a.zstd", 40), ("logs/b.zstd", 40)], 100) == [
        ["logs/a.zstd", "logs/b.zstd"]
    ]


def test_zero_sized_objects_still_form_a_partition() -> None:
    assert partition_objects([("logs/a.log", 0), ("logs/b.log", 0)], 1) == [
        ["logs/a.log", "logs/b.log"]
    ]


@pytest.mark.parametrize("target", [0, -1])
def test_a_target_below_one_byte_is_refused(target: int) -> None:
    with pytest.raises(InvalidTargetArchiveSize) as raised:
        partition_objects([("logs/a.log", 1)], target)
    assert str(raised.value) == f"invalid target archive size {target}: it must be at least 1 byte"
    assert isinstance(raised.value, ValueError)
    with pytest.raises(InvalidTargetArchiveSize):
        partition_objects([], target)


def test_a_finished_builder_cannot_be_reused() -> None:
    builder = PartitionBuilder(10)
    builder.add("logs/a.log", 1)
    assert builder.finish() == [["logs/a.log"]]
    with pytest.raises(RuntimeError):
        builder.add("logs/b.log", 1)
    with pytest.raises(RuntimeError):
        builder.finish()


SIZE_PROFILES = ("mixed", "small among large", "mostly empty")


@pytest.mark.parametrize("profile", SIZE_PROFILES)
@pytest.mark.parametrize("seed", range(25))
def test_invariants_and_reference_on_random_inputs(seed: int, profile: str) -> None:
    rng = random.Random(seed)
    objects = _random_objects(rng, rng.randint(0, 300), profile)
    target = rng.choice([1, 7, 100, 1000, 5000, 100_000])
    partitions = partition_objects(objects, target)

    # The upstream invariants: every key exactly once, no partition grown past its last file.
    estimate = {key: estimate_size(key, size) for key, size in objects}
    emitted_keys = Counter(key for partition in partitions for key in partition)
    assert emitted_keys == Counter(key for key, _ in objects)
    assert set(emitted_keys.values()) <= {1}
    for partition in partitions:
        assert partition
        assert sum(estimate[key] for key in partition) - estimate[partition[-1]] < target

    assert partitions == _reference_partitions(objects, target)


@pytest.mark.parametrize(
    "regroup_all_ratio",
    [
        pytest.param(0, id="new-objects-always-placed-one-by-one"),
        pytest.param(10**9, id="buffer-always-regrouped-whole"),
    ],
)
@pytest.mark.parametrize("profile", SIZE_PROFILES)
@pytest.mark.parametrize("seed", range(25))
def test_both_ways_of_grouping_new_objects_agree_with_the_reference(
    seed: int, profile: str, regroup_all_ratio: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The builder keeps its groups between passes and either places new objects one by one or
    # regroups the whole buffer, by a size ratio; each way alone must give CLP's partitions.
    monkeypatch.setattr(partition_module, "_REGROUP_ALL_RATIO", regroup_all_ratio)
    rng = random.Random(1000 + seed)
    objects = _random_objects(rng, rng.randint(50, 300), profile)
    target = rng.choice([1, 3, 10, 100, 1000, 5000])
    assert partition_objects(objects, target) == _reference_partitions(objects, target)


@pytest.mark.timeout(30)
def test_small_objects_kept_across_many_passes_cost_no_quadratic_work() -> None:
    # Each large object (estimated 260,000) fills a partition on its own, so a pass takes it and
    # stops; the small ones never add up to the target and stay buffered until the final flush.
    # Regrouping all of them on every pass, as CLP does, takes minutes for 100,000 objects.
    objects = []
    for index in range(100_000):
        if index % 10 == 0:
            objects.append((f"logs/nginx/access.log.{index}.gz", 20_000))
        else:
            objects.append((f"logs/worker/heartbeat-{index:06d}.log", 1))
    partitions = partition_objects(objects, 100_000)
    assert partitions[:-1] == [[key] for key, size in objects if size > 1]
    assert partitions[-1] == sorted(key for key, size in objects if size == 1)


# --- input validation -----------------------------------------------------------------------------


def test_requested_ids_are_sorted() -> None:
    assert check_requested_ids([5, 1, 3], 7) == [1, 3, 5]


def test_no_requested_ids() -> None:
    with pytest.raises(NoS3ObjectMetadata) as raised:
        check_requested_ids([], 7)
    assert str(raised.value) == "no S3 object metadata was requested for ingestion job 7"


def test_duplicate_requested_ids_are_listed_once_sorted() -> None:
    with pytest.raises(DuplicateS3ObjectMetadata) as raised:
        check_requested_ids([5, 3, 1, 5, 3, 5, 9], 7)
    assert (
        str(raised.value) == "duplicate S3 object metadata IDs [3, 5] requested for ingestion job 7"
    )
    assert raised.value.ids == (3, 5)


def test_rows_come_back_in_id_order() -> None:
    rows = [
        S3ObjectRow(9, "bucket", "logs/c.log", 30),
        S3ObjectRow(2, "bucket", "logs/a.log", 10),
        S3ObjectRow(5, "bucket", "logs/b.log", 20),
        S3ObjectRow(77, "bucket", "logs/unrequested.log", 1),
    ]
    objects = objects_in_id_order([2, 5, 9], 7, rows, bucket="bucket", key_prefix="logs/")
    assert objects == [("logs/a.log", 10), ("logs/b.log", 20), ("logs/c.log", 30)]


def _validate(rows: list[S3ObjectRow], ids: list[int] | None = None) -> list[tuple[str, int]]:
    requested = ids if ids is not None else [row.id for row in rows]
    return objects_in_id_order(requested, 7, rows, bucket="logs-bucket", key_prefix="app/")


def test_missing_row() -> None:
    with pytest.raises(MissingS3ObjectMetadata) as raised:
        _validate([S3ObjectRow(1, "logs-bucket", "app/a.log", 1)], ids=[1, 4])
    assert str(raised.value) == "missing S3 object metadata 4 for ingestion job 7"


def test_empty_bucket() -> None:
    with pytest.raises(EmptyS3ObjectMetadataField) as raised:
        _validate([S3ObjectRow(3, "", "app/a.log", 1)])
    assert str(raised.value) == "S3 object metadata 3 has an empty `bucket`"


def test_empty_key() -> None:
    with pytest.raises(EmptyS3ObjectMetadataField) as raised:
        _validate([S3ObjectRow(3, "logs-bucket", "", 1)])
    assert str(raised.value) == "S3 object metadata 3 has an empty `key`"


def test_bucket_mismatch() -> None:
    with pytest.raises(S3BucketMismatch) as raised:
        _validate([S3ObjectRow(3, "other-bucket", "app/a.log", 1)])
    assert str(raised.value) == "S3 bucket mismatch: expected `logs-bucket`, but got `other-bucket`"


def test_key_prefix_mismatch() -> None:
    with pytest.raises(S3KeyPrefixMismatch) as raised:
        _validate([S3ObjectRow(3, "logs-bucket", "App/a.log", 1)])
    assert (
        str(raised.value)
        == "S3 key prefix mismatch: expected key to start with `app/`, but got `App/a.log`"
    )


def test_no_task_inputs() -> None:
    with pytest.raises(NoTaskInputs) as raised:
        require_partitions([])
    assert str(raised.value) == "no S3 objects were partitioned into compression task inputs"
    assert require_partitions([["app/a.log"]]) == [["app/a.log"]]


def test_checks_run_per_object_in_id_order() -> None:
    # Object 2 has a wrong bucket, object 3 is missing and object 4 has an empty key: CLP checks
    # id 2 completely (its bucket against the job's) before it looks for id 3.
    rows = [
        S3ObjectRow(4, "logs-bucket", "", 1),
        S3ObjectRow(2, "other-bucket", "app/b.log", 1),
        S3ObjectRow(1, "logs-bucket", "app/a.log", 1),
    ]
    with pytest.raises(S3BucketMismatch):
        _validate(rows, ids=[1, 2, 3, 4])
    # Within one object: empty bucket before empty key, emptiness before the bucket comparison.
    with pytest.raises(EmptyS3ObjectMetadataField, match="`bucket`"):
        _validate([S3ObjectRow(1, "", "", 1)])
    with pytest.raises(EmptyS3ObjectMetadataField, match="`key`"):
        _validate([S3ObjectRow(1, "other-bucket", "", 1)])
    with pytest.raises(S3BucketMismatch):
        _validate([S3ObjectRow(1, "other-bucket", "elsewhere/a.log", 1)])


def test_every_input_error_is_one_value_error_family() -> None:
    errors: list[InvalidJobInput] = [
        NoS3ObjectMetadata(1),
        DuplicateS3ObjectMetadata(1, [2]),
        MissingS3ObjectMetadata(1, 2),
        EmptyS3ObjectMetadataField(2, "key"),
        S3BucketMismatch("a", "b"),
        S3KeyPrefixMismatch("a", "b"),
        NoTaskInputs(),
        InvalidTargetArchiveSize(0),
        NegativeObjectSize("k", -1),
    ]
    for error in errors:
        assert isinstance(error, ValueError)
        assert not str(error).startswith("Compression job failed")


def test_fetch_batch_size_is_clps() -> None:
    assert FETCH_BATCH_SIZE == 1000


# --- helpers --------------------------------------------------------------------------------------


def _random_objects(rng: random.Random, count: int, profile: str) -> list[tuple[str, int]]:
    """Distinct keys from a few families of similar names, with mixed suffixes, sized by profile.

    "small among large" keeps many small objects buffered across passes; "mostly empty" has
    objects that add nothing to the buffered total.
    """
    stems = ["app.log", "app", "nginx.log", "db", "kernel", "x", "xy", "svc-payments", "日志", ""]
    suffixes = ["", ".gz", ".GZ", ".zst", ".zstd", ".tgz", ".gzip", "/", "/."]
    directories = ["logs/", "logs/a/", "logs/b/", "logs/./c/", "", "logs/.."]
    hosts = count // 8 + 1
    objects: list[tuple[str, int]] = []
    seen: set[str] = set()
    while len(objects) < count:
        key = (
            rng.choice([*directories, f"logs/host-{rng.randrange(hosts)}/"])
            + rng.choice(stems)
            + (f".{rng.randint(0, 30)}" if rng.random() < 0.7 else "")
            + rng.choice(suffixes)
        )
        if key in seen:
            continue
        seen.add(key)
        if profile == "small among large":
            size = rng.randint(1, 5) if rng.random() < 0.9 else rng.randint(500, 5000)
        elif profile == "mostly empty":
            size = 0 if rng.random() < 0.8 else rng.randint(1, 3000)
        else:
            size = rng.choice(
                [0, 1, rng.randint(1, 50), rng.randint(1, 2000), rng.randint(1, 20000)]
            )
        objects.append((key, size))
    return objects


def _strsim_normalized_levenshtein(first: str, second: str) -> float:
    if not first and not second:
        return 1.0
    previous_row = list(range(len(second) + 1))
    for row, first_char in enumerate(first, start=1):
        current_row = [row]
        for column, second_char in enumerate(second, start=1):
            current_row.append(
                min(
                    previous_row[column] + 1,
                    current_row[column - 1] + 1,
                    previous_row[column - 1] + (first_char != second_char),
                )
            )
        previous_row = current_row
    return 1.0 - previous_row[-1] / max(len(first), len(second))


def _reference_file_name(key: str) -> str:
    normal = [part for part in key.split("/") if part not in ("", ".")]
    if not normal or normal[-1] == "..":
        return key
    return normal[-1]


def _reference_partitions(objects: list[tuple[str, int]], target: int) -> list[list[str]]:
    """A plain transcription of CLP's rules (docs/clp.md), written for clarity, not speed."""
    buffer: list[tuple[str, int]] = []
    total = 0
    emitted: list[list[str]] = []

    def run_pass(flush: bool) -> None:
        nonlocal buffer, total
        if (not flush and total < target) or not buffer:
            return
        ordered = sorted(buffer, key=lambda item: _reference_file_name(item[0]))
        groups: list[list[tuple[str, int]]] = []
        for item in ordered:
            if groups and (
                _strsim_normalized_levenshtein(
                    _reference_file_name(groups[-1][-1][0]), _reference_file_name(item[0])
                )
                >= 0.6
            ):
                groups[-1].append(item)
            else:
                groups.append([item])
        queue = [list(group) for group in groups]
        while flush or total >= target:
            partition: list[str] = []
            size = 0
            ran_dry = False
            while size < target:
                if not queue:
                    ran_dry = True
                    break
                group = queue.pop(0)
                key, estimate = group.pop(0)
                if group:
                    queue.append(group)
                size += estimate
                total -= estimate
                partition.append(key)
            if partition:
                emitted.append(partition)
            if ran_dry:
                break
        buffer = [item for group in queue for item in group]

    for key, size in objects:
        estimate = estimate_size(key, size)
        buffer.append((key, estimate))
        total += estimate
        if total >= 2 * target:
            run_pass(flush=False)
    run_pass(flush=True)
    return emitted
