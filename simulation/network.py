"""The in-memory network: connections between simulated hosts and the broker, which a test can
cut, delay or reset as TCP would be, and which report every frame crossing them to an observer
(the invariant checker's ledger), decoded by the protocol's own codec."""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Protocol

import attrs
import trio
import trio.testing

from protocol import Connection, PeerError, ProtocolError, Request, Response, Role

log = logging.getLogger(__name__)


class NetworkUnreachable(OSError):
    """A connect from a host whose network is cut."""


@attrs.define(eq=False)
class SimulatedHost:
    """One consumer process's network: while it is cut, none of its connections carry a byte in
    either direction (TCP keeps what was sent and delivers it, in order, once the cut heals), and
    new connections fail. While delivery is delayed in one direction, the bytes sent that way on
    any of its connections (new ones too: they still open) stay in flight, and arrive in order
    when the delay ends: TCP retransmitting over a path that lost every packet for a while."""

    down_until: float = -math.inf
    #: Until when bytes towards the consumer, and towards the broker, stay in flight.
    to_client_held_until: float = -math.inf
    to_server_held_until: float = -math.inf
    links: list[Link] = attrs.field(factory=list)

    @property
    def reachable(self) -> bool:
        return trio.current_time() >= self.down_until

    @property
    def delayed(self) -> bool:
        now = trio.current_time()
        return now < self.to_client_held_until or now < self.to_server_held_until

    async def heal_at(self, at: float) -> None:
        await trio.sleep_until(at)
        for link in self.links:
            link.wake()

    def cut(self, seconds: float, nursery: trio.Nursery) -> None:
        """Carry no byte either way and refuse new connections for ``seconds`` from now."""
        until = trio.current_time() + seconds
        if until > self.down_until:
            self.down_until = until
            nursery.start_soon(self.heal_at, until)

    def delay(
        self, seconds: float, nursery: trio.Nursery, *, to_client: bool, to_server: bool
    ) -> None:
        """Hold the bytes sent towards the client and/or the server for ``seconds`` from now."""
        until = trio.current_time() + seconds
        if to_client:
            self.to_client_held_until = max(self.to_client_held_until, until)
        if to_server:
            self.to_server_held_until = max(self.to_server_held_until, until)
        nursery.start_soon(self.heal_at, until)


# --- what crosses the wire -----------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Frame:
    """One frame that crossed a link, as the protocol decodes it."""

    #: 1-based, per side and per link: what a coordinator request's ``acknowledged_frames``
    #: counts (docs/design.md#ownership-lease).
    number: int
    from_client: bool
    event: Request | Response | PeerError
    #: When its sender handed it to the link, before a freeze of the sender held it back: no
    #: earlier than its sender's own machine queued it, no later than the peer could read it.
    sent_at: float


class WireObserver(Protocol):
    """What is told of every link it observes, at the instant each thing happens."""

    def frame_sent(self, link: Link, frame: Frame) -> None:
        """A side handed ``frame`` to the link (whether or not it ever arrives)."""

    def frame_delivered(self, link: Link, frame: Frame) -> None:
        """The other side read the last byte of ``frame`` now."""

    def end_sent(self, link: Link, *, by_client: bool, reset: bool) -> None:
        """A side closed its end now: an end of stream, or a reset (``reset``: the link was
        reset before, or by, the close, so the peer reads a broken connection)."""

    def end_seen(self, link: Link, *, by_client: bool) -> None:
        """A side learned now that the connection ended: it read an end of stream, or a read
        or a write of it failed with a reset."""


#: The observer decodes whatever either side sends: the sides enforce their own frame limits.
_NO_LIMIT = 2**31 - 1


class ReplayedConnection(Connection):
    """A side's protocol machine as the wire observer keeps it: fed the bytes its side reads
    and replaying what its side sends, so that it decodes each frame as that side does."""


@attrs.define(eq=False)
class _Direction:
    """The frames one side sent, decoded as its peer's protocol machine would decode them, and
    how far the peer has read."""

    #: The receiving side's machine, fed every byte sent; None once the bytes stopped making
    #: sense (a peer breaking the protocol on purpose): nothing more is reported that way.
    decoder: ReplayedConnection | None
    sent_bytes: int = 0
    delivered_bytes: int = 0
    frames: int = 0
    #: (end offset in the byte stream, frame) of the frames not read yet, in order.
    in_flight: deque[tuple[int, Frame]] = attrs.field(factory=deque)

    @classmethod
    def of(cls, receiver: Role) -> _Direction:
        return cls(decoder=ReplayedConnection(receiver, max_frame_size=_NO_LIMIT))


@attrs.define(eq=False)
class _Wire:
    """Both directions of one link, decoded. Each side's machine also replays what the other
    side sends, so that it knows the requests a response answers exactly as that side does."""

    link: Link
    observer: WireObserver
    to_server: _Direction = attrs.field(factory=lambda: _Direction.of(Role.BROKER))
    to_client: _Direction = attrs.field(factory=lambda: _Direction.of(Role.CONSUMER))

    def sent(self, from_client: bool, data: bytes, at: float) -> None:
        way, back = (
            (self.to_server, self.to_client) if from_client else (self.to_client, self.to_server)
        )
        decoder = way.decoder
        way.sent_bytes += len(data)
        if decoder is None:
            return
        decoder.receive_data(data)
        while True:
            try:
                event = decoder.next_event()
            except ProtocolError as exc:
                log.debug("no longer decoding a link's frames one way: %s", exc)
                way.decoder = None
                return
            if not isinstance(event, Request | Response | PeerError):
                return
            if back.decoder is not None and not isinstance(event, PeerError):
                try:
                    back.decoder.send(event)  # the sender's own machine, replayed
                except ProtocolError as exc:
                    log.debug("no longer decoding a link's frames one way: %s", exc)
                    back.decoder = None
            way.frames += 1
            frame = Frame(number=way.frames, from_client=from_client, event=event, sent_at=at)
            way.in_flight.append((way.sent_bytes - decoder.buffered_bytes, frame))
            self.observer.frame_sent(self.link, frame)

    def delivered(self, to_client: bool, size: int) -> None:
        way = self.to_client if to_client else self.to_server
        way.delivered_bytes += size
        while way.in_flight and way.in_flight[0][0] <= way.delivered_bytes:
            self.observer.frame_delivered(self.link, way.in_flight.popleft()[1])


