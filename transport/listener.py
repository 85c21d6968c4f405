"""The broker's accept loop, in the manner of trio's ``serve_listeners``, with a production
broker's limits on connections (``ConnectionLimits``: Kafka's ``max.connections`` and
``max.connections.per.ip``).

A connection over a limit is accepted and closed at once, before anything is allocated for it, so
a flood costs one accept and one close per connection. When accepting fails for want of resources
(EMFILE: the process's file limit) the loop waits briefly and tries again; trio's loop logs a
traceback every 0.1 s meanwhile, this one a line per 10 s. Both kinds of line say how many
were left unsaid.

While the broker is busy (``broker.door.AcceptPace``) the loop accepts at a pace, not at once:
the connections not yet accepted wait in the kernel's listen queue, which costs the broker
nothing, and the queue is shortened meanwhile (``listen`` again with a smaller backlog, which
Linux applies to a listening socket), so that what waits is what the broker will soon take, and
the rest is the kernel's to turn away and the client's connect to try again.

Each listener may admit its connections through TLS and SASL first (:mod:`transport.security`):
that runs in the connection's own task, once the gate admitted it, so a connection that is slow to
authenticate holds its place in the limits like any other.
"""

from __future__ import annotations

import errno
import logging
import socket as stdlib_socket
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

import attrs
import trio

from transport.channel import RateLimitedLog
from transport.limits import ConnectionLimits, FileBudget
from transport.security import ListenerSecurity, Peer, admit

__all__ = ["ConnectionGate", "SecuredListener", "serve_listeners"]

log = logging.getLogger(__name__)

#: After an accept failed for want of resources, wait this long before the next one: the
#: connections that hold them must get a chance to close.
ACCEPT_BACKOFF = 0.1
_OUT_OF_RESOURCES = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}

#: ``handler(stream, peer)``: serves one admitted connection.
ConnectionHandler = Callable[[trio.abc.Stream, Peer], Awaitable[None]]

#: The listen queue when accepts are not paced: trio's default (the kernel caps it at
#: ``net.core.somaxconn``).
FULL_BACKLOG = 0xFFFF


class Pace(Protocol):
    #: The listen queue while accepts are paced.
    backlog: int

    def delay(self, now: float) -> float | None:
        """Seconds to wait before the next accept (0: accept now); None: not paced now."""
        ...


@attrs.frozen(kw_only=True, eq=False)
class SecuredListener:
    """A socket listener and how it admits connections (None: plaintext, nobody authenticated)."""

    listener: trio.SocketListener
    security: ListenerSecurity | None = None


@attrs.define(eq=False)
class ConnectionGate:
    """Counts open connections, in total and by client address, and refuses those over a limit
    or beyond the file budget they share with the log's segment files."""

    limit: int
    per_address: int | None
    #: None: connections are counted here only (the metrics port, tests).
    budget: FileBudget | None = None
    open: int = 0
    by_address: Counter[str] = attrs.field(factory=Counter)
    refusals: RateLimitedLog = attrs.field(factory=lambda: RateLimitedLog(log))

    @classmethod
    def of(cls, limits: ConnectionLimits, budget: FileBudget | None = None) -> ConnectionGate:
        return cls(
            limit=limits.connection_limit(),
            per_address=limits.max_connections_per_address,
            budget=budget,
        )

    def admit(self, address: str) -> bool:
        if self.open >= self.limit:
            self.refusals.log(
                "refused a connection from %s: %d connections are open, the limit",
                address,
                self.open,
            )
            return False
        if self.per_address is not None and self.by_address[address] >= self.per_address:
            self.refusals.log(
                "refused a connection from %s: %d connections from that address are open, "
                "the limit",
                address,
                self.by_address[address],
            )
            return False
        if self.budget is not None and not self.budget.admit_connection():
            self.refusals.log(
                "refused a connection from %s: the file budget is used up (%d connections and "
                "%d segment files open, %d files in all)",
                address,
                self.budget.connections,
                self.budget.files,
                self.budget.limit,
            )
            return False
        self.open += 1
        self.by_address[address] += 1
        return True

    def leave(self, address: str) -> None:
        if self.budget is not None:
            self.budget.leave_connection()
        self.open -= 1
        self.by_address[address] -= 1
        if not self.by_address[address]:
            del self.by_address[address]


async def serve_listeners(
    handler: ConnectionHandler,
    listeners: Sequence[trio.SocketListener | SecuredListener],
    gate: ConnectionGate,
    *,
    pace: Pace | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Accept connections on every listener until cancelled, each served by ``handler`` in its
    own task, the ones ``gate`` admits, at ``pace`` if given."""
    out_of_resources = RateLimitedLog(log)
    async with trio.open_nursery() as nursery:
        for listener in listeners:
            secured = (
                listener
                if isinstance(listener, SecuredListener)
                else SecuredListener(listener=listener)
            )
            nursery.start_soon(
                _accept_loop, secured, handler, gate, out_of_resources, nursery, pace
            )
        task_status.started()


async def _accept_loop(
    secured: SecuredListener,
    handler: ConnectionHandler,
    gate: ConnectionGate,
    out_of_resources: RateLimitedLog,
    connections: trio.Nursery,
    pace: Pace | None,
) -> None:
    paced = False
    while True:
        if pace is not None:
            delay = pace.delay(trio.current_time())
            if (delay is not None) != paced:
                paced = delay is not None
                secured.listener.socket.listen(pace.backlog if paced else FULL_BACKLOG)
            if delay:
                await trio.sleep(delay)
                continue
        try:
            sock, _ = await secured.listener.socket.accept()
        except OSError as exc:
            if exc.errno not in _OUT_OF_RESOURCES:
                raise
            out_of_resources.log(
                "cannot accept connections: %s; trying again every %g s", exc, ACCEPT_BACKOFF
            )
            await trio.sleep(ACCEPT_BACKOFF)
            continue
        address = _address(sock)
        if not gate.admit(address):
            sock.close()
            continue
        connections.start_soon(_serve, handler, sock, secured.security, gate, address)


async def _serve(
    handler: ConnectionHandler,
    sock: trio.socket.SocketType,
    security: ListenerSecurity | None,
    gate: ConnectionGate,
    address: str,
) -> None:
    try:
        stream: trio.abc.Stream = trio.SocketStream(sock)
        if security is None:
            await handler(stream, Peer(host=address))
            return
        admitted = await admit(stream, security)
        if admitted is not None:
            served, peer = admitted
            await handler(served, attrs.evolve(peer, host=address))
    except Exception:
        # The handlers contain their own failures; this is the last guard of the listener.
        log.exception("serving a connection from %s failed", address)
    finally:
        gate.leave(address)


def _address(sock: trio.socket.SocketType) -> str:
    if sock.family not in (stdlib_socket.AF_INET, stdlib_socket.AF_INET6):
        return ""
    try:
        return str(sock.getpeername()[0])
    except OSError:
        return ""
