"""The clp_config blob: the log-ingestor vector, CLP's Rust decoding rule by rule, ownership.

Every blob is built here with ``msgpack`` and ``zstandard`` directly (or literal bytes), never
with the encoder under test. Each rule test names the upstream source it follows:
``clp-rust-utils/src/serde/zstd_msgpack.rs`` (ZM), ``job_config/clp_io_config.rs`` (IO) and
``clp_config/s3_config.rs`` (S3) in CLP's source, ``components/``. The expected
messages are serde's (and rmp_serde's) own, as CLP's structs built with serde 1.0 and rmp-serde
1.3.1 report them, prefixed with the field's path.
"""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
import zstandard
from sqlalchemy import create_engine

from coordinator.config.clp import CompressionCoordinator
from coordinator.job_config import (
    ClpIoConfig,
    S3InputConfig,
    S3ObjectMetadataInputConfig,
    UndecodableJobConfig,
    decode_clp_io_config,
    encode_clp_io_config,
    peek_endpoint_url,
    peek_input_type,
)
from coordinator.service.prepare import JobRejected, prepare
from coordinator.task_io import CredentialsAuthentication, DefaultAuthentication
from tests.vectors import load_vector

VECTOR = load_vector("clp_io_config.json")
CONFIG = VECTOR["CLP_IO_CONFIG"]
INPUT = CONFIG["input"]
OUTPUT = CONFIG["output"]
NAMED = bytes.fromhex(VECTOR["CLP_IO_CONFIG_NAMED_MSGPACK_HEX"])
INPUT_PATH = "ClpIoConfig.input.s3_object_metadata"


def _zstd(raw: bytes, *, content_size: bool = True) -> bytes:
    compressor = zstandard.ZstdCompressor(level=3, write_content_size=content_size)
    if content_size:
        return compressor.compress(raw)
    stream = compressor.compressobj()
    return stream.compress(raw) + stream.flush()


def _blob(value: Any, *, content_size: bool = True) -> bytes:
    return _zstd(msgpack.packb(value, use_bin_type=True), content_size=content_size)


def _input(**changes: Any) -> dict[str, Any]:
    """The vector's input with ``changes`` (a value of ``...`` removes the key)."""
    fields = {**INPUT, **changes}
    return {key: value for key, value in fields.items() if value is not ...}


def _config(**changes: Any) -> dict[str, Any]:
    return {"input": _input(**changes), "output": OUTPUT}


def _map(*pairs: tuple[Any, Any]) -> bytes:
    """A msgpack map of ``pairs`` as they are: repeated keys, keys of any type (< 16 pairs)."""
    return bytes([0x80 | len(pairs)]) + b"".join(
        msgpack.packb(key, use_bin_type=True) + msgpack.packb(value, use_bin_type=True)
        for key, value in pairs
    )


def _config_with_raw_input(raw_input: bytes) -> bytes:
    return _zstd(b"\x82\xa5input" + raw_input + b"\xa6output" + msgpack.packb(OUTPUT))


def _refused(blob: bytes) -> str:
    with pytest.raises(UndecodableJobConfig) as error:
        decode_clp_io_config(blob)
    return str(error.value)


DECODED = ClpIoConfig.model_validate(CONFIG)


# --- the vector ---------------------------------------------------------------------------------


def test_the_log_ingestor_vector_is_byte_exact() -> None:
    assert len(NAMED) == VECTOR["named_msgpack_length_bytes"]
    blob = encode_clp_io_config(DECODED)
    frame = zstandard.ZstdDecompressor().decompress(blob)  # fails unless the size is in the header
    assert frame == NAMED
    assert msgpack.unpackb(NAMED) == CONFIG
    assert decode_clp_io_config(_zstd(NAMED)) == DECODED
    assert isinstance(DECODED.input, S3ObjectMetadataInputConfig)
    assert DECODED.input.s3_object_metadata_ids == [1, 2, 3]


