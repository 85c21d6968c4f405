"""The ZooKeeper metadata store: brokers, topics, groups, offsets and the coordinator election in a
ZooKeeper ensemble, for a cluster of brokers and coordinator failover. Its client is driven
through ``kazoo_bridge``, the one module that imports kazoo.

Layout (docs/design.md#metadata-layout; Kafka 0.8's paths where the seeds keep them)::

    /brokers/ids/<id>                                 ephemeral {"host": h, "port": p, "listeners":
                                                      {name: {"host": h, "port": p}, ...}}
    /brokers/topics/<topic>                           {"0": broker_id, "1": broker_id, ...}
    /consumers/coordinator                            ephemeral {"broker_id": id}; czxid = epoch
                                                      (take_office); under layout 2 persistent
                                                      {"broker_id": -1} (occupy_single_office)
    /coordinator_epoch                                persistent; its version counts terms
    /coordinator_layout                               {"version": v, "slots": n}, written once
    /coordinator_slots/<slot>                         ephemeral {"broker_id": id}; czxid = epoch
    /coordinator_slot_epochs/<slot>                   persistent; its version counts its terms
    /config/users/<user>                              {mechanism: {"salt", "stored_key",
                                                      "server_key", "iterations"}} (SCRAM)
    /config/acls                                      [{"principal", "resource_type", "name",
                                                      "operation"}, ...]
    /consumers/<group>/registry                       {"generation": g, "record": r, "chunks": k}
    /consumers/<group>/records/<r>-<i>                chunk i of record r: the GroupRecord's JSON
                                                      (codec.encode_group), cut into k pieces
    /consumers/<group>/owners                         the record r its owner nodes mirror
    /consumers/<group>/owners/<topic>/<partition>     "<member_id>-<index>" (intended owner)
    /consumers/<group>/offsets/<topic>/<partition>    {"offset": next, "generation": g}

Group and topic names are percent-encoded where a znode name needs it (``/``, ``%``, and the name
``coordinator``, which the election node takes); ordinary names read as themselves.

Deposed writers. Taking office is one transaction that creates the ephemeral election node and bumps
the version of ``/coordinator_epoch``; the transaction's zxid (the node's czxid) is the epoch. Every
coordinator write is a transaction that first checks that ``/coordinator_epoch`` still has the
version this office gave it (nobody took office since) and that the election node exists (the
session that holds it has not ended). Both checks are on the server, so a coordinator that wakes up
from a pause with a new kazoo session cannot write, whatever its memory says.

Contact. ``in_contact_until`` tells the coordinator until when it may renew consumers' leases: a
session timeout, less a margin, after it asked something that its office's session answered
(docs/design.md#coordinator-epochs-and-the-election). A task reads the election node every third
of the session to keep that fresh, since kazoo's own session pings are not seen from here.

Size. ZooKeeper refuses a request over its jute.maxbuffer (1 MiB by default), and a group of
thousands of members over 10,000 partitions takes more than that to write: its record alone can
approach it, its owner nodes or offsets exceed it. So a write is a list of operations cut into
transactions of at most 512 KiB, each checking the office, committed in order, each list ordered so
that whatever prefix has committed is a state readers may see: a group record goes into new chunk
nodes, then the registry names them (the commit point: a write cut short leaves the previous record
whole), then the owner nodes follow, and the owners node names the record once all of them are
written (until then, the next write lists them instead of trusting the record). An offset commit
that needs more than one transaction leaves, if cut short, each partition at its old or its new
offset; its call returns only once all are written.

Threads. Requests are sent with kazoo's ``*_async`` calls from the trio thread and awaited, and
watches and session changes reach the trio thread, through the ``KazooBridge``: no kazoo thread
ever blocks on trio, and every call is bounded, ending in ``StoreUnavailable`` after
``call_bound`` seconds (a lost quorum leaves kazoo requests pending forever).

The path helpers (``group_path``, ``topic_path``, ``segment_name``) are public because seed 02's
client-side rebalancing (``bench/seed02_session.py``, the benchmarks' baseline) keeps its nodes in
the same layout.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import math
import types
import urllib.parse
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator, Mapping, Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Literal

import attrs
import trio
import trio_util

from protocol.sasl import ScramCredential
from protocol.types import BrokerInfo, ConsumerThread, TopicPartition
from statemachine.acl import Acl
from statemachine.slots import slot_of

from .codec import (
    decode_acl,
    decode_credential,
    decode_group,
    decode_placement,
    encode_acl,
    encode_credential,
    encode_group,
    encode_placement,
)
from .interface import (
    Deposed,
    GroupRecord,
    InvalidPartitions,
    LayoutMismatch,
    MetadataStore,
    OffsetBatch,
    StoreUnavailable,
    TopicExists,
    TopicPlacement,
    UnknownTopic,
    on_listener,
)
from .kazoo_bridge import (
    BadVersionError,
    DigestAuth,
    KazooBridge,
    KazooState,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    RolledBackError,
    kazoo_bridge,
)

__all__ = [
    "BROKER_IDS",
    "CONSUMERS",
    "ELECTION",
    "EPOCH_COUNTER",
    "LAYOUT",
    "LAYOUT_VERSION",
    "TOPICS",
    "DigestAuth",
    "ZooKeeperStore",
    "group_path",
    "open_zookeeper_store",
    "segment_name",
    "topic_path",
]

log = logging.getLogger(__name__)

BROKER_IDS = "/brokers/ids"
TOPICS = "/brokers/topics"
CONSUMERS = "/consumers"
ELECTION = "/consumers/coordinator"
EPOCH_COUNTER = "/coordinator_epoch"
LAYOUT = "/coordinator_layout"
#: Per coordinator slot: ephemeral ``<slot>`` election nodes, and persistent counters whose
#: versions count each slot's terms (docs/design.md#coordinator-slots).
SLOT_ELECTIONS = "/coordinator_slots"
SLOT_EPOCHS = "/coordinator_slot_epochs"
USERS = "/config/users"
ACLS = "/config/acls"

#: The layout of the nodes above that this code reads and writes: version 1 was one election node
#: whose holder coordinated every slot; version 2 elects a holder per slot, and a broker of either
#: refuses to start on the other's store (docs/design.md#coordinator-slots).
LAYOUT_VERSION = 2

DEFAULT_SESSION_TIMEOUT = 6.0
DEFAULT_CALL_BOUND = 10.0

#: ``in_contact_until`` ends this fraction of the session timeout before the session could expire
#: on the server: it covers the time between the coordinator's check and its request leaving, and
#: the difference between the two clocks' rates. With a read every third of the session (its
#: own, ``_keep_in_contact``), contact normally reaches at least half a session ahead.
CONTACT_MARGIN_FRACTION = 1 / 6

#: How often a write that lost a race with another write of the same nodes is tried again.
_RETRIES = 5

#: ZooKeeper drops the connection of a request over its jute.maxbuffer (1 MiB by default), which
#: one transaction of a 10,000-partition group's owners or offsets exceeds: transactions are cut
#: into parts of at most this many bytes, and a group record into chunk nodes of this many.
_TX_BYTES = 512 * 1024
_CHUNK_BYTES = 200 * 1024
#: An operation's bytes in a request besides its path and data (headers, lengths, an ACL).
_OP_OVERHEAD = 64
#: The depth of the layout's leaves below /consumers/<group>: owners/<topic>/<partition>.
_GROUP_DEPTH = 3

TopicsView = Mapping[str, TopicPlacement]


@attrs.frozen
class _Office:
    epoch: int
    counter_version: int
    #: The session that holds the election node: contact under any other proves nothing.
    session: int | None
    #: The election node and the counter whose version every write of this office checks.
    election: str = ELECTION
    counter: str = EPOCH_COUNTER
    #: A slot's office: the slot and the count, so that it writes only its slot's groups
    #: (docs/design.md#coordinator-slots). None: the office of every group.
    slot: tuple[int, int] | None = None

    def admits(self, group_id: str) -> bool:
        return self.slot is None or slot_of(group_id, self.slot[1]) == self.slot[0]


@attrs.frozen
class _Op:
    """One operation of a transaction, as data, so that a long list of them can be cut into
    transactions that each fit under ZooKeeper's request limit."""

    kind: Literal["create", "set", "delete"]
    path: str
    data: bytes = b""
    version: int = -1

    @property
    def size(self) -> int:
        return len(self.path) + len(self.data)  # paths are ASCII: ``_segment`` quotes the rest

    def add_to(self, tx: Any) -> None:
        if self.kind == "create":
            tx.create(self.path, self.data)
        elif self.kind == "set":
            tx.set_data(self.path, self.data, self.version)
        else:
            tx.delete(self.path, self.version)


