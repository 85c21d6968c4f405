"""Brokers run in this process (``run_node``: real sockets, real ZooKeeper, real clock), each
cancelled on its own (a clean shutdown: its ZooKeeper session closes at once)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import attrs
import trio

from broker.node import NodeSettings, run_node
from coordinator.config import CoordinatorConfig

#: The brokers' ZooKeeper session timeout: short, so a broker's death is seen within seconds.
SESSION = 2.0


@attrs.define
class Broker:
    broker_id: int
    port: int
    scope: trio.CancelScope

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)


async def _run_broker(settings: NodeSettings, *, task_status: trio.TaskStatus[Broker]) -> None:
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            port = await nursery.start(run_node, settings)
            task_status.started(Broker(broker_id=settings.broker_id, port=port, scope=scope))


async def add_broker(
    nursery: trio.Nursery, hosts: str, tmp_path: Path, config: CoordinatorConfig, broker_id: int
) -> Broker:
    """Start broker ``broker_id`` on ZooKeeper at ``hosts``, on its own data dir, in
    ``nursery``; it runs until its scope is cancelled."""
    settings = NodeSettings(
        broker_id=broker_id,
        port=0,
        data_dir=tmp_path / f"broker{broker_id}",
        coordinator=config,
        zookeeper=hosts,
        zookeeper_session_timeout=SESSION,
    )
    broker: Broker = await nursery.start(_run_broker, settings)
    return broker


@contextlib.asynccontextmanager
async def cluster(
    hosts: str, tmp_path: Path, config: CoordinatorConfig, size: int
) -> AsyncIterator[list[Broker]]:
    """``size`` brokers sharing ZooKeeper at ``hosts``, ids 1..size, each on its own data dir."""
    async with trio.open_nursery() as nursery:
        brokers = [
            await add_broker(nursery, hosts, tmp_path, config, broker_id)
            for broker_id in range(1, size + 1)
        ]
        yield brokers
        nursery.cancel_scope.cancel()


def ids(brokers: list[Broker]) -> list[tuple[int, tuple[str, int]]]:
    return [(b.broker_id, b.address) for b in brokers]
