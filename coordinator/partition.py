"""Splitting a compression job's S3 objects into compression-task inputs, exactly as CLP does.

CLP's coordinator decides which objects each ``clp-s`` task compresses with its
``CompressionInputBuilder``; this module makes the same decisions, so a job is cut into the same
partitions whichever coordinator runs it. The rules are in ``docs/clp.md`` (Partitioning; the
error texts under CLP's Rust coordinator) and are pinned by ``vectors/partition.json``:

* **Input**. The requested metadata ids must be non-empty and distinct. The
  objects are taken in ascending id order; each must exist for the job's ingestion job, have a
  non-empty bucket and key, be in the job's bucket, and have a key that starts with the job's key
  prefix (a plain string prefix). Checks run per object in that order, objects in id order, so the
  first failure is the one CLP reports. The messages are CLP's, without the
  ``Compression job failed: `` prefix that the service adds.
* **Estimate**. An object's uncompressed size is guessed from its key's suffix, ignoring
  ASCII case: ``.gz``, ``.gzip``, ``.tgz`` mean ×13, otherwise ``.zst`` means ×8, anything else
  (``.zstd`` included) counts its raw size.
* **Buffering**. Objects are buffered with the running total of their estimates. When the
  total reaches twice the target archive size, a partitioning pass runs at once.
* **A pass**. The buffer is grouped by file name: the key's last path component as Rust's
  ``Path::file_name`` sees it (trailing ``/`` and ``.`` components ignored), or the whole key when
  that is ``..`` or absent. The buffer is sorted stably by that name (code-point order), and a file
  joins the current group while its name's normalized Levenshtein similarity to the previous name
  is at least 0.6, else it starts a new group. Files are then drawn round-robin, one per group in
  turn, into partitions: a partition takes files while it is still below the target (its last file
  may overshoot the target by any amount; no object is ever split), and partitions are cut while
  the buffered total is at least the target, or until nothing is left on the final flush. Files a
  pass leaves go back to the buffer in the round-robin's current group order and are regrouped
  with the objects added after them by the next pass.
* **Output**. Every partition in emission order, none empty. A job that yields no
  partition fails.

One departure: a target archive size below 1 is refused. CLP's pass never ends on 0.

CLP re-sorts and regroups its whole buffer on every pass; ``PartitionBuilder`` keeps the buffer
grouped between passes and regroups only around what changed, which gives the same partitions
(its docstring says why) without quadratic work when small objects stay buffered for long.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import string
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, NamedTuple, Self, TypeVar

from coordinator.errors import CoordinatorError

FETCH_BATCH_SIZE = 1000
"""Requested ids are fetched from ``ingested_s3_object_metadata`` this many at a time, which
keeps each ``IN (…)`` list well inside MySQL's placeholder limit."""

SIMILAR_NAME_THRESHOLD = 0.6
"""Two file names belong to the same group when their normalized Levenshtein similarity is at least
this."""

GZIP_SIZE_RATIO = 13
ZSTD_SIZE_RATIO = 8
_GZIP_SUFFIXES = (".gz", ".gzip", ".tgz")
_ZSTD_SUFFIX = ".zst"
_LONGEST_SUFFIX = max(len(suffix) for suffix in (*_GZIP_SUFFIXES, _ZSTD_SUFFIX))
# CLP ignores ASCII case only; str.lower() would fold non-ASCII letters too.
_ASCII_LOWERCASE = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)

T = TypeVar("T")


class InvalidJobInput(CoordinatorError, ValueError):
    """A job's input that CLP's coordinator would refuse; ``str(error)`` says why, in CLP's words.

    The text is what follows ``Compression job failed: `` in ``status_msg`` (``docs/clp.md``).
    """


class NoS3ObjectMetadata(InvalidJobInput):
    """The job requests no S3 object at all."""

    def __init__(self, ingestion_job_id: int) -> None:
        super().__init__(
            f"no S3 object metadata was requested for ingestion job {ingestion_job_id}"
        )
        self.ingestion_job_id = ingestion_job_id


