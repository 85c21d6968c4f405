"""Bytes written out by hand from SPEC.md's worked example: the spec and the code must agree."""

from __future__ import annotations

import pathlib
import re

import attrs
import pytest

from protocol import (
    Connection,
    DescribeGroupRequest,
    DescribeGroupResponse,
    ErrorCode,
    LocalProtocolError,
    PartitionOffset,
    PingRequest,
    PingResponse,
    Record,
    Request,
    Response,
    Role,
    encode_record,
)
from protocol.batches import batch_spans, build_batch, read_batches, stamp
from protocol.versions import fit

SPEC = pathlib.Path(__file__).resolve().parents[2] / "protocol" / "SPEC.md"

PING = PingRequest(
    coordinator_epoch=5, generation=2, consumer_id="c1", num_retries=1, acknowledged_frames=86
)
PING_V0_BODY = (
    "00 00 00 00 00 00 00 05"  # coordinator_epoch = 5
    "00 00 00 02"  # generation = 2
    "00 02 63 31"  # consumer_id = "c1"
    "00 00 00 01"  # num_retries = 1
)
PING_FRAME = bytes.fromhex(
    "00 00 00 29"  # size = 41
    "00"  # kind = request
    "00 05"  # api_key = PING
    "00 01"  # api_version = 1
    "00 00 00 2a"  # correlation_id = 42
    "00 02 62 31"  # client_id = "b1"
    + PING_V0_BODY
    + "00 00 00 00 00 00 00 56"  # acknowledged_frames = 86
)
PING_V0_FRAME = bytes.fromhex(
    "00 00 00 21 00 00 05 00 00 00 00 00 2a 00 02 62 31"  # size 33, request, PING, v0, corr. 42
    + PING_V0_BODY
)
PONG = PingResponse(
    error_code=ErrorCode.NONE,
    consumer_id="c1",
    offsets=(PartitionOffset(topic="t", partition=0, offset=17),),
)
PONG_BODY = (
    "00 00"  # error_code = NONE
    "00 02 63 31"  # consumer_id = "c1"
    "00 00 00 01"  # one offset:
    "00 01 74 00 00 00 00 00 00 00 00 00 00 00 11"  # "t", 0, 17
)
PONG_FRAME = bytes.fromhex(
    "00 00 00 22 01 00 05 00 01 00 00 00 2a"  # size 34, response, PING, v1, correlation 42
    + PONG_BODY
)
PONG_V0_FRAME = bytes.fromhex("00 00 00 22 01 00 05 00 00 00 00 00 2a" + PONG_BODY)
DESCRIBE = DescribeGroupRequest(group_id="g")
DESCRIBED = DescribeGroupResponse(
    error_code=ErrorCode.NONE,
    group_id="g",
    state="Stable",
    generation=3,
    members=(),
    offsets=(PartitionOffset(topic="t", partition=0, offset=5),),
    reported_offsets=(PartitionOffset(topic="t", partition=0, offset=9),),
)
DESCRIBED_V1_FRAME = bytes.fromhex(
    "00 00 00 44 01 00 0d 00 01 00 00 00 07"  # size 68, response, DESCRIBE_GROUP, v1, corr. 7
    "00 00"  # error_code = NONE
    "00 01 67"  # group_id = "g"
    "00 06 53 74 61 62 6c 65"  # state = "Stable"
    "00 00 00 03"  # generation = 3
    "00 00 00 00"  # no members
    "00 00 00 01 00 01 74 00 00 00 00 00 00 00 00 00 00 00 05"  # offsets: "t", 0, 5
    "00 00 00 01 00 01 74 00 00 00 00 00 00 00 00 00 00 00 09"  # reported_offsets: "t", 0, 9
)
DESCRIBED_V2_FRAME = (
    bytes.fromhex("00 00 00 48 01 00 0d 00 02 00 00 00 07")  # size 72, v2
    + DESCRIBED_V1_FRAME[13:]
    + bytes.fromhex("00 00 00 00")  # no member_hosts
)
DESCRIBED_V3_FRAME = (
    bytes.fromhex("00 00 00 4c 01 00 0d 00 03 00 00 00 07")  # size 76, v3
    + DESCRIBED_V2_FRAME[13:]
    + bytes.fromhex("00 00 00 00")  # no member awaited
)
DESCRIBED_V0_FRAME = bytes.fromhex(
    "00 00 00 31 01 00 0d 00 00 00 00 00 07"  # size 49, response, DESCRIBE_GROUP, v0, corr. 7
    "00 00 00 01 67 00 06 53 74 61 62 6c 65 00 00 00 03 00 00 00 00"
    "00 00 00 01 00 01 74 00 00 00 00 00 00 00 00 00 00 00 05"  # offsets: "t", 0, 5; no more
)
ERROR_FRAME = bytes.fromhex("00 00 00 0f 02 00 03 00 00 00 00 00 07 00 23 00 02 76 31")
RECORD = bytes.fromhex(
    "ff ff ff ff ff ff ff ff 0b c8 24 eb 00 00 00 00 00 00 03 e8 ff ff ff ff 00 00 00 02 68 69"
)


