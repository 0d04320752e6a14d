"""Spider's binary frames: job inputs (RegisterJob) and job outputs (GetJobOutputs, commit task).

``docs/spider.md``, Wire formats (and Outputs and the termination tasks). A *wire frame* is::

    u32 little-endian count, then per payload: u32 little-endian length, payload bytes

* ``RegisterJobRequest.compressed_serialized_inputs`` is zstd(wire frame), payloads in job-input
  order (for CLP: ``[option_0, dataset_0, source_0, option_1, …]``);
* ``GetJobOutputs.serialized_outputs`` (and the commit task's graph outputs) is one option byte then
  the frame: ``0`` plain, ``1`` zstd(frame), the latter when the payloads sum to more than 1 KiB.

An empty frame is ``00000000``.

Reading follows Spider's reader exactly (``spider-utils/src/wire.rs``,
``WireFrameBuilder::unframe_payloads``): the count and every declared payload must be there, and
bytes after the last declared payload are ignored. zstd is decoded as ``zstd::stream::decode_all``
does (``spider-core/src/compression.rs``): every frame of the blob, each with or without a content
size (``coordinator.zstd_frames``, shared with the job config).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from coordinator.errors import CoordinatorError
from coordinator.zstd_frames import ZstdFramesError, compress_frame, decode_zstd_frames

ZSTD_LEVEL = 3
"""Spider compresses with level 0, which zstd takes as its default, 3."""
MAX_DECOMPRESSED_BYTES = 256 * 1024 * 1024
OUTPUTS_COMPRESSION_THRESHOLD = 1024
PLAIN, ZSTD = 0, 1

_U32 = struct.Struct("<I")


class InvalidFrame(CoordinatorError, ValueError):
    """Bytes that are not a well-formed (or well-compressed) Spider wire frame.

    ``reason`` is Spider's own text for the fault (``invalid wire format: …`` of ``wire.rs``,
    ``failed to decompress zstd bytes: …`` of ``compression.rs``), without the explanation this
    message may add."""

    def __init__(self, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = message if reason is None else reason


def encode_frame(payloads: Sequence[bytes]) -> bytes:
    """The wire frame of ``payloads``; raises ``InvalidFrame`` for a payload over 4 GiB."""
    parts = [_U32.pack(len(payloads))]
    for payload in payloads:
        if len(payload) > 0xFFFFFFFF:
            raise InvalidFrame(f"a payload of {len(payload)} bytes does not fit a frame")
        parts += [_U32.pack(len(payload)), payload]
    return b"".join(parts)


def decode_frame(frame: bytes) -> list[bytes]:
    """The payloads of ``frame``, read as Spider reads them; raises ``InvalidFrame``.

    ``spider-utils/src/wire.rs`` ``unframe_payloads`` (lines 274-303): a buffer shorter than the
    4-byte count, or one that ends before a declared payload's length or inside its bytes, is
    refused with Spider's reason; whatever follows the ``count``-th payload is never looked at.
    """
    if len(frame) < _U32.size:
        reason = "invalid wire format: buffer too small for the payload count header"
        raise InvalidFrame(f"{reason} (a frame needs at least 4 bytes, got {len(frame)})", reason)
    (count,) = _U32.unpack_from(frame, 0)
    offset, payloads = _U32.size, []
    for index in range(count):
        if offset + _U32.size > len(frame):
            reason = "invalid wire format: unexpected end of buffer reading payload length"
            raise InvalidFrame(
                f"{reason} (frame truncated before the length of payload {index} of {count})",
                reason,
            )
        (length,) = _U32.unpack_from(frame, offset)
        offset += _U32.size
        if offset + length > len(frame):
            reason = "invalid wire format: unexpected end of buffer reading payload data"
            raise InvalidFrame(
                f"{reason} (frame truncated inside payload {index}: {length} bytes declared, "
                f"{len(frame) - offset} left)",
                reason,
            )
        payloads.append(frame[offset : offset + length])
        offset += length
    # Trailing bytes after the declared payloads are ignored, as unframe_payloads ignores them
    # (it returns after the loop without comparing `pos` with the buffer's length).
    return payloads


def compress(data: bytes) -> bytes:
    """zstd, as Spider's client writes it."""
    return compress_frame(data, ZSTD_LEVEL)


def decompress(data: bytes, what: str) -> bytes:
    """Inverse of ``compress``: every frame, as Spider's ``decode_zstd_bytes`` reads it.

    ``spider-core/src/compression.rs`` line 30 (``zstd::stream::decode_all``); see
    ``decode_zstd_frames``. Raises ``InvalidFrame`` naming ``what`` for bytes Spider refuses or
    output past 256 MiB.
    """
    try:
        return decode_zstd_frames(data, MAX_DECOMPRESSED_BYTES)
    except ZstdFramesError as error:
        raise InvalidFrame(
            f"{what} is not zstd-compressed: {error}",
            f"failed to decompress zstd bytes: {error.reason}",
        ) from error


def encode_job_inputs(payloads: Sequence[bytes]) -> bytes:
    """``compressed_serialized_inputs`` of RegisterJob."""
    return compress(encode_frame(payloads))


def decode_job_inputs(data: bytes) -> list[bytes]:
    """Inverse of ``encode_job_inputs``; raises ``InvalidFrame``."""
    return decode_frame(decompress(data, "the job inputs"))


def encode_job_outputs(payloads: Sequence[bytes]) -> bytes:
    """``serialized_outputs``: option byte, then the frame (zstd when over 1 KiB of payloads)."""
    frame = encode_frame(payloads)
    if sum(len(payload) for payload in payloads) > OUTPUTS_COMPRESSION_THRESHOLD:
        return bytes([ZSTD]) + compress(frame)
    return bytes([PLAIN]) + frame


def decode_job_outputs(data: bytes) -> list[bytes]:
    """Inverse of ``encode_job_outputs``; raises ``InvalidFrame`` for an unknown option byte."""
    if not data:
        raise InvalidFrame("job outputs need an option byte")
    option, body = data[0], data[1:]
    if option == PLAIN:
        return decode_frame(body)
    if option == ZSTD:
        return decode_frame(decompress(body, "the job outputs"))
    raise InvalidFrame(f"unknown job-outputs option byte {option}")
