"""Correlation, matching and role rules, and what LocalProtocolError promises (nothing changed)."""

from __future__ import annotations

from collections.abc import Callable

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol import (
    COORDINATOR_REQUESTS,
    NEED_DATA,
    ApiKey,
    Connection,
    ConnectionClosed,
    ConnectionState,
    CreateTopicRequest,
    ErrorCode,
    FetchRequest,
    FetchResponse,
    GroupSummary,
    ListGroupsRequest,
    ListGroupsResponse,
    LocalProtocolError,
    OffsetCommitResponse,
    PeerError,
    PingRequest,
    PingResponse,
    ProduceRequest,
    Record,
    RemoteProtocolError,
    Request,
    RequestMessage,
    Response,
    Role,
    StopFetcherRequest,
)
from tests.protocol.protocol_testing import SAMPLE_REQUESTS, drain, raw_frame, string

PING = PingRequest(coordinator_epoch=3, generation=1, consumer_id="c", num_retries=0)
PONG = PingResponse(error_code=ErrorCode.NONE, consumer_id="c", offsets=())
LIST = ListGroupsRequest()
LISTED = ListGroupsResponse(error_code=ErrorCode.NONE, groups=())


def _pair() -> tuple[Connection, Connection]:
    return Connection(Role.CONSUMER, client_id="cons"), Connection(Role.BROKER, client_id="brk")


def _deliver(sender: Connection, receiver: Connection, event: Request | Response) -> list[object]:
    receiver.receive_data(sender.send(event))
    return list(drain(receiver))


# --- correlation ids ----------------------------------------------------------------------------


def test_each_direction_numbers_its_own_requests_from_zero() -> None:
    consumer, broker = _pair()
    assert [consumer.new_request(LIST).correlation_id for _ in range(3)] == [0, 1, 2]
    assert broker.new_request(PING).correlation_id == 0
    assert consumer.new_request(LIST).client_id == "cons"


def test_both_directions_may_use_the_same_correlation_id_at_once() -> None:
    consumer, broker = _pair()
    to_broker = consumer.new_request(LIST)
    to_consumer = broker.new_request(PING)
    assert to_broker.correlation_id == to_consumer.correlation_id == 0
    (received_list,) = _deliver(consumer, broker, to_broker)
    (received_ping,) = _deliver(broker, consumer, to_consumer)
    assert consumer.outstanding_requests == consumer.pending_requests == {0}
    assert isinstance(received_ping, Request) and isinstance(received_list, Request)
    assert _deliver(consumer, broker, received_ping.response(PONG)) == [
        Response(correlation_id=0, message=PONG, request=PING)
    ]
    assert _deliver(broker, consumer, received_list.response(LISTED)) == [
        Response(correlation_id=0, message=LISTED, request=LIST)
    ]


def test_correlation_ids_wrap_at_2_31_and_skip_outstanding_ones() -> None:
    consumer, _ = _pair()
    consumer.send(consumer.new_request(LIST))  # 0 stays outstanding
    consumer._next_correlation_id = 2**31 - 1
    assert consumer.new_request(LIST).correlation_id == 2**31 - 1
    assert consumer.new_request(LIST).correlation_id == 1  # wrapped past the outstanding 0


@pytest.mark.parametrize("correlation_id", [-1, 2**31])
def test_requests_must_carry_a_correlation_id_in_range(correlation_id: int) -> None:
    consumer, _ = _pair()
    with pytest.raises(LocalProtocolError):
        consumer.send(Request(correlation_id=correlation_id, message=LIST))


def test_a_peer_request_with_a_negative_correlation_id_is_refused() -> None:
    _, broker = _pair()
    broker.receive_data(raw_frame(api_key=12, correlation_id=-5))
    with pytest.raises(RemoteProtocolError) as info:
        broker.next_event()
    assert info.value.error_code is ErrorCode.INVALID_REQUEST


def test_a_peer_reusing_a_pending_correlation_id_is_refused() -> None:
    first, _ = _pair()
    second, broker = _pair()
    broker.receive_data(first.send(first.new_request(LIST)))
    broker.receive_data(second.send(second.new_request(LIST)))  # also correlation id 0
    assert isinstance(broker.next_event(), Request)
    with pytest.raises(RemoteProtocolError) as info:
        broker.next_event()
    assert info.value.error_code is ErrorCode.INVALID_REQUEST
    assert broker.state is ConnectionState.ERROR


def test_a_correlation_id_may_be_reused_once_answered() -> None:
    consumer, broker = _pair()
    for _ in range(2):
        (request,) = _deliver(consumer, broker, Request(correlation_id=7, message=LIST))
        assert isinstance(request, Request)
        _deliver(broker, consumer, request.response(LISTED))
    assert consumer.outstanding_requests == broker.pending_requests == frozenset()


