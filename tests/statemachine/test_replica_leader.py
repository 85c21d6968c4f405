"""A partition leader's high watermark, ISR changes and acks=all answers (DESIGN37 §2.4): the high
watermark counts every member of the largest ISR that may be in force (KIP-497) and only rises,
a shrink counts until the store confirms it, acks=all is refused before anything is written when
the ISR is too small, and answered NOT_ENOUGH_REPLICAS_AFTER_APPEND when it shrinks below min."""

from __future__ import annotations

import copy
import uuid

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.errors import ErrorCode, IllegalInput
from statemachine import replica_leader as rl
from statemachine.partition_state import (
    NO_LEADER,
    IsrEntry,
    PartitionKey,
    PartitionState,
    ReplicationCode,
    StateWrite,
)
from statemachine.table import IllegalTransition

KEY = PartitionKey(topic_id=uuid.UUID(int=7), partition=3)
DIRS = {b: uuid.UUID(int=100 + b) for b in (1, 2, 3)}
WIPED = {b: uuid.UUID(int=200 + b) for b in (1, 2, 3)}
LAG = 10.0
S = rl.LeaderPhase


def entries(*brokers: int) -> tuple[IsrEntry, ...]:
    return tuple(IsrEntry(broker_id=b, log_dir=DIRS[b]) for b in brokers)


def leader(isr: tuple[int, ...] = (1, 2, 3), min_insync: int = 2, leo: int = 0) -> rl.ReplicaLeader:
    state = PartitionState(leader=1, leader_epoch=5, isr=entries(*isr), version=9)
    return rl.ReplicaLeader.elected(
        key=KEY,
        broker_id=1,
        log_dir=DIRS[1],
        replicas=(1, 2, 3),
        state=state,
        settings=rl.LeaderSettings(min_insync=min_insync, replica_lag=LAG),
        leo=leo,
        durable_end=leo,
        hw=leo,
        registered=DIRS,
        now=0.0,
    )


def fetched(broker: int, offset: int, now: float = 1.0, wiped: bool = False) -> rl.FollowerFetched:
    log_dir = WIPED[broker] if wiped else DIRS[broker]
    return rl.FollowerFetched(broker_id=broker, log_dir=log_dir, fetch_offset=offset, now=now)


def produce(machine: rl.ReplicaLeader, request: int, end: int) -> list[rl.Effect]:
    """An acks=all produce appended up to ``end``: what it was answered, if anything."""
    effects = machine.handle(rl.ProduceAsked(request=request, acks_all=True))
    if effects != [rl.MayAppend(request=request)]:
        return effects
    return machine.handle(rl.Appended(request=request, acks_all=True, end=end, durable_end=end))


def ok(request: int) -> rl.Answered:
    return rl.Answered(request=request, code=ErrorCode.NONE)


def write_of(effects: list[rl.Effect]) -> StateWrite:
    (effect,) = [e for e in effects if isinstance(e, rl.WriteIsr)]
    return effect.write


def test_acks_all_is_answered_when_every_isr_member_has_the_records() -> None:
    machine = leader()
    assert produce(machine, 1, end=10) == []
    assert machine.handle(fetched(2, 10)) == []
    assert machine.hw == 0  # broker 3 has not fetched in this epoch: it holds the high watermark
    assert machine.handle(fetched(3, 6)) == []
    assert machine.hw == 6
    assert machine.handle(fetched(3, 10)) == [ok(1)]
    assert (machine.hw, machine.waiting()) == (10, ())
    # acks=1 is answered on the append
    machine.handle(rl.ProduceAsked(request=2, acks_all=False))
    assert machine.handle(rl.Appended(request=2, acks_all=False, end=12, durable_end=12)) == [ok(2)]


def test_the_leaders_own_durable_end_holds_the_high_watermark() -> None:
    machine = leader(isr=(1,), min_insync=1)
    machine.handle(rl.ProduceAsked(request=1, acks_all=True))
    assert machine.handle(rl.Appended(request=1, acks_all=True, end=5, durable_end=0)) == []
    assert machine.hw == 0
    assert machine.handle(rl.Flushed(durable_end=5)) == [ok(1)]
    assert machine.hw == 5


