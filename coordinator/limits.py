"""The bounds a broker puts on what any one client may make it hold or do.

Every byte a client sends is hostile until it is bounded and checked: each limit here caps one
input that would otherwise let a single peer grow the broker's memory, stall its event loop, or
push a frame the broker must send past the frame limit. Each is a ``serve`` option; the defaults
are what a production broker would run with (docs/limits.md lists them with their reasons).
"""

from __future__ import annotations

import resource
from typing import Any

import attrs

#: File descriptors kept back from the connection limit for partition logs, the store and the
#: listener, so that the limit, not EMFILE, is what a flood of connections meets.
FILE_RESERVE = 1024


def _positive(instance: object, attribute: attrs.Attribute[Any], value: float | None) -> None:
    if value is not None and value <= 0:
        raise ValueError(f"{attribute.name} must be positive, not {value}")


@attrs.frozen(kw_only=True)
class ConnectionLimits:
    """What the listener and each connection may hold (Kafka's ``max.connections``,
    ``max.connections.per.ip``, ``connections.max.idle.ms``)."""

    #: Open client connections at once; None: the process's file limit less FILE_RESERVE.
    max_connections: int | None = attrs.field(default=None, validator=_positive)
    #: Open connections from one client address; None: no limit (as Kafka's default: the
    #: capacity benchmark opens 19,000 connections from one address).
    max_connections_per_address: int | None = attrs.field(default=None, validator=_positive)
    #: A connection that sends nothing this long is closed; a registered consumer is never idle
    #: (it answers Pings).
    idle_timeout: float = attrs.field(default=600.0, validator=_positive)
    #: Once a frame's first byte has arrived, the rest must arrive within this long.
    frame_timeout: float = attrs.field(default=30.0, validator=_positive)
    #: Bytes buffered for all connections' unfinished frames together; a connection that would
    #: go past it waits (reads nothing) until others finish or time out.
    max_buffered_request_bytes: int = attrs.field(default=64 * 1024 * 1024, validator=_positive)

    def connection_limit(self) -> int:
        if self.max_connections is not None:
            return self.max_connections
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        # Under a small file limit (1024 is a common default) the reserve is half of it, not
        # all of it: a broker that accepts one connection is no better than one that crashes.
        return max(1, soft - FILE_RESERVE, soft // 2)


@attrs.frozen(kw_only=True)
class RequestLimits:
    """What one request may ask for, checked before it reaches a state machine or an assignor."""

    #: Group, member (consumer) and client ids, in UTF-8 bytes; control characters are refused.
    max_id_bytes: int = attrs.field(default=255, validator=_positive)
    #: A subscription's wildcard pattern, in UTF-8 bytes (compiled by RE2: linear time).
    max_pattern_bytes: int = attrs.field(default=1024, validator=_positive)
    #: Streams (consumer threads) a subscription may ask for on one topic or its wildcard.
    max_streams_per_topic: int = attrs.field(default=1000, validator=_positive)
    #: Topics a subscription may name, and a ClusterMetadata request (which may ask for all).
    max_topics_per_subscription: int = attrs.field(default=1000, validator=_positive)
    #: Partitions of one topic (CreateTopic, CreatePartitions).
    max_partitions_per_topic: int = attrs.field(default=10_000, validator=_positive)
    #: Partitions placed on one broker, over all topics: each is a directory and open files.
    max_partitions_per_broker: int = attrs.field(default=50_000, validator=_positive)
    #: Members of one group (Kafka's ``group.max.size``).
    max_group_size: int = attrs.field(default=10_000, validator=_positive)
    #: Streams (consumer threads) of one group, each member counting its widest topic: the
    #: threads the assignor balances at every rebalance, on the event loop (100,000 of them
    #: take about half a second; the benchmarks' 5,000 members hold one each).
    max_group_streams: int = attrs.field(default=20_000, validator=_positive)
    #: Partitions one OffsetCommit, OffsetFetch or RegisterConsumer (its owned partitions) may
    #: name: at most this many entries are sorted and answered for one request. The benchmarks
    #: reset and read 10,000-partition groups in one request.
    max_partitions_per_request: int = attrs.field(default=10_000, validator=_positive)
