"""What a coordinator's groups share while it holds office: its epoch, its store, the offsets, its
view of the cluster, and the nursery their tasks run in.

Each group's driver (coordinator/driver.py) and its rebalance attempts read this, and nothing of
the ``GroupCoordinator`` that made it, so the dependencies run one way: the coordinator makes
groups, groups never call back into it.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs
import trio

from coordinator.config import CoordinatorConfig, RebalanceProtocol
from coordinator.observer import NULL_OBSERVER, CoordinatorObserver
from coordinator.offsets import OffsetKeeper
from coordinator.validation import HighWatermarks, LogEnd
from protocol.types import BrokerInfo
from statemachine.consumer_group import GroupRules
from store import MetadataStore, TopicPlacement


@attrs.define(eq=False)
class CoordinatorContext:
    config: CoordinatorConfig
    store: MetadataStore
    broker: BrokerInfo
    epoch: int
    offsets: OffsetKeeper
    nursery: trio.Nursery
    took_office_at: float
    #: Told of group inputs, deaths and Pings (metrics): coordinator/observer.py.
    observer: CoordinatorObserver = NULL_OBSERVER
    #: The log end of partitions whose log this broker holds: an offset past it is refused.
    log_end: LogEnd | None = None
    #: The leaders' high watermarks of replicated partitions led elsewhere: a commit past one is
    #: refused (None: every partition is checked by ``log_end`` alone).
    high_watermarks: HighWatermarks | None = None
    topics: Mapping[str, TopicPlacement] = attrs.field(factory=dict)
    brokers: tuple[BrokerInfo, ...] = ()
    #: The brokers as the clients of each listener reach them (Kafka's advertised.listeners).
    brokers_by_listener: dict[str, tuple[BrokerInfo, ...]] = attrs.Factory(dict)

    @property
    def rules(self) -> GroupRules:
        config = self.config
        return GroupRules(
            max_missed=config.max_missed_pings,
            lease_margin=config.lease_margin,
            initial_delay=config.initial_rebalance_delay,
            initial_max_delay=config.initial_rebalance_max_delay,
            backoff_fraction=config.rebalance_backoff_fraction,
            incremental=config.rebalance_protocol is RebalanceProtocol.INCREMENTAL,
            max_members=config.limits.max_group_size,
            max_streams=config.limits.max_group_streams,
        )

    def in_contact(self) -> bool:
        """Whether this coordinator may still renew leases: it may have been deposed once out of
        contact with its store (docs/design.md#coordinator-epochs-and-the-election)."""
        return trio.current_time() < self.store.in_contact_until()
