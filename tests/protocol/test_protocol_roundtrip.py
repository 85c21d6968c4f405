"""Every message survives encode -> bytes -> decode between two peer connections, however the bytes
are split on the way."""

from __future__ import annotations

import itertools
import random
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol import (
    NEED_DATA,
    NEWEST_VERSION,
    ApiKey,
    Connection,
    ConnectionClosed,
    ConnectionState,
    ErrorCode,
    Event,
    FetchRequest,
    LocalProtocolError,
    Request,
    RequestMessage,
    Response,
    ResponseMessage,
    Role,
)
from protocol.codec import INT16, INT32, INT64, Codec, Reader, array
from protocol.schema import SINCE
from tests.protocol.protocol_testing import drain, other, sender_role
from tests.protocol.strategies import (
    REQUEST_STRATEGIES,
    RESPONSE_STRATEGIES,
    broker_requests,
    consumer_requests,
    exchanges,
)


def test_a_strategy_exists_for_every_message() -> None:
    assert set(REQUEST_STRATEGIES) == set(RESPONSE_STRATEGIES) == set(ApiKey)


@given(exchanges())
def test_every_message_round_trips(exchange: tuple[RequestMessage, ResponseMessage]) -> None:
    request, response = exchange
    role = sender_role(request)
    sender = Connection(role, client_id="sender-1")
    receiver = Connection(other(role))

    receiver.receive_data(sender.send(sender.new_request(request)))
    received = receiver.next_event()
    assert received == Request(correlation_id=0, message=request, client_id="sender-1")
    assert receiver.next_event() is NEED_DATA
    assert sender.outstanding_requests == {0}
    assert receiver.pending_requests == {0}

    assert isinstance(received, Request)
    sender.receive_data(receiver.send(received.response(response)))
    answered = sender.next_event()
    assert answered == Response(correlation_id=0, message=response, request=request)
    assert sender.next_event() is NEED_DATA
    assert sender.outstanding_requests == receiver.pending_requests == frozenset()
    assert sender.state is receiver.state is ConnectionState.OPEN


@given(exchanges(), st.data())
def test_every_version_round_trips(
    exchange: tuple[RequestMessage, ResponseMessage], data: st.DataObject
) -> None:
    """A peer speaking an older version gets its answer in that version: the fields later
    versions added are left out on the wire and read back as their defaults. A request whose
    later fields are not at their defaults is refused in an older version, changing nothing:
    leaving them out would change what it asks."""
    request, response = exchange
    version = data.draw(st.integers(0, NEWEST_VERSION[request.API_KEY]))
    role = sender_role(request)
    sender, receiver = Connection(role), Connection(other(role))
    if _as_in(request, version) != request:
        with pytest.raises(LocalProtocolError) as refused:
            sender.send(Request(correlation_id=0, message=request, api_version=version))
        assert refused.value.error_code is ErrorCode.UNSUPPORTED_VERSION
        assert sender.outstanding_requests == frozenset()
        request = _as_in(request, version)

    receiver.receive_data(
        sender.send(Request(correlation_id=0, message=request, api_version=version))
    )
    received = receiver.next_event()
    assert isinstance(received, Request)
    assert received.api_version == version
    assert received.message == _as_in(request, version)
    sender.receive_data(receiver.send(received.response(response)))
    answered = sender.next_event()
    assert isinstance(answered, Response)
    assert answered.message == _as_in(response, version)


def _as_in(message: Any, version: int) -> Any:
    """``message`` as a peer reads it in ``version``: the fields later versions added at their
    defaults."""
    absent = {
        field.name: field.default.factory() if hasattr(field.default, "factory") else field.default
        for field in attrs.fields(type(message))
        if field.metadata.get(SINCE, 0) > version
    }
    return attrs.evolve(message, **absent)


def _stream(role: Role, messages: list[RequestMessage]) -> tuple[bytes, list[Event]]:
    """Frames of ``messages`` sent by ``role`` then EOF, and the events a peer must make of them."""
    sender = Connection(role, client_id="c")
    data = b"".join(sender.send(sender.new_request(m)) for m in messages)
    expected: list[Event] = [
        Request(correlation_id=i, message=m, client_id="c") for i, m in enumerate(messages)
    ]
    return data, [*expected, ConnectionClosed()]