def test_credentials_round_trip_and_omit_an_unset_token() -> None:
    credentials = {"access_key_id": "AK", "secret_access_key": "SK"}
    value = _config(aws_authentication={"type": "credentials", "credentials": credentials})
    config = decode_clp_io_config(_blob(value))
    assert isinstance(config.input.aws_authentication, CredentialsAuthentication)
    encoded = zstandard.ZstdDecompressor().decompress(encode_clp_io_config(config))
    assert msgpack.unpackb(encoded) == value


# --- zstd: every frame (ZM:52, zstd::stream::decode_all) ----------------------------------------


def test_every_zstd_frame_is_decoded_with_or_without_a_content_size() -> None:
    """ZM:52. The msgpack split over two frames: the first with a content size, the second
    without (a streaming writer's). Before, only the first frame was read."""
    with_size = _zstd(NAMED[:100])
    without_size = _zstd(NAMED[100:], content_size=False)
    assert zstandard.get_frame_parameters(with_size).content_size == 100
    unknown = zstandard.CONTENTSIZE_UNKNOWN
    assert zstandard.get_frame_parameters(without_size).content_size == unknown
    assert decode_clp_io_config(with_size + without_size) == DECODED
    assert decode_clp_io_config(_zstd(NAMED, content_size=False)) == DECODED


def test_a_skippable_frame_gives_nothing() -> None:
    """ZM:52: libzstd's streaming decoder skips a skippable frame (magic 0x184D2A5?)."""
    skippable = bytes.fromhex("502a4d18") + (3).to_bytes(4, "little") + b"abc"
    assert decode_clp_io_config(skippable + _zstd(NAMED) + skippable) == DECODED


@pytest.mark.parametrize(
    ("blob", "reason"),
    [
        (_zstd(NAMED) + b"not a frame", "zstd decompress error: Unknown frame descriptor"),
        (_zstd(NAMED) + b"\x00" * 8, "zstd decompress error: Unknown frame descriptor"),
        (_zstd(NAMED)[:-1], "incomplete frame"),
        (_zstd(NAMED) + _zstd(b"\x90")[:6], "incomplete frame"),
        (b"", "incomplete frame"),
    ],
    ids=["garbage_after_a_frame", "zeros_after_a_frame", "truncated", "second_truncated", "empty"],
)
def test_what_is_not_a_sequence_of_whole_frames_is_refused(blob: bytes, reason: str) -> None:
    """ZM:52: decode_all reads frames until the input ends; bytes that do not start a frame are
    libzstd's error, an input that ends inside a frame (or is empty) the zstd crate's
    ``incomplete frame``. Before, bytes after the first frame were ignored and a truncated or
    empty blob read as truncated msgpack."""
    assert _refused(blob) == f"the job config is not a zstd frame: {reason}"


def test_a_decompression_bomb_is_refused() -> None:
    bomb = _zstd(b"\x00" * (65 * 1024 * 1024))
    with pytest.raises(UndecodableJobConfig, match="inflates past"):
        decode_clp_io_config(bomb)
    with pytest.raises(UndecodableJobConfig, match="inflates past"):
        peek_input_type(bomb)


# --- msgpack (ZM:53, rmp_serde::from_slice) -----------------------------------------------------


def test_bytes_after_the_msgpack_value_are_ignored() -> None:
    """ZM:53: rmp_serde::from_slice reads one value and never looks past it."""
    assert decode_clp_io_config(_zstd(NAMED + b"\xc1\xc1 trailing")) == DECODED


# --- ClpIoConfig and OutputConfig: plain structs (IO:9-14, IO:57-65) ----------------------------


