"""RegisterConsumer's checks (docs/design.md#generations-and-stale-offsets) and clear error
codes."""

from pathlib import Path

import pytest
import trio
import trio.testing

from coordinator.config import CoordinatorConfig
from protocol import ErrorCode
from protocol.types import Subscription, TopicStreams
from simulation import open_simulated_cluster
from tests.support.standin_consumer import StandInConsumer

CONFIG = CoordinatorConfig(initial_rebalance_delay=1.0, min_session_timeout_ms=2000)


# What the library refuses to send is sent by a client of the tests' own.
RAW = {"member": StandInConsumer}


@pytest.mark.parametrize(
    ("options", "code"),
    [
        ({"session_timeout_ms": 1999}, ErrorCode.INVALID_SESSION_TIMEOUT),
        ({"session_timeout_ms": 10_000_000}, ErrorCode.INVALID_SESSION_TIMEOUT),
        ({"auto_offset_reset": "newest", **RAW}, ErrorCode.INVALID_OFFSET_RESET),
        ({"subscription": Subscription(), **RAW}, ErrorCode.INVALID_REQUEST),
        (
            {
                "subscription": Subscription(topics=(TopicStreams(topic="events", streams=0),)),
                **RAW,
            },
            ErrorCode.INVALID_REQUEST,
        ),
    ],
    ids=["short-timeout", "long-timeout", "bad-reset", "no-topics", "zero-streams"],
)
async def test_a_bad_registration_is_refused_with_its_code(
    tmp_path: Path,
    autojump_clock: trio.testing.MockClock,
    options: dict[str, object],
    code: ErrorCode,
) -> None:
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        options.setdefault("topics", {"events": 1})
        consumer = await cluster.start_consumer("a", group="g", rejoin=False, **options)  # type: ignore[arg-type]
        assert consumer.last_register_error is code
        assert "g" not in cluster.coordinator.groups or not cluster.coordinator.groups["g"].members


async def test_a_duplicate_consumer_id_is_refused(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        first = await cluster.start_consumer("a", group="g", topics={"events": 1})
        second = await cluster.start_consumer("a", group="g", topics={"events": 1}, rejoin=False)
        assert second.last_register_error is ErrorCode.DUPLICATE_MEMBER_ID
        assert first.last_register_error is ErrorCode.NONE
        assert list(cluster.coordinator.groups["g"].members) == ["a"]


async def test_consumers_may_register_before_their_topic_exists(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        a = await cluster.start_consumer("a", group="g", topics={"later": 2})
        assert await cluster.wait_stable("g", members=1) == 1
        assert a.owned == frozenset()
        await trio.sleep(5)
        await cluster.create_topic("later", partitions=4)
        assert await cluster.wait_stable("g", members=1) == 2
        assert len(a.owned) == 4
