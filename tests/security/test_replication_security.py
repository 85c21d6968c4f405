"""Replication on a secured cluster (docs/security.md#brokers): brokers in this process on real
ZooKeeper, listening only where TLS and SASL are asked, reach each other on the inter-broker
listener as their own principal (a SCRAM user, or their certificate's subject), replicate a
factor-3 topic at acks=all, keep every follower in sync, and check a commit with the partitions'
leaders; a client that is not a broker is
refused REPLICA_FETCH whatever its rules; and a broker its peers would refuse says so at start."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trustme

from broker.node import NodeSettings, run_node
from consumer import ProducerConfig, open_producer
from consumer.admin import Admin, open_admin
from consumer.leaders import Leader
from launch.cluster import eventually
from protocol import ApiKey, ErrorCode, ReplicaFetchResponse
from protocol.sasl import MECHANISMS
from protocol.types import TopicPartition
from statemachine.acl import CLUSTER, Acl, Operation, ResourceType
from store.zookeeper import open_zookeeper_store
from tests.protocol.protocol_testing import SAMPLE_REQUESTS
from tests.support.zookeeper_fixtures import zookeeper, zookeeper_hosts
from transport.scram import make_credential
from transport.security import ClientSecurity, Endpoint, ServerTls

__all__ = ["zookeeper", "zookeeper_hosts"]

pytestmark = pytest.mark.realtime

TOPIC = "ledger"
PARTITIONS = 3
#: The brokers' ZooKeeper session: short, so a broker stopped is seen gone within seconds.
SESSION = 2.0
#: Generous: two busy cores run ZooKeeper and three brokers.
DEADLINE = 60
PASSWORDS = {"admin": "admin-pw", "broker": "broker-pw", "alice": "alice-pw"}
MECHANISM = "SCRAM-SHA-512"


@attrs.frozen(kw_only=True)
class Certificates:
    ca: Path
    #: The brokers' one certificate: 127.0.0.1, CN=broker.
    broker: Path
    #: CN=alice.
    alice: Path
    #: CN=broker and 127.0.0.1 too, from a CA the cluster does not trust.
    stranger: Path


@pytest.fixture
def certificates(tmp_path: Path) -> Certificates:
    ca, other = trustme.CA(), trustme.CA()
    (tmp_path / "certs").mkdir()

    def write(name: str, cert: trustme.LeafCert) -> Path:
        path = tmp_path / "certs" / f"{name}.pem"
        cert.private_key_and_cert_chain_pem.write_to_path(str(path))
        return path

    ca.cert_pem.write_to_path(str(tmp_path / "certs" / "ca.pem"))
    return Certificates(
        ca=tmp_path / "certs" / "ca.pem",
        broker=write("broker", ca.issue_cert("127.0.0.1", common_name="broker")),
        alice=write("alice", ca.issue_cert("alice@example.com", common_name="alice")),
        stranger=write("stranger", other.issue_cert("127.0.0.1", common_name="broker")),
    )


async def add_users(hosts: str) -> None:
    """The cluster's users, written to its store before any broker runs (``users add
    --zookeeper``)."""
    async with open_zookeeper_store(hosts) as store:
        for user, password in PASSWORDS.items():
            for mechanism in MECHANISMS:
                await store.set_scram_credential(user, make_credential(mechanism, password))


def sasl_ssl(
    certificates: Certificates, hosts: str, tmp_path: Path, broker_id: int
) -> NodeSettings:
    """SCRAM over TLS on the one listener; brokers authenticate as the SCRAM user ``broker``."""
    return NodeSettings(
        broker_id=broker_id,
        data_dir=tmp_path / f"broker{broker_id}",
        zookeeper=hosts,
        zookeeper_session_timeout=SESSION,
        listeners=(Endpoint(listener="SASL_SSL", host="127.0.0.1", port=0),),
        tls=ServerTls(cert=certificates.broker, key=certificates.broker),
        tls_ca=certificates.ca,
        super_users=frozenset({"User:admin", "User:broker"}),
        inter_broker_user="broker",
        inter_broker_password=PASSWORDS["broker"],
        inter_broker_sasl_mechanism=MECHANISM,
    )


def mutual_tls_beside_sasl(
    certificates: Certificates, hosts: str, tmp_path: Path, broker_id: int
) -> NodeSettings:
    """Clients on SASL_SSL (the first listener); brokers on SSL (the second), each known by its
    certificate's common name, every certificate from the cluster's CA."""
    return NodeSettings(
        broker_id=broker_id,
        data_dir=tmp_path / f"broker{broker_id}",
        zookeeper=hosts,
        zookeeper_session_timeout=SESSION,
        listeners=(
            Endpoint(listener="SASL_SSL", host="127.0.0.1", port=0),
            Endpoint(listener="SSL", host="127.0.0.1", port=0),
        ),
        tls=ServerTls(cert=certificates.broker, key=certificates.broker, client_ca=certificates.ca),
        tls_principal_is_cn=True,
        super_users=frozenset({"User:admin", "User:broker"}),
        inter_broker_listener="SSL",
    )


CLUSTERS = {"sasl_ssl": sasl_ssl, "mutual_tls_beside_sasl": mutual_tls_beside_sasl}


def as_user(certificates: Certificates, user: str) -> ClientSecurity:
    """A client on the first listener (SASL_SSL), with alice's certificate for a listener that
    asks for one."""
    return ClientSecurity(
        ca=certificates.ca,
        cert=certificates.alice,
        key=certificates.alice,
        sasl_mechanism=MECHANISM,
        username=user,
        password=PASSWORDS[user],
    )


@contextlib.asynccontextmanager
async def brokers(settings: list[NodeSettings]) -> AsyncIterator[list[tuple[str, int]]]:
    """The brokers running in this process; their first listeners' addresses."""
    async with trio.open_nursery() as nursery:
        ports = [await nursery.start(run_node, one) for one in settings]
        yield [("127.0.0.1", port) for port in ports]
        nursery.cancel_scope.cancel()


