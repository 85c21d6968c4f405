"""The embedded metadata store: the zero-set-up default for a single broker, and the store that the
deterministic simulation tests run on.

State lives in memory and under ``data_dir``: a snapshot (``metadata.json``) plus a journal
(``metadata.journal``) with one checksummed line per write, synced before the write returns, so a
restart on the same directory loses nothing that a write method returned from. When the journal
outgrows the snapshot (and a floor), the state is compacted into a new snapshot and the journal
starts over.

File I/O is done synchronously on the trio thread, not through ``trio.to_thread``. The simulation
tests run on trio's MockClock with autojump, which jumps virtual time whenever the run loop waits on
a thread; a store write there would let every timer fire. Writes are small (one JSON line and one
fdatasync) and the coordinator batches offset commits, so blocking the loop for one sync is the
cheaper price. A compaction blocks it for a time proportional to the whole state.

A rebalance of a big group would make a large write if the whole assignment (10,000 partitions)
went into one line, so a group's record is journaled as a diff from the record the store holds
(see ``state.group_entry``): a join to 10 members over 10,000 partitions writes the ~900
partitions that moved. Measured on a 2-core VM, an fdatasync of such a line takes ~0.1-0.3 ms,
while encoding, decoding and diffing whole records takes 20-100 ms of CPU, which a thread would
not take off the loop (the GIL): it is the diff that keeps the write cheap.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import math
import operator
import os
import pathlib
import types
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

import attrs
import trio
import trio_util

from protocol.sasl import ScramCredential
from protocol.topic_configs import checked_configs
from protocol.types import NO_TOPIC_ID, BrokerInfo, TopicPartition
from statemachine.acl import Acl
from statemachine.partition_state import (
    UNKNOWN_LOG_DIR,
    PartitionKey,
    PartitionState,
    StateWrite,
    sole_replica_state,
)

from .durable import replace_atomically
from .interface import (
    Assignment,
    Deposed,
    GroupRecord,
    InvalidPartitions,
    InvalidReplicationFactor,
    MetadataStore,
    OffsetBatch,
    StoreUnavailable,
    TopicExists,
    TopicPlacement,
    UnknownTopic,
    on_listener,
    replica_lists,
    writable_offsets,
)
from .journal import Journal
from .state import (
    StoreState,
    acls_entry,
    delete_group_entry,
    delete_offsets_entry,
    delete_topic_entry,
    group_entry,
    office_entry,
    offsets_entry,
    topic_entry,
    user_entry,
)

__all__ = [
    "DEFAULT_COMPACT_AFTER_BYTES",
    "JOURNAL_NAME",
    "LOCK_NAME",
    "SNAPSHOT_NAME",
    "EmbeddedStore",
    "open_embedded_store",
]

logger = logging.getLogger(__name__)

SNAPSHOT_NAME = "metadata.json"
JOURNAL_NAME = "metadata.journal"
LOCK_NAME = "metadata.lock"

DEFAULT_COMPACT_AFTER_BYTES = 8 * 1024 * 1024
"""The journal is compacted once it is larger than both this and the last snapshot: replaying it
stays cheap, and the cost of writing snapshots stays proportional to the writes that caused them."""

TopicsView = Mapping[str, TopicPlacement]


@attrs.define(eq=False, repr=False)
class EmbeddedStore:
    """A ``MetadataStore`` in this process; obtain one from ``open_embedded_store``.

    Each method does its work between two awaits, so concurrent callers never see half a write.
    The coordinator epoch is held by whoever last called ``take_office`` on this handle; a reopened
    store holds no office until someone takes it, as a ZooKeeper election node is gone with the
    session that made it.
    """

    _data_dir: pathlib.Path
    _lock_fd: int
    _journal: Journal
    _state: StoreState
    _compact_after_bytes: int
    _compaction_due: int
    _topics: TopicsView
    _topic_watch: trio_util.AsyncValue[TopicsView | None]
    _office_epoch: int | None = None
    _office_broker: int | None = None
    _brokers: dict[int, BrokerInfo] = attrs.Factory(dict)
    _advertised: dict[int, dict[str, tuple[str, int]]] = attrs.Factory(dict)
    _log_dirs: dict[int, uuid.UUID] = attrs.Factory(dict)
    #: Counts the changes of what the partitions' states are made of (topics, log directories).
    _state_changes: trio_util.AsyncValue[int] = attrs.Factory(lambda: trio_util.AsyncValue(0))
    _closed: bool = False

    def __repr__(self) -> str:
        return f"<EmbeddedStore {str(self._data_dir)!r}>"

    async def register_broker(
        self,
        broker: BrokerInfo,
        advertised: Mapping[str, tuple[str, int]] | None = None,
        *,
        log_dir: uuid.UUID | None = None,
    ) -> None:
        await self._enter()
        self._brokers[broker.broker_id] = broker
        self._advertised[broker.broker_id] = dict(advertised or {})
        if log_dir is None:
            self._log_dirs.pop(broker.broker_id, None)
        else:
            self._log_dirs[broker.broker_id] = log_dir
        self._state_changes.value += 1

    async def brokers(self, listener: str | None = None) -> tuple[BrokerInfo, ...]:
        await self._enter()
        return on_listener(
            sorted(self._brokers.values(), key=lambda broker: broker.broker_id),
            self._advertised,
            listener,
        )

    async def create_topic(
        self, topic: str, brokers: Assignment, configs: tuple[tuple[str, str], ...] = ()
    ) -> TopicPlacement:
        await self._enter()
        if topic in self._state.topics:
            raise TopicExists(topic)
        if not brokers:
            raise InvalidPartitions(f"topic {topic!r} needs at least one partition")
        replicas = replica_lists(brokers)
        if any(len(listed) != 1 for listed in replicas):
            raise InvalidReplicationFactor(
                "the embedded store keeps one replica of a partition: replication needs a "
                "cluster (--zookeeper)"
            )
        return self._place(
            TopicPlacement.of(
                topic=topic,
                assignment=replicas,
                topic_id=uuid.uuid4(),
                configs=checked_configs(configs, replication_factor=1),
            )
        )

    async def add_partitions(self, topic: str, brokers: Assignment) -> TopicPlacement:
        await self._enter()
        current = self._state.topics.get(topic)
        if current is None:
            raise UnknownTopic(topic)
        if not brokers:
            raise InvalidPartitions(f"no partitions to add to topic {topic!r}")
        return self._place(current.with_partitions(brokers))

    async def delete_topic(self, topic: str) -> None:
        await self._enter()
        if topic not in self._state.topics:
            raise UnknownTopic(topic)
        self._write(delete_topic_entry(topic))  # one entry: the topic and its offsets together
        self._publish_topics()

    async def topics(self) -> Mapping[str, TopicPlacement]:
        await self._enter()
        return self._topics

    async def topic_updates(self) -> AsyncGenerator[Mapping[str, TopicPlacement], None]:
        await self._enter()
        async with contextlib.aclosing(self._topic_watch.eventual_values()) as values:
            async for topics in values:
                if topics is None:
                    raise StoreUnavailable("the store was closed")
                yield topics

    # Replication: every partition has one replica, led by its broker, which nobody writes.

    async def partition_states(self) -> Mapping[PartitionKey, PartitionState]:
        await self._enter()
        return types.MappingProxyType(self._sole_replica_states())

    async def partition_state_updates(
        self,
    ) -> AsyncGenerator[Mapping[PartitionKey, PartitionState], None]:
        await self._enter()
        seen = self._state_changes.value
        held = self._sole_replica_states()
        yield types.MappingProxyType(dict(held))
        while True:
            seen = await self._state_changes.wait_value(partial(operator.ne, seen))
            if self._closed:
                raise StoreUnavailable("the store was closed")
            states = self._sole_replica_states()
            changed = {key: state for key, state in states.items() if held.get(key) != state}
            held = states
            if changed:
                yield types.MappingProxyType(changed)

    async def read_partition_states(
        self, keys: Iterable[PartitionKey]
    ) -> Mapping[PartitionKey, PartitionState]:
        await self._enter()
        states = self._sole_replica_states()
        return types.MappingProxyType({key: states[key] for key in keys if key in states})

    async def write_partition_states(
        self, epoch: int | None, writes: Sequence[StateWrite]
    ) -> tuple[PartitionKey, ...]:
        await self._enter()
        if epoch is not None:
            self._check_epoch(epoch)
        if writes:
            raise InvalidReplicationFactor(
                "the embedded store keeps one replica of a partition, whose state nobody writes"
            )
        return ()

    async def broker_dirs(self) -> Mapping[int, uuid.UUID]:
        await self._enter()
        return types.MappingProxyType(dict(sorted(self._log_dirs.items())))

    def _sole_replica_states(self) -> dict[PartitionKey, PartitionState]:
        states = {}
        for placement in self._topics.values():
            for partition, broker in enumerate(placement.brokers):
                key = PartitionKey(topic_id=placement.topic_id, partition=partition)
                log_dir = self._log_dirs.get(broker, UNKNOWN_LOG_DIR)
                states[key] = sole_replica_state(broker, log_dir)
        return states

    async def take_office(self, broker_id: int) -> int:
        await self._enter()
        epoch = self._state.last_epoch + 1
        self._write(office_entry(epoch, broker_id))
        self._office_epoch = epoch
        self._office_broker = broker_id
        return epoch

    async def coordinator_id(self) -> int | None:
        await self._enter()
        return self._office_broker

    def in_contact_until(self) -> float:
        # Local: only this handle can hold the office, until it closes.
        return math.inf if self._office_epoch is not None and not self._closed else -math.inf

    async def groups(self) -> Mapping[str, GroupRecord]:
        await self._enter()
        return types.MappingProxyType(dict(self._state.groups))

    async def offset_only_groups(self) -> frozenset[str]:
        await self._enter()
        return self._state.offset_only_groups()

    async def write_group(self, epoch: int, group: GroupRecord) -> None:
        await self._enter()
        self._check_epoch(epoch)
        self._write(group_entry(group, self._state.groups.get(group.group_id)))

    async def delete_group(self, epoch: int, group_id: str) -> None:
        await self._enter()
        self._check_epoch(epoch)
        if self._state.has_group(group_id):
            self._write(delete_group_entry(group_id))

    async def commit_offsets(self, epoch: int, batches: Sequence[OffsetBatch]) -> None:
        await self._enter()
        self._check_epoch(epoch)
        topics = {tp.topic for batch in batches for tp in batch.offsets}
        current = {topic: self._state.current_id(topic) for topic in topics}
        kept = [writable_offsets(batch, current) for batch in batches]
        if any(batch.offsets for batch in kept):
            self._write(offsets_entry(kept))

    async def delete_offsets(self, epoch: int, group_id: str, topic: str) -> None:
        await self._enter()
        self._check_epoch(epoch)
        if topic in self._state.offsets.get(group_id, {}):
            self._write(delete_offsets_entry(group_id, topic))

    async def fetch_offsets(self, group_id: str) -> Mapping[TopicPartition, int]:
        await self._enter()
        return types.MappingProxyType(self._state.fetch_offsets(group_id))

    async def scram_credential(self, user: str, mechanism: str) -> ScramCredential | None:
        await self._enter()
        return self._state.users.get(user, {}).get(mechanism)

    async def set_scram_credential(self, user: str, credential: ScramCredential) -> None:
        await self._enter()
        self._write(user_entry(user, credential.mechanism, credential))

    async def delete_user(self, user: str) -> bool:
        await self._enter()
        mechanisms = list(self._state.users.get(user, {}))
        for mechanism in mechanisms:
            self._write(user_entry(user, mechanism, None))
        return bool(mechanisms)

    async def users(self) -> Mapping[str, tuple[str, ...]]:
        await self._enter()
        return {user: tuple(sorted(c)) for user, c in sorted(self._state.users.items())}

    async def acls(self) -> frozenset[Acl]:
        await self._enter()
        return frozenset(self._state.acls)

    async def change_acls(self, added: Sequence[Acl], removed: Sequence[Acl]) -> frozenset[Acl]:
        await self._enter()
        self._write(acls_entry(added, removed))
        return frozenset(self._state.acls)

    async def _enter(self) -> None:
        # Every method is a checkpoint, as trio's own are, even though none of them waits.
        await trio.lowlevel.checkpoint()
        if self._closed:
            raise StoreUnavailable("the store is closed")

    def _check_epoch(self, epoch: int) -> None:
        if epoch != self._office_epoch:
            raise Deposed(
                f"epoch {epoch} is not the current coordinator epoch {self._office_epoch}"
            )

    def _place(self, placement: TopicPlacement) -> TopicPlacement:
        self._write(topic_entry(placement))
        self._publish_topics()
        return self._state.topics[placement.topic]

    def _publish_topics(self) -> None:
        self._topics = types.MappingProxyType(dict(self._state.topics))
        self._topic_watch.value = self._topics
        self._state_changes.value += 1

    def _write(self, entry: dict[str, Any]) -> None:
        """Journal the entry, then apply it: memory only ever holds what the disk holds."""
        entry["seq"] = self._state.seq + 1
        self._journal.append(entry)
        self._state.apply(entry)
        if self._journal.size > self._compaction_due:
            self._compact()

    def _compact(self) -> None:
        """Fold the journal into a new snapshot. The write that triggered this is already durable,
        so a failure here is logged and retried later, never reported as the write's failure."""
        snapshot = _encode_json(self._state.to_snapshot())
        try:
            replace_atomically(self._data_dir / SNAPSHOT_NAME, snapshot)
        except OSError:
            logger.exception("%s: cannot write a snapshot; keeping the journal", self._data_dir)
            self._compaction_due = self._journal.size + self._compaction_floor(len(snapshot))
            return
        try:
            self._journal.clear()
        except OSError:
            # The snapshot covers every entry, and replay skips entries it covers.
            logger.exception("%s: cannot empty the journal after a snapshot", self._data_dir)
        self._compaction_due = self._journal.size + self._compaction_floor(len(snapshot))

    def _compaction_floor(self, snapshot_size: int) -> int:
        return max(self._compact_after_bytes, snapshot_size)

    def _close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._topic_watch.value = None
        self._state_changes.value += 1
        self._journal.close()
        os.close(self._lock_fd)


