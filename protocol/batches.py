"""Record batches: the unit of a partition's log, on the wire and on disk alike (SPEC.md §6).

A batch is a 65-byte header and a records section. The header carries the two fields a broker
writes, ``base_offset`` and ``append_time_ms``, *before* the CRC, so a broker stamps a batch
without recomputing anything: it checks one CRC over the rest, checks the records section as a
reader will decode it (:meth:`RecordBatch.section`), writes those 16 bytes and appends the whole
batch to its log as it came. The records section is stored as the producer built it, compressed or
not (``attributes``): what a broker acknowledged, every reader can decode.

The records section is columnar: every record's timestamp delta, then every key length, then every
value length (little-endian int32 arrays, so a reader maps them as arrays without swapping), then
the keys' bytes and the values' bytes back to back. A reader turns a batch's values into an Arrow
binary column with a few array operations, and a Python reader slices them in one loop.

Kafka's v2 RecordBatch is the reference: the same header fields (``producer_id``,
``producer_epoch`` and ``base_sequence`` are reserved for an idempotent producer, KIP-98, and are
-1 until one exists), a different records section.
"""

from __future__ import annotations

import enum
import struct
import sys
import zlib
from array import array
from collections.abc import Iterator, Sequence

import attrs

from .codec import ReadableBuffer, malformed
from .errors import ErrorCode, LocalProtocolError, RemoteProtocolError
from .records import RECORD_OVERHEAD, Record

#: base_offset, batch_length, append_time_ms, crc, magic, attributes, last_offset_delta,
#: first_timestamp_ms, max_timestamp_ms, producer_id, producer_epoch, base_sequence, record_count
HEADER = struct.Struct(">qiqIbhiqqqhii")
HEADER_SIZE = HEADER.size  # 65
#: base_offset and batch_length: a reader walking a log needs only these to find the next batch.
LOG_OVERHEAD = 12
#: Where the CRC sits, and where the bytes it covers begin.
CRC_AT = 20
CRC_FROM = 24
#: The fields a broker writes: base offset (0) and append time (12); outside the CRC.
_OFFSET_AND_LENGTH = struct.Struct(">qi")
_INT64 = struct.Struct(">q")
_CRC = struct.Struct(">I")
_LAST_DELTA_AT = 27
_ATTRIBUTES_AT = 25
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_LE_I32 = struct.Struct("<i")

MAGIC = 2
"""The batch format's version (Kafka's v2 RecordBatch is magic 2, and this is its sibling)."""
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NO_TIMESTAMP = -1

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_LITTLE = sys.byteorder == "little"


class Compression(enum.IntEnum):
    """Bits 0-2 of ``attributes``; Kafka's numbering (1 gzip and 2 snappy are not served)."""

    NONE = 0
    LZ4 = 3
    ZSTD = 4


COMPRESSION_MASK = 0x07
#: Bit 3: the records carry no timestamps of their own; each one's is the batch's append time.
APPEND_TIME = 0x08
HEADERS = 0x10
"""Attributes bit 4: the records section ends with a headers column (SPEC.md §6.2)."""
_KNOWN_ATTRIBUTES = COMPRESSION_MASK | APPEND_TIME | HEADERS

Header = tuple[str, bytes | None]
"""A record header: a name and a value (Kafka's record headers)."""


def _int32_array(values: Sequence[int]) -> bytes:
    """``values`` as little-endian int32s in one call."""
    a = array("i", values)
    if not _LITTLE:
        a.byteswap()
    return a.tobytes()


def _int32s(buf: ReadableBuffer, pos: int, count: int) -> array[int]:
    a = array("i")
    a.frombytes(buf[pos : pos + 4 * count])
    if not _LITTLE:
        a.byteswap()
    return a


def compress(codec: Compression, data: bytes) -> bytes:
    if codec is Compression.NONE:
        return data
    if codec is Compression.ZSTD:
        import zstandard

        return zstandard.ZstdCompressor(level=3).compress(data)
    import lz4.frame

    compressed: bytes = lz4.frame.compress(data)
    return compressed


#: The most a records section may decompress to: a batch is at most a few MiB as sent, and a
#: small frame must not claim gigabytes (a decompression bomb) from whoever decodes it.
MAX_SECTION_BYTES = 64 * 1024 * 1024


