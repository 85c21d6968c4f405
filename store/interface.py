"""The metadata store's contract: the records it keeps, the errors it raises, and the interface
that the embedded store and the ZooKeeper store both implement (docs/design.md#metadata-layout).

The interface is five protocols, one per concern, so that a user names the part it uses and a
wrapper the part it changes: ``TopicStore`` (brokers, placements), ``SecurityStore`` (credentials,
rules), ``GroupStore`` (records and offsets by group), ``ReplicationStore`` (replicated
partitions' leaders and in-sync replicas) and ``OfficeStore`` (a coordinator's office, its
contact and the groups it recovers). ``MetadataStore`` is all five: the embedded store, and
one slot's view of the ZooKeeper store (store/slot_store.py), on which the coordinator runs
unchanged, so that a single broker runs with zero set-up and a cluster swaps in ZooKeeper without
the coordinator noticing. The contract suite in ``tests/store`` is the executable form of this
module's promises.
"""

from __future__ import annotations

import types
import uuid
from collections.abc import AsyncGenerator, Iterable, Mapping, Sequence
from typing import Protocol

import attrs

from protocol.sasl import ScramCredential
from protocol.types import NO_TOPIC_ID, BrokerInfo, TopicId, TopicPartition
from statemachine.acl import Acl
from statemachine.partition_state import PartitionKey, PartitionState, StateWrite
from statemachine.records import GroupRecord, MemberRecord

__all__ = [
    "Assignment",
    "ClusterStore",
    "Deposed",
    "GroupRecord",
    "GroupStore",
    "InvalidPartitions",
    "InvalidReplicationFactor",
    "MemberRecord",
    "MetadataStore",
    "OfficeStore",
    "OffsetBatch",
    "ReplicationStore",
    "SecurityStore",
    "StoreError",
    "StoreUnavailable",
    "TopicExists",
    "TopicPlacement",
    "TopicStore",
    "UnknownTopic",
    "offset_is_current",
    "replica_lists",
    "writable_offsets",
]


# Records are frozen all the way down: a caller that goes on mutating the dict it passed in must not
# change what the store holds (or what another reader was given) behind the journal's back.


def _int_tuple(values: Iterable[int]) -> tuple[int, ...]:
    return tuple(values)


def _frozen_offsets(offsets: Mapping[TopicPartition, int]) -> Mapping[TopicPartition, int]:
    if isinstance(offsets, types.MappingProxyType):
        # Another batch's (``writable_offsets``): the dict behind it copies without hashing
        # every key again, which attrs' generated hash makes a Python call each.
        return types.MappingProxyType(offsets.copy())
    return types.MappingProxyType(dict(offsets))


def _frozen_ids(topic_ids: Mapping[str, TopicId]) -> Mapping[str, TopicId]:
    return types.MappingProxyType(dict(topic_ids))


#: The brokers a store is asked to place partitions on: one broker per partition (replication
#: factor 1), or each partition's replicas, its preferred leader first.
Assignment = tuple[int, ...] | tuple[tuple[int, ...], ...]


def replica_lists(assignment: Iterable[int | Iterable[int]]) -> tuple[tuple[int, ...], ...]:
    """Each partition's replicas, from an ``Assignment`` of either shape."""
    return tuple(
        (int(replicas),) if isinstance(replicas, int) else tuple(int(b) for b in replicas)
        for replicas in assignment
    )


def _replicated(values: Iterable[Iterable[int]]) -> tuple[tuple[int, ...], ...]:
    """Factor 1 spelled as one-replica lists is factor 1: kept as none, so that two placements
    of one topic compare (and hash) equal however they were built."""
    replicas = replica_lists(values)
    return () if all(len(r) == 1 for r in replicas) else replicas