def test_plain_structs_read_a_map_an_array_or_field_indices() -> None:
    """IO:9-14, IO:57-65: serde_derive reads a struct from a map (field names, str or bin, or
    field indices) or from an array in field order; unknown names and indices are ignored."""
    indexed_output = dict(enumerate(OUTPUT.values())) | {7: "ignored"}
    for value in (
        [INPUT, list(OUTPUT.values())],
        {0: INPUT, 1: indexed_output, 300: "ignored"},
        {b"input": INPUT, "output": OUTPUT, "unknown": [1, {"x": None}]},
    ):
        assert decode_clp_io_config(_blob(value)) == DECODED


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ([INPUT], "ClpIoConfig: invalid length 1, expected struct ClpIoConfig with 2 elements"),
        ([INPUT, OUTPUT, 1], "ClpIoConfig: array had incorrect length, expected 2"),
        (
            {"input": INPUT, "output": [*OUTPUT.values(), 1]},
            "ClpIoConfig.output: array had incorrect length, expected 5",
        ),
        ({"input": INPUT}, "ClpIoConfig: missing field `output`"),
        ({"output": OUTPUT}, "ClpIoConfig: missing field `input`"),
        (42, "ClpIoConfig: invalid type: integer `42`, expected struct ClpIoConfig"),
        (
            {"input": INPUT, "output": OUTPUT, -1: 0},
            "ClpIoConfig: invalid type: integer `-1`, expected field identifier",
        ),
        (
            {"input": INPUT, "output": OUTPUT, None: 0},
            "ClpIoConfig: invalid type: unit value, expected field identifier",
        ),
        (
            {(1,): 2, "input": INPUT, "output": OUTPUT},
            "ClpIoConfig: invalid type: sequence, expected field identifier",
        ),
    ],
    ids=[
        "short_array",
        "long_array",
        "long_output_array",
        "no_output",
        "no_input",
        "not_a_struct",
        "negative_key",
        "nil_key",
        "array_key",
    ],
)
def test_plain_structs_refuse_what_serde_refuses(value: Any, message: str) -> None:
    """IO:9-14, IO:57-65 (serde_derive + rmp_serde): the wrong length, a missing field, a key
    that is no identifier. Before, an array or map key stopped only the peek, a long array had
    another message."""
    assert _refused(_blob(value)) == message


def test_a_field_given_twice_is_refused() -> None:
    """serde_derive (every struct of IO and S3): ``duplicate field``. Before, msgpack's dict kept
    the last one and the job ran."""
    output = msgpack.packb(OUTPUT)
    assert _refused(
        _zstd(b"\x83\xa5input" + msgpack.packb(INPUT) + b"\xa6output" + output + b"\xa5input\xc0")
    ) == ("ClpIoConfig: duplicate field `input`")
    pairs = list(INPUT.items())
    assert _refused(_config_with_raw_input(_map(*pairs, ("bucket", "other")))) == (
        f"{INPUT_PATH}: duplicate field `bucket`"
    )
    assert _refused(_config_with_raw_input(_map(*pairs, (b"type", "s3")))) == (
        "ClpIoConfig.input: duplicate field `type`"
    )


# --- input: internally tagged, flattened (IO:16-55) ---------------------------------------------


def test_the_type_tag_is_required() -> None:
    """IO:18 ``#[serde(tag = "type")]``: no ``type`` is ``missing field `type```. Before, an input
    without it (CLP's Python CLI writes them so) decoded as ``s3`` or ``fs``."""
    cli_s3_job = {"input": {"bucket": "b", "key_prefix": "p/", "keys": ["x"]}, "output": OUTPUT}
    assert _refused(_blob(cli_s3_job)) == "ClpIoConfig.input: missing field `type`"
    assert _refused(_blob(_config(type=...))) == "ClpIoConfig.input: missing field `type`"


@pytest.mark.parametrize("tag", ["fs", "future", "S3", ""])
def test_only_clps_rust_input_variants_exist(tag: str) -> None:
    """IO:19-31: ``s3`` and ``s3_object_metadata`` only. Before, ``fs`` decoded (Python's model)."""
    webui_fs_job = {
        "input": {"type": tag, "paths_to_compress": ["/x"], "dataset": None, "unstructured": False},
        "output": OUTPUT,
    }
    assert _refused(_blob(webui_fs_job)) == (
        f"ClpIoConfig.input.type: unknown variant `{tag}`, expected `s3` or `s3_object_metadata`"
    )


