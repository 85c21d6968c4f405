"""A peer that breaks the protocol is told why and closed; nobody else notices."""

import struct
from pathlib import Path

import pytest
import trio
import trio.testing

from coordinator.config import CoordinatorConfig
from protocol import Connection, ErrorCode, PeerError, Role
from simulation import open_simulated_cluster
from tests.support.standin_consumer import StandInConsumer

CONFIG = CoordinatorConfig(initial_rebalance_delay=1.0, max_frame_size=64 * 1024)


async def _error_frame(stream: trio.abc.Stream) -> PeerError | None:
    """Read what the broker says before it closes: its error frame, then end of stream."""
    connection = Connection(Role.CONSUMER)
    received = b""
    while chunk := await stream.receive_some(65536):
        received += chunk
    connection.receive_data(received)
    connection.receive_data(b"")
    event = connection.next_event()
    return event if isinstance(event, PeerError) else None


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        (b"\x00\x00\x00\x08garbage!", ErrorCode.MALFORMED_FRAME),
        (struct.pack(">i", 10 * 1024 * 1024), ErrorCode.FRAME_TOO_LARGE),
        (struct.pack(">ibhhih", 11, 0, 99, 0, 7, 0), ErrorCode.UNKNOWN_API_KEY),
    ],
    ids=["garbage", "oversized", "unknown-api-key"],
)
async def test_a_bad_frame_closes_only_that_connection(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, frame: bytes, code: ErrorCode
) -> None:
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        await cluster.create_topic("events", partitions=4)
        a = await cluster.start_consumer("a", group="g", topics={"events": 1})
        b = await cluster.start_consumer("b", group="g", topics={"events": 1})
        generation = await cluster.wait_stable("g", members=2)
        stream = await cluster.connect()
        await stream.send_all(frame)
        error = await _error_frame(stream)
        assert error is not None and error.error_code is code
        group = cluster.coordinator.groups["g"]
        assert group.machine.generation == generation
        assert set(group.members) == {"a", "b"}
        assert a.fetching and b.fetching
        await trio.sleep(30)  # pings go on; nobody rebalances
        assert group.machine.generation == generation
        cluster.ledger.check()


async def test_a_member_that_breaks_the_protocol_is_removed(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        await cluster.create_topic("events", partitions=4)
        # a writes junk on its coordinator connection: a client of the tests' own
        a = await cluster.start_consumer(
            "a", group="g", topics={"events": 1}, rejoin=False, member=StandInConsumer
        )
        b = await cluster.start_consumer("b", group="g", topics={"events": 1})
        generation = await cluster.wait_stable("g", members=2)
        assert trio.current_time() == 1.0
        assert a.channel is not None
        await a.channel.stream.send_all(b"\x00\x00\x00\x04junk")
        await cluster.wait_stable("g", members=1)
        # a may still fetch under its lease (last heard at 1.0, T = 6 s, margin 0.5 s)
        assert trio.current_time() == 7.5
        assert cluster.coordinator.groups["g"].machine.generation == generation + 1
        assert len(b.owned) == 4
        cluster.ledger.check()
