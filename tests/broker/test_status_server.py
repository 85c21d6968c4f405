"""The metrics port's own bounds, on a real socket: connections past its limit closed at once, a
request head bounded in size and in time from the accept, so that idle clients of it hold
neither its slots nor the broker's files."""

from __future__ import annotations

import pytest
import trio

from broker import status
from broker.authorization import Access
from broker.metrics import BrokerMetrics, MetricsConfig, Snapshot
from broker.viewer import RecordViewer
from protocol.sasl import ScramCredential
from statemachine.acl import Authorizer

DEADLINE = 10.0


async def no_snapshot() -> Snapshot:
    raise AssertionError("no request here asks for one")


async def received_until_closed(stream: trio.SocketStream) -> bytes:
    received = b""
    with trio.fail_after(DEADLINE):
        while chunk := await stream.receive_some(65536):
            received += chunk
    return received


async def test_the_metrics_port_bounds_its_connections_and_their_requests(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(status, "HEAD_DEADLINE", 2.0)
    metrics = BrokerMetrics(config=MetricsConfig(port=0))
    async with trio.open_nursery() as nursery:
        port = await nursery.start(status.serve_status, metrics, no_snapshot)
        idle = [
            await trio.open_tcp_stream("127.0.0.1", port) for _ in range(status.MAX_CONNECTIONS)
        ]
        # accepted after them (the accept queue is in order), while they are all open
        extra = await trio.open_tcp_stream("127.0.0.1", port)
        assert await received_until_closed(extra) == b""  # over the limit: closed at once
        # the idle ones are closed once the head deadline from their accept has passed
        started = trio.current_time()
        for stream in idle:
            assert await received_until_closed(stream) == b""
        assert trio.current_time() - started < status.HEAD_DEADLINE + 2
        big = await trio.open_tcp_stream("127.0.0.1", port)
        # exactly the bound, none of it the head's end (more unread would reset the answer)
        await big.send_all(b"GET /" + b"a" * (status.MAX_HEAD_BYTES - 5))
        assert (await received_until_closed(big)).startswith(b"HTTP/1.0 431 ")
        fine = await trio.open_tcp_stream("127.0.0.1", port)
        await fine.send_all(b"GET /nowhere HTTP/1.0\r\n\r\n")
        assert (await received_until_closed(fine)).startswith(b"HTTP/1.0 404 ")
        for stream in (*idle, extra, big, fine):
            await stream.aclose()
        nursery.cancel_scope.cancel()


async def no_users(user: str, mechanism: str) -> ScramCredential | None:
    return None


async def test_the_record_viewer_asks_a_browser_to_log_in_and_is_off_without_rules() -> None:
    """A browser shows its login prompt on a 401 with a Basic challenge; a broker enforcing no
    access rules answers 404, saying the viewer is off."""
    metrics = BrokerMetrics(config=MetricsConfig(port=0))
    answers = {}
    for enabled in (True, False):
        viewer = RecordViewer(
            access=Access(current=Authorizer(enabled=enabled)), credential=no_users, partitions=dict
        )
        async with trio.open_nursery() as nursery:
            port = await nursery.start(status.serve_status, metrics, no_snapshot, viewer)
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.send_all(b"GET /records?topic=t&partition=0 HTTP/1.0\r\n\r\n")
            answers[enabled] = await received_until_closed(stream)
            await stream.aclose()
            nursery.cancel_scope.cancel()
    head, _, body = answers[True].partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 401 ")
    assert b'\r\nWWW-Authenticate: Basic realm="broker", charset="UTF-8"' in head
    head, _, body = answers[False].partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 404 ") and b"WWW-Authenticate" not in head
    assert body.decode().strip() == status.VIEWER_OFF
