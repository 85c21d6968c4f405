"""Records: round trips, a log file as plain concatenation, and CRC protection."""

from __future__ import annotations

import struct
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol import (
    Connection,
    ConnectionState,
    ErrorCode,
    FetchRequest,
    FetchResponse,
    LocalProtocolError,
    Record,
    RemoteProtocolError,
    Request,
    Role,
    decode_record,
    encode_record,
    record_size,
)
from protocol.records import RECORD_OVERHEAD
from tests.protocol.strategies import records

OFFSET_AND_CRC = 12  # bytes before the part the CRC covers


@given(records)
def test_a_record_round_trips(record: Record) -> None:
    data = encode_record(record)
    assert len(data) == record_size(record)
    assert decode_record(data) == (record, len(data))


@given(st.lists(records, max_size=6))
def test_a_log_is_records_back_to_back(log: list[Record]) -> None:
    data = b"".join(encode_record(r) for r in log)
    decoded, pos = [], 0
    while pos < len(data):
        record, pos = decode_record(data, pos)
        decoded.append(record)
    assert decoded == log
    assert pos == len(data)


def test_the_crc_covers_timestamp_key_and_value_but_not_the_offset() -> None:
    record = Record(offset=-1, timestamp_ms=1000, key=b"k", value=b"v")
    data = encode_record(record)
    (crc,) = struct.unpack_from(">I", data, 8)
    assert crc == zlib.crc32(data[OFFSET_AND_CRC:])
    # A broker stamps the offset without touching the CRC.
    stamped = struct.pack(">q", 42) + data[8:]
    assert decode_record(stamped)[0] == Record(offset=42, timestamp_ms=1000, key=b"k", value=b"v")


@given(records, st.data())
def test_any_flipped_bit_in_the_crc_or_the_covered_part_is_caught(
    record: Record, data: st.DataObject
) -> None:
    encoded = bytearray(encode_record(record))
    bit = data.draw(st.integers(8 * 8, 8 * len(encoded) - 1), label="bit")
    encoded[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises(RemoteProtocolError) as info:
        decode_record(bytes(encoded))
    # A flipped length may make the record look cut short instead; either way it is refused.
    assert info.value.error_code in (ErrorCode.CORRUPT_MESSAGE, ErrorCode.MALFORMED_FRAME)


@given(records, st.data())
def test_a_flipped_payload_bit_is_a_crc_mismatch(record: Record, data: st.DataObject) -> None:
    encoded = bytearray(encode_record(record))
    # The timestamp's bytes: never a length, so the only possible failure is the CRC.
    index = data.draw(st.integers(OFFSET_AND_CRC, OFFSET_AND_CRC + 7), label="byte")
    encoded[index] ^= 0x01
    with pytest.raises(RemoteProtocolError) as info:
        decode_record(bytes(encoded))
    assert info.value.error_code is ErrorCode.CORRUPT_MESSAGE


@given(records, st.data())
def test_a_torn_tail_is_malformed(record: Record, data: st.DataObject) -> None:
    encoded = encode_record(record)
    cut = data.draw(st.integers(0, len(encoded) - 1), label="cut")
    with pytest.raises(RemoteProtocolError) as info:
        decode_record(encoded[:cut])
    assert info.value.error_code is ErrorCode.MALFORMED_FRAME


def test_decode_record_respects_an_end_bound() -> None:
    encoded = encode_record(Record(offset=0, timestamp_ms=0, key=None, value=b"abc"))
    with pytest.raises(RemoteProtocolError):
        decode_record(encoded + b"pad", 0, len(encoded) - 1)
    assert decode_record(b"xx" + encoded + b"pad", 2, 2 + len(encoded))[1] == 2 + len(encoded)


def test_the_smallest_record() -> None:
    empty = Record(offset=0, timestamp_ms=0, key=None, value=None)
    assert len(encode_record(empty)) == RECORD_OVERHEAD == 28


@pytest.mark.parametrize(
    "record",
    [
        Record(offset=2**63, timestamp_ms=0, key=None, value=None),
        Record(offset=0, timestamp_ms=-(2**63) - 1, key=None, value=None),
        Record(offset=0, timestamp_ms=0, key="text", value=None),  # type: ignore[arg-type]
    ],
)
def test_unencodable_records_are_local_errors(record: Record) -> None:
    with pytest.raises(LocalProtocolError):
        encode_record(record)


def test_a_corrupt_record_in_a_fetch_response_breaks_the_connection() -> None:
    consumer = Connection(Role.CONSUMER)
    broker = Connection(Role.BROKER)
    fetch = FetchRequest(topic="t", partition=0, offset=0, max_bytes=1000)
    broker.receive_data(consumer.send(consumer.new_request(fetch)))
    request = broker.next_event()
    assert isinstance(request, Request)
    record = Record(offset=0, timestamp_ms=5, key=None, value=b"payload")
    response = FetchResponse(
        error_code=ErrorCode.NONE, high_watermark=1, log_start_offset=0, records=(record,)
    )
    frame = bytearray(broker.send(request.response(response)))
    frame[frame.rindex(b"payload")] ^= 0x20
    consumer.receive_data(bytes(frame))
    with pytest.raises(RemoteProtocolError) as info:
        consumer.next_event()
    assert info.value.error_code is ErrorCode.CORRUPT_MESSAGE
    assert (info.value.correlation_id, info.value.api_key) == (0, 1)
    assert consumer.state is ConnectionState.ERROR
    assert consumer.outstanding_requests == {0}
