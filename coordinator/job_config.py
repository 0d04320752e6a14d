"""The job config stored in ``compression_jobs.clp_config``: zstd over named msgpack.

Format (``clp-contract.md`` §3, §4; vector ``vectors/clp_io_config.json``): the ``ClpIoConfig``
struct as a msgpack **map** (field names as keys, ``rmp_serde::to_vec_named``), compressed with
zstd level 3 with the content size in the frame header. Decoding uses a streaming zstd reader, so
frames without a content size (Rust's streaming writers) decode too, and accepts map- or
array-form structs.

Who writes what (§4.3), and what the coordinator does with it (hazard H1):

* log-ingestor: ``type: "s3_object_metadata"`` with every key. The only input the coordinator runs.
* CLP's Python CLI: ``fs`` or ``s3`` **without** ``type`` (pydantic ``exclude_unset``).
* the WebUI: ``type: "fs"`` with nulls.

Ownership is decided leniently first (``peek_input_type``): anything but ``s3_object_metadata``
belongs to the legacy scheduler and is left untouched. Only a job the coordinator claimed is then
decoded strictly (``decode_clp_io_config``), and a failure there fails the job with the message.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from typing import Annotated, Any, Literal

import zstandard
from pydantic import BeforeValidator, Field

from coordinator.serde import (
    U8,
    U64,
    Bool,
    NonEmptyText,
    Text,
    WireFormatError,
    WireStruct,
    decode_as,
    pack,
    tagged_array_reader,
    unpack,
)
from coordinator.task_io import AwsAuthentication

ZSTD_LEVEL = 3
MAX_DECOMPRESSED_BYTES = 64 * 1024 * 1024
"""A job config is a few hundred bytes plus object ids; refuse to inflate a blob past this."""

S3_OBJECT_METADATA = "s3_object_metadata"
"""The only input type the coordinator runs (jobs submitted by log-ingestor)."""


class UndecodableJobConfig(ValueError):
    """A ``clp_config`` blob that is not zstd-compressed msgpack, or not a ``ClpIoConfig``."""


class S3ObjectMetadataInputConfig(WireStruct):
    """log-ingestor's input: objects named by ``ingested_s3_object_metadata`` ids (Rust model)."""

    type: Literal["s3_object_metadata"] = "s3_object_metadata"
    bucket: NonEmptyText
    region_code: NonEmptyText | None = None
    key_prefix: NonEmptyText
    endpoint_url: NonEmptyText | None = None
    aws_authentication: AwsAuthentication
    ingestion_job_id: U64
    s3_object_metadata_ids: list[U64]
    dataset: NonEmptyText | None = None
    timestamp_key: NonEmptyText | None = None
    unstructured: Bool


class S3InputConfig(WireStruct):
    """The CLI's S3 input: a bucket and a prefix, optionally a key list (Python model)."""

    type: Literal["s3"] = "s3"
    bucket: NonEmptyText
    region_code: NonEmptyText | None = None
    key_prefix: Text = ""
    endpoint_url: Text | None = None
    aws_authentication: AwsAuthentication
    keys: list[Text] | None = None
    dataset: Text | None = None
    timestamp_key: Text | None = None
    unstructured: Bool = False


class FsInputConfig(WireStruct):
    """The CLI's and WebUI's local-file input (Python model; Rust has no such variant)."""

    type: Literal["fs"] = "fs"
    paths_to_compress: list[Text]
    path_prefix_to_remove: Text | None = None
    dataset: Text | None = None
    timestamp_key: Text | None = None
    unstructured: Bool = False


_INPUT_VARIANTS: dict[str, type[WireStruct]] = {
    "s3_object_metadata": S3ObjectMetadataInputConfig,
    "s3": S3InputConfig,
    "fs": FsInputConfig,
}
_read_tagged_array = tagged_array_reader(_INPUT_VARIANTS)


def _read_input(value: Any) -> Any:
    # CLP's Python CLI leaves `type` out (it is a default never set explicitly).
    if isinstance(value, Mapping) and "type" not in value:
        inferred = "fs" if "paths_to_compress" in value else "s3"
        return {"type": inferred, **value}
    return _read_tagged_array(value)


InputConfig = Annotated[
    S3ObjectMetadataInputConfig | S3InputConfig | FsInputConfig,
    BeforeValidator(_read_input),
    Field(discriminator="type"),
]


class OutputConfig(WireStruct):
    """Archive sizes and compression level of the job."""

    target_archive_size: U64
    target_dictionaries_size: U64
    target_encoded_file_size: U64
    target_segment_size: U64
    compression_level: U8


class ClpIoConfig(WireStruct):
    """What a compression job compresses, and how."""

    input: InputConfig
    output: OutputConfig


def encode_clp_io_config(config: ClpIoConfig) -> bytes:
    """The blob CLP's writers store: zstd (level 3, content size in the header) of named msgpack."""
    return zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(pack(config.to_named()))


def decode_clp_io_config(blob: bytes) -> ClpIoConfig:
    """The job config in ``blob``.

    Raises ``UndecodableJobConfig`` when the blob is not zstd, inflates past
    ``MAX_DECOMPRESSED_BYTES``, is not msgpack, or is not a valid ``ClpIoConfig`` (the message
    names the field: ``ClpIoConfig.input.s3_object_metadata.bucket: …``).
    """
    try:
        return decode_as(ClpIoConfig, _unpack_blob(blob))
    except WireFormatError as error:
        raise UndecodableJobConfig(str(error)) from error


def peek_input_type(blob: bytes) -> str | None:
    """The job's input type, read leniently to decide who owns the job.

    ``"s3_object_metadata"``, ``"s3"``, ``"fs"``, another string, or ``None`` when the input has no
    ``type`` (a CLI job). Nothing else is validated. Raises ``UndecodableJobConfig`` when the blob
    is not zstd-compressed msgpack of a map with an ``input`` map.
    """
    value = _unpack_blob(blob)
    job_input = value.get("input") if isinstance(value, Mapping) else None
    if not isinstance(job_input, Mapping):
        raise UndecodableJobConfig("the job config has no `input` map")
    input_type = job_input.get("type")
    return input_type if isinstance(input_type, str) else None


def peek_endpoint_url(blob: bytes) -> str | None:
    """The job input's ``endpoint_url``, read as leniently as ``peek_input_type``.

    ``None`` when the input has none (or not a string). Raises ``UndecodableJobConfig`` when the
    blob is not zstd-compressed msgpack of a map with an ``input`` map.
    """
    value = _unpack_blob(blob)
    job_input = value.get("input") if isinstance(value, Mapping) else None
    if not isinstance(job_input, Mapping):
        raise UndecodableJobConfig("the job config has no `input` map")
    endpoint_url = job_input.get("endpoint_url")
    return endpoint_url if isinstance(endpoint_url, str) else None


def _unpack_blob(blob: bytes) -> Any:
    try:
        reader = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(blob))
        raw = reader.read(MAX_DECOMPRESSED_BYTES + 1)
    except zstandard.ZstdError as error:
        raise UndecodableJobConfig(f"the job config is not a zstd frame: {error}") from error
    if len(raw) > MAX_DECOMPRESSED_BYTES:
        raise UndecodableJobConfig(
            f"the job config inflates past {MAX_DECOMPRESSED_BYTES} bytes; refusing to decode it"
        )
    try:
        return unpack(raw, what="ClpIoConfig")
    except WireFormatError as error:
        raise UndecodableJobConfig(str(error)) from error
