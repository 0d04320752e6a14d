"""Task I/O decoded as CLP's Rust types decode it through ``rmp_serde`` (issue 11).

Every payload is built by hand (``msgpack.packb`` or literal bytes), never by the encoder under
test. Each test names the lines of CLP's Rust source it follows, in
``components/clp-rust-utils/src/`` at ``e00317e3``: ``task_io/compression.rs`` (the task I/O
structs) and ``clp_config/s3_config.rs`` (``AwsAuthentication``, ``AwsCredentials``), and the
serde / rmp_serde / non_empty_string behaviour that applies to the declared type.
"""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from coordinator.serde import WireFormatError
from coordinator.task_io import (
    ArchiveMetadata,
    AwsCredentials,
    ClpSCompressionOption,
    CompressionTaskOutput,
    CredentialsAuthentication,
    DefaultAuthentication,
    S3InputSource,
    decode_dataset,
    encode_dataset,
)


def packb(value: Any) -> bytes:
    """msgpack as rmp_serde writes it: ``str`` as str, ``bytes`` as bin."""
    packed: bytes = msgpack.packb(value, use_bin_type=True)
    return packed


def map_bytes(*pairs: tuple[Any, Any]) -> bytes:
    """A msgpack fixmap of ``pairs`` as given: repeated keys and keys of any type kept."""
    assert len(pairs) < 16
    return bytes([0x80 | len(pairs)]) + b"".join(packb(key) + packb(item) for key, item in pairs)


def source(auth: Any = ("default",), keys: Any = ("a/1.json",), bucket: Any = "logs") -> list[Any]:
    """A positional ``S3InputSource``: endpoint_url, region_code, bucket, auth, object_keys."""
    return [None, None, bucket, list(auth), list(keys)]


CREDENTIALS = CredentialsAuthentication(
    credentials=AwsCredentials(access_key_id="AK", secret_access_key="SK", session_token="T")
)


# --- String (compression.rs:14, :25, :31, :38; s3_config.rs:30-33) ---------------------------


def test_string_fields_accept_a_bin_holding_utf8() -> None:
    """compression.rs:14 ``timestamp_key: Option<String>``, :25 ``object_keys: Vec<String>``, :31
    ``dataset: Option<String>``, :38 ``id: String``; s3_config.rs:30, :31, :33 the credentials.
    serde's ``StringVisitor::visit_bytes`` takes UTF-8 bytes, and rmp_serde hands a bin to it."""
    option = ClpSCompressionOption.from_msgpack(packb([100, 3, b"ts", False]))
    assert option.timestamp_key == "ts"
    creds = ["credentials", [b"AK", b"SK", b"T"]]
    parsed = S3InputSource.from_msgpack(packb(source(creds, [b"a/\xc3\xa9.json", "b.json"])))
    assert parsed.object_keys == ["a/é.json", "b.json"]
    assert parsed.aws_authentication == CREDENTIALS
    output = CompressionTaskOutput.from_msgpack(packb([b"web", [[b"a-1", -5, 5, 40, 100]]]))
    assert output.dataset == "web" and output.archives[0].id == "a-1"
    named = packb(
        {"id": b"a-2", "begin_timestamp": 0, "end_timestamp": 1, "size": 2, "uncompressed_size": 3}
    )
    assert ArchiveMetadata.from_msgpack(named).id == "a-2"
    assert decode_dataset(packb(b"default")) == "default"