#: The most records a batch may claim: each takes 12 bytes of its section at least.
MAX_RECORDS = MAX_SECTION_BYTES // 12


def decompress(codec: int, data: ReadableBuffer) -> bytes:
    try:
        if codec == Compression.NONE:
            return bytes(data)
        if codec == Compression.ZSTD:
            import zstandard

            raw = bytes(data)
            size = zstandard.frame_content_size(raw)
            if not 0 <= size <= MAX_SECTION_BYTES:
                raise ValueError(f"content size {size} is unknown or over {MAX_SECTION_BYTES}")
            return zstandard.ZstdDecompressor().decompress(raw)
        if codec == Compression.LZ4:
            import lz4.frame

            decompressor = lz4.frame.LZ4FrameDecompressor()
            out: bytes = decompressor.decompress(bytes(data), max_length=MAX_SECTION_BYTES)
            if not decompressor.eof:
                raise ValueError(f"more than {MAX_SECTION_BYTES} bytes, or a cut frame")
            return out
    except Exception as exc:  # zstd and lz4 raise their own types for damaged input
        raise RemoteProtocolError(
            f"a batch's records do not decompress ({codec}): {exc}", ErrorCode.CORRUPT_MESSAGE
        ) from exc
    raise RemoteProtocolError(f"unknown compression codec {codec}", ErrorCode.CORRUPT_MESSAGE)


def decompressed_bound(codec: int, data: ReadableBuffer) -> int:
    """The most :func:`decompress` can make of ``data``, read from its frame header: what a
    reader claims from a memory budget before decompressing (0 uncompressed: nothing is made)."""
    if codec == Compression.ZSTD:
        import zstandard

        try:
            size = zstandard.frame_content_size(bytes(data[:18]))  # a frame header's most
        except zstandard.ZstdError:
            return 0  # decompress refuses it before making anything
        return size if 0 <= size <= MAX_SECTION_BYTES else 0
    if codec == Compression.LZ4:
        import lz4.frame

        try:
            size = int(lz4.frame.get_frame_info(bytes(data[:19]))["content_size"])
        except RuntimeError:
            return 0
        return size if 0 < size <= MAX_SECTION_BYTES else MAX_SECTION_BYTES
    return 0


# --- building (producers) -----------------------------------------------------------------------


@attrs.define
class BatchBuilder:
    """Collects records for one batch; :meth:`build` returns its bytes (base offset 0).

    ``append`` refuses (returns False) a record the batch cannot take: past ``max_bytes`` (unless
    the batch is empty: a batch always takes its first record), or a timestamp the batch cannot
    express (a record without one in a batch whose records have them, or the other way round, or
    a delta beyond int32), so a producer starts the next batch with it. Appending keeps
    references only; the bytes are joined once, by :meth:`build`.
    """

    compression: Compression = Compression.NONE
    max_bytes: int = 1024 * 1024
    max_records: int = 2**31 - 1
    full: bool = False
    """The batch reached ``max_bytes`` or ``max_records``: it takes no more records."""
    _values: list[bytes | None] = attrs.field(factory=list)
    _keys: list[bytes | None] = attrs.field(factory=list)
    _timestamps: list[int] = attrs.field(factory=list)
    """Empty while the records have no timestamps (the broker's append time)."""
    _keyed: bool = False
    _null_values: bool = False
    _size: int = HEADER_SIZE
    _headers: list[bytes] | None = None
    """Each record's encoded headers (b"": none); None while no record has any."""

    @property
    def count(self) -> int:
        return len(self._values)

    @property
    def size(self) -> int:
        """The uncompressed size the batch has so far."""
        return self._size

    def append(
        self,
        value: bytes | None,
        key: bytes | None = None,
        timestamp_ms: int = -1,
        headers: Sequence[Header] = (),
    ) -> bool:
        size = self._size + 12
        encoded = b""
        if headers:
            encoded = encode_headers(headers)
            size += 4 + len(encoded)
        elif self._headers is not None:
            size += 4
        if value is not None:
            if type(value) is not bytes:
                value = _as_bytes(value)
            size += len(value)
        else:
            self._null_values = True
        if key is not None:
            if type(key) is not bytes:
                key = _as_bytes(key)
            size += len(key)
            self._keyed = True
        values = self._values
        if values:
            if size > self.max_bytes or self.full:
                return False
            timestamps = self._timestamps
            if timestamp_ms >= 0:
                if not timestamps or not _INT32_MIN <= timestamp_ms - timestamps[0] <= _INT32_MAX:
                    return False
                timestamps.append(timestamp_ms)
            elif timestamps:
                return False
        elif timestamp_ms >= 0:
            self._timestamps.append(timestamp_ms)
        if headers and self._headers is None:
            self._headers = [b""] * len(values)
            size += 4 * len(values)
        if self._headers is not None:
            self._headers.append(encoded)
        values.append(value)
        self._keys.append(key)
        self._size = size
        if size >= self.max_bytes or len(values) >= self.max_records:
            self.full = True
        return True

    def build(self) -> bytes:
        values = self._values
        count = len(values)
        if not count:
            raise LocalProtocolError("a batch holds at least one record", ErrorCode.INVALID_REQUEST)
        timestamps = self._timestamps
        if timestamps:
            first = timestamps[0]
            deltas = _int32_array([t - first for t in timestamps])
            first_ts, max_ts = first, max(timestamps)
        else:
            deltas = bytes(4 * count)
            first_ts = max_ts = NO_TIMESTAMP
        value_lengths, value_bytes = _column(values, self._null_values)
        if self._keyed:
            key_lengths, key_bytes = _column(self._keys, None in self._keys)
        else:
            key_lengths, key_bytes = _int32_array([-1]) * count, b""
        columns = [deltas, key_lengths, value_lengths, key_bytes, value_bytes]
        if self._headers is not None:
            columns += [_int32_array(list(map(len, self._headers))), b"".join(self._headers)]
        return encode_batch(
            columns,
            count,
            first_timestamp_ms=first_ts,
            max_timestamp_ms=max_ts,
            compression=self.compression,
            headers=self._headers is not None,
        )