class DuplicateS3ObjectMetadata(InvalidJobInput):
    """The job requests some object more than once; ``ids`` lists each such id once, ascending."""

    def __init__(self, ingestion_job_id: int, ids: Sequence[int]) -> None:
        # Rust's debug format of a Vec<u64>: "[3, 5]".
        listed = "[" + ", ".join(str(object_id) for object_id in ids) + "]"
        super().__init__(
            f"duplicate S3 object metadata IDs {listed} requested for ingestion job "
            f"{ingestion_job_id}"
        )
        self.ingestion_job_id = ingestion_job_id
        self.ids = tuple(ids)


class MissingS3ObjectMetadata(InvalidJobInput):
    """A requested object has no row for the job's ingestion job."""

    def __init__(self, ingestion_job_id: int, object_id: int) -> None:
        super().__init__(
            f"missing S3 object metadata {object_id} for ingestion job {ingestion_job_id}"
        )
        self.ingestion_job_id = ingestion_job_id
        self.object_id = object_id


class EmptyS3ObjectMetadataField(InvalidJobInput):
    """A requested object's ``bucket`` or ``key`` is the empty string."""

    def __init__(self, object_id: int, field: str) -> None:
        super().__init__(f"S3 object metadata {object_id} has an empty `{field}`")
        self.object_id = object_id
        self.field = field


class S3BucketMismatch(InvalidJobInput):
    """An object lives in another bucket than the job's."""

    def __init__(self, expected: str, actual: str) -> None:
        super().__init__(f"S3 bucket mismatch: expected `{expected}`, but got `{actual}`")
        self.expected = expected
        self.actual = actual


class S3KeyPrefixMismatch(InvalidJobInput):
    """An object's key does not start with the job's key prefix."""

    def __init__(self, key_prefix: str, key: str) -> None:
        super().__init__(
            f"S3 key prefix mismatch: expected key to start with `{key_prefix}`, but got `{key}`"
        )
        self.key_prefix = key_prefix
        self.key = key


class NoTaskInputs(InvalidJobInput):
    """Partitioning produced no compression task."""

    def __init__(self) -> None:
        super().__init__("no S3 objects were partitioned into compression task inputs")


class InvalidTargetArchiveSize(InvalidJobInput):
    """A target archive size below 1 byte (not a CLP error: CLP would never finish partitioning)."""

    def __init__(self, target_archive_size: int) -> None:
        super().__init__(
            f"invalid target archive size {target_archive_size}: it must be at least 1 byte"
        )
        self.target_archive_size = target_archive_size


class NegativeObjectSize(InvalidJobInput):
    """An object with a size below 0 (not a CLP error: CLP's column is unsigned)."""

    def __init__(self, key: str, size: int) -> None:
        super().__init__(f"S3 object `{key}` has a negative size {size}")
        self.key = key
        self.size = size


@dataclass(frozen=True, slots=True)
class S3ObjectRow:
    """The columns of an ``ingested_s3_object_metadata`` row that partitioning needs."""

    id: int
    bucket: str
    key: str
    size: int


def check_requested_ids(ids: Sequence[int], ingestion_job_id: int) -> list[int]:
    """The requested object ids in ascending order, the order CLP fetches and adds them in.

    Fails with ``NoS3ObjectMetadata`` when ``ids`` is empty and with ``DuplicateS3ObjectMetadata``
    (naming every repeated id once, ascending) when an id occurs more than once.
    """
    if not ids:
        raise NoS3ObjectMetadata(ingestion_job_id)
    ordered = sorted(ids)
    duplicates: list[int] = []
    for previous, current in itertools.pairwise(ordered):
        if previous == current and (not duplicates or duplicates[-1] != current):
            duplicates.append(current)
    if duplicates:
        raise DuplicateS3ObjectMetadata(ingestion_job_id, duplicates)
    return ordered


