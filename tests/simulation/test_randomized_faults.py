"""A randomized fault schedule over 54 consumers in three groups, checked with the public invariant
checker during the faults and after every quiet period.

Each example draws the rebalance protocol, incremental (the default) or eager
(docs/design.md#rebalance), and runs a few phases. In a phase, faults start at random instants of a
10 s window and last up to 12 s: consumers are killed, frozen, slowed, dropped or cut off from the
network, or slowed and then silenced while an answer is on its way (a request got through, its
answer does not), or what is sent to them (or by them) arrives up to 6 s late, well past the lease
margin, alone or before a cut that loses their answer, or they give up a connection that lives;
topics gain partitions or a new topic appears; the coordinator restarts. Some consumers are static
members (docs/design.md#static-members): each start of one is a new process under its instance id,
and their faults include restarts (a clean stop, a kill, a kill with a reset, or a second live
process that fences the first). Every consumer fetches through a lost connection or a restart under
its lease and re-registers holding what it fetches, which a recovered group adopts
(docs/design.md#adoption-after-a-failover): each is the library's own consumer in a simulated
process; but three consumers of each group are clients of level 0 (docs/design.md#old-clients,
the tests' own old client), in the same groups: version 0 of every request, no lease,
stopped only by a StopFetcher or their connection's end, under faults within their stated
assumption. Then the faults end,
killed consumers start again, and the cluster must settle within two minutes of virtual time, after
which every subscribed partition has exactly one owner among the live members. A monitor checks the
invariants that hold at every instant (no two fetch leases at once, offsets and generations never
going backwards) every virtual second throughout.

The test drives trio itself (``trio.run`` with an autojump MockClock) because hypothesis runs the
body once per example and pytest-trio's clock fixture is created once per test.
"""

import itertools
import os
import tempfile
from pathlib import Path
from typing import Any, Literal

import attrs
import pytest
import trio
import trio.testing
from hypothesis import example, given, settings
from hypothesis import strategies as st

from coordinator.config import CoordinatorConfig, RebalanceProtocol
from protocol.types import Subscription
from simulation import SimulatedCluster, SimulatedConsumer, open_simulated_cluster
from tests.support.standin_consumer import StandInConsumer

CONFIG = CoordinatorConfig(initial_rebalance_delay=3.0, lease_margin=0.5)

#: group -> (consumers, session timeout in ms, subscription)
GROUPS = {
    "orders-app": (20, 6000, Subscription(pattern=r"orders(\..*)?", pattern_streams=1)),
    "metrics-app": (18, 3000, Subscription(pattern=r"metrics\..*", pattern_streams=1)),
    "audit-app": (
        16,
        6000,
        Subscription(pattern=r"metrics\..*", pattern_is_blacklist=True, pattern_streams=1),
    ),
}
TOPICS = {"orders": 24, "metrics.cpu": 12, "metrics.disk": 8, "payments": 10}
CONSUMERS = [
    (f"{group}-{i:02}", group) for group, (count, _, _) in GROUPS.items() for i in range(count)
]
VICTIMS = [i for i, (c, _) in enumerate(CONSUMERS) if c.endswith(("-00", "-01"))]
#: Consumers that are static members, named by their instance id; a process of one has the
#: consumer id ``<instance id>#<n>``.
STATIC = frozenset(c for c, _ in CONSUMERS if c.endswith(("-01", "-04", "-09", "-14")))
#: Consumers of SPEC.md's level 0 (docs/design.md#old-clients): version 0 of every request, no
#: lease. Their faults last at most a third of their session timeout, the assumption their
#: weaker guarantee states: each learns that its connection ended within T.
LEVEL0 = frozenset(c for c, _ in CONSUMERS if c.endswith(("-02", "-07", "-12")))
STATIC_RESTARTS: tuple[Literal["stop", "kill", "reset", "keep"], ...] = (
    "stop",
    "kill",
    "reset",
    "keep",
)
WINDOW = 10.0  # faults start within this many seconds of a phase's start
SETTLE_DEADLINE = 120.0  # virtual seconds a quiet cluster gets to settle

CONSUMER_FAULTS = (
    "kill",
    "freeze",
    "slow",
    "drop",
    "cut",
    "slow_then_freeze",
    "slow_then_cut",
    "delay",
    "delay_then_cut",
    "abandon",
    "restart_static",
)
CLUSTER_FAULTS = ("add_partitions", "create_topic", "restart")


@attrs.frozen
class Fault:
    kind: str
    at: float
    duration: float
    target: int


