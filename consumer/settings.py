"""What an application configures a consumer with, and what it may catch from one."""

from __future__ import annotations

import warnings
from collections.abc import Awaitable, Callable, Iterable, Sequence

import attrs

from protocol import ErrorCode
from protocol.types import TopicPartition

from .streams import Deserializer

RebalanceCallback = Callable[[frozenset[TopicPartition]], Awaitable[None]]
"""Called with the partitions revoked (their fetchers already stopped, before the coordinator is
told, so a commit from it still counts for them) or added (their fetchers started); partitions a
rebalance leaves where they are appear in neither. Awaited by the driver: the coordinator expects
the answer within 2/3 of the session timeout, so keep it short."""

OFFSET_RESETS = ("earliest", "latest")
#: The names the seeds used, still accepted (with a DeprecationWarning), and what RegisterConsumer
#: carries on the wire (SPEC.md: ``smallest`` / ``largest``).
_OLD_OFFSET_RESETS = {"smallest": "earliest", "largest": "latest"}
_WIRE_OFFSET_RESETS = {"earliest": "smallest", "latest": "largest"}


def _offset_reset(value: str) -> str:
    if value in _OLD_OFFSET_RESETS:
        new = _OLD_OFFSET_RESETS[value]
        warnings.warn(
            f"auto_offset_reset={value!r} is deprecated: say {new!r}",
            DeprecationWarning,
            stacklevel=3,
        )
        return new
    if value not in OFFSET_RESETS:
        raise ValueError(f"auto_offset_reset must be 'earliest' or 'latest', not {value!r}")
    return value


class RebalanceListener:
    """aiokafka's ConsumerRebalanceListener, for ``open_consumer(listener=...)``: override
    either method. Same contract as ``on_revoked`` / ``on_assigned`` (:data:`RebalanceCallback`):
    revoked partitions are stopped and can still be committed; only what moves is named."""

    async def on_partitions_revoked(self, revoked: frozenset[TopicPartition]) -> None:
        """Called with the partitions taken away, before the coordinator is told."""

    async def on_partitions_assigned(self, assigned: frozenset[TopicPartition]) -> None:
        """Called with the partitions added, their fetchers started."""


@attrs.frozen(kw_only=True)
class ConsumerSettings:
    session_timeout: float = attrs.field(default=45.0, validator=attrs.validators.gt(0))
    """T, in seconds: the coordinator declares us dead after missed pings, and we stop fetching
    T after we queued the frame its latest request names as received (the ownership lease,
    docs/design.md#ownership-lease). Kafka's default; with the brokers' default ZooKeeper session
    a coordinator failover fits in the T/3 of lease a consumer is sure to have left
    (docs/design.md#defaults-that-fit-a-failover). A larger T detects a frozen member later."""
    auto_commit: bool = True
    """Report consumed offsets in Ping and StopFetcher responses, and commit on close."""
    auto_offset_reset: str = attrs.field(default="latest", converter=_offset_reset)
    """Where to start a partition with no committed offset, or whose offset is out of range:
    ``earliest`` (the log start) or ``latest`` (the end: only records produced from now on), the
    default, as in Kafka, aiokafka and ``coordinator consume``.
    The seeds' ``smallest`` / ``largest`` are accepted with a DeprecationWarning."""
    client_id: str = "consumer"
    retry_backoff: float = 0.1
    max_retry_backoff: float = 5.0
    failover_retry: float = 0.05
    """Delay before looking for the coordinator again after NOT_COORDINATOR or
    COORDINATOR_LOAD_IN_PROGRESS: a failover is under way and the new coordinator is about to
    answer (docs/design.md#loading). The backoff applies after 250 of them in a row (12.5 s,
    beyond the brokers' default ZooKeeper session and a tick). While the consumer fetches under
    its lease it looks at least this often whatever it is answered, with jitter, and less often
    the larger its group (docs/design.md#finding-the-coordinator-again)."""
    failover_jitter: float = 0.5
    """While fetching under its lease, each look for the coordinator comes at the failover pace
    moved at random by up to this share of it either way, so a group's consumers do not look all
    at once (0: exactly at the pace)."""
    busy_jitter: float = 0.5
    """Told BROKER_BUSY (a broker whose loop is behind sheds new clients, SPEC.md §11.7), the
    consumer waits the broker's hint (or its backoff, if longer) lengthened at random by up to
    this share of it, so the clients refused together do not come back together (0: exactly
    the hint)."""
    request_timeout: float = 5.0
    """Bound on each discovery, registration, commit and LeaveGroup round trip."""
    fetch_max_bytes: int = 1024 * 1024
    fetch_idle_interval: float = 0.1
    max_buffered_records: int = 1000
    """Per stream: fetchers wait while this many records wait for the application."""
    max_frame_size: int = 4 * 1024 * 1024
    discovery_timeout: float | None = 60.0
    """How long a new consumer looks for its coordinator before giving up: its streams then
    raise :class:`CoordinatorUnavailable` (a wrong bootstrap address or a cluster that is down;
    not a broker that answers BROKER_BUSY, which is there and asks to be asked again later).
    None: look forever. Once registered, a consumer looks for a lost coordinator forever."""
    key_deserializer: Deserializer | None = None
    """Turns each record's key (not None) into what ``async for`` and ``getmany`` hand over, as
    kafka-python's ``key_deserializer`` does: ``bytes.decode``; None: the bytes. The batch API
    always hands over bytes."""
    value_deserializer: Deserializer | None = None
    """As ``key_deserializer``, for values: ``json.loads``."""
    instance_id: str | None = None
    """Static membership (SPEC.md §11.11): the name of this member, which outlives its processes.
    A process that starts again under it within ``session_timeout`` gets its partitions back with
    nobody else disturbed; closing sends no LeaveGroup. A newer process under the same instance id
    fences this one (:class:`InstanceFenced`). The consumer id stays fresh per process."""

    def __attrs_post_init__(self) -> None:
        if self.discovery_timeout is not None and self.discovery_timeout <= 0:
            raise ValueError("discovery_timeout must be positive (or None: look forever)")


class CoordinatorUnavailable(Exception):
    """No broker of the bootstrap list named the group's coordinator within
    ``discovery_timeout``; the message says what the latest attempt ran into."""


class CommitFailed(Exception):
    def __init__(self, error_code: ErrorCode, message: str = "") -> None:
        self.error_code = error_code
        super().__init__(message or error_code.name)


class PartitionNotAssigned(CommitFailed, ValueError):
    """A commit named partitions this consumer does not own, and the coordinator refused it
    (ILLEGAL_GENERATION, its word for "not yours under this generation"). A ValueError, as
    aiokafka's consumer refuses such a commit, and a CommitFailed, as a commit that lost a
    rebalance race is one. ``partitions``: those not owned."""

    def __init__(self, partitions: Sequence[TopicPartition], owned: Iterable[TopicPartition]):
        self.partitions = tuple(partitions)
        names = ", ".join(map(str, self.partitions))
        mine = ", ".join(map(str, sorted(owned))) or "none"
        super().__init__(
            ErrorCode.ILLEGAL_GENERATION,
            f"{names} not assigned to this consumer (it owns {mine}): commit offsets only of "
            "partitions in consumer.assignment (group offsets of other partitions: "
            "admin.reset_offsets of an empty group, or `coordinator groups reset-offsets`)",
        )
