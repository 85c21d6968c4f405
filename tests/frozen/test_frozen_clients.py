"""Every level of client ever documented in SPEC.md runs a whole group against the current
broker (SPEC.md §3, docs/design.md#old-clients). Each level's client is a frozen script under
this directory, written with the standard library only and run as its own process with nothing
of this repository on its path."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from launch.processes import BrokerProcess, run_broker

pytestmark = pytest.mark.realtime

HERE = Path(__file__).resolve().parent
#: Each level's whole-group client; a fragment (``level10_configs.py``) tries one api alone.
LEVELS = sorted(path.stem for path in HERE.glob("level*.py") if path.stem[5:].isdigit())


async def run_frozen(level: str, broker: BrokerProcess, name: str) -> dict[str, object]:
    with trio.fail_after(120):
        done = await trio.run_process(
            [sys.executable, "-I", str(HERE / f"{level}.py"), f"{broker.host}:{broker.port}", name],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    assert done.returncode == 0, done.stderr.decode()[-4000:]
    result: dict[str, object] = json.loads(done.stdout.decode().splitlines()[-1])
    return result


@pytest.mark.parametrize("level", LEVELS)
async def test_a_frozen_client_runs_a_whole_group(level: str, tmp_path: Path) -> None:
    async with run_broker(tmp_path / "data", "--initial-rebalance-delay", "0.2") as broker:
        result = await run_frozen(level, broker, level)
    partitions = 4
    assert result["alone"] == partitions
    assert result["read_alone"] == 10 * partitions
    assert result["read_shared"] == 5 * partitions
    assert result["committed"] == [15] * partitions
    if "registrations" in result:  # level 1: served version 0, a's lease lapses T after it
        # registered, before the leave frees b's partitions (T and a margin after b's connection
        # ends), so a must have registered again to read them
        registrations = result["registrations"]
        assert isinstance(registrations, int)
        assert registrations >= 3
        assert result["versions_received"] == [[5, 0], [6, 0], [7, 0]]
    if "slot_holders" in result:  # level 4 on: ClusterMetadata 1, the broker holds every slot
        slot_holders = result["slot_holders"]
        assert isinstance(slot_holders, dict)
        assert slot_holders["slots"] >= 1
        assert len(slot_holders["holders"]) == 1
    if "described_hosts" in result:  # level 5 on: DescribeGroup 2 names each member's address
        assert result["described_hosts"] == {
            "state": "Stable",
            "members": {"a": partitions // 2, "b": partitions // 2},
            "hosts": {"a": True, "b": True},
        }
    if "deleted" in result:  # level 5 on: DeleteTopic 0, then again: no such topic
        assert result["deleted"] == [0, 3]
    if "topic_ids" in result:  # level 8 on: StartFetcher 3, Fetch 2, Produce 2, ClusterMetadata 2
        ids = result["topic_ids"]
        assert isinstance(ids, dict)
        # Each member was told one id for the topic, the same, and not the zero id.
        ((topic, (topic_id,)),) = ids["started"].items()
        assert ids["started_b"] == {topic: [topic_id]}
        assert topic_id != "00" * 16
        # Every one of its fetches named it and was served.
        assert ids["fetched_with_id"] >= 3 * partitions
        # ClusterMetadata 2 names the same id, and a Fetch naming another is refused
        # UNKNOWN_TOPIC_ID.
        assert ids["metadata"] == {topic: topic_id}
        assert ids["wrong_id_error"] == 100
        # Every produce named the id ClusterMetadata 2 gave and was written (the members read
        # and committed every record); one naming another is refused UNKNOWN_TOPIC_ID, and
        # writes nothing (the commits count no 16th record of partition 0).
        assert ids["produced_with_id"] == 2 * partitions
        assert ids["wrong_id_produce_error"] == 100
    if "rights" in result:  # level 9 on: users and rules over the wire
        principal, topic = f"User:{level}", f"frozen-{level}"
        rule = [principal, "topic", topic, "read"]
        assert result["rights"] == {
            "listed": [rule],
            "added": [[level, 0]],
            "described": [[level, [["SCRAM-SHA-256", 4096]]]],
            "deleted": [[level, 0], [level, 91]],  # the second time: RESOURCE_NOT_FOUND
            "removed": [rule],
            "after": [],
        }
    if "times" in result:  # level 10 on: ListOffsets 1, offsets by time
        # [error, log start, high watermark, offset, timestamp]; records stamped 1000, 1000,
        # 3000, 2000: the earliest offset that late, not the record written after that time
        assert result["times"] == {
            "0": [0, 0, 4, 0, 1000],
            "1000": [0, 0, 4, 0, 1000],
            "1500": [0, 0, 4, 2, 3000],
            "3001": [0, 0, 4, -1, -1],
            "-1": [0, 0, 4, -1, -1],  # no lookup asked
            "-2": [42, -1, -1, -1, -1],  # INVALID_REQUEST
        }
    if "throttle_hints" in result:  # level 11 on: ClusterMetadata 3, RegisterConsumer 3
        # A broker that keeps up sheds nothing: every answer read to its end, hint included,
        # and none asked to back off.
        hints = result["throttle_hints"]
        assert isinstance(hints, list)
        assert len(hints) >= 4  # a topic's id, the coordinator twice, two registrations
        assert set(hints) == {0}
    if "replication" in result:  # level 12 on: replication's versions, one replica each
        replication = result["replication"]
        assert isinstance(replication, dict)
        (broker_id,) = {leader for _, _, _, leader in replication["replicas"].values()}
        assert replication == {
            "refused_factor": 38,  # INVALID_REPLICATION_FACTOR: no replication served yet
            # each partition's sole replica leads it at epoch 0, and is its ISR
            "replicas": {str(p): [0, [broker_id], [broker_id], broker_id] for p in range(4)},
            "hints": [[broker_id, 0]],  # every Produce, Fetch and ListOffsets answer's
            "listed": [0, 0, 15],
            "newer_epoch": [75, 75],  # UNKNOWN_LEADER_EPOCH from Fetch 3 and ListOffsets 2
            "acks_0": 21,  # INVALID_REQUIRED_ACKS, nothing written (the commits count 15)
            "replica_fetch": [0, [[p, 6] for p in range(partitions)]],  # NOT_LEADER_OR_FOLLOWER
        }
    if "stop_fetcher_3" in result:  # level 13 on: StopFetcher 3, read whole
        # A broker that keeps up lets no group go: b's arrival revoked some of a's partitions
        # in a StopFetcher 3 (a rebalance's: no reason, no hint), and each member registered once.
        assert result["stop_fetcher_3"] == {"stops": [[0, 0]], "registrations": 2}
        received = result["versions_received"]
        assert isinstance(received, list)
        assert [6, 3] in received
    if "described" in result:  # level 7 on: DescribeGroup 3 names the members it awaits
        assert result["described"] == {
            "state": "Stable",
            "members": {"a": partitions // 2, "b": partitions // 2},
            "awaiting": [],
        }


async def test_a_frozen_client_sets_a_topics_settings(tmp_path: Path) -> None:
    """Level 10's CreateTopic 2 and ClusterMetadata 3 (SPEC.md §8, 10): settings kept in the
    broker's canonical order, a setting it does not know refused INVALID_CONFIG (40) with no
    topic created, and a second create TOPIC_ALREADY_EXISTS (36)."""
    async with run_broker(tmp_path / "data") as broker:
        result = await run_frozen("level10_configs", broker, "level10")
    assert result == {
        "created": 0,
        "refused": 40,
        "again": 36,
        "codes": {"level10-settings": 0, "level10-refused": 3},
        "configs": {
            "level10-settings": [["retention.ms", "86400000"], ["segment.bytes", "1048576"]]
        },
    }
