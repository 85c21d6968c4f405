"""The inputs of the consumer client's machine (:mod:`statemachine.consumer`) and the effects it
returns, for its trio layer (``consumer/``) to perform in order."""

from __future__ import annotations

from typing import TypeAlias

import attrs

from protocol.errors import ErrorCode
from protocol.messages import (
    AssignedStream,
    PingRequest,
    StartFetcherRequest,
    StopFetcherRequest,
    TopicIdentity,
)
from protocol.types import BrokerInfo, TopicPartition

# --- inputs -------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Start:
    pass


@attrs.frozen(kw_only=True)
class CoordinatorFound:
    """A broker named the coordinator (ClusterMetadata), with the epoch of its election, or
    UNKNOWN_EPOCH when the broker was not the coordinator itself."""

    now: float
    coordinator: BrokerInfo
    epoch: int


@attrs.frozen(kw_only=True)
class DiscoveryFailed:
    """A whole round-robin pass over the known brokers found no coordinator."""

    now: float
    error_code: ErrorCode = ErrorCode.COORDINATOR_NOT_AVAILABLE
    """COORDINATOR_LOAD_IN_PROGRESS when a broker said the group's coordinator slot has no live
    holder yet (a failover under way, the guard ``FAILOVER``); BROKER_BUSY when a broker was too
    busy to answer; COORDINATOR_NOT_AVAILABLE otherwise."""
    retry_after: float = 0.0
    """The longest back-off a busy broker of the pass asked for (its ``throttle_time_ms``, in
    seconds; SPEC.md §11.7)."""


@attrs.frozen(kw_only=True)
class Registered:
    """RegisterConsumer was accepted: this is the first word heard from the coordinator."""

    now: float
    anchor: float
    """When this consumer queued its RegisterConsumer frame: the coordinator received it before
    it answered, so the lease runs from here (docs/design.md#ownership-lease)."""
    generation: int
    epoch: int


@attrs.frozen(kw_only=True)
class RegistrationRejected:
    """RegisterConsumer was answered with an error; every code is retried (seed 03: the consumer
    keeps trying until shut down), after ``failover_retry`` for :data:`FAILOVER_CODES` (the guard
    ``FAILOVER``) and otherwise after a backoff; ``last_error`` keeps it for the application."""

    now: float
    error_code: ErrorCode
    retry_after: float = 0.0
    """With BROKER_BUSY: the back-off the broker asked for (its ``throttle_time_ms``, in
    seconds; SPEC.md §11.7)."""


@attrs.frozen(kw_only=True)
class PingReceived:
    """A coordinator request (so are the two below). ``now`` is when it was read; ``anchor`` is
    when this consumer queued the frame the request names in ``acknowledged_frames``, which the
    coordinator had received before it sent the request: the lease runs from there
    (docs/design.md#ownership-lease). None: the request named no frame this consumer still knows
    (-1, 0, or one forgotten), and renews nothing; it is answered all the same."""

    now: float
    anchor: float | None
    correlation_id: int
    epoch: int
    generation: int


@attrs.frozen(kw_only=True)
class StopFetcherReceived:
    now: float
    anchor: float | None
    correlation_id: int
    epoch: int
    generation: int
    partitions: tuple[TopicPartition, ...] | None = None
    """The partitions to stop, the rest going on (a revocation, SPEC.md §11.5); None: all."""
    reason: ErrorCode = ErrorCode.NONE
    """FENCED_INSTANCE_ID: a newer process took this member's instance id (SPEC.md §11.11).
    BROKER_BUSY: the broker let this member's group go (SPEC.md §11.7)."""
    retry_after: float = 0.0
    """With BROKER_BUSY: when to register again (seconds), StopFetcher 3's hint."""


@attrs.frozen(kw_only=True)
class StartFetcherReceived:
    now: float
    anchor: float | None
    correlation_id: int
    epoch: int
    generation: int
    streams: tuple[AssignedStream, ...]
    incremental: bool = False
    """Partitions of ``streams`` already fetched go on without a stop (SPEC.md §11.6)."""
    topic_partitions: int = 0
    """How many partitions the topics of ``streams`` have, as this consumer last learned (0:
    unknown): with its own share, an estimate of its group's size (``group_size``)."""
    topic_ids: tuple[TopicIdentity, ...] = ()
    """The incarnation of each topic of ``streams`` (StartFetcher v3, SPEC.md §11.12); a topic
    it does not name: any (a coordinator of an older level)."""


CoordinatorRequest: TypeAlias = PingRequest | StopFetcherRequest | StartFetcherRequest


def coordinator_input(
    request: CoordinatorRequest,
    *,
    correlation_id: int,
    now: float,
    anchor: float | None,
    topic_partitions: int = 0,
) -> PingReceived | StopFetcherReceived | StartFetcherReceived:
    """The machine's input for a coordinator request read at ``now``: the one translation every
    driver of this machine uses (the library, the load generator, a third party's client), so a
    field the protocol adds reaches them all at once. ``anchor`` and ``topic_partitions`` are as
    on the inputs; only the driver knows them (its channel's frame times, its discovery)."""
    match request:
        case PingRequest():
            return PingReceived(
                now=now,
                anchor=anchor,
                correlation_id=correlation_id,
                epoch=request.coordinator_epoch,
                generation=request.generation,
            )
        case StopFetcherRequest():
            return StopFetcherReceived(
                now=now,
                anchor=anchor,
                correlation_id=correlation_id,
                epoch=request.coordinator_epoch,
                generation=request.generation,
                partitions=request.partitions,
                reason=request.reason,
                retry_after=request.throttle_time_ms / 1000,
            )
        case StartFetcherRequest():
            return StartFetcherReceived(
                now=now,
                anchor=anchor,
                correlation_id=correlation_id,
                epoch=request.coordinator_epoch,
                generation=request.generation,
                streams=request.streams,
                incremental=request.incremental,
                topic_partitions=topic_partitions,
                topic_ids=request.topic_ids,
            )