async def leaders(admin: Admin) -> Mapping[TopicPartition, Leader]:
    return (await admin.listing([TOPIC])).leaders


@pytest.mark.parametrize("cluster", CLUSTERS)
async def test_a_secured_cluster_replicates_and_refuses_replica_fetches_from_clients(
    zookeeper_hosts: str, tmp_path: Path, certificates: Certificates, cluster: str
) -> None:
    await add_users(zookeeper_hosts)
    make = CLUSTERS[cluster]
    settings = [make(certificates, zookeeper_hosts, tmp_path, n) for n in (1, 2, 3)]
    with trio.fail_after(4 * DEADLINE):
        await _replicate_and_refuse(settings, certificates)


async def _replicate_and_refuse(settings: list[NodeSettings], certificates: Certificates) -> None:
    async with (
        brokers(settings) as addresses,
        open_admin(addresses, security=as_user(certificates, "admin")) as admin,
    ):
        with trio.fail_after(DEADLINE):
            await admin.create_topic(
                TOPIC, PARTITIONS, replication_factor=3, configs={"min.insync.replicas": "2"}
            )

        async def all_in_sync() -> bool:
            found = await leaders(admin)
            return len(found) == PARTITIONS and all(
                leader.broker_id > 0 and sorted(leader.isr) == [1, 2, 3]
                for leader in found.values()
            )

        await eventually(all_in_sync, deadline=DEADLINE)
        acknowledged: dict[int, list[int]] = {}
        async with open_producer(
            addresses,
            security=as_user(certificates, "admin"),
            config=ProducerConfig(acks="all"),
        ) as producer:
            with trio.fail_after(DEADLINE):
                for n in range(10 * PARTITIONS):
                    partition, offset = await producer.send_and_wait(
                        TOPIC, b"%d" % n, partition=n % PARTITIONS
                    )
                    acknowledged.setdefault(partition, []).append(offset)
        assert acknowledged == {p: list(range(10)) for p in range(PARTITIONS)}
        # every follower fetched them: each partition's in-sync replicas are still all three
        await eventually(all_in_sync, deadline=DEADLINE)

        # a commit is checked against each partition's leader's high watermark: the group's
        # coordinator asks the leaders of those it does not lead, over the inter-broker listener
        assert len({leader.broker_id for leader in (await leaders(admin)).values()}) > 1
        ends = {TopicPartition(topic=TOPIC, partition=p): 10 for p in range(PARTITIONS)}
        # (bounded by the whole test's deadline: the admin keeps the channel to the group's
        # coordinator it opens here, which an inner cancel scope must not enclose)
        await admin.reset_offsets("g", ends)
        assert await admin.committed_offsets("g") == ends

        # a client that is not a broker, even one every rule allows everything, is refused
        await admin.create_acls(
            [
                Acl(principal="User:alice", resource_type=kind, name=name, operation=Operation.ALL)
                for kind, name in ((ResourceType.CLUSTER, CLUSTER), (ResourceType.TOPIC, "*"))
            ]
        )
        async with open_admin(addresses, security=as_user(certificates, "alice")) as alice:
            with trio.fail_after(DEADLINE):
                answer = await alice.channel.request(SAMPLE_REQUESTS[ApiKey.REPLICA_FETCH])
        assert isinstance(answer, ReplicaFetchResponse)
        assert answer.error_code is ErrorCode.CLUSTER_AUTHORIZATION_FAILED


