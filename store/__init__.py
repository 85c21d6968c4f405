"""The metadata store: one interface (``interface``), the embedded implementation (``embedded``),
and the ZooKeeper one (``zookeeper``, on ``kazoo_bridge``, the one module that imports kazoo). The
coordinator imports from here and nowhere deeper."""

from .embedded import EmbeddedStore, open_embedded_store
from .interface import (
    Deposed,
    GroupRecord,
    InvalidPartitions,
    LayoutMismatch,
    MemberRecord,
    MetadataStore,
    OffsetBatch,
    StoreError,
    StoreUnavailable,
    TopicExists,
    TopicPlacement,
    UnknownTopic,
)

__all__ = [
    "Deposed",
    "EmbeddedStore",
    "GroupRecord",
    "InvalidPartitions",
    "LayoutMismatch",
    "MemberRecord",
    "MetadataStore",
    "OffsetBatch",
    "StoreError",
    "StoreUnavailable",
    "TopicExists",
    "TopicPlacement",
    "UnknownTopic",
    "open_embedded_store",
]