@attrs.frozen
class _Registry:
    """A group's registry node: its generation (for people and tools) and the record it names."""

    generation: int
    record: str
    chunks: int


@attrs.frozen
class _GroupNodes:
    """What a write of a group finds in place before it writes."""

    group_id: str
    missing_dirs: tuple[str, ...]
    registry: _Registry | None
    registry_version: int | None
    stale_records: tuple[str, ...]
    #: The record the owner nodes were last completely written for (None: no owners node).
    mirror: str | None
    owner_topics: set[str]


def _json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()


#: Names that cannot be znode names, or that this layout uses for itself.
_RESERVED = frozenset({".", "..", "coordinator"})


@lru_cache(maxsize=4096)  # offset commits build every path anew, quoting each name
def _segment(name: str) -> str:
    """A group or topic name as one znode name: percent-encoded where it must be (``/``, ``%``,
    anything outside ``[A-Za-z0-9_.~-]``), and a reserved name spelled out in full, so that the
    encoding is reversible and ordinary names read as themselves in other tools."""
    quoted = urllib.parse.quote(name, safe="")
    if quoted in _RESERVED:
        return "".join(f"%{byte:02X}" for byte in name.encode())
    return quoted or "%"


def segment_name(segment: str) -> str:
    """The group or topic name a znode name (``_segment``) spells."""
    return "" if segment == "%" else urllib.parse.unquote(segment)


def group_path(group_id: str, *parts: object) -> str:
    """``/consumers/<group>/<part>/...``, each name one znode name."""
    return "/".join((CONSUMERS, _segment(group_id), *(_segment(str(part)) for part in parts)))


def _record_path(group_id: str, record: str, index: int) -> str:
    return group_path(group_id, "records", f"{record}-{index}")


def _user_path(user: str) -> str:
    return f"{USERS}/{_segment(user)}"


def topic_path(topic: str) -> str:
    """``/brokers/topics/<topic>``: the topic's placement."""
    return f"{TOPICS}/{_segment(topic)}"


@attrs.define(eq=False)
class _Events:
    """A count of events a waiter must not miss: it notes the count (``seen``) before it looks,
    then waits for the count to move (``after``), so no event between the two is lost.
    ``watch`` is a kazoo watch callback: called on a kazoo thread, it counts on the trio thread
    through the bridge, and never blocks."""

    bridge: KazooBridge
    count: trio_util.AsyncValue[int] = attrs.Factory(lambda: trio_util.AsyncValue(0))

    @property
    def seen(self) -> int:
        seen: int = self.count.value
        return seen

    def watch(self, _event: object) -> None:
        self.bridge.soon(self.note)

    def note(self) -> None:
        self.count.value += 1

    async def after(self, seen: int) -> None:
        await self.count.wait_value(lambda count: count != seen)