def encode_headers(headers: Sequence[Header]) -> bytes:
    """One record's headers as the headers column holds them (SPEC.md §6.2): per header the
    name's length and UTF-8 bytes, then the value's length (-1: null) and bytes, lengths as
    little-endian int32s."""
    out = bytearray()
    for name, value in headers:
        if not isinstance(name, str):
            raise LocalProtocolError("a header's name is a str", ErrorCode.INVALID_REQUEST)
        raw = name.encode()
        out += _LE_I32.pack(len(raw)) + raw
        if value is None:
            out += _LE_I32.pack(-1)
        else:
            value = _as_bytes(value)
            out += _LE_I32.pack(len(value)) + value
    return bytes(out)


def decode_headers(block: bytes) -> tuple[Header, ...]:
    """The inverse of :func:`encode_headers`; RemoteProtocolError for a block that does not
    parse."""
    headers: list[Header] = []
    pos = 0
    try:
        while pos < len(block):
            (n,) = _LE_I32.unpack_from(block, pos)
            if n < 0 or pos + 4 + n > len(block):
                raise ValueError(f"a header name of {n} bytes")
            name = block[pos + 4 : pos + 4 + n].decode()
            pos += 4 + n
            (m,) = _LE_I32.unpack_from(block, pos)
            pos += 4
            if m < -1 or pos + max(m, 0) > len(block):
                raise ValueError(f"a header value of {m} bytes")
            headers.append((name, None if m < 0 else block[pos : pos + m]))
            pos += max(m, 0)
    except (ValueError, struct.error) as exc:  # UnicodeDecodeError is a ValueError
        raise RemoteProtocolError(
            f"record headers do not parse: {exc}", ErrorCode.CORRUPT_MESSAGE
        ) from exc
    return tuple(headers)


def _as_bytes(data: object) -> bytes:
    if isinstance(data, bytes | bytearray | memoryview):
        return bytes(data)
    raise LocalProtocolError(
        f"a record's key and value are bytes, not {type(data).__name__}", ErrorCode.INVALID_REQUEST
    )


def _column(items: list[bytes | None], nulls: bool) -> tuple[bytes, bytes]:
    """The little-endian lengths (-1: null) and the joined bytes of ``items``."""
    if nulls:
        lengths = [-1 if item is None else len(item) for item in items]
        joined = b"".join([item for item in items if item is not None])
    else:
        lengths = list(map(len, items))  # type: ignore[arg-type]
        joined = b"".join(items)  # type: ignore[arg-type]
    return _int32_array(lengths), joined


