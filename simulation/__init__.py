"""A deterministic test driver: the real group coordinator and embedded store with simulated
consumers that speak the real protocol over in-memory streams, on trio's clock, with injected
faults and an invariant checker (docs/testing.md)."""

from simulation.cluster import (
    ContactStore,
    InvariantViolation,
    LeaseInterval,
    OwnershipLedger,
    ProcessKilled,
    RecordingStore,
    SimulatedCluster,
    SimulatedConsumer,
    SimulatedProcess,
    StoreContact,
    StoreHistory,
    open_simulated_cluster,
)
from simulation.log import MemoryLog, StoredRecord

__all__ = [
    "ContactStore",
    "InvariantViolation",
    "LeaseInterval",
    "MemoryLog",
    "OwnershipLedger",
    "ProcessKilled",
    "RecordingStore",
    "SimulatedCluster",
    "SimulatedConsumer",
    "SimulatedProcess",
    "StoreContact",
    "StoreHistory",
    "StoredRecord",
    "open_simulated_cluster",
]
