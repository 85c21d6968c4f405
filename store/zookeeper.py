"""The ZooKeeper metadata store: brokers, topics, groups, offsets, security and the coordinator
slots' offices in a ZooKeeper ensemble, for a cluster of brokers and coordinator failover. Its
client is driven through ``kazoo_bridge``, the one module that imports kazoo.

The store is in parts, one module each: the nodes and their names (``zookeeper_layout``), one
session's requests and the transactions that check an office (``zookeeper_session``), the brokers,
the layout and the slots' offices (``zookeeper_cluster``), the topics' ids
(``zookeeper_topic_ids``), the groups' records and offsets (``zookeeper_groups``), the
replicated partitions' states (``zookeeper_partitions``); here, the
topics, the credentials and access rules, and the handle that puts them together. Its offices
are its slots': a coordinator runs on one slot's view of it (store/slot_store.py), which is a
whole ``MetadataStore``.
"""

from __future__ import annotations

import contextlib
import logging
import types
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import trio

from protocol.sasl import ScramCredential
from protocol.topic_configs import REPLICATION_SETTINGS, checked_configs
from statemachine.acl import Acl

from .codec import (
    decode_acl,
    decode_credential,
    encode_acl,
    encode_credential,
    encode_placement,
)
from .interface import (
    Assignment,
    ClusterStore,
    InvalidPartitions,
    StoreUnavailable,
    TopicExists,
    TopicPlacement,
    UnknownTopic,
    replica_lists,
)
from .kazoo_bridge import (
    BadVersionError,
    DigestAuth,
    NodeExistsError,
    NoNodeError,
    kazoo_bridge,
)
from .zookeeper_cluster import CONTACT_MARGIN_FRACTION, Cluster
from .zookeeper_groups import Groups
from .zookeeper_layout import (
    ACLS,
    BROKER_IDS,
    CONSUMERS,
    ELECTION,
    LAYOUT,
    LAYOUT_VERSION,
    PARTITION_CHANGES,
    PARTITION_STATES,
    SLOT_ELECTIONS,
    TOPIC_CONFIGS,
    TOPIC_IDS,
    TOPICS,
    USERS,
    group_path,
    json_bytes,
    segment_name,
    topic_config_path,
    topic_config_value,
    topic_id_path,
    topic_path,
    user_path,
)
from .zookeeper_partitions import Partitions
from .zookeeper_session import RETRIES, failure
from .zookeeper_topic_ids import TopicsView, ids_value

__all__ = [
    "BROKER_IDS",
    "CONSUMERS",
    "CONTACT_MARGIN_FRACTION",
    "DEFAULT_CALL_BOUND",
    "DEFAULT_SESSION_TIMEOUT",
    "ELECTION",
    "LAYOUT",
    "LAYOUT_VERSION",
    "SLOT_ELECTIONS",
    "TOPICS",
    "DigestAuth",
    "ZooKeeperStore",
    "group_path",
    "open_zookeeper_store",
    "segment_name",
    "topic_path",
]

log = logging.getLogger(__name__)

DEFAULT_SESSION_TIMEOUT = 6.0
DEFAULT_CALL_BOUND = 10.0


