"""A protocol connection over a trio stream, for either side.

The sans-IO :class:`protocol.Connection` decides what bytes mean; this class only moves them. Both
sides send requests over one connection (the coordinator pushes Ping/StopFetcher/StartFetcher to
consumers), so a single reader task routes every incoming response to the caller awaiting it and
hands every incoming request to the owner's handler, and the reader never waits on a handler:
a slow request (an OffsetCommit waiting for durability) must not hold back a Ping response.

Deadlines belong to callers: wrap :meth:`Channel.request` in a cancel scope. A response that
arrives after its caller gave up is dropped.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import attrs
import trio

from protocol import (
    NEED_DATA,
    Connection,
    ConnectionClosed,
    PeerError,
    RemoteProtocolError,
    Request,
    RequestMessage,
    Response,
    ResponseMessage,
    Role,
)

log = logging.getLogger(__name__)

RECEIVE_SIZE = 65536


class ChannelClosed(Exception):
    """The connection ended (or failed) before the response arrived."""


@attrs.define
class _Waiter:
    done: trio.Event = attrs.field(factory=trio.Event)
    response: ResponseMessage | None = None


@attrs.define(eq=False)
class Channel:
    stream: trio.abc.Stream
    connection: Connection
    peer: str = "?"
    closed: bool = False
    _waiters: dict[int, _Waiter] = attrs.field(factory=dict)
    _send_lock: trio.StrictFIFOLock = attrs.field(factory=trio.StrictFIFOLock)

    @classmethod
    def open(
        cls, stream: trio.abc.Stream, role: Role, *, client_id: str = "", max_frame_size: int
    ) -> Channel:
        connection = Connection(role, client_id=client_id, max_frame_size=max_frame_size)
        return cls(stream=stream, connection=connection, peer=_peer_name(stream))

    async def request(self, message: RequestMessage) -> ResponseMessage:
        """Send a request and wait for its response (the caller's cancel scope is the deadline)."""
        if self.closed:
            raise ChannelClosed(f"connection to {self.peer} is closed")
        event = self.connection.new_request(message)
        waiter = _Waiter()
        self._waiters[event.correlation_id] = waiter
        try:
            await self._send(self.connection.send(event))
            await waiter.done.wait()
        finally:
            del self._waiters[event.correlation_id]
        if waiter.response is None:
            raise ChannelClosed(f"connection to {self.peer} closed before the response")
        return waiter.response

    async def respond(self, request: Request, message: ResponseMessage) -> None:
        if self.closed:
            return  # the peer is gone; nobody awaits this answer
        data = self.connection.send(
            Response(
                correlation_id=request.correlation_id, message=message, request=request.message
            )
        )
        await self._send(data)

    async def run(self, on_request: Callable[[Request], Awaitable[None]]) -> None:
        """Read until the peer closes or breaks the protocol.

        ``on_request`` is awaited in order and should only queue the request for another task.
        A peer that breaks the protocol is told why with an error frame, and RemoteProtocolError
        propagates to the owner, who closes the connection.
        """
        try:
            while True:
                event = self.connection.next_event()
                if event is NEED_DATA:
                    data = await self.stream.receive_some(RECEIVE_SIZE)
                    self.connection.receive_data(bytes(data))
                elif isinstance(event, Response):
                    waiter = self._waiters.get(event.correlation_id)
                    if waiter is not None:
                        waiter.response = event.message
                        waiter.done.set()
                elif isinstance(event, Request):
                    await on_request(event)
                elif isinstance(event, ConnectionClosed):
                    return
                elif isinstance(event, PeerError):
                    log.info("%s reported %s: %s", self.peer, event.error_code.name, event.message)
                    return
        except RemoteProtocolError as exc:
            log.warning("closing %s: %s (%s)", self.peer, exc, exc.error_code.name)
            await self._tell_peer(exc)
            raise
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return
        finally:
            self._close_waiters()

    async def aclose(self) -> None:
        self._close_waiters()
        await self.stream.aclose()

    async def _send(self, data: bytes) -> None:
        try:
            async with self._send_lock:
                await self.stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self.connection.send_failed()
            self._close_waiters()
            raise ChannelClosed(f"connection to {self.peer} is closed") from exc

    async def _tell_peer(self, exc: RemoteProtocolError) -> None:
        data = self.connection.send_error(
            exc.error_code,
            str(exc),
            correlation_id=exc.correlation_id if exc.correlation_id is not None else -1,
            api_key=exc.api_key if exc.api_key is not None else -1,
        )
        with trio.move_on_after(1.0):
            try:
                async with self._send_lock:
                    await self.stream.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass

    def _close_waiters(self) -> None:
        self.closed = True
        for waiter in self._waiters.values():
            waiter.done.set()


def _peer_name(stream: trio.abc.Stream) -> str:
    socket = getattr(stream, "socket", None)
    if socket is not None:
        try:
            host, port = socket.getpeername()[:2]
            return f"{host}:{port}"
        except OSError:
            pass
    return type(stream).__name__
