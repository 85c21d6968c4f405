"""Codecs derived from attrs classes: the field list *is* the wire layout.

A message's bytes are its attrs fields in definition order, each encoded by the codec its type
annotation selects. Deriving the codec from the class, instead of writing an encoder and a decoder
per message, means a field cannot be added to a class without also being on the wire, and a message
cannot be encoded in one order and decoded in another.

Type annotation -> wire type:

* ``Annotated[int, codec]`` (``Int8`` .. ``Int64`` from :mod:`protocol.codec`) -> that codec;
* ``bool``, ``str``, ``bytes``, ``ErrorCode`` (int16), ``Record``, ``uuid.UUID`` (16 bytes) -> their
  primitive codec;
* ``str | None``, ``bytes | None`` -> the nullable form (length -1);
* ``tuple[X, ...]`` -> array of X; ``tuple[X, ...] | None`` -> nullable array (count -1);
* another attrs class -> its fields, inline, recursively.

Versions: a message field added in version N carries ``attrs.field(metadata=since(N))`` and a
default; :func:`struct_codec` with ``version`` keeps only the fields that version has, so each
version of a message is another field list of the same class. An older version decodes into the
same class with the newer fields at their defaults, and encodes without them. Only a message's own
fields are versioned: a nested structure has one layout (changing it means a new structure in a
new field).

A bare ``int`` has no width, so it is refused unless the class is one of the shared value types of
:mod:`protocol.types` (which may not import wire details); their widths are listed in
:data:`FOREIGN_INT_WIDTHS`.
"""

from __future__ import annotations

import linecache
import struct
import types
import typing
import uuid
from typing import Annotated, Any, NoReturn, TypeVar, Union

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
    UUID,
    Codec,
    Decoder,
    Encoder,
    Reader,
    array,
    malformed,
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
    uuid.UUID: UUID,
}
_NULLABLE_LEAVES: dict[Any, Codec[Any]] = {str: NULLABLE_STRING, bytes: NULLABLE_BYTES}

SINCE = "protocol.since"
"""Field metadata key: the first version of its message that has the field (absent: 0)."""

_struct_cache: dict[tuple[type, int | None], Codec[Any]] = {}


def since(version: int) -> dict[str, int]:
    """Metadata for a field that version ``version`` of its message added."""
    return {SINCE: version}


def struct_codec(cls: type[T], version: int | None = None) -> Codec[T]:
    """The codec of an attrs class: its fields in order, no framing of its own.

    ``version`` None: every field (the newest layout); otherwise only the fields that version has.
    """
    key = (cls, version)
    cached = _struct_cache.get(key)
    if cached is not None:
        return cached
    hints = typing.get_type_hints(cls, include_extras=True)
    attributes: tuple[attrs.Attribute[Any], ...] = attrs.fields(typing.cast(Any, cls))
    for a in attributes:
        if a.metadata.get(SINCE, 0) > 0 and a.default is attrs.NOTHING:
            raise TypeError(f"{cls.__name__}.{a.name}: a versioned field needs a default")
    fields = [
        (a.name, _codec_for(hints[a.name], cls, a.name))
        for a in attributes
        if version is None or a.metadata.get(SINCE, 0) <= version
    ]
    name = cls.__name__ if version is None else f"{cls.__name__} v{version}"
    encode, decode = _generate(cls, name.replace(" ", "_"), fields)
    codec: Codec[T] = Codec(
        name,
        encode,
        decode,
        sum(c.min_size for _, c in fields),
        fields=tuple(fields),
    )
    _struct_cache[key] = codec
    return codec


_later_cache: dict[tuple[type, int], tuple[tuple[str, Any], ...]] = {}


def dropped_fields(value: object, version: int) -> list[str]:
    """The fields of ``value`` that version ``version`` of its message lacks and that hold
    something other than their default: encoding it in that version would lose them, and with
    them what the message means (a partial StopFetcher would read as a stop of everything)."""
    cls = type(value)
    key = (cls, version)
    later = _later_cache.get(key)
    if later is None:
        later = tuple(
            # attrs keeps a factory default as an object with the factory (and no instance here)
            (a.name, a.default.factory() if hasattr(a.default, "factory") else a.default)
            for a in attrs.fields(typing.cast(Any, cls))
            if a.metadata.get(SINCE, 0) > version
        )
        _later_cache[key] = later
    return [name for name, default in later if getattr(value, name) != default]


