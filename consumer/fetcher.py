"""Fetchers: one task per assigned partition, reading from the broker that holds it.

A fetcher resolves a start offset of -1 (nothing committed) with ListOffsets per
``auto_offset_reset``, then fetches in a loop and hands each batch to its stream. It is bound by
the ownership lease (docs/design.md#ownership-lease): before each request it checks that the
lease still runs, and every request is cut off at the lease's deadline, so that a consumer whose
coordinator has gone silent has stopped fetching by the time its partitions may start elsewhere,
even if the task that expires the lease has not run yet.

Every batch is checked whole (CRC, then its records against its section, as decoding them will)
before it is handed to the stream. A batch that fails is fetched again a few times (a CRC may
have been hurt on the way) and then handed over as :class:`~consumer.streams.CorruptBatch`: the
fetcher stops there until the partition is sought, never fetching the same batch for ever.

Connections to brokers are shared by every fetcher of a broker (requests are multiplexed by
correlation id); a broken one is dropped and reopened by the next request.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import attrs
import trio

from protocol import (
    ClusterMetadataRequest,
    ClusterMetadataResponse,
    ErrorCode,
    FetchRequest,
    FetchResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    RemoteProtocolError,
    Request,
    RequestMessage,
    ResponseMessage,
    Role,
)
from protocol.batches import (
    HEADER_SIZE,
    RecordBatch,
    batch_at,
    batch_offsets,
    last_offset_delta,
    walk_batches,
)
from protocol.types import BrokerInfo
from transport.channel import Channel, ChannelClosed
from transport.connect import Connector

from .leaders import LEADER_CODES, Leaders, MetadataAsk
from .streams import ConsumerBatch, CorruptBatch, PartitionClaim, RecordStream

__all__ = [
    "BrokerConnections",
    "BrokerUnavailable",
    "FetchSettings",
    "LeaseDeadline",
    "metadata_asker",
    "run_fetcher",
]

log = logging.getLogger(__name__)

LeaseDeadline = Callable[[], float | None]

#: Fetches of a batch that does not check out before it counts as corrupt where it is stored: one
#: hurt on the way comes right the next time.
CORRUPT_ATTEMPTS = 3


class BrokerUnavailable(Exception):
    """The broker is unknown, cannot be reached, or its connection broke."""


@attrs.frozen(kw_only=True)
class FetchSettings:
    auto_offset_reset: str
    max_bytes: int
    idle_interval: float
    """How long a fetcher waits after an empty fetch (the Fetch request has no long poll)."""
    retry_backoff: float
    request_timeout: float


@attrs.define(eq=False)
class BrokerConnections:
    """One client connection per broker, opened on first use and owned by ``nursery``."""

    nursery: trio.Nursery
    connect: Connector
    client_id: str
    max_frame_size: int
    brokers: dict[int, BrokerInfo] = attrs.field(factory=dict)
    _channels: dict[int, Channel] = attrs.field(factory=dict)
    _connecting: dict[int, trio.Lock] = attrs.field(factory=dict)

    def update(self, brokers: tuple[BrokerInfo, ...]) -> None:
        for broker in brokers:
            self.brokers[broker.broker_id] = broker

    async def request(self, broker_id: int, message: RequestMessage) -> ResponseMessage:
        channel = await self._channel(broker_id)
        try:
            return await channel.request(message)
        except ChannelClosed as exc:
            raise BrokerUnavailable(str(exc)) from exc

    async def _channel(self, broker_id: int) -> Channel:
        lock = self._connecting.setdefault(broker_id, trio.Lock())
        async with lock:
            channel = self._channels.get(broker_id)
            if channel is not None and not channel.closed:
                return channel
            broker = self.brokers.get(broker_id)
            if broker is None:
                raise BrokerUnavailable(f"broker {broker_id} is not in the cluster metadata")
            try:
                stream = await self.connect(broker.host, broker.port)
            except OSError as exc:
                raise BrokerUnavailable(f"broker {broker_id}: {exc}") from exc
            channel = Channel.open(
                stream, Role.CONSUMER, client_id=self.client_id, max_frame_size=self.max_frame_size
            )
            self._channels[broker_id] = channel
            self.nursery.start_soon(self._read, broker_id, channel)
            return channel

    async def _read(self, broker_id: int, channel: Channel) -> None:
        async def refuse(request: Request) -> None:
            raise AssertionError(f"broker {broker_id} sent {request} on a data connection")

        try:
            await channel.run(refuse)
        except RemoteProtocolError as exc:
            log.warning("broker %d broke the protocol: %s", broker_id, exc)
        finally:
            if self._channels.get(broker_id) is channel:
                del self._channels[broker_id]
            with trio.CancelScope(shield=True):
                await channel.aclose()


def metadata_asker(brokers: BrokerConnections, request_timeout: float) -> MetadataAsk:
    """Asks the brokers known to ``brokers``, in turn, over their data connections, until one
    answers; what it says of the cluster's brokers is learned on the way."""

    async def ask(topics: tuple[str, ...]) -> ClusterMetadataResponse | None:
        for broker_id in list(brokers.brokers):
            with trio.move_on_after(request_timeout):
                try:
                    response = await brokers.request(
                        broker_id, ClusterMetadataRequest(group_id=None, topics=topics)
                    )
                except BrokerUnavailable as exc:
                    log.info("asking where the leaders are: %s", exc)
                    continue
                assert isinstance(response, ClusterMetadataResponse)
                if response.error_code is ErrorCode.NONE:
                    brokers.update(response.brokers)
                    return response
        return None

    return ask