BATCH = bytes.fromhex(
    "00 00 00 00 00 00 00 00 00 00 00 52 ff ff ff ff ff ff ff ff"  # base 0, length 82, no time
    "6a 54 99 b7 02 00 00 00 00 00 01"  # crc, magic 2, attributes 0, last_offset_delta 1
    "00 00 00 00 00 00 03 e8 00 00 00 00 00 00 03 ed"  # first and max timestamp: 1000, 1005
    "ff ff ff ff ff ff ff ff ff ff ff ff ff ff 00 00 00 02"  # reserved -1s, record_count 2
    "00 00 00 00 05 00 00 00 ff ff ff ff 01 00 00 00 02 00 00 00 02 00 00 00"  # the columns
    "6b 68 69 79 6f"  # "k", "hi", "yo"
)
STORED_BATCH = (
    bytes.fromhex("00 00 00 00 00 00 00 07 00 00 00 52 00 00 01 8b cf e5 68 00") + BATCH[20:]
)


HEADERS_BATCH = bytes.fromhex(
    "00 00 00 00 00 00 00 00 00 00 00 52 ff ff ff ff ff ff ff ff 2c 5a 6f 16 02 00 10"
    " 00 00 00 00 00 00 00 00 00 00 03 e8 00 00 00 00 00 00 03 e8"
    " ff ff ff ff ff ff ff ff ff ff ff ff ff ff 00 00 00 01"
    " 00 00 00 00 01 00 00 00 01 00 00 00 6b 76"
    " 0b 00 00 00 02 00 00 00 69 64 01 00 00 00 37"
)


def _spec_blocks() -> list[bytes]:
    """The hex of every code block in SPEC.md's worked-example section, comments dropped."""
    section = SPEC.read_text().split("## 10. Worked example", 1)[1]
    blocks = re.findall(r"```\n(.*?)```", section, flags=re.S)
    out = []
    for block in blocks:
        hex_text = " ".join(
            re.match(r"\s*((?:[0-9a-f]{2} ?)+)", line).group(1)  # type: ignore[union-attr]
            for line in block.splitlines()
            if re.match(r"\s*[0-9a-f]{2}( |$)", line)
        )
        out.append(bytes.fromhex(hex_text))
    return out


def test_ping_request_bytes() -> None:
    broker = Connection(Role.BROKER, client_id="b1")
    assert broker.send(Request(correlation_id=42, message=PING, client_id="b1")) == PING_FRAME
    consumer = Connection(Role.CONSUMER)
    consumer.receive_data(PING_FRAME)
    assert consumer.next_event() == Request(correlation_id=42, message=PING, client_id="b1")


def test_ping_response_bytes() -> None:
    broker = Connection(Role.BROKER)
    consumer = Connection(Role.CONSUMER)
    consumer.receive_data(PING_FRAME)
    request = consumer.next_event()
    assert isinstance(request, Request)
    assert consumer.send(request.response(PONG)) == PONG_FRAME
    broker.send(Request(correlation_id=42, message=PING, client_id="b1"))
    broker.receive_data(PONG_FRAME)
    assert broker.next_event() == Response(correlation_id=42, message=PONG, request=PING)


def test_a_version_0_ping_names_no_frame_and_is_answered_in_version_0() -> None:
    """An older coordinator's Ping lacks ``acknowledged_frames``: it decodes as -1, which renews
    no lease (SPEC.md §1), and its answer goes back in version 0."""
    consumer = Connection(Role.CONSUMER)
    consumer.receive_data(PING_V0_FRAME)
    request = consumer.next_event()
    assert request == Request(
        correlation_id=42,
        message=attrs.evolve(PING, acknowledged_frames=-1),
        client_id="b1",
        api_version=0,
    )
    assert isinstance(request, Request)
    assert consumer.send(request.response(PONG)) == PONG_V0_FRAME
    coordinator = Connection(Role.BROKER, client_id="b1")
    with pytest.raises(LocalProtocolError, match="cannot carry acknowledged_frames"):
        coordinator.send(Request(correlation_id=42, message=PING, client_id="b1", api_version=0))
    sent = coordinator.send(
        Request(correlation_id=42, message=fit(PING, 0), client_id="b1", api_version=0)
    )
    assert sent == PING_V0_FRAME