def test_acks_all_below_min_insync_is_refused_with_nothing_written() -> None:
    machine = leader(isr=(1,), min_insync=2)
    before = copy.deepcopy(machine)
    refused = machine.handle(rl.ProduceAsked(request=1, acks_all=True))
    assert refused == [rl.Answered(request=1, code=ReplicationCode.NOT_ENOUGH_REPLICAS)]
    assert ReplicationCode.NOT_ENOUGH_REPLICAS.value == 19
    assert machine == before
    # acks=1 knows no min.insync.replicas
    assert machine.handle(rl.ProduceAsked(request=2, acks_all=False)) == [rl.MayAppend(request=2)]


def test_a_shrink_counts_until_the_store_confirms_it() -> None:
    machine = leader()
    machine.handle(fetched(2, 0, now=1.0))
    machine.handle(fetched(3, 0, now=1.0))
    assert produce(machine, 1, end=10) == []
    machine.handle(fetched(2, 10, now=2.0))
    # broker 3 falls behind for longer than replica_lag: the leader writes the ISR without it
    effects = machine.handle(rl.Tick(now=1.0 + LAG + 0.5))
    write = write_of(effects)
    assert write.state.isr == entries(1, 2) and write.expected_version == 9
    assert write.state.leader_epoch == 5
    assert machine.phase is S.CHANGING
    # the removal is not confirmed: broker 3 still holds the high watermark, nothing acknowledged
    assert machine.hw == 0 and machine.waiting() == (1,)
    # with the change in flight, acks=all is refused if it would leave too few (min 3 here)
    strict = leader(min_insync=3)
    strict.handle(fetched(2, 0, now=1.0))
    strict.handle(fetched(3, 0, now=1.0))
    write_of(strict.handle(rl.Tick(now=1.0 + LAG + 0.5)))
    assert strict.handle(rl.ProduceAsked(request=9, acks_all=True)) == [
        rl.Answered(request=9, code=ReplicationCode.NOT_ENOUGH_REPLICAS)
    ]
    # confirmed: the ISR is (1, 2), both have the records
    assert machine.handle(rl.IsrWritten()) == [ok(1)]
    assert (machine.isr, machine.version, machine.hw, machine.phase) == (
        entries(1, 2),
        10,
        10,
        S.STEADY,
    )


def test_a_shrink_below_min_insync_answers_the_waiting_produces_20() -> None:
    machine = leader(isr=(1, 2), min_insync=2)
    machine.handle(fetched(2, 0, now=1.0))
    assert produce(machine, 1, end=4) == []
    write_of(machine.handle(rl.Tick(now=LAG + 2)))
    assert machine.waiting() == (1,)
    after_append = ReplicationCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND
    assert after_append.value == 20
    assert machine.handle(rl.IsrWritten()) == [rl.Answered(request=1, code=after_append)]
    # an append that finds the ISR below min meanwhile is answered 20 at once
    machine = leader(isr=(1, 2), min_insync=2)
    assert machine.handle(rl.ProduceAsked(request=2, acks_all=True)) == [rl.MayAppend(request=2)]
    seen = PartitionState(leader=1, leader_epoch=5, isr=entries(1), version=10)
    assert machine.handle(rl.StateSeen(state=seen)) == []  # the controller removed broker 2
    assert machine.handle(rl.Appended(request=2, acks_all=True, end=3, durable_end=3)) == [
        rl.Answered(request=2, code=ReplicationCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND)
    ]


def test_a_follower_fetching_from_a_wiped_disk_leaves_the_isr_and_holds_the_hw_meanwhile() -> None:
    machine = leader(leo=20)
    machine.handle(rl.Appended(request=1, acks_all=False, end=30, durable_end=30))
    machine.handle(fetched(2, 30, now=1.0))
    effects = machine.handle(fetched(3, 30, now=1.0, wiped=True))
    assert write_of(effects).state.isr == entries(1, 2)
    # broker 3's entry names its old disk: what its new disk has vouches for nothing
    assert machine.hw == 20
    machine.handle(rl.IsrWritten())
    assert machine.hw == 30


