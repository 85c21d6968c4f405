"""Real broker processes against hostile connections (docs/failure-domains.md): one connection's
bad input ends that connection only, and connections over the limit are refused cheaply while
the others are served."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import pytest
import trio

from launch.processes import BrokerProcess, run_broker
from protocol import (
    Connection,
    DescribeGroupRequest,
    ErrorCode,
    ListGroupsRequest,
    ListGroupsResponse,
    PeerError,
    Response,
    Role,
)
from transport.channel import Channel
from transport.connect import open_channel

pytestmark = pytest.mark.realtime

DEADLINE = 10.0


@asynccontextmanager
async def client(broker: BrokerProcess) -> AsyncIterator[Channel]:
    with trio.fail_after(DEADLINE):
        stream = await trio.open_tcp_stream(*broker.address)
    async with open_channel(stream, client_id="test") as channel:
        yield channel


async def list_groups(channel: Channel) -> None:
    with trio.fail_after(DEADLINE):
        response = await channel.request(ListGroupsRequest())
    assert isinstance(response, ListGroupsResponse)
    assert response.error_code is ErrorCode.NONE


async def received_until_closed(stream: trio.abc.Stream) -> bytes:
    """What the broker sends before it closes the connection (a reset counts as closing)."""
    received = b""
    with trio.fail_after(DEADLINE):
        with contextlib.suppress(trio.BrokenResourceError):
            while chunk := await stream.receive_some(65536):
                received += chunk
    return received


async def test_a_request_then_a_malformed_frame_does_not_kill_the_broker(tmp_path: Path) -> None:
    async with run_broker(tmp_path / "data") as broker, client(broker) as bystander:
        await list_groups(bystander)
        for _ in range(3):  # it killed the broker every time
            connection = Connection(Role.CONSUMER)
            frame = connection.send(connection.new_request(DescribeGroupRequest(group_id="g")))
            with trio.fail_after(DEADLINE):
                stream = await trio.open_tcp_stream(*broker.address)
            await stream.send_all(frame + b"\xff\xff\xff\xff")
            received = await received_until_closed(stream)
            await stream.aclose()
            # the answer to the valid request may come first, then the refusal, then the close
            connection.receive_data(received)
            connection.receive_data(b"")
            event = connection.next_event()
            if isinstance(event, Response):
                event = connection.next_event()
            assert isinstance(event, PeerError), received
            assert event.error_code is ErrorCode.MALFORMED_FRAME
        await list_groups(bystander)
        async with client(broker) as newcomer:
            await list_groups(newcomer)
        assert broker.process.returncode is None
        assert "Traceback" not in broker.log_text()


async def test_connections_over_the_limit_are_refused_and_the_others_served(
    tmp_path: Path,
) -> None:
    async with (
        run_broker(tmp_path / "data", "--max-connections", "5") as broker,
        AsyncExitStack() as stack,
    ):
        channels = [await stack.enter_async_context(client(broker)) for _ in range(5)]
        for channel in channels:
            await list_groups(channel)
        for _ in range(3):
            with trio.fail_after(DEADLINE):
                refused = await trio.open_tcp_stream(*broker.address)
            connection = Connection(Role.CONSUMER)
            # answered if it were served; the broker may have closed it already
            with contextlib.suppress(trio.BrokenResourceError):
                await refused.send_all(connection.send(connection.new_request(ListGroupsRequest())))
            assert await received_until_closed(refused) == b""
            await refused.aclose()
        for channel in channels:
            await list_groups(channel)
        refusals = [
            line for line in broker.log_text().splitlines() if "refused a connection" in line
        ]
        assert len(refusals) == 1, refusals
        assert "5 connections are open" in refusals[0]
        assert broker.process.returncode is None