def encode_batch(
    section: bytes | Sequence[bytes],
    count: int,
    *,
    first_timestamp_ms: int,
    max_timestamp_ms: int,
    compression: Compression = Compression.NONE,
    base_offset: int = 0,
    append_time_ms: int = NO_TIMESTAMP,
    headers: bool = False,
) -> bytes:
    """A whole batch around an (uncompressed) records section of ``count`` records, given whole
    or in parts (joined once, with the header, when not compressed); ``headers``: the section
    ends with a headers column."""
    attributes = int(compression) | (APPEND_TIME if first_timestamp_ms < 0 else 0)
    if headers:
        attributes |= HEADERS
    parts = [section] if isinstance(section, bytes) else list(section)
    if compression is not Compression.NONE:
        parts = [compress(compression, b"".join(parts))]
    body_size = sum(len(part) for part in parts)
    head = bytearray(HEADER_SIZE)
    HEADER.pack_into(
        head,
        0,
        base_offset,
        HEADER_SIZE - LOG_OVERHEAD + body_size,
        append_time_ms,
        0,
        MAGIC,
        attributes,
        count - 1,
        first_timestamp_ms,
        max_timestamp_ms,
        NO_PRODUCER_ID,
        NO_PRODUCER_EPOCH,
        NO_SEQUENCE,
        count,
    )
    with memoryview(head) as view:
        crc = zlib.crc32(view[CRC_FROM:])
    for part in parts:
        crc = zlib.crc32(part, crc)
    _CRC.pack_into(head, CRC_AT, crc)
    return b"".join([head, *parts])


def build_batch(
    values: Sequence[bytes | None],
    keys: Sequence[bytes | None] | None = None,
    timestamps_ms: Sequence[int] | None = None,
    compression: Compression = Compression.NONE,
    base_offset: int = 0,
    headers: Sequence[Sequence[Header]] | None = None,
) -> bytes:
    """One batch of these records (no size limit); ``timestamps_ms`` None: the broker's time.
    ``base_offset``: as a broker would have stamped it (producers leave it 0)."""
    builder = BatchBuilder(compression=compression, max_bytes=2**62)
    for i, value in enumerate(values):
        ok = builder.append(
            value,
            None if keys is None else keys[i],
            -1 if timestamps_ms is None else timestamps_ms[i],
            () if headers is None else headers[i],
        )
        if not ok:
            raise LocalProtocolError(
                f"record {i}'s timestamp does not fit one batch", ErrorCode.INVALID_REQUEST
            )
    batch = builder.build()
    return _INT64.pack(base_offset) + batch[8:] if base_offset else batch


#: Version-0 records are stored in batches of about this size (a batch holds at least one record,
#: so a record larger than this is a batch of its own).
RECORDS_BATCH_BYTES = 256 * 1024


def batches_from_records(records: Sequence[Record]) -> bytes:
    """Version-0 records (one at a time) as batches, for a broker that stores only batches."""
    out = bytearray()
    builder = BatchBuilder(max_bytes=RECORDS_BATCH_BYTES)
    for record in records:
        if not builder.append(record.value, record.key, record.timestamp_ms):
            out += builder.build()
            builder = BatchBuilder(max_bytes=RECORDS_BATCH_BYTES)
            builder.append(record.value, record.key, record.timestamp_ms)
    if builder.count:
        out += builder.build()
    return bytes(out)


def records_from_batches(
    buf: ReadableBuffer, min_offset: int = 0, max_bytes: int | None = None
) -> tuple[Record, ...]:
    """Batches decoded into version-0 records, those from ``min_offset`` on, while their
    :func:`~protocol.records.record_size` adds up to at most ``max_bytes`` (None: all; at least
    one record): a Fetch's limit bounds the decoding, not only the bytes read, so the last batch
    may give only its first records. Each batch's section is dropped once its records are made."""
    out: list[Record] = []
    budget = -1 if max_bytes is None else max_bytes
    for batch in read_batches(buf, check_crc=False):
        if batch.next_offset <= min_offset:
            continue
        limit = 2**63 if budget < 0 else budget
        for offset, ts, key, value, size in batch.records(min_offset, limit):
            out.append(Record(offset=offset, timestamp_ms=ts, key=key, value=value))
            if budget >= 0:
                budget = max(0, budget - size)
        if budget == 0:
            break
    return tuple(out)


