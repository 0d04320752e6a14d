"""Rust ``serde`` + ``rmp_serde`` compatible structs, as pydantic models.

CLP's Rust side encodes the same structs two ways (``docs/spider.md``, Positional msgpack;
``docs/clp.md``, The job config and Task inputs and outputs):

* ``rmp_serde::to_vec`` (task inputs and outputs): a struct is a **positional array** of its
  fields in declaration order, ``None`` is nil, an internally tagged enum is ``[tag, fields…]``,
  and a field marked ``skip_serializing_if = "Option::is_none"`` is left out when ``None``, which
  shortens the array (only trailing fields may be so marked);
* ``rmp_serde::to_vec_named`` (the job config blob): a struct is a **map** keyed by field name, an
  internally tagged enum a map with a ``type`` key.

Decoding follows what ``rmp_serde::from_slice`` with serde's derived ``Deserialize`` accepts
(``from_msgpack``, over ``unpack_wire``, which keeps every map's pairs and tells str from bin):

* a struct is an array in field order (exactly as long as the struct, less trailing
  ``#[serde(default)]`` fields) or a map; a map key names a field when it is a str or a bin equal
  to the field's name, or an unsigned integer (the field's index); any other str, bin or index is
  an unknown field and is ignored, a key of any other type is an error, and a field given twice is
  an error (``duplicate field``); an ``Option`` field missing from a map is ``None``;
* ``String`` (``Text``) takes a str or a bin holding UTF-8; ``NonEmptyString`` (``NonEmptyText``)
  only a non-empty str (its visitor has no ``visit_bytes``); invalid UTF-8 is refused either way;
* integers take any msgpack integer that fits the Rust type, never a float or a boolean;
* ``Option`` is nil or the value; a ``Vec`` is an array, or a bin read as its bytes (``u8`` each);
* an internally tagged enum (``internally_tagged_reader``) is an array led by its tag or a map
  with a ``type`` key (str or bin) given once; the tag is the variant's name (str or bin) or its
  index; a unit variant's array has nothing after the tag, while a map's other keys are ignored.

Encoding re-checks every value against its type first, so bytes Rust could not decode (a value
out of its Rust range, a string that is not UTF-8, …) are never produced: ``WireFormatError``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any, ClassVar, Self, TypeVar

import msgpack
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    Strict,
    ValidationError,
    model_validator,
)

from coordinator.errors import CoordinatorError


class WireMap:
    """A msgpack map as ``unpack_wire`` decodes it: every ``(key, value)`` pair, in order.

    Unlike a dict it keeps duplicate keys and keys of any type (an array included), so the struct
    and enum readers can apply serde's rules to them. It is neither a mapping nor iterable: a map
    where a string, a number or a sequence is expected is refused, as Rust refuses it.
    """

    __slots__ = ("pairs",)

    def __init__(self, pairs: Sequence[tuple[Any, Any]]) -> None:
        self.pairs: list[tuple[Any, Any]] = list(pairs)

    def __repr__(self) -> str:
        return f"WireMap({self.pairs!r})"


def _unexpected(value: Any) -> str:
    """What a value is, in serde's words (``invalid type: <this>, expected …``)."""
    if isinstance(value, bool):
        return f"boolean `{str(value).lower()}`"
    if isinstance(value, int | float):
        return f"{'integer' if isinstance(value, int) else 'floating point'} `{value}`"
    if isinstance(value, str):
        return f"string {value!r}"
    kinds: tuple[tuple[tuple[type, ...], str], ...] = (
        ((bytes, bytearray), "byte array"),
        ((type(None),), "unit value (nil)"),
        ((list, tuple), "sequence"),
        ((WireMap, Mapping), "map"),
    )
    for kinds_of, kind in kinds:
        if isinstance(value, kinds_of):
            return kind
    return f"msgpack {type(value).__name__}"


def _require_utf8(value: str) -> str:
    """``value``, unless it holds a lone surrogate: a msgpack str that was not UTF-8."""
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as error:
            raise ValueError(
                f"invalid value: string that is not valid UTF-8 (at character {error.start}), "
                "expected a string"
            ) from None
    return value


def _rust_string(value: Any) -> Any:
    """serde's ``String``: a str, or a bin holding UTF-8 (``StringVisitor::visit_bytes``)."""
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError as error:
            raise ValueError(
                f"invalid value: byte array that is not UTF-8 (at byte {error.start}), "
                "expected a string"
            ) from None
    if isinstance(value, str):
        return _require_utf8(value)
    return value


def _rust_non_empty_string(value: Any) -> Any:
    """``non_empty_string::NonEmptyString``: its visitor reads a str only, never a bin."""
    if isinstance(value, bytes | bytearray):
        raise ValueError(
            "invalid type: byte array, expected a string with a length of more than 0 "
            "(NonEmptyString reads a msgpack str, not a bin)"
        )
    if isinstance(value, str):
        return _require_utf8(value)
    return value


