"""A client's channel turns each way a broker refuses it into its named exception: an answer
ILLEGAL_SASL_STATE (a SASL listener's answer before authentication), an error frame refusing the
request's version, and a plaintext connection closed before any answer (a TLS listener's)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import trio
import trio.testing

from protocol import (
    ClusterMetadataRequest,
    Connection,
    ErrorCode,
    Request,
    Response,
    Role,
    error_response,
)
from transport.channel import Channel, ChannelClosed
from transport.refusals import ListenerNeedsSasl, ListenerNeedsTls, Refused, UnsupportedVersion

MAX_FRAME = 1 << 20
METADATA = ClusterMetadataRequest(group_id=None, topics=())


async def _refuse(request: Request) -> None:
    raise AssertionError(f"no request comes to a client here: {request}")


async def _asked(
    broker: Callable[[Connection, Request], bytes],
) -> BaseException:
    """What the client's request raises when the broker answers its first request with the
    bytes ``broker`` makes (b"": none) and closes."""
    client_end, broker_end = trio.testing.memory_stream_pair()
    channel = Channel.open(client_end, Role.CONSUMER, max_frame_size=MAX_FRAME)
    connection = Connection(Role.BROKER, max_frame_size=MAX_FRAME)

    async def serve() -> None:
        while not isinstance(event := connection.next_event(), Request):
            connection.receive_data(bytes(await broker_end.receive_some()))
        answer = broker(connection, event)
        if answer:
            await broker_end.send_all(answer)
        await broker_end.aclose()

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(channel.run, _refuse)
            nursery.start_soon(serve)
            with pytest.raises(ChannelClosed) as raised:
                await channel.request(METADATA)
            nursery.cancel_scope.cancel()
    return raised.value


async def test_an_answer_illegal_sasl_state_is_a_listener_that_needs_sasl() -> None:
    def illegal_sasl_state(connection: Connection, request: Request) -> bytes:
        message = error_response(request.message, ErrorCode.ILLEGAL_SASL_STATE)
        return connection.send(
            Response(
                correlation_id=request.correlation_id, message=message, request=request.message
            )
        )

    refused = await _asked(illegal_sasl_state)
    assert isinstance(refused, ListenerNeedsSasl)
    assert refused.error_code is ErrorCode.ILLEGAL_SASL_STATE


async def test_an_error_frame_refusing_the_version_is_unsupported_version() -> None:
    def unsupported(connection: Connection, request: Request) -> bytes:
        return connection.send_error(
            ErrorCode.UNSUPPORTED_VERSION,
            "CLUSTER_METADATA version 9 is not supported (0 to 2)",
            correlation_id=request.correlation_id,
        )

    refused = await _asked(unsupported)
    assert isinstance(refused, UnsupportedVersion)
    assert "version 9 is not supported" in str(refused)


async def test_a_plaintext_connection_closed_before_any_answer_asks_whether_tls_is_needed() -> None:
    refused = await _asked(lambda connection, request: b"")
    assert isinstance(refused, ListenerNeedsTls)
    assert "does this listener need TLS?" in str(refused)


async def test_a_connection_closed_after_an_answer_is_no_refusal() -> None:
    client_end, broker_end = trio.testing.memory_stream_pair()
    channel = Channel.open(client_end, Role.CONSUMER, max_frame_size=MAX_FRAME)
    connection = Connection(Role.BROKER, max_frame_size=MAX_FRAME)

    async def serve() -> None:
        answered = 0
        while True:
            data = await broker_end.receive_some()
            connection.receive_data(bytes(data))
            while isinstance(event := connection.next_event(), Request):
                if answered:
                    await broker_end.aclose()
                    return
                message = error_response(event.message, ErrorCode.COORDINATOR_NOT_AVAILABLE)
                await broker_end.send_all(
                    connection.send(
                        Response(
                            correlation_id=event.correlation_id,
                            message=message,
                            request=event.message,
                        )
                    )
                )
                answered += 1

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(channel.run, _refuse)
            nursery.start_soon(serve)
            await channel.request(METADATA)
            with pytest.raises(ChannelClosed) as raised:
                await channel.request(METADATA)
            nursery.cancel_scope.cancel()
    assert not isinstance(raised.value, Refused)
