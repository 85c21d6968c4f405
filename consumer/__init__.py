"""The trio client library: the producer and the group consumer (seed 03)."""

from .client import (
    CommitFailed,
    Consumer,
    ConsumerSettings,
    InstanceFenced,
    RebalanceCallback,
    open_consumer,
)
from .producer import (
    Compression,
    Delivery,
    ProduceError,
    Producer,
    ProducerConfig,
    open_producer,
)
from .streams import ConsumerBatch, ConsumerRecord, RecordStream

__all__ = [
    "CommitFailed",
    "Compression",
    "Consumer",
    "ConsumerBatch",
    "ConsumerRecord",
    "ConsumerSettings",
    "Delivery",
    "InstanceFenced",
    "ProduceError",
    "Producer",
    "ProducerConfig",
    "RebalanceCallback",
    "RecordStream",
    "open_consumer",
    "open_producer",
]
