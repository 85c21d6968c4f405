"""Store fixtures: the contract suite runs once per kind of store.

A kind is a function from the test's request to an *opener*: a callable whose every call opens a new
handle on the same backing state (the same data dir; for ZooKeeper, the same chroot), so a test can
close a store and open it again to see what survives. Adding a kind is one line in ``STORE_KINDS``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager

import pytest

from store import MetadataStore, open_embedded_store
from tests.support.zookeeper_fixtures import open_office, zookeeper, zookeeper_hosts

__all__ = ["zookeeper", "zookeeper_hosts"]  # fixtures the ZooKeeper kind needs

StoreOpener = Callable[[], AbstractAsyncContextManager[MetadataStore]]


def _embedded(request: pytest.FixtureRequest) -> StoreOpener:
    data_dir = request.getfixturevalue("tmp_path") / "store"
    return lambda: open_embedded_store(data_dir)


def _zookeeper(request: pytest.FixtureRequest) -> StoreOpener:
    """A real standalone ZooKeeper, a chroot per test; each open is a new session, seen through
    its one office of every group (store/slot_store.py)."""
    hosts = request.getfixturevalue("zookeeper_hosts")
    return lambda: open_office(hosts)


STORE_KINDS: dict[str, Callable[[pytest.FixtureRequest], StoreOpener]] = {
    "embedded": _embedded,
    "zookeeper": _zookeeper,
}

#: Kinds that run on real servers and the real clock.
REALTIME_KINDS = {"zookeeper"}


@pytest.fixture(
    params=[
        pytest.param(kind, marks=[pytest.mark.realtime] if kind in REALTIME_KINDS else [])
        for kind in sorted(STORE_KINDS)
    ]
)
def store_factory(request: pytest.FixtureRequest) -> StoreOpener:
    return STORE_KINDS[request.param](request)


@pytest.fixture
async def store(store_factory: StoreOpener) -> AsyncIterator[MetadataStore]:
    """One open store for tests that never reopen it (they must not also use ``store_factory``)."""
    async with store_factory() as opened:
        yield opened
