"""The bounds a broker puts on what any one request may ask for.

Each limit caps one input that would otherwise let a single peer grow the broker's memory, stall
its event loop, or push a frame the broker must send past the frame limit. Each is a ``serve``
option; the defaults are what a production broker would run with (docs/limits.md lists them with
their reasons). What a connection may hold is bounded in ``transport.limits``.
"""

from __future__ import annotations

import attrs

from transport.limits import positive


@attrs.frozen(kw_only=True)
class RequestLimits:
    """What one request may ask for, checked before it reaches a state machine or an assignor."""

    #: Group, member (consumer) and client ids, in UTF-8 bytes; control characters are refused.
    max_id_bytes: int = attrs.field(default=255, validator=positive)
    #: A subscription's wildcard pattern, in UTF-8 bytes (compiled by RE2: linear time).
    max_pattern_bytes: int = attrs.field(default=1024, validator=positive)
    #: Streams (consumer threads) a subscription may ask for on one topic or its wildcard.
    max_streams_per_topic: int = attrs.field(default=1000, validator=positive)
    #: Topics a subscription may name, and a ClusterMetadata request (which may ask for all).
    max_topics_per_subscription: int = attrs.field(default=1000, validator=positive)
    #: Partitions of one topic (CreateTopic, CreatePartitions).
    max_partitions_per_topic: int = attrs.field(default=10_000, validator=positive)
    #: Partitions placed on one broker, over all topics: each is a directory, and one open
    #: segment file while it is written or read. The default fits the file budget of a
    #: 20,000-file limit with room for as many connections again (docs/limits.md#files).
    max_partitions_per_broker: int = attrs.field(default=10_000, validator=positive)
    #: Members of one group (Kafka's ``group.max.size``).
    max_group_size: int = attrs.field(default=10_000, validator=positive)
    #: Streams (consumer threads) of one group, each member counting its widest topic: the
    #: threads the assignor balances at every rebalance, on the event loop (100,000 of them
    #: take about half a second; the benchmarks' 5,000 members hold one each).
    max_group_streams: int = attrs.field(default=20_000, validator=positive)
    #: Partitions one OffsetCommit, OffsetFetch or RegisterConsumer (its owned partitions) may
    #: name: at most this many entries are sorted and answered for one request. The benchmarks
    #: reset and read 10,000-partition groups in one request.
    max_partitions_per_request: int = attrs.field(default=10_000, validator=positive)