def test_a_caught_up_replica_rejoins_under_the_directory_it_fetches_from() -> None:
    machine = leader(isr=(1, 2), leo=8)
    machine.handle(fetched(2, 8, now=1.0))
    assert machine.hw == 8
    machine.handle(rl.Appended(request=1, acks_all=False, end=12, durable_end=12))
    # from a directory its broker has not registered (a process the store does not know)
    assert machine.handle(fetched(3, 12, now=2.0, wiped=True)) == []
    assert machine.handle(rl.BrokersSeen(registered={**DIRS, 3: WIPED[3]})) == []
    # behind the high watermark: not yet
    assert machine.handle(fetched(3, 7, now=2.0, wiped=True)) == []
    effects = machine.handle(fetched(3, 12, now=3.0, wiped=True))
    write = write_of(effects)
    assert write.state.isr == (*entries(1, 2), IsrEntry(broker_id=3, log_dir=WIPED[3]))
    # an addition counts at once: it can only hold the high watermark back
    assert machine.maximal_isr == write.state.isr
    assert machine.hw == 8
    machine.handle(fetched(2, 12, now=3.0))
    assert machine.hw == 12


def test_a_lost_race_reads_the_state_again_and_decides_anew() -> None:
    machine = leader()
    machine.handle(fetched(2, 0, now=1.0))
    machine.handle(fetched(3, 0, now=1.0))
    write_of(machine.handle(rl.Tick(now=LAG + 5)))
    assert machine.handle(rl.IsrWriteLost()) == [rl.ReadState(key=KEY)]
    assert machine.phase is S.REREADING
    # the controller removed broker 3 first (it died): the same leader, a later version
    read = PartitionState(leader=1, leader_epoch=5, isr=entries(1, 2), version=10)
    assert machine.handle(rl.StateRead(state=read)) == []
    assert (machine.phase, machine.isr, machine.version, machine.pending) == (
        S.STEADY,
        entries(1, 2),
        10,
        None,
    )
    # the next change names the version read
    machine.handle(fetched(2, 0, now=LAG + 6))
    assert write_of(machine.handle(rl.Tick(now=2 * LAG + 7))).expected_version == 10


def test_another_leader_or_epoch_ends_the_leadership_and_its_waiting_produces() -> None:
    machine = leader()
    produce(machine, 1, end=3)
    old = PartitionState(leader=2, leader_epoch=4, isr=entries(1, 2), version=8)
    assert machine.handle(rl.StateSeen(state=old)) == []  # old news
    newer = PartitionState(leader=2, leader_epoch=6, isr=entries(2, 3), version=10)
    assert machine.handle(rl.StateSeen(state=newer)) == [
        rl.Answered(request=1, code=ReplicationCode.NOT_LEADER_OR_FOLLOWER),
        rl.Resigned(key=KEY, state=newer),
    ]
    assert machine.phase is S.RESIGNED
    assert machine.handle(rl.StateSeen(state=newer)) == []
    with pytest.raises(IllegalTransition):
        machine.handle(rl.ProduceAsked(request=2, acks_all=False))
    # the state read after a lost race may depose it too
    machine = leader()
    machine.handle(fetched(2, 0, now=1.0))
    machine.handle(fetched(3, 0, now=1.0))
    machine.handle(rl.Tick(now=LAG + 5))
    machine.handle(rl.IsrWriteLost())
    gone = PartitionState(leader=NO_LEADER, leader_epoch=6, isr=entries(1), version=10)
    assert machine.handle(rl.StateRead(state=gone)) == [rl.Resigned(key=KEY, state=gone)]


def test_an_expired_produce_is_answered_timed_out_once() -> None:
    machine = leader()
    produce(machine, 1, end=3)
    assert machine.handle(rl.ProduceExpired(request=1)) == [
        rl.Answered(request=1, code=ErrorCode.REQUEST_TIMED_OUT)
    ]
    assert machine.handle(rl.ProduceExpired(request=1)) == []


def test_an_illegal_input_raises_and_changes_nothing() -> None:
    machine = leader(leo=5)
    before = copy.deepcopy(machine)
    for event in (
        rl.IsrWritten(),
        rl.IsrWriteLost(),
        rl.StateRead(state=PartitionState(leader=1, leader_epoch=5, isr=entries(1), version=9)),
        rl.Appended(request=1, acks_all=False, end=4, durable_end=4),
        rl.Flushed(durable_end=6),
    ):
        with pytest.raises(IllegalInput):
            machine.handle(event)
        assert machine == before
    with pytest.raises(IllegalInput):
        leader(isr=(2, 3))  # a state that does not name it leader


