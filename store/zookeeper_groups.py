"""The ZooKeeper store's groups: their records, owner nodes and committed offsets.

A write is a list of operations cut into transactions that check the writer's office
(zookeeper_session), each list ordered so that whatever prefix has committed is a state readers may
see: a group record goes into new chunk nodes, then the registry names them (the commit point: a
write cut short leaves the previous record whole), then the owner nodes follow, and the owners node
names the record once all of them are written (until then, the next write lists them instead of
trusting the record). An offset commit that needs more than one transaction leaves, if cut short,
each partition at its old or its new offset; its call returns only once all are written.

An offset node names the id of the topic's incarnation it was written for
(docs/design.md#topic-ids), and a read returns only those of the incarnation in force
(``offset_is_current``): a delete that raced a commit, or a commit from before a re-create, may
leave nodes of an incarnation that is gone, which no read returns and the next commit of the
partition overwrites.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import types
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import attrs

from protocol.types import NO_TOPIC_ID, ConsumerThread, TopicId, TopicPartition
from statemachine.slots import slot_of

from .codec import decode_group, encode_group
from .interface import (
    GroupRecord,
    OffsetBatch,
    StoreUnavailable,
    offset_is_current,
    writable_offsets,
)
from .kazoo_bridge import NoNodeError
from .zookeeper_layout import CONSUMERS, group_path, json_bytes, record_path, segment, segment_name
from .zookeeper_session import RETRIES, Op
from .zookeeper_topic_ids import TopicIds

__all__ = ["Groups"]

#: A group record is cut into chunk nodes of this many bytes, each well under ZooKeeper's
#: request limit (jute.maxbuffer, 1 MiB by default), which a big group's record can approach.
_CHUNK_BYTES = 200 * 1024
#: The depth of the layout's leaves below /consumers/<group>: owners/<topic>/<partition>.
_GROUP_DEPTH = 3


@attrs.frozen
class Registry:
    """A group's registry node: its generation (for people and tools) and the record it names."""

    generation: int
    record: str
    chunks: int


@attrs.frozen
class GroupNodes:
    """What a write of a group finds in place before it writes."""

    group_id: str
    missing_dirs: tuple[str, ...]
    registry: Registry | None
    registry_version: int | None
    stale_records: tuple[str, ...]
    #: The record the owner nodes were last completely written for (None: no owners node).
    mirror: str | None
    owner_topics: set[str]