@attrs.define(eq=False)
class _Pipe:
    data: bytearray = attrs.field(factory=bytearray)
    eof: bool = False
    reader_closed: bool = False


@attrs.define(eq=False)
class Link:
    """One in-memory connection between a client host and the broker; ``observer`` is told of
    every frame and every end on it."""

    host: SimulatedHost | None
    to_server: _Pipe = attrs.field(factory=_Pipe)
    to_client: _Pipe = attrs.field(factory=_Pipe)
    reset: bool = False
    observer: WireObserver | None = None
    _lot: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot)
    _wire: _Wire | None = None

    def __attrs_post_init__(self) -> None:
        if self.observer is not None:
            self._wire = _Wire(link=self, observer=self.observer)

    def _sent(self, pipe: _Pipe, data: bytes, at: float) -> None:
        if self._wire is not None and data:
            self._wire.sent(pipe is self.to_server, data, at)

    def _delivered(self, pipe: _Pipe, size: int) -> None:
        if self._wire is not None:
            self._wire.delivered(pipe is self.to_client, size)

    def _end_sent(self, pipe: _Pipe) -> None:
        if self.observer is not None:
            self.observer.end_sent(self, by_client=pipe is self.to_server, reset=self.reset)

    def _end_seen(self, pipe: _Pipe) -> None:
        """The reader of ``pipe`` learned that the connection ended."""
        if self.observer is not None:
            self.observer.end_seen(self, by_client=pipe is self.to_client)

    @property
    def delivering(self) -> bool:
        return self.host is None or self.host.reachable

    def delivering_to(self, pipe: _Pipe) -> bool:
        """Whether bytes (and a reset) reach the reader of ``pipe`` now."""
        host = self.host
        if host is None:
            return True
        held_until = (
            host.to_client_held_until if pipe is self.to_client else host.to_server_held_until
        )
        return host.reachable and trio.current_time() >= held_until

    def wake(self) -> None:
        self._lot.unpark_all()

    async def park(self) -> None:
        await self._lot.park()

    def break_(self) -> None:
        """The connection is reset: both ends see it fail (once bytes flow on the link)."""
        self.reset = True
        self.wake()


@attrs.define(eq=False)
class LinkEnd(trio.abc.Stream):
    """One end of a :class:`Link` as a trio stream. ``hold`` is awaited before every read and
    write: a frozen process does neither."""

    link: Link
    outgoing: _Pipe
    incoming: _Pipe
    hold: Callable[[], Awaitable[None]] | None = None
    _closed: bool = False

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        # The instant the sender handed the bytes over, before a freeze holds them back.
        await self.send_queued(data, trio.current_time())

    async def send_queued(self, data: bytes | bytearray | memoryview, queued_at: float) -> None:
        """Send bytes that the process's code handed over at ``queued_at``: what the wire
        ledger dates them by, however long a freeze or a slow process kept them since."""
        await trio.lowlevel.checkpoint()
        if self.hold is not None:
            await self.hold()
        if self._closed:
            raise trio.ClosedResourceError
        # The peer's reset comes back the way its bytes do.
        delivering = self.link.delivering_to(self.incoming)
        if delivering and (self.link.reset or self.outgoing.reader_closed):
            self.link._end_seen(self.incoming)
            raise trio.BrokenResourceError("connection reset by peer")
        self.link._sent(self.outgoing, bytes(data), queued_at)
        if not self.outgoing.reader_closed:
            self.outgoing.data += data
        self.link.wake()

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.checkpoint()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        await trio.lowlevel.checkpoint()
        while True:
            if self.hold is not None:
                await self.hold()
            if self._closed:
                raise trio.ClosedResourceError
            if self.link.delivering_to(self.incoming):
                if self.link.reset:
                    self.link._end_seen(self.incoming)
                    raise trio.BrokenResourceError("connection reset")
                if self.incoming.data:
                    size = len(self.incoming.data) if max_bytes is None else max_bytes
                    chunk = bytes(self.incoming.data[:size])
                    del self.incoming.data[:size]
                    self.link._delivered(self.incoming, len(chunk))
                    return chunk
                if self.incoming.eof:
                    self.link._end_seen(self.incoming)
                    return b""
            await self.link.park()

    @property
    def closed(self) -> bool:
        return self._closed

    def abort(self) -> None:
        """Close with a reset (TCP's SO_LINGER zero): the peer reads a broken connection, not an
        end of stream (``Channel.abort``)."""
        self.link.break_()

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            self.link._end_sent(self.outgoing)
            self.outgoing.eof = True
            self.incoming.reader_closed = True
            self.incoming.data.clear()
            self.link.wake()
        await trio.lowlevel.checkpoint()