def _bin_as_seq(value: Any) -> Any:
    """rmp_serde reads a bin where a sequence is expected as its bytes, one ``u8`` each."""
    if isinstance(value, bytes):
        return list(value)
    return value


U8 = Annotated[int, Strict(), Field(ge=0, le=2**8 - 1)]
U32 = Annotated[int, Strict(), Field(ge=0, le=2**32 - 1)]
U64 = Annotated[int, Strict(), Field(ge=0, le=2**64 - 1)]
I64 = Annotated[int, Strict(), Field(ge=-(2**63), le=2**63 - 1)]
Size = Annotated[int, Strict(), Field(ge=0, le=2**63 - 1)]
"""A non-negative ``i64`` (no Rust type of the wire uses it any more; kept for callers)."""
Bool = Annotated[bool, Strict()]
Text = Annotated[str, Strict(), BeforeValidator(_rust_string)]
"""Rust's ``String``: a str or a bin holding UTF-8; ``""`` is a value."""
NonEmptyText = Annotated[
    str, Strict(), Field(min_length=1), BeforeValidator(_rust_non_empty_string)
]
"""CLP's Rust ``NonEmptyString``: a str only (a bin is refused), rejects ``""``, does not strip."""
SecretText = Annotated[SecretStr, BeforeValidator(_rust_string)]
"""A ``String`` kept out of reprs and logs (credentials)."""
BIN_AS_SEQ = BeforeValidator(_bin_as_seq)
"""Annotate a ``list`` field with it for a Rust ``Vec``: a bin is read as its bytes."""


ModelT = TypeVar("ModelT", bound=BaseModel)


class WireFormatError(CoordinatorError, ValueError):
    """Bytes or values that are not a valid encoding of the expected struct.

    The message names the struct and the field (``S3InputSource.bucket: …``).
    """


def _field_of_key(key: Any, names: Sequence[str], expected: str) -> str | None:
    """The field a map key names, ``None`` for an unknown field (ignored), else ``ValueError``.

    serde_derive's field identifier: a str or a bin equal to a field name, or an unsigned integer
    (the field's index); any other str, bin or index is unknown; any other type is an error.
    """
    if isinstance(key, str):
        return key if key in names else None
    if isinstance(key, bytes):
        text = key.decode("utf-8", errors="replace")
        return text if text in names else None
    if isinstance(key, int) and not isinstance(key, bool) and key >= 0:
        return names[key] if key < len(names) else None
    raise ValueError(f"invalid type: {_unexpected(key)} as a map key, expected {expected}")


def _fields_from_pairs(
    pairs: Sequence[tuple[Any, Any]], names: Sequence[str], what: str
) -> dict[str, Any]:
    """A struct's fields from its map form: keys resolved as serde does, a repeat refused."""
    fields: dict[str, Any] = {}
    for key, item in pairs:
        name = _field_of_key(key, names, f"a field identifier of {what}")
        if name is None:
            continue
        if name in fields:
            raise ValueError(f"duplicate field `{name}` in {what}")
        fields[name] = item
    return fields


def _pairs(value: WireMap | Mapping[Any, Any]) -> list[tuple[Any, Any]]:
    return value.pairs if isinstance(value, WireMap) else list(value.items())


class WireStruct(BaseModel):
    """A struct that encodes like ``rmp_serde`` (positional or named) and decodes either form."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    SKIPPED_WHEN_NONE: ClassVar[frozenset[str]] = frozenset()
    """Trailing fields Rust marks ``#[serde(default, skip_serializing_if = "Option::is_none")]``."""

    @model_validator(mode="before")
    @classmethod
    def _accept_wire_shapes(cls, value: Any) -> Any:
        if isinstance(value, list | tuple):
            return cls._fields_from_array(value)
        if isinstance(value, WireMap | Mapping):
            return _fields_from_pairs(
                _pairs(value), list(cls.model_fields), f"struct {cls.__name__}"
            )
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

    def _check_encodable(self) -> None:
        """Every field once more against its type: a value that bypassed validation
        (``model_copy(update=…)``, ``model_construct``) must not reach the wire."""
        try:
            type(self).model_validate(dict(self))
        except ValidationError as error:
            raise WireFormatError(describe_validation_error(type(self).__name__, error)) from error

    def to_wire(self) -> list[Any]:
        """The positional form (``rmp_serde::to_vec``) as plain Python values."""
        self._check_encodable()
        values = [_plain(getattr(self, name), named=False) for name in type(self).model_fields]
        names = list(type(self).model_fields)
        while values and values[-1] is None and names[len(values) - 1] in self.SKIPPED_WHEN_NONE:
            values.pop()
        return values

    def to_named(self) -> dict[str, Any]:
        """The named form (``rmp_serde::to_vec_named``) as plain Python values, in field order."""
        self._check_encodable()
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
        """Decode an array- or map-form encoding as ``rmp_serde::from_slice`` would.

        Raises ``WireFormatError`` naming the field.
        """
        return decode_as(cls, unpack_wire(data, what=cls.__name__))


