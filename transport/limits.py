"""The bounds a broker puts on what any one client connection may make it hold.

Every byte a client sends is hostile until it is bounded and checked: each limit here caps what a
single peer's connections could otherwise grow (open files, buffered bytes, idle sockets). Each is
a ``serve`` option; the defaults are what a production broker would run with (docs/limits.md lists
them with their reasons). What one request may ask for is bounded in ``coordinator.limits``.
"""

from __future__ import annotations

import resource
from typing import Any

import attrs

#: File descriptors kept back from the connection limit for partition logs, the store and the
#: listener, so that the limit, not EMFILE, is what a flood of connections meets.
FILE_RESERVE = 1024


def positive(instance: object, attribute: attrs.Attribute[Any], value: float | None) -> None:
    """attrs validator shared by every limit: a limit is positive or None (no limit)."""
    if value is not None and value <= 0:
        raise ValueError(f"{attribute.name} must be positive, not {value}")


@attrs.frozen(kw_only=True)
class ConnectionLimits:
    """What the listener and each connection may hold (Kafka's ``max.connections``,
    ``max.connections.per.ip``, ``connections.max.idle.ms``)."""

    #: Open client connections at once; None: the process's file limit less FILE_RESERVE.
    max_connections: int | None = attrs.field(default=None, validator=positive)
    #: Open connections from one client address; None: no limit (as Kafka's default: the
    #: capacity benchmark opens 19,000 connections from one address).
    max_connections_per_address: int | None = attrs.field(default=None, validator=positive)
    #: A connection that sends nothing this long is closed; a registered consumer is never idle
    #: (it answers Pings).
    idle_timeout: float = attrs.field(default=600.0, validator=positive)
    #: Once a frame's first byte has arrived, the rest must arrive within this long.
    frame_timeout: float = attrs.field(default=30.0, validator=positive)
    #: Bytes buffered for all connections' unfinished frames together; a connection that would
    #: go past it waits (reads nothing) until others finish or time out.
    max_buffered_request_bytes: int = attrs.field(default=64 * 1024 * 1024, validator=positive)
    #: A connection to a TLS or SASL listener must finish its TLS handshake and its
    #: authentication within this long of being accepted.
    handshake_timeout: float = attrs.field(default=10.0, validator=positive)

    def connection_limit(self) -> int:
        if self.max_connections is not None:
            return self.max_connections
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        # Under a small file limit (1024 is a common default) the reserve is half of it, not
        # all of it: a broker that accepts one connection is no better than one that crashes.
        return max(1, soft - FILE_RESERVE, soft // 2)
