"""Fetched record batches as Arrow record batches, with no Python object per row.

A stored batch's records section keeps its key and value lengths apart from their bytes
(SPEC.md §6.2), as little-endian int32 arrays: Arrow's own layout for a binary column is a
validity bitmap, int32 offsets (the running sum of the lengths) and the bytes, so each column is
the section's buffer wrapped as it is plus a cumulative sum. Only whole-column array operations
run here; the Python cost is per stored batch, not per row.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from protocol import ErrorCode, RemoteProtocolError
from protocol.batches import APPEND_TIME, RecordBatch

ARROW_SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
    ]
)
_ZERO = pa.array([0], pa.int32())


def _lengths(buf: pa.Buffer, at: int, n: int) -> pa.Array:
    if sys.byteorder != "little":  # the section's arrays are little-endian; Arrow's are native
        swapped = array("i")
        swapped.frombytes(buf.slice(at, 4 * n).to_pybytes())
        swapped.byteswap()
        return pa.array(swapped, pa.int32())
    return pa.Array.from_buffers(pa.int32(), n, [None, buf.slice(at, 4 * n)])


def _binary(buf: pa.Buffer, lengths: pa.Array, data_at: int) -> pa.Array:
    """A binary column over ``buf`` from ``data_at``, with these lengths (-1: null)."""
    n = len(lengths)
    valid = pc.greater_equal(lengths, 0)
    sizes = pc.max_element_wise(lengths, 0)
    offsets = pa.concat_arrays([_ZERO, pc.cast(pc.cumulative_sum(sizes), pa.int32())])
    validity = None if pc.all(valid).as_py() else valid.buffers()[1]
    total = offsets[n].as_py()
    if data_at + total > buf.size:
        raise RemoteProtocolError(
            f"record lengths run {data_at + total - buf.size} bytes past their batch",
            ErrorCode.CORRUPT_MESSAGE,
        )
    return pa.Array.from_buffers(
        pa.binary(), n, [validity, offsets.buffers()[1], buf.slice(data_at, total)]
    )


def batch_columns(batch: RecordBatch) -> tuple[pa.Array, pa.Array, pa.Array, pa.Array]:
    """``(offset, key, value, timestamp)`` columns of every record of one stored batch."""
    section, key_lengths_at, value_lengths_at, keys_at, values_at = batch.columns()
    n = batch.record_count
    buf = pa.py_buffer(section)
    keys = _binary(buf, _lengths(buf, key_lengths_at, n), keys_at)
    values = _binary(buf, _lengths(buf, value_lengths_at, n), values_at)
    try:  # lengths that run past the section must fail here, not when a reader touches them
        keys.validate(full=True)
        values.validate(full=True)
    except pa.ArrowInvalid as exc:
        raise RemoteProtocolError(
            f"batch at offset {batch.base_offset}: {exc}", ErrorCode.CORRUPT_MESSAGE
        ) from exc
    ones = pa.repeat(pa.scalar(1, pa.int64()), n)
    offsets = pc.add(pc.cumulative_sum(ones), batch.base_offset - 1)
    if batch.attributes & APPEND_TIME:
        micros = pa.repeat(pa.scalar(batch.append_time_ms * 1000, pa.int64()), n)
    else:
        deltas = pc.cast(_lengths(buf, 0, n), pa.int64())
        micros = pc.multiply(pc.add(deltas, batch.first_timestamp_ms), 1000)
    timestamps = pc.cast(micros, pa.timestamp("us", tz="UTC"))
    return offsets, keys, values, timestamps


def arrow_batch(
    topic: str, partition: int, batches: Sequence[RecordBatch], start: int, end: int
) -> pa.RecordBatch | None:
    """The records of ``batches`` with offsets in [start, end) as one Arrow record batch in the
    source's schema (None: no such record)."""
    columns: list[list[pa.Array]] = [[], [], [], []]
    for batch in batches:
        first = max(start, batch.base_offset)
        stop = min(end, batch.next_offset)
        if first >= stop:
            continue
        for column, values in zip(columns, batch_columns(batch), strict=True):
            column.append(values.slice(first - batch.base_offset, stop - first))
    if not columns[0]:
        return None
    offsets, keys, values, timestamps = (
        c[0] if len(c) == 1 else pa.concat_arrays(c) for c in columns
    )
    n = len(offsets)
    return pa.RecordBatch.from_arrays(
        [
            pa.repeat(pa.scalar(topic, pa.string()), n),
            pa.repeat(pa.scalar(partition, pa.int32()), n),
            offsets,
            keys,
            values,
            timestamps,
        ],
        schema=ARROW_SCHEMA,
    )
