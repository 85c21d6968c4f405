"""The field's shared vocabulary: the small value types that the wire messages, the state machines,
the assignors and the metadata store all speak, so that none of them translates another's."""

from __future__ import annotations

import functools
import uuid

import attrs
import re2

#: RE2 compiles in linear time and matches in time linear in the topic name, whatever the
#: pattern: a subscription's wildcard cannot stall a broker with backtracking. Its errors are
#: returned, not written to stderr.
_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False


class InvalidPattern(ValueError):
    """A subscription pattern RE2 refuses (bad syntax, or a Python-only construct such as a
    backreference or a lookaround)."""


@functools.lru_cache(maxsize=256)
def compile_pattern(pattern: str) -> re2._Regexp:
    """The pattern compiled by RE2, cached: a rebalance matches each member's pattern against
    every topic, and members decoded from the wire carry equal but distinct strings. A compiled
    1 KiB pattern can hold about 160 KB, so the cache holds a few groups' worth, not thousands."""
    try:
        return re2.compile(pattern, _RE2_OPTIONS)
    except re2.error as exc:
        raise InvalidPattern(f"{exc}") from None


#: A topic's identity beyond its name (Kafka's KIP-516): given when the topic is created and never
#: again, so that a topic deleted and created again under its name is another topic, whose
#: records and offsets nothing confuses with the old one's (docs/design.md#topic-ids).
TopicId = uuid.UUID

#: The id no topic has: "any incarnation of the name", from a peer that names topics only by name.
NO_TOPIC_ID: TopicId = uuid.UUID(int=0)


@attrs.frozen(kw_only=True, order=True)
class TopicPartition:
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


@attrs.frozen(kw_only=True, order=True)
class PartitionOffset:
    """A committed offset is the *next* offset to read (docs/design.md#offsets)."""

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

    The wildcard is a regular expression matched in full against topic names: a
    whitelist takes the topics it matches, a blacklist takes every topic it does not match. It
    is RE2 syntax (what Python's ``re`` shares with RE2; no backreferences or lookarounds).
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
            try:
                matched = compile_pattern(self.pattern).fullmatch(topic) is not None
            except InvalidPattern:
                # Refused at registration; only a record written before that check could carry
                # one, and it matches nothing rather than failing its group's rebalances.
                return 0
            if matched != self.pattern_is_blacklist:
                return self.pattern_streams
        return 0

    @property
    def is_wildcard(self) -> bool:
        return self.pattern is not None

    @property
    def stream_count(self) -> int:
        """The threads a member with this subscription adds to its group: its threads are shared
        by its topics, so its widest topic (or wildcard) counts."""
        widest = max((entry.streams for entry in self.topics), default=0)
        if self.pattern is not None:
            widest = max(widest, self.pattern_streams)
        return widest


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