# Not slotted, nor are its parts: Python cannot combine two slotted bases that add fields.
@attrs.define(eq=False, repr=False, slots=False)
class ZooKeeperStore(Cluster, Groups, Partitions):
    """The ``ClusterStore`` on a ZooKeeper ensemble, and its coordinator slots' offices; obtain
    one from ``open_zookeeper_store``.

    One handle is one ZooKeeper session: its broker registrations and its offices end with it. If
    the session expires, kazoo opens a new one; the handle registers its brokers again, but its
    offices are over for good (``wait_slot_lost`` returns, and their writes raise ``Deposed``).
    """

    _topics_wake: trio.Event = attrs.Factory(trio.Event)
    _topics_lock: trio.Lock = attrs.Factory(trio.Lock)

    def __repr__(self) -> str:
        return f"<ZooKeeperStore {self._client.hosts!r}>"

    @property
    def operations(self) -> int:
        """ZooKeeper requests awaited (a transaction is one), for the benchmarks' counts."""
        return self._bridge.requests

    # Topics

    async def create_topic(
        self, topic: str, brokers: Assignment, configs: tuple[tuple[str, str], ...] = ()
    ) -> TopicPlacement:
        """One transaction creates the topic node, writes its new id to the name's ids node
        and its settings to the name's settings node, each checking the version read
        (docs/design.md#topic-ids): a racing create or delete of the name makes it read again,
        and an existing topic node makes it ``TopicExists``. A replicated topic, or one with
        replication settings, only once every registered broker reads them
        (``check_every_broker_reads_replicas``)."""
        if not brokers:
            raise InvalidPartitions(f"topic {topic!r} needs at least one partition")
        replicas = replica_lists(brokers)
        placement = TopicPlacement.of(
            topic=topic,
            assignment=replicas,
            topic_id=uuid.uuid4(),
            configs=checked_configs(configs, replication_factor=len(replicas[0])),
        )
        names = {name for name, _value in placement.configs}
        if placement.replication_factor > 1 or names & REPLICATION_SETTINGS:
            await self.check_every_broker_reads_replicas()
        ids_path, config_path = topic_id_path(topic), topic_config_path(topic)
        for _ in range(RETRIES):
            ids_version = await self._version(ids_path)
            config_version = await self._version(config_path)
            tx = self._client.transaction()
            tx.create(topic_path(topic), json_bytes(encode_placement(placement)))
            for path, value, version in (
                (ids_path, ids_value(placement.topic_id), ids_version),
                (config_path, topic_config_value(placement.configs), config_version),
            ):
                if version is None:
                    tx.create(path, value)
                else:
                    tx.set_data(path, value, version)
            failed = failure(await self._wait(tx.commit_async()))
            if failed is None:
                await self._refresh_topics()
                return placement
            index, exc = failed
            if index == 0 and isinstance(exc, NodeExistsError):
                raise TopicExists(topic)
            if not isinstance(exc, NodeExistsError | BadVersionError | NoNodeError):
                raise StoreUnavailable(f"cannot create topic {topic!r}: {exc!r}")
        raise StoreUnavailable(f"cannot create topic {topic!r}: its id keeps changing")

    async def _version(self, path: str) -> int | None:
        """The node's version; None: there is no such node."""
        try:
            _data, stat = await self._wait(self._client.get_async(path))
        except NoNodeError:
            return None
        return int(stat.version)

    async def add_partitions(self, topic: str, brokers: Assignment) -> TopicPlacement:
        for _ in range(RETRIES):
            current = (await self._incarnations([topic])).get(topic)
            if current is None:
                raise UnknownTopic(topic)
            if not brokers:
                raise InvalidPartitions(f"no partitions to add to topic {topic!r}")
            placement = current.placement.with_partitions(brokers)
            # The id's version too: a topic node of the same version may be another incarnation.
            tx = self._client.transaction()
            tx.check(topic_id_path(topic), current.ids_version)
            tx.set_data(
                topic_path(topic),
                json_bytes(encode_placement(placement)),
                current.topic_version,
            )
            failed = failure(await self._wait(tx.commit_async()))
            if failed is None:
                await self._refresh_topics()
                return placement
            if not isinstance(failed[1], BadVersionError | NoNodeError):
                raise StoreUnavailable(f"cannot add partitions to {topic!r}: {failed[1]!r}")
            # Another broker added partitions meanwhile (add ours after theirs), or the name
            # changed hands: read again.
        raise StoreUnavailable(f"cannot add partitions to {topic!r}: it keeps changing")

    async def delete_topic(self, topic: str) -> None:
        """Every group's offset nodes for the topic, then, in one transaction, the name's ids
        node set to null and the topic node deleted, each checking the version read with the
        incarnation (docs/design.md#topic-ids). If either changed (the incarnation was deleted,
        re-created, or given partitions meanwhile), it reads again and decides again: so two
        deletes never both succeed on one incarnation, and a delete removes the offsets of the
        incarnation it deletes, whichever it finds in force. Cut short, a delete leaves the topic
        with fewer offsets, and deleting it again finishes the job. No office is checked: none is
        needed to delete a topic, as none is to create one."""
        for _ in range(RETRIES):
            current = (await self._incarnations([topic])).get(topic)
            if current is None:
                raise UnknownTopic(topic)
            groups = await self._children(CONSUMERS, missing_ok=True)
            ops = await self._topic_offset_ops(groups, topic)
            if await self._commit_in_parts(None, ops) < len(ops):
                continue
            tx = self._client.transaction()
            tx.set_data(topic_id_path(topic), ids_value(None), current.ids_version)
            tx.delete(topic_path(topic), current.topic_version)
            failed = failure(await self._wait(tx.commit_async()))
            if failed is None:
                self._offset_nodes = {n for n in self._offset_nodes if n[1] != topic}
                if current.placement.replication_factor > 1:
                    await self._delete_partition_states(current.placement.topic_id)
                if current.config_version is not None:
                    # Not in the transaction: topics created before settings had nodes have
                    # none. Its version read with the incarnation: a create since keeps its own.
                    with contextlib.suppress(BadVersionError, NoNodeError):
                        await self._wait(
                            self._client.delete_async(
                                topic_config_path(topic), current.config_version
                            )
                        )
                await self._refresh_topics()
                return
            if not isinstance(failed[1], BadVersionError | NoNodeError):
                raise StoreUnavailable(f"cannot delete topic {topic!r}: {failed[1]!r}")
        raise StoreUnavailable(f"cannot delete topic {topic!r}: it keeps changing")

    async def topics(self) -> Mapping[str, TopicPlacement]:
        return await self._read_topics(watch=None)

    async def _read_topics(self, watch: Callable[[Any], None] | None) -> TopicsView:
        names = [segment_name(segment) for segment in await self._children(TOPICS, watch=watch)]
        found = await self._incarnations(names, watch)
        return types.MappingProxyType(
            {name: found[name].placement for name in names if name in found}
        )

    async def topic_updates(self) -> AsyncGenerator[Mapping[str, TopicPlacement], None]:
        self._check_open()
        async with contextlib.aclosing(self._topic_watch.eventual_values()) as values:
            async for topics in values:
                if topics is None:
                    raise StoreUnavailable("the store was closed")
                yield topics

    async def _watch_topics(self, *, task_status: trio.TaskStatus[None]) -> None:
        """Keep ``_topic_watch`` equal to the topics, re-reading whenever a watch fires.

        A watch only says "something changed"; the value published is always a fresh read, so
        changes that pile up while a read is in flight collapse into the next one.
        """
        started = False
        while True:
            wake = self._topics_wake = trio.Event()
            try:
                await self._refresh_topics()
            except StoreUnavailable as exc:
                if not started:
                    raise
                log.warning("cannot read the topics (%s); retrying", exc)
                with trio.move_on_after(1.0):
                    await wake.wait()
                continue
            if not started:
                task_status.started()
                started = True
            await wake.wait()

    async def _refresh_topics(self) -> None:
        """Read the topics, re-arm the watches and publish what was read.

        Reads and publications take turns, and one session's requests are answered in order, so
        a later publication never holds an older value than an earlier one. Writers refresh
        after their own writes, so their readers see them without waiting for the watch.
        """
        async with self._topics_lock:
            self._topic_watch.value = await self._read_topics(watch=self._on_topics_watch)

    def _on_topics_watch(self, _event: object) -> None:
        self._bridge.soon(lambda: self._topics_wake.set())

    # Users

    async def scram_credential(self, user: str, mechanism: str) -> ScramCredential | None:
        value, _version = await self._read_user(user)
        found = value.get(mechanism)
        return None if found is None else decode_credential(mechanism, found)

    async def _read_user(self, user: str) -> tuple[dict[str, Any], int | None]:
        try:
            data, stat = await self._wait(self._client.get_async(user_path(user)))
        except NoNodeError:
            return {}, None
        return dict(self._decode(data)), int(stat.version)

    async def set_scram_credential(self, user: str, credential: ScramCredential) -> None:
        await self._change_user(
            user, lambda value: value | {credential.mechanism: encode_credential(credential)}
        )

    async def delete_user(self, user: str) -> bool:
        for _ in range(RETRIES):
            value, version = await self._read_user(user)
            if version is None:
                return False
            try:
                await self._wait(self._client.delete_async(user_path(user), version=version))
                return bool(value)
            except (NoNodeError, BadVersionError):
                continue
        raise StoreUnavailable(f"cannot delete user {user!r}: its node keeps changing")

    async def _change_user(
        self, user: str, change: Callable[[dict[str, Any]], dict[str, Any]]
    ) -> None:
        """Read, change and write the user's node, again if another writer came between."""
        path = user_path(user)
        for _ in range(RETRIES):
            value, version = await self._read_user(user)
            data = json_bytes(change(value))
            try:
                if version is None:
                    await self._wait(self._client.create_async(path, data))
                else:
                    await self._wait(self._client.set_async(path, data, version=version))
                return
            except (NodeExistsError, NoNodeError, BadVersionError):
                continue
        raise StoreUnavailable(f"cannot change user {user!r}: its node keeps changing")

    async def users(self) -> Mapping[str, tuple[str, ...]]:
        found = {}
        for segment in sorted(await self._children(USERS, missing_ok=True)):
            user = segment_name(segment)
            value, version = await self._read_user(user)
            if version is not None and value:
                found[user] = tuple(sorted(value))
        return found

    # Access rules: one node, changed by compare and set

    async def acls(self) -> frozenset[Acl]:
        found, _version = await self._read_acls()
        return found

    async def _read_acls(self) -> tuple[frozenset[Acl], int | None]:
        try:
            data, stat = await self._wait(self._client.get_async(ACLS))
        except NoNodeError:
            return frozenset(), None
        return frozenset(decode_acl(a) for a in self._decode(data)), int(stat.version)

    async def change_acls(self, added: Sequence[Acl], removed: Sequence[Acl]) -> frozenset[Acl]:
        for _ in range(RETRIES):
            current, version = await self._read_acls()
            changed = (current - set(removed)) | set(added)
            data = json_bytes([encode_acl(a) for a in sorted(changed)])
            try:
                if version is None:
                    await self._wait(self._client.create_async(ACLS, data, makepath=True))
                else:
                    await self._wait(self._client.set_async(ACLS, data, version=version))
                return changed
            except (NodeExistsError, NoNodeError, BadVersionError):
                continue
        raise StoreUnavailable(f"cannot change {ACLS}: it keeps changing")

    # The session

    def _state_changed(self, state: str) -> None:
        """The session's state listener (``KazooBridge.listen``), on the trio thread."""
        log.info("ZooKeeper session %s", state)
        self._topics_wake.set()
        self._election_events.note()
        self._partition_events.note()
        self._session_events.value += 1