def _faults() -> st.SearchStrategy[Fault]:
    instant = st.integers(min_value=0, max_value=int(WINDOW * 4)).map(lambda q: q / 4)
    duration = st.integers(min_value=1, max_value=48).map(lambda q: q / 4)
    return st.builds(
        Fault,
        kind=st.sampled_from(CONSUMER_FAULTS + CLUSTER_FAULTS),
        at=instant,
        duration=duration,
        # half the faults fall on two consumers of each group, so that faults overlap on one
        # consumer (a slow answer cut off by the network, a freeze during a restart) often
        target=st.one_of(
            st.sampled_from(VICTIMS), st.integers(min_value=0, max_value=len(CONSUMERS) - 1)
        ),
    )


PHASES = st.lists(st.lists(_faults(), min_size=1, max_size=8), min_size=1, max_size=3)


def _processes(cluster: SimulatedCluster, name: str) -> list[SimulatedConsumer | StandInConsumer]:
    """The processes started for one of CONSUMERS, oldest first (one, unless static)."""
    if name not in STATIC:
        return [cluster.consumers[name]] if name in cluster.consumers else []
    return [c for c in cluster.consumers.values() if c.instance_id == name]


#: Numbers the processes of static members (unique in the run: two restarts at one instant must
#: not start two processes under one consumer id).
_PROCESS_NUMBERS = itertools.count()


def _new_process_id(name: str) -> str:
    return f"{name}#{next(_PROCESS_NUMBERS)}"


def _latest(cluster: SimulatedCluster, name: str) -> SimulatedConsumer | StandInConsumer:
    return _processes(cluster, name)[-1]


async def _start_missing(cluster: SimulatedCluster) -> None:
    for consumer_id, group in CONSUMERS:
        processes = _processes(cluster, consumer_id)
        if not processes or not processes[-1].alive:
            _, timeout_ms, subscription = GROUPS[group]
            static = consumer_id in STATIC
            # nothing is produced: fetchers asking once a second keep 54 consumers cheap
            old: dict[str, Any] = {"fetch_idle_interval": 1.0}
            if consumer_id in LEVEL0:
                old = {"member": StandInConsumer, "level0": True}
            await cluster.start_consumer(
                _new_process_id(consumer_id) if static else consumer_id,
                group=group,
                subscription=subscription,
                session_timeout_ms=timeout_ms,
                instance_id=consumer_id if static else None,
                **old,
            )


async def _consumer_fault(cluster: SimulatedCluster, fault: Fault) -> None:
    await trio.sleep(fault.at)
    name, group = CONSUMERS[fault.target]
    consumer = _latest(cluster, name)
    if name in LEVEL0:
        third = GROUPS[group][1] / 3000
        fault = attrs.evolve(fault, duration=min(fault.duration, third))
    match fault.kind:
        case "restart_static":
            # a static member's process ends (or not: a second one fences it) and a new one
            # registers under its instance id
            static = sorted(STATIC)
            name = static[fault.target % len(static)]
            consumer = _latest(cluster, name)
            end = STATIC_RESTARTS[int(fault.at * 4) % len(STATIC_RESTARTS)]
            await cluster.restart_consumer(
                consumer, _new_process_id(name), end=end, down_for=fault.duration / 4
            )
        case "kill":
            await consumer.kill()
        case "freeze":
            consumer.freeze(fault.duration)
        case "drop":
            consumer.drop_connection()
        case "abandon":
            # it takes a live coordinator for silent and registers again, fetching on
            consumer.abandon_connection()
        case "cut":
            consumer.cut_network(fault.duration)
        case "slow":
            consumer.answer_slowly(fault.duration / 8)
            await trio.sleep(fault.duration)
            consumer.answer_slowly(0.0)
        case "slow_then_freeze" | "slow_then_cut":
            # answers that take a while, then silence while one may be on its way: the request
            # got through, its answer does not
            consumer.answer_slowly(0.25 + (fault.target % 6) / 4)
            await trio.sleep(fault.at % 2)
            if fault.kind == "slow_then_freeze":
                consumer.freeze(fault.duration)
            else:
                consumer.cut_network(fault.duration)
            await trio.sleep(fault.duration)
            consumer.answer_slowly(0.0)
        case "delay":
            # bytes late by 1/8 s to 6 s (the lease margin is 0.5 s), towards the consumer, the
            # broker or both
            towards = fault.target % 3
            consumer.delay_delivery(
                fault.duration / 2, to_consumer=towards != 1, to_broker=towards != 0
            )
        case "delay_then_cut":
            # requests arrive late, and the answer to the first of them is lost: a lease renewed
            # by their arrival would outlast the coordinator's count
            delay = fault.duration / 2
            consumer.answer_slowly(0.5)
            consumer.delay_delivery(delay)
            await trio.sleep(delay + 0.25)
            consumer.cut_network(fault.duration)
            await trio.sleep(fault.duration)
            consumer.answer_slowly(0.0)