# --- checking and stamping (brokers) ------------------------------------------------------------


@attrs.frozen(kw_only=True)
class BatchSpan:
    """Where one batch sits in a buffer of batches, and what a log needs to know of it."""

    position: int
    size: int
    base_offset: int
    record_count: int
    max_timestamp_ms: int
    """The newest timestamp of its records (its append time when they have none); -1: unknown."""


def walk_batches(
    buf: ReadableBuffer, pos: int = 0, end: int | None = None, check_crc: bool = True
) -> Iterator[tuple[int, int, int, int, int]]:
    """``(position, size, base_offset, record_count, max_timestamp_ms)`` of each whole batch in
    ``buf[pos:end]``, checking each header and (``check_crc``) its one CRC.

    Raises RemoteProtocolError at the first bad batch, after yielding the good ones before it:
    MALFORMED_FRAME for bytes that are not a whole batch (a torn tail, in a log file),
    CORRUPT_MESSAGE for a CRC that does not match or a header no writer of this format makes.
    ``max_timestamp_ms`` is the append time for a batch whose records carry no timestamps.
    """
    end = len(buf) if end is None else end
    unpack = HEADER.unpack_from
    crc32 = zlib.crc32
    with memoryview(buf) as view:
        while pos < end:
            if end - pos < HEADER_SIZE:
                raise malformed(f"a batch header needs {HEADER_SIZE} bytes, {end - pos} left")
            (
                base,
                length,
                append_time,
                crc,
                magic,
                attributes,
                last_delta,
                _first_ts,
                max_ts,
                _pid,
                _epoch,
                _seq,
                count,
            ) = unpack(view, pos)
            size = LOG_OVERHEAD + length
            if length < HEADER_SIZE - LOG_OVERHEAD:
                raise malformed(f"batch at byte {pos}: length {length} is shorter than a header")
            if size > end - pos:
                raise malformed(f"batch at byte {pos}: {size} bytes, {end - pos} left")
            if check_crc:
                actual = crc32(view[pos + CRC_FROM : pos + size])
                if actual != crc:
                    raise RemoteProtocolError(
                        f"batch at byte {pos} (offset {base}): crc {actual:#010x} does not "
                        f"match {crc:#010x}",
                        ErrorCode.CORRUPT_MESSAGE,
                    )
            if (
                magic != MAGIC
                or attributes & ~_KNOWN_ATTRIBUTES
                or (attributes & COMPRESSION_MASK) not in _CODECS
                or not 1 <= count <= MAX_RECORDS
                or last_delta != count - 1
                # uncompressed, the section holds three int32s per record at least
                or (not attributes & COMPRESSION_MASK and size - HEADER_SIZE < 12 * count)
            ):
                raise RemoteProtocolError(
                    f"batch at byte {pos}: magic {magic}, attributes {attributes:#x}, "
                    f"{count} records, last offset delta {last_delta}: not a batch this "
                    "format allows",
                    ErrorCode.CORRUPT_MESSAGE,
                )
            yield pos, size, base, count, append_time if attributes & APPEND_TIME else max_ts
            pos += size


def batch_spans(buf: ReadableBuffer, check_crc: bool = True) -> list[BatchSpan]:
    """Every batch of ``buf`` (see :func:`walk_batches`); raises at the first bad one."""
    return [
        BatchSpan(position=p, size=s, base_offset=b, record_count=c, max_timestamp_ms=t)
        for p, s, b, c, t in walk_batches(buf, check_crc=check_crc)
    ]


_CODECS = frozenset(int(c) for c in Compression)


def check_batches(buf: ReadableBuffer, spans: Sequence[BatchSpan]) -> None:
    """Decode-check every batch of ``spans`` as a reader will (:meth:`RecordBatch.section`):
    RemoteProtocolError (CORRUPT_MESSAGE) at the first that a reader could not decode. One
    section is held at a time, so the memory this takes is :func:`section_bound`'s."""
    for span in spans:
        batch_at(buf, span.position, span.size).section()


