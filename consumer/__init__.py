"""The trio client library: the producer and the group consumer (seed 03)."""

from protocol.types import TopicPartition
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

from .admin import Admin, AdminError, open_admin
from .client import (
    CommitFailed,
    Consumer,
    ConsumerSettings,
    CoordinatorUnavailable,
    InstanceFenced,
    PartitionNotAssigned,
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
    SendDoesNotWait,
    TopicRecreated,
    open_producer,
)
from .runtime import Stop, WrongEventLoop, stop_on_signals
from .streams import ConsumerBatch, ConsumerRecord, CorruptBatch, RecordStream

__all__ = [
    "Admin",
    "AdminError",
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
    "PartitionNotAssigned",
    "ProduceError",
    "Producer",
    "ProducerConfig",
    "RebalanceCallback",
    "RebalanceListener",
    "RecordStream",
    "Refused",
    "SendDoesNotWait",
    "Stop",
    "TopicAuthorizationFailed",
    "TopicPartition",
    "TopicRecreated",
    "UnsupportedVersion",
    "WrongEventLoop",
    "open_admin",
    "open_consumer",
    "open_producer",
    "stop_on_signals",
]
