"""Record batches (SPEC.md §6.2): whatever a producer builds, a consumer reads back exactly; what
a broker or consumer is handed that no producer built is refused with CORRUPT_MESSAGE or
MALFORMED_FRAME, never a crash or a bomb."""

from __future__ import annotations

import struct
import zlib
from array import array

import lz4.frame
import pytest
import zstandard
from hypothesis import given
from hypothesis import strategies as st

from protocol import ErrorCode, Record, RemoteProtocolError
from protocol.batches import (
    HEADER_SIZE,
    MAX_RECORDS,
    MAX_SECTION_BYTES,
    RECORDS_BATCH_BYTES,
    BatchBuilder,
    Compression,
    batch_spans,
    batches_from_records,
    build_batch,
    encode_batch,
    read_batches,
    records_from_batches,
)
from protocol.records import record_size

maybe_bytes = st.none() | st.binary(max_size=64)


@given(
    st.lists(st.tuples(maybe_bytes, maybe_bytes), min_size=1, max_size=50),
    st.none() | st.integers(0, 2**40),
    st.sampled_from(list(Compression)),
)
def test_a_batch_reads_back_as_built(
    records: list[tuple[bytes | None, bytes | None]], first_ts: int | None, codec: Compression
) -> None:
    values = [v for _, v in records]
    keys = [k for k, _ in records]
    timestamps = None if first_ts is None else [first_ts + i * 7 for i in range(len(records))]
    data = build_batch(values, keys, timestamps, compression=codec)
    (span,) = batch_spans(data)
    assert (span.size, span.record_count) == (len(data), len(records))
    (batch,) = read_batches(data)
    assert batch.compression == codec
    assert batch.keys() == keys and batch.values() == values
    assert batch.timestamps() == (timestamps or [-1] * len(records))


def test_a_builder_refuses_what_its_batch_cannot_carry() -> None:
    builder = BatchBuilder(max_bytes=HEADER_SIZE + 2 * (12 + 10), max_records=5)
    assert builder.append(b"x" * 10, None, 1000)
    assert not builder.append(b"y", None, -1)  # no timestamp among records that have them
    assert not builder.append(b"y", None, 1000 + 2**31)  # a delta beyond int32
    assert builder.append(b"z" * 10, None, 999)
    assert builder.full and not builder.append(b"", None, 1000)  # max_bytes reached
    with pytest.raises(Exception, match="bytes, not str"):
        BatchBuilder().append("text")  # type: ignore[arg-type]


@pytest.mark.parametrize("flip", [24, 25, 30, 61, 70, -1])
def test_a_flipped_bit_anywhere_the_crc_covers_is_corrupt(flip: int) -> None:
    data = bytearray(build_batch([b"hello", b"world"], [b"k", None], [5, 6]))
    data[flip] ^= 0x04
    with pytest.raises(RemoteProtocolError) as caught:
        batch_spans(bytes(data))
    assert caught.value.error_code is ErrorCode.CORRUPT_MESSAGE


def test_a_torn_batch_is_malformed() -> None:
    data = build_batch([b"hello"]) + build_batch([b"world"])
    for cut in (1, HEADER_SIZE - 1, HEADER_SIZE + 3):
        with pytest.raises(RemoteProtocolError) as caught:
            batch_spans(data[: len(data) - cut])
        assert caught.value.error_code is ErrorCode.MALFORMED_FRAME


