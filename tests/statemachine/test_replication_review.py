"""Hazards found reviewing the replication path (issue 37) in the partition leader's machine,
sans-IO: what a user would see go wrong, held by a test."""

from __future__ import annotations

import uuid

from statemachine import replica_leader as rl
from statemachine.partition_state import IsrEntry, PartitionKey, PartitionState

KEY = PartitionKey(topic_id=uuid.UUID(int=7), partition=3)
DIRS = {b: uuid.UUID(int=100 + b) for b in (1, 2, 3)}
LAG = 10.0


def test_a_follower_that_keeps_up_with_a_steady_stream_stays_in_sync() -> None:
    """Under a steady stream of produces the leader's log end moves between a follower's two
    fetches, so a follower that keeps up fetches from where the log ended at its last fetch,
    rarely from the log end itself. It is caught up (Kafka's lastCaughtUpTime, credited at the
    previous fetch once the follower reached the log end of then); counting only fetches from
    the log end of now would take every follower out of the ISR after ``replica_lag``, and
    refuse acks=all (NOT_ENOUGH_REPLICAS) for as long as the stream lasts."""
    isr = tuple(IsrEntry(broker_id=b, log_dir=DIRS[b]) for b in (1, 2, 3))
    machine = rl.ReplicaLeader.elected(
        key=KEY,
        broker_id=1,
        log_dir=DIRS[1],
        replicas=(1, 2, 3),
        state=PartitionState(leader=1, leader_epoch=5, isr=isr, version=9),
        settings=rl.LeaderSettings(min_insync=2, replica_lag=LAG),
        leo=0,
        durable_end=0,
        hw=0,
        registered=DIRS,
        now=0.0,
    )
    told = {2: 0, 3: 0}  # the log end each follower was last served up to
    effects: list[rl.Effect] = []
    for step in range(1, 301):  # 30 s: a produce and a fetch by each follower every 0.1 s
        now = step / 10
        effects += machine.handle(
            rl.Appended(request=step, acks_all=False, end=step, durable_end=step)
        )
        for follower in (2, 3):
            effects += machine.handle(
                rl.FollowerFetched(
                    broker_id=follower, log_dir=DIRS[follower], fetch_offset=told[follower], now=now
                )
            )
            told[follower] = machine.leo
    assert [e for e in effects if isinstance(e, rl.WriteIsr)] == []
    assert machine.hw == 299  # one produce behind: what the followers had at their last fetch
