"""ZooKeeper digest authentication: the metadata a broker keeps in ZooKeeper is not readable or
writable by whoever reaches the ensemble, only by clients that know the user's password."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from store import StoreUnavailable
from store.kazoo_bridge import DigestAuth, NoAuthError, blocking_client
from store.zookeeper import open_zookeeper_store
from transport.scram import make_credential

pytestmark = pytest.mark.realtime

BROKERS = DigestAuth(user="brokers", password="zk-secret")


def _try(hosts: str, auth: DigestAuth | None, action: Any) -> str:
    """What a raw kazoo client of ``hosts`` gets doing ``action(client)``: "ok" or the error."""
    with blocking_client(hosts, start_timeout=30, auth=auth) as client:
        try:
            action(client)
        except NoAuthError:
            return "no auth"
    return "ok"


async def test_only_a_client_with_the_password_reads_or_writes_the_metadata(
    zookeeper_hosts: str,
) -> None:
    async with open_zookeeper_store(zookeeper_hosts, auth=BROKERS) as store:
        await store.create_topic("t", (1,))
        await store.set_scram_credential("alice", make_credential("SCRAM-SHA-256", "pw"))
    for action in (
        lambda c: c.get("/brokers/topics/t"),
        lambda c: c.set("/brokers/topics/t", b"{}"),
        lambda c: c.get("/config/users/alice"),
        lambda c: c.create("/brokers/topics/u", b"{}"),
        lambda c: c.get_children("/"),
    ):
        assert await trio.to_thread.run_sync(_try, zookeeper_hosts, None, action) == "no auth"
        wrong = DigestAuth(user="brokers", password="guess")
        assert await trio.to_thread.run_sync(_try, zookeeper_hosts, wrong, action) == "no auth"
    reader = await trio.to_thread.run_sync(
        _try, zookeeper_hosts, BROKERS, lambda c: c.get("/brokers/topics/t")
    )
    assert reader == "ok"
    with pytest.raises((StoreUnavailable, ExceptionGroup)) as refused:
        async with open_zookeeper_store(zookeeper_hosts, call_bound=10) as store:
            await store.topics()
    assert "NoAuthError" in repr(
        refused.value.exceptions if isinstance(refused.value, ExceptionGroup) else refused.value
    )
    async with open_zookeeper_store(zookeeper_hosts, auth=BROKERS) as store:
        assert set(await store.topics()) == {"t"}
        assert await store.users() == {"alice": ("SCRAM-SHA-256",)}
