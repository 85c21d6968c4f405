"""Records one at a time: the data of version 0 of PRODUCE and FETCH (SPEC.md §6.1).

A record is ``offset:int64, crc:uint32, timestamp_ms:int64, key:bytes, value:bytes``. The CRC covers
only the part after itself, never the offset, so a broker can stamp offsets on a producer's records
(which arrive with offset -1) without recomputing anything. Version 1 on carries record batches
instead (:mod:`protocol.batches`), and so does every broker's log: a broker turns version-0
records into batches as they arrive, and batches back into records for a version-0 fetch."""

from __future__ import annotations

import struct
import zlib

import attrs

from .codec import (
    NULLABLE_BYTES,
    Codec,
    ReadableBuffer,
    Reader,
    malformed,
)
from .errors import ErrorCode, LocalProtocolError, RemoteProtocolError

_HEAD_SIZE = 12  # offset:int64, crc:uint32 — the part the CRC does not cover
#: The fixed-width start of a record, read and written with one call: offset, crc, timestamp,
#: key length (the hot path of every produce, fetch and log scan).
_FIXED = struct.Struct(">qIqi")
#: What a reader takes in one call before the key: offset, crc, timestamp.
_HEAD = struct.Struct(">qIq")
_LENGTH = struct.Struct(">i")
_CRC = struct.Struct(">I")

RECORD_OVERHEAD = _HEAD_SIZE + 8 + 4 + 4
"""Bytes a record takes beyond its key and value."""


@attrs.frozen(kw_only=True)
class Record:
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None


def record_size(record: Record) -> int:
    """Encoded size, so a broker can honour a fetch's ``max_bytes`` without encoding first."""
    key, value = record.key, record.value
    return (
        RECORD_OVERHEAD
        + (len(key) if key is not None else 0)
        + (len(value) if value is not None else 0)
    )


def write_record(w: bytearray, record: Record) -> None:
    """Append one encoded record to ``w`` (the building block of frames and log segments)."""
    key, value = record.key, record.value
    start = len(w)
    try:
        w += _FIXED.pack(record.offset, 0, record.timestamp_ms, -1 if key is None else len(key))
        if key:
            w += key
        w += _LENGTH.pack(-1 if value is None else len(value))
        if value:
            w += value
    except (struct.error, TypeError) as exc:
        del w[start:]
        raise LocalProtocolError(
            f"record at offset {record.offset} cannot be encoded: {exc}", ErrorCode.INVALID_REQUEST
        ) from exc
    if isinstance(key, str) or isinstance(value, str):  # len() and += took them; wire takes bytes
        del w[start:]
        raise LocalProtocolError(
            "a record's key and value are bytes, not str", ErrorCode.INVALID_REQUEST
        )
    with memoryview(w) as view:
        crc = zlib.crc32(view[start + _HEAD_SIZE :])
    _CRC.pack_into(w, start + 8, crc)


def read_record(r: Reader) -> Record:
    """Decode one record at ``r.pos``, checking its CRC."""
    buf, pos = r.buf, r.pos
    if r.end - pos < RECORD_OVERHEAD:
        raise malformed(f"a record needs at least {RECORD_OVERHEAD} bytes, {r.end - pos} left")
    offset, crc, timestamp_ms = _HEAD.unpack_from(buf, pos)
    covered = pos + _HEAD_SIZE
    r.pos = pos + _HEAD.size
    key = NULLABLE_BYTES.decode(r)
    value = NULLABLE_BYTES.decode(r)
    with memoryview(buf) as view:
        actual = zlib.crc32(view[covered : r.pos])
    if actual != crc:
        raise RemoteProtocolError(
            f"record at offset {offset}: crc {actual:#010x} does not match {crc:#010x}",
            ErrorCode.CORRUPT_MESSAGE,
        )
    return Record(offset=offset, timestamp_ms=timestamp_ms, key=key, value=value)


def encode_record(record: Record) -> bytes:
    """One record's bytes; raises LocalProtocolError if a field does not fit its width."""
    w = bytearray()
    write_record(w, record)
    return bytes(w)


def decode_record(buf: ReadableBuffer, pos: int = 0, end: int | None = None) -> tuple[Record, int]:
    """Decode the record at ``buf[pos:]`` (up to ``end``) and return it with the next position.

    Raises RemoteProtocolError: CORRUPT_MESSAGE when the CRC does not match, MALFORMED_FRAME when
    the bytes stop before the record does (a torn tail, for a log file).
    """
    r = Reader(buf, pos, end)
    if r.remaining < RECORD_OVERHEAD:
        raise malformed(f"a record needs at least {RECORD_OVERHEAD} bytes, {r.remaining} left")
    record = read_record(r)
    return record, r.pos


RECORD: Codec[Record] = Codec("record", write_record, read_record, RECORD_OVERHEAD)
