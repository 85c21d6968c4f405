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

A broker's channels are bounded by :class:`ReadBounds` (its :class:`ConnectionLimits` and one
:class:`ReadBudget` shared by all its connections): the reader runs under one cancel scope whose
deadline is the earlier of the idle deadline and the deadline of the frame being received, so a
bound costs a deadline update per read, not a task per connection.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket
import struct
from collections.abc import Awaitable, Callable

import attrs
import trio

from protocol import (
    NEED_DATA,
    Connection,
    ConnectionClosed,
    ConnectionState,
    ErrorCode,
    LocalProtocolError,
    PeerError,
    PingRequest,
    RemoteProtocolError,
    Request,
    RequestMessage,
    Response,
    ResponseMessage,
    Role,
    StartFetcherRequest,
    StopFetcherRequest,
    error_response,
)
from protocol.sasl import ANONYMOUS
from transport.limits import ConnectionLimits
from transport.refusals import ChannelClosed as ChannelClosed
from transport.refusals import ListenerNeedsSasl, ListenerNeedsTls, UnsupportedVersion

log = logging.getLogger(__name__)

RECEIVE_SIZE = 65536
#: A whole frame at least this large is decoded in a worker thread: decoding costs about 55 ns a
#: byte, so a 4 MiB frame decoded on the event loop would stall every other connection for a
#: quarter of a second, and one of 64 KiB takes under 4 ms. The thread holds the GIL in turns of
#: the interpreter's switch interval (5 ms), so the loop keeps running meanwhile.
DECODE_OFF_LOOP = 64 * 1024


#: Responses a caller of :meth:`Channel.respond` or :meth:`Channel.request` may leave unwritten
#: before it waits for the writer: a peer that does not read must not grow our memory without bound.
HIGH_WATER = 1 << 20
#: How long a last frame before closing may take to leave: a peer that does not read gets none.
CLOSING_WRITE_DEADLINE = 1.0
#: Queue times a consumer-side channel keeps of its frames no coordinator request has named yet.
#: Past it the oldest are dropped: a request naming a dropped frame renews no lease, which is
#: safe, and a connection that no coordinator request ever comes over (a fetch connection)
#: holds no more than this. A coordinator request names a frame the coordinator had received
#: when it built the request, so a recent one: only a consumer queueing this many frames within
#: a round trip would lose the one named.
SENT_TIMES_KEPT = 1024


def acknowledged_frames(message: RequestMessage) -> int:
    """The frame count a coordinator request names (docs/design.md#ownership-lease); -1 for any
    other request, which names none."""
    if isinstance(message, PingRequest | StopFetcherRequest | StartFetcherRequest):
        return message.acknowledged_frames
    return -1


ResponseHandler = Callable[[ResponseMessage | None], None]
"""Called by the reader with the response, or with None when the connection ends first."""

#: At most one log line per this many seconds for each kind of repeated event a client can cause.
LOG_INTERVAL = 10.0


@attrs.define(eq=False)
class RateLimitedLog:
    """One line now, then at most one per ``interval`` with how many were left unsaid: a client
    that repeats what makes us log must not fill the disk or bury everything else."""

    logger: logging.Logger
    level: int = logging.WARNING
    interval: float = LOG_INTERVAL
    _next_at: float = -math.inf
    _unsaid: int = 0

    def log(self, message: str, *args: object) -> None:
        now = trio.current_time()
        if now < self._next_at:
            self._unsaid += 1
            return
        if self._unsaid:
            message += " (and %d more like it since the last such line)"
            args = (*args, self._unsaid)
        self.logger.log(self.level, message, *args)
        self._unsaid = 0
        self._next_at = now + self.interval