@pytest.mark.parametrize(
    ("model", "data", "field"),
    [
        (ClpSCompressionOption, packb([100, 3, b"\xff\xfe", False]), "timestamp_key"),
        (S3InputSource, packb(source(keys=[b"ok", b"\xc3("])), "object_keys.1"),
        (S3InputSource, packb(source(["credentials", [b"\x80", "SK"]])), "access_key_id"),
        (CompressionTaskOutput, packb([b"\xe2\x82", []]), "dataset"),
        (ArchiveMetadata, packb([b"\xff", 0, 1, 2, 3]), "id"),
        # A str whose bytes are not UTF-8: rmp_serde's read_str_data refuses it for a String.
        (ArchiveMetadata, bytes.fromhex("95 a2fffe 00 01 02 03"), "id"),
        (ClpSCompressionOption, bytes.fromhex("94 64 03 a1ff c2"), "timestamp_key"),
    ],
)
def test_string_fields_refuse_what_is_not_utf8(model: type[Any], data: bytes, field: str) -> None:
    """compression.rs:14, :25, :31, :38; s3_config.rs:30: ``String`` holds UTF-8 only
    (``String::from_utf8`` in ``visit_bytes``; rmp_serde's ``Utf8Error`` for a str)."""
    with pytest.raises(WireFormatError, match=f"{model.__name__}.*{field}"):
        model.from_msgpack(data)


def test_the_dataset_input_is_an_option_string() -> None:
    """The compress task's second input is ``Option<String>`` (docs/clp.md, the type of
    compression.rs:31): nil, a str, or a bin holding UTF-8; nothing else."""
    assert decode_dataset(bytes.fromhex("c0")) is None
    assert decode_dataset(packb("web")) == "web"
    assert decode_dataset(packb(b"web")) == "web"
    for data in (packb(b"\xff"), bytes.fromhex("a1ff"), packb(3), packb(["web"])):
        with pytest.raises(WireFormatError, match="dataset"):
            decode_dataset(data)


@pytest.mark.parametrize(
    "data",
    [
        packb(source(bucket=b"logs")),
        packb([b"http://s3", None, "logs", ["default"], []]),
        packb([None, b"us-east-1", "logs", ["default"], []]),
        packb(source(bucket="")),
    ],
)
def test_non_empty_string_fields_take_only_a_non_empty_str(data: bytes) -> None:
    """compression.rs:21-23 ``Option<NonEmptyString>`` / ``NonEmptyString``: non_empty_string's
    visitor has ``visit_str`` only (a bin is an invalid type) and refuses ``""``."""
    with pytest.raises(WireFormatError, match="S3InputSource"):
        S3InputSource.from_msgpack(data)


# --- integers (compression.rs:12, :13, :39-42) -----------------------------------------------


def test_archive_metadata_holds_a_string_id_and_i64_sizes() -> None:
    """compression.rs:38-42: ``id: String`` (``""`` included) and four ``i64``: negative sizes
    and timestamps decode, a value above ``i64::MAX`` does not."""
    low = -(2**63)
    archive = ArchiveMetadata.from_msgpack(packb(["", low, 2**63 - 1, -40, low]))
    assert (archive.id, archive.size, archive.uncompressed_size) == ("", -40, low)
    for position in range(1, 5):
        fields: list[Any] = ["a", 0, 0, 0, 0]
        fields[position] = 2**63  # uint64 cf 80 00 …
        with pytest.raises(WireFormatError, match="ArchiveMetadata"):
            ArchiveMetadata.from_msgpack(packb(fields))


@pytest.mark.parametrize(
    ("hex_bytes", "expected"),
    [
        ("94 d0 05 03 c0 c2", (5, 3)),  # int8 5 for a u64
        ("94 d3 0000000000000007 d1 00ff c0 c2", (7, 255)),  # int64 / int16 that fit
        ("94 cf ffffffffffffffff cd 00ff c0 c2", (2**64 - 1, 255)),  # u64::MAX, u8::MAX as uint16
        ("94 ff 03 c0 c2", None),  # -1 for a u64
        ("94 64 cd 0100 c0 c2", None),  # 256 for a u8
        ("94 ca 40400000 03 c0 c2", None),  # float32 3.0 for a u64
        ("94 64 cb 4008000000000000 c0 c2", None),  # float64 3.0 for a u8
        ("94 c3 03 c0 c2", None),  # true for a u64
        ("94 64 03 c0 01", None),  # 1 for a bool (compression.rs:15)
    ],
)
def test_integers_take_any_msgpack_integer_that_fits(
    hex_bytes: str, expected: tuple[int, int] | None
) -> None:
    """compression.rs:12 ``u64``, :13 ``u8``, :15 ``bool``: serde's primitive visitors take any
    msgpack integer marker whose value fits, and no float or boolean (nor an integer for a bool)."""
    data = bytes.fromhex(hex_bytes)
    if expected is None:
        with pytest.raises(WireFormatError, match="ClpSCompressionOption"):
            ClpSCompressionOption.from_msgpack(data)
    else:
        option = ClpSCompressionOption.from_msgpack(data)
        assert (option.target_encoded_size, option.compression_level) == expected