def objects_in_id_order(
    requested_ids: Sequence[int],
    ingestion_job_id: int,
    rows: Iterable[S3ObjectRow],
    *,
    bucket: str,
    key_prefix: str,
) -> list[tuple[str, int]]:
    """``(key, size)`` of every requested object, in ascending id order, for ``partition_objects``.

    ``requested_ids`` are the distinct ids ``check_requested_ids`` returns; ``rows`` are what the
    fetch returned for ``ingestion_job_id``, in any order (a row of another ingestion job must not
    be among them: CLP's query filters on the ingestion job, so such an id counts as missing).
    Rows that were not requested are ignored. ``bucket`` and ``key_prefix`` are the job's.

    Each object is checked in id order, and within an object in CLP's order; the first failure is
    raised: ``MissingS3ObjectMetadata`` (no row for the id), ``EmptyS3ObjectMetadataField`` (empty
    ``bucket``, then empty ``key``), ``S3BucketMismatch``, ``S3KeyPrefixMismatch``.
    """
    rows_by_id = {row.id: row for row in rows}
    objects: list[tuple[str, int]] = []
    for object_id in sorted(requested_ids):
        row = rows_by_id.get(object_id)
        if row is None:
            raise MissingS3ObjectMetadata(ingestion_job_id, object_id)
        if not row.bucket:
            raise EmptyS3ObjectMetadataField(object_id, "bucket")
        if not row.key:
            raise EmptyS3ObjectMetadataField(object_id, "key")
        if row.bucket != bucket:
            raise S3BucketMismatch(bucket, row.bucket)
        if not row.key.startswith(key_prefix):
            raise S3KeyPrefixMismatch(key_prefix, row.key)
        objects.append((row.key, row.size))
    return objects


def require_partitions(partitions: list[list[str]]) -> list[list[str]]:
    """``partitions`` unchanged; fails with ``NoTaskInputs`` when there are none."""
    if not partitions:
        raise NoTaskInputs
    return partitions


def estimate_size(key: str, size: int) -> int:
    """The uncompressed size CLP assumes for an object of ``size`` raw bytes, from its key's suffix.

    ``.gz``, ``.gzip`` or ``.tgz`` (``.tar.gz`` too) multiply by 13, otherwise ``.zst`` by 8;
    anything else, ``.zstd`` included, is taken as is. Suffixes are compared ignoring ASCII case.
    Fails with ``NegativeObjectSize`` when ``size`` is below 0.
    """
    if size < 0:
        raise NegativeObjectSize(key, size)
    suffix = key[-_LONGEST_SUFFIX:].translate(_ASCII_LOWERCASE)
    if suffix.endswith(_GZIP_SUFFIXES):
        return size * GZIP_SIZE_RATIO
    if suffix.endswith(_ZSTD_SUFFIX):
        return size * ZSTD_SIZE_RATIO
    return size


def file_name(key: str) -> str:
    """The name a key is grouped by: its last path component as Rust's ``Path::file_name`` has it.

    Empty components (``//``, a trailing ``/``) and ``.`` components are skipped, so ``a/b/`` and
    ``a/b/.`` give ``b``. When the last remaining component is ``..``, or none remains (``/``,
    ``""``, ``.``), the whole key is the name. Never fails.
    """
    _, _, last = key.rpartition("/")
    if last not in ("", ".", ".."):
        return last
    for component in reversed(key.split("/")):
        if component in ("", "."):
            continue
        return key if component == ".." else component
    return key


def name_similarity(first: str, second: str) -> float:
    """The normalized Levenshtein similarity of two names, as CLP (strsim) computes it.

    1 − edit distance / length of the longer name, in characters; 1.0 for two empty names. Never
    fails.
    """
    # No score_cutoff: rapidfuzz 3.x reports 0.0 for a score exactly at the cutoff (a 2-edit pair of
    # 5-character names scores exactly 0.6), which would split a group that CLP keeps together.
    return _normalized_similarity()(first, second)


