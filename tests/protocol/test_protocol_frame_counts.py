"""Each end of a connection counts the whole frames it sent and received: a coordinator request's
``acknowledged_frames`` is the coordinator's received count, and the consumer's lease runs from its
own queue time of that frame (SPEC.md §1), so the two counts must agree frame for frame."""

from __future__ import annotations

import pytest

from protocol import (
    NEED_DATA,
    Connection,
    ErrorCode,
    LocalProtocolError,
    OffsetCommitRequest,
    OffsetCommitResponse,
    PeerError,
    PingRequest,
    PingResponse,
    Request,
    Role,
)

PING = PingRequest(
    coordinator_epoch=1, generation=1, consumer_id="c", num_retries=0, acknowledged_frames=0
)
PONG = PingResponse(error_code=ErrorCode.NONE, consumer_id="c", offsets=())
COMMIT = OffsetCommitRequest(group_id="g", consumer_id="c", generation=1, offsets=())


def test_a_fresh_connection_has_counted_nothing() -> None:
    connection = Connection(Role.CONSUMER)
    assert (connection.frames_sent, connection.frames_received) == (0, 0)


def test_requests_responses_and_error_frames_count_on_both_ends() -> None:
    consumer, broker = Connection(Role.CONSUMER), Connection(Role.BROKER)
    broker.receive_data(consumer.send(consumer.new_request(COMMIT)))  # consumer frame 1
    consumer.receive_data(broker.send(broker.new_request(PING)))  # broker frame 1
    ping = consumer.next_event()
    assert isinstance(ping, Request)
    broker.receive_data(consumer.send(ping.response(PONG)))  # consumer frame 2
    assert consumer.frames_sent == 2
    assert consumer.frames_received == 1
    assert broker.frames_received == 0  # bytes buffered are not frames yet
    commit = broker.next_event()
    assert isinstance(commit, Request)
    assert broker.frames_received == 1
    broker.next_event()
    assert broker.frames_received == 2 == consumer.frames_sent
    broker.receive_data(consumer.send_error(ErrorCode.INVALID_REQUEST, "bye"))  # frame 3
    assert consumer.frames_sent == 3
    assert isinstance(broker.next_event(), PeerError)
    assert broker.frames_received == 3


def test_a_partial_frame_is_not_counted_until_its_last_byte() -> None:
    consumer, broker = Connection(Role.CONSUMER), Connection(Role.BROKER)
    frame = consumer.send(consumer.new_request(COMMIT))
    broker.receive_data(frame[:-1])
    assert broker.next_event() is NEED_DATA
    assert broker.frames_received == 0
    broker.receive_data(frame[-1:])
    assert isinstance(broker.next_event(), Request)
    assert broker.frames_received == 1


def test_a_refused_send_counts_nothing() -> None:
    """A send that raises sends no bytes, so it must not count, or the peer's count would name
    an earlier frame than ours for every later one: harmless but renewing less."""
    consumer = Connection(Role.CONSUMER, max_frame_size=64)
    big = OffsetCommitRequest(group_id="g" * 100, consumer_id="c", generation=1, offsets=())
    with pytest.raises(LocalProtocolError):
        consumer.send(consumer.new_request(big))
    with pytest.raises(LocalProtocolError):
        consumer.send(consumer.new_request(PING))  # a consumer may not send Ping
    with pytest.raises(LocalProtocolError):  # nothing to answer
        consumer.send(
            Request(correlation_id=3, message=COMMIT).response(
                OffsetCommitResponse(error_code=ErrorCode.NONE)
            )
        )
    assert consumer.frames_sent == 0
