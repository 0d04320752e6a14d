"""The values CLP's Spider tasks take and return: the task I/O wire format.

Each value is one msgpack payload, byte for byte what CLP's Rust types produce through
``rmp_serde::to_vec`` (``clp-contract.md`` §8, ``spider-contract.md`` §10; vectors in
``vectors/task_io.json``). Field order is part of the contract:

==========================  ==================================================================
type                        fields, in wire order
==========================  ==================================================================
``ClpSCompressionOption``   target_encoded_size (u64), compression_level (u8), timestamp_key
                            (Option<String>), unstructured (bool)
dataset                     Option<String> (a bare value: ``encode_dataset``/``decode_dataset``)
``S3InputSource``           endpoint_url, region_code (Option<NonEmptyString>), bucket
                            (NonEmptyString), aws_authentication, object_keys (Vec<String>)
``AwsAuthentication``       ``["default"]`` or ``["credentials", [key id, secret(, token)]]``
``CompressionTaskOutput``   dataset (Option<String>), archives (Vec<ArchiveMetadata>)
``ArchiveMetadata``         id, begin_timestamp (i64), end_timestamp (i64), size (compressed),
                            uncompressed_size
==========================  ==================================================================

A compress task receives ``[option, dataset, source]`` and returns one ``CompressionTaskOutput``.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BeforeValidator, Field, SecretStr

from coordinator.serde import (
    I64,
    U8,
    U64,
    Bool,
    NonEmptyText,
    Size,
    Text,
    WireFormatError,
    WireStruct,
    pack,
    tagged_array_reader,
    unpack,
)


class AwsCredentials(WireStruct):
    """Static AWS credentials; ``session_token`` is left out of the encoding when unset."""

    SKIPPED_WHEN_NONE: ClassVar[frozenset[str]] = frozenset({"session_token"})

    access_key_id: Text
    secret_access_key: SecretStr
    session_token: SecretStr | None = None


class DefaultAuthentication(WireStruct):
    """The AWS SDK's default credential chain (on the worker)."""

    type: Literal["default"] = "default"


class CredentialsAuthentication(WireStruct):
    """Static credentials carried in the job (and so in the task inputs)."""

    type: Literal["credentials"] = "credentials"
    credentials: AwsCredentials


class ProfileAuthentication(WireStruct):
    """A named profile of the worker's AWS configuration (CLP's Python model; not on the wire)."""

    type: Literal["profile"] = "profile"
    profile: NonEmptyText


class EnvVarsAuthentication(WireStruct):
    """Credentials from the worker's environment (CLP's Python model; not on the wire)."""

    type: Literal["env_vars"] = "env_vars"


_AUTHENTICATION_VARIANTS: dict[str, type[WireStruct]] = {
    "default": DefaultAuthentication,
    "credentials": CredentialsAuthentication,
    "profile": ProfileAuthentication,
    "env_vars": EnvVarsAuthentication,
}
TASK_AUTHENTICATION_TYPES = frozenset({"default", "credentials"})
"""What CLP's task package (and Rust's ``AwsAuthentication`` at ``e00317e3``) understands."""


AwsAuthentication = Annotated[
    DefaultAuthentication
    | CredentialsAuthentication
    | ProfileAuthentication
    | EnvVarsAuthentication,
    BeforeValidator(tagged_array_reader(_AUTHENTICATION_VARIANTS)),
    Field(discriminator="type"),
]
"""CLP's ``AwsAuthentication``, internally tagged on ``type``."""


class ClpSCompressionOption(WireStruct):
    """How ``clp-s`` compresses: first input of every compress task."""

    target_encoded_size: U64
    compression_level: U8
    timestamp_key: Text | None = None
    unstructured: Bool


class S3InputSource(WireStruct):
    """One partition's objects and how to reach them: third input of a compress task."""

    endpoint_url: NonEmptyText | None = None
    region_code: NonEmptyText | None = None
    bucket: NonEmptyText
    aws_authentication: AwsAuthentication
    object_keys: list[Text]

    def to_wire(self) -> list[Any]:
        """Positional form; fails with ``WireFormatError`` for an authentication tasks lack."""
        if self.aws_authentication.type not in TASK_AUTHENTICATION_TYPES:
            raise WireFormatError(
                f"S3InputSource.aws_authentication: type {self.aws_authentication.type!r} cannot "
                "be sent to CLP's compress task, which understands only 'default' and 'credentials'"
            )
        return super().to_wire()


class ArchiveMetadata(WireStruct):
    """One archive a compress task wrote (from ``clp-s --print-archive-stats``)."""

    id: NonEmptyText
    begin_timestamp: I64
    end_timestamp: I64
    size: Size
    """Compressed bytes; before ``uncompressed_size`` on the wire."""
    uncompressed_size: Size


class CompressionTaskOutput(WireStruct):
    """What a compress task returns; the commit task receives one per compress task."""

    dataset: Text | None = None
    archives: list[ArchiveMetadata]


def encode_dataset(dataset: str | None) -> bytes:
    """The second compress-task input, ``Option<String>``: the name, or nil."""
    return pack(dataset)


def decode_dataset(data: bytes) -> str | None:
    """Inverse of ``encode_dataset``; raises ``WireFormatError`` unless it is a string or nil."""
    value = unpack(data, what="dataset")
    if value is not None and not isinstance(value, str):
        raise WireFormatError(f"dataset: expected a string or nil, got {type(value).__name__}")
    return value