def in_phase(phase: rl.LeaderPhase) -> rl.ReplicaLeader:
    """A leader of (1, 2, 3) whose followers caught up at 1.0, brought into ``phase``."""
    machine = leader(leo=4)
    machine.handle(fetched(2, 4, now=1.0))
    machine.handle(fetched(3, 4, now=1.0))
    if phase is S.RESIGNED:
        machine.handle(rl.StateSeen(state=other_leader(machine)))
    elif phase is not S.STEADY:
        machine.handle(rl.Tick(now=LAG + 5))  # both followers lag: a shrink in flight
        if phase is S.REREADING:
            machine.handle(rl.IsrWriteLost())
    assert machine.phase is phase
    return machine


def other_leader(machine: rl.ReplicaLeader) -> PartitionState:
    return PartitionState(leader=2, leader_epoch=6, isr=entries(2), version=machine.version + 1)


def event_for(machine: rl.ReplicaLeader, event_type: type, guard: str | None) -> rl.Event:
    """An input of ``event_type`` for which ``guard`` holds in ``machine``."""
    same = PartitionState(leader=1, leader_epoch=5, isr=machine.isr, version=machine.version)
    late = LAG + 5  # follower 3 (and 2) last caught up at 1.0: too long ago by then
    events: dict[tuple[type, str | None], rl.Event] = {
        (rl.ProduceAsked, None): rl.ProduceAsked(request=1, acks_all=False),
        (rl.Appended, None): rl.Appended(
            request=1, acks_all=False, end=machine.leo + 1, durable_end=machine.leo
        ),
        (rl.Flushed, None): rl.Flushed(durable_end=machine.leo),
        (rl.ProduceExpired, None): rl.ProduceExpired(request=1),
        (rl.StateSeen, "deposed"): rl.StateSeen(state=other_leader(machine)),
        (rl.StateSeen, "still leading"): rl.StateSeen(state=same),
        (rl.StateSeen, None): rl.StateSeen(state=same),
        (rl.FollowerFetched, "proposes a change"): fetched(2, 4, now=late),
        (rl.FollowerFetched, "nothing to change"): fetched(2, 4, now=2.0),
        (rl.FollowerFetched, None): fetched(2, 4, now=2.0),
        (rl.Tick, "proposes a change"): rl.Tick(now=late),
        (rl.Tick, "nothing to change"): rl.Tick(now=2.0),
        (rl.Tick, None): rl.Tick(now=2.0),
        (rl.IsrWritten, None): rl.IsrWritten(),
        (rl.BrokersSeen, None): rl.BrokersSeen(registered=DIRS),
        (rl.IsrWriteLost, None): rl.IsrWriteLost(),
        (rl.StateRead, "deposed"): rl.StateRead(state=other_leader(machine)),
        (rl.StateRead, "still leading"): rl.StateRead(
            state=attrs.evolve(same, version=machine.version + 1)
        ),
    }
    return events[(event_type, guard)]


def test_the_leader_lands_where_its_table_says_for_every_outcome() -> None:
    for entry in rl.TABLE.entries():
        machine = in_phase(entry.source)
        event = event_for(machine, entry.event_type, entry.guard)
        assert rl.TABLE.lookup(machine.phase, event, machine) == entry
        machine.handle(event)
        assert machine.phase is entry.target, entry


def test_an_input_its_phase_does_not_take_raises_and_changes_nothing() -> None:
    for phase in S:
        for event_type in rl.TABLE.inputs():
            if rl.TABLE.allows(phase, event_type):
                continue
            machine = in_phase(phase)
            before = copy.deepcopy(machine)
            guard = "deposed" if event_type is rl.StateRead else None
            with pytest.raises(IllegalTransition):
                machine.handle(event_for(machine, event_type, guard))
            assert machine == before


# --- a property: the high watermark never passes what the ISR in force has --------------------


ONCE_IN_4 = (False, False, False, True)


@st.composite
def steps(draw: st.DrawFn) -> list[tuple[str, int, int, bool]]:
    kinds = st.sampled_from(
        ("append", "append", "flush", "fetch", "fetch", "fetch", "tick", "win", "lose", "shrink")
    )
    return draw(
        st.lists(
            st.tuples(
                kinds, st.sampled_from((2, 3)), st.integers(0, 8), st.sampled_from(ONCE_IN_4)
            ),
            min_size=15,
            max_size=60,
        )
    )


