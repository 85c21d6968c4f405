"""What every client of a broker needs: the bootstrap list, a connection to some broker that
answers, and a channel whose reader runs for as long as the client uses it.

The admin tools, the producer and the consumer all start the same way (try the known brokers
round robin until one answers, as seed 03's onStartup does), so they share this module.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager

import trio

from protocol import Request, Role
from transport.channel import Channel
from transport.refusals import Refused

log = logging.getLogger(__name__)

Address = tuple[str, int]
Connector = Callable[[str, int], Awaitable[trio.abc.Stream]]

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
#: How long one connection attempt may take before the next broker is tried.
CONNECT_DEADLINE = 5.0
DEFAULT_MAX_FRAME_SIZE = 64 * 1024 * 1024


class NoBrokerAvailable(ConnectionError):
    """No broker of the bootstrap list accepted a connection."""


def parse_bootstrap(text: str) -> list[Address]:
    """``HOST:PORT[,HOST:PORT...]`` -> addresses; ValueError with the offending part."""
    addresses = []
    for part in (p.strip() for p in text.split(",")):
        host, sep, port = part.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"bad broker address {part!r}: expected HOST:PORT")
        addresses.append((host.strip("[]"), int(port)))
    return addresses


async def _tcp(host: str, port: int) -> trio.abc.Stream:
    return await trio.open_tcp_stream(host, port)


async def connect_any(
    bootstrap: Sequence[Address], *, connect: Connector = _tcp, start: int = 0
) -> tuple[trio.abc.Stream, Address]:
    """One pass over the bootstrap list, from ``start``: the first broker that accepts; a
    :class:`~transport.refusals.Refused` (a wrong password, a listener that needs TLS) at once."""
    errors = []
    for i in range(len(bootstrap)):
        host, port = bootstrap[(start + i) % len(bootstrap)]
        with trio.move_on_after(CONNECT_DEADLINE):
            try:
                return await connect(host, port), (host, port)
            except OSError as exc:
                if isinstance(exc, Refused):
                    raise  # the cluster's answer: another broker of it would give the same
                errors.append(f"{host}:{port}: {exc.strerror or exc}")
                continue
        errors.append(f"{host}:{port}: no answer in {CONNECT_DEADLINE:g} s")
    raise NoBrokerAvailable("cannot reach any broker (" + "; ".join(errors) + ")")


@asynccontextmanager
async def open_channel(
    stream: trio.abc.Stream,
    *,
    client_id: str = "",
    on_request: Callable[[Request], Awaitable[None]] | None = None,
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
) -> AsyncIterator[Channel]:
    """A client-side channel with its reader running; closed on exit.

    A plain client (an admin tool, a producer) receives no requests: one arriving is a broken
    peer, and ends the connection.
    """
    channel = Channel.open(
        stream, Role.CONSUMER, client_id=client_id, max_frame_size=max_frame_size
    )

    async def refuse(request: Request) -> None:
        log.warning("closing: unexpected %s from the broker", type(request.message).__name__)
        nursery.cancel_scope.cancel()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(channel.run, on_request or refuse)
        try:
            yield channel
        finally:
            nursery.cancel_scope.cancel()
            with trio.CancelScope(shield=True):
                await channel.aclose()
