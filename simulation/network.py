"""The in-memory network: connections between simulated hosts and the broker, which a test can
cut, delay or reset as TCP would be."""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable

import attrs
import trio
import trio.testing

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


@attrs.define(eq=False)
class _Pipe:
    data: bytearray = attrs.field(factory=bytearray)
    eof: bool = False
    reader_closed: bool = False


@attrs.define(eq=False)
class Link:
    """One in-memory connection between a client host and the broker."""

    host: SimulatedHost | None
    to_server: _Pipe = attrs.field(factory=_Pipe)
    to_client: _Pipe = attrs.field(factory=_Pipe)
    reset: bool = False
    _lot: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot)

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
        await trio.lowlevel.checkpoint()
        if self.hold is not None:
            await self.hold()
        if self._closed:
            raise trio.ClosedResourceError
        # The peer's reset comes back the way its bytes do.
        delivering = self.link.delivering_to(self.incoming)
        if delivering and (self.link.reset or self.outgoing.reader_closed):
            raise trio.BrokenResourceError("connection reset by peer")
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
                    raise trio.BrokenResourceError("connection reset")
                if self.incoming.data:
                    size = len(self.incoming.data) if max_bytes is None else max_bytes
                    chunk = bytes(self.incoming.data[:size])
                    del self.incoming.data[:size]
                    return chunk
                if self.incoming.eof:
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
            self.outgoing.eof = True
            self.incoming.reader_closed = True
            self.incoming.data.clear()
            self.link.wake()
        await trio.lowlevel.checkpoint()
