"""Spider's length-prefixed frames and zstd, read as Spider reads them, rule by rule.

Every input is built here with ``struct``/literal bytes and ``zstandard`` directly, never with the
encoders under test. The rules are Spider's (Spider's source, ``components/``):
``spider-utils/src/wire.rs`` (W) ``WireFrameBuilder::unframe_payloads``, and
``spider-core/src/compression.rs`` (C) ``decode_zstd_bytes`` = ``zstd::stream::decode_all``. Each
was also checked against Spider's real storage service (``../shared/spider-storage``):
RegisterJob accepts a graph or inputs split over zstd frames and a frame followed by bytes it does
not declare, and refuses bytes after the last zstd frame, a truncated frame, an empty payload,
a short count header and a payload that runs past the end, with the reasons below.
"""

from __future__ import annotations

import struct
from concurrent.futures import ThreadPoolExecutor

import pytest
import zstandard

from coordinator.spider.task_graph import InvalidTaskGraph, decode_job_submission, decode_task_graph
from coordinator.spider.wire import (
    MAX_DECOMPRESSED_BYTES,
    InvalidFrame,
    decode_frame,
    decode_job_inputs,
    decode_job_outputs,
    decompress,
)
from coordinator.zstd_frames import ZstdFramesError, compress_frame, decode_zstd_frames
from tests.engine_support import graph, task
from tests.vectors import load_vector

GRAPH_JSON = load_vector("task_graph.json")["task_graph_json_text"].encode()
SKIPPABLE = bytes.fromhex("502a4d18") + struct.pack("<I", 3) + b"abc"


def _frame(*payloads: bytes, count: int | None = None) -> bytes:
    """A wire frame built by hand: u32 LE count, then u32 LE length + bytes per payload."""
    head = struct.pack("<I", len(payloads) if count is None else count)
    return head + b"".join(struct.pack("<I", len(payload)) + payload for payload in payloads)


def _zstd(raw: bytes, *, content_size: bool = True) -> bytes:
    compressor = zstandard.ZstdCompressor(level=3, write_content_size=content_size)
    if content_size:
        return compressor.compress(raw)
    stream = compressor.compressobj()
    return stream.compress(raw) + stream.flush()


# --- length-prefixed frames (W:274-303) ---------------------------------------------------------


def test_bytes_after_the_declared_payloads_are_ignored() -> None:
    """W:283-302: the loop reads ``count`` payloads and returns; the rest is never looked at.
    Before, trailing bytes were refused."""
    assert decode_frame(_frame(b"\x01", b"") + b"\xff\xff\xff") == [b"\x01", b""]
    assert decode_frame(bytes.fromhex("00000000ff")) == []
    assert decode_job_outputs(b"\x00" + _frame(b"\xc0") + b"junk") == [b"\xc0"]


def test_a_frame_reads_exactly_its_declared_payloads() -> None:
    """W:274-303: ``count`` payloads in order, each ``length`` bytes (empty ones included)."""
    assert decode_frame(_frame()) == []
    assert decode_frame(_frame(b"", b"abc", b"\x00" * 300)) == [b"", b"abc", b"\x00" * 300]


@pytest.mark.parametrize(
    ("frame", "reason"),
    [
        (b"", "buffer too small for the payload count header"),
        (b"\x01\x00\x00", "buffer too small for the payload count header"),
        (_frame(count=1), "unexpected end of buffer reading payload length"),
        (_frame(b"ab", count=2) + b"\x01\x00", "unexpected end of buffer reading payload length"),
        (_frame(b"abcde")[:-1], "unexpected end of buffer reading payload data"),
        (struct.pack("<II", 1, 2**32 - 1) + b"x", "unexpected end of buffer reading payload data"),
    ],
    ids=["empty", "three_bytes", "no_length", "cut_length", "short_payload", "huge_length"],
)
def test_spiders_reader_refuses_a_frame_that_ends_early(frame: bytes, reason: str) -> None:
    """W:275-279 (count header), W:285-290 (a length), W:293-297 (a payload's bytes), with
    Spider's ``invalid wire format: …`` reason (``InvalidFrame.reason``: that alone, which
    RegisterJob's refusal of such inputs carries, as Spider's does)."""
    with pytest.raises(InvalidFrame, match=f"^invalid wire format: {reason} ") as error:
        decode_frame(frame)
    assert error.value.reason == f"invalid wire format: {reason}"
    with pytest.raises(InvalidTaskGraph) as refused:
        decode_job_submission(graph(task("echo")).compressed(), _zstd(frame))
    assert str(refused.value) == (
        f"bad request: failed to deserialize the job inputs: invalid wire format: {reason}"
    )


# --- zstd: every frame (C:30, zstd::stream::decode_all) -----------------------------------------


def test_every_zstd_frame_is_decoded_with_or_without_a_content_size() -> None:
    """C:30: decode_all concatenates every frame. Before, only the first frame was read."""
    frame = _frame(b"\x94\x01\x02\xc0\xc2", b"\xa7default", b"\x00" * 40)
    split = _zstd(frame[:7]) + _zstd(frame[7:20], content_size=False) + _zstd(frame[20:])
    assert zstandard.get_frame_parameters(split).content_size == 7
    assert decode_zstd_frames(split, 1024) == frame
    assert decode_job_inputs(split) == decode_frame(frame)
    assert decode_job_outputs(b"\x01" + split) == decode_frame(frame)


