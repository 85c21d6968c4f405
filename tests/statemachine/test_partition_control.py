"""The controller's decisions (DESIGN37 §2.4 (a)-(e)): a dead leader's successor is the first
eligible in-sync replica in assignment order, a wiped disk is never elected, the last in-sync
replica stays in, unclean election only where the topic allows it, dead followers leave the ISR,
and every write is conditional on the version read."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.errors import IllegalInput
from statemachine.partition_control import (
    ControlView,
    controlled_by,
    decide,
    decide_partition,
    eligible,
)
from statemachine.partition_state import (
    NO_LEADER,
    IsrEntry,
    PartitionKey,
    PartitionState,
    StateWrite,
)

TOPIC = uuid.UUID(int=7)
KEY = PartitionKey(topic_id=TOPIC, partition=0)
DIRS = {b: uuid.UUID(int=100 + b) for b in range(1, 6)}
WIPED = {b: uuid.UUID(int=200 + b) for b in range(1, 6)}


def entries(*brokers: int) -> tuple[IsrEntry, ...]:
    return tuple(IsrEntry(broker_id=b, log_dir=DIRS[b]) for b in brokers)


def live(*brokers: int) -> dict[int, uuid.UUID]:
    return {b: DIRS[b] for b in brokers}


def state(leader: int, epoch: int, isr: Sequence[int], version: int = 4) -> PartitionState:
    return PartitionState(leader=leader, leader_epoch=epoch, isr=entries(*isr), version=version)


def one(
    st_: PartitionState | None,
    alive: Mapping[int, uuid.UUID],
    replicas: Sequence[int] = (1, 2, 3),
    *,
    unclean: bool = False,
) -> StateWrite | None:
    return decide_partition(KEY, replicas, st_, alive, unclean=unclean)


def test_a_new_partition_starts_with_its_live_replicas_in_sync_the_first_leading() -> None:
    write = one(None, live(2, 3), replicas=(1, 2, 3))
    assert write == StateWrite(
        key=KEY,
        state=PartitionState(leader=2, leader_epoch=0, isr=entries(2, 3), version=0),
        expected_version=-1,
    )
    # with no replica live it waits: an empty ISR could never elect anybody
    assert one(None, live(4, 5)) is None


def test_a_dead_leaders_successor_is_the_first_eligible_isr_member_in_assignment_order() -> None:
    read = state(leader=1, epoch=3, isr=(1, 3, 2))
    write = one(read, live(2, 3), replicas=(1, 2, 3))
    assert write == StateWrite(
        key=KEY,
        state=PartitionState(leader=2, leader_epoch=4, isr=entries(3, 2), version=5),
        expected_version=4,
    )
    # a live replica outside the ISR is passed over
    write = one(state(leader=1, epoch=3, isr=(1, 3)), live(2, 3), replicas=(1, 2, 3))
    assert write is not None and write.state.leader == 3 and write.state.isr == entries(3)


def test_a_replica_back_with_a_wiped_disk_is_never_elected() -> None:
    read = state(leader=1, epoch=3, isr=(1, 2, 3))
    wiped_two = {2: WIPED[2], 3: DIRS[3]}
    write = one(read, wiped_two)
    assert write is not None
    assert (write.state.leader, write.state.leader_epoch) == (3, 4)
    assert write.state.isr == entries(3)  # the wiped entry leaves with the dead leader
    assert not eligible(read, 2, wiped_two)
    # nobody else: no leader, and the wiped replica is not taken for the one that had the data
    write = one(state(leader=1, epoch=3, isr=(1, 2)), {2: WIPED[2]})
    assert write is not None and write.state.leader == NO_LEADER
    # a leader whose own disk was wiped is replaced as if dead
    write = one(state(leader=1, epoch=3, isr=(1, 2)), {1: WIPED[1], 2: DIRS[2]})
    assert write is not None and (write.state.leader, write.state.isr) == (2, entries(2))


def test_with_no_eligible_replica_the_partition_has_no_leader_and_keeps_its_isr() -> None:
    read = state(leader=1, epoch=3, isr=(1, 2))
    write = one(read, live(3))
    assert write is not None
    assert write.state == PartitionState(
        leader=NO_LEADER, leader_epoch=4, isr=entries(1, 2), version=5
    )
    assert write.expected_version == 4
    # nothing more to write while nobody eligible is back
    assert one(write.state, live(3)) is None


def test_a_leaderless_partition_elects_an_isr_member_that_comes_back() -> None:
    leaderless = state(leader=NO_LEADER, epoch=4, isr=(1, 2), version=5)
    write = one(leaderless, live(2, 3))
    assert write is not None
    assert write.state == PartitionState(leader=2, leader_epoch=5, isr=entries(2), version=6)
    assert write.expected_version == 5
    # the last member back on the same disk: the ISR is whole again
    write = one(leaderless, live(1, 2))
    assert write is not None and write.state.isr == entries(1, 2)


def test_unclean_election_only_where_the_topic_allows_it_and_with_an_isr_of_one() -> None:
    read = state(leader=1, epoch=3, isr=(1, 2))
    clean = one(read, live(3), unclean=False)
    assert clean is not None and clean.state.leader == NO_LEADER
    unclean = one(read, live(3), unclean=True)
    assert unclean is not None
    assert unclean.state == PartitionState(leader=3, leader_epoch=4, isr=entries(3), version=5)
    # a wiped ISR member may lead uncleanly too, under its new directory
    unclean = one(read, {2: WIPED[2]}, unclean=True)
    assert unclean is not None
    assert unclean.state.isr == (IsrEntry(broker_id=2, log_dir=WIPED[2]),)
    # an eligible ISR member is preferred all the same
    unclean = one(read, live(2, 3), unclean=True)
    assert unclean is not None and unclean.state.leader == 2


def test_dead_followers_leave_the_isr_under_the_same_epoch() -> None:
    read = state(leader=1, epoch=3, isr=(1, 2, 3))
    write = one(read, live(1, 3))
    assert write == StateWrite(
        key=KEY,
        state=PartitionState(leader=1, leader_epoch=3, isr=entries(1, 3), version=5),
        expected_version=4,
    )
    # a follower back with another directory is not the member its entry names
    write = one(read, {1: DIRS[1], 2: DIRS[2], 3: WIPED[3]})
    assert write is not None and write.state.isr == entries(1, 2)
    # everybody live and in place: nothing to write
    assert one(read, live(1, 2, 3)) is None
    # the leader alone: it stays, the last member is never removed
    assert one(state(leader=1, epoch=3, isr=(1,)), live(1)) is None


def test_a_lost_version_race_is_decided_again_on_the_state_read_again() -> None:
    """The runtime re-reads what lost and decides again: the write names the new version, and a
    leader elected by somebody else meanwhile is not replaced."""
    stale = state(leader=1, epoch=3, isr=(1, 2, 3), version=4)
    first = one(stale, live(2, 3))
    assert first is not None and first.expected_version == 4
    # meanwhile the leader (still live when it wrote) shrank its ISR to (1, 3): version 5
    reread = state(leader=1, epoch=3, isr=(1, 3), version=5)
    again = one(reread, live(2, 3))
    assert again is not None
    assert (again.state.leader, again.state.isr, again.expected_version) == (3, entries(3), 5)
    # another controller already elected 2 under epoch 4: nothing more to do
    assert one(state(leader=2, epoch=4, isr=(2, 3), version=5), live(2, 3)) is None


def test_an_assignment_must_name_each_broker_once() -> None:
    for replicas in ((), (1, 1, 2)):
        with pytest.raises(IllegalInput):
            one(state(leader=1, epoch=0, isr=(1,)), live(1), replicas=replicas)


def test_a_controller_writes_only_the_partitions_of_its_own_slot() -> None:
    keys = [PartitionKey(topic_id=TOPIC, partition=p) for p in range(40)]
    replicas = dict.fromkeys(keys, (1, 2, 3))
    by_slot: dict[int, set[PartitionKey]] = {}
    for slot in range(5):
        view = ControlView(slot=slot, slots=5, replicas=replicas, states={}, live=live(1, 2, 3))
        written = {write.key for write in decide(view)}
        assert all(controlled_by(key, slot, 5) for key in written)
        by_slot[slot] = written
    # every partition is initialized by exactly one controller
    assert sorted(k for written in by_slot.values() for k in written) == keys
    assert sum(1 for written in by_slot.values() if written) > 1


def test_unclean_election_is_per_topic() -> None:
    other = uuid.UUID(int=8)
    keys = [PartitionKey(topic_id=t, partition=0) for t in (TOPIC, other)]
    states = {key: state(leader=1, epoch=0, isr=(1,)) for key in keys}
    writes = {
        write.key.topic_id: write.state.leader
        for slot in range(2)
        for write in decide(
            ControlView(
                slot=slot,
                slots=2,
                replicas=dict.fromkeys(keys, (1, 2)),
                states=states,
                live=live(2),
                unclean=frozenset({other}),
            )
        )
    }
    assert writes == {TOPIC: NO_LEADER, other: 2}


# --- properties ------------------------------------------------------------------------------

BROKERS = st.sampled_from(range(1, 6))


@st.composite
def situations(
    draw: st.DrawFn,
) -> tuple[tuple[int, ...], PartitionState, dict[int, uuid.UUID], bool]:
    replicas = tuple(draw(st.lists(BROKERS, min_size=1, max_size=5, unique=True)))
    members = draw(st.lists(st.sampled_from(replicas), min_size=1, unique=True))
    isr = tuple(
        IsrEntry(broker_id=b, log_dir=draw(st.sampled_from((DIRS[b], WIPED[b])))) for b in members
    )
    leader = draw(st.sampled_from((NO_LEADER, *members)))
    read = PartitionState(
        leader=leader,
        leader_epoch=draw(st.integers(0, 5)),
        isr=isr,
        version=draw(st.integers(0, 5)),
    )
    alive = {
        b: draw(st.sampled_from((DIRS[b], WIPED[b]))) for b in draw(st.lists(BROKERS, unique=True))
    }
    return replicas, read, alive, draw(st.booleans())


@given(situations())
def test_no_ineligible_replica_is_elected_and_the_isr_never_empties(
    situation: tuple[tuple[int, ...], PartitionState, dict[int, uuid.UUID], bool],
) -> None:
    replicas, read, alive, unclean = situation
    write = one(read, alive, replicas, unclean=unclean)
    if write is None:
        return
    new = write.state
    assert write.expected_version == read.version and new.version == read.version + 1
    assert new.isr, "the last ISR member is never removed"
    if new.leader == NO_LEADER:
        assert new.isr == read.isr and new.leader_epoch == read.leader_epoch + 1
        return
    assert new.leader in replicas and new.leader in alive
    alone = (IsrEntry(broker_id=new.leader, log_dir=alive[new.leader]),)
    assert alone[0] in new.isr
    if read.leader != NO_LEADER and eligible(read, read.leader, alive):
        # a leader in place keeps its epoch; only dead or moved followers leave
        assert (new.leader, new.leader_epoch) == (read.leader, read.leader_epoch)
        assert set(new.isr) < set(read.isr)
    elif eligible(read, new.leader, alive):
        assert new.leader_epoch == read.leader_epoch + 1
        assert set(new.isr) <= set(read.isr)
    else:
        assert unclean and new.isr == alone and new.leader_epoch == read.leader_epoch + 1


@given(situations(), st.lists(st.lists(BROKERS, unique=True), max_size=6))
def test_a_partition_never_has_two_leaders_in_one_epoch(
    situation: tuple[tuple[int, ...], PartitionState, dict[int, uuid.UUID], bool],
    lives: list[list[int]],
) -> None:
    """Brokers die and come back in turn, the controller writing each decision: each epoch has
    one leader, and deciding again on what was written writes nothing."""
    replicas, current, alive, unclean = situation
    leaders: dict[int, int] = {current.leader_epoch: current.leader}
    for now_live in [sorted(alive), *lives]:
        view = {b: alive.get(b, DIRS[b]) for b in now_live}
        write = one(current, view, replicas, unclean=unclean)
        if write is None:
            continue
        assert write.state.leader_epoch >= current.leader_epoch
        current = write.state
        assert leaders.setdefault(current.leader_epoch, current.leader) == current.leader
        assert one(current, view, replicas, unclean=unclean) is None
