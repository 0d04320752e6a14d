"""The values CLP's Spider tasks take and return: the task I/O wire format.

Each value is one msgpack payload, byte for byte what CLP's Rust types produce through
``rmp_serde::to_vec`` (``docs/clp.md``, Task inputs and outputs; ``docs/spider.md``; vectors in
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
``ArchiveMetadata``         id (String), begin_timestamp, end_timestamp, size (compressed),
                            uncompressed_size (all i64)
==========================  ==================================================================

A compress task receives ``[option, dataset, source]`` and returns one ``CompressionTaskOutput``.

Decoding accepts exactly what the Rust types accept through ``rmp_serde`` (``coordinator.serde``):
a ``String`` may come as a bin holding UTF-8, a ``NonEmptyString`` only as a str; an ``i64`` size
may be negative and an archive id empty, as Rust declares them; the authentication is one of the
two variants ``clp_config/s3_config.rs`` defines (``default``, ``credentials``), never CLP's
Python-only ``profile`` or ``env_vars``. Encoding refuses a value Rust could not decode.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BeforeValidator, Field, ValidationError

from coordinator.serde import (
    BIN_AS_SEQ,
    I64,
    U8,
    U64,
    Bool,
    NonEmptyText,
    SecretText,
    Text,
    WireFormatError,
    WireStruct,
    internally_tagged_reader,
    pack,
    tagged_array_reader,
    unpack_wire,
)


class AwsCredentials(WireStruct):
    """Static AWS credentials; ``session_token`` is left out of the encoding when unset."""

    SKIPPED_WHEN_NONE: ClassVar[frozenset[str]] = frozenset({"session_token"})

    access_key_id: Text
    secret_access_key: SecretText
    session_token: SecretText | None = None


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
RUST_AUTHENTICATION_VARIANTS: dict[str, type[WireStruct]] = {
    "default": DefaultAuthentication,
    "credentials": CredentialsAuthentication,
}
"""Rust's ``AwsAuthentication`` (``clp_config/s3_config.rs``), in declaration order: a tag may be
the variant's index."""
TASK_AUTHENTICATION_TYPES = frozenset(RUST_AUTHENTICATION_VARIANTS)
"""What CLP's task package (and Rust's ``AwsAuthentication`` at ``e00317e3``) understands."""


AwsAuthentication = Annotated[
    DefaultAuthentication
    | CredentialsAuthentication
    | ProfileAuthentication
    | EnvVarsAuthentication,
    BeforeValidator(tagged_array_reader(_AUTHENTICATION_VARIANTS)),
    Field(discriminator="type"),
]
"""CLP's ``AwsAuthentication`` as its Python model knows it (four variants), internally tagged on
``type``; read leniently (the configuration, the job config)."""

RustAwsAuthentication = Annotated[
    DefaultAuthentication
    | CredentialsAuthentication
    | ProfileAuthentication
    | EnvVarsAuthentication,
    BeforeValidator(internally_tagged_reader("AwsAuthentication", RUST_AUTHENTICATION_VARIANTS)),
    Field(discriminator="type"),
]
"""Rust's ``AwsAuthentication`` as serde reads it: from the wire (an array or a map) only
``default`` and ``credentials``, by name (str or bin) or index. An instance of the Python-only
variants is still held in memory, so that encoding can refuse it with a message."""


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
    aws_authentication: RustAwsAuthentication
    object_keys: Annotated[list[Text], BIN_AS_SEQ]

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

    id: Text
    """Rust's ``String``: ``""`` decodes, as in Rust."""
    begin_timestamp: I64
    end_timestamp: I64
    size: I64
    """Compressed bytes; before ``uncompressed_size`` on the wire. An ``i64``, as Rust's."""
    uncompressed_size: I64


class CompressionTaskOutput(WireStruct):
    """What a compress task returns; the commit task receives one per compress task."""

    dataset: Text | None = None
    archives: Annotated[list[ArchiveMetadata], BIN_AS_SEQ]


class _Dataset(WireStruct):
    """The bare ``Option<String>`` compress-task input, checked as a struct field would be."""

    dataset: Text | None


def encode_dataset(dataset: str | None) -> bytes:
    """The second compress-task input, ``Option<String>``: the name, or nil.

    Raises ``WireFormatError`` for anything Rust could not decode as one (not a string, not UTF-8).
    """
    try:
        checked = _Dataset(dataset=dataset)
    except ValidationError as error:
        raise WireFormatError(_dataset_error(error)) from error
    return pack(checked.dataset)


def decode_dataset(data: bytes) -> str | None:
    """Inverse of ``encode_dataset``: nil, a str, or a bin holding UTF-8 (Rust's ``String``).

    Raises ``WireFormatError`` for anything else.
    """
    value = unpack_wire(data, what="dataset")
    try:
        return _Dataset(dataset=value).dataset
    except ValidationError as error:
        raise WireFormatError(_dataset_error(error)) from error


def _dataset_error(error: ValidationError) -> str:
    reasons = "; ".join(detail["msg"] for detail in error.errors(include_url=False))
    return f"dataset: expected a string or nil: {reasons}"