def _describe_request_frame(version: int) -> bytes:
    return bytes.fromhex(
        f"00 00 00 0e 00 00 0d 00 {version:02x} 00 00 00 07"  # request, DESCRIBE_GROUP, corr. 7
        "00 00"  # client_id = ""
        "00 01 67"  # group_id = "g"
    )


def test_describe_group_is_answered_in_the_version_it_was_asked_in() -> None:
    for version, frame in [
        (3, DESCRIBED_V3_FRAME),
        (2, DESCRIBED_V2_FRAME),
        (1, DESCRIBED_V1_FRAME),
        (0, DESCRIBED_V0_FRAME),
    ]:
        broker = Connection(Role.BROKER)
        broker.receive_data(_describe_request_frame(version))
        request = broker.next_event()
        assert request == Request(correlation_id=7, message=DESCRIBE, api_version=version)
        assert isinstance(request, Request)
        assert broker.send(request.response(DESCRIBED)) == frame


def test_a_client_sends_the_newest_describe_group_and_reads_either_version() -> None:
    client = Connection(Role.CONSUMER)
    assert client.send(Request(correlation_id=7, message=DESCRIBE)) == _describe_request_frame(3)
    client.receive_data(DESCRIBED_V3_FRAME)
    assert client.next_event() == Response(correlation_id=7, message=DESCRIBED, request=DESCRIBE)

    old_client = Connection(Role.CONSUMER)
    sent = old_client.send(Request(correlation_id=7, message=DESCRIBE, api_version=0))
    assert sent == _describe_request_frame(0)
    old_client.receive_data(DESCRIBED_V0_FRAME)
    without_reported = DescribeGroupResponse(
        error_code=ErrorCode.NONE,
        group_id="g",
        state="Stable",
        generation=3,
        members=(),
        offsets=DESCRIBED.offsets,
    )
    assert old_client.next_event() == Response(
        correlation_id=7, message=without_reported, request=DESCRIBE
    )


def test_error_frame_bytes() -> None:
    frame = Connection(Role.BROKER).send_error(
        ErrorCode.UNSUPPORTED_VERSION, "v1", correlation_id=7, api_key=3
    )
    assert frame == ERROR_FRAME


def test_record_bytes() -> None:
    record = Record(offset=-1, timestamp_ms=1000, key=None, value=b"hi")
    assert encode_record(record) == RECORD


def test_batch_bytes_as_a_producer_builds_them() -> None:
    assert build_batch([b"hi", b"yo"], [None, b"k"], [1000, 1005]) == BATCH


def test_a_broker_stamps_a_batch_without_touching_its_crc_and_a_consumer_reads_it_back() -> None:
    data = bytearray(BATCH)
    spans = batch_spans(data)
    assert stamp(data, spans, 7, 1_700_000_000_000) == 9
    assert bytes(data) == STORED_BATCH
    (batch,) = read_batches(bytes(data))
    assert list(batch) == [(7, 1000, None, b"hi"), (8, 1005, b"k", b"yo")]
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (-1, -1, -1)


def test_spec_shows_the_same_bytes() -> None:
    assert _spec_blocks() == [
        PING_FRAME,
        PONG_FRAME,
        DESCRIBED_V1_FRAME,
        ERROR_FRAME,
        RECORD,
        BATCH,
        STORED_BATCH,
        HEADERS_BATCH,
    ]


def test_headers_bytes_as_a_producer_builds_them_and_a_consumer_reads_them() -> None:
    assert build_batch([b"v"], [b"k"], [1000], headers=[[("id", b"7")]]) == HEADERS_BATCH
    (batch,) = read_batches(HEADERS_BATCH)
    assert batch.headers() == [(("id", b"7"),)]
    assert list(batch) == [(0, 1000, b"k", b"v")]
    # a batch without headers has no headers column: the bytes it always had
    (plain,) = read_batches(BATCH)
    assert plain.headers() == [(), ()]
