"""Rust ``serde`` + ``rmp_serde`` compatible structs, as pydantic models.

CLP's Rust side encodes the same structs two ways (``spider-contract.md`` §10,
``clp-contract.md`` §3 and §8):

* ``rmp_serde::to_vec`` (task inputs and outputs): a struct is a **positional array** of its
  fields in declaration order, ``None`` is nil, an internally tagged enum is ``[tag, fields…]``,
  and a field marked ``skip_serializing_if = "Option::is_none"`` is left out when ``None``, which
  shortens the array (only trailing fields may be so marked);
* ``rmp_serde::to_vec_named`` (the job config blob): a struct is a **map** keyed by field name, an
  internally tagged enum a map with a ``type`` key.

The Rust decoders accept either form for any struct: an array (exactly as long as the struct, less
trailing skippable fields), a map with field-name keys (absent ``Option`` fields are ``None``), or a
map with integer keys (field indices). ``WireStruct`` does the same, so a model declared once reads
and writes both. Integers are strict (no floats, no booleans), as in Rust.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Annotated, Any, ClassVar, Self, TypeVar

import msgpack
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    Strict,
    ValidationError,
    model_validator,
)

U8 = Annotated[int, Strict(), Field(ge=0, le=2**8 - 1)]
U32 = Annotated[int, Strict(), Field(ge=0, le=2**32 - 1)]
U64 = Annotated[int, Strict(), Field(ge=0, le=2**64 - 1)]
I64 = Annotated[int, Strict(), Field(ge=-(2**63), le=2**63 - 1)]
Size = Annotated[int, Strict(), Field(ge=0, le=2**63 - 1)]
"""A size in bytes: Rust declares it ``i64``, but a negative size is an error here."""
Bool = Annotated[bool, Strict()]
Text = Annotated[str, Strict()]
NonEmptyText = Annotated[str, Strict(), Field(min_length=1)]
"""CLP's Rust ``NonEmptyString``: rejects ``""``, does not strip whitespace."""


ModelT = TypeVar("ModelT", bound=BaseModel)


class WireFormatError(ValueError):
    """Bytes or values that are not a valid encoding of the expected struct.

    The message names the struct and the field (``S3InputSource.bucket: …``).
    """


class WireStruct(BaseModel):
    """A struct that encodes like ``rmp_serde`` (positional or named) and decodes either form."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    SKIPPED_WHEN_NONE: ClassVar[frozenset[str]] = frozenset()
    """Trailing fields Rust marks ``skip_serializing_if = "Option::is_none"``."""

    @model_validator(mode="before")
    @classmethod
    def _accept_wire_shapes(cls, value: Any) -> Any:
        if isinstance(value, list | tuple):
            return cls._fields_from_array(value)
        if isinstance(value, Mapping) and any(isinstance(key, int) for key in value):
            names = list(cls.model_fields)
            return {
                names[key] if isinstance(key, int) and 0 <= key < len(names) else key: item
                for key, item in value.items()
            }
        return value

    @classmethod
    def _fields_from_array(cls, items: list[Any] | tuple[Any, ...]) -> dict[str, Any]:
        names = list(cls.model_fields)
        required = len(names)
        while required and names[required - 1] in cls.SKIPPED_WHEN_NONE:
            required -= 1
        if not required <= len(items) <= len(names):
            expected = f"{len(names)}" if required == len(names) else f"{required} to {len(names)}"
            raise ValueError(
                f"invalid length {len(items)}, expected struct {cls.__name__} "
                f"with {expected} elements"
            )
        return dict(zip(names, items, strict=False))

    def to_wire(self) -> list[Any]:
        """The positional form (``rmp_serde::to_vec``) as plain Python values."""
        values = [_plain(getattr(self, name), named=False) for name in type(self).model_fields]
        names = list(type(self).model_fields)
        while values and values[-1] is None and names[len(values) - 1] in self.SKIPPED_WHEN_NONE:
            values.pop()
        return values

    def to_named(self) -> dict[str, Any]:
        """The named form (``rmp_serde::to_vec_named``) as plain Python values, in field order."""
        return {
            name: _plain(getattr(self, name), named=True)
            for name in type(self).model_fields
            if not (name in self.SKIPPED_WHEN_NONE and getattr(self, name) is None)
        }

    def to_msgpack(self) -> bytes:
        """The exact bytes ``rmp_serde::to_vec`` produces for this value."""
        return pack(self.to_wire())

    @classmethod
    def from_msgpack(cls, data: bytes) -> Self:
        """Decode an array- or map-form encoding; raises ``WireFormatError`` naming the field."""
        return decode_as(cls, unpack(data, what=cls.__name__))


def tagged_array_reader(variants: Mapping[str, type[WireStruct]]) -> Callable[[Any], Any]:
    """A before-validator for an internally tagged enum whose variants lead with a ``type`` field.

    ``rmp_serde::to_vec`` writes such an enum as ``[tag, fields…]``: the tag picks the variant,
    whose own field order then applies. Maps (``{"type": tag, …}``) go on to the discriminator.
    """

    def read(value: Any) -> Any:
        if isinstance(value, list | tuple) and value and isinstance(value[0], str):
            variant = variants.get(value[0])
            if variant is not None:
                return variant.model_validate(value)
        return value

    return read


def _plain(value: Any, *, named: bool) -> Any:
    if isinstance(value, WireStruct):
        return value.to_named() if named else value.to_wire()
    if isinstance(value, list | tuple):
        return [_plain(item, named=named) for item in value]
    if isinstance(value, SecretStr):
        return value.get_secret_value()
    return value


def pack(value: Any) -> bytes:
    """``msgpack.packb`` with the options that match ``rmp_serde`` (str as str, bytes as bin)."""
    packed: bytes = msgpack.packb(value, use_bin_type=True)
    return packed


def unpack(data: bytes, *, what: str) -> Any:
    """One msgpack value; raises ``WireFormatError`` for bytes that are not msgpack.

    Trailing bytes after the value are ignored, as ``rmp_serde::from_slice`` does.
    """
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=len(data) or 1)
    unpacker.feed(data)
    try:
        return unpacker.unpack()
    except msgpack.OutOfData as error:
        raise WireFormatError(f"{what}: truncated or empty msgpack ({len(data)} bytes)") from error
    except (msgpack.ExtraData, msgpack.FormatError, msgpack.StackError, ValueError) as error:
        reason = str(error) or type(error).__name__
        raise WireFormatError(f"{what}: not valid msgpack ({reason})") from error


def decode_as(model: type[ModelT], value: Any) -> ModelT:
    """``value`` validated as ``model``; raises ``WireFormatError`` naming each bad field."""
    try:
        return model.model_validate(value)
    except ValidationError as error:
        raise WireFormatError(describe_validation_error(model.__name__, error)) from error


def describe_validation_error(what: str, error: ValidationError) -> str:
    """One line per problem: ``Struct.field.sub: reason``."""
    problems = []
    for detail in error.errors(include_url=False, include_input=False):
        location = ".".join(str(part) for part in (what, *detail["loc"]))
        problems.append(f"{location}: {detail['msg']}")
    return "; ".join(problems)
