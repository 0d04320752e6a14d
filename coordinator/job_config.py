"""The job config stored in ``compression_jobs.clp_config``: zstd over named msgpack.

Format (``docs/clp.md``, The job config; vector ``vectors/clp_io_config.json``): the ``ClpIoConfig``
struct as a msgpack **map** (field names as keys, ``rmp_serde::to_vec_named``), compressed with
zstd level 3 with the content size in the frame header.

Who writes what, and what the coordinator does with it (hazard H1, ``docs/hazards.md``):

* log-ingestor: ``type: "s3_object_metadata"`` with every key. The only input the coordinator runs.
* CLP's Python CLI: ``fs`` or ``s3`` **without** ``type`` (pydantic ``exclude_unset``).
* the WebUI: ``type: "fs"`` with nulls.

Ownership is decided leniently first (``peek_input_type``): anything but ``s3_object_metadata``
belongs to the legacy scheduler and is left untouched. The peek reads the input's type in every
msgpack form: ``ClpIoConfig`` as a map (``{"input": …}``, or integer keys ``{0: …}``) or as an
array (``[input, output]``); the input as a map with a ``type`` key, an array led by its tag, or a
map with integer keys led by the tag at ``0``. A blob it cannot classify is undecodable.

Only a job the coordinator owns is then decoded, by ``decode_clp_io_config``, exactly as CLP's
Rust ``ZstdMsgpack::deserialize::<ClpIoConfig>`` would (clp-rust-utils: ``serde/zstd_msgpack.rs``
lines 50-54, ``job_config/clp_io_config.rs``, ``clp_config/s3_config.rs``; serde 1.0 derive and
rmp_serde 1.3 semantics, checked against those structs built with Debian's serde and rmp-serde):

* zstd: every frame (``zstd::stream::decode_all``, ``coordinator.zstd_frames.decode_zstd_frames``);
  msgpack: one value, trailing bytes ignored (``rmp_serde::from_slice``);
* ``ClpIoConfig`` and ``OutputConfig`` (plain structs, read by rmp_serde): a map or an array of
  exactly their fields; a map key is a field's name (str or bin) or its index (any unsigned
  integer); unknown names and indices are ignored (no ``deny_unknown_fields`` anywhere), a key of
  another type is an error, a field given twice is an error (``duplicate field``);
* ``input`` (``#[serde(tag = "type")]``, each variant ``#[serde(flatten)]``): a **map** whose
  ``type`` key (str or bin, once) names ``s3`` or ``s3_object_metadata`` (or their index, 0 or 1);
  no ``type`` is ``missing field `type```, ``fs`` or anything else an unknown variant. Its other
  keys reach serde as buffered content: a key must be a str, a bin, or an unsigned integer that
  msgpack encodes in 1 or 8 bytes (serde's ``Content::U8``/``U64``; others are errors), and only
  names match fields (flattened structs take no indices). An array is refused (a flattened struct
  has no sequence form). Required fields are checked before the flattened ``S3Config``'s;
* ``aws_authentication``: ``default`` or ``credentials`` only (``profile`` and ``env_vars`` are
  unknown variants at this commit), a map with a ``type`` key or an array led by the tag;
* values: ``NonEmptyString`` a non-empty str (never a bin), ``String`` a str or a UTF-8 bin,
  ``u64``/``u8`` an integer in range (no float, no boolean), ``bool`` a boolean, ``Option`` nil or
  the value (a missing ``Option`` field is ``None``), ``Vec`` an array.

The error text is serde's for the same failure, prefixed with the field's path
(``ClpIoConfig.input.s3_object_metadata.bucket: invalid value: string "", expected a string with a
length of more than 0``); the service prefixes it with ``Failed to deserialize CLP I/O config: ``,
the status message CLP's Rust coordinator writes for a config it cannot decode (``Coordinator::run``
and start-up recovery in CLP's ``components/compression-coordinator``; ``docs/clp.md``, CLP's
Rust coordinator; that crate was not among the sources the rules above were checked against).
Where Rust reports only the first error, so does this.

Nothing a blob holds raises anything but ``UndecodableJobConfig`` from this module: a row's content
must never stop the service.
"""

