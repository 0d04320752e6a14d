"""Every zstd frame of a blob, read as Rust's ``zstd::stream::decode_all`` reads it; one frame
written.

Spider compresses job inputs and outputs with zstd (``coordinator.spider.wire``) and CLP stores the
job config as zstd over msgpack (``coordinator.job_config``); both are decoded by Rust's
``zstd::stream::decode_all``, which this module reproduces once for both, and both write one frame
(``compress_frame``).
"""

from __future__ import annotations

import threading

import zstandard

from coordinator.errors import CoordinatorError


class ZstdFramesError(CoordinatorError, ValueError):
    """Bytes ``zstd::stream::decode_all`` refuses (the message says why), or too much output.

    ``reason`` is what the zstd crate's ``io::Error`` says (libzstd's error name, or ``incomplete
    frame``), the message with this module's ``zstd decompress error: `` prefix."""

    def __init__(self, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = message if reason is None else reason


class ZstdOutputTooLarge(ZstdFramesError):
    """Output past the caller's limit (Rust sets none; this one protects the process)."""


_compressors = threading.local()


def compress_frame(data: bytes, level: int) -> bytes:
    """``data`` as one zstd frame at ``level``, its content size in the header (what
    ``zstandard.ZstdCompressor(level=level).compress`` writes).

    Each thread keeps one compressor per level: making its context costs as much as compressing
    a job's few hundred bytes, and a context may be reused (each ``compress`` starts a new frame)
    but not shared between threads.
    """
    by_level: dict[int, zstandard.ZstdCompressor] | None = getattr(_compressors, "by_level", None)
    if by_level is None:
        by_level = _compressors.by_level = {}
    compressor = by_level.get(level)
    if compressor is None:
        compressor = by_level[level] = zstandard.ZstdCompressor(level=level)
    return compressor.compress(data)


_ZSTD_CHUNK = 1024
"""Compressed bytes fed to zstd at a time: one zstd block inflates at most 32,768-fold (an RLE
block: 4 bytes for 128 KiB), so the output limit is overshot by at most 32 MiB."""


def decode_zstd_frames(data: bytes, limit: int) -> bytes:
    """Every zstd frame of ``data``, concatenated, as Rust's ``zstd::stream::decode_all`` reads it.

    The zstd crate's streaming reader (``zstd/src/stream/zio/reader.rs``, ``Reader::read``, not
    single-frame) decodes frame after frame until the input ends: each frame with or without a
    content size (and skippable frames, which give nothing), the next one starting right after the
    previous one ends. So bytes after a frame that are not another frame are an error (libzstd's
    ``Unknown frame descriptor``), and an input that ends inside a frame, or is empty, is an error
    too (``finish`` with no finished frame: ``incomplete frame``, ``zstd/src/stream/raw.rs``).

    Rust sets no output limit; here output past ``limit`` bytes raises ``ZstdOutputTooLarge`` (a
    ``ZstdFramesError``: a few hundred bytes of zstd can claim gigabytes). Nothing else escapes.
    """
    if not data:
        raise ZstdFramesError("incomplete frame")
    decompressor = zstandard.ZstdDecompressor()
    view = memoryview(data)
    output = bytearray()
    position = 0
    while position < len(data):
        frame = decompressor.decompressobj()  # one frame; a new context for the next one
        while not frame.eof:
            if position >= len(data):
                raise ZstdFramesError("incomplete frame")
            chunk = view[position : position + _ZSTD_CHUNK]
            position += len(chunk)
            try:
                output += frame.decompress(chunk)
            except zstandard.ZstdError as error:
                # "zstd decompressor error: Unknown frame descriptor": libzstd's reason, which is
                # what the zstd crate reports (zstd_safe::get_error_name).
                reason = str(error).partition("error: ")[2] or str(error)
                raise ZstdFramesError(f"zstd decompress error: {reason}", reason) from error
            if len(output) > limit:
                raise ZstdOutputTooLarge(f"inflates past {limit} bytes")
        position -= len(frame.unused_data)  # the next frame starts where this one ended
    return bytes(output)
