"""One broker process: its metadata store, its coordinator, its log, and its TCP listener.

The pieces are opened in dependency order and closed in reverse by one ``AsyncExitStack``, so a
SIGTERM (a cancellation) stops accepting, closes every connection, flushes the offsets and closes
the store, in that order.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from functools import partial
from pathlib import Path

import attrs
import trio

from broker.data_plane import open_broker_log
from broker.dispatch import handle_connection
from broker.election import handle_elected_connection, open_elector
from broker.log import LogConfig
from coordinator.config import CoordinatorConfig
from coordinator.group_coordinator import open_group_coordinator
from coordinator.validation import LogEnd
from protocol.types import BrokerInfo
from store import MetadataStore, open_embedded_store
from store.zookeeper import ZooKeeperStore, open_zookeeper_store
from transport.channel import ReadBounds
from transport.limits import ConnectionLimits
from transport.listener import ConnectionGate, serve_listeners

log = logging.getLogger(__name__)


@attrs.frozen(kw_only=True)
class NodeSettings:
    broker_id: int = 1
    host: str = "127.0.0.1"
    port: int = 9092
    #: The address other brokers and clients use to reach this one (defaults to host).
    advertised_host: str | None = None
    data_dir: Path = Path("data")
    coordinator: CoordinatorConfig = attrs.field(factory=CoordinatorConfig)
    connections: ConnectionLimits = attrs.field(factory=ConnectionLimits)
    log: LogConfig = attrs.field(factory=LogConfig)
    #: ``host:port[,host:port...][/chroot]`` of a ZooKeeper ensemble shared by the brokers of a
    #: cluster, which then elect one coordinator among them; None: the embedded store, and this
    #: broker is the coordinator.
    zookeeper: str | None = None
    #: How long ZooKeeper keeps this broker's registration and office after losing touch with it.
    #: A successor takes office that long (plus up to a ZooKeeper tick) after the coordinator
    #: died, which must fit in a third of the consumers' session timeout for their leases to
    #: outlast the failover (docs/design.md#defaults-that-fit-a-failover).
    zookeeper_session_timeout: float = 8.0


async def run_node(
    settings: NodeSettings, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED
) -> None:
    """Serve until cancelled; ``task_status.started`` gets the bound port (useful with port 0)."""
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    async with _open_store(settings) as store:
        listeners = await trio.open_tcp_listeners(settings.port, host=settings.host)
        port = listeners[0].socket.getsockname()[1]
        broker = BrokerInfo(
            broker_id=settings.broker_id,
            host=settings.advertised_host or settings.host,
            port=port,
        )
        await store.register_broker(broker)
        async with (
            open_broker_log(store, broker.broker_id, settings.data_dir, settings.log) as data_plane,
            _open_coordination(
                store, settings.coordinator, broker, data_plane.log_end_offset
            ) as serve_connection,
            trio.open_nursery() as nursery,
        ):
            handler = partial(
                serve_connection, data_plane=data_plane, bounds=ReadBounds.of(settings.connections)
            )
            gate = ConnectionGate.of(settings.connections)
            await nursery.start(serve_listeners, handler, listeners, gate)
            log.info(
                "broker %d serving on %s:%d, data in %s",
                broker.broker_id,
                settings.host,
                port,
                settings.data_dir,
            )
            task_status.started(port)


def _open_store(settings: NodeSettings) -> AbstractAsyncContextManager[MetadataStore]:
    if settings.zookeeper is None:
        return open_embedded_store(settings.data_dir / "metadata")
    return open_zookeeper_store(
        settings.zookeeper, session_timeout=settings.zookeeper_session_timeout
    )


#: ``handler(stream, data_plane=...)``: serves one connection.
ConnectionHandler = Callable[..., Awaitable[None]]


@asynccontextmanager
async def _open_coordination(
    store: MetadataStore, config: CoordinatorConfig, broker: BrokerInfo, log_end: LogEnd
) -> AsyncIterator[ConnectionHandler]:
    """Alone on its store, a broker is the coordinator; sharing ZooKeeper, it stands for election
    and serves each connection as whatever it is when the connection arrives."""
    if isinstance(store, ZooKeeperStore):
        async with open_elector(store, config, broker, log_end=log_end) as elector:
            yield partial(handle_elected_connection, elector)
    else:
        async with open_group_coordinator(store, config, broker, log_end=log_end) as coordinator:
            yield partial(handle_connection, coordinator)