from __future__ import annotations

import decimal
import math
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import Annotated, Any, Literal, NoReturn

from pydantic import Field, ValidationError, field_validator

from coordinator.errors import CoordinatorError
from coordinator.serde import (
    U8,
    U64,
    Bool,
    NonEmptyText,
    WireFormatError,
    WireMap,
    WireStruct,
    pack,
    unpack,
    unpack_wire,
)
from coordinator.task_io import AwsAuthentication
from coordinator.zstd_frames import (
    ZstdFramesError,
    ZstdOutputTooLarge,
    compress_frame,
    decode_zstd_frames,
)

ZSTD_LEVEL = 3
MAX_DECOMPRESSED_BYTES = 64 * 1024 * 1024
"""A job config is a few hundred bytes plus object ids; refuse to inflate a blob past this."""

S3_OBJECT_METADATA = "s3_object_metadata"
"""The only input type the coordinator runs (jobs submitted by log-ingestor)."""

RUST_AUTHENTICATION_TYPES = ("default", "credentials")
"""``AwsAuthentication``'s variants in ``clp_config/s3_config.rs`` lines 15-25, in order."""


class UndecodableJobConfig(CoordinatorError, ValueError):
    """A ``clp_config`` blob that is not zstd-compressed msgpack, or not a ``ClpIoConfig``."""


def _rust_authentication(value: AwsAuthentication) -> AwsAuthentication:
    if value.type not in RUST_AUTHENTICATION_TYPES:
        raise ValueError(
            f"unknown variant `{value.type}`, expected `default` or `credentials` "
            "(CLP's Rust AwsAuthentication)"
        )
    return value


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

    _check_authentication = field_validator("aws_authentication")(_rust_authentication)


class S3InputConfig(WireStruct):
    """An S3 bucket and prefix, optionally a key list (Rust's ``S3InputConfig``; not run here)."""

    type: Literal["s3"] = "s3"
    bucket: NonEmptyText
    region_code: NonEmptyText | None = None
    key_prefix: NonEmptyText
    endpoint_url: NonEmptyText | None = None
    aws_authentication: AwsAuthentication
    keys: list[NonEmptyText] | None = None
    dataset: NonEmptyText | None = None
    timestamp_key: NonEmptyText | None = None
    unstructured: Bool

    _check_authentication = field_validator("aws_authentication")(_rust_authentication)


_INPUT_VARIANTS: dict[str, type[WireStruct]] = {
    "s3": S3InputConfig,
    "s3_object_metadata": S3ObjectMetadataInputConfig,
}
"""``InputConfig``'s variants in ``clp_io_config.rs`` lines 19-31, in order (CLP's Rust has no
``fs``)."""


