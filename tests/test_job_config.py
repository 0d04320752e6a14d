"""The clp_config blob: the log-ingestor vector, each CLP writer's shape, ownership, rejections."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
import zstandard

from coordinator.job_config import (
    ClpIoConfig,
    FsInputConfig,
    S3InputConfig,
    S3ObjectMetadataInputConfig,
    UndecodableJobConfig,
    decode_clp_io_config,
    encode_clp_io_config,
    peek_endpoint_url,
    peek_input_type,
)
from coordinator.task_io import CredentialsAuthentication
from tests.vectors import load_vector

VECTOR = load_vector("clp_io_config.json")
OUTPUT = VECTOR["CLP_IO_CONFIG"]["output"]


def _blob(value: Any, *, content_size: bool = True) -> bytes:
    compressor = zstandard.ZstdCompressor(level=3, write_content_size=content_size)
    if content_size:
        return compressor.compress(msgpack.packb(value))
    stream = compressor.compressobj()
    return stream.compress(msgpack.packb(value)) + stream.flush()


def test_the_log_ingestor_vector_is_byte_exact() -> None:
    named = bytes.fromhex(VECTOR["CLP_IO_CONFIG_NAMED_MSGPACK_HEX"])
    assert len(named) == VECTOR["named_msgpack_length_bytes"]
    config = ClpIoConfig.model_validate(VECTOR["CLP_IO_CONFIG"])
    blob = encode_clp_io_config(config)
    frame = zstandard.ZstdDecompressor().decompress(blob)  # fails unless the size is in the header
    assert frame == named
    assert msgpack.unpackb(named) == VECTOR["CLP_IO_CONFIG"]
    assert decode_clp_io_config(blob) == config
    assert isinstance(config.input, S3ObjectMetadataInputConfig)
    assert config.input.s3_object_metadata_ids == [1, 2, 3]


def test_a_frame_without_a_content_size_decodes() -> None:
    blob = _blob(VECTOR["CLP_IO_CONFIG"], content_size=False)
    with pytest.raises(zstandard.ZstdError):
        zstandard.ZstdDecompressor().decompress(blob)
    assert decode_clp_io_config(blob) == ClpIoConfig.model_validate(VECTOR["CLP_IO_CONFIG"])


def test_array_form_structs_decode() -> None:
    config = ClpIoConfig.model_validate(VECTOR["CLP_IO_CONFIG"])
    assert decode_clp_io_config(_blob(config.to_wire())) == config


def test_credentials_round_trip_and_omit_an_unset_token() -> None:
    value = dict(VECTOR["CLP_IO_CONFIG"])
    credentials = {"access_key_id": "AK", "secret_access_key": "SK"}
    value["input"] = {
        **value["input"],
        "aws_authentication": {"type": "credentials", "credentials": credentials},
    }
    config = decode_clp_io_config(_blob(value))
    assert isinstance(config.input.aws_authentication, CredentialsAuthentication)
    assert (
        msgpack.unpackb(zstandard.ZstdDecompressor().decompress(encode_clp_io_config(config)))
        == value
    )


def test_the_python_cli_shapes_decode_without_type() -> None:
    fs_job = {
        "input": {"paths_to_compress": ["/logs/a.log"], "dataset": "default"},
        "output": OUTPUT,
    }
    s3_job = {
        "input": {
            "bucket": "b",
            "key_prefix": "",
            "aws_authentication": {"type": "default"},
            "keys": ["x"],
        },
        "output": OUTPUT,
    }
    assert peek_input_type(_blob(fs_job)) is None
    assert isinstance(decode_clp_io_config(_blob(fs_job)).input, FsInputConfig)
    assert peek_input_type(_blob(s3_job)) is None
    assert isinstance(decode_clp_io_config(_blob(s3_job)).input, S3InputConfig)


def test_the_webui_shape_decodes() -> None:
    webui_job = {
        "input": {
            "type": "fs",
            "paths_to_compress": ["/x"],
            "path_prefix_to_remove": None,
            "dataset": None,
            "timestamp_key": None,
            "unstructured": False,
        },
        "output": OUTPUT,
    }
    assert peek_input_type(_blob(webui_job)) == "fs"
    assert isinstance(decode_clp_io_config(_blob(webui_job)).input, FsInputConfig)


def test_peek_reads_only_the_type() -> None:
    assert (
        peek_input_type(encode_clp_io_config(ClpIoConfig.model_validate(VECTOR["CLP_IO_CONFIG"])))
        == "s3_object_metadata"
    )
    broken_but_ours = {"input": {"type": "s3_object_metadata"}, "output": {}}
    assert peek_input_type(_blob(broken_but_ours)) == "s3_object_metadata"
    assert peek_input_type(_blob({"input": {"type": "future"}})) == "future"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"bucket": ""}, "input.s3_object_metadata.bucket"),
        ({"key_prefix": ""}, "input.s3_object_metadata.key_prefix"),
        ({"unstructured": None}, "input.s3_object_metadata.unstructured"),
        ({"s3_object_metadata_ids": [-1]}, "s3_object_metadata_ids.0"),
        ({"ingestion_job_id": "7"}, "ingestion_job_id"),
        ({"aws_authentication": {"type": "sso"}}, "aws_authentication"),
    ],
)
def test_invalid_configs_name_the_field(change: dict[str, Any], message: str) -> None:
    value = {**VECTOR["CLP_IO_CONFIG"], "input": {**VECTOR["CLP_IO_CONFIG"]["input"], **change}}
    with pytest.raises(UndecodableJobConfig, match=message):
        decode_clp_io_config(_blob(value))


def test_output_ranges_are_checked() -> None:
    value = {**VECTOR["CLP_IO_CONFIG"], "output": {**OUTPUT, "compression_level": 256}}
    with pytest.raises(UndecodableJobConfig, match="output.compression_level"):
        decode_clp_io_config(_blob(value))


@pytest.mark.parametrize(
    ("blob", "message"),
    [
        (b"", "not a zstd frame|truncated"),
        (b"not zstd at all", "not a zstd frame"),
        (zstandard.ZstdCompressor().compress(b"\xc1"), "not valid msgpack"),
        (zstandard.ZstdCompressor().compress(msgpack.packb([1, 2])), "no `input` map"),
    ],
)
def test_undecodable_blobs_say_why(blob: bytes, message: str) -> None:
    with pytest.raises(UndecodableJobConfig, match=message):
        peek_input_type(blob)
    with pytest.raises(UndecodableJobConfig):
        decode_clp_io_config(blob)


def test_a_decompression_bomb_is_refused() -> None:
    bomb = zstandard.ZstdCompressor().compress(b"\x00" * (65 * 1024 * 1024))
    with pytest.raises(UndecodableJobConfig, match="inflates past"):
        peek_input_type(bomb)


def _array_input(tag: str, *fields: Any) -> list[Any]:
    return [tag, *fields]


_OUTPUT_ARRAY = list(OUTPUT.values())
_LOG_INGESTOR = ClpIoConfig.model_validate(VECTOR["CLP_IO_CONFIG"])


@pytest.mark.parametrize(
    ("value", "input_type"),
    [
        (_LOG_INGESTOR.to_wire(), "s3_object_metadata"),  # rmp_serde::to_vec: [input, output]
        ([VECTOR["CLP_IO_CONFIG"]["input"], OUTPUT], "s3_object_metadata"),
        ({0: _LOG_INGESTOR.input.to_wire(), 1: OUTPUT}, "s3_object_metadata"),
        (
            {"input": dict(enumerate(_LOG_INGESTOR.input.to_wire())), "output": OUTPUT},
            "s3_object_metadata",
        ),
        ([_array_input("fs", ["/a"], None, None, None, False), _OUTPUT_ARRAY], "fs"),
        (
            [_array_input("s3", "b", None, "", None, ["default"], None, None, None, False), OUTPUT],
            "s3",
        ),
        ({"input": dict(enumerate(["fs", ["/a"]])), "output": OUTPUT}, "fs"),
        ([_array_input("future"), OUTPUT], "future"),
    ],
)
def test_peek_reads_the_type_in_every_form_the_decoder_accepts(value: Any, input_type: str) -> None:
    """Before, an ``fs`` job stored as an array was not recognised as ``fs`` (and was claimed)."""
    blob = _blob(value)
    assert peek_input_type(blob) == input_type
    if input_type != "future":
        assert decode_clp_io_config(blob).input.type == input_type


def test_peek_reads_the_endpoint_of_an_array_form_input() -> None:
    fields = {**VECTOR["CLP_IO_CONFIG"]["input"], "endpoint_url": "http://127.0.0.1:9000"}
    config = ClpIoConfig.model_validate({**VECTOR["CLP_IO_CONFIG"], "input": fields})
    assert peek_endpoint_url(_blob(config.to_wire())) == "http://127.0.0.1:9000"
    assert peek_endpoint_url(_blob({0: config.input.to_wire(), 1: OUTPUT})) == (
        "http://127.0.0.1:9000"
    )


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
    """Only ``UndecodableJobConfig`` ever leaves the module (an array key raised TypeError)."""
    blob = _blob(value)
    with pytest.raises(UndecodableJobConfig, match=message):
        peek_input_type(blob)
    with pytest.raises(UndecodableJobConfig):
        decode_clp_io_config(blob)
