"""Seed 02's consumer, the predecessor the coordinator replaces: every consumer rebalances by
itself through ZooKeeper (Kafka 0.8's ``ZookeeperConsumerConnector``). A benchmark baseline only.

Each consumer registers under ``/consumers/<group>/ids/<id>`` (ephemeral) and watches the member
list and its topic's partitions. Whenever a watch fires it rebalances as the seed's steps say: stop
its fetchers, release every ownership node it holds, read the members and partitions, compute the
range assignment itself (the same ``range_assign`` the coordinator uses), and claim its share by
creating ephemeral ``/consumers/<group>/owners/<topic>/<partition>`` nodes. A claim that meets a
NodeExists (another consumer has not released it yet) fails the attempt: like Kafka 0.8, it
releases what it did claim, backs off and tries the whole rebalance again. It fetches (in this
model: holds a fetch lease in an ``OwnershipLedger``) only between a complete claim and the next
rebalance.

Every ZooKeeper request goes through the session of ``bench/seed02_session.py`` (on the store's
kazoo bridge), which counts them.
"""

from __future__ import annotations

import argparse
import json
import time

import attrs
import trio

from bench.seed02_session import ZooKeeperRebalanceSession, open_zk_rebalance_session
from protocol.types import Subscription, TopicPartition, TopicStreams
from simulation import OwnershipLedger
from statemachine.assignment import range_assign
from store import StoreUnavailable

__all__ = ["PrintingLedger", "Seed02Consumer"]


@attrs.define(eq=False)
class Seed02Consumer:
    session: ZooKeeperRebalanceSession
    consumer_id: str
    group_id: str
    topic: str
    ledger: OwnershipLedger
    #: Kafka 0.8's ``rebalance.backoff.ms`` (its default is 2 s) between failed attempts.
    backoff: float = 0.2
    #: The partitions it fetches now (empty while it rebalances).
    owned: frozenset[TopicPartition] = frozenset()
    #: The member list its current assignment was computed from.
    view: tuple[str, ...] = ()
    rebalancing: bool = True
    failed_claims: int = 0
    attempts: int = 0
    #: ``session.changes`` as it was when the last successful rebalance began to read.
    seen_changes: int = -1
    alive: bool = True

    @property
    def settled_view(self) -> bool:
        """Done rebalancing, with no watch fired since it last read the members."""
        return not self.rebalancing and self.session.changes.value == self.seen_changes

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Register, then rebalance on every watch until cancelled (the process's death)."""
        try:
            await self.session.register(self.group_id, self.consumer_id, [self.topic])
            task_status.started()
            while True:
                seen = self.session.changes.value
                await self._rebalance()
                await self.session.changes.wait_value(lambda value, seen=seen: value != seen)
        finally:
            self.stop_fetching()

    def stop_fetching(self) -> None:
        now = trio.current_time()
        for tp in self.owned:
            self.ledger.ended(self.group_id, self.consumer_id, tp, now)
        self.owned = frozenset()

    async def _rebalance(self) -> None:
        """Kafka 0.8's ``syncedRebalance``: attempts until one claims the whole share."""
        self.rebalancing = True
        while True:
            self.attempts += 1
            try:
                if await self._attempt():
                    self.rebalancing = False
                    return
            except StoreUnavailable:
                pass  # the connection was lost meanwhile: like a failed claim, try again
            await trio.sleep(self.backoff)

    async def _attempt(self) -> bool:
        # (1) stop the fetchers, (2) release every ownership
        held = self.owned
        self.stop_fetching()
        for tp in sorted(held):
            await self.session.release(self.group_id, tp.topic, tp.partition)
        # (3) every consumer computes the whole assignment from what ZooKeeper says now
        seen = self.session.changes.value
        members = await self.session.consumer_ids(self.group_id)
        if self.consumer_id not in members:
            # A new session (the old one expired): register again, as Kafka 0.8's
            # handleNewSession does, and read the members anew.
            await self.session.register(self.group_id, self.consumer_id, [self.topic])
            seen = self.session.changes.value
            members = await self.session.consumer_ids(self.group_id)
        count = await self.session.partition_count(self.topic)
        subscription = Subscription(topics=(TopicStreams(topic=self.topic, streams=1),))
        assignment = range_assign(dict.fromkeys(members, subscription), {self.topic: count})
        mine = sorted(tp for tp, t in assignment.items() if t.member_id == self.consumer_id)
        # (4) claim its share; one conflict fails the attempt
        claimed = []
        for tp in mine:
            owner = f"{self.consumer_id}-0"
            if await self.session.claim(self.group_id, tp.topic, tp.partition, owner):
                claimed.append(tp)
            else:
                self.failed_claims += 1  # Kafka 0.8 tries every claim, then undoes them
        if len(claimed) < len(mine):
            for tp in claimed:
                await self.session.release(self.group_id, tp.topic, tp.partition)
            return False
        # (5) start the fetchers
        now = trio.current_time()
        for tp in mine:
            self.ledger.began(self.group_id, self.consumer_id, tp, now)
        self.owned = frozenset(mine)
        self.view = tuple(members)
        self.seen_changes = seen
        return True


# --- one consumer as a process of its own (a benchmark pauses it with SIGSTOP) ------------------


@attrs.define
class PrintingLedger(OwnershipLedger):
    """Prints each lease's start and end as a JSON line with CLOCK_MONOTONIC, one clock for
    every process on the machine, so that the parent can merge them with its own leases."""

    def began(self, group_id: str, consumer_id: str, partition: TopicPartition, at: float) -> None:
        self._print("began", partition)

    def ended(self, group_id: str, consumer_id: str, partition: TopicPartition, at: float) -> None:
        self._print("ended", partition)

    def _print(self, event: str, partition: TopicPartition) -> None:
        at = time.monotonic()  # real-clock: compared across processes
        line = {"event": event, "partition": partition.partition, "monotonic": at}
        print(json.dumps(line), flush=True)


async def _run_one(args: argparse.Namespace) -> None:
    async with open_zk_rebalance_session(args.zookeeper, session_timeout=args.session_timeout) as s:
        consumer = Seed02Consumer(
            session=s,
            consumer_id=args.id,
            group_id=args.group,
            topic=args.topic,
            ledger=PrintingLedger(),
            backoff=args.backoff,
        )
        await consumer.run()


def main() -> None:
    parser = argparse.ArgumentParser(description="one seed-02 consumer, printing its leases")
    parser.add_argument("--zookeeper", required=True, help="HOST:PORT[,...][/chroot]")
    parser.add_argument("--group", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--id", required=True)
    parser.add_argument("--session-timeout", type=float, default=2.0)
    parser.add_argument("--backoff", type=float, default=0.2)
    trio.run(_run_one, parser.parse_args())


if __name__ == "__main__":
    main()
