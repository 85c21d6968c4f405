"""Pytest fixtures for real ZooKeeper: one standalone server for the whole session, a fresh
3-node ensemble per test that needs one, and a chroot of its own for every test.

Import them into a ``conftest.py`` (``from tests.support.zookeeper_fixtures import *``). A machine
without java or Debian's zookeeper package skips these tests, saying why.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from launch.zookeeper import Ensemble, open_ensemble, zookeeper_available
from store.slot_store import SlotStore
from store.zookeeper import open_zookeeper_store

__all__ = [
    "open_office",
    "require_zookeeper",
    "zookeeper",
    "zookeeper_ensemble",
    "zookeeper_hosts",
]

_chroots = itertools.count(1)


def require_zookeeper() -> None:
    """Skip the test, saying why, on a machine that cannot run ZooKeeper."""
    if not zookeeper_available():
        pytest.skip(
            "needs java and Debian's zookeeper package (scripts/bootstrap.sh installs them)"
        )


@pytest.fixture(scope="session")
def zookeeper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ensemble]:
    """One standalone server shared by every test of the run; tests keep apart by chroot."""
    require_zookeeper()
    with open_ensemble(1, base_dir=tmp_path_factory.mktemp("zookeeper")) as ensemble:
        yield ensemble


@pytest.fixture
def zookeeper_hosts(zookeeper: Ensemble) -> str:
    """A connect string with a chroot no other test uses (kazoo creates it on first use)."""
    return f"{zookeeper.hosts}/test-{os.getpid()}-{next(_chroots)}"


@pytest.fixture
def zookeeper_ensemble(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ensemble]:
    """A 3-node quorum of this test's own, for tests that kill servers."""
    require_zookeeper()
    with open_ensemble(3, base_dir=tmp_path_factory.mktemp("ensemble")) as ensemble:
        yield ensemble


@contextlib.asynccontextmanager
async def open_office(hosts: str, **options: Any) -> AsyncIterator[SlotStore]:
    """A ZooKeeper store (``open_zookeeper_store(hosts, **options)``) seen through its one office
    of every group: the one slot of a count of 1, as the contract suite runs it."""
    async with open_zookeeper_store(hosts, **options) as store:
        yield SlotStore(inner=store)
