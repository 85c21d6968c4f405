"""The field's shared vocabulary: the small value types that the wire messages, the state machines,
the assignors and the metadata store all speak, so that none of them translates another's."""

from __future__ import annotations

import re

import attrs


@attrs.frozen(kw_only=True, order=True)
class TopicPartition:
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


@attrs.frozen(kw_only=True, order=True)
class PartitionOffset:
    """A committed offset is the *next* offset to read (DESIGN.md, "Offsets")."""

    topic: str
    partition: int
    offset: int

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(topic=self.topic, partition=self.partition)


@attrs.frozen(kw_only=True, order=True)
class BrokerInfo:
    broker_id: int
    host: str
    port: int


@attrs.frozen(kw_only=True, order=True)
class TopicStreams:
    """One entry of the seeds' ``topic_count``: how many streams (threads) want this topic."""

    topic: str
    streams: int


@attrs.frozen(kw_only=True)
class Subscription:
    """What a consumer wants: named topics with their stream counts, and/or a wildcard.

    The wildcard is a regular expression matched in full against topic names (seed 01 §6): a
    whitelist takes the topics it matches, a blacklist takes every topic it does not match.
    """

    topics: tuple[TopicStreams, ...] = ()
    pattern: str | None = None
    pattern_is_blacklist: bool = False
    pattern_streams: int = 1

    def streams_for(self, topic: str) -> int:
        """How many streams this subscription wants on ``topic`` (0: not subscribed)."""
        for entry in self.topics:
            if entry.topic == topic:
                return entry.streams
        if self.pattern is not None:
            matched = re.fullmatch(self.pattern, topic) is not None
            if matched != self.pattern_is_blacklist:
                return self.pattern_streams
        return 0

    @property
    def is_wildcard(self) -> bool:
        return self.pattern is not None


@attrs.frozen(kw_only=True, order=True)
class ConsumerThread:
    """One of a member's streams (the seeds' "consumer thread").

    ``index`` counts from 0 per topic for named topics, and across all matching topics for a
    wildcard. On the wire it is the stream id ``f"{member_id}-{index}"``."""

    member_id: str
    index: int

    @property
    def stream_id(self) -> str:
        return f"{self.member_id}-{self.index}"

    def __str__(self) -> str:
        return self.stream_id
