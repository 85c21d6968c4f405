"""The embedded store's durable state in memory, and the journal entries that change it.

A live write and a replay after a restart go through the same ``StoreState.apply`` on the same JSON
entry, so what a restart rebuilds is, by construction, what the running store held; and every live
write exercises the decoder that a restart will depend on.

Entries set values absolutely (a topic's whole placement, an offset's new value, the epoch reached),
except a group's record once the store has one: a rebalance moves few partitions, so the entry
holds only what changed since the previous record ("group_update"), not the whole assignment, which
over 10,000 partitions was most of a rebalance's cost on the coordinator. Every entry carries a
sequence number and is applied only right after the entry before it, so a snapshot that already
covers part of the journal can be replayed over safely, and an update also names the generation it
was computed against, which replay checks.
"""

from __future__ import annotations

import types
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import attrs

from protocol.sasl import ScramCredential
from protocol.types import NO_TOPIC_ID, ConsumerThread, TopicId, TopicPartition
from statemachine.acl import Acl

from .codec import (
    decode_acl,
    decode_credential,
    decode_group,
    decode_member,
    decode_owners,
    decode_placement,
    decode_topic_ids,
    encode_acl,
    encode_credential,
    encode_group,
    encode_member,
    encode_owners,
    encode_placement,
    encode_topic_ids,
)
from .interface import GroupRecord, OffsetBatch, TopicPlacement, offset_is_current

__all__ = [
    "SNAPSHOT_FORMAT",
    "StoreState",
    "acls_entry",
    "delete_group_entry",
    "delete_offsets_entry",
    "delete_topic_entry",
    "group_entry",
    "office_entry",
    "offsets_entry",
    "topic_entry",
    "user_entry",
]

#: 1: topics without ids. 2: each topic's id, and the id each group's offsets of a topic were
#: written for (docs/design.md#topic-ids); a store of format 1 gives its topics ids when it
#: opens, and counts its offsets as their current incarnations'; a broker reading only format 1
#: refuses format 2.
SNAPSHOT_FORMAT = 2

JsonObject = dict[str, Any]

# group -> topic -> partition -> (offset, generation). Nested plain dicts rather than TopicPartition
# keys: a commit, the hot path, then builds no objects, and the snapshot encodes straight from it.
OffsetTable = dict[str, dict[str, dict[int, tuple[int, int]]]]


def topic_entry(placement: TopicPlacement) -> JsonObject:
    return {
        "op": "topic",
        "topic": placement.topic,
        "placement": encode_placement(placement),
        "topic_id": str(placement.topic_id),
        **_encode_configs(placement),
    }


def _encode_configs(placement: TopicPlacement) -> JsonObject:
    """A topic's settings as an entry or snapshot holds them: absent when it has none, so a
    file written before topics had settings reads as they all being the broker's, and a broker
    of that time reads this one's files (serving every topic with its own settings)."""
    return {"configs": dict(placement.configs)} if placement.configs else {}


def _decode_configs(value: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((str(k), str(v)) for k, v in value.get("configs", {}).items()))


def _topic_id(value: object) -> TopicId:
    """An entry or snapshot of format 1 names no id: NO_TOPIC_ID, given one when the store opens."""
    return NO_TOPIC_ID if value is None else uuid.UUID(str(value))


def acls_entry(added: Sequence[Acl], removed: Sequence[Acl]) -> JsonObject:
    return {
        "op": "acls",
        "add": [encode_acl(a) for a in added],
        "remove": [encode_acl(a) for a in removed],
    }


def user_entry(user: str, mechanism: str, credential: ScramCredential | None) -> JsonObject:
    """Set (or, with None, remove) one of a user's SCRAM credentials."""
    encoded = None if credential is None else encode_credential(credential)
    return {"op": "user", "user": user, "mechanism": mechanism, "credential": encoded}


def office_entry(epoch: int, broker_id: int) -> JsonObject:
    # The broker id is journaled for whoever reads the file after an incident; replay ignores it.
    return {"op": "office", "epoch": epoch, "broker_id": broker_id}