@attrs.frozen(kw_only=True)
class TopicPlacement:
    """Where a topic's partitions live: ``brokers[p]`` is partition ``p``'s preferred leader,
    its one broker at replication factor 1, and ``replicas[p]`` every broker holding a replica
    of it, the preferred leader first; the tuples' length is the partition count. Who leads a
    replicated partition now is its state's (``ReplicationStore``), not the placement's.

    On ZooKeeper it is the JSON map ``{"0": 1, ...}`` at ``/brokers/topics/<topic>``, or with
    replicas ``{"0": [1, 2, 3], ...}``. ``topic_id`` names the incarnation
    (docs/design.md#topic-ids): a store gives every topic it publishes one. Build a replicated
    one with ``of``: ``brokers`` must be the replicas' first.
    """

    topic: str
    brokers: tuple[int, ...] = attrs.field(converter=_int_tuple)
    topic_id: TopicId
    #: The settings the topic was created with, sorted by name (protocol/topic_configs.py: the
    #: names Kafka's, the values checked); one it does not name is each broker's own. A tuple,
    #: not a mapping, so a placement stays hashable (broker/dispatch.py keeps answers by it).
    configs: tuple[tuple[str, str], ...] = ()
    #: Each partition's replicas at a factor above 1; none at factor 1 (``replicas`` derives
    #: them from ``brokers``), so a factor-1 placement is what it always was.
    _replicas: tuple[tuple[int, ...], ...] = attrs.field(default=(), converter=_replicated)

    @_replicas.validator
    def _check_replicas(self, _attribute: object, replicas: tuple[tuple[int, ...], ...]) -> None:
        if not replicas:
            return
        if len(replicas) != len(self.brokers):
            raise ValueError(f"{len(replicas)} replica lists for {len(self.brokers)} partitions")
        factor = len(replicas[0])
        for partition, (broker, listed) in enumerate(zip(self.brokers, replicas, strict=True)):
            if len(listed) != factor or len(set(listed)) != factor or listed[0] != broker:
                raise ValueError(
                    f"partition {partition}'s replicas {list(listed)} are not {factor} distinct "
                    f"brokers led by broker {broker}"
                )

    @classmethod
    def of(
        cls,
        *,
        topic: str,
        assignment: Assignment,
        topic_id: TopicId,
        configs: tuple[tuple[str, str], ...] = (),
    ) -> TopicPlacement:
        """The placement of ``assignment`` (either shape), ``brokers`` its first replicas."""
        replicas = replica_lists(assignment)
        return cls(
            topic=topic,
            brokers=tuple(r[0] for r in replicas),
            replicas=replicas,
            topic_id=topic_id,
            configs=configs,
        )

    def with_partitions(self, brokers: Assignment) -> TopicPlacement:
        """This placement with partitions on ``brokers`` after its own, each with as many
        replicas as the topic's (``InvalidReplicationFactor`` otherwise)."""
        replicas = replica_lists(brokers)
        factor = self.replication_factor
        if any(len(listed) != factor for listed in replicas):
            raise InvalidReplicationFactor(
                f"topic {self.topic!r} has replication factor {factor}: "
                f"partitions are added with as many replicas"
            )
        return TopicPlacement.of(
            topic=self.topic,
            assignment=self.replicas + replicas,
            topic_id=self.topic_id,
            configs=self.configs,
        )

    @property
    def partition_count(self) -> int:
        return len(self.brokers)

    @property
    def replicas(self) -> tuple[tuple[int, ...], ...]:
        return self._replicas or tuple((broker,) for broker in self.brokers)

    @property
    def replication_factor(self) -> int:
        return len(self._replicas[0]) if self._replicas else 1


@attrs.frozen(kw_only=True)
class OffsetBatch:
    """One group's offsets, reported under one generation.

    A committed offset is the *next* offset to read. The generation travels with the offsets into
    the store, so that whoever recovers them can tell which rebalance they were reported under.
    """

    group_id: str
    generation: int
    offsets: Mapping[TopicPartition, int] = attrs.field(converter=_frozen_offsets)
    topic_ids: Mapping[str, TopicId] = attrs.field(factory=dict, converter=_frozen_ids)
    """The incarnation each topic's offsets were read from (docs/design.md#topic-ids); a topic
    not named here: the one in force when the store writes them (a commit by name). The store
    writes no offset of an incarnation that is not the topic's current one."""


def writable_offsets(batch: OffsetBatch, current: Mapping[str, TopicId]) -> OffsetBatch:
    """The part of ``batch`` a store writes, given the id of each of its topics' incarnation in
    force (``current``; NO_TOPIC_ID: no topic has the name): a topic's offsets read from another
    incarnation are dropped, silently, since that incarnation is gone and its offsets mean
    nothing to the one in force (its coordinator forgets them too); the rest are written under
    the current id, which the result's ``topic_ids`` names for each topic it keeps. Offsets
    committed by name while no topic has the name are written under NO_TOPIC_ID: they belong to
    no incarnation, and none created later sees them."""
    topic_ids: dict[str, TopicId] = {}
    dropped = set()
    for topic in {tp.topic for tp in batch.offsets}:
        if batch.topic_ids.get(topic, NO_TOPIC_ID) in (NO_TOPIC_ID, current[topic]):
            topic_ids[topic] = current[topic]
        else:
            dropped.add(topic)
    offsets = batch.offsets
    if dropped:
        offsets = {tp: offset for tp, offset in offsets.items() if tp.topic not in dropped}
    return OffsetBatch(
        group_id=batch.group_id, generation=batch.generation, offsets=offsets, topic_ids=topic_ids
    )