@given(steps(), st.integers(1, 3))
def test_the_high_watermark_never_passes_an_isr_that_may_be_in_force(
    plan: list[tuple[str, int, int, bool]], min_insync: int
) -> None:
    """Random appends, fetches (sometimes from a wiped disk), ticks, store answers and
    controller shrinks: the high watermark only rises, never to past what any member of the
    store's ISR (or of the change in flight, which may have happened) durably has then, and a
    produce is acknowledged only below it, with at least min.insync.replicas in the ISR."""
    machine = leader(min_insync=min_insync)
    store = PartitionState(leader=1, leader_epoch=5, isr=machine.isr, version=machine.version)
    has: dict[IsrEntry, int] = {entry: 0 for entry in machine.isr}  # durable end per replica
    now, request, hw = 0.0, 0, 0
    ends: dict[int, int] = {}

    def holds(isr: tuple[IsrEntry, ...]) -> int:
        return min((machine.durable_end if e.broker_id == 1 else has.get(e, 0)) for e in isr)

    for kind, broker, amount, flag in plan:
        effects: list[rl.Effect] = []
        if machine.phase is S.RESIGNED:
            break
        if kind == "append":
            request += 1
            ends[request] = machine.leo + amount
            effects = produce(machine, request, ends[request])
        elif kind == "flush":
            effects = machine.handle(rl.Flushed(durable_end=machine.leo))
        elif kind == "fetch":
            log_dir = WIPED[broker] if flag else DIRS[broker]
            had = has.get(IsrEntry(broker_id=broker, log_dir=log_dir), 0)
            # mostly forward, to the end at times, back when it truncated
            offset = machine.leo if amount > 6 else max(0, min(machine.leo, had + amount - 1))
            for other in (DIRS[broker], WIPED[broker]):
                if other != log_dir:
                    has.pop(IsrEntry(broker_id=broker, log_dir=other), None)  # the disk moved
            has[IsrEntry(broker_id=broker, log_dir=log_dir)] = offset
            now += 0.5
            machine.handle(rl.BrokersSeen(registered={**machine.registered, broker: log_dir}))
            effects = machine.handle(
                rl.FollowerFetched(broker_id=broker, log_dir=log_dir, fetch_offset=offset, now=now)
            )
        elif kind == "tick":
            now += amount * LAG / 6
            effects = machine.handle(rl.Tick(now=now))
        elif kind in ("win", "lose") and machine.phase is S.CHANGING:
            assert machine.pending is not None
            if kind == "win" and machine.pending.expected_version == store.version:
                store = PartitionState(
                    leader=1, leader_epoch=5, isr=machine.pending.isr, version=store.version + 1
                )
                effects = machine.handle(rl.IsrWritten())
            else:
                effects = machine.handle(rl.IsrWriteLost())
        elif kind in ("win", "lose") and machine.phase is S.REREADING:
            effects = machine.handle(rl.StateRead(state=store))
        elif kind == "shrink":  # the controller takes a dead follower out
            isr = tuple(e for e in store.isr if e.broker_id != broker)
            if isr != store.isr:
                store = attrs.evolve(store, isr=isr, version=store.version + 1)
                if flag:
                    effects = machine.handle(rl.StateSeen(state=store))
        in_force = [store.isr] + ([machine.pending.isr] if machine.pending else [])
        assert machine.hw >= hw
        # The claim is made when it rises: a replica that loses records later (a wiped disk,
        # an unflushed tail lost in a crash) does not make an earlier rise wrong.
        if machine.hw > hw:
            assert all(machine.hw <= holds(isr) for isr in in_force)
        hw = machine.hw
        for effect in effects:
            if isinstance(effect, rl.WriteIsr):  # a replica joins with every covered record
                joining = set(effect.write.state.isr) - set(machine.isr)
                assert all(has.get(entry, 0) >= machine.hw for entry in joining)
            if isinstance(effect, rl.Answered) and effect.code is ErrorCode.NONE:
                assert ends[effect.request] <= machine.hw
                assert len(machine.isr) >= min_insync