@functools.cache
def _normalized_similarity() -> Callable[[str, str], float]:
    # rapidfuzz is imported by the first partitioning, not by every command (start-up time, issue
    # 14); once, here: an import inside name_similarity would double its cost per pair.
    from rapidfuzz.distance import Levenshtein  # noqa: PLC0415

    similarity: Callable[[str, str], float] = Levenshtein.normalized_similarity
    return similarity


def group_by_similar_name(keys: Iterable[str]) -> list[list[str]]:
    """``keys`` grouped as a partitioning pass groups its buffer.

    Sorted stably by ``file_name``, then split wherever a name's ``name_similarity`` to the name
    before it is below 0.6. Never fails.
    """
    items = [_Item(file_name(key), key, 0) for key in keys]
    return [[item.key for item in run] for run in _similar_name_runs(items)]


class RoundRobin(Generic[T]):
    """Draws one item from each group in turn; a group leaves the rotation once it is used up.

    The rotation is a queue of groups: the front group gives its next item and, if it has more,
    goes to the back. ``remaining()`` is what has not been drawn, group by group in the queue's
    current order (the order CLP puts a pass's leftovers back into its buffer in).
    """

    __slots__ = ("_groups", "_rotation", "_unvisited")

    def __init__(self, groups: Iterable[Iterable[T]]) -> None:
        self._start([_Group(items) for items in map(list, groups) if items])

    @classmethod
    def _drawing_from(cls, groups: list[_Group[T]]) -> RoundRobin[T]:
        """A rotation over ``groups`` themselves: drawing advances them in place, no copies."""
        draw = cls.__new__(cls)
        draw._start(groups)
        return draw

    def _start(self, groups: list[_Group[T]]) -> None:
        # Until every group has given its first item, the queue's front is simply the next group
        # in order, so the groups nobody reaches are never touched.
        self._groups = groups
        self._unvisited = 0
        self._rotation: deque[_Group[T]] = deque()

    @property
    def visited(self) -> int:
        """How many groups (always the first ones, in order) have given at least one item."""
        return self._unvisited

    def __iter__(self) -> Self:
        return self

    def __next__(self) -> T:
        if self._unvisited < len(self._groups):
            group = self._groups[self._unvisited]
            self._unvisited += 1
        elif self._rotation:
            group = self._rotation.popleft()
        else:
            raise StopIteration
        item = group.items[group.start]
        group.start += 1
        if group.start < len(group.items):
            self._rotation.append(group)
        return item

    def remaining(self) -> list[T]:
        """The undrawn items, flattened in the rotation's current group order."""
        queue = itertools.chain(self._groups[self._unvisited :], self._rotation)
        return [item for group in queue for item in group.items[group.start :]]


