"""``topics delete`` on a cluster of three brokers on ZooKeeper, asked of a broker that does not
coordinate the group: the topic leaves every broker's listing, each broker removes its
partitions' files, and the group's offsets for it leave ``groups describe``. Brokers run in this
process on real ZooKeeper; the CLI runs as real processes."""

from __future__ import annotations

from pathlib import Path

import pytest

from launch.cluster import agreed_coordinator, eventually
from tests.support.node_cluster import cluster, ids
from tests.zookeeper.test_cluster_clients import CONFIG, DEADLINE, cli, cli_json

pytestmark = pytest.mark.realtime


async def test_a_topic_deleted_through_a_follower_goes_from_every_broker(
    zookeeper_hosts: str, tmp_path: Path
) -> None:
    async with cluster(zookeeper_hosts, tmp_path, CONFIG, 3) as brokers:
        coordinator_id = await agreed_coordinator(ids(brokers), group="g", deadline=DEADLINE)
        follower = next(b for b in brokers if b.broker_id != coordinator_id)
        await cli(
            follower, "topics", "create", "t", "--partitions", "6", "--replication-factor", "1"
        )
        await cli(
            follower, "topics", "create", "kept", "--partitions", "1", "--replication-factor", "1"
        )
        lines = b"".join(b"record-%d\n" % i for i in range(30))
        await cli(follower, "produce", "t", stdin=lines)
        await cli(
            follower, "consume", "t", "--group", "g", "--from-beginning", "--max-messages", "30"
        )
        partition_dirs = sorted(tmp_path.glob("broker*/log/t-*"))
        assert len(partition_dirs) == 6  # two on each broker

        assert await cli(follower, "topics", "delete", "t") == "deleted topic t\n"
        for broker in brokers:
            assert [r["topic"] for r in await cli_json(broker, "topics", "list")] == ["kept"]

        async def files_gone() -> bool:
            return not any(path.exists() for path in partition_dirs)

        await eventually(files_gone, deadline=DEADLINE)

        async def offsets_gone() -> bool:
            report = await cli_json(follower, "groups", "describe", "g")
            return not [p for p in report["partitions"] if p["committed"] is not None]

        await eventually(offsets_gone, deadline=DEADLINE)
