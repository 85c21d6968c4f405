"""A committed offset of a replicated partition is checked against its leader's high watermark,
not this broker's replica (docs/design.md#replication): a lagging local replica neither refuses
a good commit nor admits a bad one, and a leader that cannot tell makes the commit retriable."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

from coordinator.config import CoordinatorConfig
from coordinator.group_coordinator import open_group_coordinator
from coordinator.validation import LeaderUnavailable
from protocol import ErrorCode, OffsetCommitRequest
from protocol.types import BrokerInfo, PartitionOffset, TopicPartition
from store import open_embedded_store

REPLICATED = TopicPartition(topic="t", partition=0)
SINGLE = TopicPartition(topic="t", partition=1)
#: The local log ends: the replica of partition 0 here lags its leader.
LOCAL = {REPLICATED: 5, SINGLE: 5}


def commit(offsets: Mapping[TopicPartition, int]) -> OffsetCommitRequest:
    return OffsetCommitRequest(
        group_id="g",
        consumer_id=None,
        generation=-1,
        offsets=tuple(
            PartitionOffset(topic=tp.topic, partition=tp.partition, offset=offset)
            for tp, offset in offsets.items()
        ),
    )


async def test_a_commit_is_checked_against_the_leaders_high_watermark(tmp_path: Path) -> None:
    leader_reachable = True
    asked: list[dict[TopicPartition, int]] = []

    async def high_watermarks(
        offsets: Mapping[TopicPartition, int],
    ) -> Mapping[TopicPartition, int]:
        asked.append(dict(offsets))
        if not leader_reachable:
            raise LeaderUnavailable("broker 2: no answer in 2 s")
        return {REPLICATED: 10}  # partition 1 is of factor 1: checked here as always

    info = BrokerInfo(broker_id=1, host="memory", port=9092)
    async with open_embedded_store(tmp_path) as store:
        await store.register_broker(info)
        await store.create_topic("t", (1, 1))
        async with open_group_coordinator(
            store,
            CoordinatorConfig(),
            info,
            log_end=LOCAL.get,
            high_watermarks=high_watermarks,
        ) as coordinator:
            channel = cast(Any, None)  # a committer that is no member: no channel is used

            async def answer(offsets: Mapping[TopicPartition, int]) -> ErrorCode:
                return await coordinator.commit(commit(offsets), channel)

            # Above the lagging local replica, within the leader's high watermark: committed.
            assert await answer({REPLICATED: 10, SINGLE: 5}) is ErrorCode.NONE
            assert await answer({REPLICATED: 11}) is ErrorCode.OFFSET_OUT_OF_RANGE
            assert await answer({REPLICATED: 3, SINGLE: 6}) is ErrorCode.OFFSET_OUT_OF_RANGE
            leader_reachable = False
            assert await answer({REPLICATED: 3}) is ErrorCode.COORDINATOR_NOT_AVAILABLE
            assert asked[0] == {REPLICATED: 10, SINGLE: 5}
            assert dict(await coordinator.offsets.committed("g")) == {REPLICATED: 10, SINGLE: 5}
