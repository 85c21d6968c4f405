"""Wire primitives: big-endian ints, strings, bytes, bools and arrays, Kafka 0.8 style.

Every primitive is a :class:`Codec`, a pair of plain functions, so that larger codecs (structs,
arrays, whole messages) are compositions of these and nothing else parses bytes. Decoding reads from
a :class:`Reader` bounded by the end of the current frame, so a body that runs short can never read
into the next frame; encoding appends to a ``bytearray`` so a whole frame is built in one buffer.

Errors are attributed here: anything wrong with bytes being decoded is the peer's fault
(:class:`RemoteProtocolError`, MALFORMED_FRAME), anything wrong with a value being encoded is ours
(:class:`LocalProtocolError`), and the connection adds the frame's correlation id and api key.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable
from typing import Annotated, Any, Generic, TypeVar

import attrs

from .errors import ErrorCode, LocalProtocolError, RemoteProtocolError

T = TypeVar("T")

ReadableBuffer = bytes | bytearray | memoryview
Encoder = Callable[[bytearray, Any], None]
Decoder = Callable[["Reader"], Any]


class Reader:
    """A cursor over ``buf[pos:end]``; decoders advance ``pos`` and may never pass ``end``."""

    __slots__ = ("buf", "end", "pos")

    def __init__(self, buf: ReadableBuffer, pos: int = 0, end: int | None = None) -> None:
        self.buf = buf
        self.pos = pos
        self.end = len(buf) if end is None else end

    @property
    def remaining(self) -> int:
        return self.end - self.pos

    def take(self, n: int) -> int:
        """Claim the next ``n`` bytes and return where they start."""
        pos = self.pos
        new = pos + n
        if new > self.end:
            raise malformed(f"needed {n} more bytes, {self.end - pos} left")
        self.pos = new
        return pos


@attrs.frozen
class Codec(Generic[T]):
    """How one wire type is written and read.

    ``min_size`` is the fewest bytes a value can take; arrays use it to refuse a count that the
    remaining bytes could not possibly hold, before allocating anything for it. ``fixed`` is the
    :mod:`struct` format character of a fixed-width integer type (``from_int`` turns the unpacked
    int into the field's value), which lets a struct codec read runs of such fields in one call.
    """

    name: str
    encode: Encoder
    decode: Decoder
    min_size: int
    fixed: str | None = None
    from_int: Callable[[int], Any] | None = None
    fields: tuple[tuple[str, Codec[Any]], ...] = ()
    """For a structure: its fields' names and codecs in wire order (for docs and tests)."""


def malformed(msg: str) -> RemoteProtocolError:
    return RemoteProtocolError(msg, ErrorCode.MALFORMED_FRAME)


def _int_codec(name: str, fmt: str) -> Codec[int]:
    packer = struct.Struct(fmt)
    pack = packer.pack
    unpack_from = packer.unpack_from
    size = packer.size
    bits = size * 8
    lo, hi = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1

    def encode(w: bytearray, value: Any) -> None:
        if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
            raise LocalProtocolError(f"{value!r} does not fit in {name}", ErrorCode.INVALID_REQUEST)
        w += pack(value)

    def decode(r: Reader) -> int:
        pos = r.pos
        new = pos + size
        if new > r.end:
            raise malformed(f"needed {size} bytes for {name}, {r.end - pos} left")
        r.pos = new
        value: int = unpack_from(r.buf, pos)[0]
        return value

    return Codec(name, encode, decode, size, fixed=fmt[1:])


INT8 = _int_codec("int8", ">b")
INT16 = _int_codec("int16", ">h")
INT32 = _int_codec("int32", ">i")
INT64 = _int_codec("int64", ">q")

# Field annotations: the type checker sees ``int``, the schema sees the width.
Int8 = Annotated[int, INT8]
Int16 = Annotated[int, INT16]
Int32 = Annotated[int, INT32]
Int64 = Annotated[int, INT64]

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_pack_i16 = _I16.pack
_pack_i32 = _I32.pack
_unpack_i16 = _I16.unpack_from
_unpack_i32 = _I32.unpack_from
MAX_STRING_BYTES = 2**15 - 1
MAX_INT32 = 2**31 - 1


def _string_codec(*, nullable: bool) -> Codec[Any]:
    """``int16`` length + UTF-8; length -1 is null, accepted only where the field is Optional.

    Each variant is one flat function: strings are in nearly every message (ids, topics), so a
    call per length prefix would show on the ping path.
    """
    name = "nullable string" if nullable else "string"
    null_prefix = _pack_i16(-1)

    def encode(w: bytearray, value: Any) -> None:
        if value.__class__ is not str:
            if value is None and nullable:
                w += null_prefix
                return
            if not isinstance(value, str):
                raise LocalProtocolError(f"{name}: got {value!r}", ErrorCode.INVALID_REQUEST)
        try:
            data = value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise LocalProtocolError(
                f"{name} is not UTF-8: {exc}", ErrorCode.INVALID_REQUEST
            ) from None
        n = len(data)
        if n > MAX_STRING_BYTES:
            raise LocalProtocolError(
                f"{name} of {n} bytes exceeds {MAX_STRING_BYTES}", ErrorCode.INVALID_REQUEST
            )
        w += _pack_i16(n)
        w += data

    def decode(r: Reader) -> str | None:
        buf = r.buf
        pos = r.pos
        end = r.end
        if pos + 2 > end:
            raise malformed(f"needed 2 bytes for a {name} length, {end - pos} left")
        (n,) = _unpack_i16(buf, pos)
        pos += 2
        if n < 0:
            if n == -1 and nullable:
                r.pos = pos
                return None
            raise malformed(f"{name} length {n}")
        stop = pos + n
        if stop > end:
            raise malformed(f"{name} of {n} bytes, {end - pos} left")
        r.pos = stop
        try:
            return str(buf[pos:stop], "utf-8")
        except UnicodeDecodeError as exc:
            raise malformed(f"{name} is not UTF-8: {exc}") from None

    return Codec(name, encode, decode, 2)


STRING: Codec[str] = _string_codec(nullable=False)
NULLABLE_STRING: Codec[str | None] = _string_codec(nullable=True)


def _bytes_codec(*, nullable: bool) -> Codec[Any]:
    """``int32`` length + raw bytes; length -1 is null, accepted only where the field may be."""
    name = "nullable bytes" if nullable else "bytes"
    null_prefix = _pack_i32(-1)

    def encode(w: bytearray, value: Any) -> None:
        if value is None and nullable:
            w += null_prefix
            return
        if not isinstance(value, bytes | bytearray):
            raise LocalProtocolError(f"{name}: got {value!r}", ErrorCode.INVALID_REQUEST)
        n = len(value)
        if n > MAX_INT32:
            raise LocalProtocolError(f"{name}: {n} bytes exceed int32", ErrorCode.INVALID_REQUEST)
        w += _pack_i32(n)
        w += value

    def decode(r: Reader) -> bytes | None:
        buf = r.buf
        pos = r.pos
        end = r.end
        if pos + 4 > end:
            raise malformed(f"needed 4 bytes for a {name} length, {end - pos} left")
        (n,) = _unpack_i32(buf, pos)
        pos += 4
        if n < 0:
            if n == -1 and nullable:
                r.pos = pos
                return None
            raise malformed(f"{name} length {n}")
        stop = pos + n
        if stop > end:
            raise malformed(f"{name} of {n} bytes, {end - pos} left")
        r.pos = stop
        return bytes(buf[pos:stop])

    return Codec(name, encode, decode, 4)


BYTES: Codec[bytes] = _bytes_codec(nullable=False)
NULLABLE_BYTES: Codec[bytes | None] = _bytes_codec(nullable=True)


def _encode_bool(w: bytearray, value: Any) -> None:
    if not isinstance(value, bool):
        raise LocalProtocolError(f"expected a bool, got {value!r}", ErrorCode.INVALID_REQUEST)
    w.append(1 if value else 0)


def _decode_bool(r: Reader) -> bool:
    pos = r.pos
    if pos >= r.end:
        raise malformed("needed 1 byte for a bool, 0 left")
    r.pos = pos + 1
    byte = r.buf[pos]
    if byte == 0:
        return False
    if byte == 1:
        return True
    raise malformed(f"bool byte is {byte}, not 0 or 1")


BOOL: Codec[bool] = Codec("bool", _encode_bool, _decode_bool, 1)


def _encode_error_code(w: bytearray, value: Any) -> None:
    if not isinstance(value, ErrorCode):
        raise LocalProtocolError(f"expected an ErrorCode, got {value!r}", ErrorCode.INVALID_REQUEST)
    w += _pack_i16(value)


def _decode_error_code(r: Reader) -> ErrorCode:
    return ErrorCode.from_wire(INT16.decode(r))


ERROR_CODE: Codec[ErrorCode] = Codec(
    "error code",
    _encode_error_code,
    _decode_error_code,
    2,
    fixed="h",
    from_int=ErrorCode.from_wire,
)


def _encode_uuid(w: bytearray, value: Any) -> None:
    if not isinstance(value, uuid.UUID):
        raise LocalProtocolError(f"expected a UUID, got {value!r}", ErrorCode.INVALID_REQUEST)
    w += value.bytes


def _decode_uuid(r: Reader) -> uuid.UUID:
    pos = r.take(16)
    return uuid.UUID(bytes=bytes(r.buf[pos : pos + 16]))


#: Kafka's uuid: 16 bytes, most significant first (a topic id, KIP-516).
UUID: Codec[uuid.UUID] = Codec("uuid", _encode_uuid, _decode_uuid, 16)


#: Arrays of fixed-width ints shorter than this are packed by a packer made once.
_KEPT_PACKERS = 8


def array(item: Codec[Any], *, nullable: bool = False) -> Codec[Any]:
    """``int32`` count then the items; -1 is null, accepted only where the field is Optional."""
    item_encode = item.encode
    item_decode = item.decode
    item_min = max(item.min_size, 1)
    name = f"{'nullable ' if nullable else ''}array of {item.name}"
    # Fixed-width ints (a partition's replicas, a cluster's slot holders) go in one struct call
    # with their count: per element, a call would cost more than the packing. The short arrays
    # that make up most of an answer (replicas, in-sync replicas) keep their packer.
    fixed = item.fixed if item.from_int is None else None
    packers = [struct.Struct(f">i{n}{fixed}").pack for n in range(_KEPT_PACKERS)] if fixed else []
    unpackers = [struct.Struct(f">{n}{fixed}") for n in range(_KEPT_PACKERS)] if fixed else []

    def encode(w: bytearray, value: Any) -> None:
        if value is None:
            if not nullable:
                raise LocalProtocolError(f"{name} may not be null", ErrorCode.INVALID_REQUEST)
            w += _pack_i32(-1)
            return
        if not isinstance(value, tuple | list):
            raise LocalProtocolError(f"expected a tuple, got {value!r}", ErrorCode.INVALID_REQUEST)
        if fixed is not None:
            n = len(value)
            try:
                if n < _KEPT_PACKERS:
                    w += packers[n](n, *value)
                else:
                    w += struct.pack(f">i{n}{fixed}", n, *value)
                return
            except struct.error:
                pass  # the element that does not fit is named below, nothing written yet
        w += _pack_i32(len(value))
        for element in value:
            item_encode(w, element)

    def decode(r: Reader) -> tuple[Any, ...] | None:
        pos = r.pos
        if pos + 4 > r.end:
            raise malformed(f"needed 4 bytes for a {name} count, {r.end - pos} left")
        (n,) = _unpack_i32(r.buf, pos)
        r.pos = pos + 4
        if n < 0:
            if n == -1 and nullable:
                return None
            raise malformed(f"{name} count {n}")
        if n * item_min > r.end - r.pos:
            raise malformed(f"{n} items of {name} cannot fit in {r.end - r.pos} bytes")
        if fixed is not None:
            unpacker = unpackers[n] if n < _KEPT_PACKERS else struct.Struct(f">{n}{fixed}")
            values: tuple[Any, ...] = unpacker.unpack_from(r.buf, r.pos)
            r.pos += unpacker.size
            return values
        return tuple([item_decode(r) for _ in range(n)])

    return Codec(name, encode, decode, 4)