@attrs.define(eq=False)
class ReadBudget:
    """The bytes of unfinished frames all of a broker's connections may hold together
    (``ConnectionLimits.max_buffered_request_bytes``), in the manner of Kafka's
    ``queued.max.request.bytes``: a connection claims a frame's whole size as soon as its size
    field has arrived, and reads nothing more of it until the claim fits.

    It cannot deadlock: a connection that holds the only claim always gets what it asks (so a frame
    larger than the budget but within the frame limit still arrives), and every waiting claim
    belongs to a connection in the middle of a frame, whose frame deadline closes it and frees
    its bytes if the others never make room.
    """

    limit: int
    used: int = 0
    _room: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot)

    async def claim(self, held: int, wanted: int) -> None:
        """Change one connection's claim from ``held`` to ``wanted`` bytes, waiting (for others
        to release theirs) while growing it would go past the limit."""
        if wanted <= held:
            self.release(held - wanted)
            return
        while self.used - held + wanted > self.limit and self.used > held:
            await self._room.park()
        self.used += wanted - held

    def release(self, amount: int) -> None:
        if amount:
            self.used -= amount
            self._room.unpark_all()


@attrs.define(eq=False)
class ReadBounds:
    """What bounds the reading side of every connection of one broker."""

    limits: ConnectionLimits
    budget: ReadBudget
    #: Answers that could not be encoded, replaced by an error response.
    unanswerable: RateLimitedLog = attrs.field(factory=lambda: RateLimitedLog(log))
    #: Whole frames at least this large are decoded in a worker thread; None: every frame on
    #: the loop, for the deterministic test driver, whose virtual clock would jump ahead while a
    #: thread works.
    decode_off_loop: int | None = DECODE_OFF_LOOP
    #: One large frame decoded off the loop at a time: more threads would only take turns with
    #: the loop for the GIL.
    decoder: trio.CapacityLimiter = attrs.field(factory=lambda: trio.CapacityLimiter(1))

    @classmethod
    def of(cls, limits: ConnectionLimits, *, threads: bool = True) -> ReadBounds:
        return cls(
            limits=limits,
            budget=ReadBudget(limit=limits.max_buffered_request_bytes),
            decode_off_loop=DECODE_OFF_LOOP if threads else None,
        )


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
    #: None: nothing bounds reading (a client's channel).
    bounds: ReadBounds | None = None
    #: The broker listener the connection came in on (transport/security.py): the addresses the
    #: peer is told to reach brokers at are those advertised on it. "": no listener named.
    listener: str = ""
    #: Who the listener admitted the peer as (transport/security.py): what access rules name.
    principal: str = ANONYMOUS
    #: The address the peer connected from, as the listener saw it ("": not known).
    host: str = ""
    #: The reader's deadlines, the earlier of the idle and the frame deadline.
    _watchdog: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    _idle_deadline: float = math.inf
    #: When the frame being received began to arrive; None between frames.
    _frame_began: float | None = None
    #: Never idle (a registered member: it answers Pings, and its failure detector judges it).
    _never_idle: bool = False
    #: Bytes this connection holds of ``bounds.budget``.
    _claimed: int = 0
    #: The frame size of each request read and not yet answered, by correlation id (bounded
    #: channels only), and their sum.
    _unanswered: dict[int, int] = attrs.field(factory=dict)
    _unanswered_bytes: int = 0
    _answered: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot)
    #: Frame number (1-based, this connection's) -> the trio time it was queued, oldest first,
    #: for the frames no coordinator request has named yet (consumer role only).
    _sent_times: dict[int, float] = attrs.field(factory=dict)
    #: The error frame the peer closed the connection with, if it did.
    _peer_error: PeerError | None = None

    @classmethod
    def open(
        cls,
        stream: trio.abc.Stream,
        role: Role,
        *,
        client_id: str = "",
        max_frame_size: int,
        bounds: ReadBounds | None = None,
    ) -> Channel:
        connection = Connection(role, client_id=client_id, max_frame_size=max_frame_size)
        return cls(stream=stream, connection=connection, peer=_peer_name(stream), bounds=bounds)

    def never_idle(self) -> None:
        """The idle timeout no longer applies (a member registered on this connection)."""
        if self._never_idle:
            return
        self._never_idle = True
        self._set_deadline()

    @property
    def frames_received(self) -> int:
        """Complete frames received from the peer on this connection: what a coordinator request
        built now carries as ``acknowledged_frames`` (docs/design.md#ownership-lease)."""
        return self.connection.frames_received

    @property
    def frames_sent(self) -> int:
        return self.connection.frames_sent

    def sent_at(self, frame: int) -> float | None:
        """The trio time this side queued its ``frame``-th frame (1-based) on this connection, or
        None: not a frame number (0, -1), not sent yet, or forgotten (named by an earlier
        coordinator request than a later one, or dropped past :data:`SENT_TIMES_KEPT`).
        Kept on the consumer side only, the side coordinator requests come to."""
        return self._sent_times.get(frame)

    def _acknowledged(self, frame: int) -> None:
        """A coordinator request named ``frame``: the queue times of earlier frames are no longer
        needed (requests come in the order they were built, with counts that only grow; one that
        does not finds its frame gone and renews nothing). ``frame`` itself is kept: the next
        request names it again if nothing newer has arrived meanwhile."""
        times = self._sent_times
        while times and (oldest := next(iter(times))) < frame:
            del times[oldest]

    def _record_sent(self) -> None:
        if self.connection.our_role is not Role.CONSUMER:
            return  # the broker side receives no coordinator requests, so needs no times
        times = self._sent_times
        times[self.connection.frames_sent] = trio.current_time()
        if len(times) > SENT_TIMES_KEPT:
            del times[next(iter(times))]

    async def request(
        self, message: RequestMessage, *, api_version: int | None = None
    ) -> ResponseMessage:
        """Send a request and wait for its response (the caller's cancel scope is the deadline);
        ``api_version`` None: the newest."""
        done = trio.Event()
        answers: list[ResponseMessage | None] = []

        def on_response(response: ResponseMessage | None) -> None:
            answers.append(response)
            done.set()

        correlation_id = self.request_nowait(message, on_response, api_version=api_version)
        try:
            await self._wait_for_room()
            await done.wait()
        finally:
            self.abandon(correlation_id)
        if not answers or answers[0] is None:
            refused = self._peer_error
            if refused is not None and refused.error_code is ErrorCode.UNSUPPORTED_VERSION:
                raise UnsupportedVersion(f"{self.peer}: {refused.message}")
            if self._never_answered():
                raise ListenerNeedsTls(
                    f"{self.peer} closed the connection before answering "
                    "(does this listener need TLS?)"
                )
            raise ChannelClosed(f"connection to {self.peer} closed before the response")
        response = answers[0]
        if (
            getattr(response, "error_code", None) is ErrorCode.ILLEGAL_SASL_STATE
            and self.connection.our_role is Role.CONSUMER
        ):
            raise ListenerNeedsSasl(f"{self.peer}: this listener needs SASL")
        return response

    def _never_answered(self) -> bool:
        """A client's connection without TLS that the broker closed before its first frame."""
        return (
            self.connection.our_role is Role.CONSUMER
            and self.connection.frames_received == 0
            and not isinstance(self.stream, trio.SSLStream)
        )

    def request_nowait(
        self,
        message: RequestMessage,
        on_response: ResponseHandler,
        *,
        api_version: int | None = None,
    ) -> int:
        """Queue a request; the reader calls ``on_response`` from its own task when the answer
        comes (or with None if the connection ends first). For the coordinator's Pings: one
        scheduler sends thousands of them without a task, a cancel scope or an Event each.
        ``api_version`` None: the newest; the coordinator sends a member what it serves.

        Returns the correlation id, for :meth:`abandon`."""
        if self.closed or self.connection.state is not ConnectionState.OPEN:
            raise ChannelClosed(f"connection to {self.peer} is closed")
        event = self.connection.new_request(message, api_version)
        self._handlers[event.correlation_id] = on_response
        self._queue(self.connection.send(event))
        return event.correlation_id

    def abandon(self, correlation_id: int) -> None:
        """The caller gave up on a request (its deadline passed): a late answer is dropped."""
        self._handlers.pop(correlation_id, None)

    async def respond(self, request: Request, message: ResponseMessage) -> None:
        """Answer ``request``; an answer that cannot be encoded (one that would exceed the frame
        limit: the peer asked for too much) is replaced by an error response, never raised."""
        self._answering(request)
        if self.closed or self.connection.state is not ConnectionState.OPEN:
            return  # the peer is gone or refused: nobody will read this answer
        try:
            data = self._response(request, message)
        except LocalProtocolError as exc:
            code = (
                ErrorCode.RESPONSE_TOO_LARGE
                if exc.error_code is ErrorCode.FRAME_TOO_LARGE
                else ErrorCode.UNKNOWN_SERVER_ERROR
            )
            (log.warning if self.bounds is None else self.bounds.unanswerable.log)(
                "answered %s from %s with %s: %s",
                type(request.message).__name__,
                self.peer,
                code.name,
                exc,
            )
            data = self._response(request, error_response(request.message, code))
        self._queue(data)
        await self._wait_for_room()

    def _response(self, request: Request, message: ResponseMessage) -> bytes:
        return self.connection.send(
            Response(
                correlation_id=request.correlation_id, message=message, request=request.message
            )
        )

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

    async def abort(self) -> None:
        """Close with a reset, not an end of stream: the peer reads a failed connection. A
        consumer that gives up its coordinator connection while it still fetches closes this way,
        since the coordinator takes an end of stream as proof that the member stopped
        (docs/design.md#ownership-lease). A TCP stream resets with SO_LINGER zero; another stream
        resets if it offers ``abort()`` (the simulation's), and closes plainly otherwise (TLS
        over TCP resets through the socket beneath)."""
        stream: object = self.stream
        while isinstance(stream, trio.SSLStream):
            stream = stream.transport_stream
        if isinstance(stream, trio.SocketStream):
            with contextlib.suppress(OSError):
                stream.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        else:
            abort = getattr(stream, "abort", None)
            if callable(abort):
                abort()
        await self.aclose()

    async def _read(self, on_request: Callable[[Request], Awaitable[None]]) -> None:
        try:
            with self._watchdog:
                self._touch()
                await self._read_events(on_request)
            if self._watchdog.cancelled_caught:
                self._expired()
        except RemoteProtocolError as exc:
            log.warning("closing %s: %s (%s)", self.peer, exc, exc.error_code.name)
            await self._tell_peer(exc)
            raise
        except trio.BrokenResourceError:
            self.broken = True
        except trio.ClosedResourceError:
            return
        finally:
            self._claim_nothing()

    def _expired(self) -> None:
        """The watchdog fired: raise if a frame was too slow, return if the peer was idle."""
        bounds = self.bounds
        assert bounds is not None
        began = self._frame_began
        if began is not None and trio.current_time() >= began + bounds.limits.frame_timeout:
            raise RemoteProtocolError(
                f"a frame begun {bounds.limits.frame_timeout:g} s ago is not complete",
                ErrorCode.REQUEST_TIMED_OUT,
            )
        log.debug("closing %s: idle for %g s", self.peer, bounds.limits.idle_timeout)

    async def _read_events(self, on_request: Callable[[Request], Awaitable[None]]) -> None:
        connection = self.connection
        while True:
            decoder = self._off_loop_decoder()
            if decoder is None:
                event = connection.next_event()
            else:
                event = await trio.to_thread.run_sync(connection.next_event, limiter=decoder)
            if event is NEED_DATA:
                if self.bounds is not None and (connection.buffered_bytes or self._claimed):
                    await self._await_room_for_frame()
                data = await self.stream.receive_some(RECEIVE_SIZE)
                self.connection.receive_data(bytes(data))
                if data:
                    self._touch()
                continue
            if self._frame_began is not None:
                self._frame_began = None
                self._set_deadline()
            if isinstance(event, Response):
                handler = self._handlers.pop(event.correlation_id, None)
                if handler is not None:
                    handler(event.message)
            elif isinstance(event, Request):
                self._acknowledged(acknowledged_frames(event.message))
                if self.bounds is not None:
                    await self._await_room_for_request(event)
                await on_request(event)
            elif isinstance(event, ConnectionClosed):
                return
            elif isinstance(event, PeerError):
                log.info("%s reported %s: %s", self.peer, event.error_code.name, event.message)
                self._peer_error = event
                return

    def _off_loop_decoder(self) -> trio.CapacityLimiter | None:
        """The limiter to decode the next frame under in a worker thread, if it is whole and
        large enough for that (None: decode it on the loop), so that one client's big request
        does not stall the others. Meanwhile this reader (the only caller of ``receive_data``
        and ``next_event``) waits, and the loop may only send on the connection, which touches
        other correlation ids than the decode does."""
        bounds = self.bounds
        if bounds is None or bounds.decode_off_loop is None:
            return None
        size = self.connection.next_frame_bytes
        if size is None or size < bounds.decode_off_loop or self.connection.buffered_bytes < size:
            return None
        return bounds.decoder

    async def _await_room_for_frame(self) -> None:
        """Between reads: start the deadline of a frame that has begun to arrive, and claim its
        size from the broker's budget, waiting (not reading) while the budget has no room."""
        assert self.bounds is not None
        buffered = self.connection.buffered_bytes
        if buffered and self._frame_began is None:
            self._frame_began = trio.current_time()
            self._set_deadline()
        wanted = self.connection.next_frame_bytes or buffered
        await self.bounds.budget.claim(self._claimed, wanted)
        self._claimed = wanted

    async def _await_room_for_request(self, request: Request) -> None:
        """Take a request only while those read and not answered yet, this one included, fit one
        frame (or it is the only one): with the request queue's length, this bounds what a peer
        that pipelines requests and never reads the answers makes us hold, whatever their size.
        Its waiting reader reads nothing, so the idle timeout closes it in the end."""
        size = self.connection.last_frame_bytes
        limit = self.connection.max_frame_size
        while self._unanswered_bytes and self._unanswered_bytes + size > limit:
            await self._answered.park()
        self._unanswered[request.correlation_id] = size
        self._unanswered_bytes += size

    def _answering(self, request: Request) -> None:
        size = self._unanswered.pop(request.correlation_id, 0)
        if size:
            self._unanswered_bytes -= size
            self._answered.unpark_all()

    def _claim_nothing(self) -> None:
        if self.bounds is not None:
            self.bounds.budget.release(self._claimed)
        self._claimed = 0

    def _touch(self) -> None:
        """Bytes arrived: the idle deadline starts again."""
        if self.bounds is not None and not self._never_idle:
            self._idle_deadline = trio.current_time() + self.bounds.limits.idle_timeout
            self._set_deadline()

    def _set_deadline(self) -> None:
        if self.bounds is None:
            return
        idle = math.inf if self._never_idle else self._idle_deadline
        began = self._frame_began
        frame = math.inf if began is None else began + self.bounds.limits.frame_timeout
        self._watchdog.deadline = min(idle, frame)

    def _queue(self, data: bytes) -> None:
        """Send one frame the connection has just encoded (so counted), in order."""
        self._record_sent()
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
    while isinstance(stream, trio.SSLStream):
        stream = stream.transport_stream
    socket = getattr(stream, "socket", None)
    if socket is not None:
        try:
            host, port = socket.getpeername()[:2]
            return f"{host}:{port}"
        except OSError:
            pass
    return type(stream).__name__