if TYPE_CHECKING:  # mypy proves here that the class meets the interface
    _conforms: type[ClusterStore] = ZooKeeperStore


@contextlib.asynccontextmanager
async def open_zookeeper_store(
    hosts: str,
    *,
    session_timeout: float = DEFAULT_SESSION_TIMEOUT,
    call_bound: float = DEFAULT_CALL_BOUND,
    auth: DigestAuth | None = None,
    coordinator_slots: int | None = None,
) -> AsyncIterator[ZooKeeperStore]:
    """Connect to ``hosts`` (``host:port,...`` with an optional ``/chroot``, created if missing)
    and open a store on it for the duration of the block; one ZooKeeper session.

    ``session_timeout`` is how long the ensemble keeps this session's ephemeral nodes (broker
    registrations, its offices) after it last heard from us; ``call_bound`` is the longest any one
    call waits before ``StoreUnavailable``. With ``auth`` (ZooKeeper digest authentication) the
    nodes this store creates are readable and writable by that user alone; nodes made before
    without it keep their open ACL, so protect a cluster's metadata from its first start on.
    A broker passes its ``coordinator_slots``: the first pins the cluster's count, and a store
    pinned to another count (or layout) raises ``LayoutMismatch`` before anything is served.
    """
    bridge = kazoo_bridge(hosts, session_timeout=session_timeout, call_bound=call_bound, auth=auth)
    store = ZooKeeperStore(bridge=bridge, session_timeout=session_timeout)
    bridge.listen(store._state_changed)
    async with bridge.running():
        try:
            for path in (
                BROKER_IDS,
                TOPICS,
                TOPIC_IDS,
                TOPIC_CONFIGS,
                CONSUMERS,
                USERS,
                PARTITION_STATES,
                PARTITION_CHANGES,
            ):
                await store._wait(store._client.ensure_path_async(path))
            if coordinator_slots is not None:
                await store.check_layout(coordinator_slots)
            async with trio.open_nursery() as nursery:
                await nursery.start(store._watch_topics)
                nursery.start_soon(store._keep_registrations)
                nursery.start_soon(store._keep_in_contact)
                try:
                    yield store
                finally:
                    nursery.cancel_scope.cancel()
        finally:
            store._closed = True
            store._topic_watch.value = None
            store._partition_events.note()  # a reader waiting for notes finds the store closed