def test_a_task_graph_split_over_frames_decodes() -> None:
    """C:30 for ``compressed_serialized_task_graph`` (``task_graph.rs`` reads it with
    ``decode_zstd_bytes``); checked with Spider's storage service. Before, only the first
    frame was read and the JSON was cut short."""
    half = len(GRAPH_JSON) // 2
    graph = _zstd(GRAPH_JSON[:half]) + _zstd(GRAPH_JSON[half:], content_size=False)
    assert decode_task_graph(graph).to_json_text() == GRAPH_JSON.decode()


def test_skippable_frames_give_nothing() -> None:
    """C:30: libzstd skips skippable frames (magic 0x184D2A5?), wherever they are."""
    assert decode_zstd_frames(SKIPPABLE + _zstd(b"abc") + SKIPPABLE, 1024) == b"abc"
    assert decode_zstd_frames(SKIPPABLE, 1024) == b""


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (_zstd(b"abc") + b"xyz", "zstd decompress error: Unknown frame descriptor"),
        (_zstd(b"abc") + b"\x00", "zstd decompress error: Unknown frame descriptor"),
        (b"not zstd", "zstd decompress error: Unknown frame descriptor"),
        (_zstd(b"abc" * 100)[:-1], "incomplete frame"),
        (_zstd(b"abc") + _zstd(b"def")[:5], "incomplete frame"),
        (b"", "incomplete frame"),
    ],
    ids=["garbage_after", "zero_after", "not_zstd", "truncated", "second_truncated", "empty"],
)
def test_what_is_not_whole_zstd_frames_is_refused(data: bytes, reason: str) -> None:
    """C:30: after a frame, the next bytes must start another (libzstd's ``Unknown frame
    descriptor``); input that ends inside a frame, or no input, is the zstd crate's ``incomplete
    frame`` (``zstd/src/stream/raw.rs``, ``Decoder::finish``). Spider's server answers
    ``failed to decompress zstd bytes: <reason>``, the reason without this module's prefix
    (``ZstdFramesError.reason``), and so do the task graph's and the job inputs' readers. Before,
    bytes after the first frame were ignored, and a cut frame or an empty blob gave what it held."""
    with pytest.raises(ZstdFramesError) as error:
        decode_zstd_frames(data, 1024)
    assert str(error.value) == reason
    spiders = error.value.reason
    assert spiders in ("Unknown frame descriptor", "incomplete frame")
    assert reason.endswith(spiders)
    with pytest.raises(InvalidFrame, match=f"^the job inputs is not zstd-compressed: {reason}$"):
        decompress(data, "the job inputs")
    with pytest.raises(InvalidTaskGraph) as graph_error:
        decode_task_graph(data)
    assert str(graph_error.value) == (
        "bad request: failed to deserialize the compressed task graph: "
        f"`crate::compression::Error`: failed to decompress zstd bytes: {spiders}"
    )
    with pytest.raises(InvalidTaskGraph) as inputs_error:
        decode_job_submission(graph(task("echo")).compressed(), data)
    assert str(inputs_error.value) == (
        "bad request: failed to deserialize the job inputs: "
        f"failed to decompress zstd bytes: {spiders}"
    )


def test_output_past_the_limit_is_refused() -> None:
    """Spider sets no limit; here a blob may not inflate past ``MAX_DECOMPRESSED_BYTES``."""
    bomb = _zstd(b"\x00" * (2 * 1024 * 1024))
    assert len(decode_zstd_frames(bomb, 2 * 1024 * 1024)) == 2 * 1024 * 1024
    with pytest.raises(ZstdFramesError, match="inflates past"):
        decode_zstd_frames(bomb, 1024 * 1024)
    assert MAX_DECOMPRESSED_BYTES == 256 * 1024 * 1024


def test_a_reused_compressor_writes_each_frame_as_a_fresh_one_in_every_thread() -> None:
    # compress_frame keeps one compressor per thread and level: every call must still write the
    # whole frame a new compressor writes (content size in the header), whatever came before it
    # on that thread, and threads must not share a context.
    blobs = [GRAPH_JSON, b"", b"x" * 70_000, GRAPH_JSON[:100]]
    expected = [zstandard.ZstdCompressor(level=3).compress(blob) for blob in blobs]

    def compress_all() -> list[bytes]:
        return [compress_frame(blob, 3) for _ in range(50) for blob in blobs]

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = [future.result() for future in [pool.submit(compress_all) for _ in range(4)]]
    for result in results:
        assert result == expected * 50
    assert compress_frame(GRAPH_JSON, 1) == zstandard.ZstdCompressor(level=1).compress(GRAPH_JSON)
    frame = zstandard.get_frame_parameters(compress_frame(GRAPH_JSON, 3))
    assert frame.content_size == len(GRAPH_JSON)