# --- response matching --------------------------------------------------------------------------


def _unexpected(conn: Connection, frame: bytes) -> None:
    conn.receive_data(frame)
    with pytest.raises(RemoteProtocolError) as info:
        conn.next_event()
    assert info.value.error_code is ErrorCode.UNEXPECTED_RESPONSE
    assert conn.state is ConnectionState.ERROR


def test_a_response_to_nothing_is_unexpected() -> None:
    consumer, _ = _pair()
    _unexpected(consumer, raw_frame(kind=1, api_key=12, correlation_id=0, body=b"\0\0\0\0\0\0"))


def test_a_response_with_the_wrong_api_key_is_unexpected() -> None:
    consumer, _ = _pair()
    consumer.send(consumer.new_request(LIST))
    _unexpected(consumer, raw_frame(kind=1, api_key=10, correlation_id=0, body=b"\0\0"))
    # The outstanding request is still recorded (the error froze everything).
    assert consumer.outstanding_requests == {0}


def test_a_second_response_to_the_same_request_is_unexpected() -> None:
    consumer, broker = _pair()
    (request,) = _deliver(consumer, broker, consumer.new_request(LIST))
    assert isinstance(request, Request)
    frame = broker.send(request.response(LISTED))
    consumer.receive_data(frame)
    assert isinstance(consumer.next_event(), Response)
    _unexpected(consumer, frame)


def test_a_response_only_matches_requests_of_its_own_direction() -> None:
    consumer, broker = _pair()
    broker.send(broker.new_request(PING))  # the broker awaits PING 0, the consumer awaits nothing
    ping_response = raw_frame(kind=1, api_key=5, correlation_id=0, body=b"\0\0" + string("c"))
    _unexpected(consumer, ping_response + b"\0\0\0\0")


# --- roles --------------------------------------------------------------------------------------


@pytest.mark.parametrize("api_key", sorted(ApiKey))
def test_each_request_is_received_by_one_role_only(api_key: ApiKey) -> None:
    sender_role = Role.BROKER if api_key in COORDINATOR_REQUESTS else Role.CONSUMER
    wrong_receiver = Connection(sender_role)  # a side receiving what only it may send
    message = SAMPLE_REQUESTS[api_key]
    spoofer = Connection(sender_role)
    frame = spoofer.send(spoofer.new_request(message))
    _unexpected(wrong_receiver, frame)


@pytest.mark.parametrize("api_key", sorted(ApiKey))
def test_each_request_is_sent_by_one_role_only(api_key: ApiKey) -> None:
    sender_role = Role.BROKER if api_key in COORDINATOR_REQUESTS else Role.CONSUMER
    wrong_sender = Connection(Role.CONSUMER if sender_role is Role.BROKER else Role.BROKER)
    message = SAMPLE_REQUESTS[api_key]
    with pytest.raises(LocalProtocolError):
        wrong_sender.new_request(message)
    with pytest.raises(LocalProtocolError):
        wrong_sender.send(Request(correlation_id=0, message=message))
    assert wrong_sender.outstanding_requests == frozenset()


def test_coordinator_requests() -> None:
    assert {ApiKey.PING, ApiKey.STOP_FETCHER, ApiKey.START_FETCHER} == COORDINATOR_REQUESTS


# --- LocalProtocolError changes nothing ---------------------------------------------------------


def _snapshot(conn: Connection) -> tuple[object, ...]:
    return (conn.state, conn.outstanding_requests, conn.pending_requests, conn._next_correlation_id)


def _with_pending_list_request() -> tuple[Connection, Connection, Request]:
    consumer, broker = _pair()
    consumer.send(consumer.new_request(CreateTopicRequest(topic="x", partitions=1)))
    (request,) = _deliver(consumer, broker, consumer.new_request(LIST))
    assert isinstance(request, Request)
    return consumer, broker, request


def _req(message: RequestMessage) -> Request:
    return Request(correlation_id=5, message=message)