@attrs.frozen(kw_only=True)
class CoordinatorMoved:
    """A request to the coordinator (OffsetCommit, LeaveGroup) was answered NOT_COORDINATOR or
    COORDINATOR_LOAD_IN_PROGRESS: the group's coordinator is elsewhere or not ready yet."""

    now: float
    error_code: ErrorCode


@attrs.frozen(kw_only=True)
class Fenced:
    """An OffsetCommit was answered FENCED_INSTANCE_ID: a newer process registered under this
    member's instance id (SPEC.md §11.11)."""

    now: float


@attrs.frozen(kw_only=True)
class ConnectionLost:
    """The coordinator connection failed or was closed by the coordinator (which is how the seeds'
    coordinator triggers a rebalance), or a registration answer did not come in time."""

    now: float


@attrs.frozen(kw_only=True)
class LeaseExpired:
    """Nothing was heard from the coordinator for the session timeout."""

    now: float


@attrs.frozen(kw_only=True)
class Close:
    """The application shuts the consumer down."""


Input: TypeAlias = (
    Start
    | CoordinatorFound
    | DiscoveryFailed
    | Registered
    | RegistrationRejected
    | PingReceived
    | StopFetcherReceived
    | StartFetcherReceived
    | CoordinatorMoved
    | Fenced
    | ConnectionLost
    | LeaseExpired
    | Close
)


# --- effects ------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Discover:
    """After ``delay`` seconds, give or take up to ``jitter`` chosen at random (so a group's
    consumers do not look all at once), ask the known brokers round-robin for the coordinator;
    report one CoordinatorFound, or DiscoveryFailed after a full pass."""

    delay: float
    jitter: float = 0.0


@attrs.frozen(kw_only=True)
class Register:
    """Connect to ``coordinator`` and send RegisterConsumer with this generation and the partitions
    still being fetched, so that a newly elected coordinator can adopt them."""

    coordinator: BrokerInfo
    generation: int
    owned: tuple[TopicPartition, ...]
    instance_id: str | None = None
    """The static member this process is (SPEC.md §11.11); None: a dynamic member."""


@attrs.frozen(kw_only=True)
class StopFetchers:
    """Stop the fetchers of ``partitions`` (None: every one) and clear their queues; nothing may
    be fetched for them once this has been done. The others fetch on."""

    partitions: tuple[TopicPartition, ...] | None = None


@attrs.frozen(kw_only=True)
class StartFetchers:
    """Fetch exactly the partitions of ``streams``: those in ``kept`` are being fetched already
    and go on from where they are (an incremental start; possibly into another stream), the
    others start at their offsets."""

    generation: int
    streams: tuple[AssignedStream, ...]
    kept: tuple[TopicPartition, ...] = ()
    topic_ids: tuple[TopicIdentity, ...] = ()
    """The incarnation of each topic to fetch (SPEC.md §11.12): every Fetch names it, so a
    broker never serves another incarnation of the name; a topic not named: any."""


@attrs.frozen(kw_only=True)
class RespondPing:
    """Answer the Ping with the consumed offsets of ``partitions`` (only offsets the application
    has finished with: docs/design.md#offsets)."""

    correlation_id: int
    partitions: tuple[TopicPartition, ...]


@attrs.frozen(kw_only=True)
class RespondStop:
    """Answer the StopFetcher with the *final* consumed offsets of ``partitions``: the fetchers were
    stopped by the effect before this one, so the offsets can no longer move."""

    correlation_id: int
    partitions: tuple[TopicPartition, ...]


@attrs.frozen(kw_only=True)
class RespondStart:
    correlation_id: int


@attrs.frozen(kw_only=True)
class CommitAndLeave:
    """Commit the final offsets of ``partitions`` under ``generation``, then, with ``leave``, send
    LeaveGroup, so the group rebalances without waiting for a failure to be detected. A static
    member does not leave (SPEC.md §11.11): its restart is expected, and its clean close after
    stopping frees its partitions all the same."""

    generation: int
    partitions: tuple[TopicPartition, ...]
    leave: bool = True


@attrs.frozen(kw_only=True)
class CloseConnection:
    """Close the coordinator connection (also a half-open registration). ``reset``: the fetchers
    run on after it, so close with a reset, never an end of stream, which the coordinator takes
    as proof that the member stopped (docs/design.md#ownership-lease)."""

    reset: bool = False


@attrs.frozen(kw_only=True)
class Ignored:
    """A guard dropped the input, which changed nothing (a lease that ran out before it arrived
    is expired first: those effects come before this one)."""

    event: object
    reason: str


Effect: TypeAlias = (
    Discover
    | Register
    | StopFetchers
    | StartFetchers
    | RespondPing
    | RespondStop
    | RespondStart
    | CommitAndLeave
    | CloseConnection
    | Ignored
)
