"""The embedded store's durable state in memory, and the journal entries that change it.

A live write and a replay after a restart go through the same ``StoreState.apply`` on the same JSON
entry, so what a restart rebuilds is, by construction, what the running store held; and every live
write exercises the decoder that a restart will depend on.

Every entry sets values absolutely (a topic's whole placement, a group's whole record, an offset's
new value, the epoch reached) rather than relative to what came before, and carries a sequence
number, so a snapshot that already covers part of the journal can be replayed over safely.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from protocol.types import TopicPartition

from .codec import decode_group, decode_placement, encode_group, encode_placement
from .interface import GroupRecord, OffsetBatch, TopicPlacement

__all__ = [
    "SNAPSHOT_FORMAT",
    "StoreState",
    "delete_group_entry",
    "group_entry",
    "office_entry",
    "offsets_entry",
    "topic_entry",
]

SNAPSHOT_FORMAT = 1

JsonObject = dict[str, Any]

# group -> topic -> partition -> (offset, generation). Nested plain dicts rather than TopicPartition
# keys: a commit, the hot path, then builds no objects, and the snapshot encodes straight from it.
OffsetTable = dict[str, dict[str, dict[int, tuple[int, int]]]]


def topic_entry(placement: TopicPlacement) -> JsonObject:
    return {"op": "topic", "topic": placement.topic, "placement": encode_placement(placement)}


def office_entry(epoch: int, broker_id: int) -> JsonObject:
    # The broker id is journaled for whoever reads the file after an incident; replay ignores it.
    return {"op": "office", "epoch": epoch, "broker_id": broker_id}


def group_entry(group: GroupRecord) -> JsonObject:
    return {"op": "group", "group": encode_group(group)}


def delete_group_entry(group_id: str) -> JsonObject:
    return {"op": "delete_group", "group_id": group_id}


def offsets_entry(batches: Sequence[OffsetBatch]) -> JsonObject:
    """Offsets as [group, generation, {topic: [[partition, offset], ...]}] per batch: a batch's
    generation is written once, not once per offset, and no key names repeat per offset."""
    encoded: list[list[Any]] = []
    for batch in batches:
        by_topic: dict[str, list[list[int]]] = {}
        for tp, offset in batch.offsets.items():
            by_topic.setdefault(tp.topic, []).append([tp.partition, offset])
        encoded.append([batch.group_id, batch.generation, by_topic])
    return {"op": "offsets", "batches": encoded}


@attrs.define
class StoreState:
    seq: int = 0
    """The sequence number of the last journal entry applied (or covered by the snapshot)."""
    last_epoch: int = 0
    topics: dict[str, TopicPlacement] = attrs.Factory(dict)
    groups: dict[str, GroupRecord] = attrs.Factory(dict)
    offsets: OffsetTable = attrs.Factory(dict)

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
            self.topics[topic] = decode_placement(topic, entry["placement"])
        elif op == "group":
            group = decode_group(entry["group"])
            self.groups[group.group_id] = group
        elif op == "delete_group":
            group_id = str(entry["group_id"])
            self.groups.pop(group_id, None)
            self.offsets.pop(group_id, None)
        elif op == "office":
            self.last_epoch = int(entry["epoch"])
        else:
            raise ValueError(f"unknown journal entry {op!r}")
        self.seq = seq

    def _apply_offsets(self, batches: Sequence[Sequence[Any]]) -> None:
        for group_id, generation, by_topic in batches:
            group_offsets = self.offsets.setdefault(group_id, {})
            for topic, rows in by_topic.items():
                partitions = group_offsets.setdefault(topic, {})
                for partition, offset in rows:
                    partitions[partition] = (offset, generation)

    def fetch_offsets(self, group_id: str) -> dict[TopicPartition, int]:
        return {
            TopicPartition(topic=topic, partition=partition): offset
            for topic, partitions in self.offsets.get(group_id, {}).items()
            for partition, (offset, _generation) in partitions.items()
        }

    def has_group(self, group_id: str) -> bool:
        return group_id in self.groups or group_id in self.offsets

    def to_snapshot(self) -> JsonObject:
        return {
            "format": SNAPSHOT_FORMAT,
            "seq": self.seq,
            "last_epoch": self.last_epoch,
            "topics": {topic: encode_placement(p) for topic, p in self.topics.items()},
            "groups": {group_id: encode_group(g) for group_id, g in self.groups.items()},
            # group -> topic -> [[partition, offset, generation], ...]
            "offsets": {
                group_id: {
                    topic: [[p, offset, gen] for p, (offset, gen) in partitions.items()]
                    for topic, partitions in by_topic.items()
                }
                for group_id, by_topic in self.offsets.items()
            },
        }

    @classmethod
    def from_snapshot(cls, value: Mapping[str, Any]) -> StoreState:
        if value.get("format") != SNAPSHOT_FORMAT:
            raise ValueError(f"unsupported snapshot format {value.get('format')!r}")
        return cls(
            seq=int(value["seq"]),
            last_epoch=int(value["last_epoch"]),
            topics={t: decode_placement(t, p) for t, p in value["topics"].items()},
            groups={g: decode_group(r) for g, r in value["groups"].items()},
            offsets={
                group_id: {
                    topic: {int(p): (int(offset), int(gen)) for p, offset, gen in rows}
                    for topic, rows in by_topic.items()
                }
                for group_id, by_topic in value["offsets"].items()
            },
        )
