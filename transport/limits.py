"""The bounds a broker puts on what any one client connection may make it hold.

Every byte a client sends is hostile until it is bounded and checked: each limit here caps what a
single peer's connections could otherwise grow (open files, buffered bytes, idle sockets). Each is
a ``serve`` option; the defaults are what a production broker would run with (docs/limits.md lists
them with their reasons). What one request may ask for is bounded in ``coordinator.limits``.
"""

from __future__ import annotations

import resource
import threading
from collections.abc import Callable
from typing import Any

import attrs

#: Files kept out of the file budget: the listeners, the store, stdio and logs, the metrics
#: port's connections (broker/status.py) and the files an I/O thread opens for a moment (an
#: index written, a directory fsynced, a segment scanned), so that the budget, not EMFILE, is
#: what a flood of connections or of partitions meets.
FILE_RESERVE = 256
#: Files of the budget kept for segment files, whatever the connections: enough for every I/O
#: thread to hold one while the rest are reopened on demand.
SEGMENT_FILES_FLOOR = 64
#: Places in the budget segment files leave free for new connections, closing their own to keep
#: them free: an idle segment file may not be closable at once (not yet fsynced), and the event
#: loop that admits a connection does not wait for an fsync.
CONNECTION_HEADROOM = 16


def file_budget_size() -> int:
    """The files a broker may hold for connections and segment files together: the process's
    (soft) file limit less FILE_RESERVE. Under a small limit (1024 is a common default) the
    reserve is half of it, not all of it: a broker that accepts one connection is no better
    than one that crashes."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(2, soft - FILE_RESERVE, soft // 2)


def segment_files_floor(budget: int) -> int:
    return min(SEGMENT_FILES_FLOOR, budget // 2)


def positive(instance: object, attribute: attrs.Attribute[Any], value: float | None) -> None:
    """attrs validator shared by every limit: a limit is positive or None (no limit)."""
    if value is not None and value <= 0:
        raise ValueError(f"{attribute.name} must be positive, not {value}")


@attrs.frozen(kw_only=True)
class ConnectionLimits:
    """What the listener and each connection may hold (Kafka's ``max.connections``,
    ``max.connections.per.ip``, ``connections.max.idle.ms``)."""

    #: Open client connections at once; None: the file budget less the segment files' floor
    #: (the file budget refuses a connection in any case once it is used up: FileBudget).
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
        budget = file_budget_size()
        return budget - segment_files_floor(budget)


@attrs.define(eq=False)
class FileBudget:
    """One count of the files a broker holds for client connections and for segment files
    (broker/log/files.py), against one limit derived from the process's file limit.

    A segment file the log holds open but no thread is using can be closed and reopened on
    demand, a connection cannot: so a connection that finds the budget used up first asks the
    log to give back an idle file (``reclaim``), down to ``floor`` files that connections never
    take, and is refused only when none can be given back. Segment files take what connections
    leave but ``headroom``, once they have ``floor``. Counted from the event loop (connections)
    and from I/O threads (files), hence the lock.
    """

    limit: int
    #: Files kept for segment files: connections are refused before they would take these.
    floor: int
    #: Places segment files beyond the floor leave free for new connections.
    headroom: int = 0
    connections: int = 0
    files: int = 0
    #: Closes one segment file no thread is using (returning it here); False if none can be.
    reclaim: Callable[[], bool] | None = None
    _lock: threading.Lock = attrs.field(factory=threading.Lock)

    @classmethod
    def of_process(cls) -> FileBudget:
        size = file_budget_size()
        return cls(
            limit=size,
            floor=segment_files_floor(size),
            headroom=min(CONNECTION_HEADROOM, size // 8),
        )

    def admit_connection(self) -> bool:
        while True:
            with self._lock:
                if self.connections + max(self.files, self.floor) < self.limit:
                    self.connections += 1
                    return True
                if self.files <= self.floor or self.reclaim is None:
                    return False
            if not self.reclaim():
                return False

    def leave_connection(self) -> None:
        with self._lock:
            self.connections -= 1

    def take_file(self, *, beyond: bool = False) -> bool:
        """Count one more segment file if the budget has room (with ``beyond``: in any case,
        for a file that must open while every open one is in use or not yet flushed)."""
        with self._lock:
            room = self.limit - self.connections - self.files
            if not beyond and (room <= 0 or (self.files >= self.floor and room <= self.headroom)):
                return False
            self.files += 1
            return True

    def return_file(self) -> None:
        with self._lock:
            self.files -= 1
