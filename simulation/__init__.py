"""A deterministic test driver: the real group coordinator and embedded store with the library's
own consumers, each in a simulated process, over in-memory streams, on trio's clock, with injected
faults and an invariant checker that reads the wire (docs/testing.md)."""

from simulation.cluster import SimulatedCluster, open_simulated_cluster
from simulation.consumer import SimulatedConsumer
from simulation.invariants import (
    InvariantViolation,
    LeaseInterval,
    OwnershipLedger,
    StoreHistory,
    StrayFetch,
)
from simulation.log import MemoryLog, StoredRecord
from simulation.process import ProcessKilled, SimulatedProcess
from simulation.store_faults import ContactStore, RecordingStore, StoreContact

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
    "StrayFetch",
    "open_simulated_cluster",
]
