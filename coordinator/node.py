"""One broker process: its metadata store, its coordinator, its log, and its TCP listener.

The pieces are opened in dependency order and closed in reverse by one ``AsyncExitStack``, so a
SIGTERM (a cancellation) stops accepting, closes every connection, flushes the offsets and closes
the store, in that order.
"""

from __future__ import annotations

import logging
from functools import partial
from pathlib import Path

import attrs
import trio

from coordinator.config import CoordinatorConfig
from coordinator.group_coordinator import open_group_coordinator
from coordinator.server import handle_connection
from coordinator.store import open_embedded_store
from protocol.types import BrokerInfo

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


async def run_node(
    settings: NodeSettings, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED
) -> None:
    """Serve until cancelled; ``task_status.started`` gets the bound port (useful with port 0)."""
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    async with open_embedded_store(settings.data_dir / "metadata") as store:
        listeners = await trio.open_tcp_listeners(settings.port, host=settings.host)
        port = listeners[0].socket.getsockname()[1]
        broker = BrokerInfo(
            broker_id=settings.broker_id,
            host=settings.advertised_host or settings.host,
            port=port,
        )
        await store.register_broker(broker)
        async with (
            open_group_coordinator(store, settings.coordinator, broker) as coordinator,
            trio.open_nursery() as nursery,
        ):
            handler = partial(handle_connection, coordinator)
            await nursery.start(trio.serve_listeners, handler, listeners)
            log.info(
                "broker %d serving on %s:%d, data in %s",
                broker.broker_id,
                settings.host,
                port,
                settings.data_dir,
            )
            task_status.started(port)