def _settings(
    certificates: Certificates, hosts: str, tmp_path: Path, **changes: Any
) -> NodeSettings:
    return attrs.evolve(sasl_ssl(certificates, hosts, tmp_path, 1), **changes)


async def refusal(settings: NodeSettings) -> str:
    """Why the broker refused to start (it must, and at once: ``serve`` prints it)."""
    with trio.fail_after(DEADLINE):
        try:
            await run_node(settings)
        except (ValueError, ExceptionGroup) as error:
            (refused,) = _leaves(error)
            assert isinstance(refused, ValueError), error
            return str(refused)
    raise AssertionError("the broker started")


def _leaves(error: BaseException) -> list[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in _leaves(inner)]
    return [error]


REFUSALS: dict[str, tuple[dict[str, Any], str]] = {
    "no credentials": (
        {"inter_broker_user": None, "inter_broker_password": None},
        "replication needs --inter-broker-user and its password",
    ),
    "not a super user": (
        {"super_users": frozenset({"User:admin"})},
        "this broker is User:broker to its peers on the inter-broker listener SASL_SSL",
    ),
    "a wrong password": (
        {"inter_broker_password": "guess"},
        "the inter-broker password is not --inter-broker-user broker's",
    ),
    "an unknown user": (
        {"inter_broker_user": "nobody", "super_users": frozenset({"User:nobody"})},
        "--inter-broker-user nobody has no SCRAM-SHA-512 credential in the cluster's store",
    ),
    "no such listener": ({"inter_broker_listener": "SSL"}, "none of this broker's listeners"),
}


@pytest.mark.parametrize("case", REFUSALS)
async def test_a_broker_its_peers_would_refuse_is_refused_at_start(
    zookeeper_hosts: str, tmp_path: Path, certificates: Certificates, case: str
) -> None:
    await add_users(zookeeper_hosts)
    changes, said = REFUSALS[case]
    settings = _settings(certificates, zookeeper_hosts, tmp_path, **changes)
    assert said in await refusal(settings)


@pytest.mark.parametrize(
    ("cluster", "cert", "advertised", "said"),
    [
        (mutual_tls_beside_sasl, "stranger", None, "unable to get local issuer certificate"),
        (sasl_ssl, "stranger", None, "unable to get local issuer certificate"),
        (sasl_ssl, "broker", "localhost", "Hostname mismatch"),
    ],
    ids=["client certificate", "server certificate", "advertised address"],
)
async def test_a_certificate_its_peers_would_refuse_is_refused_at_start(
    zookeeper_hosts: str,
    tmp_path: Path,
    certificates: Certificates,
    cluster: Callable[..., NodeSettings],
    cert: str,
    advertised: str | None,
    said: str,
) -> None:
    settings = cluster(certificates, zookeeper_hosts, tmp_path, 1)
    assert settings.tls is not None
    path = getattr(certificates, cert)
    settings = attrs.evolve(
        settings,
        tls=attrs.evolve(settings.tls, cert=path, key=path),
        advertised_host=advertised,
    )
    refused = await refusal(settings)
    assert "its peers would refuse this broker's certificate" in refused
    assert said in refused