InputConfig = Annotated[
    S3ObjectMetadataInputConfig | S3InputConfig,
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
    return compress_frame(pack(config.to_named()), ZSTD_LEVEL)


def decode_clp_io_config(blob: bytes) -> ClpIoConfig:
    """The job config in ``blob``, decoded as CLP's Rust ``ClpIoConfig`` (module docstring).

    Raises ``UndecodableJobConfig``, and nothing else, when Rust could not decode it, or when it
    inflates past ``MAX_DECOMPRESSED_BYTES``. The message names the field and serde's reason.

    A blob of at most ``DECODED_CACHE_BLOB_BYTES`` is decoded once per process while it stays
    among the ``DECODED_CACHE_ENTRIES`` last used (the claim reads a job's dataset and its
    submission the whole config: one decoding serves both); callers share the config, which is
    frozen, and must not change its lists. Failures are not remembered.
    """
    blob = bytes(blob)
    if len(blob) <= DECODED_CACHE_BLOB_BYTES:
        return _decode_remembered(blob)
    return _decode(blob)


DECODED_CACHE_ENTRIES = 1024
"""Decoded configs kept (a tick claims up to ``max_concurrent_jobs``, 1,000 by default, and
submits them in claim order: each submission then finds its claim's decoding)."""
DECODED_CACHE_BLOB_BYTES = 4096
"""Only blobs this small are kept (a one-object job's blob is ~200 bytes): a large job's decoding
is small beside its work, and its object ids would hold memory."""


@lru_cache(maxsize=DECODED_CACHE_ENTRIES)
def _decode_remembered(blob: bytes) -> ClpIoConfig:
    return _decode(blob)


def _decode(blob: bytes) -> ClpIoConfig:
    raw = _inflate(blob)
    try:
        # Maps as ``WireMap`` (repeated and unhashable keys kept, as serde sees them); a str that
        # is not UTF-8 keeps its bytes as lone surrogates, so that it reads as rmp_serde hands it
        # to serde: as bytes. Trailing bytes are ignored, as by ``rmp_serde::from_slice``.
        value = unpack_wire(raw, what="ClpIoConfig")
        fields = _read_clp_io_config(value)
    except (_SerdeError, WireFormatError) as error:
        raise UndecodableJobConfig(str(error)) from error
    except Exception as error:  # never a row's fault to stop the service
        raise UndecodableJobConfig(f"ClpIoConfig: {_describe(error)}") from error
    try:
        return ClpIoConfig.model_validate(fields)
    except ValidationError as error:  # the reader let through what the model refuses: a bug
        raise UndecodableJobConfig(f"ClpIoConfig: {error}") from error


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


def _inflate(blob: bytes) -> bytes:
    """Every zstd frame of ``blob`` (``zstd_msgpack.rs`` line 52: ``zstd::stream::decode_all``)."""
    try:
        return decode_zstd_frames(blob, MAX_DECOMPRESSED_BYTES)
    except ZstdOutputTooLarge as error:
        raise UndecodableJobConfig(
            f"the job config inflates past {MAX_DECOMPRESSED_BYTES} bytes; refusing to decode it"
        ) from error
    except ZstdFramesError as error:
        raise UndecodableJobConfig(f"the job config is not a zstd frame: {error}") from error


def _unpack_blob(blob: bytes) -> Any:
    """The msgpack value of ``blob``, maps as dicts (the lenient peek's reading)."""
    raw = _inflate(blob)
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


# --- ClpIoConfig as serde + rmp_serde read it --------------------------------------------------
#
# rmp_serde reads ``ClpIoConfig`` and ``OutputConfig`` directly ("direct" below). Everything under
# ``input`` is first buffered into serde's private ``Content`` (an internally tagged enum, and the
# flattened structs, need that), then read from the buffer ("content" below). The readings differ
# in which integer keys and tags are identifiers (directly any unsigned integer; from content only
# ``Content::U8``/``U64``, i.e. msgpack's 1- and 8-byte unsigned encodings, which every msgpack
# writer uses for 0-255 and for 2^32 and above: values are read, not encodings, so a writer that
# widens small integers is not modelled), in the error for an array that is too long, and in the
# error for a str, bin, array or map given for an integer (rmp_serde reads that marker itself).


class _SerdeError(ValueError):
    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")


def _fail(path: str, message: str) -> NoReturn:
    raise _SerdeError(path, message)


_MISSING = object()


def _text(value: Any) -> str | None:
    """``value`` as a msgpack str that is valid UTF-8, else ``None``."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return None  # a str that was not UTF-8: rmp_serde gives serde its bytes
        return value
    return None


def _raw_bytes(value: Any) -> bytes | None:
    """``value`` as bytes serde sees as such: a bin, or a msgpack str that is not UTF-8."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str) and _text(value) is None:
        return value.encode("utf-8", "surrogateescape")
    return None


def _is_unsigned(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _content_unsigned(value: int) -> bool:
    """Whether serde buffers this non-negative integer as ``Content::U8``/``U64`` (msgpack's
    1- and 8-byte unsigned encodings), the only integers ``deserialize_identifier`` takes."""
    return value <= 0xFF or value > 0xFFFFFFFF


def _unexpected(value: Any) -> str:
    """serde's ``Unexpected`` for a value, as its ``Display`` writes it."""
    if isinstance(value, bool):
        return f"boolean `{'true' if value else 'false'}`"
    if isinstance(value, int):
        return f"integer `{value}`"
    if isinstance(value, float):
        return f"floating point `{_rust_float(value)}`"
    text = _text(value)
    if text is not None:
        return f"string {_rust_debug(text)}"
    kinds: tuple[tuple[bool, str], ...] = (
        (_raw_bytes(value) is not None, "byte array"),
        (value is None, "unit value"),
        (isinstance(value, WireMap), "map"),
        (isinstance(value, list), "sequence"),
    )
    return next((kind for matches, kind in kinds if matches), f"msgpack {type(value).__name__}")


def _rust_float(value: float) -> str:
    """Rust's ``Display`` of an ``f64`` (never an exponent), with serde's ``.0`` when integral."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    text = format(decimal.Decimal(repr(value)), "f")
    return text if "." in text else f"{text}.0"


def _rust_debug(text: str) -> str:
    """Rust's ``Debug`` of a ``str`` (quoted, escapes for quotes, backslashes and controls)."""
    escapes = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\0": "\\0"}
    out = []
    for char in text:
        if char in escapes:
            out.append(escapes[char])
        elif not char.isprintable() and char != " ":
            out.append(f"\\u{{{ord(char):x}}}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def _length(count: int, noun: str = "element") -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


# Values ---------------------------------------------------------------------------------------

_Reader = Callable[[Any, str], Any]


def _u64(value: Any, path: str) -> int:
    return _unsigned(value, path, "u64", 2**64 - 1, direct=False)


def _u64_direct(value: Any, path: str) -> int:
    return _unsigned(value, path, "u64", 2**64 - 1, direct=True)


def _u8_direct(value: Any, path: str) -> int:
    return _unsigned(value, path, "u8", 0xFF, direct=True)


def _unsigned(value: Any, path: str, rust_type: str, maximum: int, *, direct: bool) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        if 0 <= value <= maximum:
            return value
        _fail(path, f"invalid value: integer `{value}`, expected {rust_type}")
    if direct and (marker := _container_marker(value)) is not None:
        # rmp_serde reads an integer field's marker itself and names a str, bin, array or map
        # found there by its marker.
        _fail(path, f"wrong msgpack marker {marker}")
    _fail(path, f"invalid type: {_unexpected(value)}, expected {rust_type}")


def _container_marker(value: Any) -> str | None:
    """rmp's ``Marker`` (``Debug``) of a str, bin, array or map, as a minimal writer encodes it."""
    text = _text(value)
    if text is not None or isinstance(value, str):
        size = len(text.encode("utf-8") if text is not None else _raw_bytes(value) or b"")
        return f"FixStr({size})" if size < 32 else _sized("Str", size, (8, 16, 32))
    if isinstance(value, bytes):
        return _sized("Bin", len(value), (8, 16, 32))
    if isinstance(value, WireMap | list):
        kind = "Map" if isinstance(value, WireMap) else "Array"
        size = len(value.pairs) if isinstance(value, WireMap) else len(value)
        return f"Fix{kind}({size})" if size < 16 else _sized(kind, size, (16, 32))
    return None


def _sized(kind: str, size: int, widths: tuple[int, ...]) -> str:
    width = next((bits for bits in widths if size < 2**bits), widths[-1])
    return f"{kind}{width}"


def _bool(value: Any, path: str) -> bool:
    if isinstance(value, bool):
        return value
    _fail(path, f"invalid type: {_unexpected(value)}, expected a boolean")


_NON_EMPTY = "a string with a length of more than 0"


def _non_empty_string(value: Any, path: str) -> str:
    """``non_empty_string::NonEmptyString``: its visitor takes a str only (never bytes)."""
    text = _text(value)
    if text is None:
        _fail(path, f"invalid type: {_unexpected(value)}, expected {_NON_EMPTY}")
    if not text:
        _fail(path, f'invalid value: string "", expected {_NON_EMPTY}')
    return text


def _string(value: Any, path: str) -> str:
    """serde's ``String``: a str, or bytes holding UTF-8 (``StringVisitor::visit_bytes``)."""
    text = _text(value)
    if text is not None:
        return text
    raw = _raw_bytes(value)
    if raw is not None:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            _fail(path, "invalid value: byte array, expected a string")
    _fail(path, f"invalid type: {_unexpected(value)}, expected a string")


def _option(read: _Reader) -> _Reader:
    def read_option(value: Any, path: str) -> Any:
        return None if value is None else read(value, path)

    return read_option


def _vec(read: _Reader) -> _Reader:
    def read_vec(value: Any, path: str) -> list[Any]:
        if isinstance(value, list):
            return [read(item, f"{path}.{index}") for index, item in enumerate(value)]
        _fail(path, f"invalid type: {_unexpected(value)}, expected a sequence")

    return read_vec


# Structs and enums ----------------------------------------------------------------------------

_Fields = tuple[tuple[str, _Reader, bool], ...]
"""A struct's fields in declaration order: name, reader, required (not ``Option``, no default)."""


def _key_name(key: Any) -> str | None:
    """The field name a key spells (a str, or bytes holding UTF-8), else ``None``."""
    text = _text(key)
    if text is not None:
        return text
    raw = _raw_bytes(key)
    if raw is not None:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return None
    return None


def _identifier(key: Any, path: str, *, content: bool) -> str | int | None:
    """A map key as serde_derive's field identifier: a name, an index, or an error."""
    name = _key_name(key)
    if name is not None or _raw_bytes(key) is not None:
        return name
    if _is_unsigned(key) and (not content or _content_unsigned(key)):
        return int(key)
    _fail(path, f"invalid type: {_unexpected(key)}, expected field identifier")


def _struct(
    value: Any, path: str, name: str, fields: _Fields, *, content: bool, defaults: int = 0
) -> dict[str, Any]:
    """A derived struct: a map (names or indices) or an array of its fields.

    ``defaults``: how many trailing fields are ``#[serde(default)]`` (an array may leave them out).
    """
    if isinstance(value, WireMap):
        return _struct_from_map(value, path, fields, content=content)
    if isinstance(value, list):
        return _struct_from_array(value, path, name, fields, content=content, defaults=defaults)
    _fail(path, f"invalid type: {_unexpected(value)}, expected struct {name}")


def _struct_from_map(
    value: WireMap, path: str, fields: _Fields, *, content: bool
) -> dict[str, Any]:
    """serde_derive's ``visit_map``: entries in order, then the missing fields in field order."""
    names = [field for field, _, _ in fields]
    readers = {field: read for field, read, _ in fields}
    out: dict[str, Any] = {}
    for key, item in value.pairs:
        found = _identifier(key, path, content=content)
        field = names[found] if isinstance(found, int) and found < len(names) else found
        if not isinstance(field, str) or field not in readers:
            continue  # unknown: ignored (no deny_unknown_fields)
        if field in out:
            _fail(path, f"duplicate field `{field}`")
        out[field] = readers[field](item, f"{path}.{field}")
    for field, _, required in fields:
        if field not in out:
            if required:
                _fail(path, f"missing field `{field}`")
            out[field] = None
    return out


def _struct_from_array(
    value: list[Any], path: str, name: str, fields: _Fields, *, content: bool, defaults: int
) -> dict[str, Any]:
    """serde_derive's ``visit_seq``: one element per field; a shorter array is an error unless
    the fields left out have defaults, a longer one too (rmp_serde's or serde's wording)."""
    out: dict[str, Any] = {}
    for index, (field, read, _) in enumerate(fields):
        if index < len(value):
            out[field] = read(value[index], f"{path}.{field}")
        elif index < len(fields) - defaults:
            _fail(
                path,
                f"invalid length {len(value)}, expected struct {name} with {_length(len(fields))}",
            )
        else:
            out[field] = None
    if len(value) > len(fields):
        if content:  # serde's SeqDeserializer::end
            _fail(path, f"invalid length {len(value)}, expected {_length(len(fields))} in sequence")
        _fail(path, f"array had incorrect length, expected {len(fields)}")  # rmp_serde's check
    return out


def _variant(tag: Any, path: str, enum: str, variants: tuple[str, ...], *, content: bool) -> str:
    """An enum's tag as serde_derive's variant identifier: a name or an index."""
    name = _text(tag)
    raw = _raw_bytes(tag)
    if name is None and raw is not None:
        name = raw.decode("utf-8", "replace")  # serde prints bytes with from_utf8_lossy
    if name is not None:
        if name in variants:
            return name
        expected = " or ".join(f"`{variant}`" for variant in variants)
        _fail(path, f"unknown variant `{name}`, expected {expected}")
    if _is_unsigned(tag) and (not content or _content_unsigned(tag)):
        if tag < len(variants):
            return variants[int(tag)]
        _fail(
            path,
            f"invalid value: integer `{tag}`, expected variant index 0 <= i < {len(variants)}",
        )
    _fail(path, f"invalid type: {_unexpected(tag)}, expected variant identifier")


def _tagged(
    value: Any, path: str, enum: str, variants: tuple[str, ...], *, content: bool
) -> tuple[str, WireMap | list[Any]]:
    """serde's ``TaggedContentVisitor`` (``#[serde(tag = "type")]``): the variant and the rest.

    A map holds the tag under a str or bin ``type`` key, once; an array leads with it.
    """
    if isinstance(value, WireMap):
        tag: Any = _MISSING
        rest: list[tuple[Any, Any]] = []
        for key, item in value.pairs:
            if _text(key) == "type" or _raw_bytes(key) == b"type":
                if tag is not _MISSING:
                    _fail(path, "duplicate field `type`")
                tag = _variant(item, f"{path}.type", enum, variants, content=content)
            else:
                rest.append((key, item))
        if tag is _MISSING:
            _fail(path, "missing field `type`")
        return tag, WireMap(rest)
    if isinstance(value, list):
        if not value:
            _fail(path, "missing field `type`")
        return _variant(value[0], f"{path}.type", enum, variants, content=content), value[1:]
    _fail(path, f"invalid type: {_unexpected(value)}, expected internally tagged enum {enum}")


def _aws_credentials(value: Any, path: str) -> dict[str, Any]:
    """``AwsCredentials`` (``s3_config.rs`` lines 27-34): ``session_token`` is
    ``#[serde(default)]``, so an array may leave it out."""
    fields: _Fields = (
        ("access_key_id", _string, True),
        ("secret_access_key", _string, True),
        ("session_token", _option(_string), False),
    )
    credentials = _struct(value, path, "AwsCredentials", fields, content=True, defaults=1)
    if credentials["session_token"] is None:
        del credentials["session_token"]
    return credentials


def _aws_authentication(value: Any, path: str) -> dict[str, Any]:
    """``AwsAuthentication`` (``s3_config.rs`` lines 15-25), from buffered content."""
    tag, rest = _tagged(value, path, "AwsAuthentication", RUST_AUTHENTICATION_TYPES, content=True)
    if tag == "default":
        # A unit variant (serde's InternallyTaggedUnitVisitor): a map's other keys are ignored;
        # an array must end after the tag.
        if not isinstance(rest, WireMap) and rest:
            _fail(path, f"invalid length {len(rest)}, expected 0 elements in sequence")
        return {"type": "default"}
    variant = "struct variant AwsAuthentication::Credentials"
    if isinstance(rest, WireMap):
        fields = _struct(
            rest, path, variant, (("credentials", _aws_credentials, True),), content=True
        )
        return {"type": "credentials", "credentials": fields["credentials"]}
    if not rest:
        _fail(path, f"invalid length 0, expected {variant} with 1 element")
    credentials = _aws_credentials(rest[0], f"{path}.credentials")
    if len(rest) > 1:
        _fail(path, f"invalid length {len(rest)}, expected 1 element in sequence")
    return {"type": "credentials", "credentials": credentials}


_S3_CONFIG: _Fields = (  # clp_config/s3_config.rs lines 7-13
    ("bucket", _non_empty_string, True),
    ("region_code", _option(_non_empty_string), False),
    ("key_prefix", _non_empty_string, True),
    ("endpoint_url", _option(_non_empty_string), False),
    ("aws_authentication", _aws_authentication, True),
)
_VARIANT_FIELDS: dict[str, tuple[str, _Fields]] = {  # job_config/clp_io_config.rs lines 33-55
    "s3": (
        "S3InputConfig",
        (
            ("keys", _option(_vec(_non_empty_string)), False),
            ("dataset", _option(_non_empty_string), False),
            ("timestamp_key", _option(_non_empty_string), False),
            ("unstructured", _bool, True),
        ),
    ),
    "s3_object_metadata": (
        "S3ObjectMetadataInputConfig",
        (
            ("ingestion_job_id", _u64, True),
            ("s3_object_metadata_ids", _vec(_u64), True),
            ("dataset", _option(_non_empty_string), False),
            ("timestamp_key", _option(_non_empty_string), False),
            ("unstructured", _bool, True),
        ),
    ),
}


def _input(value: Any, path: str) -> dict[str, Any]:
    """``InputConfig`` (``clp_io_config.rs`` lines 16-31): ``#[serde(tag = "type")]``, each
    variant a struct variant whose one field is ``#[serde(flatten)]`` of a struct that itself
    flattens ``S3Config`` first."""
    tag, rest = _tagged(value, path, "InputConfig", tuple(_INPUT_VARIANTS), content=False)
    rust_name, own_fields = _VARIANT_FIELDS[tag]
    if not isinstance(rest, WireMap):
        # A struct with a flattened field is read from a map only.
        _fail(
            path,
            f"invalid type: sequence, expected struct variant InputConfig::{rust_name}",
        )
    path = f"{path}.{tag}"
    # The variant's own map visitor: every key must be an identifier (values are not read yet).
    names = [_identifier(key, path, content=True) for key, _ in rest.pairs]
    # The flattening struct's visitor: its own fields in map order, the rest kept for S3Config.
    readers = {field: read for field, read, _ in own_fields}
    out: dict[str, Any] = {"type": tag}
    kept: list[tuple[str, Any]] = []
    for name, (_, item) in zip(names, rest.pairs, strict=True):
        if not isinstance(name, str):
            continue  # an index names nothing in a flattened struct
        if name in readers:
            if name in out:
                _fail(path, f"duplicate field `{name}`")
            out[name] = readers[name](item, f"{path}.{name}")
        else:
            kept.append((name, item))
    # serde_derive checks the struct's missing fields before reading its flattened one.
    for field, _, required in own_fields:
        if field not in out:
            if required:
                _fail(path, f"missing field `{field}`")
            out[field] = None
    s3_config = _struct(
        WireMap(kept), path, "S3Config", _S3_CONFIG, content=True
    )  # FlatStructAccess hands S3Config only the entries named like its fields
    return {**s3_config, **out}


_OUTPUT_CONFIG: _Fields = (  # job_config/clp_io_config.rs lines 57-65
    ("target_archive_size", _u64_direct, True),
    ("target_dictionaries_size", _u64_direct, True),
    ("target_encoded_file_size", _u64_direct, True),
    ("target_segment_size", _u64_direct, True),
    ("compression_level", _u8_direct, True),
)


def _output(value: Any, path: str) -> dict[str, Any]:
    return _struct(value, path, "OutputConfig", _OUTPUT_CONFIG, content=False)


def _read_clp_io_config(value: Any) -> dict[str, Any]:
    """``ClpIoConfig`` (``clp_io_config.rs`` lines 9-14) as named fields, or ``_SerdeError``."""
    fields: _Fields = (("input", _input, True), ("output", _output, True))
    return _struct(value, "ClpIoConfig", "ClpIoConfig", fields, content=False)


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


def _shorten(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"