# --- structs: array or map (every struct of compression.rs and s3_config.rs) -----------------


def test_a_struct_is_an_array_in_field_order_or_a_map_keyed_by_name_bin_name_or_index() -> None:
    """compression.rs:10-16 ``ClpSCompressionOption``: rmp_serde's ``deserialize_struct`` gives
    serde's visitor an array (fields in order) or a map, whose keys serde_derive's field
    identifier reads as a str or a bin name, or an unsigned index."""
    expected = ClpSCompressionOption(
        target_encoded_size=9, compression_level=3, timestamp_key="t", unstructured=True
    )
    forms = [
        packb([9, 3, "t", True]),
        packb(
            {
                "unstructured": True,
                "timestamp_key": "t",
                "compression_level": 3,
                "target_encoded_size": 9,
            }
        ),
        packb(
            {
                b"target_encoded_size": 9,
                b"compression_level": 3,
                b"timestamp_key": "t",
                b"unstructured": True,
            }
        ),
        map_bytes((3, True), (0, 9), (b"compression_level", 3), ("timestamp_key", "t")),
    ]
    for data in forms:
        assert ClpSCompressionOption.from_msgpack(data) == expected
    for short_or_long in ([9, 3, "t"], [9, 3, "t", True, 0]):
        with pytest.raises(WireFormatError, match="invalid length"):
            ClpSCompressionOption.from_msgpack(packb(short_or_long))


def test_unknown_map_keys_are_ignored_whatever_they_hold() -> None:
    """compression.rs:36-43 ``ArchiveMetadata`` (no ``deny_unknown_fields``): serde_derive maps an
    unknown str or bin name, or an index past the last field, to ``__ignore`` and skips its value
    with ``IgnoredAny``, which takes anything, a str that is not UTF-8 included."""
    data = map_bytes(
        ("id", "a"),
        ("begin_timestamp", 1),
        ("end_timestamp", 2),
        (5, "index past the fields"),
        (b"is_split", False),
        ("range_index", [1, {"x": b"\xff"}]),
        ("size", 3),
        ("uncompressed_size", 4),
    )
    assert ArchiveMetadata.from_msgpack(data).size == 3
    # An unknown key whose value is a str that is not UTF-8 (a1 ff), then the fields.
    odd = bytes.fromhex("86 a1 78 a1 ff") + b"".join(
        packb(key) + packb(item)
        for key, item in [
            ("id", "a"),
            ("begin_timestamp", 1),
            ("end_timestamp", 2),
            ("size", 3),
            ("uncompressed_size", 4),
        ]
    )
    assert ArchiveMetadata.from_msgpack(odd).uncompressed_size == 4


@pytest.mark.parametrize("key", [-1, None, True, 1.5, [0], {"a": 1}])
def test_map_keys_of_other_types_are_refused(key: Any) -> None:
    """compression.rs:29-33 ``CompressionTaskOutput``: serde_derive's field identifier visits
    only a str, a bin or an unsigned integer; a negative integer, nil, a boolean, a float, an
    array or a map as a key is an invalid type."""
    data = map_bytes(("archives", []), (key, "x"))
    with pytest.raises(WireFormatError, match="CompressionTaskOutput"):
        CompressionTaskOutput.from_msgpack(data)