class PartitionBuilder:
    """CLP's ``CompressionInputBuilder``: objects go in one by one, partitions come out.

    ``add`` may already cut partitions (when the buffered estimates reach twice the target);
    ``finish`` cuts the rest and returns every partition in emission order.

    The buffer is not re-sorted and regrouped from scratch on every pass, as CLP does: it is kept
    as its groups, in name order, and only what changed is regrouped. That gives CLP's partitions
    because, at the start of any pass, CLP's stably sorted buffer is the buffered objects ordered by
    (file name, insertion order): equal names always share a group, a pass draws each group from
    its front, and new objects are appended behind the leftovers. CLP's groups are the runs of that
    order between dissimilar neighbours, so a new object or a drawn one only changes the groups
    next to it. Keeping them avoids the quadratic work of regrouping objects that stay buffered
    across many passes (many small objects among a few large ones).
    """

    def __init__(self, target_archive_size: int) -> None:
        """Fails with ``InvalidTargetArchiveSize`` when ``target_archive_size`` is below 1."""
        if target_archive_size < 1:
            raise InvalidTargetArchiveSize(target_archive_size)
        self._target = target_archive_size
        self._early_pass_threshold = 2 * target_archive_size
        # The buffer: objects added since the last pass, and the groups of the ones before.
        self._unsorted: list[_Item] = []
        self._groups: list[_Group[_Item]] = []
        self._grouped_count = 0
        self._buffered_estimate = 0
        self._partitions: list[list[str]] = []
        self._finished = False

    @property
    def emitted(self) -> tuple[tuple[str, ...], ...]:
        """A copy of the partitions cut so far, in emission order."""
        return tuple(tuple(partition) for partition in self._partitions)

    def add(self, key: str, size: int) -> None:
        """Buffers one object of ``size`` raw bytes, running a pass if the buffer is big enough.

        Fails with ``NegativeObjectSize`` for a size below 0, and with ``RuntimeError`` once the
        builder has been finished.
        """
        if self._finished:
            raise RuntimeError("the partition builder was already finished")
        estimate = estimate_size(key, size)
        self._unsorted.append(_Item(file_name(key), key, estimate))
        self._buffered_estimate += estimate
        if self._buffered_estimate >= self._early_pass_threshold:
            self._run_pass(flush=False)

    def finish(self) -> list[list[str]]:
        """Partitions whatever is still buffered and returns every partition in emission order.

        Fails with ``RuntimeError`` when called a second time.
        """
        if self._finished:
            raise RuntimeError("the partition builder was already finished")
        self._run_pass(flush=True)
        self._finished = True
        return self._partitions

    def _run_pass(self, *, flush: bool) -> None:
        self._group_new_objects()
        if not self._groups:
            return
        draw = RoundRobin._drawing_from(self._groups)
        target = self._target
        buffered_estimate = self._buffered_estimate
        drawn_count = 0
        while flush or buffered_estimate >= target:
            partition: list[str] = []
            partition_estimate = 0
            drawn_everything = False
            while partition_estimate < target:
                item = next(draw, None)
                if item is None:
                    drawn_everything = True
                    break
                partition_estimate += item.estimate
                partition.append(item.key)
            buffered_estimate -= partition_estimate
            drawn_count += len(partition)
            if partition:
                self._partitions.append(partition)
            if drawn_everything:
                break
        self._buffered_estimate = buffered_estimate
        self._grouped_count -= drawn_count
        self._regroup_drawn(draw.visited)

    def _group_new_objects(self) -> None:
        new_items = self._unsorted
        if not new_items:
            return
        self._unsorted = []
        if len(new_items) * _REGROUP_ALL_RATIO >= self._grouped_count:
            # Many new objects: one sort (the grouped ones are already in order, so it is mostly a
            # merge) and one scan cost less than placing each.
            items = [item for group in self._groups for item in group.items[group.start :]]
            items.extend(new_items)
            self._groups = [_Group(run) for run in _similar_name_runs(items)]
        else:
            for item in new_items:
                self._place(item)
        self._grouped_count += len(new_items)

    def _place(self, item: _Item) -> None:
        """Puts a new object behind every grouped one whose name sorts before or equal to it."""
        groups = self._groups
        name = item.name
        index = bisect.bisect_right(groups, name, key=_front_name) - 1
        if index >= 0:
            group = groups[index]
            items = group.items
            position = bisect.bisect_right(items, name, lo=group.start, key=_item_name)
            if position < len(items):
                self._place_inside(index, position, item)
                return
        # Between two groups (or before the first, or after the last).
        before = groups[index] if index >= 0 else None
        after = groups[index + 1] if index + 1 < len(groups) else None
        if before is not None and _linked(before.items[-1].name, name):
            before.items.append(item)
            if after is not None and _linked(name, _front_name(after)):
                groups[index] = _joined(before, after)
                del groups[index + 1]
        elif after is not None and _linked(name, _front_name(after)):
            after.items.insert(after.start, item)
        else:
            groups.insert(index + 1, _Group([item]))

    def _place_inside(self, index: int, position: int, item: _Item) -> None:
        """Puts a new object between two neighbours of one group, splitting it where unlike."""
        groups = self._groups
        items = groups[index].items
        joins_before = _linked(items[position - 1].name, item.name)
        joins_after = _linked(item.name, items[position].name)
        if joins_before and joins_after:
            items.insert(position, item)
            return
        tail = items[position:]
        del items[position:]
        if joins_before:
            items.append(item)
            groups.insert(index + 1, _Group(tail))
        elif joins_after:
            groups.insert(index + 1, _Group([item, *tail]))
        else:
            groups[index + 1 : index + 1] = [_Group([item]), _Group(tail)]

    def _regroup_drawn(self, visited: int) -> None:
        """Drops used-up groups among the first ``visited`` and joins the ones that became alike.

        Drawing only shortens the visited groups from their fronts, so only their fronts and the
        neighbours of emptied groups have new neighbours; the group after them is rechecked too.
        """
        groups = self._groups
        end = min(visited + 1, len(groups))
        regrouped: list[_Group[_Item]] = []
        for group in groups[:end]:
            if group.start == len(group.items):
                continue
            if group.start * 2 > len(group.items):
                # Forget the drawn front once it is most of the list (amortized O(1) per item).
                del group.items[: group.start]
                group.start = 0
            if regrouped and _linked(regrouped[-1].items[-1].name, _front_name(group)):
                regrouped[-1] = _joined(regrouped[-1], group)
            else:
                regrouped.append(group)
        groups[:end] = regrouped