@attrs.define(eq=False, repr=False, slots=False)
class Groups(TopicIds):
    """The groups' nodes as one session reads and writes them (``ZooKeeperStore``)."""

    _offset_nodes: set[tuple[str, str, int]] = attrs.Factory(set)
    #: Per group, the record this handle last wrote every owner node for, and their assignment.
    _owners_written: dict[str, tuple[str, Mapping[TopicPartition, ConsumerThread]]] = attrs.Factory(
        dict
    )
    _record_ids: Iterator[int] = attrs.Factory(itertools.count)

    # Reads of a slot's groups, by the coordinator taking its office

    async def slot_groups(self, slot: int, slots: int) -> Mapping[str, GroupRecord]:
        """``OfficeStore.groups`` of one coordinator slot: only their records are read."""
        names = await self._group_names(slot, slots)
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

    async def slot_offset_only_groups(self, slot: int, slots: int) -> frozenset[str]:
        """``OfficeStore.offset_only_groups`` of one coordinator slot."""
        names = await self._group_names(slot, slots)
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
                    (name, segment_name(topic), self._client.get_children_async(f"{base}/{topic}"))
                    for topic in await self._wait(result)
                ]
        nodes = []
        for name, topic, result in directories:
            # An empty directory: made for offsets whose commit did not happen.
            with contextlib.suppress(NoNodeError):
                nodes += [
                    (name, topic, self._client.get_async(group_path(name, "offsets", topic, p)))
                    for p in await self._wait(result)
                ]
        current = await self._current_ids(sorted({topic for _name, topic, _result in nodes}))
        found = set()
        for name, topic, result in nodes:
            with contextlib.suppress(NoNodeError):
                data, _stat = await self._wait(result)
                _offset, stored = self._decode_offset(name, data)
                if offset_is_current(stored, current[topic]):
                    found.add(name)
        return frozenset(found)

    async def _group_names(self, slot: int, slots: int) -> list[str]:
        children = await self._children(CONSUMERS)
        names = [segment_name(child) for child in children if child != "coordinator"]
        return [name for name in names if slot_of(name, slots) == slot]

    async def _read_group(self, group_id: str) -> GroupRecord | None:
        for _ in range(RETRIES):
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

    def _read_chunks(self, group_id: str, registry: Registry) -> list[Any]:
        return [
            self._client.get_async(record_path(group_id, registry.record, index))
            for index in range(registry.chunks)
        ]

    async def _record(self, group_id: str, chunks: list[Any]) -> GroupRecord:
        """A group record from the reads of its chunk nodes (``_read_chunks``), in order;
        NoNodeError if one is gone (the group was written again or deleted meanwhile)."""
        answers = [await self._wait(result) for result in chunks]
        try:
            return decode_group(json.loads(b"".join(data for data, _stat in answers)))
        except (ValueError, KeyError, TypeError) as exc:
            raise StoreUnavailable(f"unreadable record of group {group_id!r}: {exc}") from exc

    def _decode_registry(self, group_id: str, data: bytes) -> Registry:
        try:
            value = json.loads(data)
            return Registry(
                generation=int(value["generation"]),
                record=str(value["record"]),
                chunks=int(value["chunks"]),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise StoreUnavailable(f"unreadable registry of group {group_id!r}: {exc}") from exc

    # Records

    async def write_group(self, epoch: int, group: GroupRecord) -> None:
        """The record goes into new chunk nodes first; then the registry is pointed at them, which
        is the commit point readers trust, so a write cut short (a crash, a lost connection, the
        office lost between two transactions) leaves the previous record whole. The owner nodes
        follow, and the owners node names the record they mirror once every one is written."""
        office = self._check_epoch(epoch, group.group_id)
        group_id = group.group_id
        data = json_bytes(encode_group(group))
        chunks = [data[i : i + _CHUNK_BYTES] for i in range(0, len(data), _CHUNK_BYTES)]
        registry_path = group_path(group_id, "registry")
        for _ in range(RETRIES):
            # A new record each attempt: chunks an attempt left behind are stale, not in the way.
            record_id = f"{office.epoch}-{next(self._record_ids)}"
            registry = json_bytes(
                {"generation": group.generation, "record": record_id, "chunks": len(chunks)}
            )
            nodes = await self._group_nodes(group_id)
            ops = [Op("create", path) for path in nodes.missing_dirs]
            ops += [
                Op("create", record_path(group_id, record_id, index), chunk)
                for index, chunk in enumerate(chunks)
            ]
            if nodes.registry_version is None:
                ops.append(Op("create", registry_path, registry))
            else:
                ops.append(Op("set", registry_path, registry, nodes.registry_version))
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
        for _ in range(RETRIES):
            nodes = await self._group_nodes(group_id, keep=record_id)
            owners = await self._listed_owners(nodes)
            ops = self._mirror_ops(group_id, record_id, nodes, owners, group)
            if await self._commit_in_parts(office, ops) == len(ops):
                self._owners_written[group_id] = (record_id, group.assignment)
                return
        raise StoreUnavailable(f"cannot write the owners of group {group_id!r}: they keep changing")

    async def _group_nodes(self, group_id: str, *, keep: str | None = None) -> GroupNodes:
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
        return GroupNodes(
            group_id=group_id,
            missing_dirs=tuple(missing),
            registry=current,
            registry_version=version,
            stale_records=tuple(stale),
            mirror=None if mirror is None else mirror.decode(errors="replace"),
            owner_topics=topics,
        )

    async def _owners(self, nodes: GroupNodes) -> Mapping[TopicPartition, ConsumerThread | None]:
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
        self, nodes: GroupNodes
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
        nodes: GroupNodes,
        owners: Mapping[TopicPartition, ConsumerThread | None],
        group: GroupRecord,
    ) -> list[Op]:
        """After the registry: drop the records it no longer names, bring the owner nodes from
        ``owners`` to the group's assignment, and last name the record they now mirror."""
        ops = [Op("delete", group_path(group_id, "records", name)) for name in nodes.stale_records]
        for tp in owners.keys() - group.assignment.keys():
            ops.append(Op("delete", group_path(group_id, "owners", tp.topic, tp.partition)))
        topics = set(nodes.owner_topics)
        for tp, thread in group.assignment.items():
            if segment(tp.topic) not in topics:
                ops.append(Op("create", group_path(group_id, "owners", tp.topic)))
                topics.add(segment(tp.topic))
            path = group_path(group_id, "owners", tp.topic, tp.partition)
            if tp not in owners:
                ops.append(Op("create", path, f"{thread.member_id}-{thread.index}".encode()))
            elif owners[tp] != thread:
                ops.append(Op("set", path, f"{thread.member_id}-{thread.index}".encode()))
        ops.append(Op("set", group_path(group_id, "owners"), record_id.encode()))
        return ops

    async def delete_group(self, epoch: int, group_id: str) -> None:
        office = self._check_epoch(epoch, group_id)
        root = group_path(group_id)
        registry = group_path(group_id, "registry")
        records = group_path(group_id, "records")
        for _ in range(RETRIES):
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
            ops = [Op("delete", path) for path in [*first, *last, root]]
            if await self._commit_in_parts(office, ops) == len(ops):
                self._offset_nodes = {n for n in self._offset_nodes if n[0] != group_id}
                self._owners_written.pop(group_id, None)
                return
        raise StoreUnavailable(f"cannot delete group {group_id!r}: it keeps changing")

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

    # Offsets

    async def commit_offsets(self, epoch: int, batches: Sequence[OffsetBatch]) -> None:
        office = self._check_epoch(epoch, *{batch.group_id for batch in batches})
        current = await self._writable_ids(batches)
        latest: dict[tuple[str, str, int], bytes] = {}
        for batch in batches:
            kept = writable_offsets(batch, current)
            ids = {topic: str(topic_id) for topic, topic_id in kept.topic_ids.items()}
            for tp, offset in kept.offsets.items():
                latest[batch.group_id, tp.topic, tp.partition] = json_bytes(
                    {"offset": offset, "generation": batch.generation, "topic_id": ids[tp.topic]}
                )
        if not latest:
            return
        for _ in range(RETRIES):
            await self._learn_offset_nodes(latest.keys() - self._offset_nodes)
            keys = list(latest)
            ops = []
            for key in keys:
                path = group_path(key[0], "offsets", key[1], key[2])
                ops.append(Op("set" if key in self._offset_nodes else "create", path, latest[key]))
            done = await self._commit_in_parts(office, ops)
            self._offset_nodes.update(keys[:done])
            if done == len(keys):
                return
            for key in keys[:done]:
                del latest[key]
            # A node we thought was there was gone, or the other way round: learn again.
            self._offset_nodes.difference_update(latest)
        raise StoreUnavailable("cannot commit offsets: their nodes keep changing")

    async def _writable_ids(self, batches: Sequence[OffsetBatch]) -> dict[str, TopicId]:
        """The id in force of every topic the batches commit offsets of (``writable_offsets``).

        The topic watch's latest read answers where it agrees with the batch: if it is stale,
        the incarnation it names is gone, and offsets written under its id are never read.
        Where it does not (a topic it does not know, or an id it does not hold, as when the
        coordinator saw a re-create first), the topic's nodes are read now."""
        published = self._topic_watch.value or {}
        current = {topic: placement.topic_id for topic, placement in published.items()}
        doubtful = set()
        for batch in batches:
            for topic in {tp.topic for tp in batch.offsets}:
                named = batch.topic_ids.get(topic, NO_TOPIC_ID)
                if topic not in current or named not in (NO_TOPIC_ID, current[topic]):
                    doubtful.add(topic)
        if doubtful:
            current.update(await self._current_ids(sorted(doubtful)))
        return current

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
        for _ in range(RETRIES):
            ops = await self._topic_offset_ops([segment(group_id)], topic)
            if await self._commit_in_parts(office, ops) == len(ops):
                self._offset_nodes = {n for n in self._offset_nodes if n[:2] != (group_id, topic)}
                return
        raise StoreUnavailable(f"cannot delete the offsets of {group_id!r} for {topic!r}")

    async def _topic_offset_ops(self, group_segments: Sequence[str], topic: str) -> list[Op]:
        """Deletes of the offset nodes of ``topic`` under each group (znode names), each
        group's directory of them after its nodes."""
        dirs = [f"{CONSUMERS}/{group}/offsets/{segment(topic)}" for group in group_segments]
        listings = [(d, self._client.get_children_async(d)) for d in dirs]
        ops: list[Op] = []
        for directory, result in listings:
            try:
                partitions = await self._wait(result)
            except NoNodeError:
                continue  # the election node, or a group with no offsets for the topic
            ops.extend(Op("delete", f"{directory}/{p}") for p in partitions)
            ops.append(Op("delete", directory))
        return ops

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
        current = await self._current_ids(sorted({tp.topic for tp, _result in pending}))
        offsets = {}
        for tp, result in pending:
            try:
                data, _stat = await self._wait(result)
            except NoNodeError:
                continue
            offset, stored = self._decode_offset(group_id, data)
            if offset_is_current(stored, current[tp.topic]):
                offsets[tp] = offset
        return types.MappingProxyType(offsets)

    def _decode_offset(self, group_id: str, data: bytes) -> tuple[int, TopicId | None]:
        """An offset node's offset and the id it was written under (None: before topics had
        ids)."""
        try:
            value = json.loads(data)
            stored = value.get("topic_id")
            return int(value["offset"]), None if stored is None else uuid.UUID(str(stored))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise StoreUnavailable(f"unreadable offset of group {group_id!r}: {exc}") from exc