def test_the_tag_is_a_name_in_str_or_bin_or_a_variant_index() -> None:
    """IO:18-31: serde_derive's variant identifier takes a str, a bin, or the index (1 is
    ``s3_object_metadata``); the tag key may be a bin too. Before, a bin tag was refused."""
    assert decode_clp_io_config(_blob(_config(type=b"s3_object_metadata"))) == DECODED
    assert decode_clp_io_config(_blob(_config(type=1))) == DECODED
    by_bin_key = {b"type" if key == "type" else key: value for key, value in INPUT.items()}
    assert decode_clp_io_config(_blob({"input": by_bin_key, "output": OUTPUT})) == DECODED
    assert _refused(_blob(_config(type=2))) == (
        "ClpIoConfig.input.type: invalid value: integer `2`, expected variant index 0 <= i < 2"
    )
    assert _refused(_blob(_config(type=None))) == (
        "ClpIoConfig.input.type: invalid type: unit value, expected variant identifier"
    )


def test_a_flattened_input_is_read_from_a_map_only() -> None:
    """IO:22, IO:28 ``#[serde(flatten)]``: a struct with a flattened field has no sequence form,
    and its keys are names only (no field indices). Before, ``rmp_serde::to_vec``'s array and an
    integer-keyed map decoded and the job ran."""
    as_array = ["s3_object_metadata", *list(INPUT.values())[1:]]
    assert _refused(_blob({"input": as_array, "output": OUTPUT})) == (
        "ClpIoConfig.input: invalid type: sequence, expected struct variant "
        "InputConfig::S3ObjectMetadataInputConfig"
    )
    as_indices = {"input": dict(enumerate(INPUT.values())), "output": OUTPUT}
    assert _refused(_blob(as_indices)) == "ClpIoConfig.input: missing field `type`"
    with_type = {"type": "s3_object_metadata", **dict(enumerate(list(INPUT.values())[1:], 1))}
    assert _refused(_blob({"input": with_type, "output": OUTPUT})) == (
        f"{INPUT_PATH}: missing field `ingestion_job_id`"
    )


@pytest.mark.parametrize(
    ("key", "message"),
    [
        (5, None),
        (2**40, None),
        (b"\xff", None),
        (300, "invalid type: integer `300`, expected field identifier"),
        (-1, "invalid type: integer `-1`, expected field identifier"),
        (True, "invalid type: boolean `true`, expected field identifier"),
        (None, "invalid type: unit value, expected field identifier"),
        ((1,), "invalid type: sequence, expected field identifier"),
    ],
)
def test_input_keys_are_read_from_serdes_buffer(key: Any, message: str | None) -> None:
    """IO:22-28: the flattened input is buffered as serde's ``Content`` first, whose
    ``deserialize_identifier`` takes a str, a bin, or an unsigned integer stored as ``U8`` or
    ``U64`` (msgpack's 1- and 8-byte encodings); an unknown key is ignored, any other is an error.
    Before, 300 was ignored and an array key read as another error."""
    blob = _config_with_raw_input(_map(*INPUT.items(), (key, 1)))
    if message is None:
        assert decode_clp_io_config(blob) == DECODED
    else:
        assert _refused(blob) == f"{INPUT_PATH}: {message}"


def test_the_flattening_structs_fields_are_checked_before_s3_config() -> None:
    """IO:45-55: serde_derive reads the struct's own fields in map order, checks its missing
    ones, and only then reads the flattened ``S3Config`` (IO:47-48, S3:7-13)."""
    assert _refused(_blob(_config(unstructured=..., bucket=""))) == (
        f"{INPUT_PATH}: missing field `unstructured`"
    )
    assert _refused(_blob(_config(bucket="", ingestion_job_id="7"))) == (
        f'{INPUT_PATH}.ingestion_job_id: invalid type: string "7", expected u64'
    )