def partition_objects(
    objects: Iterable[tuple[str, int]], target_archive_size: int
) -> list[list[str]]:
    """The partitions (lists of keys, in emission order) CLP cuts from ``objects``.

    ``objects`` are ``(key, raw size)`` pairs in the order CLP adds them: ascending metadata id.
    No input gives no partition. Fails with ``InvalidTargetArchiveSize`` when
    ``target_archive_size`` is below 1 (before reading ``objects``) and with ``NegativeObjectSize``
    for a size below 0.
    """
    builder = PartitionBuilder(target_archive_size)
    for key, size in objects:
        builder.add(key, size)
    return builder.finish()


_REGROUP_ALL_RATIO = 4
"""New objects are sorted in with the grouped ones, rather than placed one by one, when there are
at least a quarter as many of them: regrouping everything then costs a bounded multiple of their
number."""


class _Item(NamedTuple):
    name: str
    key: str
    estimate: int


class _Group(Generic[T]):
    """A group's items in order; the first ``start`` have been drawn."""

    __slots__ = ("items", "start")

    def __init__(self, items: list[T]) -> None:
        self.items = items
        self.start = 0


def _item_name(item: _Item) -> str:
    return item.name


def _front_name(group: _Group[_Item]) -> str:
    return group.items[group.start].name


def _linked(name: str, next_name: str) -> bool:
    # Equal names skip the distance: they always score 1.0.
    return name == next_name or name_similarity(name, next_name) >= SIMILAR_NAME_THRESHOLD


def _similar_name_runs(items: list[_Item]) -> list[list[_Item]]:
    """``items`` sorted stably by name and cut between dissimilar neighbours."""
    runs: list[list[_Item]] = []
    run: list[_Item] = []
    previous_name = ""
    # Each file is compared with its group's last file only (a chain), which is always the file
    # just before it in name order.
    for item in sorted(items, key=_item_name):
        name = item.name
        if run and _linked(previous_name, name):
            run.append(item)
        else:
            run = [item]
            runs.append(run)
        previous_name = name
    return runs


def _joined(first: _Group[_Item], second: _Group[_Item]) -> _Group[_Item]:
    """One group of ``first``'s remaining items followed by ``second``'s, copying the shorter."""
    if len(first.items) - first.start >= len(second.items) - second.start:
        first.items.extend(second.items[second.start :])
        return first
    second.items[second.start : second.start] = first.items[first.start :]
    return second
