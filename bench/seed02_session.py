"""One consumer's ZooKeeper session for seed 02's client-side rebalancing (Kafka 0.8's
``ZookeeperConsumerConnector``): the predecessor the coordinator replaces, kept only as the
baseline of ``bench/seed02.py``, whose consumer logic is in ``bench/seed02_consumer.py``.

Its nodes follow the store's layout (``store.zookeeper``'s path helpers), and its client is
driven like the store's, through ``store.kazoo_bridge``: requests queued with kazoo's ``*_async``
calls, their completions and watches back on the trio thread, every wait bounded.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

import attrs
import trio_util

from store import StoreUnavailable
from store.kazoo_bridge import KazooBridge, NodeExistsError, NoNodeError, kazoo_bridge
from store.zookeeper import (
    DEFAULT_CALL_BOUND,
    DEFAULT_SESSION_TIMEOUT,
    group_path,
    segment_name,
    topic_path,
)

__all__ = ["ZooKeeperRebalanceSession", "open_zk_rebalance_session"]


@attrs.define(eq=False, repr=False)
class ZooKeeperRebalanceSession:
    """The primitives seed 02's design is built from; obtain one from ``open_zk_rebalance_session``.

    Each is one ZooKeeper request, counted in ``operations``: register the consumer (ephemeral),
    list the group's consumers and read a topic's partitions (both arming a watch; every watch
    that fires bumps ``changes``), claim a partition (an ephemeral owner node: a NodeExists is a
    failed claim) and release it.
    """

    _bridge: KazooBridge
    #: Bumped on the trio thread by every watch that fires and every session state change.
    changes: trio_util.AsyncValue[int] = attrs.Factory(lambda: trio_util.AsyncValue(0))
    _closed: bool = False

    def __repr__(self) -> str:
        return f"<ZooKeeperRebalanceSession {self._bridge.client.hosts!r}>"

    @property
    def operations(self) -> int:
        """ZooKeeper requests made (create, delete, get, get_children; ensure_path counts once)."""
        return self._bridge.requests

    async def register(self, group_id: str, consumer_id: str, topics: Sequence[str]) -> None:
        """Create ``/consumers/<group>/ids/<consumer_id>`` (ephemeral) and the owner dirs."""
        client = self._bridge.client
        owner_dirs = [group_path(group_id, "owners", topic) for topic in topics]
        for parent in [group_path(group_id, "ids"), *owner_dirs]:
            await self._wait(client.ensure_path_async(parent))
        path = group_path(group_id, "ids", consumer_id)
        await self._wait(client.create_async(path, b"{}", ephemeral=True))

    async def consumer_ids(self, group_id: str) -> list[str]:
        """The group's registered consumers, arming a watch on the list."""
        path = group_path(group_id, "ids")
        children = await self._wait(
            self._bridge.client.get_children_async(path, watch=self._on_watch)
        )
        return sorted(segment_name(child) for child in children)

    async def partition_count(self, topic: str) -> int:
        """How many partitions ``topic`` has (0 if it does not exist), arming a watch on it."""
        client = self._bridge.client
        try:
            data, _stat = await self._wait(
                client.get_async(topic_path(topic), watch=self._on_watch)
            )
        except NoNodeError:
            await self._wait(client.exists_async(topic_path(topic), watch=self._on_watch))
            return 0
        return len(json.loads(data))

    async def claim(self, group_id: str, topic: str, partition: int, owner: str) -> bool:
        """Create the partition's ephemeral owner node: False if someone else still holds it."""
        path = group_path(group_id, "owners", topic, partition)
        try:
            await self._wait(self._bridge.client.create_async(path, owner.encode(), ephemeral=True))
        except NodeExistsError:
            return False
        return True

    async def release(self, group_id: str, topic: str, partition: int) -> None:
        """Delete the partition's owner node (gone already is fine)."""
        path = group_path(group_id, "owners", topic, partition)
        with contextlib.suppress(NoNodeError):
            await self._wait(self._bridge.client.delete_async(path))

    def _on_watch(self, _event: object) -> None:
        """Kazoo's watch callback, on a kazoo thread."""
        self._bridge.soon(self._bump)

    def _bump(self) -> None:
        self.changes.value += 1

    async def _wait(self, result: Any) -> Any:
        if self._closed:
            raise StoreUnavailable("the session is closed")
        return await self._bridge.answer(result)


@contextlib.asynccontextmanager
async def open_zk_rebalance_session(
    hosts: str,
    *,
    session_timeout: float = DEFAULT_SESSION_TIMEOUT,
    call_bound: float = DEFAULT_CALL_BOUND,
) -> AsyncIterator[ZooKeeperRebalanceSession]:
    """One seed-02 consumer's ZooKeeper session (``hosts`` as for ``open_zookeeper_store``) for
    the block; leaving it closes the session, so its ephemeral nodes go at once."""
    bridge = kazoo_bridge(hosts, session_timeout=session_timeout, call_bound=call_bound)
    session = ZooKeeperRebalanceSession(bridge=bridge)
    bridge.listen(lambda _state: session._bump())
    async with bridge.running():
        try:
            yield session
        finally:
            session._closed = True