def test_the_s3_variant_has_rusts_fields() -> None:
    """IO:33-43: ``key_prefix`` non-empty and ``unstructured`` required, ``keys`` non-empty
    strings. Before, Python's model defaulted them and accepted ``""``."""
    s3 = {
        "type": "s3",
        "bucket": "b",
        "key_prefix": "logs/",
        "aws_authentication": {"type": "default"},
        "keys": ["logs/a.json"],
        "unstructured": True,
    }
    config = decode_clp_io_config(_blob({"input": s3, "output": OUTPUT}))
    assert isinstance(config.input, S3InputConfig)
    assert (config.input.keys, config.input.dataset) == (["logs/a.json"], None)
    path = "ClpIoConfig.input.s3"
    for changes, message in (
        ({"unstructured": ...}, f"{path}: missing field `unstructured`"),
        ({"key_prefix": ...}, f"{path}: missing field `key_prefix`"),
        (
            {"key_prefix": ""},
            f'{path}.key_prefix: invalid value: string "", expected a string with a length of '
            "more than 0",
        ),
        (
            {"keys": ["a", ""]},
            f'{path}.keys.1: invalid value: string "", expected a string with a length of more '
            "than 0",
        ),
    ):
        value = {key: item for key, item in {**s3, **changes}.items() if item is not ...}
        assert _refused(_blob({"input": value, "output": OUTPUT})) == message


# --- S3Config and AwsAuthentication (S3:7-34) ---------------------------------------------------


@pytest.mark.parametrize("kind", ["profile", "env_vars", "sso"])
def test_only_default_and_credentials_authenticate(kind: str) -> None:
    """S3:18-25: ``AwsAuthentication`` has ``default`` and ``credentials`` only. Before,
    ``profile`` and ``env_vars`` decoded (the Python model's) and the job failed later, building
    its task graph, with another message."""
    value = _config(aws_authentication={"type": kind, "profile": "ops"})
    message = (
        f"{INPUT_PATH}.aws_authentication.type: unknown variant `{kind}`, expected `default` or "
        "`credentials`"
    )
    assert _refused(_blob(value)) == message
    with pytest.raises(JobRejected) as rejected:
        prepare(create_engine("sqlite://"), _blob(value), CompressionCoordinator())
    assert str(rejected.value) == f"Failed to deserialize CLP I/O config: {message}"


@pytest.mark.parametrize(
    "authentication",
    [
        ["default"],
        {"type": "default", "profile": "ignored"},
        {"type": 0},
        ["credentials", ["AK", "SK"]],
        {"type": "credentials", "credentials": ["AK", "SK", None]},
        {"type": "credentials", 0: {"access_key_id": b"AK", "secret_access_key": "SK"}},
        {"type": "credentials", "credentials": {"access_key_id": "AK", "secret_access_key": "SK"}},
    ],
)
def test_authentication_reads_serdes_forms(authentication: Any) -> None:
    """S3:16-34: an internally tagged enum is a map with ``type`` or an array led by the tag; a
    unit variant ignores a map's other keys; ``credentials`` is a struct variant (name or index
    0); ``AwsCredentials`` a map or an array of 2 or 3 (``session_token`` is
    ``#[serde(default)]``); ``String`` takes a bin holding UTF-8."""
    config = decode_clp_io_config(_blob(_config(aws_authentication=authentication)))
    auth = config.input.aws_authentication
    if isinstance(auth, CredentialsAuthentication):
        assert auth.credentials.access_key_id == "AK"
        assert auth.credentials.secret_access_key.get_secret_value() == "SK"
        assert auth.credentials.session_token is None
    else:
        assert isinstance(auth, DefaultAuthentication)


