"""The wire of replication (SPEC.md §8, 1000 and 3): REPLICA_FETCH, the one request a follower
sends its leader each round for every partition it follows there, and the replica sets
ClusterMetadata names from version 5 on.

The same conventions as :mod:`protocol.messages` (field order is byte order; offsets and epochs
are int64); kept apart only so that neither module outgrows the size a reader takes in at once.
"""

from __future__ import annotations

import uuid
from typing import ClassVar

import attrs

from .api_keys import ApiKey
from .codec import Int32, Int64
from .errors import ErrorCode
from .types import TopicId

#: The longest a REPLICA_FETCH may ask its leader to hold it for data (its ``max_wait_ms``): a
#: follower's round is also how it learns a leader moved, so the wait stays short.
MAX_REPLICA_WAIT_MS = 500


# --- 3 CLUSTER_METADATA, version 5 --------------------------------------------------------------


@attrs.frozen(kw_only=True)
class PartitionReplicas:
    """Who holds one partition: its leader's epoch, its replicas (the leader among them, in
    placement order) and those of them in sync (the ISR)."""

    partition: Int32
    leader_epoch: Int64
    replicas: tuple[Int32, ...]
    isr: tuple[Int32, ...]


@attrs.frozen(kw_only=True)
class TopicReplicas:
    topic: str
    partitions: tuple[PartitionReplicas, ...]


# --- 1000 REPLICA_FETCH (follower -> leader) ----------------------------------------------------


@attrs.frozen(kw_only=True)
class ReplicaFetchPartition:
    """One partition the follower wants from ``fetch_offset`` on, under the leader epoch it
    believes in force; ``last_fetched_epoch``: the epoch of the last record it holds (-1: none),
    which the leader checks its log against (KIP-320's diverging epoch)."""

    topic_id: TopicId
    partition: Int32
    leader_epoch: Int64
    fetch_offset: Int64
    last_fetched_epoch: Int64


@attrs.frozen(kw_only=True)
class EpochStart:
    """A leader's epoch-cache entry (KIP-101): the first offset written under ``epoch``."""

    epoch: Int64
    start_offset: Int64


@attrs.frozen(kw_only=True)
class ReplicaFetchData:
    """One partition's answer: whole batches from ``fetch_offset`` on, or, where the follower's
    log diverges from the leader's, no data and where to truncate to (``diverging_epoch`` and
    ``diverging_end_offset``, -1 and -1 when it does not)."""

    topic_id: TopicId
    partition: Int32
    error_code: ErrorCode
    high_watermark: Int64
    log_start_offset: Int64
    diverging_epoch: Int64
    diverging_end_offset: Int64
    epoch_starts: tuple[EpochStart, ...]
    """The leader's epoch-cache entries that meet the range answered: the batches carry no
    epoch (SPEC.md §6.2), so a follower builds its cache from these."""
    batches: bytes


@attrs.frozen(kw_only=True)
class ReplicaFetchRequest:
    API_KEY: ClassVar[ApiKey] = ApiKey.REPLICA_FETCH
    replica_id: Int32
    """The follower's broker id."""
    log_dir: uuid.UUID
    """The identity of the follower's log directory: a wiped disk is a new one, which must
    catch up before it can be elected (KIP-966)."""
    max_wait_ms: Int32
    """How long the leader may hold the request while it has nothing new (0 to
    :data:`MAX_REPLICA_WAIT_MS`)."""
    max_bytes: Int32
    partitions: tuple[ReplicaFetchPartition, ...]


@attrs.frozen(kw_only=True)
class ReplicaFetchResponse:
    API_KEY: ClassVar[ApiKey] = ApiKey.REPLICA_FETCH
    error_code: ErrorCode
    partitions: tuple[ReplicaFetchData, ...]