@pytest.mark.parametrize("codec", [Compression.ZSTD, Compression.LZ4])
def test_a_decompression_bomb_is_refused_unopened(codec: Compression) -> None:
    huge = b"\0" * (MAX_SECTION_BYTES + 1)
    body = (
        zstandard.ZstdCompressor().compress(huge)
        if codec is Compression.ZSTD
        else lz4.frame.compress(huge)
    )
    # a real header around the bomb, its CRC made right: only the records section lies
    batch = encode_batch(b"", 1, first_timestamp_ms=-1, max_timestamp_ms=-1)
    data = bytearray(batch[:HEADER_SIZE] + body)
    struct.pack_into(">i", data, 8, len(data) - 12)
    struct.pack_into(">h", data, 25, int(codec) | 0x08)
    struct.pack_into(">I", data, 20, zlib.crc32(bytes(data[24:])))
    (received,) = read_batches(bytes(data))
    with pytest.raises(RemoteProtocolError) as caught:
        received.values()
    assert caught.value.error_code is ErrorCode.CORRUPT_MESSAGE


def test_lengths_that_run_past_the_records_are_corrupt() -> None:
    section = struct.pack("<iii", 0, -1, 1000) + b"short"
    data = encode_batch(section, 1, first_timestamp_ms=-1, max_timestamp_ms=-1)
    (received,) = read_batches(data)
    with pytest.raises(RemoteProtocolError) as caught:
        received.values()
    assert caught.value.error_code is ErrorCode.CORRUPT_MESSAGE


def test_a_batch_claiming_more_records_than_it_holds_is_corrupt() -> None:
    # CRC-valid (a producer can make any bytes CRC-valid), but more records than 12 bytes hold
    for count in (2, MAX_RECORDS + 1):
        head = bytearray(
            encode_batch(
                struct.pack("<iii", 0, -1, 0), 1, first_timestamp_ms=-1, max_timestamp_ms=-1
            )
        )
        struct.pack_into(">i", head, 27, count - 1)  # last_offset_delta
        struct.pack_into(">i", head, 61, count)  # record_count
        struct.pack_into(">I", head, 20, zlib.crc32(bytes(head[24:])))
        with pytest.raises(RemoteProtocolError) as caught:
            batch_spans(bytes(head))
        assert caught.value.error_code is ErrorCode.CORRUPT_MESSAGE


def test_version_0_records_are_stored_in_batches_of_bounded_size() -> None:
    records = [Record(offset=-1, timestamp_ms=-1, key=None, value=b"x" * 1000)] * 1000
    spans = batch_spans(batches_from_records(records))
    assert sum(s.record_count for s in spans) == 1000
    assert max(s.size for s in spans) <= RECORDS_BATCH_BYTES


def test_length_columns_are_checked_across_the_chunks_a_check_takes_at_a_time() -> None:
    from protocol.batches import _CHUNK, _column_total

    n = 2 * _CHUNK + 5
    lengths = array("i", [1, -1] * (n // 2) + [3])
    assert _column_total(lengths.tobytes(), 0, n) == n // 2 + 3
    assert _column_total(lengths.tobytes(), 4 * 3, n - 3) == n // 2 + 3 - 2  # 1, null, 1 left out
    lengths[_CHUNK + 7] = -2  # in the second chunk
    assert _column_total(lengths.tobytes(), 0, n) is None
    assert _column_total(array("i", [0, 5, -1]).tobytes(), 0, 3, lowest=0) is None
    assert _column_total(array("i", [0, 5, 2]).tobytes(), 0, 3, lowest=0) == 7


def test_bounded_records_from_inside_a_batch_are_the_records_a_whole_decode_gives() -> None:
    values = [None if i % 5 == 0 else b"v" * (i % 7) for i in range(50)]
    keys = [None if i % 3 == 0 else b"k%d" % i for i in range(50)]
    stamps = [1_000 + i for i in range(50)]
    batch = build_batch(values, keys, stamps, base_offset=100)
    whole = records_from_batches(batch)
    for first in (100, 117, 149):
        for max_bytes in (1, 100, 10_000):
            part = records_from_batches(batch, first, max_bytes)
            assert part == whole[first - 100 : first - 100 + len(part)]
            assert len(part) == 1 or sum(map(record_size, part)) <= max_bytes
            if max_bytes == 10_000:
                assert part[-1] == whole[-1]