async def run_fetcher(
    claim: PartitionClaim,
    stream: RecordStream,
    brokers: BrokerConnections,
    leaders: Leaders,
    settings: FetchSettings,
    lease_deadline: LeaseDeadline,
) -> None:
    """Fetch ``claim``'s partition into ``stream`` until cancelled or the lease runs out. A
    broker that does not lead the partition (:data:`~consumer.leaders.LEADER_CODES`) or cannot
    be reached sends the fetcher to the leader ``leaders`` names, from where it was: the group
    hears nothing of it."""
    tp = claim.partition
    failures = 0  # fetches in a row from this position that found it corrupt
    while claim.active:
        deadline = lease_deadline()
        if deadline is None or trio.current_time() >= deadline:
            log.debug("%s: the lease ran out, fetcher stops", tp)
            return
        if claim.paused:
            with trio.move_on_at(deadline):
                await claim.unpaused.wait()
            continue
        if claim.failed is not None:
            with trio.move_on_at(deadline):
                await claim.sought.wait()
            failures = 0
            continue
        seeks = claim.seeks
        response: ResponseMessage | None = None
        with trio.move_on_at(min(deadline, trio.current_time() + settings.request_timeout)):
            try:
                epoch = leaders.epoch_at(tp, claim.broker_id)
                if claim.position < 0:
                    response = await brokers.request(
                        claim.broker_id,
                        ListOffsetsRequest(
                            topic=tp.topic, partition=tp.partition, current_leader_epoch=epoch
                        ),
                    )
                else:
                    response = await brokers.request(
                        claim.broker_id,
                        FetchRequest(
                            topic=tp.topic,
                            partition=tp.partition,
                            offset=claim.position,
                            max_bytes=settings.max_bytes,
                            topic_id=claim.topic_id,
                            current_leader_epoch=epoch,
                        ),
                    )
            except BrokerUnavailable as exc:
                log.info("%s: %s", tp, exc)
                with trio.move_on_at(deadline):
                    await _follow_leader(claim, leaders, -1, -1)
        if response is None:
            await trio.sleep(settings.retry_backoff)
            continue
        if trio.current_time() >= deadline:
            return  # answered after the lease ran out: not ours to deliver
        if claim.seeks != seeks:
            failures = 0
            continue  # asked for before a seek or pause: the position it answers is gone
        if isinstance(response, ListOffsetsResponse):
            if response.error_code is not ErrorCode.NONE:
                log.info("%s: ListOffsets failed: %s", tp, response.error_code.name)
                if await _followed(claim, leaders, response, deadline):
                    continue
                await trio.sleep(settings.retry_backoff)
                continue
            claim.position = _reset_offset(response, claim.reset or settings.auto_offset_reset)
            claim.reset = None
            if claim.consumed is None:
                claim.consumed = claim.position
            continue
        assert isinstance(response, FetchResponse)
        if response.error_code is ErrorCode.OFFSET_OUT_OF_RANGE:
            reset = _reset_offset(response, settings.auto_offset_reset)
            log.warning(
                "%s: offset %d is out of range, reset to %d (%s)",
                tp,
                claim.position,
                reset,
                settings.auto_offset_reset,
            )
            claim.position = claim.consumed = reset
            continue
        if response.error_code is ErrorCode.UNKNOWN_TOPIC_ID:
            # Another incarnation of the name (SPEC.md §11.12): nothing of it is ours, and no
            # reset makes it so. The coordinator stops us and starts the new one afresh.
            log.warning(
                "%s: the topic was deleted since this consumer was started on it (it has another"
                " id now); fetching it stops until the coordinator starts it again",
                tp,
            )
            claim.topic_gone = True
            return
        failed: CorruptBatch | None = None
        if response.error_code is ErrorCode.CORRUPT_MESSAGE:  # the broker cannot read its file
            reason = "the broker cannot read it: CORRUPT_MESSAGE"
            failed = CorruptBatch(tp.topic, tp.partition, claim.position, None, reason)
            batches: list[ConsumerBatch] = []
        elif response.error_code is not ErrorCode.NONE:
            log.info("%s: Fetch failed: %s", tp, response.error_code.name)
            if await _followed(claim, leaders, response, deadline):
                continue
            await trio.sleep(settings.retry_backoff)
            continue
        else:
            batches, failed = _claimed_batches(claim, response)
        if claim.consumed is None:
            claim.consumed = claim.position
        if failed is not None and not batches:
            failures += 1
            if failures < CORRUPT_ATTEMPTS:
                log.info("%s; fetching it again", failed)
                await trio.sleep(settings.retry_backoff)
                continue
            # the application hears of it: CorruptBatch, when it reaches the batch
            log.info("%s; the fetcher stops there until the partition is sought", failed)
        else:
            failed = None  # the batches before it first; the next fetch starts at it
            failures = 0
        if not batches and failed is None:
            await trio.sleep(settings.idle_interval)
            continue
        with trio.move_on_at(deadline):  # a full stream must not hold a batch past the lease
            delivered = await stream._put(claim, batches, seeks, failed)
            if delivered is None:
                return
            if delivered and batches:
                claim.position = batches[-1].batch.next_offset


