"""Task I/O wire format: every vector of task_io.json, both input forms, and rejections."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from coordinator.serde import WireFormatError, WireStruct
from coordinator.task_io import (
    ArchiveMetadata,
    AwsCredentials,
    ClpSCompressionOption,
    CompressionTaskOutput,
    CredentialsAuthentication,
    DefaultAuthentication,
    ProfileAuthentication,
    S3InputSource,
    decode_dataset,
    encode_dataset,
)
from tests.vectors import load_vector

VECTORS = load_vector("task_io.json")["vectors"]
MODELS: dict[str, type[WireStruct]] = {
    "ClpSCompressionOption": ClpSCompressionOption,
    "S3InputSource": S3InputSource,
    "CompressionTaskOutput": CompressionTaskOutput,
}


@pytest.mark.parametrize("name", sorted(VECTORS))
def test_every_vector_encodes_and_decodes_exactly(name: str) -> None:
    vector = VECTORS[name]
    data = bytes.fromhex(vector["hex"])
    assert msgpack.packb(vector["positional_msgpack_value"]) == data
    if vector["rust_type"] == "Option<String>":
        value = vector["field_values"]["value"]
        assert encode_dataset(value) == data
        assert decode_dataset(data) == value
        return
    model = MODELS[vector["rust_type"]]
    value = model.model_validate(vector["field_values"])
    assert value.to_msgpack() == data
    assert value.to_wire() == vector["positional_msgpack_value"]
    assert model.from_msgpack(data) == value


def _source(**changes: Any) -> S3InputSource:
    fields: dict[str, Any] = {
        "endpoint_url": "http://127.0.0.1:9000",
        "region_code": None,
        "bucket": "logs",
        "aws_authentication": DefaultAuthentication(),
        "object_keys": ["a/1.jsonl", "a/2.jsonl.gz"],
    }
    fields.update(changes)
    return S3InputSource.model_validate(fields)


ROUND_TRIPS: list[WireStruct] = [
    ClpSCompressionOption(
        target_encoded_size=2**64 - 1, compression_level=255, timestamp_key="t", unstructured=True
    ),
    _source(),
    _source(
        aws_authentication=CredentialsAuthentication(
            credentials=AwsCredentials(access_key_id="AK", secret_access_key="SK")
        )
    ),
    _source(
        aws_authentication=CredentialsAuthentication(
            credentials=AwsCredentials(
                access_key_id="AK", secret_access_key="SK", session_token="T"
            )
        )
    ),
    CompressionTaskOutput(dataset=None, archives=[]),
    CompressionTaskOutput(
        dataset="web",
        archives=[
            ArchiveMetadata(
                id="0f3c", begin_timestamp=-5, end_timestamp=2**63 - 1, size=0, uncompressed_size=7
            )
        ],
    ),
]


@pytest.mark.parametrize("value", ROUND_TRIPS, ids=lambda v: type(v).__name__)
def test_round_trips_in_array_and_map_form(value: WireStruct) -> None:
    model = type(value)
    assert model.from_msgpack(value.to_msgpack()) == value
    assert model.from_msgpack(msgpack.packb(value.to_named())) == value
    indexed = dict(enumerate(value.to_wire()))
    assert model.from_msgpack(msgpack.packb(indexed, strict_types=False)) == value


def test_credentials_encode_as_a_tagged_array_shortened_without_a_token() -> None:
    short = AwsCredentials(access_key_id="AK", secret_access_key="SK")
    full = AwsCredentials(access_key_id="AK", secret_access_key="SK", session_token="T")
    assert CredentialsAuthentication(credentials=short).to_wire() == ["credentials", ["AK", "SK"]]
    assert CredentialsAuthentication(credentials=full).to_wire() == [
        "credentials",
        ["AK", "SK", "T"],
    ]
    assert "SK" not in repr(short) and "SK" not in str(full)


def test_a_map_may_omit_optional_fields() -> None:
    data = msgpack.packb({"target_encoded_size": 5, "compression_level": 1, "unstructured": False})
    assert ClpSCompressionOption.from_msgpack(data).timestamp_key is None


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([100, 3, None], "invalid length 3, expected struct ClpSCompressionOption with 4"),
        ([100, 3, None, True, 1], "invalid length 5"),
        ([100, 300, None, True], "ClpSCompressionOption.compression_level"),
        ([100, -1, None, True], "ClpSCompressionOption.compression_level"),
        ([1.5, 3, None, True], "ClpSCompressionOption.target_encoded_size"),
        ([-1, 3, None, True], "ClpSCompressionOption.target_encoded_size"),
        ([100, 3, None, 1], "ClpSCompressionOption.unstructured"),
        ({"compression_level": 3, "unstructured": True}, "target_encoded_size: Field required"),
    ],
)
def test_bad_options_are_rejected_naming_the_field(data: Any, message: str) -> None:
    with pytest.raises(WireFormatError, match=message):
        ClpSCompressionOption.from_msgpack(msgpack.packb(data))


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([None, None, "", ["default"], []], "S3InputSource.bucket"),
        ([None, "", "b", ["default"], []], "S3InputSource.region_code"),
        ([None, None, "b", ["nope"], []], "S3InputSource.aws_authentication"),
        ([None, None, "b", ["credentials", ["AK"]], []], "invalid length 1"),
        ([None, None, "b", ["default"], [1]], "S3InputSource.object_keys.0"),
    ],
)
def test_bad_sources_are_rejected_naming_the_field(data: Any, message: str) -> None:
    with pytest.raises(WireFormatError, match=message):
        S3InputSource.from_msgpack(msgpack.packb(data))


def test_garbage_is_a_clear_error() -> None:
    for data in (b"", b"\xc1", b"\x94\x01"):
        with pytest.raises(WireFormatError, match="ClpSCompressionOption"):
            ClpSCompressionOption.from_msgpack(data)
    with pytest.raises(WireFormatError, match="dataset: expected a string"):
        decode_dataset(msgpack.packb(3))


def test_authentication_the_task_cannot_use_is_refused_on_encoding() -> None:
    source = _source(aws_authentication=ProfileAuthentication(profile="ops"))
    with pytest.raises(WireFormatError, match="'profile' cannot be sent"):
        source.to_msgpack()
