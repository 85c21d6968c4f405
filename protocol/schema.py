"""Codecs derived from attrs classes: the field list *is* the wire layout.

A message's bytes are its attrs fields in definition order, each encoded by the codec its type
annotation selects. Deriving the codec from the class, instead of writing an encoder and a decoder
per message, means a field cannot be added to a class without also being on the wire, and a message
cannot be encoded in one order and decoded in another.

Type annotation -> wire type:

* ``Annotated[int, codec]`` (``Int8`` .. ``Int64`` from :mod:`protocol.codec`) -> that codec;
* ``bool``, ``str``, ``bytes``, ``ErrorCode`` (int16), ``Record`` -> their primitive codec;
* ``str | None``, ``bytes | None`` -> the nullable form (length -1);
* ``tuple[X, ...]`` -> array of X; ``tuple[X, ...] | None`` -> nullable array (count -1);
* another attrs class -> its fields, inline, recursively.

A bare ``int`` has no width, so it is refused unless the class is one of the shared value types of
:mod:`protocol.types` (which may not import wire details); their widths are listed in
:data:`FOREIGN_INT_WIDTHS`.
"""

from __future__ import annotations

import types
import typing
from typing import Annotated, Any, TypeVar, Union

import attrs

from .codec import (
    BOOL,
    BYTES,
    ERROR_CODE,
    INT32,
    INT64,
    NULLABLE_BYTES,
    NULLABLE_STRING,
    STRING,
    Codec,
    Reader,
    array,
)
from .errors import ErrorCode, LocalProtocolError
from .records import RECORD, Record
from .types import BrokerInfo, PartitionOffset, Subscription, TopicPartition, TopicStreams

T = TypeVar("T")

FOREIGN_INT_WIDTHS: dict[type, dict[str, Codec[int]]] = {
    TopicPartition: {"partition": INT32},
    PartitionOffset: {"partition": INT32, "offset": INT64},
    BrokerInfo: {"broker_id": INT32, "port": INT32},
    TopicStreams: {"streams": INT32},
    Subscription: {"pattern_streams": INT32},
}

_LEAVES: dict[Any, Codec[Any]] = {
    bool: BOOL,
    str: STRING,
    bytes: BYTES,
    ErrorCode: ERROR_CODE,
    Record: RECORD,
}
_NULLABLE_LEAVES: dict[Any, Codec[Any]] = {str: NULLABLE_STRING, bytes: NULLABLE_BYTES}

_struct_cache: dict[type, Codec[Any]] = {}


def struct_codec(cls: type[T]) -> Codec[T]:
    """The codec of an attrs class: its fields in order, no framing of its own."""
    cached = _struct_cache.get(cls)
    if cached is not None:
        return cached
    hints = typing.get_type_hints(cls, include_extras=True)
    fields = [
        (field.name, _codec_for(hints[field.name], cls, field.name))
        for field in attrs.fields(cls)
    ]
    encoders = tuple((name, codec.encode) for name, codec in fields)
    decoders = tuple((name, codec.decode) for name, codec in fields)

    def encode(w: bytearray, value: Any) -> None:
        if not isinstance(value, cls):
            raise LocalProtocolError(
                f"expected {cls.__name__}, got {value!r}", ErrorCode.INVALID_REQUEST
            )
        for name, field_encode in encoders:
            field_encode(w, getattr(value, name))

    def decode(r: Reader) -> T:
        return cls(**{name: field_decode(r) for name, field_decode in decoders})

    codec: Codec[T] = Codec(
        cls.__name__, encode, decode, sum(codec.min_size for _, codec in fields)
    )
    _struct_cache[cls] = codec
    return codec


def _codec_for(tp: Any, owner: type, name: str) -> Codec[Any]:
    where = f"{owner.__name__}.{name}"
    origin = typing.get_origin(tp)
    if origin is Annotated:
        for meta in tp.__metadata__:
            if isinstance(meta, Codec):
                return meta
        raise TypeError(f"{where}: Annotated without a Codec")
    if tp is int:
        width = FOREIGN_INT_WIDTHS.get(owner, {}).get(name)
        if width is None:
            raise TypeError(f"{where}: a bare int has no wire width; use Int32/Int64")
        return width
    leaf = _LEAVES.get(tp)
    if leaf is not None:
        return leaf
    if origin is Union or origin is types.UnionType:
        args = [arg for arg in typing.get_args(tp) if arg is not type(None)]
        if len(args) != 1 or len(typing.get_args(tp)) != 2:
            raise TypeError(f"{where}: only `X | None` unions are supported, not {tp}")
        (inner,) = args
        nullable_leaf = _NULLABLE_LEAVES.get(inner)
        if nullable_leaf is not None:
            return nullable_leaf
        if typing.get_origin(inner) is tuple:
            return array(_item_codec(inner, owner, name), nullable=True)
        raise TypeError(f"{where}: {inner} cannot be null on the wire")
    if origin is tuple:
        return array(_item_codec(tp, owner, name))
    if attrs.has(tp):
        return struct_codec(tp)
    raise TypeError(f"{where}: no wire encoding for {tp}")


def _item_codec(tp: Any, owner: type, name: str) -> Codec[Any]:
    args = typing.get_args(tp)
    if len(args) != 2 or args[1] is not Ellipsis:
        raise TypeError(f"{owner.__name__}.{name}: arrays are tuple[X, ...], not {tp}")
    return _codec_for(args[0], owner, name)