def internally_tagged_reader(
    enum: str, variants: Mapping[str, type[WireStruct]], tag: str = "type"
) -> Callable[[Any], Any]:
    """A before-validator for a ``#[serde(tag = "type")]`` enum, read as serde reads it.

    Each variant model leads with its ``tag`` field. An instance of a model passes as it is; an
    array is ``[tag, fields…]`` (a unit variant takes nothing after its tag), a map (``WireMap``
    or dict) holds the tag under a str or bin ``tag`` key, exactly once, and the variant's fields
    under their keys (other keys ignored). The tag is a variant's name (str or bin) or its index
    in ``variants``. Anything else is refused with serde's reason. Returns the variant's fields
    with the canonical tag, for a discriminated union to validate.
    """
    names = list(variants)
    expected = " or ".join(f"`{name}`" for name in names)
    tag_bytes = tag.encode()

    def variant_of(value: Any) -> str:
        if isinstance(value, str | bytes):
            text = value if isinstance(value, str) else value.decode("utf-8", errors="replace")
            if text in variants:
                return text
            raise ValueError(f"unknown variant `{text}` of {enum}, expected {expected}")
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            if value < len(names):
                return names[value]
            raise ValueError(
                f"invalid value: integer `{value}`, expected variant index 0 <= i < {len(names)}"
            )
        raise ValueError(f"invalid type: {_unexpected(value)}, expected a variant of {enum}")

    def read(value: Any) -> Any:
        if isinstance(value, BaseModel):
            return value
        if isinstance(value, list | tuple):
            if not value:
                raise ValueError(f"missing field `{tag}` of {enum}")
            name = variant_of(value[0])
            return variants[name]._fields_from_array([name, *value[1:]])
        if isinstance(value, WireMap | Mapping):
            found: list[Any] = []
            rest: list[tuple[Any, Any]] = []
            for key, item in _pairs(value):
                if key in (tag, tag_bytes):
                    if found:
                        raise ValueError(f"duplicate field `{tag}` of {enum}")
                    found.append(item)
                else:
                    rest.append((key, item))
            if not found:
                raise ValueError(f"missing field `{tag}` of {enum}")
            name = variant_of(found[0])
            model = variants[name]
            fields = [field for field in model.model_fields if field != tag]
            if not fields:
                return {tag: name}  # a unit variant ignores every other key
            what = f"struct variant {enum}::{model.__name__}"
            return {tag: name, **_fields_from_pairs(rest, fields, what)}
        raise ValueError(
            f"invalid type: {_unexpected(value)}, expected internally tagged enum {enum}"
        )

    return read


def tagged_array_reader(variants: Mapping[str, type[WireStruct]]) -> Callable[[Any], Any]:
    """A before-validator for an internally tagged enum whose variants lead with a ``type`` field.

    ``rmp_serde::to_vec`` writes such an enum as ``[tag, fields…]``: the tag picks the variant,
    whose own field order then applies. Maps (``{"type": tag, …}``) go on to the discriminator.
    (Lenient: ``internally_tagged_reader`` applies serde's rules.)
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
    """One msgpack value, maps as dicts; raises ``WireFormatError`` for bytes that are not msgpack.

    Trailing bytes after the value are ignored, as ``rmp_serde::from_slice`` does. A dict keeps
    the last of repeated keys; ``unpack_wire`` keeps them all, as serde's rules need.
    """
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=len(data) or 1)
    return _unpack_one(unpacker, data, what)


def unpack_wire(data: bytes, *, what: str) -> Any:
    """One msgpack value for serde's rules: maps as ``WireMap``, bin as ``bytes``, str as ``str``.

    A str that is not UTF-8 decodes with lone surrogates (``surrogateescape``), which every
    string type refuses, while an ignored field may hold it, as in Rust. Raises
    ``WireFormatError`` for bytes that are not msgpack; trailing bytes are ignored.
    """
    unpacker = msgpack.Unpacker(
        raw=False,
        strict_map_key=False,
        object_pairs_hook=WireMap,
        unicode_errors="surrogateescape",
        max_buffer_size=len(data) or 1,
    )
    return _unpack_one(unpacker, data, what)


def _unpack_one(unpacker: msgpack.Unpacker, data: bytes, what: str) -> Any:
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
