"""Where each partition's leader is: a cache of ClusterMetadata v5's leaders, replicas, in-sync
replicas and leader epochs, which the consumer's fetchers, the admin client and the Spark source
consult when a broker says it does not lead a partition (docs/consumer.md#leaders).

A leader code (:data:`LEADER_CODES`) means the client's idea of the leader is stale: it takes the
answer's hint (KIP-951's ``leader_id``/``leader_epoch``) if that hint is of a later epoch than
what it knows, else refreshes the topic's metadata, and goes to the leader. A leader change is
not a group event: no rebalance, the generation unchanged. Refreshes are rate-limited per topic
(at most one per :attr:`Leaders.min_interval`), so the fetchers of a topic whose leaders all moved
at once ask once, not once each.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import attrs
import trio

from protocol import ClusterMetadataResponse, ErrorCode
from protocol.types import TopicId, TopicPartition

__all__ = ["LEADER_CODES", "Leader", "Leaders", "MetadataAsk", "leaders_of"]

log = logging.getLogger(__name__)

#: The codes after which a client refreshes where a partition's leader is and asks it there
#: (DESIGN: a broker that does not lead the partition, or not at the epoch the client named).
LEADER_CODES: frozenset[ErrorCode] = frozenset(
    {
        ErrorCode.LEADER_NOT_AVAILABLE,
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        ErrorCode.FENCED_LEADER_EPOCH,
        ErrorCode.UNKNOWN_LEADER_EPOCH,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    }
)

#: Asks some broker for the metadata of these topics; None when no broker answered.
MetadataAsk = Callable[[tuple[str, ...]], Awaitable[ClusterMetadataResponse | None]]


@attrs.frozen(kw_only=True)
class Leader:
    broker_id: int
    """-1: no leader now (an election under way, or every replica down)."""
    epoch: int
    """-1: unknown (a broker answering below ClusterMetadata v5)."""
    replicas: tuple[int, ...]
    isr: tuple[int, ...]


def leaders_of(response: ClusterMetadataResponse) -> dict[TopicPartition, Leader]:
    """Each partition of the topics ``response`` found, with who holds it (a topic without a
    ``replicas`` entry, and every topic below version 5, has one replica, its leader, at epoch
    0)."""
    replicas = {
        TopicPartition(topic=t.topic, partition=p.partition): p
        for t in response.replicas
        for p in t.partitions
    }
    found: dict[TopicPartition, Leader] = {}
    for topic in response.topics:
        if topic.error_code is not ErrorCode.NONE:
            continue
        for partition in topic.partitions:
            tp = TopicPartition(topic=topic.topic, partition=partition.partition)
            held = replicas.get(tp)
            alone = (partition.broker_id,) if partition.broker_id >= 0 else ()
            found[tp] = Leader(
                broker_id=partition.broker_id,
                # A topic of one replica per partition has no entry (SPEC.md §7): its leader is
                # its only replica, at epoch 0.
                epoch=held.leader_epoch if held is not None else (0 if alone else -1),
                replicas=tuple(held.replicas) if held is not None else alone,
                isr=tuple(held.isr) if held is not None else alone,
            )
    return found


@attrs.define(eq=False)
class Leaders:
    ask: MetadataAsk
    min_interval: float = 0.1
    """No topic's metadata is asked for again sooner than this after the last time."""
    _known: dict[TopicPartition, Leader] = attrs.field(factory=dict)
    #: The incarnation of each topic ``_known`` is of (as far as the answers said).
    _ids: dict[str, TopicId] = attrs.field(factory=dict)
    _asked: dict[str, float] = attrs.field(factory=dict)
    _locks: dict[str, trio.Lock] = attrs.field(factory=dict)

    def of(self, tp: TopicPartition) -> Leader | None:
        return self._known.get(tp)

    def epoch_at(self, tp: TopicPartition, broker_id: int) -> int:
        """The leader epoch a request to ``broker_id`` names: the known one if that broker is
        the known leader, else -1 (unchecked), so a stale cache never fences a good request."""
        known = self._known.get(tp)
        return known.epoch if known is not None and known.broker_id == broker_id else -1

    def learn(self, response: ClusterMetadataResponse) -> None:
        """Take every partition of ``response`` whose leader epoch is not older than the one
        known (an answer from a broker that has not heard of an election yet changes nothing).
        A topic the answer names another incarnation of is learned afresh: its epochs count
        from 0 again."""
        for identity in response.topic_ids:
            if self._ids.get(identity.topic, identity.topic_id) != identity.topic_id:
                self.forget(identity.topic)
            self._ids[identity.topic] = identity.topic_id
        for tp, leader in leaders_of(response).items():
            known = self._known.get(tp)
            if known is None or leader.epoch < 0 or leader.epoch >= known.epoch:
                self._known[tp] = leader

    def forget(self, topic: str) -> None:
        """Drop what is known of ``topic``'s leaders: another incarnation of the name counts its
        epochs from 0 again, and none of them is older than the gone one's."""
        for tp in [tp for tp in self._known if tp.topic == topic]:
            del self._known[tp]

    def learn_hint(self, tp: TopicPartition, leader_id: int, epoch: int) -> bool:
        """An answer's leader hint: taken only if its epoch is later than the one known."""
        known = self._known.get(tp)
        if leader_id < 0 or epoch < 0 or (known is not None and epoch <= known.epoch):
            return False
        replicas = known.replicas if known is not None else (leader_id,)
        self._known[tp] = Leader(broker_id=leader_id, epoch=epoch, replicas=replicas, isr=())
        return True

    async def refresh(self, topic: str) -> None:
        """Ask for ``topic``'s leaders, unless they were asked for less than ``min_interval``
        ago (then what that answer said stands)."""
        lock = self._locks.setdefault(topic, trio.Lock())
        async with lock:
            last = self._asked.get(topic)
            if last is not None and trio.current_time() - last < self.min_interval:
                return
            self._asked[topic] = trio.current_time()
            response = await self.ask((topic,))
            if response is None:
                log.info("topic %r: no broker answered where its leaders are", topic)
                return
            self.learn(response)

    async def follow(self, tp: TopicPartition, leader_id: int, epoch: int) -> int | None:
        """After a leader code: the hint if it is news, else a refresh; the broker that leads
        ``tp`` now as far as this client knows (None: nobody does)."""
        if not self.learn_hint(tp, leader_id, epoch):
            await self.refresh(tp.topic)
        known = self._known.get(tp)
        return known.broker_id if known is not None and known.broker_id >= 0 else None