def offset_is_current(stored: TopicId | None, current: TopicId) -> bool:
    """Whether an offset stored under the id ``stored`` is one of the incarnation in force,
    ``current`` (NO_TOPIC_ID: no topic has the name); one stored before topics had ids (None)
    counts as the current incarnation's."""
    return stored is None or stored == current


class StoreError(Exception):
    """Base of everything the store raises on purpose."""


class StoreUnavailable(StoreError):
    """The store could not be reached, read or written in bounded time, or its I/O failed.

    Nothing partial is left behind: a write that raises this either happened completely or not at
    all, and the caller may retry it.
    """


class Deposed(StoreError):
    """A write carried an epoch that is no longer the store's current coordinator epoch.

    The writer is a deposed coordinator (docs/design.md#coordinator-epochs-and-the-election); it
    must stop acting as one. Nothing was changed.
    """


class LayoutMismatch(StoreError):
    """The shared store was created for another layout version or another coordinator slot count
    than this broker runs (docs/design.md#coordinator-slots). Two counts would put one group under
    two coordinators, so the broker must not start; the message says what the store holds."""


class TopicExists(StoreError):
    pass


class UnknownTopic(StoreError):
    pass


class InvalidPartitions(StoreError):
    """An empty placement: a topic has at least one partition and partitions never shrink."""


class InvalidReplicationFactor(StoreError):
    """A replication factor this store cannot keep now (INVALID_REPLICATION_FACTOR, 38): above
    1 on the embedded store, partitions added to a topic with another factor than its own, or a
    replicated topic (or one with replication settings) while a broker of an older layout is
    registered, which could not read it (docs/design.md#coordinator-slots); the message says
    which."""


def on_listener(
    brokers: Iterable[BrokerInfo],
    advertised: Mapping[int, Mapping[str, tuple[str, int]]],
    listener: str | None,
) -> tuple[BrokerInfo, ...]:
    """``brokers`` as a client of ``listener`` reaches them (MetadataStore.brokers)."""
    if listener is None:
        return tuple(brokers)
    found = []
    for broker in brokers:
        address = advertised.get(broker.broker_id, {}).get(listener)
        if address is not None:
            found.append(BrokerInfo(broker_id=broker.broker_id, host=address[0], port=address[1]))
    return tuple(found)


class TopicStore(Protocol):
    """The live brokers and the topics' placements: what every broker reads to route and serve
    partitions, and the topic admin writes. No office is checked: any broker may create or delete
    a topic."""

    async def register_broker(
        self,
        broker: BrokerInfo,
        advertised: Mapping[str, tuple[str, int]] | None = None,
        *,
        log_dir: uuid.UUID | None = None,
    ) -> None:
        """Announce a live broker; a later registration of the same id replaces it.
        ``advertised``: the address it advertises on each of its listeners, by listener name
        (Kafka's ``advertised.listeners``); ``broker`` holds the address of its first.
        ``log_dir``: the id of its log directory (``ReplicationStore.broker_dirs``), new when
        the directory is new or wiped; None: it names none."""
        ...

    async def brokers(self, listener: str | None = None) -> tuple[BrokerInfo, ...]:
        """The live brokers, sorted by id, each under the address it advertises on
        ``listener`` (those without that listener left out); None: their first listener's."""
        ...

    async def create_topic(
        self, topic: str, brokers: Assignment, configs: tuple[tuple[str, str], ...] = ()
    ) -> TopicPlacement:
        """A new incarnation of the name, with an id no other ever had
        (docs/design.md#topic-ids), its partitions on ``brokers``: one broker each, or each its
        replicas. Raises ``TopicExists``, ``InvalidPartitions`` when ``brokers`` is empty, or
        ``InvalidReplicationFactor``. Creates and deletes of one name are linearizable, also
        from two brokers at once: two of them never both act on one incarnation. A replicated
        partition has no state until its controller writes one (``ReplicationStore``)."""
        ...

    async def add_partitions(self, topic: str, brokers: Assignment) -> TopicPlacement:
        """Append partitions placed on ``brokers`` (replicas as many as the topic's factor);
        existing ones keep their numbers and homes.

        Raises ``UnknownTopic``, ``InvalidPartitions`` when ``brokers`` is empty, or
        ``InvalidReplicationFactor``.
        """
        ...

    async def delete_topic(self, topic: str) -> None:
        """Forget the topic and every group's committed offsets for it, so that a topic created
        again under the name starts with none; no epoch, as for creating one: any broker may
        delete a topic. Raises ``UnknownTopic``.

        The coordinator forgets the topic's offsets in memory when its topic watch shows the
        topic gone, and removes those its committer wrote meanwhile (``delete_offsets``)."""
        ...

    async def topics(self) -> Mapping[str, TopicPlacement]: ...

    def topic_updates(self) -> AsyncGenerator[Mapping[str, TopicPlacement], None]:
        """A level-triggered watch over ``topics()``.

        Yields the current topics at once, then the latest value whenever it changed; values that
        were superseded before the reader came back are skipped, as with ZooKeeper's watches, so a
        slow reader never falls behind a queue of stale changes. A generator rather than a bare
        iterator so that a reader can close it promptly (``contextlib.aclosing``).
        """
        ...


