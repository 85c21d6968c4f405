"""Taking up a partition's leadership (broker/replicas.py) on in-process brokers
(tests/broker/replica_cluster.py): a broker whose log directory was wiped comes back while the
states still name it leader, under the directory the in-sync replicas vouched for; it must not
lead, and must leave its new log as it found it, so that it can follow the next leader and catch
up."""

from __future__ import annotations

import uuid
from pathlib import Path

from broker.data_plane import open_broker_log
from broker.log import FsyncPolicy, LogConfig
from protocol import ErrorCode
from tests.broker.replica_cluster import TP, open_cluster, until


async def test_a_wiped_leader_back_before_its_election_does_not_lead_and_catches_up(
    tmp_path: Path,
) -> None:
    async with open_cluster(tmp_path, [1, 2]) as cluster:
        one, two = cluster.nodes[1], cluster.nodes[2]
        cluster.store.elect(leader=2, epoch=0, isr=[2, 1])
        await cluster.start(2)
        await cluster.start(1)
        assert await two.produce(b"a") == (ErrorCode.NONE, 0)
        cluster.store.elect(leader=1, epoch=1, isr=[1, 2])
        await until(lambda: one.manager is not None and one.manager.leading(TP) is not None)
        assert await one.produce(b"b") == (ErrorCode.NONE, 1)
        # broker 1's disk is lost: it comes back with an empty one, under a new directory id,
        # while the state still names it leader under the old one
        cluster.stop(1)
        cluster.store.dirs[1] = uuid.uuid4()
        config = LogConfig(fsync=FsyncPolicy.NEVER)
        async with open_broker_log(
            cluster.store,  # type: ignore[arg-type]
            1,
            tmp_path / "broker-1-wiped",
            config,
        ) as wiped:
            one.log = wiped
            await cluster.start(1)
            assert one.manager is not None and one.manager.leading(TP) is None
            # the controller elects broker 2, the one eligible replica
            cluster.store.elect(leader=2, epoch=2, isr=[2])
            await until(lambda: TP in one.log.partitions and one.end() == 2)
            await until(lambda: cluster.store.isr() == [2, 1])
            assert await one.values() == [b"a", b"b"]
            epochs = (await one.log.partitions[TP].leader_epochs()).entries
            assert [(e.epoch, e.start_offset) for e in epochs] == [(0, 0), (1, 1)]
            cluster.stop(1)