@pytest.mark.parametrize(
    "pairs",
    [
        (("bucket", "a"), ("bucket", "b")),
        (("bucket", "a"), (b"bucket", "b")),
        ((2, "a"), ("bucket", "b")),
    ],
)
def test_a_field_given_twice_is_refused(pairs: tuple[tuple[Any, Any], ...]) -> None:
    """compression.rs:19-26 ``S3InputSource``: serde_derive's ``visit_map`` returns
    ``duplicate_field`` when a field comes back, by name, bin name or index alike."""
    rest = (("endpoint_url", None), ("aws_authentication", ["default"]), ("object_keys", []))
    with pytest.raises(WireFormatError, match="duplicate field `bucket`"):
        S3InputSource.from_msgpack(map_bytes(*pairs, *rest))


def test_options_are_nil_or_absent_from_a_map_but_never_from_an_array() -> None:
    """compression.rs:14, :21, :22, :31 ``Option``: nil is ``None`` and a map may leave the field
    out (serde's ``missing_field`` gives ``None``), but an array must hold every field without
    ``#[serde(default)]``; s3_config.rs:32-33 ``session_token`` has it, so its array may stop
    before it."""
    assert ClpSCompressionOption.from_msgpack(packb([1, 2, None, False])).timestamp_key is None
    assert (
        S3InputSource.from_msgpack(
            packb({"bucket": "logs", "aws_authentication": ["default"], "object_keys": []})
        ).endpoint_url
        is None
    )
    assert CompressionTaskOutput.from_msgpack(packb({"archives": []})).dataset is None
    with pytest.raises(WireFormatError, match="invalid length 1"):
        CompressionTaskOutput.from_msgpack(packb([[]]))
    with pytest.raises(WireFormatError, match="invalid length 4"):
        S3InputSource.from_msgpack(packb([None, "logs", ["default"], []]))
    short = S3InputSource.from_msgpack(packb(source(["credentials", ["AK", "SK"]])))
    assert isinstance(short.aws_authentication, CredentialsAuthentication)
    assert short.aws_authentication.credentials.session_token is None


def test_a_vec_is_an_array_or_a_bin_read_as_its_bytes() -> None:
    """compression.rs:25 ``Vec<String>``, :32 ``Vec<ArchiveMetadata>``: rmp_serde's
    ``deserialize_seq`` reads a bin as a sequence of ``u8``: an empty bin is an empty ``Vec``,
    and a byte is no ``String`` nor ``ArchiveMetadata``."""
    assert S3InputSource.from_msgpack(packb(source(keys=b""))).object_keys == []
    assert CompressionTaskOutput.from_msgpack(packb(["web", b""])).archives == []
    with pytest.raises(WireFormatError, match="object_keys"):
        S3InputSource.from_msgpack(packb(source(keys=b"a")))
    with pytest.raises(WireFormatError, match="archives"):
        CompressionTaskOutput.from_msgpack(packb(["web", b"\x01"]))


# --- AwsAuthentication (s3_config.rs:16-25) ----------------------------------------------------

CREDS_MAP = {"access_key_id": "AK", "secret_access_key": "SK", "session_token": "T"}