@pytest.mark.parametrize(
    ("authentication", "message"),
    [
        (["default", "x"], "invalid length 1, expected 0 elements in sequence"),
        ({"type": "credentials"}, "missing field `credentials`"),
        (
            ["credentials"],
            "invalid length 0, expected struct variant AwsAuthentication::Credentials with 1 "
            "element",
        ),
        (["credentials", ["AK", "SK"], 1], "invalid length 2, expected 1 element in sequence"),
        (
            ["credentials", ["AK"]],
            "invalid length 1, expected struct AwsCredentials with 3 elements",
        ),
        (
            ["credentials", ["AK", "SK", "T", "X"]],
            "invalid length 4, expected 3 elements in sequence",
        ),
        ({"profile": "ops"}, "missing field `type`"),
        ("default", 'invalid type: string "default", expected internally tagged enum '),
    ],
)
def test_authentication_refuses_what_serde_refuses(authentication: Any, message: str) -> None:
    """S3:16-34, read from serde's buffer (the input is flattened)."""
    error = _refused(_blob(_config(aws_authentication=authentication)))
    assert error.startswith(f"{INPUT_PATH}.aws_authentication")
    assert message in error


def test_credentials_strings_are_rusts_strings() -> None:
    """S3:29-33: ``String`` may be empty and may come as a bin holding UTF-8, not other bytes."""
    empty = {"type": "credentials", "credentials": {"access_key_id": "", "secret_access_key": ""}}
    assert decode_clp_io_config(_blob(_config(aws_authentication=empty)))
    not_utf8 = {
        "type": "credentials",
        "credentials": {"access_key_id": b"\xff", "secret_access_key": "SK"},
    }
    assert _refused(_blob(_config(aws_authentication=not_utf8))) == (
        f"{INPUT_PATH}.aws_authentication.credentials.access_key_id: invalid value: byte array, "
        "expected a string"
    )


# --- values: Option, NonEmptyString, integers, bool, Vec ----------------------------------------


def test_option_fields_may_be_missing_or_nil() -> None:
    """S3:9, S3:11, IO:52-53: an ``Option`` field missing from the map or nil is ``None``."""
    config = decode_clp_io_config(
        _blob(_config(region_code=..., endpoint_url=None, dataset=..., timestamp_key=None))
    )
    assert config.input.region_code is None
    assert config.input.dataset is None
    assert config.input.timestamp_key is None


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"bucket": ...}, ": missing field `bucket`"),
        ({"aws_authentication": ...}, ": missing field `aws_authentication`"),
        ({"s3_object_metadata_ids": ...}, ": missing field `s3_object_metadata_ids`"),
        ({"unstructured": None}, ".unstructured: invalid type: unit value, expected a boolean"),
        ({"unstructured": 0}, ".unstructured: invalid type: integer `0`, expected a boolean"),
        (
            {"bucket": ""},
            '.bucket: invalid value: string "", expected a string with a length of more than 0',
        ),
        (
            {"bucket": b"yscope"},
            ".bucket: invalid type: byte array, expected a string with a length of more than 0",
        ),
        (
            {"dataset": ""},
            '.dataset: invalid value: string "", expected a string with a length of more than 0',
        ),
        (
            {"endpoint_url": ""},
            '.endpoint_url: invalid value: string "", expected a string with a length of more '
            "than 0",
        ),
        (
            {"s3_object_metadata_ids": [1, -1]},
            ".s3_object_metadata_ids.1: invalid value: integer `-1`, expected u64",
        ),
        (
            {"s3_object_metadata_ids": [2.0**64]},
            ".s3_object_metadata_ids.0: invalid type: floating point `18446744073709552000.0`, "
            "expected u64",
        ),
        (
            {"ingestion_job_id": True},
            ".ingestion_job_id: invalid type: boolean `true`, expected u64",
        ),
        (
            {"s3_object_metadata_ids": b"\x01"},
            ".s3_object_metadata_ids: invalid type: byte array, expected a sequence",
        ),
    ],
)
def test_values_follow_their_rust_types(changes: dict[str, Any], message: str) -> None:
    """S3:7-13, IO:45-55: required fields, ``bool``, ``NonEmptyString`` (a str only: its visitor
    has no ``visit_bytes``), ``u64`` (no sign, no float, no boolean), ``Vec``."""
    assert _refused(_blob(_config(**changes))) == INPUT_PATH + message