class SecurityStore(Protocol):
    """SCRAM credentials and access rules (statemachine/acl.py): what a listener authenticates
    and authorizes against, and what the security admin changes."""

    async def scram_credential(self, user: str, mechanism: str) -> ScramCredential | None:
        """The user's salted, hashed credential for ``mechanism``; None: no such user or none
        for that mechanism."""
        ...

    async def set_scram_credential(self, user: str, credential: ScramCredential) -> None:
        """Add or replace the user's credential for ``credential.mechanism``."""
        ...

    async def delete_user(self, user: str) -> bool:
        """Remove every credential of ``user``; False if it had none."""
        ...

    async def users(self) -> Mapping[str, tuple[str, ...]]:
        """Every user with a credential, and its mechanisms (sorted)."""
        ...

    async def acls(self) -> frozenset[Acl]:
        """Every access rule (statemachine/acl.py)."""
        ...

    async def change_acls(self, added: Sequence[Acl], removed: Sequence[Acl]) -> frozenset[Acl]:
        """Add and remove rules in one write; the rules in force after it."""
        ...


class GroupStore(Protocol):
    """Groups' records and committed offsets, by group id. Writes carry the writer's coordinator
    epoch and raise ``Deposed``, changing nothing, unless it is an office's current epoch that
    admits the group."""

    async def write_group(self, epoch: int, group: GroupRecord) -> None:
        """Replace the group's whole record: readers see the old record or the new one whole, even
        if the call fails part-way."""
        ...

    async def delete_group(self, epoch: int, group_id: str) -> None:
        """Forget the group and its offsets; a group the store does not know is not an error."""
        ...

    async def commit_offsets(self, epoch: int, batches: Sequence[OffsetBatch]) -> None:
        """Make every batch durable before returning. If the call fails, each partition's offset
        is either its old one or its new one, never anything else (a store may need more than one
        transaction for a large commit: the ZooKeeper store's are at most 512 KiB each).

        Later batches of the same call win over earlier ones for the same partition. A group needs
        no record to have offsets: a standalone committer's group may never register members.

        A batch's offsets of a topic whose ``topic_ids`` entry is not the topic's id in force are
        dropped without an error (``writable_offsets``); those of a topic it does not name are
        written under the id in force (docs/design.md#topic-ids).
        """
        ...

    async def delete_offsets(self, epoch: int, group_id: str, topic: str) -> None:
        """Forget the group's committed offsets for ``topic`` (a deleted topic's); none is not
        an error."""
        ...

    async def fetch_offsets(self, group_id: str) -> Mapping[TopicPartition, int]:
        """The group's committed offsets of the topics' incarnations in force
        (``offset_is_current``); empty for a group the store does not know."""
        ...


