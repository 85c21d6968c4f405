"""The rebalance protocol a simulated test runs under (docs/design.md#rebalance)."""

from __future__ import annotations

import attrs

from coordinator.config import CoordinatorConfig, RebalanceProtocol


def eager(config: CoordinatorConfig | None = None) -> CoordinatorConfig:
    """``config`` under the eager protocol: for tests whose timeline is the seeds' rebalance,
    which stops and starts every member."""
    return attrs.evolve(config or CoordinatorConfig(), rebalance_protocol=RebalanceProtocol.EAGER)


def under(
    protocol: RebalanceProtocol, config: CoordinatorConfig | None = None
) -> CoordinatorConfig:
    return attrs.evolve(config or CoordinatorConfig(), rebalance_protocol=protocol)