if TYPE_CHECKING:  # mypy proves here that the class meets the interface
    _conforms: type[MetadataStore] = EmbeddedStore


@contextlib.asynccontextmanager
async def open_embedded_store(
    data_dir: pathlib.Path, *, compact_after_bytes: int = DEFAULT_COMPACT_AFTER_BYTES
) -> AsyncIterator[EmbeddedStore]:
    """Open the store kept under ``data_dir`` (created if missing) for the duration of the block.

    One store at a time may hold a directory: a second open, from this process or another, raises
    ``StoreUnavailable`` rather than interleaving two journals' writes.
    """
    await trio.lowlevel.checkpoint()
    store = _load(data_dir, compact_after_bytes)
    try:
        yield store
    finally:
        store._close()


def _load(data_dir: pathlib.Path, compact_after_bytes: int) -> EmbeddedStore:
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        lock_fd = os.open(data_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise StoreUnavailable(f"cannot use {data_dir} for the metadata store: {exc}") from exc
    try:
        _lock(lock_fd, data_dir)
        with contextlib.suppress(FileNotFoundError):
            (data_dir / (SNAPSHOT_NAME + ".tmp")).unlink()  # left by a compaction that crashed
        state, snapshot_size = _read_snapshot(data_dir / SNAPSHOT_NAME)
        journal, entries = Journal.open(data_dir / JOURNAL_NAME)
    except OSError as exc:
        os.close(lock_fd)
        raise StoreUnavailable(f"cannot use {data_dir} for the metadata store: {exc}") from exc
    except BaseException:
        os.close(lock_fd)
        raise
    try:
        _replay(state, entries, journal.path)
    except BaseException:
        journal.close()
        os.close(lock_fd)
        raise
    topics: TopicsView = types.MappingProxyType(dict(state.topics))
    floor = max(compact_after_bytes, snapshot_size)
    store = EmbeddedStore(
        data_dir=data_dir,
        lock_fd=lock_fd,
        journal=journal,
        state=state,
        compact_after_bytes=compact_after_bytes,
        compaction_due=floor,
        topics=topics,
        topic_watch=trio_util.AsyncValue(topics),
    )
    # Topics of a store written before topics had ids get theirs now, once and durably, before
    # anyone reads them (docs/design.md#topic-ids).
    for placement in list(state.topics.values()):
        if placement.topic_id == NO_TOPIC_ID:
            store._write(topic_entry(attrs.evolve(placement, topic_id=uuid.uuid4())))
    store._publish_topics()
    return store


def _lock(lock_fd: int, data_dir: pathlib.Path) -> None:
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as exc:
        raise StoreUnavailable(f"{data_dir} is in use by another metadata store") from exc


def _read_snapshot(path: pathlib.Path) -> tuple[StoreState, int]:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return StoreState(), 0
    try:
        return StoreState.from_snapshot(json.loads(data)), len(data)
    except (ValueError, KeyError, TypeError) as exc:
        raise StoreUnavailable(f"{path} is not a snapshot this store can read: {exc}") from exc


def _replay(state: StoreState, entries: list[dict[str, Any]], path: pathlib.Path) -> None:
    for entry in entries:
        try:
            if int(entry["seq"]) > state.seq:  # older entries are covered by the snapshot
                state.apply(entry)
        except (ValueError, KeyError, TypeError) as exc:
            raise StoreUnavailable(f"{path}: cannot replay entry {entry!r:.200}: {exc}") from exc


def _encode_json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), check_circular=False).encode("ascii")