def test_integer_widths_and_signedness() -> None:
    """IO:50-51, IO:60-64: ``u64`` up to 2^64-1, ``u8`` up to 255; rmp_serde reads an integer
    field's marker itself, so a str there is ``wrong msgpack marker``."""
    top = 2**64 - 1
    config = decode_clp_io_config(
        _blob(
            {
                "input": _input(ingestion_job_id=top, s3_object_metadata_ids=[top]),
                "output": {**OUTPUT, "target_archive_size": top, "compression_level": 255},
            }
        )
    )
    assert (config.input.ingestion_job_id, config.output.compression_level) == (top, 255)
    for field, bad, message in (
        ("compression_level", 256, "invalid value: integer `256`, expected u8"),
        ("target_segment_size", -1, "invalid value: integer `-1`, expected u64"),
        ("target_archive_size", 1.0, "invalid type: floating point `1.0`, expected u64"),
        ("target_archive_size", "1", "wrong msgpack marker FixStr(1)"),
    ):
        value = {"input": INPUT, "output": {**OUTPUT, field: bad}}
        assert _refused(_blob(value)) == f"ClpIoConfig.output.{field}: {message}"


def test_unknown_fields_are_ignored_everywhere() -> None:
    """No ``deny_unknown_fields`` in IO or S3: unknown keys are ignored at every level, whatever
    they hold (a str that is not UTF-8 included)."""
    credentials = {"access_key_id": "AK", "secret_access_key": "SK", "region": 1}
    value = {
        "input": _input(
            aws_authentication={"type": "credentials", "credentials": credentials, "x": [1]},
            paths_to_compress=["/x"],
            extra={"nested": [None, 1.5]},
        ),
        "output": {**OUTPUT, "retention_period": None},
        "version": 2,
    }
    config = decode_clp_io_config(_blob(value))
    assert isinstance(config.input.aws_authentication, CredentialsAuthentication)
    not_utf8 = b"\xa5extra\xa2\xff\xfe"  # "extra": a str of two bytes that are not UTF-8
    raw_input = _map(*INPUT.items())
    raw_input = bytes([raw_input[0] + 1]) + raw_input[1:] + not_utf8
    assert decode_clp_io_config(_config_with_raw_input(raw_input)) == DECODED


def test_the_failed_status_message_is_produced_at_decode_time() -> None:
    """The shape CLP's Rust coordinator writes (``docs/clp.md``): ``Failed to
    deserialize CLP I/O config: {e}``, from ``prepare`` before anything else is looked at."""
    blob = _blob(_config(key_prefix=""))
    with pytest.raises(JobRejected) as rejected:
        prepare(create_engine("sqlite://"), blob, CompressionCoordinator())
    assert str(rejected.value) == (
        f'Failed to deserialize CLP I/O config: {INPUT_PATH}.key_prefix: invalid value: string "", '
        "expected a string with a length of more than 0"
    )


# --- ownership: the lenient peek ----------------------------------------------------------------


def test_peek_reads_only_the_type() -> None:
    assert peek_input_type(_zstd(NAMED)) == "s3_object_metadata"
    broken_but_ours = {"input": {"type": "s3_object_metadata"}, "output": {}}
    assert peek_input_type(_blob(broken_but_ours)) == "s3_object_metadata"
    assert peek_input_type(_blob({"input": {"type": "future"}})) == "future"
    cli_job = {"input": {"paths_to_compress": ["/logs/a.log"]}, "output": OUTPUT}
    assert peek_input_type(_blob(cli_job)) is None
    webui_job = {"input": {"type": "fs", "paths_to_compress": ["/x"]}, "output": OUTPUT}
    assert peek_input_type(_blob(webui_job)) == "fs"