def group_entry(group: GroupRecord, previous: GroupRecord | None = None) -> JsonObject:
    """The whole record, or, given the record the store holds, only what changed since it: the
    members that left (by id) and joined (kept members keep their order, joiners follow), and the
    partitions whose owner changed or that left the assignment."""
    if previous is None:
        return {"op": "group", "group": encode_group(group)}
    old_members = {member.member_id: member for member in previous.members}
    kept = set()
    #: Kept members whose own generation alone changed: an incremental rebalance starts some
    #: members and leaves the others as they are, so this is the common change.
    generations: dict[str, int] = {}
    for member in group.members:
        old = old_members.get(member.member_id)
        if old is member or old == member:
            kept.add(member.member_id)
        elif old is not None and attrs.evolve(old, generation=member.generation) == member:
            kept.add(member.member_id)
            generations[member.member_id] = member.generation
    joined = [member for member in group.members if member.member_id not in kept]
    if [m.member_id for m in previous.members if m.member_id in kept] + [
        m.member_id for m in joined
    ] != [m.member_id for m in group.members]:
        # an order a diff cannot say: all anew
        kept, joined, generations = set(), list(group.members), {}
    old_assignment = previous.assignment
    changed: dict[TopicPartition, ConsumerThread] = {}
    still_assigned = 0
    for tp, thread in group.assignment.items():
        old_thread = old_assignment.get(tp)
        if old_thread is None:
            changed[tp] = thread
            continue
        still_assigned += 1
        # Field by field: attrs' generated __ne__ is two Python calls per partition.
        if old_thread is not thread and (
            old_thread.index != thread.index or old_thread.member_id != thread.member_id
        ):
            changed[tp] = thread
    released: dict[str, list[int]] = {}
    if still_assigned < len(old_assignment):
        for tp in old_assignment.keys() - group.assignment.keys():
            released.setdefault(tp.topic, []).append(tp.partition)
    return {
        "op": "group_update",
        "group_id": group.group_id,
        "from": previous.generation,
        "generation": group.generation,
        "left": sorted(old_members.keys() - kept),
        "joined": [encode_member(member) for member in joined],
        "generations": generations,
        "owners": encode_owners(changed),
        "released": {topic: sorted(partitions) for topic, partitions in released.items()},
        "complete": group.complete,
        # Whole: a few topics' ids (docs/design.md#topic-ids); absent, as in older entries,
        # when the record names none.
        **({"topic_ids": encode_topic_ids(group.topic_ids)} if group.topic_ids else {}),
    }


def delete_group_entry(group_id: str) -> JsonObject:
    return {"op": "delete_group", "group_id": group_id}


def delete_topic_entry(topic: str) -> JsonObject:
    """The topic and every group's offsets for it."""
    return {"op": "delete_topic", "topic": topic}


def delete_offsets_entry(group_id: str, topic: str) -> JsonObject:
    return {"op": "delete_offsets", "group_id": group_id, "topic": topic}


def offsets_entry(batches: Sequence[OffsetBatch]) -> JsonObject:
    """Offsets as [group, generation, {topic: [[partition, offset], ...]}, {topic: id}] per
    batch: a batch's generation is written once, not once per offset, and no key names repeat
    per offset. The ids are those the batch names (``writable_offsets`` names every topic's);
    an entry written before topics had ids has none."""
    encoded: list[list[Any]] = []
    for batch in batches:
        by_topic: dict[str, list[list[int]]] = {}
        for tp, offset in batch.offsets.items():
            by_topic.setdefault(tp.topic, []).append([tp.partition, offset])
        ids = {topic: str(topic_id) for topic, topic_id in batch.topic_ids.items()}
        encoded.append([batch.group_id, batch.generation, by_topic, ids])
    return {"op": "offsets", "batches": encoded}