async def _cluster_faults(cluster: SimulatedCluster, faults: list[Fault], phase: int) -> None:
    """Topic changes and restarts, one at a time: each needs the coordinator up."""
    start = trio.current_time()
    for n, fault in enumerate(sorted(faults, key=lambda f: f.at)):
        await trio.sleep_until(start + fault.at)
        match fault.kind:
            case "add_partitions":
                topics = sorted(TOPICS)
                topic = topics[fault.target % len(topics)]
                await cluster.add_partitions(topic, added=1 + fault.target % 3)
            case "create_topic":
                # a new topic for the whitelist or for the blacklist's complement, in turn
                name = ("metrics.new", "orders.new", "refunds")[fault.target % 3]
                await cluster.create_topic(f"{name}{phase}x{n}", partitions=2 + fault.target % 4)
            case "restart":
                await cluster.restart_coordinator(down_for=fault.duration / 4)


async def _monitor(cluster: SimulatedCluster) -> None:
    while True:
        await trio.sleep(1.0)
        await cluster.check_invariants()


async def _scenario(data_dir: Path, phases: list[list[Fault]], protocol: RebalanceProtocol) -> None:
    config = attrs.evolve(CONFIG, rebalance_protocol=protocol)
    async with open_simulated_cluster(data_dir, config) as cluster:
        for topic, partitions in TOPICS.items():
            await cluster.create_topic(topic, partitions=partitions)
        with trio.fail_after(SETTLE_DEADLINE):
            await _start_missing(cluster)
            await cluster.wait_settled()
        await cluster.check_invariants(settled=True)
        async with trio.open_nursery() as monitors:
            monitors.start_soon(_monitor, cluster)
            for phase, faults in enumerate(phases):
                async with trio.open_nursery() as nursery:
                    cluster_faults = [f for f in faults if f.kind in CLUSTER_FAULTS]
                    nursery.start_soon(_cluster_faults, cluster, cluster_faults, phase)
                    for fault in faults:
                        if fault.kind in CONSUMER_FAULTS:
                            nursery.start_soon(_consumer_fault, cluster, fault)
                # quiet: every fault has ended
                await trio.sleep(max(f.duration for f in faults))
                with trio.fail_after(SETTLE_DEADLINE):
                    await _start_missing(cluster)
                    await cluster.wait_settled()
                await cluster.check_invariants(settled=True)
            monitors.cancel_scope.cancel()
        assert len([c for c in cluster.consumers.values() if c.alive]) == len(CONSUMERS)
        assert all(_latest(cluster, name).alive for name, _ in CONSUMERS)


# The CI profile's 60 examples of up to three phases would take over a minute; 40 take ~50 s and
# mix every fault kind with every other. Examples that once broke an invariant run every time.
# Outside CI, run far more after a change to leases, deaths or ownership: FAULT_EXAMPLES=2000
# (the two-owner bugs were found by long runs, never by CI's few). A long run is bounded by its
# examples, not by the suite's per-test timeout, which it would outlast.
EXAMPLES = int(os.environ.get("FAULT_EXAMPLES", "40"))
if "FAULT_EXAMPLES" in os.environ:
    pytestmark = pytest.mark.timeout(0)


