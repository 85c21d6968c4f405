"""The user's own code run as a process of the simulated cluster, with the faults a test injects
into it."""

from __future__ import annotations

import contextlib
import logging
import math
import struct
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import attrs
import trio
import trio.testing

from .network import LinkEnd, SimulatedHost

if TYPE_CHECKING:
    from .cluster import SimulatedCluster

log = logging.getLogger(__name__)


class ProcessKilled(trio.BrokenResourceError):
    """What a killed process's connections raise, should its code still run."""


@attrs.define(eq=False)
class SimulatedProcess:
    """The user's own code (``open_consumer`` / ``open_producer``, the real library) run as one
    process of the simulated cluster. Its connections are made by :meth:`connect`, which the
    cluster passes to its main function; they are the ones its faults act on.

    Faults: :meth:`kill` (the process dies: its sockets close, its code stops where it is and
    its ``finally`` blocks reach nobody), :meth:`freeze` (nothing is read or written on its
    connections, and no connection opens, until it thaws; its own timers run on, as a lease's
    must), :meth:`cut_network`, :meth:`delay_delivery` and :meth:`drop_connections`.
    """

    name: str
    cluster: SimulatedCluster
    host: SimulatedHost = attrs.field(factory=SimulatedHost)
    frozen_until: float = -math.inf
    #: Each frame it sends leaves this long after the one before it (or after it was sent): a
    #: slow process, whose answers are late one after another (0: at once).
    answer_delay: float = 0.0
    killed: bool = False
    done: trio.Event = attrs.field(factory=trio.Event)
    """Set once its main function returned, raised or was killed."""
    _scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    _ends: list[LinkEnd] = attrs.field(factory=list)

    async def connect(self, host: str, port: int) -> trio.abc.Stream:
        """The ``connect=`` for ``open_consumer`` / ``open_producer``: every address reaches
        the simulated broker."""
        await trio.lowlevel.checkpoint()
        await self._hold()
        stream, _link = self.cluster.open_link(self.host, hold=self._hold)
        assert isinstance(stream, LinkEnd)
        self._ends = [end for end in self._ends if not end.closed]
        self._ends.append(stream)
        return _SlowWrites(end=stream, process=self)

    async def _hold(self) -> None:
        while trio.current_time() < self.frozen_until:
            await trio.sleep_until(self.frozen_until)
        if self.killed:
            raise ProcessKilled(f"process {self.name} was killed")

    async def run(self, main: Callable[..., Awaitable[object]], *args: object) -> None:
        try:
            with self._scope:
                await main(*args, connect=self.connect)
        except* ProcessKilled:
            if not self.killed:
                raise
            # Its code met its closed sockets before the cancellation reached it: it is gone.
        finally:
            self.done.set()

    async def kill(self) -> None:
        """The process dies: the kernel closes its connections (the broker reads an end of
        stream) and its code runs no further; returns once it is gone."""
        self.killed = True
        for end in self._ends:
            await end.aclose()
        self._scope.cancel()
        await self.done.wait()

    def freeze(self, seconds: float) -> None:
        """Stop reading and writing for ``seconds`` (a GC pause, as the coordinator sees it)."""
        self.frozen_until = max(self.frozen_until, trio.current_time() + seconds)

    def cut_network(self, seconds: float) -> None:
        self.host.cut(seconds, self.cluster.nursery)

    def delay_delivery(
        self, seconds: float, *, to_process: bool = True, to_broker: bool = False
    ) -> None:
        self.host.delay(seconds, self.cluster.nursery, to_client=to_process, to_server=to_broker)

    def answer_slowly(self, seconds: float) -> None:
        """Take ``seconds`` over each frame it sends from now on (0: prompt again)."""
        self.answer_delay = seconds

    def drop_connections(self) -> None:
        """Reset every connection it has; the process lives on and connects again."""
        for link in self.host.links:
            link.break_()


@attrs.define(eq=False)
class _SlowWrites(trio.abc.Stream):
    """A process's end of a connection whose frames each leave ``answer_delay`` after the one
    before (or after being sent, if later): a slow process, whose answers are late one after
    another. A frozen process writes nothing until it thaws, and closes or resets nothing (the
    kernel would, at once, only for a dead one).

    Its code is not held up meanwhile: what it sends is taken at once, dated then, and leaves
    in order when it may (a kernel's send buffer), so the wire ledger dates each frame by when
    the code queued it, not by when a frame before it got out."""

    end: LinkEnd
    process: SimulatedProcess
    _reset: bool = False
    _backlog: list[tuple[bytes, float]] = attrs.field(factory=list)
    _sending: bool = False
    _drained: trio.Event = attrs.field(factory=trio.Event)
    _failure: BaseException | None = None

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self._failure is not None:
            raise trio.BrokenResourceError("connection lost") from self._failure
        now = trio.current_time()
        if not self._sending and not self.process.answer_delay and now >= self.process.frozen_until:
            await self.end.send_all(data)
            return
        await trio.lowlevel.checkpoint()
        self._backlog.append((bytes(data), now))
        if not self._sending:
            self._sending = True
            self._drained = trio.Event()
            self.process.cluster.nursery.start_soon(self._send_backlog)

    async def _send_backlog(self) -> None:
        try:
            while self._backlog:
                data, queued_at = self._backlog.pop(0)
                while data:
                    (size,) = struct.unpack_from(">i", data) if len(data) >= 4 else (len(data),)
                    frame, data = data[: 4 + size], data[4 + size :]
                    if self.process.answer_delay:
                        await trio.sleep(self.process.answer_delay)
                    await self.process._hold()
                    await self.end.send_queued(frame, queued_at)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self._failure = exc
            self._backlog.clear()
        finally:
            self._sending = False
            self._drained.set()

    async def wait_send_all_might_not_block(self) -> None:
        await self.end.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        return await self.end.receive_some(max_bytes)

    def abort(self) -> None:
        """Reset on :meth:`aclose`, which ``Channel.abort`` calls next."""
        self._reset = True

    async def aclose(self) -> None:
        with contextlib.suppress(ProcessKilled):
            await self.process._hold()
            if self._sending and not self._reset:
                await self._drained.wait()
        if self._reset:
            self.end.abort()
        await self.end.aclose()
