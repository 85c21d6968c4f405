"""Finding the group's coordinator: seed 03's round robin over the known brokers.

The known brokers start as the bootstrap list and grow with every ClusterMetadata answer. Each
:meth:`Discovery.find` is one pass, starting after the broker the previous pass started from, so a
dead first broker is not asked first every time; the consumer machine decides the backoff between
passes.
"""

from __future__ import annotations

import logging

import attrs
import trio

from protocol import ClusterMetadataRequest, ClusterMetadataResponse, ErrorCode, RemoteProtocolError
from protocol.types import BrokerInfo
from transport.channel import ChannelClosed
from transport.connect import Connector, open_channel
from transport.refusals import Refused, final_refusal

__all__ = ["Discovery", "Found"]

log = logging.getLogger(__name__)

Address = tuple[str, int]


@attrs.frozen(kw_only=True)
class Found:
    coordinator: BrokerInfo
    epoch: int
    brokers: tuple[BrokerInfo, ...]


@attrs.define(eq=False)
class Discovery:
    group_id: str
    addresses: list[Address]
    connect: Connector
    client_id: str
    max_frame_size: int
    request_timeout: float
    topics: tuple[str, ...] = ()
    """The subscription's named topics: each pass asks about them too, to warn of missing ones."""
    last_problem: str | None = None
    """Why the latest broker asked did not name a coordinator (for the application's logs)."""
    last_code: ErrorCode = ErrorCode.COORDINATOR_NOT_AVAILABLE
    """COORDINATOR_LOAD_IN_PROGRESS when a broker of the latest pass said the group's
    coordinator slot has no live holder yet (a failover under way); BROKER_BUSY when one was
    too busy to answer (and none said that); COORDINATOR_NOT_AVAILABLE otherwise."""
    retry_after: float = 0.0
    """The longest back-off a busy broker of the latest pass asked for, in seconds (SPEC.md
    §11.7): the consumer machine waits at least that long before the next pass."""
    partition_counts: dict[str, int] = attrs.field(factory=dict)
    """Each topic's partition count, as the latest answer naming it said."""
    said: str | None = None
    """The problem last warned of: a pass that fails for the same reason is not warned of again
    (the next one that finds a coordinator forgets it)."""
    refused: Refused | None = None
    """The refusal a broker of the latest pass answered with (a wrong password, a listener that
    needs SASL): the consumer ends with it rather than look again."""
    _next: int = 0
    _warned_missing: set[str] = attrs.field(factory=set)

    async def find(self, *, leased: bool = False) -> Found | None:
        """One round-robin pass: the first broker that names a coordinator it also lists wins.
        ``leased``: the consumer fetches under its lease, which a busy broker does not make
        wait (SPEC.md §11.7)."""
        start = self._next
        self._next = (self._next + 1) % len(self.addresses)
        self.last_code = ErrorCode.COORDINATOR_NOT_AVAILABLE
        self.retry_after = 0.0
        self.refused = None
        for i in range(len(self.addresses)):
            host, port = self.addresses[(start + i) % len(self.addresses)]
            response = await self._ask(host, port, leased)
            if response is None:
                continue
            self._learn(response.brokers)
            self._count_partitions(response)
            self._warn_missing(response)
            if response.error_code is not ErrorCode.NONE:
                if response.error_code is ErrorCode.COORDINATOR_LOAD_IN_PROGRESS:
                    self.last_code = response.error_code
                elif response.error_code is ErrorCode.BROKER_BUSY:
                    if self.last_code is not ErrorCode.COORDINATOR_LOAD_IN_PROGRESS:
                        self.last_code = response.error_code
                    self.retry_after = max(self.retry_after, response.throttle_time_ms / 1000)
                self._problem(f"{host}:{port}: no coordinator ({response.error_code.name})")
                continue
            coordinator = next(
                (b for b in response.brokers if b.broker_id == response.coordinator_id), None
            )
            if coordinator is None:
                self._problem(f"{host}:{port} does not know the coordinator of {self.group_id}")
                continue
            self.said = None
            return Found(
                coordinator=coordinator,
                epoch=response.coordinator_epoch,
                brokers=response.brokers,
            )
        return None

    async def _ask(self, host: str, port: int, leased: bool) -> ClusterMetadataResponse | None:
        with trio.move_on_after(self.request_timeout):
            try:
                stream = await self.connect(host, port)
            except OSError as exc:
                self._refused(exc)
                self._problem(f"cannot reach {host}:{port}: {exc}")
                return None
            try:
                async with open_channel(
                    stream, client_id=self.client_id, max_frame_size=self.max_frame_size
                ) as channel:
                    response = await channel.request(
                        ClusterMetadataRequest(
                            group_id=self.group_id, topics=self.topics, leased=leased
                        )
                    )
            except (ChannelClosed, RemoteProtocolError) as exc:
                self._refused(exc)
                self._problem(f"{host}:{port}: {exc}")
                return None
            except ExceptionGroup as group:  # the reader's protocol error, out of its nursery
                if group.split((ChannelClosed, RemoteProtocolError))[1] is not None:
                    raise
                self._refused(group)
                self._problem(f"{host}:{port}: {group.exceptions[0]}")
                return None
            assert isinstance(response, ClusterMetadataResponse)
            return response
        self._problem(f"{host}:{port} did not answer in {self.request_timeout:.1f} s")
        return None

    def _refused(self, exc: Exception) -> None:
        self.refused = final_refusal(exc) or self.refused

    def _problem(self, text: str) -> None:
        self.last_problem = text
        log.info("%s", text)

    def _count_partitions(self, response: ClusterMetadataResponse) -> None:
        for topic in response.topics:
            if topic.error_code is ErrorCode.NONE:
                self.partition_counts[topic.topic] = len(topic.partitions)

    def _warn_missing(self, response: ClusterMetadataResponse) -> None:
        """Warn once per topic of the subscription that does not exist: the group assigns
        nothing of it, and without a word the consumer would just receive nothing."""
        for topic in response.topics:
            if topic.error_code is ErrorCode.NONE:
                self._warned_missing.discard(topic.topic)
            elif topic.topic not in self._warned_missing:
                self._warned_missing.add(topic.topic)
                missing = topic.error_code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                log.warning(
                    "group %s: subscribed topic %r %s (%s): nothing of it is fetched until %s",
                    self.group_id,
                    topic.topic,
                    "does not exist" if missing else "is not available",
                    topic.error_code.name,
                    "it is created" if missing else "that changes",
                )

    def _learn(self, brokers: tuple[BrokerInfo, ...]) -> None:
        for broker in brokers:
            address = (broker.host, broker.port)
            if address not in self.addresses:
                self.addresses.append(address)
