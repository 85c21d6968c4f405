"""The metadata store: its interface, five protocols and their union (``interface``), the embedded
implementation (``embedded``), and the ZooKeeper one (``zookeeper`` and its ``zookeeper_*``
modules, on ``kazoo_bridge``, the one module that imports kazoo), whose offices are its slots'
(``slot_store``). The coordinator imports from here and nowhere deeper."""

from .embedded import EmbeddedStore, open_embedded_store
from .forwarding import ForwardingStore
from .interface import (
    Assignment,
    ClusterStore,
    Deposed,
    GroupRecord,
    GroupStore,
    InvalidPartitions,
    InvalidReplicationFactor,
    LayoutMismatch,
    MemberRecord,
    MetadataStore,
    OfficeStore,
    OffsetBatch,
    ReplicationStore,
    SecurityStore,
    StoreError,
    StoreUnavailable,
    TopicExists,
    TopicPlacement,
    TopicStore,
    UnknownTopic,
)

__all__ = [
    "Assignment",
    "ClusterStore",
    "Deposed",
    "EmbeddedStore",
    "ForwardingStore",
    "GroupRecord",
    "GroupStore",
    "InvalidPartitions",
    "InvalidReplicationFactor",
    "LayoutMismatch",
    "MemberRecord",
    "MetadataStore",
    "OfficeStore",
    "OffsetBatch",
    "ReplicationStore",
    "SecurityStore",
    "StoreError",
    "StoreUnavailable",
    "TopicExists",
    "TopicPlacement",
    "TopicStore",
    "UnknownTopic",
    "open_embedded_store",
]
