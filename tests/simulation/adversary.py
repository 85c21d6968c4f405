"""A group member that speaks the real protocol over the simulated wire and can be told to break
the ownership lease's rules on purpose (docs/design.md#ownership-lease): the checker's
adversary. Honest, it fetches like the library's consumer: over a connection of its own to the
broker, only while its lease lasts and until it answers a StopFetcher. The invariant checker
works out what it may fetch from its frames on the wire alone, so what it does wrong shows up
there, whatever it believes."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable

import attrs
import trio

from protocol import (
    ErrorCode,
    FetchRequest,
    PingRequest,
    PingResponse,
    RegisterConsumerRequest,
    RegisterConsumerResponse,
    Request,
    Role,
    StartFetcherRequest,
    StartFetcherResponse,
    StopFetcherRequest,
    StopFetcherResponse,
)
from protocol.types import NO_TOPIC_ID, Subscription, TopicId, TopicPartition, TopicStreams
from simulation import SimulatedCluster
from simulation.network import Link, SimulatedHost
from transport.channel import Channel, ChannelClosed, acknowledged_frames

#: It fetches each partition it believes it may every this many virtual seconds, half of it
#: off the multiples (at 3.125, 3.375, ...): never at the instant the coordinator acts, whose
#: timers fall on round figures, so a test knows which came first.
FETCH_EVERY = 0.25


@attrs.define(eq=False)
class Adversary:
    """One member process: a coordinator connection it answers on, and a fetch connection.

    The rules it can be told to break: ``fetch_after_lease`` (it fetches on once its lease ran
    out), ``fetch_after_stop`` (it answers a StopFetcher and fetches on what it named),
    ``stale_ids`` (it fetches naming the topic ids of its first start, a topic created again
    since or not), and :meth:`close_cleanly` (it ends its coordinator connection with an end of
    stream while it still fetches). :meth:`go_deaf` is no fault of its own: it reads the
    coordinator's requests and answers none, so its lease runs out (an honest member then stops
    fetching)."""

    cluster: SimulatedCluster
    consumer_id: str
    group_id: str
    topic: str
    session_timeout_ms: int = 6000
    fetch_after_lease: bool = False
    fetch_after_stop: bool = False
    #: It fetches naming the topic id the first StartFetcher gave it, whatever a later one says.
    stale_ids: bool = False
    #: The topic id it fetches each topic with (SPEC.md §11.12).
    topic_ids: dict[str, TopicId] = attrs.field(factory=dict)
    host: SimulatedHost = attrs.field(factory=SimulatedHost)
    #: What it fetches.
    fetching: set[TopicPartition] = attrs.field(factory=set)
    lease_end: float = -math.inf
    #: The instants it sent a Fetch, per partition.
    fetched: dict[TopicPartition, list[float]] = attrs.field(factory=dict)
    deaf: bool = False
    coordinator: Channel | None = None
    _scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    #: Its coordinator connection's, then its fetch connection's.
    _links: list[Link] = attrs.field(factory=list)

    @property
    def session_timeout(self) -> float:
        return self.session_timeout_ms / 1000

    def _channel(self) -> Channel:
        stream, link = self.cluster.open_link(self.host)
        self._links.append(link)
        return Channel.open(
            stream,
            Role.CONSUMER,
            client_id=self.consumer_id,
            max_frame_size=self.cluster.config.max_frame_size,
        )

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Register, then answer and fetch until :meth:`stop`; started once registered."""
        coordinator = self.coordinator = self._channel()
        fetch = self._channel()
        with self._scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(coordinator.run, self._answer)
                nursery.start_soon(fetch.run, self._refuse)
                queued_at = trio.current_time()  # the registration frame's, request() queues it
                response = await coordinator.request(
                    RegisterConsumerRequest(
                        group_id=self.group_id,
                        consumer_id=self.consumer_id,
                        subscription=Subscription(
                            topics=(TopicStreams(topic=self.topic, streams=1),)
                        ),
                        auto_commit=False,
                        auto_offset_reset="smallest",
                        session_timeout_ms=self.session_timeout_ms,
                        generation=-1,
                        owned_partitions=(),
                    )
                )
                assert isinstance(response, RegisterConsumerResponse)
                assert response.error_code is ErrorCode.NONE, response
                self.lease_end = queued_at + self.session_timeout
                task_status.started()
                await self._fetch_forever(fetch)

    def stop(self) -> None:
        self._scope.cancel()

    def go_deaf(self) -> None:
        self.deaf = True

    def reset_coordinator_connection(self) -> None:
        """The coordinator connection breaks (both ends read a reset); it fetches on under its
        lease, as a consumer fetching through a failover does."""
        self._links[0].break_()

    async def close_cleanly(self) -> None:
        """End the coordinator connection with an end of stream, whatever it fetches."""
        assert self.coordinator is not None
        await self.coordinator.aclose()

    async def _refuse(self, request: Request) -> None:
        raise AssertionError(f"a fetch connection got {request}")

    async def _answer(self, request: Request) -> None:
        channel = self.coordinator
        assert channel is not None
        message = request.message
        assert isinstance(message, PingRequest | StopFetcherRequest | StartFetcherRequest)
        if self.deaf:
            return
        anchor = channel.sent_at(acknowledged_frames(message))
        if anchor is not None and trio.current_time() < self.lease_end:
            self.lease_end = max(self.lease_end, anchor + self.session_timeout)
        answer: PingResponse | StopFetcherResponse | StartFetcherResponse
        match message:
            case PingRequest():
                answer = PingResponse(
                    error_code=ErrorCode.NONE, consumer_id=self.consumer_id, offsets=()
                )
            case StopFetcherRequest(partitions=named):
                if not self.fetch_after_stop:
                    self.fetching -= self.fetching if named is None else set(named)
                answer = StopFetcherResponse(
                    error_code=ErrorCode.NONE, consumer_id=self.consumer_id, offsets=()
                )
            case StartFetcherRequest():
                if not message.incremental:
                    self.fetching.clear()
                self.fetching |= set(_partitions(message))
                for identity in message.topic_ids:
                    if not self.stale_ids or identity.topic not in self.topic_ids:
                        self.topic_ids[identity.topic] = identity.topic_id
                answer = StartFetcherResponse(
                    error_code=ErrorCode.NONE, consumer_id=self.consumer_id
                )
        with contextlib.suppress(ChannelClosed):
            await channel.respond(request, answer)

    async def _fetch_forever(self, fetch: Channel) -> None:
        while True:
            tick = (trio.current_time() - FETCH_EVERY / 2) // FETCH_EVERY + 1
            await trio.sleep_until((tick + 0.5) * FETCH_EVERY)
            now = trio.current_time()
            if now >= self.lease_end and not self.fetch_after_lease:
                self.fetching.clear()  # its own rule: no fetch once the lease ran out
            for tp in sorted(self.fetching):
                self.fetched.setdefault(tp, []).append(now)
                fetch.request_nowait(
                    FetchRequest(
                        topic=tp.topic,
                        partition=tp.partition,
                        offset=0,
                        max_bytes=1024,
                        topic_id=self.topic_ids.get(tp.topic, NO_TOPIC_ID),
                    ),
                    lambda _answer: None,
                )


def _partitions(start: StartFetcherRequest) -> Iterable[TopicPartition]:
    for stream in start.streams:
        for p in stream.partitions:
            yield TopicPartition(topic=p.topic, partition=p.partition)


async def start_adversary(
    cluster: SimulatedCluster, consumer_id: str, *, group: str, topic: str, **rules: bool
) -> Adversary:
    """Start a member on the cluster's nursery and return once it registered."""
    adversary = Adversary(
        cluster=cluster,
        consumer_id=consumer_id,
        group_id=group,
        topic=topic,
        fetch_after_lease=rules.pop("fetch_after_lease", False),
        fetch_after_stop=rules.pop("fetch_after_stop", False),
        stale_ids=rules.pop("stale_ids", False),
    )
    assert not rules, rules
    await cluster.nursery.start(adversary.run)
    return adversary
