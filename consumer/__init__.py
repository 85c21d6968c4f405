"""The trio client library: the producer and the group consumer (seed 03)."""

from transport.refusals import (
    AuthenticationFailed,
    ClusterAuthorizationFailed,
    GroupAuthorizationFailed,
    ListenerNeedsSasl,
    ListenerNeedsTls,
    Refused,
    TopicAuthorizationFailed,
    UnsupportedVersion,
)

from .client import (
    CommitFailed,
    Consumer,
    ConsumerSettings,
    CoordinatorUnavailable,
    InstanceFenced,
    RebalanceCallback,
    RebalanceListener,
    open_consumer,
)
from .producer import (
    Compression,
    Delivery,
    NotAwaited,
    ProduceError,
    Producer,
    ProducerConfig,
    TopicRecreated,
    open_producer,
)
from .runtime import Stop, WrongEventLoop, stop_on_signals
from .streams import ConsumerBatch, ConsumerRecord, CorruptBatch, RecordStream

__all__ = [
    "AuthenticationFailed",
    "ClusterAuthorizationFailed",
    "CommitFailed",
    "Compression",
    "Consumer",
    "ConsumerBatch",
    "ConsumerRecord",
    "ConsumerSettings",
    "CoordinatorUnavailable",
    "CorruptBatch",
    "Delivery",
    "GroupAuthorizationFailed",
    "InstanceFenced",
    "ListenerNeedsSasl",
    "ListenerNeedsTls",
    "NotAwaited",
    "ProduceError",
    "Producer",
    "ProducerConfig",
    "RebalanceCallback",
    "RebalanceListener",
    "RecordStream",
    "Refused",
    "Stop",
    "TopicAuthorizationFailed",
    "TopicRecreated",
    "UnsupportedVersion",
    "WrongEventLoop",
    "open_consumer",
    "open_producer",
    "stop_on_signals",
]