@pytest.mark.parametrize(
    ("auth", "expected"),
    [
        (["default"], DefaultAuthentication()),
        ({"type": "default"}, DefaultAuthentication()),
        ({"type": "default", "other": [1, 2]}, DefaultAuthentication()),
        ([b"default"], DefaultAuthentication()),
        ([0], DefaultAuthentication()),
        ({b"type": 0}, DefaultAuthentication()),
        (["credentials", ["AK", "SK", "T"]], CREDENTIALS),
        ([1, CREDS_MAP], CREDENTIALS),
        ({"credentials": CREDS_MAP, "type": b"credentials", "x": None}, CREDENTIALS),
        ({"type": "credentials", 0: ["AK", "SK", "T"]}, CREDENTIALS),
    ],
)
def test_authentication_is_read_as_serde_reads_an_internally_tagged_enum(
    auth: Any, expected: Any
) -> None:
    """s3_config.rs:17 ``#[serde(tag = "type")]``, :20-24 ``default`` (unit) and ``credentials``
    (struct): serde's ``TaggedContentVisitor`` takes an array led by the tag or a map with a
    ``type`` key (str or bin); the tag is read by serde_derive's variant identifier (name as str
    or bin, or variant index 0/1); a unit variant ignores a map's other keys."""
    data = packb([None, None, "logs", auth, []])
    assert S3InputSource.from_msgpack(data).aws_authentication == expected


@pytest.mark.parametrize(
    ("auth", "reason"),
    [
        (["profile", "ops"], "unknown variant `profile`"),
        ({"type": "env_vars"}, "unknown variant `env_vars`"),
        ([2], "variant index 0 <= i < 2"),
        (["Default"], "unknown variant `Default`"),
        ([None], "invalid type"),
        (["default", None], "invalid length 2"),
        (["credentials"], "invalid length 1"),
        (["credentials", ["AK", "SK"], 1], "invalid length 3"),
        ([], "missing field `type`"),
        ({"credentials": CREDS_MAP}, "missing field `type`"),
        ({0: "default"}, "missing field `type`"),
        ({"type": "credentials"}, "credentials: Field required"),
        ("default", "invalid type"),
        (b"default", "invalid type"),
    ],
)
def test_authentication_refuses_what_serde_refuses(auth: Any, reason: str) -> None:
    """s3_config.rs:18-25: only ``default`` and ``credentials`` exist (CLP's Python-only
    ``profile`` and ``env_vars`` are unknown variants); serde's unit-variant ``visit_seq`` leaves
    elements that ``SeqDeserializer::end`` refuses; a missing tag, a struct variant without its
    field, or a bare string is an error."""
    with pytest.raises(WireFormatError, match=reason):
        S3InputSource.from_msgpack(packb([None, None, "logs", auth, []]))


def test_authentication_refuses_a_repeated_tag() -> None:
    """s3_config.rs:17: ``TaggedContentVisitor::visit_map`` returns ``duplicate_field("type")``
    when the tag comes twice (as a str, then as a bin)."""
    auth = map_bytes(("type", "default"), (b"type", "default"))
    data = bytes.fromhex("95 c0 c0") + packb("logs") + auth + packb([])
    with pytest.raises(WireFormatError, match="duplicate field `type`"):
        S3InputSource.from_msgpack(data)


# --- encoding ------------------------------------------------------------------------------------


def test_encoding_refuses_values_rust_could_not_decode() -> None:
    """compression.rs:12 ``u64``, :13 ``u8``, :41 ``i64``; s3_config.rs:18-25: a value that
    bypassed validation (``model_copy(update=…)``) is checked again before it is encoded."""
    archive = ArchiveMetadata(
        id="a", begin_timestamp=0, end_timestamp=0, size=0, uncompressed_size=0
    )
    option = ClpSCompressionOption(target_encoded_size=1, compression_level=1, unstructured=False)
    bad = [
        archive.model_copy(update={"size": 2**63}),
        archive.model_copy(update={"id": "\ud800"}),
        option.model_copy(update={"target_encoded_size": -1}),
        option.model_copy(update={"compression_level": 256}),
        CompressionTaskOutput(dataset=None, archives=[archive.model_copy(update={"size": 2**64})]),
    ]
    for value in bad:
        with pytest.raises(WireFormatError):
            value.to_msgpack()
    for dataset in ("\udcff", 5, ["web"]):
        with pytest.raises(WireFormatError, match="dataset"):
            encode_dataset(dataset)  # type: ignore[arg-type]
