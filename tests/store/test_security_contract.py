"""The store's part in security, for every kind of store: brokers as each listener's clients reach
them (advertised listeners), SCRAM credentials kept salted and hashed, and access rules."""

from __future__ import annotations

from pathlib import Path

from protocol.types import BrokerInfo
from statemachine.acl import Acl, Operation, ResourceType
from store import MetadataStore, open_embedded_store
from tests.store.conftest import StoreOpener
from transport.scram import make_credential


async def test_each_listener_names_the_brokers_by_the_address_it_advertises(
    store: MetadataStore,
) -> None:
    await store.register_broker(
        BrokerInfo(broker_id=1, host="10.0.0.1", port=9092),
        {"PLAINTEXT": ("10.0.0.1", 9092), "SSL": ("broker1.example", 9093)},
    )
    await store.register_broker(
        BrokerInfo(broker_id=2, host="10.0.0.2", port=9092), {"PLAINTEXT": ("10.0.0.2", 9092)}
    )
    assert await store.brokers("SSL") == (
        BrokerInfo(broker_id=1, host="broker1.example", port=9093),
    )
    assert [b.port for b in await store.brokers("PLAINTEXT")] == [9092, 9092]
    assert [b.host for b in await store.brokers()] == ["10.0.0.1", "10.0.0.2"]


async def test_scram_credentials_are_kept_per_mechanism_and_survive_a_reopen(
    store_factory: StoreOpener,
) -> None:
    sha256 = make_credential("SCRAM-SHA-256", "pw", iterations=4096)
    sha512 = make_credential("SCRAM-SHA-512", "pw", iterations=4096)
    async with store_factory() as store:
        await store.set_scram_credential("alice", sha256)
        await store.set_scram_credential("alice", sha512)
        await store.set_scram_credential("bob=,x", sha256)
    async with store_factory() as store:
        assert await store.scram_credential("alice", "SCRAM-SHA-256") == sha256
        assert await store.scram_credential("alice", "SCRAM-SHA-512") == sha512
        assert await store.scram_credential("carol", "SCRAM-SHA-256") is None
        assert await store.users() == {
            "alice": ("SCRAM-SHA-256", "SCRAM-SHA-512"),
            "bob=,x": ("SCRAM-SHA-256",),
        }
        assert await store.delete_user("alice")
        assert not await store.delete_user("alice")
        assert await store.scram_credential("alice", "SCRAM-SHA-512") is None
        assert await store.users() == {"bob=,x": ("SCRAM-SHA-256",)}


async def test_a_new_password_replaces_the_old(store: MetadataStore) -> None:
    await store.set_scram_credential("alice", make_credential("SCRAM-SHA-256", "old"))
    new = make_credential("SCRAM-SHA-256", "new")
    await store.set_scram_credential("alice", new)
    assert await store.scram_credential("alice", "SCRAM-SHA-256") == new


async def test_the_embedded_store_never_writes_the_password(tmp_path: Path) -> None:
    async with open_embedded_store(tmp_path) as store:
        await store.set_scram_credential(
            "alice", make_credential("SCRAM-SHA-512", "hunter2-correct-horse")
        )
    written = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.is_file())
    assert b"hunter2-correct-horse" not in written
    assert b"alice" in written


async def test_access_rules_are_added_and_removed_in_one_write_and_survive_a_reopen(
    store_factory: StoreOpener,
) -> None:
    read_t = Acl(
        principal="User:alice", resource_type=ResourceType.TOPIC, name="t", operation=Operation.READ
    )
    read_g = Acl(
        principal="User:alice", resource_type=ResourceType.GROUP, name="g", operation=Operation.READ
    )
    everyone = Acl(
        principal="*", resource_type=ResourceType.TOPIC, name="*", operation=Operation.DESCRIBE
    )
    async with store_factory() as store:
        assert await store.acls() == frozenset()
        assert await store.change_acls([read_t, read_g], []) == {read_t, read_g}
        assert await store.change_acls([everyone], [read_g]) == {read_t, everyone}
    async with store_factory() as store:
        assert await store.acls() == {read_t, everyone}