@attrs.define
class StoreState:
    seq: int = 0
    """The sequence number of the last journal entry applied (or covered by the snapshot)."""
    last_epoch: int = 0
    topics: dict[str, TopicPlacement] = attrs.Factory(dict)
    groups: dict[str, GroupRecord] = attrs.Factory(dict)
    offsets: OffsetTable = attrs.Factory(dict)
    #: group -> topic -> the id of the incarnation its offsets were written for; a topic not
    #: named: offsets written before topics had ids, which count as the current incarnation's.
    offset_ids: dict[str, dict[str, TopicId]] = attrs.Factory(dict)
    #: user -> mechanism -> credential
    users: dict[str, dict[str, ScramCredential]] = attrs.Factory(dict)
    acls: set[Acl] = attrs.Factory(set)

    def apply(self, entry: Mapping[str, Any]) -> None:
        """Apply the entry that follows ``seq``; a gap means a lost or reordered entry."""
        seq = int(entry["seq"])
        if seq != self.seq + 1:
            raise ValueError(f"journal entry {seq} does not follow entry {self.seq}")
        op = entry["op"]
        if op == "offsets":
            self._apply_offsets(entry["batches"])
        elif op == "topic":
            topic = str(entry["topic"])
            self.topics[topic] = attrs.evolve(
                decode_placement(topic, entry["placement"], _topic_id(entry.get("topic_id"))),
                configs=_decode_configs(entry),
            )
        elif op == "group":
            group = decode_group(entry["group"])
            self.groups[group.group_id] = group
        elif op == "group_update":
            self._apply_group_update(entry)
        elif op == "delete_group":
            group_id = str(entry["group_id"])
            self.groups.pop(group_id, None)
            self.offsets.pop(group_id, None)
            self.offset_ids.pop(group_id, None)
        elif op == "delete_topic":
            topic = str(entry["topic"])
            del self.topics[topic]
            for group_offsets in self.offsets.values():
                group_offsets.pop(topic, None)
            for group_ids in self.offset_ids.values():
                group_ids.pop(topic, None)
        elif op == "delete_offsets":
            group_id, topic = str(entry["group_id"]), str(entry["topic"])
            self.offsets.get(group_id, {}).pop(topic, None)
            self.offset_ids.get(group_id, {}).pop(topic, None)
        elif op == "office":
            self.last_epoch = int(entry["epoch"])
        elif op == "acls":
            self.acls -= {decode_acl(a) for a in entry["remove"]}
            self.acls |= {decode_acl(a) for a in entry["add"]}
        elif op == "user":
            self._apply_user(str(entry["user"]), str(entry["mechanism"]), entry["credential"])
        else:
            raise ValueError(f"unknown journal entry {op!r}")
        self.seq = seq

    def _apply_group_update(self, entry: Mapping[str, Any]) -> None:
        group_id = str(entry["group_id"])
        previous = self.groups[group_id]
        if previous.generation != int(entry["from"]):
            raise ValueError(
                f"an update of group {group_id!r} from generation {entry['from']} "
                f"meets generation {previous.generation}"
            )
        left = set(entry["left"])
        generations = entry.get("generations", {})
        members = [
            member
            if member.member_id not in generations
            else attrs.evolve(member, generation=int(generations[member.member_id]))
            for member in previous.members
            if member.member_id not in left
        ]
        members.extend(decode_member(member) for member in entry["joined"])
        # The record's mapping proxy copies its dict as a dict: no rehashing of every partition.
        assignment = _copy(previous.assignment)
        for topic, partitions in entry["released"].items():
            for partition in partitions:
                del assignment[TopicPartition(topic=str(topic), partition=int(partition))]
        assignment.update(decode_owners(entry["owners"]))
        self.groups[group_id] = GroupRecord(
            group_id=group_id,
            generation=int(entry["generation"]),
            members=tuple(members),
            assignment=assignment,
            complete=bool(entry.get("complete", False)),
            topic_ids=decode_topic_ids(entry.get("topic_ids", {})),
        )

    def _apply_user(self, user: str, mechanism: str, credential: Mapping[str, Any] | None) -> None:
        credentials = self.users.setdefault(user, {})
        if credential is None:
            credentials.pop(mechanism, None)
        else:
            credentials[mechanism] = decode_credential(mechanism, credential)
        if not credentials:
            del self.users[user]

    def _apply_offsets(self, batches: Sequence[Sequence[Any]]) -> None:
        for group_id, generation, by_topic, *named in batches:
            group_offsets = self.offsets.setdefault(group_id, {})
            ids = named[0] if named else {}
            group_ids = self.offset_ids.setdefault(group_id, {}) if ids else {}
            for topic, rows in by_topic.items():
                partitions = group_offsets.setdefault(topic, {})
                if topic in ids:
                    topic_id = uuid.UUID(ids[topic])
                    if group_ids.setdefault(topic, topic_id) != topic_id:
                        # Another incarnation's offsets, which nothing reads any more.
                        partitions.clear()
                        group_ids[topic] = topic_id
                for partition, offset in rows:
                    partitions[partition] = (offset, generation)

    def current_id(self, topic: str) -> TopicId:
        """The id of the topic's incarnation in force; NO_TOPIC_ID while no topic has the name."""
        placement = self.topics.get(topic)
        return NO_TOPIC_ID if placement is None else placement.topic_id

    def _current_offsets(self, group_id: str) -> Iterator[tuple[str, dict[int, tuple[int, int]]]]:
        """The group's offsets, by topic, of the incarnations in force (``offset_is_current``)."""
        ids = self.offset_ids.get(group_id, {})
        for topic, partitions in self.offsets.get(group_id, {}).items():
            if offset_is_current(ids.get(topic), self.current_id(topic)):
                yield topic, partitions

    def fetch_offsets(self, group_id: str) -> dict[TopicPartition, int]:
        return {
            TopicPartition(topic=topic, partition=partition): offset
            for topic, partitions in self._current_offsets(group_id)
            for partition, (offset, _generation) in partitions.items()
        }

    def offset_only_groups(self) -> frozenset[str]:
        return frozenset(
            group_id
            for group_id in self.offsets
            if group_id not in self.groups
            and any(partitions for _topic, partitions in self._current_offsets(group_id))
        )

    def has_group(self, group_id: str) -> bool:
        return group_id in self.groups or group_id in self.offsets

    def to_snapshot(self) -> JsonObject:
        return {
            "format": SNAPSHOT_FORMAT,
            "seq": self.seq,
            "last_epoch": self.last_epoch,
            "topics": {
                topic: {
                    "placement": encode_placement(p),
                    "topic_id": str(p.topic_id),
                    **_encode_configs(p),
                }
                for topic, p in self.topics.items()
            },
            "groups": {group_id: encode_group(g) for group_id, g in self.groups.items()},
            # group -> topic -> [[partition, offset, generation], ...]
            "offsets": {
                group_id: {
                    topic: [[p, offset, gen] for p, (offset, gen) in partitions.items()]
                    for topic, partitions in by_topic.items()
                }
                for group_id, by_topic in self.offsets.items()
            },
            # group -> topic -> id; a topic not named: offsets from before topics had ids
            "offset_topic_ids": {
                group_id: {topic: str(topic_id) for topic, topic_id in by_topic.items()}
                for group_id, by_topic in self.offset_ids.items()
                if by_topic
            },
            "users": {
                user: {m: encode_credential(c) for m, c in credentials.items()}
                for user, credentials in self.users.items()
            },
            "acls": [encode_acl(a) for a in sorted(self.acls)],
        }

    @classmethod
    def from_snapshot(cls, value: Mapping[str, Any]) -> StoreState:
        found = value.get("format")
        if found not in (1, SNAPSHOT_FORMAT):
            raise ValueError(
                f"snapshot format {found!r}, this broker reads formats 1 to {SNAPSHOT_FORMAT}"
            )
        if found == 1:  # topics without ids
            topics = {t: decode_placement(t, p) for t, p in value["topics"].items()}
        else:
            topics = {
                t: attrs.evolve(
                    decode_placement(t, p["placement"], _topic_id(p["topic_id"])),
                    configs=_decode_configs(p),
                )
                for t, p in value["topics"].items()
            }
        return cls(
            seq=int(value["seq"]),
            last_epoch=int(value["last_epoch"]),
            topics=topics,
            groups={g: decode_group(r) for g, r in value["groups"].items()},
            offsets={
                group_id: {
                    topic: {int(p): (int(offset), int(gen)) for p, offset, gen in rows}
                    for topic, rows in by_topic.items()
                }
                for group_id, by_topic in value["offsets"].items()
            },
            offset_ids={
                group_id: {topic: uuid.UUID(str(topic_id)) for topic, topic_id in by_topic.items()}
                for group_id, by_topic in value.get("offset_topic_ids", {}).items()
            },
            users={
                user: {m: decode_credential(m, c) for m, c in credentials.items()}
                for user, credentials in value.get("users", {}).items()
            },
            acls={decode_acl(a) for a in value.get("acls", [])},
        )


def _copy(mapping: Mapping[TopicPartition, ConsumerThread]) -> dict[TopicPartition, ConsumerThread]:
    if isinstance(mapping, types.MappingProxyType | dict):
        return mapping.copy()
    return dict(mapping)
