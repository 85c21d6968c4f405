"""Each group's committed offsets: kept in memory, checked by the caller, written in batches.

One committer task writes every group's changed offsets to the store at an interval; an
OffsetCommit is answered only once its batch is durable, and a rebalance forces a commit before
StartFetcher (docs/design.md#offsets, docs/design.md#rebalance). One task writes; everyone else
records an update and, if they need durability, waits for the version they produced to become
durable, which also asks the committer to write at once instead of at its next interval.

So each group has two views. *Accepted* offsets (:meth:`OffsetKeeper.committed`) are everything
checked and recorded, durable or not: what later reports are compared against and what a rebalance
hands out (after forcing a commit). *Durable* offsets (:attr:`OffsetView.durable`) are those the
store is known to hold, the only ones a restart or failover cannot take back: what OffsetFetch
returns and DescribeGroup calls committed. Between the two sit the offsets a crash would lose.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping

import attrs
import trio
from trio_util import AsyncValue

from protocol.types import TopicId, TopicPartition
from store import GroupStore, OffsetBatch, StoreUnavailable

log = logging.getLogger(__name__)


@attrs.define
class _GroupOffsets:
    generation: int = -1
    committed: dict[TopicPartition, int] = attrs.field(factory=dict)
    """Accepted: durable, or about to be."""
    durable: dict[TopicPartition, int] = attrs.field(factory=dict)
    """What the store holds: loaded from it, then updated by each write that succeeded."""
    dirty: dict[TopicPartition, int] = attrs.field(factory=dict)
    ids: dict[str, TopicId] = attrs.field(factory=dict)
    """The incarnation each topic's offsets belong to (docs/design.md#topic-ids): what the
    batches that write them name."""


@attrs.frozen(kw_only=True)
class OffsetView:
    #: Checked and recorded, durable or not.
    accepted: Mapping[TopicPartition, int]
    #: What the store holds: the only offsets to call committed.
    durable: Mapping[TopicPartition, int]

    @property
    def pending(self) -> dict[TopicPartition, int]:
        """Accepted but not (yet) durable: lost if the coordinator dies before its committer
        writes them."""
        durable = self.durable
        return {tp: offset for tp, offset in self.accepted.items() if durable.get(tp) != offset}


@attrs.define(eq=False)
class OffsetKeeper:
    store: GroupStore
    epoch: int
    commit_interval: float
    retry_backoff: float
    _groups: dict[str, _GroupOffsets] = attrs.field(factory=dict)
    _version: int = 0
    _durable: AsyncValue[int] = attrs.field(factory=lambda: AsyncValue(0))
    _flush_wanted: trio.Event = attrs.field(factory=trio.Event)
    _write_lock: trio.Lock = attrs.field(factory=trio.Lock)
    #: The incarnation in force of each topic, as the topic watch last saw them: an offset of
    #: another is dropped (empty until the watch first reports: nothing is dropped).
    topic_ids: Mapping[str, TopicId] = attrs.field(factory=dict)

    async def committed(self, group_id: str) -> Mapping[TopicPartition, int]:
        """The group's offsets as accepted so far (durable, or about to be); not what to show
        anyone as committed, which is :attr:`OffsetView.durable`."""
        return (await self._load(group_id)).committed

    async def view(self, group_id: str) -> OffsetView:
        """A group's offsets for a query (OffsetFetch, DescribeGroup, DeleteGroup). A group not
        in memory is read from the store and not kept: a client asking about any number of
        group ids must not grow the broker's memory. Read the mappings at once; they are live."""
        group = self._groups.get(group_id)
        if group is None:
            stored = await self.store.fetch_offsets(group_id)
            return OffsetView(accepted=stored, durable=stored)
        return OffsetView(accepted=group.committed, durable=group.durable)

    async def accept(
        self,
        group_id: str,
        generation: int,
        offsets: Mapping[TopicPartition, int],
        *,
        monotonic: bool,
        topic_ids: Mapping[str, TopicId] | None = None,
    ) -> int:
        """Record offsets the caller has already checked; returns the version to wait for.

        Members only ever move an offset forward (``monotonic``): a late report of an older
        position must not regress what a newer one committed. A standalone committer (a reset
        while the group is empty) may set any offset. ``topic_ids``: the incarnation each
        topic's offsets were read from; an offset of any other than the one in force is dropped
        (docs/design.md#topic-ids). A topic it does not name (a commit by name): the one in
        force.
        """
        await self._load(group_id)
        version = self.accept_nowait(
            group_id, generation, offsets, monotonic=monotonic, topic_ids=topic_ids
        )
        return self._version if version is None else version  # None: deleted meanwhile

    def accept_nowait(
        self,
        group_id: str,
        generation: int,
        offsets: Mapping[TopicPartition, int],
        *,
        monotonic: bool,
        topic_ids: Mapping[str, TopicId] | None = None,
    ) -> int | None:
        """:meth:`accept` for a group whose offsets are in memory, from a plain function (the
        reader that got a Ping answer); None when they are not in memory."""
        group = self._groups.get(group_id)
        if group is None:
            return None
        changed = False
        current = self.topic_ids
        for tp, offset in offsets.items():
            now_id = current.get(tp.topic)
            read_id = topic_ids.get(tp.topic, now_id) if topic_ids else now_id
            if now_id is not None and read_id != now_id:
                continue  # of another incarnation of the name: never applied to this one
            if monotonic and offset <= group.committed.get(tp, -1):
                continue
            group.committed[tp] = offset
            group.dirty[tp] = offset
            if read_id is not None:
                group.ids[tp.topic] = read_id
            changed = True
        if changed:
            # A standalone commit (a reset of an empty group) is written as one (-1), not under
            # the generation its members last had: it may move offsets backwards, they may not.
            group.generation = max(group.generation, generation) if monotonic else generation
            self._version += 1
        return self._version

    async def wait_durable(self, version: int) -> None:
        if self._durable.value >= version:
            return
        self._flush_wanted.set()
        await self._durable.wait_value(lambda durable: durable >= version)

    async def flush(self) -> None:
        """Write every pending offset now (one store transaction); StoreUnavailable on failure."""
        async with self._write_lock:
            version = self._version
            batches = [
                OffsetBatch(
                    group_id=group_id,
                    generation=group.generation,
                    offsets=group.dirty,
                    topic_ids=_read_from(group),
                )
                for group_id, group in self._groups.items()
                if group.dirty
            ]
            if not batches:
                self._durable.value = max(self._durable.value, version)
                return
            for group in self._groups.values():
                group.dirty = {}
            try:
                await self.store.commit_offsets(self.epoch, batches)
            except BaseException:
                for batch in batches:  # keep what was not overwritten meanwhile, and retry it
                    if batch.group_id in self._groups:
                        kept = self._groups[batch.group_id]
                        kept.dirty = {**batch.offsets, **kept.dirty}
                raise
            for batch in batches:
                written = self._groups.get(batch.group_id)
                if written is not None:
                    written.durable.update(batch.offsets)
            self._durable.value = max(self._durable.value, version)

    def forget(self, group_id: str) -> None:
        self._groups.pop(group_id, None)

    async def forget_topics(self, topics: Collection[str]) -> dict[str, set[str]]:
        """Drop every offset of ``topics`` (deleted topics', or those of a topic's incarnation
        no longer in force: docs/design.md#topic-ids) from memory, accepted or durable, so that
        no view shows them and the committer does not write them again. Returns, per group,
        those of ``topics`` it had written: the store's delete of the topic may have come
        before such a write, so the caller deletes them again. Waits for a write in flight,
        which may hold them. Offsets already accepted for the incarnation in force are kept."""
        async with self._write_lock:
            written: dict[str, set[str]] = {}
            current = self.topic_ids
            for group_id, group in self._groups.items():
                kept = {
                    t
                    for t in topics
                    if t in group.ids and t in current and group.ids[t] == current[t]
                }
                for topic in set(topics) - kept:
                    group.ids.pop(topic, None)
                topics_gone = set(topics) - kept
                for offsets in (group.committed, group.durable, group.dirty):
                    for tp in [tp for tp in offsets if tp.topic in topics_gone]:
                        if offsets is group.durable:
                            written.setdefault(group_id, set()).add(tp.topic)
                        del offsets[tp]
            return written

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The committer task: write at each interval, or at once when someone waits."""
        task_status.started()
        while True:
            with trio.move_on_after(self.commit_interval):
                await self._flush_wanted.wait()
            self._flush_wanted = trio.Event()
            try:
                await self.flush()
            except StoreUnavailable as exc:
                log.warning("offset commit failed, retrying: %s", exc)
                await trio.sleep(self.retry_backoff)
                self._flush_wanted.set()

    async def _load(self, group_id: str) -> _GroupOffsets:
        if group_id not in self._groups:
            stored = await self.store.fetch_offsets(group_id)
            # The store returns the offsets of the incarnations in force alone.
            current = self.topic_ids
            ids = {tp.topic: current[tp.topic] for tp in stored if tp.topic in current}
            # another task may have loaded it while this one waited on the store
            self._groups.setdefault(
                group_id, _GroupOffsets(committed=dict(stored), durable=dict(stored), ids=ids)
            )
        return self._groups[group_id]


def _read_from(group: _GroupOffsets) -> dict[str, TopicId]:
    """The incarnation of each topic of the group's unwritten offsets, as its batch names it."""
    ids = group.ids
    return {topic: ids[topic] for topic in {tp.topic for tp in group.dirty} if topic in ids}