def _feed(role: Role, chunks: list[bytes]) -> list[Event]:
    receiver = Connection(other(role))
    events: list[Event] = []
    for chunk in chunks:
        if not chunk:
            continue  # b"" would mean EOF
        receiver.receive_data(chunk)
        events += drain(receiver)
    receiver.receive_data(b"")
    events += drain(receiver)
    return events


@given(
    st.sampled_from(Role).flatmap(
        lambda role: st.tuples(
            st.just(role),
            st.lists(consumer_requests if role is Role.CONSUMER else broker_requests, max_size=5),
        )
    )
)
def test_bytes_one_at_a_time_give_the_same_events_as_all_at_once(
    case: tuple[Role, list[RequestMessage]],
) -> None:
    role, messages = case
    data, expected = _stream(role, messages)
    assert _feed(role, [data]) == expected
    assert _feed(role, [data[i : i + 1] for i in range(len(data))]) == expected


@given(st.lists(consumer_requests, min_size=1, max_size=5), st.data())
def test_any_split_gives_the_same_events(
    messages: list[RequestMessage], data: st.DataObject
) -> None:
    stream, expected = _stream(Role.CONSUMER, messages)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=8)))
    bounds = [0, *cuts, len(stream)]
    chunks = [stream[a:b] for a, b in itertools.pairwise(bounds)]
    assert _feed(Role.CONSUMER, chunks) == expected


@given(st.lists(exchanges(), min_size=2, max_size=6), st.randoms(use_true_random=False))
def test_responses_may_come_back_in_any_order(
    pairs: list[tuple[RequestMessage, ResponseMessage]], rnd: random.Random
) -> None:
    consumer = Connection(Role.CONSUMER)
    broker = Connection(Role.BROKER)
    sent: list[tuple[Connection, Connection, Request, ResponseMessage]] = []
    for request, response in pairs:
        sender, receiver = (
            (consumer, broker) if sender_role(request) is Role.CONSUMER else (broker, consumer)
        )
        event = sender.new_request(request)
        receiver.receive_data(sender.send(event))
        (received,) = drain(receiver)
        assert received == event
        sent.append((sender, receiver, event, response))
    rnd.shuffle(sent)
    for sender, receiver, event, response in sent:
        sender.receive_data(receiver.send(event.response(response)))
        assert drain(sender) == [
            Response(correlation_id=event.correlation_id, message=response, request=event.message)
        ]
    for conn in (consumer, broker):
        assert conn.outstanding_requests == conn.pending_requests == frozenset()


def test_a_large_batch_of_frames_in_one_chunk_decodes_in_order() -> None:
    # Enough bytes to make the receive buffer compact itself part-way through.
    messages: list[RequestMessage] = [
        FetchRequest(topic="t" * 100, partition=i, offset=i, max_bytes=1) for i in range(3000)
    ]
    data, expected = _stream(Role.CONSUMER, messages)
    assert len(data) > 300_000
    half = len(data) // 2 + 7
    assert _feed(Role.CONSUMER, [data[:half], data[half:]]) == expected


@given(
    st.sampled_from([(INT16, 16), (INT32, 32), (INT64, 64)]).flatmap(
        lambda codec_bits: st.tuples(
            st.just(codec_bits[0]),
            st.lists(
                st.integers(-(2 ** (codec_bits[1] - 1)), 2 ** (codec_bits[1] - 1) - 1),
                max_size=40,
            ).map(tuple),
        )
    )
)
def test_an_array_of_fixed_width_ints_round_trips_at_any_length(
    codec_values: tuple[Codec[int], tuple[int, ...]],
) -> None:
    """Packed whole (short arrays by a packer made once, longer by one made per call), as each
    element alone would be."""
    codec, values = codec_values
    packed = bytearray()
    array(codec).encode(packed, values)
    one_by_one = bytearray(len(values).to_bytes(4, "big"))
    for value in values:
        codec.encode(one_by_one, value)
    assert packed == one_by_one
    reader = Reader(bytes(packed))
    assert array(codec).decode(reader) == values
    assert reader.remaining == 0


@pytest.mark.parametrize("length", [1, 7, 8, 30])
def test_an_int_out_of_its_width_in_an_array_is_named_and_not_sent(length: int) -> None:
    values = (*range(length - 1), 2**31)
    with pytest.raises(LocalProtocolError, match="2147483648 does not fit in int32"):
        array(INT32).encode(bytearray(), values)