class OfficeStore(Protocol):
    """A coordinator's office: taking it, until when it may act on it (contact), and the groups
    it recovers on taking it. Its ``groups`` are those of the office only: every group on the
    embedded store, one slot's on ZooKeeper (store/slot_store.py)."""

    async def take_office(self, broker_id: int) -> int:
        """Become the coordinator and return the new epoch.

        The epoch is strictly larger than any this store ever returned, across restarts; the
        holder of every earlier epoch is deposed from then on. On a shared store (ZooKeeper)
        this waits, for as long as the caller lets it, until no other broker holds the office.
        """
        ...

    async def coordinator_id(self) -> int | None:
        """The broker that holds the coordinator office now; None while nobody does."""
        ...

    def in_contact_until(self) -> float:
        """The trio-clock instant until which this handle may still act as the coordinator: send
        a consumer a request that renews its ownership lease (docs/design.md#ownership-lease).
        A pure query, asked before every such request; ``-inf`` while it holds no office.

        A shared store can depose its coordinator without the coordinator hearing of it (a pause
        past its ZooKeeper session), and a successor counts the leases it must wait out from
        when it took office: so a coordinator renews none after the instant its office may have
        ended, some margin before its session could have expired on the server since the
        latest request the server answered (docs/design.md#coordinator-epochs-and-the-election).
        The embedded store is local: nobody else can take its office, so it is ``inf`` while in
        office.
        """
        ...

    async def groups(self) -> Mapping[str, GroupRecord]: ...

    async def offset_only_groups(self) -> frozenset[str]:
        """The groups that have committed offsets (of incarnations in force, as
        ``fetch_offsets`` returns them) but no record: those only a standalone committer ever
        used (``commit_offsets`` needs no record). ``groups`` leaves them out, so
        a coordinator taking office learns them here, to list and expire them
        (docs/design.md#group-retention)."""
        ...


class ReplicationStore(Protocol):
    """Replicated partitions' states (statemachine/partition_state.py): who leads each, under
    which leader epoch, and which replicas are in sync in which log directory; and each live
    broker's log directory. A partition's controller (the holder of the coordinator slot of its
    ``slot_key``) writes them under its slot's epoch; its leader writes its in-sync replicas
    with none. Every write is conditional on the state's version, which each write moves on.

    A store keeps states of partitions of replication factor above 1 only; the embedded store
    keeps none (it refuses such topics) and gives each of its partitions the one nobody writes,
    ``sole_replica_state`` of its broker, at version 0. On ZooKeeper a partition of factor 1 has
    no state: it is that one too (its broker leads it at epoch 0)."""

    async def partition_states(self) -> Mapping[PartitionKey, PartitionState]:
        """Every state the store holds, read now."""
        ...

    def partition_state_updates(
        self,
    ) -> AsyncGenerator[Mapping[PartitionKey, PartitionState], None]:
        """A watch over ``partition_states()``: yields them all at once, then, whenever some
        changed, the states whose version moved on (or that are new) since the reader last
        heard of them. Changes that piled up while the reader was away come together, each
        state at its latest; states of a deleted topic are not retracted (they name an id the
        topics no longer do). A generator, so that a reader can close it promptly."""
        ...

    async def read_partition_states(
        self, keys: Iterable[PartitionKey]
    ) -> Mapping[PartitionKey, PartitionState]:
        """The states of ``keys``, read now (what a writer that lost a race reads before it
        decides again); a key without a state is left out."""
        ...

    async def write_partition_states(
        self, epoch: int | None, writes: Sequence[StateWrite]
    ) -> tuple[PartitionKey, ...]:
        """Write each state whose version is still its ``expected_version`` (-1: it has none
        yet), its version becoming one more (0 for a new one); return the keys of those that
        lost the race, changing nothing of theirs: their writer reads them again
        (``read_partition_states``) and decides again, never writing blind.

        ``epoch``: a controller's, of its slot's office, which must admit every key
        (``Deposed``, nothing written, otherwise); None: a leader's change of its in-sync
        replicas, checked by version alone. A store may need more than one transaction for many
        writes: if this raises part-way, each state is its old one or its new one."""
        ...

    async def broker_dirs(self) -> Mapping[int, uuid.UUID]:
        """The log directory each live broker registered with (``register_broker``); a broker
        that named none is left out."""
        ...


class ClusterStore(TopicStore, SecurityStore, GroupStore, ReplicationStore, Protocol):
    """What every broker of a cluster shares, its offices apart: the ZooKeeper store itself,
    whose offices are its slots' (store/slot_store.py)."""


class MetadataStore(ClusterStore, OfficeStore, Protocol):
    """Everything the brokers and the coordinator keep outside their own memory.

    Methods are async because the ZooKeeper store waits on the network; a bounded wait ends in
    ``StoreUnavailable``. Deadlines beyond that bound are the caller's cancel scopes.

    Writes that only a coordinator may make carry its epoch and raise ``Deposed``, changing
    nothing, unless it is the current one. Broker registrations are ephemeral: they last as long as
    the store handle that made them (a ZooKeeper session), and a reopened store starts without any.
    Topics, groups, offsets and the epoch counter are persistent.
    """
