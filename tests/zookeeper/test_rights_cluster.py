"""Users and access rules changed through one broker of a ZooKeeper cluster apply on the other:
a user added through broker 1 authenticates at broker 2 as soon as the change is answered, and a
rule added or removed through broker 1 is enforced by broker 2 within the stated bound
(docs/design.md#who-may-do-what: ACL_REFRESH and one read of the store)."""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path

import pytest
import trio

from broker.authorization import ACL_REFRESH
from consumer.admin import Admin, open_admin
from protocol import ErrorCode
from statemachine.acl import Acl, Operation, ResourceType
from tests.cli.cli_process import run_cli
from tests.security.conftest import Broker, run_secured_broker
from transport.connect import parse_bootstrap
from transport.security import ClientSecurity

pytestmark = pytest.mark.realtime

#: What the machine may add to the bound: a loaded CI core delays a ZooKeeper read, a process's
#: timer, the poll below.
MARGIN = 2.0
READ_T = Acl(
    principal="User:alice", resource_type=ResourceType.TOPIC, name="t", operation=Operation.READ
)


def _as(user: str, password: str) -> ClientSecurity:
    return ClientSecurity(sasl_mechanism="SCRAM-SHA-512", username=user, password=password)


async def _topic_error(admin: Admin) -> ErrorCode:
    (topic,) = (await admin.metadata(["t"])).topics
    return topic.error_code


async def _until(admin: Admin, wanted: ErrorCode) -> float:
    """How long broker 2 took to answer alice's metadata of t with ``wanted``."""
    began = trio.current_time()
    with trio.fail_after(ACL_REFRESH + MARGIN):
        while await _topic_error(admin) is not wanted:
            await trio.sleep(0.05)
    return trio.current_time() - began


async def test_a_change_through_one_broker_applies_on_the_other_within_the_bound(
    zookeeper_hosts: str, tmp_path: Path
) -> None:
    added = await run_cli(
        "users", "add", "admin", "--zookeeper", zookeeper_hosts, "--password-stdin",
        stdin=b"admin-pw\n",
    )  # fmt: skip
    assert added.returncode == 0, added.stderr.decode()
    password = tmp_path / "admin.pw"
    password.write_text("admin-pw\n")
    async with AsyncExitStack() as stack:
        brokers: list[Broker] = []
        for broker_id in (1, 2):
            brokers.append(
                await stack.enter_async_context(
                    run_secured_broker(
                        tmp_path / f"broker{broker_id}",
                        ["SASL_PLAINTEXT"],
                        f"--broker-id={broker_id}",
                        f"--zookeeper={zookeeper_hosts}",
                        "--super-users=User:admin",
                        # the brokers reach each other on SASL_PLAINTEXT too, as admin
                        "--inter-broker-user=admin",
                        f"--inter-broker-password-file={password}",
                    )
                )
            )
        one, two = (parse_bootstrap(b.bootstrap("SASL_PLAINTEXT")) for b in brokers)
        admin = await stack.enter_async_context(open_admin(one, security=_as("admin", "admin-pw")))
        with trio.fail_after(30):
            await admin.create_topic("t", 1, replication_factor=1)
            await admin.set_password("alice", "alice-pw")
        # a user added through broker 1 authenticates at broker 2 at once
        alice = await stack.enter_async_context(open_admin(two, security=_as("alice", "alice-pw")))
        with trio.fail_after(30):
            assert await _topic_error(alice) is ErrorCode.TOPIC_AUTHORIZATION_FAILED
            await admin.create_acls([READ_T])
        took = await _until(alice, ErrorCode.NONE)
        assert took <= ACL_REFRESH + MARGIN
        with trio.fail_after(30):
            assert await admin.delete_acls([READ_T]) == (READ_T,)
        took = await _until(alice, ErrorCode.TOPIC_AUTHORIZATION_FAILED)
        assert took <= ACL_REFRESH + MARGIN
