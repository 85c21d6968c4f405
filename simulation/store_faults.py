"""Faults of the coordinator's metadata store, injected by wrapping the embedded store: writes
recorded for the invariant checker, contact lost for a while, group reads slowed down."""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import AsyncGenerator, Mapping, Sequence

import attrs
import trio
import trio.testing
from trio_util import AsyncValue

from store import ForwardingStore, GroupRecord, MetadataStore, OffsetBatch, TopicPlacement

from .invariants import StoreHistory

log = logging.getLogger(__name__)


@attrs.define(eq=False)
class RecordingStore(ForwardingStore):
    """The real store, with every durable offset and group write reported to a StoreHistory;
    everything else passes straight through."""

    history: StoreHistory

    async def write_group(self, epoch: int, group: GroupRecord) -> None:
        await self.inner.write_group(epoch, group)
        self.history.group_written(group)

    async def delete_group(self, epoch: int, group_id: str) -> None:
        await self.inner.delete_group(epoch, group_id)
        self.history.group_deleted(group_id)

    async def commit_offsets(self, epoch: int, batches: Sequence[OffsetBatch]) -> None:
        await self.inner.commit_offsets(epoch, batches)
        self.history.offsets_written(batches)

    async def delete_topic(self, topic: str) -> None:
        await self.inner.delete_topic(topic)
        self.history.topic_offsets_deleted(topic)

    async def delete_offsets(self, epoch: int, group_id: str, topic: str) -> None:
        await self.inner.delete_offsets(epoch, group_id, topic)
        self.history.topic_offsets_deleted(topic, group_id)


@attrs.define
class StoreContact:
    """Whether the coordinator hears from its store, cut for a while by :meth:`lose_contact`.
    The cluster keeps it, so a cut outlives a coordinator restart."""

    lost_at: float = -math.inf
    back_at: float = -math.inf

    def lose_contact(self, seconds: float) -> None:
        now = trio.current_time()
        if now >= self.back_at:
            self.lost_at = now
        self.back_at = max(self.back_at, now + seconds)

    def until(self, inner: MetadataStore) -> float:
        if self.lost_at <= trio.current_time() < self.back_at:
            return self.lost_at
        return inner.in_contact_until()


@attrs.define(eq=False)
class ContactStore(ForwardingStore):
    """A store whose contact with its coordinator can be cut: while it is, ``in_contact_until``
    is the instant contact was lost, as for a ZooKeeper store whose session stopped answering
    then (docs/design.md#coordinator-epochs-and-the-election). Its writes still go through, so a
    test sees what the coordinator does with the answer alone."""

    contact: StoreContact

    def in_contact_until(self) -> float:
        return self.contact.until(self.inner)


@attrs.define
class StoreLatency:
    """How long the store takes to read the groups' records, set by
    :meth:`SimulatedCluster.slow_group_reads`. The cluster keeps it, so it outlives a restart."""

    group_reads: float = 0.0
    #: True: the topic watch hears of no change until it is False again, and then only the
    #: topics as they are by then (a watch slower than the writes in between, which it sees as
    #: one); a watch that begins (a coordinator taking office) reads them as they are.
    topics_held: AsyncValue[bool] = attrs.field(factory=lambda: AsyncValue(False))


@attrs.define(eq=False)
class SlowStore(ForwardingStore):
    """A store whose reads of the groups' records take ``latency.group_reads`` seconds, as a big
    group's do on ZooKeeper, so that a coordinator's load is long enough to be seen; and whose
    topic updates can be held back (``latency.topics_held``)."""

    latency: StoreLatency

    async def groups(self) -> Mapping[str, GroupRecord]:
        await trio.sleep(self.latency.group_reads)
        return await self.inner.groups()

    async def topic_updates(self) -> AsyncGenerator[Mapping[str, TopicPlacement], None]:
        held = self.latency.topics_held
        first = True  # the topics as they are when the watch begins: never held
        async with contextlib.aclosing(self.inner.topic_updates()) as updates:
            async for topics in updates:
                if held.value and not first:
                    await held.wait_value(False)
                    yield await self.inner.topics()
                else:
                    yield topics
                first = False
