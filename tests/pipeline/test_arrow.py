"""Fetched record batches become Arrow columns by array operations over the batch's own buffers:
the rows must be exactly the records, nulls, skipped offsets and compression included."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest

from pipeline.arrow import ARROW_SCHEMA, arrow_batch
from protocol.batches import Compression, batch_spans, build_batch, read_batches, stamp


def stored(data: bytes, base: int, append_time_ms: int = 0) -> bytes:
    buf = bytearray(data)
    stamp(buf, batch_spans(buf), base, append_time_ms)
    return bytes(buf)


@pytest.mark.parametrize("compression", list(Compression))
def test_columns_are_the_records_from_the_start_offset_to_the_end(
    compression: Compression,
) -> None:
    first = build_batch(
        [b"a", None, b"", b"dddd"],
        [None, b"k1", b"k2", None],
        [1000, 1001, 999, 1005],
        compression=compression,
    )
    second = build_batch([b"e" * 300, b"f"], compression=compression)  # the broker's time
    fetched = read_batches(stored(first, 10) + stored(second, 14, append_time_ms=2_000_000))
    arrow = arrow_batch("t", 3, fetched, 11, 15)
    assert arrow is not None
    assert arrow.schema == ARROW_SCHEMA

    def at(ms: int) -> dt.datetime:
        return dt.datetime.fromtimestamp(ms / 1000, dt.UTC)

    assert arrow.to_pylist() == [
        {
            "topic": "t",
            "partition": 3,
            "offset": 11,
            "key": b"k1",
            "value": None,
            "timestamp": at(1001),
        },
        {
            "topic": "t",
            "partition": 3,
            "offset": 12,
            "key": b"k2",
            "value": b"",
            "timestamp": at(999),
        },
        {
            "topic": "t",
            "partition": 3,
            "offset": 13,
            "key": None,
            "value": b"dddd",
            "timestamp": at(1005),
        },
        {
            "topic": "t",
            "partition": 3,
            "offset": 14,
            "key": None,
            "value": b"e" * 300,
            "timestamp": at(2_000_000),
        },
    ]
    assert arrow_batch("t", 3, fetched, 16, 20) is None


def test_a_value_column_shares_the_batch_buffer() -> None:
    (batch,) = read_batches(build_batch([b"x" * 100] * 1000))
    arrow = arrow_batch("t", 0, [batch], 0, 1000)
    assert arrow is not None
    values = arrow.column("value")
    assert isinstance(values, pa.BinaryArray)
    # the bytes are the batch's records section as it is, not a copy built row by row
    assert values.buffers()[2].address == pa.py_buffer(batch.section()).address + 12 * 1000
