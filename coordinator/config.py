"""The coordinator's options (docs/design.md#failure-detection, docs/design.md#rebalance,
docs/design.md#offsets), with the defaults a single-broker user gets."""

from __future__ import annotations

import enum
from typing import Any

import attrs

from coordinator.limits import RequestLimits
from statemachine.slots import DEFAULT_SLOTS


def _positive(instance: object, attribute: attrs.Attribute[Any], value: float) -> None:
    if value <= 0:
        raise ValueError(f"{attribute.name} must be positive, not {value}")


class RebalanceProtocol(enum.Enum):
    """How a rebalance moves partitions (docs/design.md#rebalance)."""

    #: Stop only what moves, start only who gains: members whose assignment does not change
    #: get no request and never stop fetching.
    INCREMENTAL = "incremental"
    #: The seeds' rebalance: stop every member, then start every member.
    EAGER = "eager"


@attrs.frozen(kw_only=True)
class CoordinatorConfig:
    #: A consumer asking for a shorter session timeout is refused (INVALID_SESSION_TIMEOUT): very
    #: short ones turn GC pauses into false deaths and pings into load.
    min_session_timeout_ms: int = attrs.field(default=1000, validator=_positive)
    max_session_timeout_ms: int = attrs.field(default=300_000, validator=_positive)
    #: Deadlines (Ping, StopFetcher, StartFetcher) a member may miss in a row before it is dead.
    max_missed_pings: int = attrs.field(default=1, validator=_positive)
    #: Added to a silent member's lease before its partitions start elsewhere: covers clock-rate
    #: differences and the consumer's own lease check interval.
    lease_margin: float = attrs.field(default=0.5, validator=_positive)
    #: A new group waits this long after its first member so a crowd joining together causes one
    #: rebalance (Kafka's group.initial.rebalance.delay.ms); each further join before that first
    #: rebalance begins restarts the wait, as in Kafka ...
    initial_rebalance_delay: float = attrs.field(default=3.0, validator=attrs.validators.ge(0))
    #: ... but never past this long after the first join (or the initial delay, if that is
    #: longer), so a crowd that never stops joining is not kept waiting forever.
    initial_rebalance_max_delay: float = attrs.field(default=30.0, validator=attrs.validators.ge(0))
    #: A failed rebalance attempt waits this fraction of the group's longest session timeout.
    rebalance_backoff_fraction: float = attrs.field(default=1 / 3, validator=_positive)
    rebalance_protocol: RebalanceProtocol = attrs.field(
        default=RebalanceProtocol.INCREMENTAL, converter=RebalanceProtocol
    )
    #: How often offsets reported in Ping responses are written to the store.
    commit_interval: float = attrs.field(default=1.0, validator=_positive)
    max_frame_size: int = attrs.field(default=4 * 1024 * 1024, validator=_positive)
    #: How long the coordinator retries a store write before it answers a request with an error.
    store_retry_backoff: float = attrs.field(default=0.2, validator=_positive)
    #: Bounds on what one request may ask for (coordinator.limits).
    limits: RequestLimits = attrs.field(factory=RequestLimits)
    #: The coordinator slots the cluster's groups are hashed onto. The first broker on a ZooKeeper
    #: store pins the count there, and a broker configured otherwise refuses to start; the
    #: embedded store's one broker holds every slot (docs/design.md#coordinator-slots).
    coordinator_slots: int = attrs.field(default=DEFAULT_SLOTS, validator=_positive)
    #: Replicas per partition of a topic created without a factor (Kafka's
    #: ``default.replication.factor``); None: 3 on a cluster sharing ZooKeeper, 1 alone on the
    #: embedded store. A default above the live brokers refuses such a topic, as an explicit
    #: factor does: never silently fewer replicas (docs/design.md#replication).
    default_replication_factor: int | None = attrs.field(
        default=None, validator=attrs.validators.optional(_positive)
    )
    #: A group that has had no member for this long is removed with its offsets, so that groups
    #: nobody uses (every ``coordinator consume`` without ``--group`` makes one) do not pile up:
    #: Kafka's ``offsets.retention.minutes``, 7 days (docs/design.md#group-retention).
    group_retention: float = attrs.field(default=7 * 24 * 3600.0, validator=_positive)
    #: How often the coordinator looks for such groups (Kafka's
    #: ``offsets.retention.check.interval.ms``, 10 minutes).
    group_retention_check_interval: float = attrs.field(default=600.0, validator=_positive)
    #: While the broker's loop stays behind by more than this many seconds, whole groups are let
    #: go, the newest first, so that the broker keeps the members it can serve rather than lose
    #: them all (docs/design.md#shedding-load); None: never. ``serve --shed-above-lag`` sets it
    #: with the door's bound.
    shed_groups_above_lag: float | None = attrs.field(default=None)

    def __attrs_post_init__(self) -> None:
        if self.min_session_timeout_ms > self.max_session_timeout_ms:
            raise ValueError("min_session_timeout_ms exceeds max_session_timeout_ms")