def section_bound(buf: ReadableBuffer, spans: Sequence[BatchSpan]) -> int:
    """The most memory decompressing one of these batches takes (:func:`decompressed_bound`):
    read from their frame headers, before any is decompressed."""
    bound = 0
    with memoryview(buf) as view:
        for span in spans:
            codec = _I16.unpack_from(view, span.position + _ATTRIBUTES_AT)[0] & COMPRESSION_MASK
            if codec:
                body = view[span.position + HEADER_SIZE : span.position + span.size]
                bound = max(bound, decompressed_bound(codec, body))
    return bound


def stamp(buf: bytearray, spans: Sequence[BatchSpan], base_offset: int, now_ms: int) -> int:
    """Write offsets from ``base_offset`` and the append time into checked batches; returns the
    offset after the last record. The CRCs stay valid: neither field is covered."""
    offset = base_offset
    for span in spans:
        _INT64.pack_into(buf, span.position, offset)
        _INT64.pack_into(buf, span.position + 12, now_ms)
        offset += span.record_count
    return offset


def stamped_pieces(
    buf: ReadableBuffer, spans: Sequence[BatchSpan], base_offset: int, now_ms: int
) -> list[ReadableBuffer]:
    """The checked batches of ``buf`` as :func:`stamp` would leave them, as pieces to write
    (``os.writev``) without copying the batches: a new 20-byte start per batch (base offset,
    length, append time) and a view of the rest."""
    pieces: list[ReadableBuffer] = []
    offset = base_offset
    view = memoryview(buf)
    stamp_time = _INT64.pack(now_ms)
    for span in spans:
        pos = span.position
        pieces.append(_INT64.pack(offset) + bytes(view[pos + 8 : pos + 12]) + stamp_time)
        pieces.append(view[pos + 20 : pos + span.size])
        offset += span.record_count
    return pieces


def stamped_spans(spans: Sequence[BatchSpan], base_offset: int, now_ms: int) -> list[BatchSpan]:
    """``spans`` as :func:`stamp` leaves them: their offsets, and the append time as the newest
    timestamp of batches whose records have none."""
    out = []
    offset = base_offset
    for span in spans:
        out.append(
            attrs.evolve(
                span,
                base_offset=offset,
                max_timestamp_ms=now_ms if span.max_timestamp_ms < 0 else span.max_timestamp_ms,
            )
        )
        offset += span.record_count
    return out


# --- reading (consumers) ------------------------------------------------------------------------


@attrs.frozen
class _Layout:
    """What checking a records section found: where its values begin, and its headers (None: the
    batch has no headers column)."""

    values_at: int
    headers: list[tuple[Header, ...]] | None


#: Elements of a length column a check takes in one C call: ``min`` over 65,536 int32s takes
#: about 3 ms, and the GIL can pass to the event loop only between calls.
_CHUNK = 1 << 16
_NULLS = _LE_I32.pack(-1) * _CHUNK


def _column_total(buf: ReadableBuffer, pos: int, count: int, lowest: int = -1) -> int | None:
    """The bytes the ``count`` lengths at ``buf[pos:]`` say their items take (-1: null, when
    ``lowest`` is -1); None if a length is below ``lowest``. ``min``, ``sum`` and ``count`` are C
    loops over an array, no Python step per record, taken a chunk at a time: a thread checking a
    batch of millions of records holds the GIL for milliseconds at a time, not a quarter second,
    and copies no more than a chunk of the column. A chunk of nulls (a batch without keys) is
    one comparison of bytes."""
    total = 0
    for at in range(0, count, _CHUNK):
        n = min(_CHUNK, count - at)
        raw = buf[pos + 4 * at : pos + 4 * (at + n)]
        if lowest < 0 and raw == _NULLS[: 4 * n]:
            continue
        part = _int32s(raw, 0, n)
        low = min(part)
        if low < lowest:
            return None
        total += sum(part) + (part.count(-1) if low < 0 else 0)
    return total