ILLEGAL_SENDS: dict[str, Callable[[Connection, Connection, Request], object]] = {
    "request outstanding twice": lambda c, b, r: c.send(Request(correlation_id=1, message=LIST)),
    "int32 out of range": lambda c, b, r: c.send(
        _req(FetchRequest(topic="t", partition=2**31, offset=0, max_bytes=1))
    ),
    "int64 out of range": lambda c, b, r: c.send(
        _req(FetchRequest(topic="t", partition=0, offset=-(2**63) - 1, max_bytes=1))
    ),
    "record field out of range": lambda c, b, r: c.send(
        _req(
            ProduceRequest(
                topic="t",
                partition=0,
                records=(Record(offset=-1, timestamp_ms=2**64, key=None, value=b""),),
            )
        )
    ),
    "string too long": lambda c, b, r: c.send(
        _req(CreateTopicRequest(topic="x" * 40000, partitions=1))
    ),
    "lone surrogate": lambda c, b, r: c.send(
        _req(CreateTopicRequest(topic="\ud800", partitions=1))
    ),
    "null where not nullable": lambda c, b, r: c.send(
        _req(CreateTopicRequest(topic=None, partitions=1))  # type: ignore[arg-type]
    ),
    "wrong type in a field": lambda c, b, r: c.send(
        _req(CreateTopicRequest(topic="x", partitions="1"))  # type: ignore[arg-type]
    ),
    "not a message": lambda c, b, r: c.send(Request(correlation_id=9, message=object())),  # type: ignore[arg-type]
    "not an event": lambda c, b, r: c.send(LIST),  # type: ignore[arg-type]
    "role may not send": lambda c, b, r: c.send(Request(correlation_id=9, message=PING)),
    "response to nothing": lambda c, b, r: b.send(
        Response(correlation_id=5, message=LISTED, request=LIST)
    ),
    "response of the wrong type": lambda c, b, r: b.send(
        Response(
            correlation_id=r.correlation_id,
            message=OffsetCommitResponse(error_code=ErrorCode.NONE),
            request=r.message,
        )
    ),
    "response naming another request": lambda c, b, r: b.send(
        Response(correlation_id=r.correlation_id, message=LISTED, request=PING)
    ),
    "response field out of range": lambda c, b, r: b.send(
        r.response(ListGroupsResponse(error_code=2**15, groups=()))  # type: ignore[arg-type]
    ),
}


@pytest.mark.parametrize("case", sorted(ILLEGAL_SENDS))
def test_local_protocol_errors_change_nothing(case: str) -> None:
    consumer, broker, request = _with_pending_list_request()
    before = (_snapshot(consumer), _snapshot(broker))
    with pytest.raises(LocalProtocolError):
        ILLEGAL_SENDS[case](consumer, broker, request)
    assert (_snapshot(consumer), _snapshot(broker)) == before
    # ... and both sides carry on as if nothing had happened.
    assert _deliver(broker, consumer, request.response(LISTED)) == [
        Response(correlation_id=1, message=LISTED, request=LIST)
    ]


def test_a_request_larger_than_our_frame_limit_is_not_sent() -> None:
    consumer = Connection(Role.CONSUMER, max_frame_size=100)
    with pytest.raises(LocalProtocolError) as info:
        consumer.send(consumer.new_request(CreateTopicRequest(topic="x" * 100, partitions=1)))
    assert info.value.error_code is ErrorCode.FRAME_TOO_LARGE
    assert consumer.outstanding_requests == frozenset()


def test_a_response_larger_than_our_frame_limit_is_not_sent() -> None:
    consumer = Connection(Role.CONSUMER)
    broker = Connection(Role.BROKER, max_frame_size=100)
    (request,) = _deliver(consumer, broker, consumer.new_request(LIST))
    assert isinstance(request, Request)
    big = ListGroupsResponse(
        error_code=ErrorCode.NONE, groups=(GroupSummary(group_id="g" * 100, state="Stable"),)
    )
    with pytest.raises(LocalProtocolError) as info:
        broker.send(request.response(big))
    assert info.value.error_code is ErrorCode.FRAME_TOO_LARGE
    assert broker.pending_requests == {0}
    broker.send(request.response(LISTED))


def test_sending_in_closed_or_error_raises() -> None:
    consumer, _ = _pair()
    consumer.receive_data(b"")
    assert drain(consumer) == [ConnectionClosed()]
    with pytest.raises(LocalProtocolError):
        consumer.send(consumer.new_request(LIST))
    failed, _ = _pair()
    failed.send_failed()
    assert failed.state is ConnectionState.ERROR
    with pytest.raises(LocalProtocolError):
        failed.send(failed.new_request(LIST))
    with pytest.raises(RemoteProtocolError):
        failed.next_event()


# --- error frames -------------------------------------------------------------------------------


