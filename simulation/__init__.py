"""A deterministic test driver: the real group coordinator and embedded store with simulated
consumers that speak the real protocol over in-memory streams, on trio's clock, with injected
faults and an invariant checker (docs/testing.md)."""

from simulation.cluster import (
    ContactStore,
    InvariantViolation,
    LeaseInterval,
    OwnershipLedger,
    RecordingStore,
    SimulatedCluster,
    SimulatedConsumer,
    StoreContact,
    StoreHistory,
    open_simulated_cluster,
)

__all__ = [
    "ContactStore",
    "InvariantViolation",
    "LeaseInterval",
    "OwnershipLedger",
    "RecordingStore",
    "SimulatedCluster",
    "SimulatedConsumer",
    "StoreContact",
    "StoreHistory",
    "open_simulated_cluster",
]
