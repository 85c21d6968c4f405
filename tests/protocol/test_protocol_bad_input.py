"""Whatever the peer sends, the connection either makes whole events or raises RemoteProtocolError
with the right code, goes to ERROR and stays there; it never returns part of a frame."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol import (
    NEED_DATA,
    Connection,
    ConnectionClosed,
    ConnectionState,
    DescribeGroupRequest,
    ErrorCode,
    ListGroupsRequest,
    LocalProtocolError,
    OffsetFetchRequest,
    PingRequest,
    ProtocolError,
    RemoteProtocolError,
    Request,
    RequestMessage,
    Role,
)
from tests.protocol.protocol_testing import drain, ping_body, raw_frame, string
from tests.protocol.strategies import consumer_requests


def _ping_frame(correlation_id: int = 0) -> bytes:
    broker = Connection(Role.BROKER)
    ping = PingRequest(coordinator_epoch=1, generation=2, consumer_id="c", num_retries=0)
    return broker.send(Request(correlation_id=correlation_id, message=ping))


def _expect_error(conn: Connection, code: ErrorCode) -> RemoteProtocolError:
    with pytest.raises(RemoteProtocolError) as info:
        drain(conn)
    assert info.value.error_code is code
    assert conn.state is ConnectionState.ERROR
    # Sticky: every later call raises again with the same code, and new bytes change nothing.
    conn.receive_data(_ping_frame(99))
    with pytest.raises(RemoteProtocolError) as again:
        conn.next_event()
    assert again.value.error_code is code
    assert conn.state is ConnectionState.ERROR
    return info.value


def _consumer_fed(*chunks: bytes) -> Connection:
    conn = Connection(Role.CONSUMER)
    for chunk in chunks:
        conn.receive_data(chunk)
    return conn


# --- truncation and EOF -------------------------------------------------------------------------


def test_eof_at_a_frame_boundary_closes_cleanly() -> None:
    conn = _consumer_fed(_ping_frame(), b"")
    assert isinstance(conn.next_event(), Request)
    assert conn.next_event() == ConnectionClosed()
    assert conn.state is ConnectionState.CLOSED
    assert conn.next_event() == ConnectionClosed()  # and stays closed
    conn.receive_data(b"")
    with pytest.raises(RuntimeError):
        conn.receive_data(b"more")


@given(consumer_requests, st.data())
def test_eof_mid_frame_is_malformed_and_yields_nothing(
    message: RequestMessage, data: st.DataObject
) -> None:
    sender = Connection(Role.CONSUMER)
    frame = sender.send(sender.new_request(message))
    cut = data.draw(st.integers(1, len(frame) - 1), label="cut")
    conn = Connection(Role.BROKER)
    conn.receive_data(frame[:cut])
    assert conn.next_event() is NEED_DATA  # no partial event before EOF
    conn.receive_data(b"")
    _expect_error(conn, ErrorCode.MALFORMED_FRAME)


def test_whole_frames_before_a_truncated_one_are_still_delivered() -> None:
    frame = _ping_frame(0)
    conn = _consumer_fed(frame + _ping_frame(1)[:-3], b"")
    assert isinstance(conn.next_event(), Request)
    _expect_error(conn, ErrorCode.MALFORMED_FRAME)
    assert conn.pending_requests == {0}


# --- sizes --------------------------------------------------------------------------------------


def test_an_oversized_size_field_is_refused_as_soon_as_it_is_read() -> None:
    conn = Connection(Role.CONSUMER, max_frame_size=1000)
    conn.receive_data(struct.pack(">i", 1001))  # nothing after the size field yet
    error = _expect_error(conn, ErrorCode.FRAME_TOO_LARGE)
    assert error.correlation_id is None and error.api_key is None


def test_the_size_limit_is_inclusive() -> None:
    frame = _ping_frame()
    conn = Connection(Role.CONSUMER, max_frame_size=len(frame) - 4)
    conn.receive_data(frame)
    assert isinstance(conn.next_event(), Request)
    conn = Connection(Role.CONSUMER, max_frame_size=len(frame) - 5)
    conn.receive_data(frame)
    _expect_error(conn, ErrorCode.FRAME_TOO_LARGE)


@pytest.mark.parametrize("size", [-1, -(2**31), 0, 8])
def test_sizes_below_a_header_are_malformed(size: int) -> None:
    _expect_error(_consumer_fed(struct.pack(">i", size) + b"\0" * 16), ErrorCode.MALFORMED_FRAME)


@given(st.binary(max_size=64))
def test_garbage_never_escapes_as_anything_but_a_protocol_error(garbage: bytes) -> None:
    for role in Role:
        conn = Connection(role)
        conn.receive_data(garbage)
        conn.receive_data(b"")
        try:
            drain(conn)
        except RemoteProtocolError:
            assert conn.state is ConnectionState.ERROR
        else:
            assert conn.state is ConnectionState.CLOSED


def test_all_ones_garbage_is_malformed() -> None:
    _expect_error(_consumer_fed(b"\xff" * 32), ErrorCode.MALFORMED_FRAME)


# --- header -------------------------------------------------------------------------------------


def test_unknown_api_key() -> None:
    conn = _consumer_fed(raw_frame(api_key=77, correlation_id=4))
    error = _expect_error(conn, ErrorCode.UNKNOWN_API_KEY)
    assert (error.correlation_id, error.api_key) == (4, 77)


@pytest.mark.parametrize("version", [2, -1, 32767])
def test_unsupported_version(version: int) -> None:
    conn = _consumer_fed(raw_frame(version=version, correlation_id=3, body=ping_body()))
    error = _expect_error(conn, ErrorCode.UNSUPPORTED_VERSION)
    assert (error.correlation_id, error.api_key) == (3, 5)


def test_a_version_past_an_apis_newest_is_unsupported() -> None:
    broker = Connection(Role.BROKER)
    broker.receive_data(raw_frame(api_key=13, version=4, correlation_id=3, body=string("g")))
    error = _expect_error(broker, ErrorCode.UNSUPPORTED_VERSION)
    assert (error.correlation_id, error.api_key) == (3, 13)


def test_a_response_in_another_version_than_its_request_is_refused() -> None:
    client = Connection(Role.CONSUMER)
    client.send(Request(correlation_id=3, message=DescribeGroupRequest(group_id="g")))
    v0_body = bytes.fromhex("00 00") + string("g") + string("Empty") + bytes(12)
    client.receive_data(raw_frame(kind=1, api_key=13, version=0, correlation_id=3, body=v0_body))
    _expect_error(client, ErrorCode.UNSUPPORTED_VERSION)


@pytest.mark.parametrize("kind", [3, -1, 127])
def test_unknown_frame_kind(kind: int) -> None:
    _expect_error(_consumer_fed(raw_frame(kind=kind, body=ping_body())), ErrorCode.MALFORMED_FRAME)


def test_null_client_id_is_malformed() -> None:
    frame = raw_frame(client_id=string(None), body=ping_body())
    _expect_error(_consumer_fed(frame), ErrorCode.MALFORMED_FRAME)


# --- body ---------------------------------------------------------------------------------------


def test_trailing_bytes_after_the_body() -> None:
    _expect_error(_consumer_fed(raw_frame(body=ping_body() + b"\0")), ErrorCode.MALFORMED_FRAME)


def test_a_body_that_runs_short() -> None:
    _expect_error(_consumer_fed(raw_frame(body=ping_body()[:-1])), ErrorCode.MALFORMED_FRAME)


def test_a_body_cannot_read_into_the_next_frame() -> None:
    # The first frame's body lacks its last field; the next frame's bytes must not complete it.
    data = raw_frame(body=ping_body()[:-4]) + raw_frame(correlation_id=1, body=ping_body())
    _expect_error(_consumer_fed(data), ErrorCode.MALFORMED_FRAME)


def test_bad_utf8_is_malformed() -> None:
    body = struct.pack(">qi", 1, 1) + struct.pack(">h", 2) + b"\xc3\x28" + struct.pack(">i", 0)
    _expect_error(_consumer_fed(raw_frame(body=body)), ErrorCode.MALFORMED_FRAME)


@pytest.mark.parametrize("length", [-2, -(2**15)])
def test_negative_string_lengths_other_than_null_are_malformed(length: int) -> None:
    body = struct.pack(">qih", 1, 1, length) + struct.pack(">i", 0)
    _expect_error(_consumer_fed(raw_frame(body=body)), ErrorCode.MALFORMED_FRAME)


def test_null_in_a_non_nullable_string_is_malformed() -> None:
    body = struct.pack(">qi", 1, 1) + string(None) + struct.pack(">i", 0)
    _expect_error(_consumer_fed(raw_frame(body=body)), ErrorCode.MALFORMED_FRAME)


def _register_body(auto_commit: int, owned_count: int = 0) -> bytes:
    subscription = struct.pack(">i", 0) + string(None) + b"\x00" + struct.pack(">i", 1)
    return (
        string("g")
        + string("c")
        + subscription
        + struct.pack(">b", auto_commit)
        + string("smallest")
        + struct.pack(">ii", 30000, -1)
        + struct.pack(">i", owned_count)
    )


def _to_broker(frame: bytes) -> Connection:
    conn = Connection(Role.BROKER)
    conn.receive_data(frame)
    return conn


def test_hand_built_register_body_is_valid() -> None:
    (event,) = drain(_to_broker(raw_frame(api_key=4, body=_register_body(1))))
    assert isinstance(event, Request) and event.message.API_KEY == 4


@pytest.mark.parametrize("byte", [2, -1, 0x7F])
def test_a_bool_other_than_0_or_1_is_malformed(byte: int) -> None:
    frame = raw_frame(api_key=4, body=_register_body(byte))
    _expect_error(_to_broker(frame), ErrorCode.MALFORMED_FRAME)


@pytest.mark.parametrize("count", [-1, -2, 2**31 - 1])
def test_bad_array_counts_are_malformed(count: int) -> None:
    # owned_partitions is not nullable; a huge count must be refused before anything is allocated.
    frame = raw_frame(api_key=4, body=_register_body(0, owned_count=count))
    _expect_error(_to_broker(frame), ErrorCode.MALFORMED_FRAME)


def test_null_in_a_nullable_array_is_fine() -> None:
    body = string("g") + struct.pack(">i", -1)  # OffsetFetchRequest, partitions = null
    (event,) = drain(_to_broker(raw_frame(api_key=9, body=body)))
    assert isinstance(event, Request)
    assert event.message == OffsetFetchRequest(group_id="g", partitions=None)


# --- what ERROR means for the rest of the connection --------------------------------------------


def test_error_state_refuses_sends_but_allows_send_error() -> None:
    conn = _consumer_fed(raw_frame(api_key=77, correlation_id=4))
    error = _expect_error(conn, ErrorCode.UNKNOWN_API_KEY)
    assert isinstance(error, ProtocolError)
    with pytest.raises(LocalProtocolError):
        conn.send(conn.new_request(ListGroupsRequest()))
    frame = conn.send_error(
        error.error_code, str(error), correlation_id=error.correlation_id, api_key=error.api_key
    )
    assert frame[4:13] == bytes.fromhex("02 004d 0000 00000004")  # error, key 77, v0, corr 4
    assert conn.state is ConnectionState.ERROR
