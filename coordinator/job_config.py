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

The peek reads the input's type in every form the full decoder accepts: ``ClpIoConfig`` as a map
(``{"input": …}``, or integer keys ``{0: …}``) or as an array (``[input, output]``); the input as a
map with a ``type`` key (serde's internally tagged form, what every CLP writer stores), an array
led by its tag (``[tag, fields…]``, ``rmp_serde::to_vec``), or a map with integer keys led by the
tag at ``0``. A blob it cannot classify is undecodable. Nothing a blob holds raises anything but
``UndecodableJobConfig`` from this module: a row's content must never stop the service.
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
    if isinstance(value, Mapping) and "type" not in value:
        tag = value.get(0)
        if isinstance(tag, str) and tag in _INPUT_VARIANTS:
            # Integer keys (field indices): the tag is field 0 of every variant.
            return _INPUT_VARIANTS[tag].model_validate(value)
        # CLP's Python CLI leaves `type` out (it is a default never set explicitly).
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

    Raises ``UndecodableJobConfig``, and nothing else, when the blob is not zstd, inflates past
    ``MAX_DECOMPRESSED_BYTES``, is not msgpack (an array or map as a map key included), or is not
    a valid ``ClpIoConfig`` (the message names the field:
    ``ClpIoConfig.input.s3_object_metadata.bucket: …``).
    """
    value = _unpack_blob(blob)
    try:
        return decode_as(ClpIoConfig, value)
    except WireFormatError as error:
        raise UndecodableJobConfig(str(error)) from error
    except Exception as error:
        # A validator may fail in a way pydantic does not wrap; it is still this blob's fault.
        raise UndecodableJobConfig(f"ClpIoConfig: {_describe(error)}") from error


def peek_input_type(blob: bytes) -> str | None:
    """The job's input type, read leniently to decide who owns the job.

    ``"s3_object_metadata"``, ``"s3"``, ``"fs"``, another string, or ``None`` when the input is a
    map without ``type`` (a job of CLP's Python CLI). Nothing else is validated. Raises
    ``UndecodableJobConfig`` when the blob is not zstd-compressed msgpack of a ``ClpIoConfig``
    (map or array) whose input is a map or a tagged array, or when the type is not a string.
    """
    job_input = _peek_input(blob)
    if isinstance(job_input, Mapping):
        if "type" in job_input:
            input_type = job_input["type"]
        elif isinstance(job_input.get(0), str):
            input_type = job_input[0]  # integer keys: the tag is field 0
        else:
            return None
    else:
        input_type = job_input[0]
    if not isinstance(input_type, str):
        raise UndecodableJobConfig(
            f"the job config's input type is not a string: {_shorten(input_type)}"
        )
    return input_type


def peek_endpoint_url(blob: bytes) -> str | None:
    """The job input's ``endpoint_url``, read as leniently as ``peek_input_type``.

    ``None`` when the input has none (or not a string). Raises ``UndecodableJobConfig`` when
    ``peek_input_type`` does.
    """
    job_input = _peek_input(blob)
    if isinstance(job_input, Mapping):
        endpoint_url = job_input.get("endpoint_url")
        if endpoint_url is None and isinstance(job_input.get(0), str):
            endpoint_url = _positional(job_input, "endpoint_url")
    else:
        endpoint_url = _positional(job_input, "endpoint_url")
    return endpoint_url if isinstance(endpoint_url, str) else None


def _peek_input(blob: bytes) -> Mapping[Any, Any] | list[Any]:
    """The input of a map- or array-form ``ClpIoConfig``: a map, or an array led by a string tag.

    Raises ``UndecodableJobConfig`` for anything else.
    """
    value = _unpack_blob(blob)
    if isinstance(value, Mapping):
        if "input" not in value and 0 not in value:
            raise UndecodableJobConfig("the job config has no `input` key")
        job_input = value["input"] if "input" in value else value[0]
    elif isinstance(value, list) and len(value) == len(ClpIoConfig.model_fields):
        job_input = value[0]
    else:
        raise UndecodableJobConfig(
            "the job config has no `input` map: it is neither a ClpIoConfig map nor an "
            f"[input, output] array but {_shorten(value)}"
        )
    if isinstance(job_input, Mapping):
        return job_input
    if isinstance(job_input, list) and job_input and isinstance(job_input[0], str):
        return job_input
    raise UndecodableJobConfig(
        "the job config has no `input` map: its input is neither a map nor an array led by its "
        f"type but {_shorten(job_input)}"
    )


def _positional(job_input: Mapping[Any, Any] | list[Any], field: str) -> object:
    """Field ``field`` of a tagged array (or integer-keyed map) input, by its variant's order."""
    variant = _INPUT_VARIANTS.get(job_input[0])
    if variant is None or field not in variant.model_fields:
        return None
    index = list(variant.model_fields).index(field)
    if isinstance(job_input, Mapping):
        return job_input.get(index)
    return job_input[index] if index < len(job_input) else None


def _unpack_blob(blob: bytes) -> Any:
    try:
        reader = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(blob))
        raw = reader.read(MAX_DECOMPRESSED_BYTES + 1)
    except zstandard.ZstdError as error:
        raise UndecodableJobConfig(f"the job config is not a zstd frame: {error}") from error
    except Exception as error:
        raise UndecodableJobConfig(
            f"the job config is not a zstd frame: {_describe(error)}"
        ) from error
    if len(raw) > MAX_DECOMPRESSED_BYTES:
        raise UndecodableJobConfig(
            f"the job config inflates past {MAX_DECOMPRESSED_BYTES} bytes; refusing to decode it"
        )
    try:
        return unpack(raw, what="ClpIoConfig")
    except WireFormatError as error:
        raise UndecodableJobConfig(str(error)) from error
    except TypeError as error:
        # msgpack builds maps as dicts: an array or map used as a key raises TypeError.
        raise UndecodableJobConfig(
            f"ClpIoConfig: a msgpack map has an array or a map as a key ({error})"
        ) from error
    except Exception as error:
        raise UndecodableJobConfig(
            f"ClpIoConfig: not valid msgpack ({_describe(error)})"
        ) from error


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


def _shorten(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"
