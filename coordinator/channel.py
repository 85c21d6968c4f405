"""A protocol connection over a trio stream, for either side.

The sans-IO :class:`protocol.Connection` decides what bytes mean; this class only moves them. Both
sides send requests over one connection (the coordinator pushes Ping/StopFetcher/StartFetcher to
consumers), so a single reader task routes every incoming response to the caller awaiting it and
hands every incoming request to the owner's handler, and the reader never waits on a handler:
a slow request (an OffsetCommit waiting for durability) must not hold back a Ping response.

Sending never waits for the socket: a frame goes straight to the kernel when nothing is queued,
else to one buffer that a writer task drains, so the coordinator's ping scheduler can send a Ping
from a plain function. Deadlines belong to callers:
wrap :meth:`Channel.request` in a cancel scope, or :meth:`Channel.abandon` a request sent with
:meth:`Channel.request_nowait`. A response that arrives after its caller gave up is dropped.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable

import attrs
import trio

from protocol import (
    NEED_DATA,
    Connection,
    ConnectionClosed,
    ErrorCode,
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


#: Responses a caller of :meth:`Channel.respond` or :meth:`Channel.request` may leave unwritten
#: before it waits for the writer: a peer that does not read must not grow our memory without bound.
HIGH_WATER = 1 << 20
#: How long a last frame before closing may take to leave: a peer that does not read gets none.
CLOSING_WRITE_DEADLINE = 1.0

ResponseHandler = Callable[[ResponseMessage | None], None]
"""Called by the reader with the response, or with None when the connection ends first."""


@attrs.define(eq=False)
class Channel:
    stream: trio.abc.Stream
    connection: Connection
    peer: str = "?"
    closed: bool = False
    #: The connection failed (a reset, a send error) rather than the peer closing it: a member
    #: whose connection broke may not know yet, so it is not proof that it stopped fetching.
    broken: bool = False
    _handlers: dict[int, ResponseHandler] = attrs.field(factory=dict)
    #: Frames not yet written; one writer task drains it, so a caller that sends never waits
    #: for the socket and frames leave in the order they were made.
    _outgoing: bytearray = attrs.field(factory=bytearray)
    _has_outgoing: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot)
    _written: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot)
    _send_lock: trio.StrictFIFOLock = attrs.field(factory=trio.StrictFIFOLock)

    @classmethod
    def open(
        cls, stream: trio.abc.Stream, role: Role, *, client_id: str = "", max_frame_size: int
    ) -> Channel:
        connection = Connection(role, client_id=client_id, max_frame_size=max_frame_size)
        return cls(stream=stream, connection=connection, peer=_peer_name(stream))

    async def request(self, message: RequestMessage) -> ResponseMessage:
        """Send a request and wait for its response (the caller's cancel scope is the deadline)."""
        done = trio.Event()
        answers: list[ResponseMessage | None] = []

        def on_response(response: ResponseMessage | None) -> None:
            answers.append(response)
            done.set()

        correlation_id = self.request_nowait(message, on_response)
        try:
            await self._wait_for_room()
            await done.wait()
        finally:
            self.abandon(correlation_id)
        if not answers or answers[0] is None:
            raise ChannelClosed(f"connection to {self.peer} closed before the response")
        return answers[0]

    def request_nowait(self, message: RequestMessage, on_response: ResponseHandler) -> int:
        """Queue a request; the reader calls ``on_response`` from its own task when the answer
        comes (or with None if the connection ends first). For the coordinator's Pings: one
        scheduler sends thousands of them without a task, a cancel scope or an Event each.

        Returns the correlation id, for :meth:`abandon`."""
        if self.closed:
            raise ChannelClosed(f"connection to {self.peer} is closed")
        event = self.connection.new_request(message)
        self._handlers[event.correlation_id] = on_response
        self._queue(self.connection.send(event))
        return event.correlation_id

    def abandon(self, correlation_id: int) -> None:
        """The caller gave up on a request (its deadline passed): a late answer is dropped."""
        self._handlers.pop(correlation_id, None)

    async def respond(self, request: Request, message: ResponseMessage) -> None:
        if self.closed:
            return  # the peer is gone; nobody awaits this answer
        data = self.connection.send(
            Response(
                correlation_id=request.correlation_id, message=message, request=request.message
            )
        )
        self._queue(data)
        await self._wait_for_room()

    async def refuse(self, error_code: ErrorCode, reason: str) -> None:
        """Tell the peer why we are about to close the connection: an error frame, after which
        nothing else is sent on it, written like :meth:`flush`."""
        self._queue(self.connection.send_error(error_code, reason))
        await self.flush()

    async def flush(self) -> None:
        """Write everything queued so far, from the caller's task: for a last frame that must
        leave while the connection closes (the writer may already be cancelled), so shielded
        from that cancellation and bounded instead: a peer that does not read gets nothing."""
        with trio.CancelScope(shield=True), trio.move_on_after(CLOSING_WRITE_DEADLINE):
            async with self._send_lock:
                await self._write_queued()

    async def run(self, on_request: Callable[[Request], Awaitable[None]]) -> None:
        """Read until the peer closes or breaks the protocol, and write what is queued meanwhile.

        ``on_request`` is awaited in order and should only queue the request for another task.
        A peer that breaks the protocol is told why with an error frame, and RemoteProtocolError
        propagates to the owner, who closes the connection.
        """
        violation: RemoteProtocolError | None = None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._write_forever, nursery.cancel_scope)
            try:
                await self._read(on_request)
            except RemoteProtocolError as exc:
                violation = exc  # raised below, not wrapped in the nursery's group
            finally:
                self._close_handlers()  # before the writer is gone: nobody sends meanwhile
            nursery.cancel_scope.cancel()
        if violation is not None:
            raise violation

    async def aclose(self) -> None:
        self._close_handlers()
        await self.stream.aclose()

    async def _read(self, on_request: Callable[[Request], Awaitable[None]]) -> None:
        try:
            while True:
                event = self.connection.next_event()
                if event is NEED_DATA:
                    data = await self.stream.receive_some(RECEIVE_SIZE)
                    self.connection.receive_data(bytes(data))
                elif isinstance(event, Response):
                    handler = self._handlers.pop(event.correlation_id, None)
                    if handler is not None:
                        handler(event.message)
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
        except trio.BrokenResourceError:
            self.broken = True
        except trio.ClosedResourceError:
            return

    def _queue(self, data: bytes) -> None:
        if not self._outgoing and not self._send_lock.locked():
            data = self._write_now(data)
            if not data:
                return
        self._outgoing += data
        self._has_outgoing.unpark()

    def _write_now(self, data: bytes) -> bytes:
        """Hand a frame to a TCP socket's kernel buffer from the caller's task; returns what it
        did not take. Waking the writer task costs more than the frame's encoding, and almost
        every frame fits at once. Only while nothing is queued or being written, so frames
        stay in order; any error is left for the writer's ``send_all`` to meet and report."""
        socket = getattr(self.stream, "socket", None)
        fd = socket.fileno() if isinstance(socket, trio.socket.SocketType) else -1
        if fd < 0:
            return data  # not a socket (an in-memory stream), or closed
        try:
            written = os.write(fd, data)
        except OSError:
            return data
        return data[written:]

    async def _write_forever(self, run_scope: trio.CancelScope) -> None:
        """The writer: when it cannot write, the connection is over and ``run`` ends."""
        while not self.closed:
            if not self._outgoing:
                await self._has_outgoing.park()
                continue
            async with self._send_lock:
                await self._write_queued()
        run_scope.cancel()

    async def _write_queued(self) -> None:
        if not self._outgoing or self.closed:
            return
        data = bytes(self._outgoing)
        self._outgoing.clear()
        try:
            await self.stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            if isinstance(exc, trio.BrokenResourceError):
                self.broken = True
            self.connection.send_failed()
            self._close_handlers()
        finally:
            self._written.unpark_all()

    async def _wait_for_room(self) -> None:
        while len(self._outgoing) > HIGH_WATER and not self.closed:
            await self._written.park()

    async def _tell_peer(self, exc: RemoteProtocolError) -> None:
        self._queue(
            self.connection.send_error(
                exc.error_code,
                str(exc),
                correlation_id=exc.correlation_id if exc.correlation_id is not None else -1,
                api_key=exc.api_key if exc.api_key is not None else -1,
            )
        )
        await self.flush()

    def _close_handlers(self) -> None:
        """The connection is over: every request still waiting gets None, once."""
        self.closed = True
        self._outgoing.clear()
        handlers = list(self._handlers.values())
        self._handlers.clear()
        for handler in handlers:
            handler(None)
        self._written.unpark_all()
        self._has_outgoing.unpark_all()


def _peer_name(stream: trio.abc.Stream) -> str:
    socket = getattr(stream, "socket", None)
    if socket is not None:
        try:
            host, port = socket.getpeername()[:2]
            return f"{host}:{port}"
        except OSError:
            pass
    return type(stream).__name__