@attrs.define(eq=False, repr=False)
class ZooKeeperStore:
    """A ``MetadataStore`` on a ZooKeeper ensemble; obtain one from ``open_zookeeper_store``.

    One handle is one ZooKeeper session: its broker registrations and its office end with it. If
    the session expires, kazoo opens a new one; the handle registers its brokers again, but its
    office is over for good (``wait_office_lost`` returns, and its writes raise ``Deposed``).
    """

    _bridge: KazooBridge
    _session_timeout: float
    _topic_watch: trio_util.AsyncValue[TopicsView | None]
    #: The bridge's KazooClient (untyped), named for brevity on every request.
    _client: Any = attrs.field(
        init=False, default=attrs.Factory(lambda self: self._bridge.client, takes_self=True)
    )
    _topics_wake: trio.Event = attrs.Factory(trio.Event)
    _topics_lock: trio.Lock = attrs.Factory(trio.Lock)
    #: Election watch events and session state changes.
    _election_events: _Events = attrs.field(
        init=False, default=attrs.Factory(lambda self: _Events(self._bridge), takes_self=True)
    )
    _session_events: trio_util.AsyncValue[int] = attrs.Factory(lambda: trio_util.AsyncValue(0))
    #: Child watch events on the live brokers and the slots' offices (``read_cluster``).
    _cluster_events: _Events = attrs.field(
        init=False, default=attrs.Factory(lambda self: _Events(self._bridge), takes_self=True)
    )
    _office: _Office | None = None
    #: The slot offices this handle holds, by slot (``take_slot``).
    _slot_offices: dict[int, _Office] = attrs.Factory(dict)
    #: (session, instant) of the latest request the server answered within one session, asked
    #: at that instant: the session lives at least a session timeout past it.
    _contact: tuple[int, float] | None = None
    _brokers: dict[int, BrokerInfo] = attrs.Factory(dict)
    _advertised: dict[int, dict[str, tuple[str, int]]] = attrs.Factory(dict)
    _offset_nodes: set[tuple[str, str, int]] = attrs.Factory(set)
    #: Per group, the record this handle last wrote every owner node for, and their assignment.
    _owners_written: dict[str, tuple[str, Mapping[TopicPartition, ConsumerThread]]] = attrs.Factory(
        dict
    )
    _record_ids: Iterator[int] = attrs.Factory(itertools.count)
    _closed: bool = False

    def __repr__(self) -> str:
        return f"<ZooKeeperStore {self._client.hosts!r}>"

    @property
    def operations(self) -> int:
        """ZooKeeper requests awaited (a transaction is one), for the benchmarks' counts."""
        return self._bridge.requests

    # Brokers

    async def register_broker(
        self, broker: BrokerInfo, advertised: Mapping[str, tuple[str, int]] | None = None
    ) -> None:
        self._brokers[broker.broker_id] = broker
        self._advertised[broker.broker_id] = dict(advertised or {})
        await self._register(broker)

    async def _register(self, broker: BrokerInfo) -> None:
        path = f"{BROKER_IDS}/{broker.broker_id}"
        listeners = {
            name: {"host": host, "port": port}
            for name, (host, port) in self._advertised.get(broker.broker_id, {}).items()
        }
        value: dict[str, Any] = {"host": broker.host, "port": broker.port}
        if listeners:
            value["listeners"] = listeners
        data = _json(value)
        for _ in range(_RETRIES):
            try:
                await self._wait(self._client.create_async(path, data, ephemeral=True))
                return
            except NodeExistsError:
                pass
            # Someone (perhaps this broker's previous session) holds the id: replace it.
            tx = self._client.transaction()
            tx.delete(path)
            tx.create(path, data, ephemeral=True)
            if _failure(await self._wait(tx.commit_async())) is None:
                return
        raise StoreUnavailable(f"cannot register broker {broker.broker_id}: {path} keeps changing")

    async def brokers(self, listener: str | None = None) -> tuple[BrokerInfo, ...]:
        return await self._read_brokers(listener, watch=None)

    async def _read_brokers(
        self, listener: str | None, watch: Callable[[Any], None] | None
    ) -> tuple[BrokerInfo, ...]:
        ids = await self._children(BROKER_IDS, watch=watch)
        pending = [(int(i), self._client.get_async(f"{BROKER_IDS}/{i}")) for i in ids]
        found = []
        advertised: dict[int, dict[str, tuple[str, int]]] = {}
        for broker_id, result in pending:
            try:
                data, _stat = await self._wait(result)
            except NoNodeError:
                continue
            value = self._decode(data)
            found.append(BrokerInfo(broker_id=broker_id, host=value["host"], port=value["port"]))
            advertised[broker_id] = {
                str(name): (str(address["host"]), int(address["port"]))
                for name, address in value.get("listeners", {}).items()
            }
        found.sort(key=lambda broker: broker.broker_id)
        return on_listener(found, advertised, listener)

    # The cluster's layout

    async def check_layout(self, slots: int) -> None:
        """Pin the cluster's layout version and coordinator slot count if this is the first
        broker to ask, or raise ``LayoutMismatch`` if the store holds others: the count is fixed
        when the cluster's store is created (docs/design.md#coordinator-slots)."""
        wanted = {"version": LAYOUT_VERSION, "slots": slots}
        try:
            await self._wait(self._client.create_async(LAYOUT, _json(wanted)))
            return
        except NodeExistsError:
            pass
        data, _stat = await self._wait(self._client.get_async(LAYOUT))
        found = self._decode(data)
        if found.get("version") != LAYOUT_VERSION:
            raise LayoutMismatch(
                f"the cluster's ZooKeeper store has layout version {found.get('version')}, "
                f"this broker runs version {LAYOUT_VERSION}"
            )
        if found.get("slots") != slots:
            raise LayoutMismatch(
                f"the cluster's ZooKeeper store has {found.get('slots')} coordinator slots, "
                f"this broker is configured with {slots} "
                f"(start it with --coordinator-slots {found.get('slots')})"
            )

    # Topics

    async def create_topic(self, topic: str, brokers: tuple[int, ...]) -> TopicPlacement:
        if not brokers:
            raise InvalidPartitions(f"topic {topic!r} needs at least one partition")
        placement = TopicPlacement(topic=topic, brokers=brokers)
        try:
            await self._wait(
                self._client.create_async(topic_path(topic), _json(encode_placement(placement)))
            )
        except NodeExistsError:
            raise TopicExists(topic) from None
        await self._refresh_topics()
        return placement

    async def add_partitions(self, topic: str, brokers: tuple[int, ...]) -> TopicPlacement:
        path = topic_path(topic)
        for _ in range(_RETRIES):
            try:
                data, stat = await self._wait(self._client.get_async(path))
            except NoNodeError:
                raise UnknownTopic(topic) from None
            if not brokers:
                raise InvalidPartitions(f"no partitions to add to topic {topic!r}")
            current = self._decode_placement(topic, data)
            placement = TopicPlacement(topic=topic, brokers=current.brokers + tuple(brokers))
            value = _json(encode_placement(placement))
            try:
                await self._wait(self._client.set_async(path, value, stat.version))
            except BadVersionError:
                continue  # another broker added partitions meanwhile: add ours after theirs
            await self._refresh_topics()
            return placement
        raise StoreUnavailable(f"cannot add partitions to {topic!r}: it keeps changing")

    async def delete_topic(self, topic: str) -> None:
        """Every group's offset nodes for the topic, then the topic's node last, with the version
        read (partitions added meanwhile: read again). Cut short, a delete leaves the topic with
        fewer offsets, and deleting it again finishes the job. No office is checked: none is needed
        to delete a topic, as none is to create one."""
        path = topic_path(topic)
        for _ in range(_RETRIES):
            try:
                _data, stat = await self._wait(self._client.get_async(path))
            except NoNodeError:
                raise UnknownTopic(topic) from None
            groups = await self._children(CONSUMERS, missing_ok=True)
            ops = await self._topic_offset_ops(groups, topic)
            ops.append(_Op("delete", path, version=stat.version))
            if await self._commit_in_parts(None, ops) == len(ops):
                self._offset_nodes = {n for n in self._offset_nodes if n[1] != topic}
                await self._refresh_topics()
                return
        raise StoreUnavailable(f"cannot delete topic {topic!r}: it keeps changing")

    async def _topic_offset_ops(self, group_segments: Sequence[str], topic: str) -> list[_Op]:
        """Deletes of the offset nodes of ``topic`` under each group (znode names), each
        group's directory of them after its nodes."""
        dirs = [f"{CONSUMERS}/{group}/offsets/{_segment(topic)}" for group in group_segments]
        listings = [(d, self._client.get_children_async(d)) for d in dirs]
        ops: list[_Op] = []
        for directory, result in listings:
            try:
                partitions = await self._wait(result)
            except NoNodeError:
                continue  # the election node, or a group with no offsets for the topic
            ops.extend(_Op("delete", f"{directory}/{p}") for p in partitions)
            ops.append(_Op("delete", directory))
        return ops

    async def topics(self) -> Mapping[str, TopicPlacement]:
        return await self._read_topics(watch=None)

    async def _read_topics(self, watch: Callable[[Any], None] | None) -> TopicsView:
        names = [segment_name(segment) for segment in await self._children(TOPICS, watch=watch)]
        pending = [(name, self._client.get_async(topic_path(name), watch=watch)) for name in names]
        topics = {}
        for name, result in pending:
            try:
                data, _stat = await self._wait(result)
            except NoNodeError:
                continue  # deleted since it was listed
            topics[name] = self._decode_placement(name, data)
        return types.MappingProxyType(topics)

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

    # The coordinator's office

    async def take_office(self, broker_id: int) -> int:
        self._office = office = await self._elect(broker_id, ELECTION, EPOCH_COUNTER)
        log.info("broker %d took office, epoch %d", broker_id, office.epoch)
        return office.epoch

    async def take_slot(self, broker_id: int, slot: int, slots: int) -> int:
        """Take the office of one coordinator slot, waiting while another session holds it, and
        return its epoch: the zxid of the transaction that created the slot's election node and
        bumped the slot's counter, so larger than every earlier epoch of any slot. Writes under
        it check that slot's counter and node, and admit only the slot's groups."""
        election, counter = f"{SLOT_ELECTIONS}/{slot}", f"{SLOT_EPOCHS}/{slot}"
        for path in (SLOT_ELECTIONS, counter):
            await self._wait(self._client.ensure_path_async(path))
        office = await self._elect(broker_id, election, counter, slot=(slot, slots))
        self._slot_offices[slot] = office
        log.info("broker %d took slot %d, epoch %d", broker_id, slot, office.epoch)
        return office.epoch

    async def _elect(
        self, broker_id: int, election: str, counter: str, *, slot: tuple[int, int] | None = None
    ) -> _Office:
        """Create ``election`` (ephemeral) and bump ``counter`` in one transaction, waiting while
        another session holds the node; the office that transaction began."""
        data = _json({"broker_id": broker_id})
        while True:
            seen = self._election_events.seen
            stat = await self._wait(
                self._client.exists_async(election, watch=self._election_events.watch)
            )
            tx = self._client.transaction()
            if stat is not None:
                if stat.ephemeralOwner != self._session_id():
                    # Someone else's office: stand again once it is gone.
                    await self._election_events.after(seen)
                    continue
                tx.delete(election)  # ours already: a new term, with a new epoch
            tx.create(election, data, ephemeral=True)
            tx.set_data(counter, data)
            session, asked_at = self._session_id(), trio.current_time()
            results = await self._wait(tx.commit_async())
            if _failure(results) is not None:
                continue  # lost the race to another broker
            stamp = results[-1]
            # One transaction, one zxid: the election node's czxid is the counter's mzxid.
            owner = self._session_id()
            if owner is not None and owner == session:
                self._heard(owner, asked_at)
            return _Office(
                epoch=int(stamp.mzxid),
                counter_version=stamp.version,
                session=owner,
                election=election,
                counter=counter,
                slot=slot,
            )

    async def release_slot(self, slot: int) -> None:
        """Give the slot's office up (a handoff: the caller stopped renewing leases and flushed
        its offsets first); its writes are refused from here on, and another may take it."""
        office = self._slot_offices.pop(slot, None)
        if office is None:
            return
        self._election_events.note()  # wakes wait_slot_lost
        # Checked like a write: if the node is no longer this office's (the session ended and
        # another broker took the slot), the counter moved on and nothing is deleted.
        tx = self._office_transaction(office)
        tx.delete(office.election)
        failed = _failure(await self._wait(tx.commit_async()))
        if failed is not None:
            log.info("slot %d was no longer this broker's to release: %r", slot, failed[1])

    async def abandon_slot(self, slot: int) -> None:
        """Delete the slot's election node if this session created it but holds no office for it
        (a wait for the slot given up while its transaction went through): nobody else could
        take the slot before the session ended. ZooKeeper answers one session's requests in
        order, so the transaction has been applied when this read is answered."""
        if slot in self._slot_offices:
            return
        election = f"{SLOT_ELECTIONS}/{slot}"
        stat = await self._wait(self._client.exists_async(election))
        if stat is None or stat.ephemeralOwner != self._session_id():
            return
        tx = self._client.transaction()
        tx.check(election, stat.version)
        tx.delete(election)
        if _failure(await self._wait(tx.commit_async())) is None:
            log.info("gave up slot %d, taken while no longer wanted", slot)

    async def occupy_single_office(self) -> None:
        """Keep the election node of layout 1 occupied by nobody's session, so that a broker of
        a release before the layout check, which would elect itself coordinator of every group
        there, waits for ever instead (docs/design.md#coordinator-slots)."""
        with contextlib.suppress(NodeExistsError):
            await self._wait(
                self._client.create_async(ELECTION, _json({"broker_id": -1}), makepath=True)
            )

    async def slot_holders(self) -> dict[int, int]:
        """Who holds each slot's office now (slot -> broker id); a slot nobody holds is left
        out."""
        return await self._read_slot_holders(watch=None)

    async def _read_slot_holders(self, watch: Callable[[Any], None] | None) -> dict[int, int]:
        slots = await self._children(SLOT_ELECTIONS, watch=watch, missing_ok=True)
        pending = [(int(s), self._client.get_async(f"{SLOT_ELECTIONS}/{s}")) for s in slots]
        holders = {}
        for slot, result in pending:
            try:
                data, _stat = await self._wait(result)
            except NoNodeError:
                continue
            holders[slot] = int(self._decode(data)["broker_id"])
        return dict(sorted(holders.items()))

    async def read_cluster(self) -> tuple[int, tuple[BrokerInfo, ...], dict[int, int]]:
        """The live brokers and the slots' holders, each list read with a one-shot watch on it,
        and the count of cluster events before the reads: ``cluster_changed`` with that count
        returns once a broker registered or went, or a slot's office was taken or given up,
        after they were read. A watch fires once: each read arms it again."""
        seen = self._cluster_events.seen
        brokers = await self._read_brokers(None, watch=self._cluster_events.watch)
        holders = await self._read_slot_holders(watch=self._cluster_events.watch)
        return seen, brokers, holders

    async def cluster_changed(self, seen: int) -> None:
        """Return once a watch armed after ``seen`` (``read_cluster``) has fired."""
        await self._cluster_events.after(seen)

    def in_contact_until(self) -> float:
        return self._contact_until(self._office)

    def slot_in_contact_until(self, slot: int) -> float:
        """``in_contact_until`` for the office of ``slot`` (``take_slot``): the same session
        rule, for the slot's office alone."""
        return self._contact_until(self._slot_offices.get(slot))

    def _contact_until(self, office: _Office | None) -> float:
        contact = self._contact
        if self._closed or office is None or contact is None or contact[0] != office.session:
            return -math.inf
        return contact[1] + self._session_timeout * (1 - CONTACT_MARGIN_FRACTION)

    def _heard(self, session: int, asked_at: float) -> None:
        if self._contact is None or self._contact[0] != session or self._contact[1] < asked_at:
            self._contact = (session, asked_at)

    async def _keep_in_contact(self) -> None:
        """Ask ZooKeeper something cheap every third of the session, so that
        ``in_contact_until`` stays ahead while the session lives: kazoo's own session pings are
        not seen from here (``KazooBridge.heard_in_session``). Each answer within one session
        moves the contact forward; a failure or a new session leaves it to run out."""
        interval = self._session_timeout / 3
        while True:
            asked_at = trio.current_time()
            with trio.move_on_at(asked_at + self._session_timeout):
                try:
                    heard = await self._bridge.heard_in_session(
                        lambda: self._client.exists_async(ELECTION)
                    )
                except StoreUnavailable as exc:
                    log.debug("no contact with ZooKeeper: %s", exc)
                else:
                    if heard is not None:
                        self._heard(*heard)
            await trio.sleep_until(asked_at + interval)

    async def coordinator_id(self) -> int | None:
        try:
            data, _stat = await self._wait(self._client.get_async(ELECTION))
        except NoNodeError:
            return None
        return int(self._decode(data)["broker_id"])

    async def wait_office_lost(self, *, suspended_grace: float | None = None) -> None:
        """Return once this handle's office may be over: someone else holds the election node,
        the session ended, or the connection has been lost for ``suspended_grace`` seconds.

        The session outlives a lost connection by about a third of its timeout, and consumers
        keep fetching until they have not heard from their coordinator for their own session
        timeout; a coordinator that steps down within the grace has long stopped pinging when
        its successor starts moving partitions.
        """
        await self._wait_lost(lambda: self._office is not None, ELECTION, suspended_grace)
        self._office = None

    async def wait_slot_lost(self, slot: int, *, suspended_grace: float | None = None) -> None:
        """``wait_office_lost`` for the office of ``slot``: it may be over once another session
        holds the slot's node, the session ended, the connection stayed lost for the grace, or
        this handle released the slot or was deposed from it."""
        office = self._slot_offices.get(slot)
        if office is None:
            return
        await self._wait_lost(
            lambda: self._slot_offices.get(slot) is office, office.election, suspended_grace
        )
        self._drop(office)

    async def _wait_lost(
        self, holding: Callable[[], bool], election: str, suspended_grace: float | None
    ) -> None:
        if suspended_grace is None:
            suspended_grace = self._session_timeout / 3
        while holding():
            seen = self._election_events.seen
            if self._client.state == KazooState.LOST:
                break
            if self._client.state == KazooState.SUSPENDED:
                with trio.move_on_after(suspended_grace) as grace:
                    await self._election_events.after(seen)
                if grace.cancelled_caught:
                    break
                continue
            with contextlib.suppress(StoreUnavailable):
                stat = await self._wait(
                    self._client.exists_async(election, watch=self._election_events.watch)
                )
                if stat is None or stat.ephemeralOwner != self._session_id():
                    break
            await self._election_events.after(seen)

    # Groups

    async def groups(self) -> Mapping[str, GroupRecord]:
        return await self._groups(lambda _group_id: True)

    async def slot_groups(self, slot: int, slots: int) -> Mapping[str, GroupRecord]:
        """``groups`` of one coordinator slot: only their records are read."""
        return await self._groups(lambda group_id: slot_of(group_id, slots) == slot)

    async def offset_only_groups(self) -> frozenset[str]:
        return await self._offset_only_groups(lambda _group_id: True)

    async def slot_offset_only_groups(self, slot: int, slots: int) -> frozenset[str]:
        """``offset_only_groups`` of one coordinator slot."""
        return await self._offset_only_groups(lambda group_id: slot_of(group_id, slots) == slot)

    async def _group_names(self, admit: Callable[[str], bool]) -> list[str]:
        children = await self._children(CONSUMERS)
        names = [segment_name(child) for child in children if child != "coordinator"]
        return [name for name in names if admit(name)]

    async def _offset_only_groups(self, admit: Callable[[str], bool]) -> frozenset[str]:
        names = await self._group_names(admit)
        # Each level's questions are all asked before any answer is awaited: a round trip each.
        registries = [(n, self._client.exists_async(group_path(n, "registry"))) for n in names]
        unrecorded = [name for name, result in registries if await self._wait(result) is None]
        listings = [
            (name, self._client.get_children_async(group_path(name, "offsets")))
            for name in unrecorded
        ]
        directories = []
        for name, result in listings:
            with contextlib.suppress(NoNodeError):  # nothing committed, or deleted meanwhile
                base = group_path(name, "offsets")
                directories += [
                    (name, self._client.get_children_async(f"{base}/{topic}"))
                    for topic in await self._wait(result)
                ]
        found = set()
        for name, result in directories:
            # An empty directory: made for offsets whose commit did not happen.
            with contextlib.suppress(NoNodeError):
                if await self._wait(result):
                    found.add(name)
        return frozenset(found)

    async def _groups(self, admit: Callable[[str], bool]) -> Mapping[str, GroupRecord]:
        names = await self._group_names(admit)
        pending = [(n, self._client.get_async(group_path(n, "registry"))) for n in names]
        registries = []
        for name, result in pending:
            try:
                data, _stat = await self._wait(result)
            except NoNodeError:
                continue  # a group with offsets only (a standalone committer's)
            registries.append((name, self._decode_registry(name, data)))
        # Every group's chunks are asked for before any answer is awaited: one round trip in all.
        reads = [(name, self._read_chunks(name, registry)) for name, registry in registries]
        groups = {}
        for name, chunks in reads:
            try:
                groups[name] = await self._record(name, chunks)
            except NoNodeError:
                # Written again (or deleted) between the two reads: read the registry anew.
                record = await self._read_group(name)
                if record is not None:
                    groups[name] = record
        return types.MappingProxyType(groups)

    async def _read_group(self, group_id: str) -> GroupRecord | None:
        for _ in range(_RETRIES):
            try:
                data, _stat = await self._wait(
                    self._client.get_async(group_path(group_id, "registry"))
                )
            except NoNodeError:
                return None
            registry = self._decode_registry(group_id, data)
            try:
                return await self._record(group_id, self._read_chunks(group_id, registry))
            except NoNodeError:
                continue
        raise StoreUnavailable(f"cannot read group {group_id!r}: it keeps changing")

    def _read_chunks(self, group_id: str, registry: _Registry) -> list[Any]:
        return [
            self._client.get_async(_record_path(group_id, registry.record, index))
            for index in range(registry.chunks)
        ]

    async def write_group(self, epoch: int, group: GroupRecord) -> None:
        """The record goes into new chunk nodes first; then the registry is pointed at them, which
        is the commit point readers trust, so a write cut short (a crash, a lost connection, the
        office lost between two transactions) leaves the previous record whole. The owner nodes
        follow, and the owners node names the record they mirror once every one is written."""
        office = self._check_epoch(epoch, group.group_id)
        group_id = group.group_id
        data = _json(encode_group(group))
        chunks = [data[i : i + _CHUNK_BYTES] for i in range(0, len(data), _CHUNK_BYTES)]
        registry_path = group_path(group_id, "registry")
        for _ in range(_RETRIES):
            # A new record each attempt: chunks an attempt left behind are stale, not in the way.
            record_id = f"{office.epoch}-{next(self._record_ids)}"
            registry = _json(
                {"generation": group.generation, "record": record_id, "chunks": len(chunks)}
            )
            nodes = await self._group_nodes(group_id)
            ops = [_Op("create", path) for path in nodes.missing_dirs]
            ops += [
                _Op("create", _record_path(group_id, record_id, index), chunk)
                for index, chunk in enumerate(chunks)
            ]
            if nodes.registry_version is None:
                ops.append(_Op("create", registry_path, registry))
            else:
                ops.append(_Op("set", registry_path, registry, nodes.registry_version))
            committed_at = len(ops)
            ops += self._mirror_ops(group_id, record_id, nodes, await self._owners(nodes), group)
            done = await self._commit_in_parts(office, ops)
            if done == len(ops):
                self._owners_written[group_id] = (record_id, group.assignment)
                return
            if done >= committed_at:
                break
        else:
            raise StoreUnavailable(f"cannot write group {group_id!r}: it keeps changing")
        # The registry holds the new record, but the owner nodes were not as remembered: list them.
        for _ in range(_RETRIES):
            nodes = await self._group_nodes(group_id, keep=record_id)
            owners = await self._listed_owners(nodes)
            ops = self._mirror_ops(group_id, record_id, nodes, owners, group)
            if await self._commit_in_parts(office, ops) == len(ops):
                self._owners_written[group_id] = (record_id, group.assignment)
                return
        raise StoreUnavailable(f"cannot write the owners of group {group_id!r}: they keep changing")

    async def _group_nodes(self, group_id: str, *, keep: str | None = None) -> _GroupNodes:
        """The nodes a write of the group replaces, read in one round trip."""
        registry = self._client.get_async(group_path(group_id, "registry"))
        records = self._client.get_children_async(group_path(group_id, "records"))
        owners = self._client.get_async(group_path(group_id, "owners"))
        owner_topics = self._client.get_children_async(group_path(group_id, "owners"))
        missing = []
        try:
            data, stat = await self._wait(registry)
            current, version = self._decode_registry(group_id, data), stat.version
        except NoNodeError:
            current, version = None, None
            # A new group, or one with offsets only (a standalone committer's).
            if await self._wait(self._client.exists_async(group_path(group_id))) is None:
                missing.append(group_path(group_id))
        try:
            stale = [
                name
                for name in await self._wait(records)
                if keep is None or not name.startswith(f"{keep}-")
            ]
        except NoNodeError:
            missing.append(group_path(group_id, "records"))
            stale = []
        try:
            mirror, _stat = await self._wait(owners)
            topics = set(await self._wait(owner_topics))
        except NoNodeError:
            missing.append(group_path(group_id, "owners"))
            mirror, topics = None, set()
        return _GroupNodes(
            group_id=group_id,
            missing_dirs=tuple(missing),
            registry=current,
            registry_version=version,
            stale_records=tuple(stale),
            mirror=None if mirror is None else mirror.decode(errors="replace"),
            owner_topics=topics,
        )

    async def _owners(self, nodes: _GroupNodes) -> Mapping[TopicPartition, ConsumerThread | None]:
        """What the owner nodes hold. The owners node names a record only after all of them were
        written for it, and every write commits a new record before it touches them, so they
        match the registry's record exactly when the owners node names that record. Otherwise (a
        write was cut short after its commit point) they are listed, values unknown."""
        registry = nodes.registry
        if registry is None or nodes.mirror != registry.record:
            return await self._listed_owners(nodes)
        remembered = self._owners_written.get(nodes.group_id)
        if remembered is not None and remembered[0] == registry.record:
            return remembered[1]
        try:
            record = await self._record(nodes.group_id, self._read_chunks(nodes.group_id, registry))
        except NoNodeError:
            return await self._listed_owners(nodes)  # written meanwhile: the commit will fail
        return record.assignment

    async def _listed_owners(
        self, nodes: _GroupNodes
    ) -> Mapping[TopicPartition, ConsumerThread | None]:
        listings = [
            (
                segment_name(topic),
                self._client.get_children_async(
                    group_path(nodes.group_id, "owners", segment_name(topic))
                ),
            )
            for topic in nodes.owner_topics
        ]
        owners: dict[TopicPartition, ConsumerThread | None] = {}
        for topic, result in listings:
            with contextlib.suppress(NoNodeError):
                for partition in await self._wait(result):
                    owners[TopicPartition(topic=topic, partition=int(partition))] = None
        return owners

    def _mirror_ops(
        self,
        group_id: str,
        record_id: str,
        nodes: _GroupNodes,
        owners: Mapping[TopicPartition, ConsumerThread | None],
        group: GroupRecord,
    ) -> list[_Op]:
        """After the registry: drop the records it no longer names, bring the owner nodes from
        ``owners`` to the group's assignment, and last name the record they now mirror."""
        ops = [_Op("delete", group_path(group_id, "records", name)) for name in nodes.stale_records]
        for tp in owners.keys() - group.assignment.keys():
            ops.append(_Op("delete", group_path(group_id, "owners", tp.topic, tp.partition)))
        topics = set(nodes.owner_topics)
        for tp, thread in group.assignment.items():
            if _segment(tp.topic) not in topics:
                ops.append(_Op("create", group_path(group_id, "owners", tp.topic)))
                topics.add(_segment(tp.topic))
            path = group_path(group_id, "owners", tp.topic, tp.partition)
            if tp not in owners:
                ops.append(_Op("create", path, f"{thread.member_id}-{thread.index}".encode()))
            elif owners[tp] != thread:
                ops.append(_Op("set", path, f"{thread.member_id}-{thread.index}".encode()))
        ops.append(_Op("set", group_path(group_id, "owners"), record_id.encode()))
        return ops

    async def delete_group(self, epoch: int, group_id: str) -> None:
        office = self._check_epoch(epoch, group_id)
        root = group_path(group_id)
        registry = group_path(group_id, "registry")
        records = group_path(group_id, "records")
        for _ in range(_RETRIES):
            nodes = await self._group_subtree(group_id)
            if not nodes:
                # Nothing to delete, but still only from office.
                await self._commit_in_office(self._office_transaction(office), office)
                return
            # Offsets and owners first, then the registry before the chunks it names: cut short,
            # a delete leaves a group with fewer offsets (deleting it again finishes the job) or
            # none at all, never a registry whose record is gone.
            last = [registry, *(n for n in reversed(nodes) if n.startswith(f"{records}/")), records]
            last = [n for n in last if n in nodes]
            first = [n for n in reversed(nodes) if n not in last and n != root]
            ops = [_Op("delete", path) for path in [*first, *last, root]]
            if await self._commit_in_parts(office, ops) == len(ops):
                self._offset_nodes = {n for n in self._offset_nodes if n[0] != group_id}
                self._owners_written.pop(group_id, None)
                return
        raise StoreUnavailable(f"cannot delete group {group_id!r}: it keeps changing")

    # Offsets

    async def commit_offsets(self, epoch: int, batches: Sequence[OffsetBatch]) -> None:
        office = self._check_epoch(epoch, *{batch.group_id for batch in batches})
        latest: dict[tuple[str, str, int], tuple[int, int]] = {}
        for batch in batches:
            for tp, offset in batch.offsets.items():
                latest[batch.group_id, tp.topic, tp.partition] = (offset, batch.generation)
        if not latest:
            return
        for _ in range(_RETRIES):
            await self._learn_offset_nodes(latest.keys() - self._offset_nodes)
            keys = list(latest)
            ops = []
            for key in keys:
                offset, generation = latest[key]
                path = group_path(key[0], "offsets", key[1], key[2])
                value = _json({"offset": offset, "generation": generation})
                ops.append(_Op("set" if key in self._offset_nodes else "create", path, value))
            done = await self._commit_in_parts(office, ops)
            self._offset_nodes.update(keys[:done])
            if done == len(keys):
                return
            for key in keys[:done]:
                del latest[key]
            # A node we thought was there was gone, or the other way round: learn again.
            self._offset_nodes.difference_update(latest)
        raise StoreUnavailable("cannot commit offsets: their nodes keep changing")

    async def _learn_offset_nodes(self, keys: set[tuple[str, str, int]]) -> None:
        """Learn which offset nodes exist in the directories of ``keys``, creating the directories
        that are missing. One listing per topic, not a request per partition; empty directories
        change nothing a reader sees, so creating them needs no office."""
        dirs = sorted({(group, topic) for group, topic, _partition in keys})
        created = [self._client.ensure_path_async(group_path(g, "offsets", t)) for g, t in dirs]
        for result in created:
            await self._wait(result)
        listings = [
            (g, t, self._client.get_children_async(group_path(g, "offsets", t))) for g, t in dirs
        ]
        for group, topic, result in listings:
            with contextlib.suppress(NoNodeError):  # deleted meanwhile: its nodes are gone too
                for partition in await self._wait(result):
                    self._offset_nodes.add((group, topic, int(partition)))

    async def delete_offsets(self, epoch: int, group_id: str, topic: str) -> None:
        office = self._check_epoch(epoch, group_id)
        for _ in range(_RETRIES):
            ops = await self._topic_offset_ops([_segment(group_id)], topic)
            if await self._commit_in_parts(office, ops) == len(ops):
                self._offset_nodes = {n for n in self._offset_nodes if n[:2] != (group_id, topic)}
                return
        raise StoreUnavailable(f"cannot delete the offsets of {group_id!r} for {topic!r}")

    async def fetch_offsets(self, group_id: str) -> Mapping[TopicPartition, int]:
        base = group_path(group_id, "offsets")
        topics = await self._children(base, missing_ok=True)
        listings = [(t, self._client.get_children_async(f"{base}/{t}")) for t in topics]
        pending = []
        for topic, result in listings:
            try:
                partitions = await self._wait(result)
            except NoNodeError:
                continue
            for p in partitions:
                path = f"{base}/{topic}/{p}"
                tp = TopicPartition(topic=segment_name(topic), partition=int(p))
                pending.append((tp, self._client.get_async(path)))
        offsets = {}
        for tp, result in pending:
            try:
                data, _stat = await self._wait(result)
            except NoNodeError:
                continue
            offsets[tp] = int(self._decode(data)["offset"])
        return types.MappingProxyType(offsets)

    # Plumbing

    # Users

    async def scram_credential(self, user: str, mechanism: str) -> ScramCredential | None:
        value, _version = await self._read_user(user)
        found = value.get(mechanism)
        return None if found is None else decode_credential(mechanism, found)

    async def _read_user(self, user: str) -> tuple[dict[str, Any], int | None]:
        try:
            data, stat = await self._wait(self._client.get_async(_user_path(user)))
        except NoNodeError:
            return {}, None
        return dict(self._decode(data)), int(stat.version)

    async def set_scram_credential(self, user: str, credential: ScramCredential) -> None:
        await self._change_user(
            user, lambda value: value | {credential.mechanism: encode_credential(credential)}
        )

    async def delete_user(self, user: str) -> bool:
        for _ in range(_RETRIES):
            value, version = await self._read_user(user)
            if version is None:
                return False
            try:
                await self._wait(self._client.delete_async(_user_path(user), version=version))
                return bool(value)
            except (NoNodeError, BadVersionError):
                continue
        raise StoreUnavailable(f"cannot delete user {user!r}: its node keeps changing")

    async def _change_user(
        self, user: str, change: Callable[[dict[str, Any]], dict[str, Any]]
    ) -> None:
        """Read, change and write the user's node, again if another writer came between."""
        path = _user_path(user)
        for _ in range(_RETRIES):
            value, version = await self._read_user(user)
            data = _json(change(value))
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
        for _ in range(_RETRIES):
            current, version = await self._read_acls()
            changed = (current - set(removed)) | set(added)
            data = _json([encode_acl(a) for a in sorted(changed)])
            try:
                if version is None:
                    await self._wait(self._client.create_async(ACLS, data, makepath=True))
                else:
                    await self._wait(self._client.set_async(ACLS, data, version=version))
                return changed
            except (NodeExistsError, NoNodeError, BadVersionError):
                continue
        raise StoreUnavailable(f"cannot change {ACLS}: it keeps changing")

    def _check_open(self) -> None:
        if self._closed:
            raise StoreUnavailable("the store is closed")

    def _check_epoch(self, epoch: int, *group_ids: str) -> _Office:
        """The office of ``epoch``, which must admit every group written under it: the whole
        cluster's office, or a slot's for the slot's groups alone."""
        office = self._office
        if office is None or office.epoch != epoch:
            office = next((o for o in self._slot_offices.values() if o.epoch == epoch), None)
        if office is None:
            current = None if self._office is None else self._office.epoch
            raise Deposed(f"epoch {epoch} is not this store's coordinator epoch {current}")
        for group_id in group_ids:
            if not office.admits(group_id):
                raise Deposed(f"group {group_id!r} is not in the slot of epoch {epoch}")
        return office

    def _office_transaction(self, office: _Office | None) -> Any:
        """A transaction checking ``office`` first; None: a write any broker may make."""
        tx = self._client.transaction()
        if office is None:
            return tx
        tx.check(office.counter, office.counter_version)
        tx.check(office.election, 0)  # exists: an election node is never written after creation
        return tx

    def _drop(self, office: _Office) -> None:
        if self._office is office:
            self._office = None
        elif office.slot is not None and self._slot_offices.get(office.slot[0]) is office:
            del self._slot_offices[office.slot[0]]

    async def _commit_in_office(self, tx: Any, office: _Office | None) -> bool:
        """Commit a transaction from ``_office_transaction``: True if it happened, False if it
        lost a race with another write (retry), ``Deposed`` if the office is over."""
        failed = _failure(await self._wait(tx.commit_async()))
        if failed is None:
            return True
        index, exc = failed
        if office is not None and index < 2:
            self._drop(office)
            raise Deposed(f"the coordinator office of this store is over ({exc!r})")
        if isinstance(exc, NoNodeError | NodeExistsError | BadVersionError | NotEmptyError):
            return False
        raise StoreUnavailable(f"transaction failed: {exc!r}")

    async def _commit_in_parts(self, office: _Office | None, ops: Sequence[_Op]) -> int:
        """Commit ``ops`` in order, as transactions checking ``office`` that each fit well under
        ZooKeeper's request limit; how many of them (a prefix) are committed: all, or fewer when a
        part lost a race with another write. A part committed stays committed, so callers order
        ``ops`` such that every prefix leaves a state readers may see. Raises as
        ``_commit_in_office``."""
        overhead = _OP_OVERHEAD + len(self._client.chroot)
        done = 0
        while done < len(ops):
            tx = self._office_transaction(office)
            end, size = done, 0
            while end < len(ops) and (end == done or size + ops[end].size + overhead <= _TX_BYTES):
                ops[end].add_to(tx)
                size += ops[end].size + overhead
                end += 1
            if not await self._commit_in_office(tx, office):
                return done
            done = end
        return done

    async def _children(
        self, path: str, *, watch: Callable[[Any], None] | None = None, missing_ok: bool = False
    ) -> list[str]:
        try:
            return list(await self._wait(self._client.get_children_async(path, watch=watch)))
        except NoNodeError:
            if missing_ok:
                return []
            raise StoreUnavailable(f"{path} is missing") from None

    async def _group_subtree(self, group_id: str) -> list[str]:
        """The group's nodes, parents first; empty if it has none. Its partitions' owner and
        offset nodes are the layout's leaves, so they are not asked for children: a big group
        has tens of thousands of them."""
        nodes = []
        frontier = [group_path(group_id)]
        for depth in range(_GROUP_DEPTH + 1):
            if depth == _GROUP_DEPTH:
                nodes.extend(frontier)
                break
            pending = [(p, self._client.get_children_async(p)) for p in frontier]
            frontier = []
            for path, result in pending:
                try:
                    children = await self._wait(result)
                except NoNodeError:
                    continue
                nodes.append(path)
                frontier.extend(f"{path}/{child}" for child in children)
        return nodes

    async def _wait(self, result: Any) -> Any:
        """A request's answer (``KazooBridge.answer``), counted in ``operations``."""
        self._check_open()
        return await self._bridge.answer(result)

    def _session_id(self) -> int | None:
        return self._bridge.session_id()

    def _state_changed(self, state: str) -> None:
        """The session's state listener (``KazooBridge.listen``), on the trio thread."""
        log.info("ZooKeeper session %s", state)
        self._topics_wake.set()
        self._election_events.note()
        self._session_events.value += 1

    async def _keep_registrations(self) -> None:
        """Register this handle's brokers again whenever kazoo had to open a new session."""
        session = self._session_id()
        async for _ in self._session_events.eventual_values():
            if self._client.state != KazooState.CONNECTED or self._session_id() == session:
                continue
            session = self._session_id()
            for broker in list(self._brokers.values()):
                try:
                    await self._register(broker)
                except StoreUnavailable as exc:
                    log.warning("cannot register broker %d again: %s", broker.broker_id, exc)

    def _decode(self, data: bytes) -> Any:
        try:
            return json.loads(data)
        except ValueError as exc:
            raise StoreUnavailable(f"unreadable node: {data[:200]!r}") from exc

    def _decode_registry(self, group_id: str, data: bytes) -> _Registry:
        try:
            value = json.loads(data)
            return _Registry(
                generation=int(value["generation"]),
                record=str(value["record"]),
                chunks=int(value["chunks"]),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise StoreUnavailable(f"unreadable registry of group {group_id!r}: {exc}") from exc

    async def _record(self, group_id: str, chunks: list[Any]) -> GroupRecord:
        """A group record from the reads of its chunk nodes (``_read_chunks``), in order;
        NoNodeError if one is gone (the group was written again or deleted meanwhile)."""
        answers = [await self._wait(result) for result in chunks]
        try:
            return decode_group(json.loads(b"".join(data for data, _stat in answers)))
        except (ValueError, KeyError, TypeError) as exc:
            raise StoreUnavailable(f"unreadable record of group {group_id!r}: {exc}") from exc

    def _decode_placement(self, topic: str, data: bytes) -> TopicPlacement:
        try:
            return decode_placement(topic, self._decode(data))
        except (KeyError, TypeError, ValueError) as exc:
            raise StoreUnavailable(f"unreadable placement of topic {topic!r}: {exc}") from exc


def _failure(results: Sequence[Any]) -> tuple[int, Exception] | None:
    """The operation that made a transaction fail (the others say RolledBackError), if any."""
    for index, result in enumerate(results):
        if isinstance(result, Exception) and not isinstance(result, RolledBackError):
            return index, result
    return None


if TYPE_CHECKING:  # mypy proves here that the class meets the interface
    _conforms: type[MetadataStore] = ZooKeeperStore


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
    registrations, the office) after it last heard from us; ``call_bound`` is the longest any one
    call waits before ``StoreUnavailable``. With ``auth`` (ZooKeeper digest authentication) the
    nodes this store creates are readable and writable by that user alone; nodes made before
    without it keep their open ACL, so protect a cluster's metadata from its first start on.
    A broker passes its ``coordinator_slots``: the first pins the cluster's count, and a store
    pinned to another count (or layout) raises ``LayoutMismatch`` before anything is served.
    """
    bridge = kazoo_bridge(hosts, session_timeout=session_timeout, call_bound=call_bound, auth=auth)
    store = ZooKeeperStore(
        bridge=bridge, session_timeout=session_timeout, topic_watch=trio_util.AsyncValue(None)
    )
    bridge.listen(store._state_changed)
    async with bridge.running():
        try:
            for path in (BROKER_IDS, TOPICS, CONSUMERS, EPOCH_COUNTER, USERS):
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