async def _followed(
    claim: PartitionClaim,
    leaders: Leaders,
    response: FetchResponse | ListOffsetsResponse,
    deadline: float,
) -> bool:
    """After a refusal: True if it was a leader code and the fetcher now asks another broker
    (at once: the answer named it, or fresh metadata did)."""
    if response.error_code not in LEADER_CODES:
        return False
    was = claim.broker_id
    with trio.move_on_at(deadline):
        await _follow_leader(claim, leaders, response.leader_id, response.leader_epoch)
    return claim.broker_id != was


async def _follow_leader(
    claim: PartitionClaim, leaders: Leaders, leader_id: int, epoch: int
) -> None:
    leader = await leaders.follow(claim.partition, leader_id, epoch)
    if leader is not None and leader != claim.broker_id:
        log.info(
            "%s: its leader is broker %d now (was %d); fetching there",
            claim.partition,
            leader,
            claim.broker_id,
        )
        claim.broker_id = leader


def _claimed_batches(
    claim: PartitionClaim, response: FetchResponse
) -> tuple[list[ConsumerBatch], CorruptBatch | None]:
    """The answer's batches from the claim's position on, each checked whole (its CRC, and its
    records against its section: decompressed once, here, and kept for decoding), up to the
    first that does not check out, which is returned as the error it makes."""
    tp = claim.partition
    buf = response.batches
    batches: list[ConsumerBatch] = []
    at = 0  # where the batch being checked starts
    try:
        for position, size, _, _, _ in walk_batches(buf):
            at = position
            batch = batch_at(buf, position, size)
            if batch.next_offset > claim.position:
                batch.section()
                batches.append(_consumer_batch(claim, batch))
            at = position + size
    except RemoteProtocolError as exc:
        offset, after = claim.position, None
        if len(buf) - at >= HEADER_SIZE:  # base offset and count as the broker stamped them
            base = batch_offsets(buf, at)[0]
            offset, after = max(base, offset), base + last_offset_delta(buf, at) + 1
        return batches, CorruptBatch(tp.topic, tp.partition, offset, after, str(exc))
    return batches, None


def _consumer_batch(claim: PartitionClaim, batch: RecordBatch) -> ConsumerBatch:
    tp = claim.partition
    return ConsumerBatch(
        topic=tp.topic,
        partition=tp.partition,
        batch=batch,
        first_offset=max(claim.position, batch.base_offset),
        claim=claim,
    )


def _reset_offset(response: ListOffsetsResponse | FetchResponse, reset: str) -> int:
    """The log start for ``earliest``, the high watermark for ``latest``."""
    return response.log_start_offset if reset == "earliest" else response.high_watermark