def _generate(
    cls: type, label: str, fields: list[tuple[str, Codec[Any]]]
) -> tuple[Encoder, Decoder]:
    """Write an encoder and a decoder specialised to ``cls``, as attrs writes its ``__init__``.

    A generic loop over fields costs a call and a lookup per field per message; the ping path
    decodes tens of thousands of frames a second, so each class gets straight-line code instead,
    with every run of fixed-width ints read or written by a single ``struct`` call. The code is
    derived from the same field list, so it cannot disagree with the schema.
    """
    namespace: dict[str, Any] = {
        "_cls": cls,
        "_struct_error": struct.error,
        "_wrong_type": _wrong_type,
        "_range_error": _range_error,
        "_short": _short,
    }
    enc = ["def encode(w, v):", "    if not isinstance(v, _cls):", "        _wrong_type(_cls, v)"]
    dec = ["def decode(r):", "    buf = r.buf"]
    args = []
    for i, run in enumerate(_runs(fields)):
        first_name, first_codec = run[0]
        if first_codec.fixed is None:
            namespace[f"_enc{i}"] = first_codec.encode
            namespace[f"_dec{i}"] = first_codec.decode
            enc.append(f"    _enc{i}(w, v.{first_name})")
            dec.append(f"    {first_name}_ = _dec{i}(r)")
            args.append(first_name)
            continue
        packer = struct.Struct(">" + "".join(typing.cast(str, c.fixed) for _, c in run))
        names = [name for name, _ in run]
        namespace[f"_pack{i}"] = packer.pack
        namespace[f"_unpack{i}"] = packer.unpack_from
        namespace[f"_run{i}"] = run
        enc += [
            "    try:",
            f"        w += _pack{i}({', '.join(f'v.{name}' for name in names)})",
            "    except _struct_error:",
            f"        _range_error(_cls, v, _run{i})",
        ]
        dec += [
            "    pos = r.pos",
            f"    if pos + {packer.size} > r.end:",
            f"        _short(_cls, {packer.size}, r)",
            f"    {''.join(f'{name}_, ' for name in names)}= _unpack{i}(buf, pos)",
            f"    r.pos = pos + {packer.size}",
        ]
        for name, codec in run:
            if codec.from_int is not None:
                namespace[f"_from_int_{name}"] = codec.from_int
                dec.append(f"    {name}_ = _from_int_{name}({name}_)")
        args += names
    dec.append(f"    return _cls({', '.join(f'{name}={name}_' for name in args)})")
    source = "\n".join(enc) + "\n\n" + "\n".join(dec) + "\n"
    filename = f"<protocol.schema generated {cls.__module__}.{label}>"
    exec(compile(source, filename, "exec"), namespace)
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    return namespace["encode"], namespace["decode"]


def _runs(fields: list[tuple[str, Codec[Any]]]) -> list[list[tuple[str, Codec[Any]]]]:
    """Split fields into runs of consecutive fixed-width ints and single other fields."""
    runs: list[list[tuple[str, Codec[Any]]]] = []
    for name, codec in fields:
        if codec.fixed is not None and runs and runs[-1][0][1].fixed is not None:
            runs[-1].append((name, codec))
        else:
            runs.append([(name, codec)])
    return runs


def _wrong_type(cls: type, value: object) -> NoReturn:
    raise LocalProtocolError(f"expected {cls.__name__}, got {value!r}", ErrorCode.INVALID_REQUEST)


def _range_error(cls: type, value: object, run: list[tuple[str, Codec[Any]]]) -> NoReturn:
    """Name the field that did not fit, by encoding the run's fields one at a time."""
    scratch = bytearray()
    for name, codec in run:
        try:
            codec.encode(scratch, getattr(value, name))
        except LocalProtocolError as exc:
            raise LocalProtocolError(f"{cls.__name__}.{name}: {exc}", exc.error_code) from None
    raise LocalProtocolError(
        f"{cls.__name__}: fields {[name for name, _ in run]} do not fit their wire types",
        ErrorCode.INVALID_REQUEST,
    )


def _short(cls: type, size: int, r: Reader) -> NoReturn:
    raise malformed(f"{cls.__name__}: needed {size} bytes, {r.end - r.pos} left")


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