@settings(max_examples=EXAMPLES)
@given(phases=PHASES, protocol=st.sampled_from(list(RebalanceProtocol)))
# A consumer paused while its connection is reset: the coordinator took the reset for the
# consumer's own close and moved its partitions while it still fetched (found with 100 random
# examples, not by CI's derandomized ones).
@example(
    phases=[
        [Fault(kind="kill", at=0.0, duration=0.25, target=0)],
        [
            Fault(kind="kill", at=0.0, duration=0.25, target=0),
            Fault(kind="drop", at=4.0, duration=0.25, target=1),
            Fault(kind="slow_then_freeze", at=3.0, duration=0.25, target=1),
        ],
    ],
    protocol=RebalanceProtocol.EAGER,
)
# Pings delivered 2.5 s late, the answer to the first one lost to a cut: a lease counted from
# their arrival outlasted the coordinator's count by 0.25 s (found with 64 random examples).
@example(
    phases=[[Fault(kind="delay_then_cut", at=0.0, duration=5.0, target=0)]],
    protocol=RebalanceProtocol.INCREMENTAL,
)
# A recovered group adopted a member its record gave nothing, whose lease had run out meanwhile:
# stopped, it waited for a start that never came, and the group never settled (found with 40
# random examples).
@example(
    phases=[
        [
            Fault(kind="kill", at=6.0, duration=2.5, target=0),
            Fault(kind="kill", at=0.0, duration=4.75, target=21),
            Fault(kind="kill", at=6.25, duration=4.5, target=0),
            Fault(kind="restart", at=0.0, duration=11.75, target=0),
            Fault(kind="kill", at=0.0, duration=11.5, target=0),
            Fault(kind="kill", at=10.0, duration=3.75, target=42),
            Fault(kind="slow", at=1.25, duration=11.5, target=12),
        ],
        [
            Fault(kind="create_topic", at=10.0, duration=10.25, target=20),
            Fault(kind="kill", at=0.5, duration=9.0, target=51),
        ],
        [
            Fault(kind="kill", at=5.25, duration=6.75, target=1),
            Fault(kind="restart", at=7.75, duration=2.0, target=52),
            Fault(kind="drop", at=4.25, duration=8.25, target=7),
            Fault(kind="create_topic", at=6.75, duration=6.75, target=34),
            Fault(kind="abandon", at=8.75, duration=11.5, target=21),
            Fault(kind="create_topic", at=9.75, duration=6.25, target=20),
        ],
    ],
    protocol=RebalanceProtocol.EAGER,
)
# A consumer fetching through a restart froze before it registered again and stayed frozen past
# its lease: the simulated consumer kept its fetch lease open until it woke, after the new
# coordinator had (rightly) started its partitions elsewhere (found with 149 random examples; it
# shows on some of trio's schedules only).
@example(
    phases=[
        [
            Fault(kind="kill", at=0.0, duration=0.25, target=0),
            Fault(kind="kill", at=0.0, duration=0.25, target=0),
            Fault(kind="restart", at=7.0, duration=11.75, target=0),
            Fault(kind="kill", at=0.0, duration=0.25, target=0),
            Fault(kind="kill", at=0.0, duration=0.25, target=0),
            Fault(kind="restart", at=0.0, duration=4.0, target=0),
            Fault(kind="freeze", at=9.0, duration=10.25, target=39),
        ]
    ],
    protocol=RebalanceProtocol.EAGER,
)
# A static member restarted while the coordinator was down: the simulated consumer's start gave
# up before it had registered, and starting it failed (found in CI's stored example).
@example(
    phases=[
        [Fault(kind="kill", at=0.0, duration=0.25, target=0)],
        [
            Fault(kind="kill", at=0.0, duration=0.25, target=0),
            Fault(kind="kill", at=0.0, duration=0.25, target=0),
            Fault(kind="restart_static", at=5.5, duration=0.25, target=39),
            Fault(kind="kill", at=0.0, duration=0.25, target=0),
            Fault(kind="restart_static", at=7.0, duration=0.25, target=39),
            Fault(kind="restart", at=3.25, duration=11.0, target=0),
        ],
    ],
    protocol=RebalanceProtocol.INCREMENTAL,
)
# A static member stopped for a restart while it looked for a coordinator that was down: the
# simulated consumer's stop committed over a fresh connection, which the cluster refused (found
# with 300 random examples).
@example(
    phases=[
        [
            Fault(kind="kill", at=7.75, duration=4.5, target=0),
            Fault(kind="kill", at=4.75, duration=5.75, target=0),
            Fault(kind="kill", at=0.0, duration=0.5, target=0),
            Fault(kind="kill", at=0.0, duration=4.5, target=0),
            Fault(kind="kill", at=0.0, duration=4.25, target=0),
        ],
        [
            Fault(kind="add_partitions", at=0.0, duration=12.0, target=0),
            Fault(kind="restart", at=3.0, duration=11.0, target=0),
            Fault(kind="restart_static", at=7.0, duration=3.25, target=19),
            Fault(kind="restart", at=7.75, duration=1.5, target=13),
            Fault(kind="abandon", at=7.0, duration=6.25, target=23),
            Fault(kind="kill", at=4.25, duration=4.25, target=2),
            Fault(kind="delay", at=0.0, duration=5.5, target=0),
            Fault(kind="restart", at=6.75, duration=8.75, target=24),
        ],
        [
            Fault(kind="restart", at=7.75, duration=7.25, target=24),
            Fault(kind="restart", at=1.5, duration=3.75, target=1),
            Fault(kind="add_partitions", at=7.75, duration=0.5, target=20),
            Fault(kind="cut", at=5.0, duration=9.75, target=35),
            Fault(kind="drop", at=4.0, duration=8.75, target=1),
        ],
    ],
    protocol=RebalanceProtocol.INCREMENTAL,
)
def test_random_faults_keep_every_invariant(
    phases: list[list[Fault]], protocol: RebalanceProtocol
) -> None:
    with tempfile.TemporaryDirectory() as data_dir:
        trio.run(
            _scenario,
            Path(data_dir),
            phases,
            protocol,
            clock=trio.testing.MockClock(autojump_threshold=0),
        )