@given(
    st.sampled_from(ErrorCode),
    st.text(max_size=30),
    st.integers(-1, 2**31 - 1),
    st.sampled_from(Role),
)
def test_send_error_arrives_as_peer_error(
    code: ErrorCode, message: str, correlation_id: int, role: Role
) -> None:
    sender = Connection(role)
    receiver = Connection(Role.BROKER if role is Role.CONSUMER else Role.CONSUMER)
    receiver.receive_data(sender.send_error(code, message, correlation_id=correlation_id))
    assert sender.state is ConnectionState.ERROR
    assert receiver.next_event() == PeerError(
        error_code=code, message=message, correlation_id=correlation_id
    )
    assert receiver.state is ConnectionState.ERROR
    with pytest.raises(RemoteProtocolError) as info:
        receiver.next_event()
    assert info.value.error_code is code


def test_an_error_frame_after_a_normal_frame() -> None:
    consumer, broker = _pair()
    broker.receive_data(consumer.send(consumer.new_request(LIST)))
    broker.receive_data(consumer.send_error(ErrorCode.UNKNOWN_SERVER_ERROR, "bye"))
    event, peer_error = drain(broker)
    assert isinstance(event, Request)
    assert peer_error == PeerError(
        error_code=ErrorCode.UNKNOWN_SERVER_ERROR, message="bye", correlation_id=-1
    )


def test_send_error_is_allowed_in_error_and_after_close() -> None:
    consumer, _ = _pair()
    consumer.send_failed()
    assert consumer.send_error(ErrorCode.MALFORMED_FRAME, "x")
    closed, _ = _pair()
    closed.receive_data(b"")
    closed.next_event()
    assert closed.send_error(ErrorCode.MALFORMED_FRAME, "x")
    assert closed.state is ConnectionState.CLOSED


def test_an_unknown_error_code_reads_as_unknown_server_error() -> None:
    consumer, _ = _pair()
    consumer.receive_data(
        raw_frame(kind=2, api_key=-1, correlation_id=-1, body=b"\x10\x00" + string("?"))
    )
    event = consumer.next_event()
    assert isinstance(event, PeerError) and event.error_code is ErrorCode.UNKNOWN_SERVER_ERROR


def test_error_frames_are_read_whatever_their_version_or_api_key() -> None:
    consumer, _ = _pair()
    consumer.receive_data(
        raw_frame(kind=2, api_key=999, version=9, correlation_id=3, body=b"\x00\x23" + string("v"))
    )
    assert consumer.next_event() == PeerError(
        error_code=ErrorCode.UNSUPPORTED_VERSION, message="v", correlation_id=3
    )


def test_a_malformed_error_frame_is_malformed() -> None:
    consumer, _ = _pair()
    consumer.receive_data(raw_frame(kind=2, body=b"\x00\x01" + string("x") + b"!"))
    with pytest.raises(RemoteProtocolError) as info:
        consumer.next_event()
    assert info.value.error_code is ErrorCode.MALFORMED_FRAME


def test_an_over_long_error_message_is_cut_to_fit() -> None:
    consumer, broker = _pair()
    broker.receive_data(consumer.send_error(ErrorCode.INVALID_REQUEST, "é" * 20000))
    event = broker.next_event()
    assert isinstance(event, PeerError)
    assert event.message == "é" * 16383  # 32766 bytes: the last whole character that fits


# --- events -------------------------------------------------------------------------------------


def test_request_response_helper_names_the_request() -> None:
    request = Request(correlation_id=4, message=LIST, client_id="x")
    assert request.response(LISTED) == Response(correlation_id=4, message=LISTED, request=LIST)


def test_events_are_frozen() -> None:
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        Request(correlation_id=1, message=LIST).correlation_id = 2  # type: ignore[misc]


def test_need_data_is_a_singleton() -> None:
    consumer, _ = _pair()
    assert consumer.next_event() is NEED_DATA
    assert repr(NEED_DATA) == "NEED_DATA"


def test_fetch_records_survive_the_trip() -> None:
    consumer, broker = _pair()
    fetch = FetchRequest(topic="t", partition=0, offset=5, max_bytes=1 << 20)
    (request,) = _deliver(consumer, broker, consumer.new_request(fetch))
    assert isinstance(request, Request)
    records = tuple(
        Record(offset=5 + i, timestamp_ms=1000 + i, key=None, value=b"v%d" % i) for i in range(3)
    )
    response = FetchResponse(
        error_code=ErrorCode.NONE, high_watermark=8, log_start_offset=0, records=records
    )
    assert _deliver(broker, consumer, request.response(response)) == [
        Response(correlation_id=0, message=response, request=fetch)
    ]


def test_stop_fetcher_goes_from_broker_to_consumer() -> None:
    consumer, broker = _pair()
    stop = StopFetcherRequest(coordinator_epoch=1, generation=2, consumer_id="c")
    (request,) = _deliver(broker, consumer, broker.new_request(stop))
    assert request == Request(correlation_id=0, message=stop, client_id="brk")
    assert consumer.next_event() is NEED_DATA
