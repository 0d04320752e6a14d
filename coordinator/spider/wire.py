"""Spider's binary frames: job inputs (RegisterJob) and job outputs (GetJobOutputs, commit task).

``spider-contract.md`` §11.2–§11.3 and §5. A *wire frame* is::

    u32 little-endian count, then per payload: u32 little-endian length, payload bytes

* ``RegisterJobRequest.compressed_serialized_inputs`` is zstd(wire frame), payloads in job-input
  order (for CLP: ``[option_0, dataset_0, source_0, option_1, …]``);
* ``GetJobOutputs.serialized_outputs`` (and the commit task's graph outputs) is one option byte then
  the frame: ``0`` plain, ``1`` zstd(frame), the latter when the payloads sum to more than 1 KiB.

An empty frame is ``00000000``.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Sequence

import zstandard

ZSTD_LEVEL = 3
"""Spider compresses with level 0, which zstd takes as its default, 3."""
MAX_DECOMPRESSED_BYTES = 256 * 1024 * 1024
OUTPUTS_COMPRESSION_THRESHOLD = 1024
PLAIN, ZSTD = 0, 1

_U32 = struct.Struct("<I")


class InvalidFrame(ValueError):
    """Bytes that are not a well-formed (or well-compressed) Spider wire frame."""


def encode_frame(payloads: Sequence[bytes]) -> bytes:
    """The wire frame of ``payloads``; raises ``InvalidFrame`` for a payload over 4 GiB."""
    parts = [_U32.pack(len(payloads))]
    for payload in payloads:
        if len(payload) > 0xFFFFFFFF:
            raise InvalidFrame(f"a payload of {len(payload)} bytes does not fit a frame")
        parts += [_U32.pack(len(payload)), payload]
    return b"".join(parts)


def decode_frame(frame: bytes) -> list[bytes]:
    """The payloads of ``frame``; raises ``InvalidFrame`` if it is short, truncated or too long."""
    if len(frame) < _U32.size:
        raise InvalidFrame(f"a frame needs at least 4 bytes, got {len(frame)}")
    (count,) = _U32.unpack_from(frame, 0)
    offset, payloads = _U32.size, []
    for index in range(count):
        if offset + _U32.size > len(frame):
            raise InvalidFrame(f"frame truncated before the length of payload {index} of {count}")
        (length,) = _U32.unpack_from(frame, offset)
        offset += _U32.size
        if offset + length > len(frame):
            raise InvalidFrame(f"frame truncated inside payload {index} ({length} bytes)")
        payloads.append(frame[offset : offset + length])
        offset += length
    if offset != len(frame):
        raise InvalidFrame(f"{len(frame) - offset} trailing bytes after {count} payloads")
    return payloads


def compress(data: bytes) -> bytes:
    """zstd, as Spider's client writes it."""
    return zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(data)


def decompress(data: bytes, what: str) -> bytes:
    """Inverse of ``compress``, streaming (frames with or without a content size).

    Raises ``InvalidFrame`` naming ``what`` for non-zstd bytes or output past 256 MiB.
    """
    try:
        raw = (
            zstandard.ZstdDecompressor()
            .stream_reader(io.BytesIO(data))
            .read(MAX_DECOMPRESSED_BYTES + 1)
        )
    except zstandard.ZstdError as error:
        raise InvalidFrame(f"{what} is not zstd-compressed: {error}") from error
    if len(raw) > MAX_DECOMPRESSED_BYTES:
        raise InvalidFrame(f"{what} inflates past {MAX_DECOMPRESSED_BYTES} bytes")
    return raw


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
