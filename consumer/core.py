"""A consumer's state, and the sources the driver's inputs come from."""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeAlias

import attrs
import trio
from trio_util import AsyncValue

from protocol import Request
from protocol.types import BrokerInfo, Subscription, TopicPartition
from statemachine import consumer as sm
from transport.channel import Channel
from transport.connect import Connector

from .discovery import Discovery
from .fetcher import BrokerConnections
from .leaders import Leaders
from .runtime import Unawaited
from .settings import ConsumerSettings, RebalanceCallback
from .streams import ConsumerRecord, PartitionClaim, RecordStream

if TYPE_CHECKING:
    from .client import Consumer

#: One logger for the whole consumer: the name applications configure (docs/consumer.md).
log = logging.getLogger("consumer.client")


# --- what the driver's inputs come from ---------------------------------------------------------


@attrs.define(eq=False)
class _Session:
    """One coordinator connection, from Register to CloseConnection."""

    coordinator: BrokerInfo
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    channel: Channel | None = None
    registered: trio.Event = attrs.field(factory=trio.Event)
    requests: dict[int, Request] = attrs.field(factory=dict)


@attrs.define(eq=False)
class _DiscoveryRun:
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)


@attrs.define(eq=False)
class _Fetcher:
    """One partition's fetcher task, stopped on its own."""

    claim: PartitionClaim
    stream: RecordStream
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    done: trio.Event = attrs.field(factory=trio.Event)


_Source: TypeAlias = _Session | _DiscoveryRun | None
"""None: the application (Close)."""


@attrs.define(eq=False, repr=False)
class ConsumerCore:
    """What a :class:`~consumer.client.Consumer` holds: its parts (``consumer/offsets.py``,
    ``consumer/session.py``, ``consumer/fetchers.py``, ``consumer/client.py``) share it."""

    group_id: str
    member_id: str
    subscription: Subscription
    settings: ConsumerSettings
    streams: tuple[RecordStream, ...]
    """Named topics: ``streams_for(topic)``; a wildcard: every stream takes every matching topic."""
    _machine: sm.ConsumerMachine
    assignment: AsyncValue[frozenset[TopicPartition]]
    """The partitions being fetched now (empty while stopped); wait on it with ``wait_value``."""
    _nursery: trio.Nursery
    _connect: Connector
    _discovery: Discovery
    _brokers: BrokerConnections
    _leaders: Leaders
    """Where each fetched partition's leader is (consumer/leaders.py), shared by the fetchers."""
    _on_revoked: RebalanceCallback | None
    _on_assigned: RebalanceCallback | None
    _send: trio.MemorySendChannel[tuple[_Source, sm.Input]]
    _receive: trio.MemoryReceiveChannel[tuple[_Source, sm.Input]]
    _session: _Session | None = None
    _discovery_run: _DiscoveryRun | None = None
    _fetchers: dict[TopicPartition, _Fetcher] = attrs.field(factory=dict)
    _claims: dict[TopicPartition, PartitionClaim] = attrs.field(factory=dict)
    """Every claim since the last start: running ones, and stopped ones whose final offsets a
    StopFetcher answer or the final commit still reports."""
    _revoking: dict[TopicPartition, PartitionClaim] = attrs.field(factory=dict)
    """Stopped by the effects being performed, not yet answered: the coordinator still counts
    their offsets, so ``commit()`` from ``on_revoked`` includes them."""
    _accepted_by_epoch: collections.Counter[int] = attrs.field(factory=collections.Counter)
    """Coordinator requests (Ping, StopFetcher, StartFetcher) that passed the machine's epoch
    guard and were acted on, by coordinator epoch: what a failover test checks fencing with."""
    _accepted_span: dict[int, tuple[int, int]] = attrs.field(factory=dict)
    """Per epoch, the positions (1-based, over all accepted requests) of its first and last
    accepted request: a deposed coordinator's last must come before its successor's first."""
    _close_requested: bool = False
    _stopped: trio.Event = attrs.field(factory=trio.Event)
    _registered_once: bool = False
    _failure: Exception | None = None
    """Why the consumer gave up on its own (no coordinator found in time): iteration raises it."""
    _changed: trio.Event = attrs.field(factory=trio.Event)
    """Set when any stream changes: what iterating the consumer itself waits on."""
    _handed: dict[TopicPartition, ConsumerRecord] = attrs.field(factory=dict)
    """The last record of each partition handed out by iterating the consumer or ``getmany``:
    finished when the application asks for more."""
    _next_stream: int = 0
    _not_awaited: Unawaited = attrs.field(factory=lambda: Unawaited("consumer"))
    """A ``commit()`` never awaited: an error when the ``open_consumer`` block ends."""
    observer: Callable[[Consumer, list[sm.Effect]], None] | None = None
    """Called with the effects of each input the machine took, once performed: what a test harness
    (the simulation's consumer) reads the machine's state and requests through, in the instant
    they changed."""

    @property
    def instance_id(self) -> str | None:
        return self.settings.instance_id