@attrs.define(eq=False)
class RecordBatch:
    """One received batch, decoded on demand: the header at once, the records on first use.

    ``offsets``, ``timestamps``, ``keys`` and ``values`` are parallel lists of the batch's
    records; :meth:`columns` gives the raw arrays a vectorised reader wants instead.
    """

    base_offset: int
    append_time_ms: int
    attributes: int
    first_timestamp_ms: int
    max_timestamp_ms: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int
    _body: ReadableBuffer = attrs.field(repr=False)
    _section: bytes | None = attrs.field(default=None, repr=False)
    _layout: _Layout | None = attrs.field(default=None, repr=False)

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_MASK

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.record_count - 1

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.record_count

    def section(self) -> bytes:
        """The records section, decompressed and checked (once): every length column against
        the section's size, and every header block walked. A reader that gets it past here
        can decode every record; RemoteProtocolError (CORRUPT_MESSAGE) otherwise."""
        if self._section is None:
            section = decompress(self.compression, self._body)
            self._layout = self._check(section)
            self._section = section
        return self._section

    def _corrupt(self, what: str) -> RemoteProtocolError:
        return RemoteProtocolError(
            f"batch at offset {self.base_offset}: {what}", ErrorCode.CORRUPT_MESSAGE
        )

    def _check(self, section: bytes) -> _Layout:
        """Where the section's columns are, after checking that they fill it exactly. The length
        columns are checked with array operations (one C loop each, whatever the record count);
        the header blocks, which only a walk can check, one by one."""
        n = self.record_count
        size = len(section)
        if size < 12 * n:
            raise self._corrupt(f"{size} bytes of records section for {n} records")
        keys_total = _column_total(section, 4 * n, n)
        values_total = _column_total(section, 8 * n, n)
        if keys_total is None or values_total is None:
            raise self._corrupt("a key or value length below -1")
        values_at = 12 * n + keys_total
        end = values_at + values_total
        headers: list[tuple[Header, ...]] | None = None
        if self.attributes & HEADERS:
            if end + 4 * n > size:
                raise self._corrupt("no room for its headers column")
            blocks_total = _column_total(section, end, n, lowest=0)
            if blocks_total is None:
                raise self._corrupt("a headers block of negative length")
            blocks_at = end + 4 * n
            if blocks_at + blocks_total == size:
                blocks = self._slices(section, _int32s(section, end, n), blocks_at)
                headers = [decode_headers(block) if block else () for block in blocks]
            end = blocks_at + blocks_total
        if end != size:
            raise self._corrupt(f"its lengths add up to {end} bytes, its section has {size}")
        return _Layout(values_at=values_at, headers=headers)

    def columns(self) -> tuple[bytes, int, int, int, int]:
        """``(section, key_lengths_at, value_lengths_at, keys_at, values_at)``: byte positions of
        the little-endian int32 key and value length arrays and of the key and value bytes in
        the decompressed section (timestamp deltas are at 0)."""
        section = self.section()
        n = self.record_count
        assert self._layout is not None
        return section, 4 * n, 8 * n, 12 * n, self._layout.values_at

    @property
    def offsets(self) -> range:
        return range(self.base_offset, self.base_offset + self.record_count)

    def timestamps(self) -> list[int]:
        n = self.record_count
        if self.attributes & APPEND_TIME:
            self.section()  # a batch claiming more records than it holds fails here
            return [self.append_time_ms] * n
        first = self.first_timestamp_ms
        return [first + d for d in _int32s(self.section(), 0, n)]

    def keys(self) -> list[bytes | None]:
        section = self.section()
        n = self.record_count
        return self._slices(section, _int32s(section, 4 * n, n), 12 * n)

    def values(self) -> list[bytes | None]:
        section, _, value_lengths_at, _, values_at = self.columns()
        n = self.record_count
        return self._slices(section, _int32s(section, value_lengths_at, n), values_at)

    def headers(self) -> list[tuple[Header, ...]]:
        """Each record's headers (empty for a record, or a batch, without any)."""
        self.section()
        assert self._layout is not None
        headers = self._layout.headers
        return [()] * self.record_count if headers is None else list(headers)

    def records(
        self, first_offset: int, max_bytes: int
    ) -> Iterator[tuple[int, int, bytes | None, bytes | None, int]]:
        """``(offset, timestamp_ms, key, value, size)`` of the records from ``first_offset`` on,
        ``size`` being :func:`~protocol.records.record_size`'s, while their sizes add up to at
        most ``max_bytes`` (the first one whatever its size). The work is in proportion to the
        records made, not to the batch's record count: a batch of a million empty records
        gives a Fetch of 1 KiB its 36 records without making the rest."""
        section = self.section()
        n = self.record_count
        i = max(0, first_offset - self.base_offset)
        if i >= n:
            return
        m = min(n - i, max_bytes // RECORD_OVERHEAD + 1)  # the most that can fit
        key_lengths = _int32s(section, 4 * (n + i), m)
        value_lengths = _int32s(section, 4 * (2 * n + i), m)
        deltas = None if self.attributes & APPEND_TIME else _int32s(section, 4 * i, m)
        key_at = 12 * n + (_column_total(section, 4 * n, i) or 0)
        value_at = self.columns()[4] + (_column_total(section, 8 * n, i) or 0)
        used = 0
        for j in range(m):
            k, v = key_lengths[j], value_lengths[j]
            size = RECORD_OVERHEAD + max(k, 0) + max(v, 0)
            if used and used + size > max_bytes:
                return
            used += size
            key = None if k < 0 else section[key_at : key_at + k]
            value = None if v < 0 else section[value_at : value_at + v]
            key_at += max(k, 0)
            value_at += max(v, 0)
            ts = self.append_time_ms if deltas is None else self.first_timestamp_ms + deltas[j]
            yield self.base_offset + i + j, ts, key, value, size

    def _slices(self, section: bytes, lengths: array[int], start: int) -> list[bytes | None]:
        out: list[bytes | None] = []
        append = out.append
        pos = start
        for n in lengths:
            if n < 0:
                append(None)
            else:
                append(section[pos : pos + n])
                pos += n
        if pos > len(section):
            raise RemoteProtocolError(
                f"batch at offset {self.base_offset}: lengths run past its records",
                ErrorCode.CORRUPT_MESSAGE,
            )
        return out

    def __iter__(self) -> Iterator[tuple[int, int, bytes | None, bytes | None]]:
        """``(offset, timestamp_ms, key, value)`` of each record."""
        return zip(self.offsets, self.timestamps(), self.keys(), self.values(), strict=True)


def read_batches(buf: ReadableBuffer, check_crc: bool = True) -> list[RecordBatch]:
    """Every batch in ``buf`` (a fetch answer's ``batches``), headers decoded, records not yet."""
    return [batch_at(buf, p, s) for p, s, _, _, _ in walk_batches(buf, check_crc=check_crc)]


def batch_at(buf: ReadableBuffer, position: int, size: int) -> RecordBatch:
    """The batch of ``size`` bytes at ``position`` of ``buf``, its header as found (see
    :func:`walk_batches` for the checks), its records not decoded yet."""
    fields = HEADER.unpack_from(buf, position)
    return RecordBatch(
        base_offset=fields[0],
        append_time_ms=fields[2],
        attributes=fields[5],
        first_timestamp_ms=fields[7],
        max_timestamp_ms=fields[8],
        producer_id=fields[9],
        producer_epoch=fields[10],
        base_sequence=fields[11],
        record_count=fields[12],
        body=memoryview(buf)[position + HEADER_SIZE : position + size],
    )


def batch_offsets(buf: ReadableBuffer, position: int) -> tuple[int, int]:
    """``(base_offset, size)`` of the batch at ``position``, from its first 12 bytes."""
    base, length = _OFFSET_AND_LENGTH.unpack_from(buf, position)
    return base, LOG_OVERHEAD + length


def last_offset_delta(buf: ReadableBuffer, position: int) -> int:
    delta: int = _I32.unpack_from(buf, position + _LAST_DELTA_AT)[0]
    return delta


def count_records(batches: Sequence[RecordBatch]) -> int:
    return sum(b.record_count for b in batches)


__all__ = [
    "APPEND_TIME",
    "HEADER_SIZE",
    "LOG_OVERHEAD",
    "MAGIC",
    "BatchBuilder",
    "BatchSpan",
    "Compression",
    "RecordBatch",
    "batch_at",
    "batch_offsets",
    "batch_spans",
    "batches_from_records",
    "build_batch",
    "check_batches",
    "count_records",
    "encode_batch",
    "last_offset_delta",
    "read_batches",
    "records_from_batches",
    "section_bound",
    "stamp",
    "stamped_pieces",
    "stamped_spans",
    "walk_batches",
]