def test_peek_reads_every_zstd_frame() -> None:
    """ZM:52 for ownership too: a config split over frames is still classified."""
    assert peek_input_type(_zstd(NAMED[:50]) + _zstd(NAMED[50:], content_size=False)) == (
        "s3_object_metadata"
    )


_OUTPUT_ARRAY = list(OUTPUT.values())
_INPUT_ARRAY = ["s3_object_metadata", *list(INPUT.values())[1:]]


@pytest.mark.parametrize(
    ("value", "input_type"),
    [
        ([_INPUT_ARRAY, _OUTPUT_ARRAY], "s3_object_metadata"),  # rmp_serde::to_vec
        ([INPUT, OUTPUT], "s3_object_metadata"),
        ({0: _INPUT_ARRAY, 1: OUTPUT}, "s3_object_metadata"),
        ({"input": dict(enumerate(_INPUT_ARRAY)), "output": OUTPUT}, "s3_object_metadata"),
        ([["fs", ["/a"], None, None, None, False], _OUTPUT_ARRAY], "fs"),
        ([["s3", "b", None, "p", None, ["default"], None, None, None, False], OUTPUT], "s3"),
        ({"input": dict(enumerate(["fs", ["/a"]])), "output": OUTPUT}, "fs"),
        ([["future"], OUTPUT], "future"),
    ],
)
def test_peek_reads_the_type_in_every_msgpack_form(value: Any, input_type: str) -> None:
    """Ownership is decided in every form, even those Rust's decoder then refuses (an array or
    integer-keyed input): those jobs are the coordinator's, and end Failed."""
    blob = _blob(value)
    assert peek_input_type(blob) == input_type
    if isinstance(value, list) and isinstance(value[0], dict):
        assert decode_clp_io_config(blob) == DECODED
    else:
        with pytest.raises(UndecodableJobConfig):
            decode_clp_io_config(blob)


def test_peek_reads_the_endpoint_of_an_array_form_input() -> None:
    fields = _input(endpoint_url="http://127.0.0.1:9000")
    array = ["s3_object_metadata", *list(fields.values())[1:]]
    assert peek_endpoint_url(_blob([array, OUTPUT])) == "http://127.0.0.1:9000"
    assert peek_endpoint_url(_blob({0: dict(enumerate(array)), 1: OUTPUT})) == (
        "http://127.0.0.1:9000"
    )


@pytest.mark.parametrize(
    ("blob", "message"),
    [
        (b"not zstd at all", "not a zstd frame"),
        (_zstd(b"\xc1"), "not valid msgpack"),
        (_blob([1, 2]), "no `input` map"),
    ],
)
def test_undecodable_blobs_say_why(blob: bytes, message: str) -> None:
    with pytest.raises(UndecodableJobConfig, match=message):
        peek_input_type(blob)
    with pytest.raises(UndecodableJobConfig):
        decode_clp_io_config(blob)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({(1,): 2}, "a msgpack map has an array or a map as a key"),
        ({"input": {(1,): 2, "type": "s3_object_metadata"}}, "an array or a map as a key"),
        ({"output": OUTPUT}, "no `input` key"),
        ([1, 2, 3], "neither a ClpIoConfig map nor an \\[input, output\\] array"),
        ([[], OUTPUT], "neither a map nor an array led by its type"),
        ([[7, "x"], OUTPUT], "neither a map nor an array led by its type"),
        ({"input": "s3_object_metadata"}, "neither a map nor an array led by its type"),
        ({"input": {"type": 5}}, "input type is not a string: 5"),
        ({"input": {"type": None}}, "input type is not a string: None"),
    ],
)
def test_what_peek_cannot_classify_is_undecodable(value: Any, message: str) -> None:
    """Only ``UndecodableJobConfig`` ever leaves the module."""
    blob = _blob(value)
    with pytest.raises(UndecodableJobConfig, match=message):
        peek_input_type(blob)
    with pytest.raises(UndecodableJobConfig):
        decode_clp_io_config(blob)
