"""Old clients in the same groups as new ones (docs/design.md#old-clients): each member gets only
the versions it reads, one that cannot read a partial stop is stopped and started whole, one
without a lease frees its partitions T plus the margin after its connection ends, and a
registration no rule can serve is refused with a code and a message, never accepted."""

from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing

from coordinator.config import CoordinatorConfig
from protocol import (
    NEED_DATA,
    ApiKey,
    ApiVersionRange,
    ErrorCode,
    PeerError,
    RegisterConsumerRequest,
    Role,
)
from simulation import open_simulated_cluster
from tests.protocol.test_versions import REQUEST
from tests.support.standin_consumer import StandInConsumer
from transport.channel import Channel

CONFIG = CoordinatorConfig(initial_rebalance_delay=1.0, lease_margin=0.5)
TOPICS = {"events": 6}


async def test_an_old_member_is_stopped_whole_while_the_others_are_only_revoked(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        await cluster.create_topic("events", partitions=6)
        new = await cluster.start_consumer("new", group="g", topics={"events": 1})
        old = await cluster.start_consumer(
            "old", group="g", topics={"events": 1}, level0=True, member=StandInConsumer
        )
        await cluster.wait_stable("g", members=2)
        assert len(new.owned) == len(old.owned) == 3
        stops_before = len(new.stopped_partitions), len(old.stopped_partitions)

        await cluster.start_consumer("third", group="g", topics={"events": 1})
        await cluster.wait_stable("g", members=3)
        await cluster.check_invariants(settled=True)

        # The new member gave up only what moved; the old one was stopped whole and started
        # with what it keeps, in version 0 (any other version would have failed the run).
        (revoked,) = new.stopped_partitions[stops_before[0] :]
        assert revoked is not None and len(revoked) == 1
        assert old.stopped_partitions[stops_before[1] :] == [None]
        assert len(new.owned) == len(old.owned) == 2


@pytest.mark.parametrize("level0", [False, True], ids=["new", "level0"])
async def test_an_old_member_frees_its_partitions_only_after_t_and_the_margin(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, level0: bool
) -> None:
    """A new member's LeaveGroup frees its partitions at once; a level-0 member's proves
    nothing, since it keeps no lease: they start elsewhere T plus the margin after it."""
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        await cluster.create_topic("events", partitions=4)
        stays = await cluster.start_consumer("stays", group="g", topics={"events": 1})
        old: dict[str, Any] = {"level0": True, "member": StandInConsumer} if level0 else {}
        leaves = await cluster.start_consumer(
            "leaves", group="g", topics={"events": 1}, session_timeout_ms=6000, **old
        )
        await cluster.wait_stable("g", members=2)
        given_up = leaves.owned
        assert len(given_up) == 2
        left_at = trio.current_time()
        await leaves.leave()
        while not given_up <= stays.owned:
            await trio.sleep(0.01)
        waited = trio.current_time() - left_at
        await cluster.check_invariants(settled=True)
    assert waited < 0.1 if not level0 else 6.5 <= waited < 6.6


async def _refusal(tmp_path: Path, request: RegisterConsumerRequest) -> PeerError:
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        await cluster.create_topic("events", partitions=1)
        stream, _ = cluster.open_link()
        channel = Channel.open(stream, Role.CONSUMER, max_frame_size=1 << 20)
        connection = channel.connection
        with trio.fail_after(5):
            await stream.send_all(connection.send(connection.new_request(request)))
            while (event := connection.next_event()) is NEED_DATA:
                connection.receive_data(bytes(await stream.receive_some()))
            assert await stream.receive_some() == b""  # and the broker closed the connection
        assert "g" not in cluster.coordinator.groups or not cluster.coordinator.groups["g"].members
        assert isinstance(event, PeerError)
        return event


async def test_a_static_member_that_cannot_be_fenced_is_refused_by_name(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    reads = (
        ApiVersionRange(api_key=ApiKey.PING, min_version=0, max_version=1),
        ApiVersionRange(api_key=ApiKey.STOP_FETCHER, min_version=0, max_version=1),
        ApiVersionRange(api_key=ApiKey.START_FETCHER, min_version=0, max_version=2),
    )
    refusal = await _refusal(
        tmp_path, attrs.evolve(REQUEST, instance_id="s", served_versions=reads)
    )
    assert refusal.error_code is ErrorCode.UNSUPPORTED_VERSION
    assert "STOP_FETCHER version 2 or newer" in refusal.message


async def test_a_client_reading_only_versions_the_broker_lacks_is_refused(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    reads = (ApiVersionRange(api_key=ApiKey.PING, min_version=7, max_version=9),)
    refusal = await _refusal(tmp_path, attrs.evolve(REQUEST, served_versions=reads))
    assert refusal.error_code is ErrorCode.UNSUPPORTED_VERSION
    assert refusal.message == "PING: the consumer reads versions 7-9, this broker sends 0-1"


async def test_a_member_without_a_lease_is_cut_off_when_the_coordinator_may_be_deposed(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """Out of contact with its store, the coordinator renews no lease; a member that keeps none
    would fetch on while a successor counts T from taking office, so its connection ends at the
    next Ping it would have sent, and it stops. A member with a lease fetches on under it."""
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        await cluster.create_topic("events", partitions=2)
        new = await cluster.start_consumer("new", group="g", topics={"events": 1})
        old = await cluster.start_consumer(
            "old", group="g", topics={"events": 1}, level0=True, member=StandInConsumer
        )
        await cluster.wait_stable("g", members=2)
        cluster.lose_store_contact(3.0)
        with trio.fail_after(6.0 / 3):  # at the next Ping, due every T/3
            await old.fetching_state.wait_value(False)
        assert new.fetching
        registrations = old.registrations
        with trio.fail_after(30):
            while old.registrations == registrations or not old.fetching:
                await trio.sleep(0.1)
        await cluster.wait_stable("g", members=2)
        await cluster.check_invariants(settled=True)
