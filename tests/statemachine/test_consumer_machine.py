"""The consumer client's machine: its table cell by cell, its lease, its epoch guard, and a
random walk that checks the safety rules of the ownership lease (docs/design.md#ownership-lease)
on the effects it emits."""

from __future__ import annotations

import math
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.errors import ErrorCode
from protocol.messages import AssignedPartition, AssignedStream
from protocol.types import BrokerInfo, TopicPartition
from statemachine.consumer import (
    TABLE,
    UNKNOWN_EPOCH,
    Close,
    CloseConnection,
    CommitAndLeave,
    ConnectionLost,
    ConsumerConfig,
    ConsumerMachine,
    ConsumerState,
    CoordinatorFound,
    CoordinatorMoved,
    Discover,
    DiscoveryFailed,
    Effect,
    Fenced,
    Ignored,
    Input,
    LeaseExpired,
    PingReceived,
    Register,
    Registered,
    RegistrationRejected,
    RespondPing,
    RespondStart,
    RespondStop,
    Start,
    StartFetcherReceived,
    StartFetchers,
    StopFetcherReceived,
    StopFetchers,
)
from statemachine.table import IllegalTransition

S = ConsumerState
T = 6.0
OLD = BrokerInfo(broker_id=1, host="127.0.0.1", port=9092)
NEW = BrokerInfo(broker_id=2, host="127.0.0.1", port=9093)


def streams(*partitions: tuple[str, int]) -> tuple[AssignedStream, ...]:
    return (
        AssignedStream(
            stream_id="c-0",
            partitions=tuple(
                AssignedPartition(topic=t, partition=p, offset=0, broker_id=1)
                for t, p in partitions
            ),
        ),
    )


ASSIGNED = streams(("t", 1), ("t", 0))
OWNED = (TopicPartition(topic="t", partition=0), TopicPartition(topic="t", partition=1))


def _started(now: float) -> StartFetcherReceived:
    return StartFetcherReceived(
        now=now, anchor=now, correlation_id=1, epoch=5, generation=3, streams=ASSIGNED
    )


def machine_in(state: ConsumerState, now: float = 100.0) -> ConsumerMachine:
    """Drive a fresh machine into ``state`` along the ordinary path, all at time ``now``, with
    coordinator epoch 5 and generation 3."""
    m = ConsumerMachine(config=ConsumerConfig(session_timeout=T))
    paths: dict[ConsumerState, list[Input]] = {
        S.IDLE: [],
        S.DISCOVERING: [Start()],
        S.REGISTERING: [Start(), CoordinatorFound(now=now, coordinator=OLD, epoch=5)],
        S.STOPPED: [
            Start(),
            CoordinatorFound(now=now, coordinator=OLD, epoch=5),
            Registered(now=now, anchor=now, generation=2, epoch=5),
        ],
        S.FETCHING: [
            Start(),
            CoordinatorFound(now=now, coordinator=OLD, epoch=5),
            Registered(now=now, anchor=now, generation=2, epoch=5),
            StartFetcherReceived(
                now=now, anchor=now, correlation_id=1, epoch=5, generation=3, streams=ASSIGNED
            ),
        ],
        S.REDISCOVERING: [
            Start(),
            CoordinatorFound(now=now, coordinator=OLD, epoch=5),
            Registered(now=now, anchor=now, generation=2, epoch=5),
            StartFetcherReceived(
                now=now, anchor=now, correlation_id=1, epoch=5, generation=3, streams=ASSIGNED
            ),
            CoordinatorMoved(now=now, error_code=ErrorCode.NOT_COORDINATOR),
        ],
        S.REREGISTERING: [
            Start(),
            CoordinatorFound(now=now, coordinator=OLD, epoch=5),
            Registered(now=now, anchor=now, generation=2, epoch=5),
            StartFetcherReceived(
                now=now, anchor=now, correlation_id=1, epoch=5, generation=3, streams=ASSIGNED
            ),
            CoordinatorMoved(now=now, error_code=ErrorCode.NOT_COORDINATOR),
            CoordinatorFound(now=now, coordinator=NEW, epoch=5),
        ],
        S.CLOSED: [Close()],
        S.FENCED: [
            Start(),
            CoordinatorFound(now=now, coordinator=OLD, epoch=5),
            RegistrationRejected(now=now, error_code=ErrorCode.FENCED_INSTANCE_ID),
        ],
    }
    for event in paths[state]:
        m.handle(event)
    assert state_of(m) is state
    return m


def sample(kind: type, now: float, epoch: int = 5) -> Input:
    """One input of each kind, fresh (within the lease) and at the current epoch."""
    samples: dict[type, Input] = {
        Start: Start(),
        CoordinatorFound: CoordinatorFound(now=now, coordinator=NEW, epoch=epoch),
        DiscoveryFailed: DiscoveryFailed(now=now),
        Registered: Registered(now=now, anchor=now, generation=3, epoch=epoch),
        RegistrationRejected: RegistrationRejected(
            now=now, error_code=ErrorCode.DUPLICATE_MEMBER_ID
        ),
        PingReceived: PingReceived(
            now=now, anchor=now, correlation_id=7, epoch=epoch, generation=3
        ),
        StopFetcherReceived: StopFetcherReceived(
            now=now, anchor=now, correlation_id=8, epoch=epoch, generation=4
        ),
        StartFetcherReceived: StartFetcherReceived(
            now=now,
            anchor=now,
            correlation_id=9,
            epoch=epoch,
            generation=4,
            streams=streams(("u", 0)),
        ),
        CoordinatorMoved: CoordinatorMoved(now=now, error_code=ErrorCode.NOT_COORDINATOR),
        Fenced: Fenced(now=now),
        ConnectionLost: ConnectionLost(now=now),
        LeaseExpired: LeaseExpired(now=now),
        Close: Close(),
    }
    return samples[kind]


def state_of(m: ConsumerMachine) -> ConsumerState:
    return m.state  # read through a call, so that mypy does not keep an earlier narrowing


def snapshot(m: ConsumerMachine) -> dict[str, Any]:
    return attrs.asdict(m, recurse=False)


# --- the table, cell by cell, written out by hand -----------------------------------------------

COLUMNS: dict[str, type] = {
    "Start": Start,
    "Found": CoordinatorFound,
    "DFail": DiscoveryFailed,
    "Regd": Registered,
    "Rejd": RegistrationRejected,
    "Ping": PingReceived,
    "Stop": StopFetcherReceived,
    "StartF": StartFetcherReceived,
    "Moved": CoordinatorMoved,
    "Fenced": Fenced,
    "Lost": ConnectionLost,
    "Lease": LeaseExpired,
    "Close": Close,
}
CELLS = {
    "IDLE": S.IDLE,
    "DISC": S.DISCOVERING,
    "REG": S.REGISTERING,
    "STOP": S.STOPPED,
    "FETCH": S.FETCHING,
    "REDISC": S.REDISCOVERING,
    "REREG": S.REREGISTERING,
    "CLOSED": S.CLOSED,
    "FENCED": S.FENCED,
}
# Rows and cells name states as CELLS does; "-": the input is illegal in that state
# (IllegalTransition, nothing changes).
GRID = """
       Start  Found  DFail  Regd   Rejd   Ping   Stop   StartF Moved  Fenced Lost   Lease  Close
IDLE   DISC   -      -      -      -      -      -      -      -      -      -      -      CLOSED
DISC   -      REG    DISC   -      -      -      -      -      -      -      -      -      CLOSED
REG    -      -      -      STOP   DISC   -      -      -      -      -      DISC   -      CLOSED
STOP   -      -      -      -      -      STOP   STOP   FETCH  DISC   FENCED DISC   DISC   CLOSED
FETCH  -      -      -      -      -      FETCH  STOP   FETCH  REDISC FENCED REDISC DISC   CLOSED
REDISC -      REREG  REDISC -      -      -      -      -      -      -      -      DISC   CLOSED
REREG  -      -      -      FETCH  REDISC -      -      -      -      -      REDISC DISC   CLOSED
CLOSED -      -      -      -      -      -      -      -      -      -      -      -      CLOSED
FENCED -      -      -      -      -      -      -      -      -      -      -      -      FENCED
"""


def expected_table() -> dict[tuple[ConsumerState, type], ConsumerState | None]:
    header, *rows = GRID.strip().splitlines()
    kinds = [COLUMNS[name] for name in header.split()]
    table: dict[tuple[ConsumerState, type], ConsumerState | None] = {}
    for row in rows:
        state_name, *cells = row.split()
        assert len(cells) == len(kinds)
        for kind, cell in zip(kinds, cells, strict=True):
            table[(CELLS[state_name], kind)] = None if cell == "-" else CELLS[cell]
    return table


EXPECTED: dict[tuple[ConsumerState, type], ConsumerState | None] = expected_table()
CELLS_IN_ORDER: list[tuple[ConsumerState, type]] = sorted(
    EXPECTED.keys(), key=lambda c: (c[0].name, c[1].__name__)
)


def test_the_grid_covers_every_state_and_every_input_of_the_table() -> None:
    assert {state for state, _ in EXPECTED} == set(ConsumerState)
    assert {kind for _, kind in EXPECTED} == set(TABLE.inputs())


@pytest.mark.parametrize(("state", "kind"), CELLS_IN_ORDER)
def test_every_state_and_input(state: ConsumerState, kind: type) -> None:
    m = machine_in(state)
    # Within the lease, except LeaseExpired itself, which comes exactly at the deadline.
    now = 100.0 + T if kind is LeaseExpired else 101.0
    event = sample(kind, now)
    expected = EXPECTED[(state, kind)]
    before = snapshot(m)
    if expected is None:
        with pytest.raises(IllegalTransition):
            m.handle(event)
        assert snapshot(m) == before
    else:
        effects = m.handle(event)
        assert state_of(m) is expected
        assert not any(isinstance(e, Ignored) for e in effects)


# --- the ownership lease ------------------------------------------------------------------------


def test_lease_runs_out_exactly_session_timeout_after_the_last_request() -> None:
    m = machine_in(S.FETCHING, now=100.0)
    assert m.lease_deadline() == 106.0
    assert m.check_lease(math.nextafter(106.0, 0.0)) == []
    assert state_of(m) is S.FETCHING
    assert m.handle(
        PingReceived(now=104.0, anchor=104.0, correlation_id=2, epoch=5, generation=3)
    ) == [RespondPing(correlation_id=2, partitions=OWNED)]
    assert m.lease_deadline() == 110.0
    assert m.check_lease(109.5) == []
    assert m.check_lease(110.0) == [StopFetchers(), CloseConnection(), Discover(delay=0.0)]
    assert state_of(m) is S.DISCOVERING
    assert m.owned == ()
    assert m.lease_deadline() is None
    assert m.check_lease(1000.0) == []


@given(
    st.floats(0, 1e6, allow_nan=False),
    st.floats(0.01, 1e3, allow_nan=False),
    st.lists(st.floats(0, 1e3, allow_nan=False), max_size=5),
)
def test_lease_expiry_stops_fetching_at_last_heard_plus_t(
    start: float, timeout: float, gaps: list[float]
) -> None:
    m = ConsumerMachine(config=ConsumerConfig(session_timeout=timeout))
    m.handle(Start())
    m.handle(CoordinatorFound(now=start, coordinator=OLD, epoch=1))
    m.handle(Registered(now=start, anchor=start, generation=0, epoch=1))
    m.handle(
        StartFetcherReceived(
            now=start, anchor=start, correlation_id=0, epoch=1, generation=1, streams=ASSIGNED
        )
    )
    heard = start
    for i, gap in enumerate(gaps):
        at = heard + min(gap, timeout) * 0.999
        if at >= heard + timeout:
            continue
        m.handle(PingReceived(now=at, anchor=at, correlation_id=i, epoch=1, generation=1))
        heard = at
    deadline = heard + timeout
    assert m.lease_deadline() == deadline
    assert m.check_lease(math.nextafter(deadline, -math.inf)) == []
    assert state_of(m) is S.FETCHING
    assert StopFetchers() in m.check_lease(deadline)
    assert state_of(m) is S.DISCOVERING


def test_stopped_consumer_presumes_a_silent_coordinator_dead() -> None:
    m = machine_in(S.STOPPED, now=100.0)
    assert m.check_lease(106.0) == [CloseConnection(), Discover(delay=0.0)]
    assert state_of(m) is S.DISCOVERING


def test_a_stale_lease_timer_is_ignored() -> None:
    m = machine_in(S.FETCHING, now=100.0)
    m.handle(PingReceived(now=105.0, anchor=105.0, correlation_id=2, epoch=5, generation=3))
    before = snapshot(m)
    timer = LeaseExpired(now=106.0)  # armed for the old deadline
    assert m.handle(timer) == [Ignored(event=timer, reason="the lease was renewed since")]
    assert snapshot(m) == before


def test_a_request_read_after_the_deadline_does_not_revive_the_lease() -> None:
    m = machine_in(S.FETCHING, now=100.0)
    late = PingReceived(now=107.0, anchor=107.0, correlation_id=2, epoch=5, generation=3)
    effects = m.handle(late)
    assert effects[:3] == [StopFetchers(), CloseConnection(), Discover(delay=0.0)]
    assert isinstance(effects[3], Ignored) and effects[3].event == late
    assert len(effects) == 4
    assert state_of(m) is S.DISCOVERING


def test_the_lease_runs_from_the_frame_a_request_names_not_from_its_arrival() -> None:
    """A Ping that spent 4.5 s in the network names a frame this consumer queued at 101.0: the
    coordinator sent it after receiving that frame, and counts from its send, so the lease runs
    T from 101.0, not from when the Ping arrived (docs/design.md#ownership-lease)."""
    m = machine_in(S.FETCHING, now=100.0)
    delayed = PingReceived(now=105.5, anchor=101.0, correlation_id=2, epoch=5, generation=3)
    assert m.handle(delayed) == [RespondPing(correlation_id=2, partitions=OWNED)]
    assert m.lease_deadline() == 107.0
    assert StopFetchers() in m.check_lease(107.0)
    assert state_of(m) is S.DISCOVERING


def test_requests_in_flight_together_never_move_the_deadline_back() -> None:
    """Requests read in a row name frames queued at different times: each renews from its own
    frame, the latest anchor wins, and one naming an earlier frame changes nothing."""
    m = machine_in(S.FETCHING, now=100.0)
    m.handle(PingReceived(now=102.5, anchor=102.0, correlation_id=2, epoch=5, generation=3))
    assert m.lease_deadline() == 108.0
    stop = StopFetcherReceived(now=102.6, anchor=101.0, correlation_id=3, epoch=5, generation=4)
    assert m.handle(stop) == [StopFetchers(), RespondStop(correlation_id=3, partitions=OWNED)]
    assert m.lease_deadline() == 108.0  # not 107.0
    start = StartFetcherReceived(
        now=102.7, anchor=102.5, correlation_id=4, epoch=5, generation=4, streams=ASSIGNED
    )
    m.handle(start)
    assert state_of(m) is S.FETCHING
    assert m.lease_deadline() == 108.5


@pytest.mark.parametrize("state", [S.STOPPED, S.FETCHING])
def test_a_request_naming_no_known_frame_is_answered_and_renews_nothing(
    state: ConsumerState,
) -> None:
    """-1 (a version-0 request), 0, or a frame forgotten: the trio layer finds no queue time and
    passes None. The request is carried out; the lease is not renewed."""
    m = machine_in(state, now=100.0)
    ping = PingReceived(now=105.0, anchor=None, correlation_id=2, epoch=5, generation=3)
    owned = OWNED if state is S.FETCHING else ()
    assert m.handle(ping) == [RespondPing(correlation_id=2, partitions=owned)]
    assert m.lease_deadline() == 106.0
    assert m.check_lease(106.0)[-1] == Discover(delay=0.0)


def test_a_start_naming_no_known_frame_starts_fetching_under_the_lease_it_had() -> None:
    m = machine_in(S.STOPPED, now=100.0)
    start = StartFetcherReceived(
        now=105.0, anchor=None, correlation_id=2, epoch=5, generation=4, streams=ASSIGNED
    )
    assert m.handle(start)[-1] == RespondStart(correlation_id=2)
    assert state_of(m) is S.FETCHING
    assert m.lease_deadline() == 106.0


def test_registration_renews_from_when_the_register_request_was_queued() -> None:
    m = ConsumerMachine(config=ConsumerConfig(session_timeout=T))
    m.handle(Start())
    m.handle(CoordinatorFound(now=100.0, coordinator=OLD, epoch=5))
    m.handle(Registered(now=103.0, anchor=100.5, generation=2, epoch=5))
    assert m.lease_deadline() == 106.5


def test_lease_runs_on_while_rediscovering_and_stops_the_fetchers() -> None:
    m = machine_in(S.REDISCOVERING, now=100.0)
    assert m.lease_deadline() == 106.0
    # A discovery answer after the deadline: stop first, then register owning nothing.
    effects = m.handle(CoordinatorFound(now=106.5, coordinator=NEW, epoch=6))
    assert effects == [StopFetchers(), Register(coordinator=NEW, generation=3, owned=())]
    assert state_of(m) is S.REGISTERING


def test_reregistration_answer_after_the_deadline_is_dropped() -> None:
    m = machine_in(S.REREGISTERING, now=100.0)
    effects = m.handle(Registered(now=106.0, anchor=106.0, generation=3, epoch=6))
    # No failure so far (NOT_COORDINATOR was a failover's quick retry), hence no backoff.
    assert effects[:3] == [StopFetchers(), CloseConnection(), Discover(delay=0.0)]
    assert isinstance(effects[-1], Ignored)
    assert state_of(m) is S.DISCOVERING


# --- the coordinator epoch ----------------------------------------------------------------------


@pytest.mark.parametrize("kind", [PingReceived, StopFetcherReceived, StartFetcherReceived])
@pytest.mark.parametrize("state", [S.STOPPED, S.FETCHING])
def test_requests_from_an_older_epoch_are_ignored(kind: type, state: ConsumerState) -> None:
    m = machine_in(state, now=100.0)
    before = snapshot(m)
    event = sample(kind, now=101.0, epoch=4)
    effects = m.handle(event)
    assert len(effects) == 1 and isinstance(effects[0], Ignored) and effects[0].event == event
    assert snapshot(m) == before  # not even the lease was renewed


def test_a_newer_epoch_raises_the_bar() -> None:
    m = machine_in(S.FETCHING, now=100.0)
    m.handle(PingReceived(now=101.0, anchor=101.0, correlation_id=2, epoch=9, generation=3))
    assert m.epoch == 9
    effects = m.handle(
        StopFetcherReceived(now=102.0, anchor=102.0, correlation_id=3, epoch=5, generation=4)
    )
    assert isinstance(effects[0], Ignored)
    assert state_of(m) is S.FETCHING


def test_registration_with_a_deposed_coordinator_counts_as_a_rejection() -> None:
    m = machine_in(S.REREGISTERING, now=100.0)
    m.epoch = 8  # seen meanwhile; a newer coordinator exists
    effects = m.handle(Registered(now=101.0, anchor=101.0, generation=3, epoch=7))
    # Fetching on under its lease: it resets the connection and looks at the failover pace.
    assert effects == [CloseConnection(reset=True), Discover(delay=0.05, jitter=0.025)]
    assert state_of(m) is S.REDISCOVERING
    assert m.last_error is ErrorCode.STALE_COORDINATOR_EPOCH
    assert m.owned == OWNED  # still fetching under the lease


def test_stale_metadata_counts_as_a_failed_discovery() -> None:
    m = machine_in(S.REDISCOVERING, now=100.0)
    effects = m.handle(CoordinatorFound(now=101.0, coordinator=OLD, epoch=4))
    assert effects == [
        Discover(delay=0.05, jitter=0.025)
    ]  # fetching under its lease: the failover pace
    assert state_of(m) is S.REDISCOVERING
    m = machine_in(S.DISCOVERING, now=100.0)
    m.epoch = 5
    effects = m.handle(CoordinatorFound(now=101.0, coordinator=OLD, epoch=4))
    assert effects == [Discover(delay=0.1)]  # holding nothing: the first failure in a row


def test_a_follower_naming_the_coordinator_without_its_epoch_is_not_stale_metadata() -> None:
    # After a failover a follower names the successor; not being the coordinator, it gives no
    # epoch (ClusterMetadata coordinator_epoch -1). Counting that as stale metadata would send every
    # consumer that had registered once into backoff until a pass happened to ask the coordinator.
    m = machine_in(S.STOPPED, now=100.0)
    assert m.handle(ConnectionLost(now=101.0)) == [CloseConnection(), Discover(delay=0.0)]
    found = CoordinatorFound(now=101.2, coordinator=NEW, epoch=UNKNOWN_EPOCH)
    assert m.handle(found) == [Register(coordinator=NEW, generation=m.generation, owned=())]
    assert state_of(m) is S.REGISTERING
    assert m.epoch == 5
    # The registration answer brings the coordinator's epoch, and the guard checks that one.
    assert m.handle(Registered(now=101.3, anchor=101.3, generation=3, epoch=4)) == [
        CloseConnection(),
        Discover(delay=0.1),
    ]
    assert m.last_error is ErrorCode.STALE_COORDINATOR_EPOCH


def test_a_follower_naming_the_coordinator_while_fetching_leads_to_reregistration() -> None:
    m = machine_in(S.REDISCOVERING, now=100.0)
    found = CoordinatorFound(now=101.0, coordinator=NEW, epoch=UNKNOWN_EPOCH)
    assert m.handle(found) == [Register(coordinator=NEW, generation=3, owned=OWNED)]
    assert state_of(m) is S.REREGISTERING
    assert m.handle(Registered(now=101.1, anchor=101.1, generation=3, epoch=6)) == []
    assert state_of(m) is S.FETCHING and m.epoch == 6


# --- effects: order and memory ------------------------------------------------------------------


def test_registration_carries_generation_and_partitions_still_fetched() -> None:
    m = machine_in(S.REDISCOVERING, now=100.0)
    assert m.handle(CoordinatorFound(now=101.0, coordinator=NEW, epoch=6)) == [
        Register(coordinator=NEW, generation=3, owned=OWNED)
    ]
    assert m.handle(Registered(now=102.0, anchor=102.0, generation=3, epoch=6)) == []
    assert state_of(m) is S.FETCHING
    assert m.lease_deadline() == 108.0


def test_a_reregistration_reports_only_a_generation_it_was_started_under() -> None:
    """The registration answer names the group's generation, under which another process with
    this consumer id may hold partitions: reporting it after a lost connection would claim them
    and end that process's lease while it may still fetch."""
    m = ConsumerMachine(config=ConsumerConfig(session_timeout=T))
    m.handle(Start())
    m.handle(CoordinatorFound(now=100.0, coordinator=OLD, epoch=5))
    m.handle(Registered(now=100.0, anchor=100.0, generation=5, epoch=5))
    m.handle(ConnectionLost(now=101.0))
    assert m.handle(CoordinatorFound(now=101.5, coordinator=OLD, epoch=5)) == [
        Register(coordinator=OLD, generation=-1, owned=())
    ]


def test_stop_reports_final_offsets_of_what_it_owned_then_forgets_it() -> None:
    m = machine_in(S.FETCHING)
    assert m.handle(
        StopFetcherReceived(now=101.0, anchor=101.0, correlation_id=4, epoch=5, generation=4)
    ) == [
        StopFetchers(),
        RespondStop(correlation_id=4, partitions=OWNED),
    ]
    assert m.owned == ()
    assert m.handle(
        StopFetcherReceived(now=101.5, anchor=101.5, correlation_id=5, epoch=5, generation=4)
    ) == [RespondStop(correlation_id=5, partitions=())]
    m.handle(ConnectionLost(now=102.0))
    assert m.handle(CoordinatorFound(now=102.0, coordinator=NEW, epoch=5)) == [
        Register(coordinator=NEW, generation=3, owned=())
    ]


def test_start_while_fetching_stops_before_starting() -> None:
    m = machine_in(S.FETCHING)
    new = streams(("u", 3))
    effects = m.handle(
        StartFetcherReceived(
            now=101.0, anchor=101.0, correlation_id=6, epoch=5, generation=5, streams=new
        )
    )
    assert effects == [
        StopFetchers(),
        StartFetchers(generation=5, streams=new),
        RespondStart(correlation_id=6),
    ]
    assert m.owned == (TopicPartition(topic="u", partition=3),)
    assert m.generation == 5


def test_close_stops_fetchers_commits_and_leaves_before_closing() -> None:
    m = machine_in(S.FETCHING)
    assert m.handle(Close()) == [
        StopFetchers(),
        CommitAndLeave(generation=3, partitions=OWNED),
        CloseConnection(),
    ]
    assert state_of(m) is S.CLOSED
    assert m.handle(Close()) == []


def test_a_lost_connection_does_not_stop_the_fetchers_and_is_reset() -> None:
    """The lease, not the connection, bounds fetching (docs/design.md#ownership-lease): the
    consumer fetches on while it finds the coordinator again, and re-registers holding its
    partitions under its generation. The connection is closed with a reset: an end of stream
    would tell the coordinator that it stopped."""
    m = machine_in(S.FETCHING, now=100.0)
    assert m.handle(ConnectionLost(now=101.0)) == [
        CloseConnection(reset=True),
        Discover(delay=0.0),
    ]
    assert state_of(m) is S.REDISCOVERING
    assert m.owned == OWNED
    assert m.handle(CoordinatorFound(now=101.5, coordinator=NEW, epoch=6)) == [
        Register(coordinator=NEW, generation=3, owned=OWNED)
    ]
    # The group's generation in the answer does not replace the one it holds its partitions
    # under.
    assert m.handle(Registered(now=102.0, anchor=101.5, generation=7, epoch=6)) == []
    assert (state_of(m), m.generation, m.lease_deadline()) == (S.FETCHING, 3, 107.5)


def test_an_unanswered_reregistration_is_reset_and_fetching_goes_on() -> None:
    m = machine_in(S.REREGISTERING, now=100.0)
    assert m.handle(ConnectionLost(now=101.0)) == [
        CloseConnection(reset=True),
        Discover(delay=0.05, jitter=0.025),  # fetching under its lease: the failover pace
    ]
    assert state_of(m) is S.REDISCOVERING
    assert m.owned == OWNED


def test_coordinator_moved_keeps_fetching_while_rediscovering() -> None:
    m = machine_in(S.FETCHING)
    assert m.handle(CoordinatorMoved(now=101.0, error_code=ErrorCode.NOT_COORDINATOR)) == [
        CloseConnection(reset=True),  # fetching on, it resets the connection
        Discover(delay=0.05, jitter=0.025),  # fetching under its lease: the failover pace
    ]
    assert state_of(m) is S.REDISCOVERING
    assert m.owned == OWNED


@pytest.mark.parametrize(
    "code", [ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, ErrorCode.NOT_COORDINATOR]
)
def test_a_failover_answer_is_retried_at_once_a_bounded_number_of_times(code: ErrorCode) -> None:
    config = ConsumerConfig(session_timeout=T, failover_retry=0.02, max_failover_retries=3)
    m = ConsumerMachine(config=config)
    m.handle(Start())
    delays = []
    for i in range(5):
        m.handle(CoordinatorFound(now=100.0 + i, coordinator=NEW, epoch=5))
        effects = m.handle(RegistrationRejected(now=100.0 + i, error_code=code))
        assert effects[0] == CloseConnection()
        (discover,) = effects[1:]
        assert isinstance(discover, Discover)
        delays.append(discover.delay)
        assert state_of(m) is S.DISCOVERING
        assert m.last_error is code
    # Three quick retries, then the ordinary backoff from its first step.
    assert delays == [0.02, 0.02, 0.02, 0.1, 0.2]
    # A registration ends the failover: the quick retries are available again.
    m.handle(CoordinatorFound(now=110.0, coordinator=NEW, epoch=5))
    m.handle(Registered(now=110.0, anchor=110.0, generation=1, epoch=5))
    m.handle(ConnectionLost(now=111.0))
    m.handle(CoordinatorFound(now=111.0, coordinator=NEW, epoch=5))
    assert m.handle(RegistrationRejected(now=111.0, error_code=code)) == [
        CloseConnection(),
        Discover(delay=0.02),
    ]


def test_other_refusals_back_off_as_before() -> None:
    m = machine_in(S.REGISTERING)
    effects = m.handle(RegistrationRejected(now=101.0, error_code=ErrorCode.REBALANCE_IN_PROGRESS))
    assert effects == [CloseConnection(), Discover(delay=0.1)]
    assert state_of(m) is S.DISCOVERING


def test_a_fetching_consumer_told_of_a_failover_keeps_fetching_and_retries_at_once() -> None:
    m = machine_in(S.REREGISTERING)
    effects = m.handle(
        RegistrationRejected(now=101.0, error_code=ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
    )
    assert effects == [CloseConnection(reset=True), Discover(delay=0.05, jitter=0.025)]
    assert state_of(m) is S.REDISCOVERING
    assert m.owned == OWNED  # still fetching under the lease


def test_backoff_doubles_up_to_its_cap_and_resets_on_registration() -> None:
    m = ConsumerMachine(
        config=ConsumerConfig(session_timeout=T, retry_backoff=0.5, max_retry_backoff=3.0)
    )
    assert m.handle(Start()) == [Discover(delay=0.0)]
    delays = [m.handle(DiscoveryFailed(now=float(i))) for i in range(5)]
    assert delays == [[Discover(delay=d)] for d in (0.5, 1.0, 2.0, 3.0, 3.0)]
    m.handle(CoordinatorFound(now=10.0, coordinator=OLD, epoch=1))
    m.handle(Registered(now=10.0, anchor=10.0, generation=0, epoch=1))
    assert m.handle(ConnectionLost(now=11.0)) == [CloseConnection(), Discover(delay=0.0)]


# --- incremental rebalancing (SPEC.md §11.5, §11.6) --------------------------------------------

T0, T1, T2 = (TopicPartition(topic="t", partition=p) for p in (0, 1, 2))


def test_a_revocation_stops_only_the_listed_partitions_and_keeps_the_generation() -> None:
    m = machine_in(S.FETCHING, now=100.0)
    revoke = StopFetcherReceived(
        now=101.0, anchor=101.0, correlation_id=4, epoch=5, generation=4, partitions=(T1, T2)
    )
    # t-2 is not fetched: ignored; t-1 stops and its final offset is answered; t-0 goes on.
    assert m.handle(revoke) == [
        StopFetchers(partitions=(T1,)),
        RespondStop(correlation_id=4, partitions=(T1,)),
    ]
    assert (state_of(m), m.owned, m.generation) == (S.FETCHING, (T0,), 3)
    assert m.lease_deadline() == 107.0
    ping = PingReceived(now=102.0, anchor=102.0, correlation_id=5, epoch=5, generation=3)
    assert m.handle(ping) == [RespondPing(correlation_id=5, partitions=(T0,))]
    # A re-registration offers only what is still fetched.
    m.handle(ConnectionLost(now=103.0))
    assert m.handle(CoordinatorFound(now=103.0, coordinator=NEW, epoch=5)) == [
        Register(coordinator=NEW, generation=3, owned=(T0,))
    ]


def test_a_revocation_of_nothing_fetched_is_answered_and_stops_nothing() -> None:
    for state in (S.STOPPED, S.FETCHING):
        m = machine_in(state, now=100.0)
        owned = m.owned
        revoke = StopFetcherReceived(
            now=101.0, anchor=101.0, correlation_id=4, epoch=5, generation=4, partitions=(T2,)
        )
        assert m.handle(revoke) == [RespondStop(correlation_id=4, partitions=())]
        assert (state_of(m), m.owned) == (state, owned)


def test_revoking_everything_fetched_keeps_fetching_state_with_nothing() -> None:
    m = machine_in(S.FETCHING, now=100.0)
    revoke = StopFetcherReceived(
        now=101.0, anchor=101.0, correlation_id=4, epoch=5, generation=4, partitions=OWNED
    )
    assert m.handle(revoke) == [
        StopFetchers(partitions=OWNED),
        RespondStop(correlation_id=4, partitions=OWNED),
    ]
    assert (state_of(m), m.owned, m.generation) == (S.FETCHING, (), 3)


def incremental_start(new: tuple[AssignedStream, ...]) -> StartFetcherReceived:
    return StartFetcherReceived(
        now=101.0,
        anchor=101.0,
        correlation_id=6,
        epoch=5,
        generation=7,
        streams=new,
        incremental=True,
    )


def test_an_incremental_start_goes_on_with_what_it_keeps_and_stops_what_it_drops() -> None:
    m = machine_in(S.FETCHING, now=100.0)  # fetching t-0 and t-1 under generation 3
    new = streams(("t", 1), ("t", 2))
    assert m.handle(incremental_start(new)) == [
        StopFetchers(partitions=(T0,)),  # the coordinator revokes first; if not, stop it here
        StartFetchers(generation=7, streams=new, kept=(T1,)),
        RespondStart(correlation_id=6),
    ]
    assert (state_of(m), m.owned, m.generation) == (S.FETCHING, (T1, T2), 7)


def test_an_incremental_start_that_drops_nothing_stops_nothing() -> None:
    m = machine_in(S.FETCHING, now=100.0)
    new = streams(("t", 0), ("t", 1), ("t", 2))
    assert m.handle(incremental_start(new)) == [
        StartFetchers(generation=7, streams=new, kept=OWNED),
        RespondStart(correlation_id=6),
    ]


def test_an_incremental_start_while_stopped_starts_everything() -> None:
    m = machine_in(S.STOPPED, now=100.0)
    start = attrs.evolve(_started(101.0), incremental=True)
    assert m.handle(start) == [
        StartFetchers(generation=3, streams=ASSIGNED, kept=()),
        RespondStart(correlation_id=1),
    ]
    assert state_of(m) is S.FETCHING


# --- static members (SPEC.md §11.11) ------------------------------------------------------------

STATIC = ConsumerConfig(session_timeout=T, instance_id="billing-1")


def static_machine_fetching(now: float = 100.0) -> ConsumerMachine:
    m = ConsumerMachine(config=STATIC)
    m.handle(Start())
    assert m.handle(CoordinatorFound(now=now, coordinator=OLD, epoch=5)) == [
        Register(coordinator=OLD, generation=-1, owned=(), instance_id="billing-1")
    ]
    m.handle(Registered(now=now, anchor=now, generation=2, epoch=5))
    m.handle(_started(now))
    return m


def fenced_stop(epoch: int) -> StopFetcherReceived:
    return StopFetcherReceived(
        now=101.0,
        anchor=101.0,
        correlation_id=3,
        epoch=epoch,
        generation=3,
        reason=ErrorCode.FENCED_INSTANCE_ID,
    )


def test_a_static_member_closes_after_stopping_and_committing_without_leaving() -> None:
    m = static_machine_fetching()
    assert m.handle(Close()) == [
        StopFetchers(),
        CommitAndLeave(generation=3, partitions=OWNED, leave=False),
        CloseConnection(),
    ]
    assert state_of(m) is S.CLOSED


@pytest.mark.parametrize("state", [S.STOPPED, S.FETCHING])
def test_a_fenced_stop_stops_answers_closes_and_ends(state: ConsumerState) -> None:
    m = static_machine_fetching()
    if state is S.STOPPED:
        m.handle(
            StopFetcherReceived(now=100.5, anchor=100.5, correlation_id=2, epoch=5, generation=3)
        )
    fenced = fenced_stop(epoch=5)
    stopped = [StopFetchers()] if state is S.FETCHING else []
    owned = OWNED if state is S.FETCHING else ()
    assert m.handle(fenced) == [
        *stopped,
        RespondStop(correlation_id=3, partitions=owned),
        CloseConnection(),  # clean: it has stopped
    ]
    assert (state_of(m), m.owned, m.last_error) == (S.FENCED, (), ErrorCode.FENCED_INSTANCE_ID)
    assert m.lease_deadline() is None  # nothing runs out, nothing is looked for again
    assert m.check_lease(1e9) == []
    assert m.handle(Close()) == []
    assert (state_of(m), m.last_error) == (S.FENCED, ErrorCode.FENCED_INSTANCE_ID)


def test_a_fenced_stop_from_a_deposed_coordinator_is_ignored() -> None:
    m = static_machine_fetching()
    before = snapshot(m)
    stale = fenced_stop(epoch=4)
    (ignored,) = m.handle(stale)
    assert isinstance(ignored, Ignored)
    assert snapshot(m) == before


def test_a_fenced_commit_stops_and_closes_without_answering_anything() -> None:
    m = static_machine_fetching()
    assert m.handle(Fenced(now=101.0)) == [StopFetchers(), CloseConnection()]
    assert (state_of(m), m.last_error) == (S.FENCED, ErrorCode.FENCED_INSTANCE_ID)


def test_a_fenced_registration_ends_it_and_a_fetching_one_stops_first() -> None:
    m = ConsumerMachine(config=STATIC)
    m.handle(Start())
    m.handle(CoordinatorFound(now=100.0, coordinator=OLD, epoch=5))
    fenced = RegistrationRejected(now=100.1, error_code=ErrorCode.FENCED_INSTANCE_ID)
    assert m.handle(fenced) == [CloseConnection()]  # no Discover: it does not look again
    assert state_of(m) is S.FENCED

    m = static_machine_fetching()
    m.handle(ConnectionLost(now=101.0))
    m.handle(CoordinatorFound(now=101.0, coordinator=NEW, epoch=6))
    assert state_of(m) is S.REREGISTERING
    assert m.handle(fenced) == [StopFetchers(), CloseConnection()]
    assert (state_of(m), m.owned) == (S.FENCED, ())


# --- a random walk checking the safety rules on the effects -------------------------------------

KINDS = list(COLUMNS.values())
_RENEWING = (Registered, PingReceived, StopFetcherReceived, StartFetcherReceived)


@st.composite
def walks(draw: st.DrawFn) -> list[Input]:
    events: list[Input] = [Start()]
    now = 0.0
    for _ in range(draw(st.integers(0, 40))):
        now += draw(st.sampled_from([0.0, 0.5, 2.0, 5.9, 6.0, 7.0]))
        kind = draw(st.sampled_from(KINDS))
        epoch = draw(st.sampled_from([4, 5, 5, 5, 6]))
        event = sample(kind, now, epoch)
        if isinstance(event, StopFetcherReceived):
            event = attrs.evolve(
                event,
                partitions=draw(st.sampled_from([None, (T0,), (T1, T2), OWNED])),
                reason=draw(st.sampled_from([ErrorCode.NONE] * 3 + [ErrorCode.FENCED_INSTANCE_ID])),
            )
        if isinstance(event, StartFetcherReceived):
            event = attrs.evolve(
                event,
                streams=draw(st.sampled_from([ASSIGNED, streams(("t", 1), ("t", 2)), ()])),
                incremental=draw(st.booleans()),
            )
        if isinstance(event, RegistrationRejected):
            codes = [ErrorCode.DUPLICATE_MEMBER_ID, ErrorCode.NOT_COORDINATOR]
            codes.append(ErrorCode.FENCED_INSTANCE_ID)
            event = attrs.evolve(event, error_code=draw(st.sampled_from(codes)))
        if isinstance(event, PingReceived | StopFetcherReceived | StartFetcherReceived):
            # the frame the request names was queued a while before it was read, or is unknown
            anchor = draw(st.sampled_from([0.0, 0.5, 2.0, 4.0, None]))
            event = attrs.evolve(event, anchor=None if anchor is None else now - anchor)
        events.append(event)
    return events


@given(walks())
def test_random_walk_keeps_the_safety_rules(events: list[Input]) -> None:
    m = ConsumerMachine(config=ConsumerConfig(session_timeout=T))
    fetching = False
    fetched: set[TopicPartition] = set()
    connected = False
    discoveries = 0
    anchors: set[float] = set()
    for event in events:
        before = snapshot(m)
        was_fenced = m.state is S.FENCED
        heard = m.last_heard
        if isinstance(event, _RENEWING) and event.anchor is not None:
            anchors.add(event.anchor)
        try:
            effects: list[Effect] = m.handle(event)
        except IllegalTransition:
            assert snapshot(m) == before
            continue
        # The lease runs from an anchor it was given, never from an arrival, and never moves back.
        assert m.last_heard is None or m.last_heard in anchors
        assert heard is None or (m.last_heard is not None and m.last_heard >= heard)
        if isinstance(event, CoordinatorFound | DiscoveryFailed) and not (
            effects and isinstance(effects[-1], Ignored)
        ):
            discoveries -= 1  # this input is the discovery's answer
        for effect in effects:
            match effect:
                case StopFetchers(partitions=None):
                    fetching = False
                    fetched.clear()
                case StopFetchers(partitions=partitions):
                    assert partitions and set(partitions) <= fetched
                    fetched -= set(partitions)
                case StartFetchers(streams=new, kept=kept):
                    wanted = {
                        TopicPartition(topic=p.topic, partition=p.partition)
                        for stream in new
                        for p in stream.partitions
                    }
                    # Only what goes on is still fetched; everything else was stopped first.
                    assert set(kept) == fetched <= wanted
                    fetching = True
                    fetched = wanted
                case RespondStop(partitions=answered):
                    assert not set(answered) & fetched  # stopped before the answer
                case Register():
                    assert not connected
                    connected = True
                case CloseConnection(reset=reset):
                    # A clean close (end of stream) only once the fetchers stopped.
                    assert reset == fetching
                    connected = False
                case CommitAndLeave():
                    assert not fetching and connected
                case Discover():
                    discoveries += 1
        if isinstance(event, Close):
            discoveries = 0  # the trio layer cancels what is in flight
        assert fetching == (m.state in (S.FETCHING, S.REDISCOVERING, S.REREGISTERING))
        assert connected == (m.state in (S.REGISTERING, S.STOPPED, S.FETCHING, S.REREGISTERING))
        assert discoveries == (1 if m.state in (S.DISCOVERING, S.REDISCOVERING) else 0)
        if not fetching:
            assert m.owned == ()
        assert set(m.owned) == fetched
        if was_fenced:  # the end: nothing more is done, and it never looks for a coordinator
            assert state_of(m) is S.FENCED and effects == []
        if fetching and not isinstance(event, Start | Close):
            deadline = m.lease_deadline()
            assert deadline is not None and event.now < deadline


# --- looking for the coordinator under the lease (docs/design.md#finding-the-coordinator-again) --


@pytest.mark.parametrize(
    "failure",
    [
        DiscoveryFailed(now=0.0),  # no broker named a coordinator
        DiscoveryFailed(now=0.0, error_code=ErrorCode.COORDINATOR_LOAD_IN_PROGRESS),  # no holder
        ConnectionLost(now=0.0),  # the named coordinator refused the connection (a dead broker)
        RegistrationRejected(now=0.0, error_code=ErrorCode.NOT_COORDINATOR),
        RegistrationRejected(now=0.0, error_code=ErrorCode.COORDINATOR_NOT_AVAILABLE),
    ],
)
def test_a_consumer_fetching_under_its_lease_looks_at_the_failover_pace_whatever_failed(
    failure: DiscoveryFailed | ConnectionLost | RegistrationRejected,
) -> None:
    """Before: each failure doubled the backoff (0.1, 0.2, ... 3.2 s), so a group's consumers all
    came back seconds after the successor took office (issue 28). Under the lease the pace stays
    50 ms with jitter until the lease runs out; the backoff then starts afresh at 0.1 s."""
    m = machine_in(S.FETCHING, now=100.0)  # the lease runs to 106.0
    assert m.handle(ConnectionLost(now=100.5)) == [CloseConnection(reset=True), Discover(delay=0.0)]
    now = 100.5
    looks = []
    while now < 105.9:
        if isinstance(failure, ConnectionLost | RegistrationRejected):
            m.handle(CoordinatorFound(now=now, coordinator=NEW, epoch=5))
        effects = m.handle(attrs.evolve(failure, now=now))
        looks.append(effects[-1])
        assert state_of(m) is S.REDISCOVERING and m.owned == OWNED
        now += 0.05
    assert set(looks) == {Discover(delay=0.05, jitter=0.025)}
    assert len(looks) > 100 and m.failures == 0  # more than the 100 quick retries of before
    # The lease runs out: the fetchers stop, and the backoff starts from its first step.
    effects = m.check_lease(106.0)
    assert effects[0] == StopFetchers() and state_of(m) is S.DISCOVERING
    m.handle(CoordinatorFound(now=106.1, coordinator=NEW, epoch=5))
    effects = m.handle(RegistrationRejected(now=106.1, error_code=ErrorCode.REBALANCE_IN_PROGRESS))
    assert effects[-1] == Discover(delay=0.1)


def test_the_failover_pace_grows_with_the_group_and_stays_within_the_lease() -> None:
    """The group's looks spread to ``failover_looks_per_second``: each consumer estimates the
    group's size from its share of the assigned topics' partitions."""

    def pace_with(topic_partitions: int, t: float = 45.0) -> Discover:
        m = ConsumerMachine(config=ConsumerConfig(session_timeout=t))
        m.handle(Start())
        m.handle(CoordinatorFound(now=0.0, coordinator=OLD, epoch=5))
        m.handle(Registered(now=0.0, anchor=0.0, generation=1, epoch=5))
        m.handle(attrs.evolve(_started(0.0), topic_partitions=topic_partitions))
        m.handle(ConnectionLost(now=1.0))
        (look,) = m.handle(DiscoveryFailed(now=1.0))
        assert isinstance(look, Discover)
        return look

    # Two partitions each: 2 of 2 is a group of one, 2 of 200 a group of 100 (0.5 s apart at
    # 200 looks/s), 2 of 30,000 a group of 15,000 (75 s), but at most T/6 = 7.5 s apart.
    assert pace_with(0) == pace_with(2) == Discover(delay=0.05, jitter=0.025)
    assert pace_with(200) == Discover(delay=0.5, jitter=0.25)
    assert pace_with(30_000) == Discover(delay=7.5, jitter=3.75)
    assert pace_with(30_000, t=6.0) == Discover(delay=1.0, jitter=0.5)


def test_a_discovery_told_that_a_failover_is_under_way_retries_quickly() -> None:
    """A broker whose answer says the group's slot has no live holder yet (a failover under way)
    is retried after ``failover_retry`` by a consumer that holds nothing, as NOT_COORDINATOR is;
    the quick retries in a row outlast the brokers' default ZooKeeper session (8 s) and a tick."""
    config = ConsumerConfig(session_timeout=T)
    assert config.max_failover_retries * config.failover_retry >= 8.0 + 2.0
    m = machine_in(S.DISCOVERING)
    loading = DiscoveryFailed(now=100.0, error_code=ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
    assert m.handle(loading) == [Discover(delay=0.05)]
    errors = [m.last_error]
    assert m.handle(DiscoveryFailed(now=100.1)) == [Discover(delay=0.1)]
    errors.append(m.last_error)
    assert errors == [ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, ErrorCode.COORDINATOR_NOT_AVAILABLE]


@pytest.mark.parametrize("state", [S.STOPPED, S.FETCHING])
def test_a_member_let_go_stops_answers_closes_and_looks_again_only_after_the_hint(
    state: ConsumerState,
) -> None:
    # SPEC.md §11.7, "A group let go": StopFetcher 3, reason BROKER_BUSY, hint 6 s.
    m = machine_in(state)
    m.failures = 2  # a backoff of 0.2 s: the hint, not the backoff, sets the wait
    let_go = StopFetcherReceived(
        now=101.0,
        anchor=101.0,
        correlation_id=3,
        epoch=5,
        generation=3,
        reason=ErrorCode.BROKER_BUSY,
        retry_after=6.0,
    )
    stopped = [StopFetchers()] if state is S.FETCHING else []
    owned = OWNED if state is S.FETCHING else ()
    assert m.handle(let_go) == [
        *stopped,
        RespondStop(correlation_id=3, partitions=owned),
        CloseConnection(),  # clean: it has stopped
        # 6 s lengthened at random by up to half (busy_jitter): between 6 and 9 s from now
        Discover(delay=7.5, jitter=1.5),
    ]
    assert (state_of(m), m.owned, m.last_error) == (S.DISCOVERING, (), ErrorCode.BROKER_BUSY)
    assert m.failures == 2  # asked to wait, not a failure
    assert m.coordinator is None


def test_a_let_go_from_a_deposed_coordinator_is_ignored() -> None:
    m = machine_in(S.FETCHING)
    let_go = StopFetcherReceived(
        now=101.0,
        anchor=101.0,
        correlation_id=3,
        epoch=4,
        generation=3,
        reason=ErrorCode.BROKER_BUSY,
        retry_after=6.0,
    )
    (ignored,) = m.handle(let_go)
    assert isinstance(ignored, Ignored)
    assert (state_of(m), m.owned) == (S.FETCHING, OWNED)


def test_a_reregistration_refused_because_its_group_was_let_go_stops_and_waits_the_hint() -> None:
    # Fetching under its lease, it listed its partitions; the coordinator let its group go and
    # will not take them back (SPEC.md §11.7): it stops now, rather than look again and again
    # at the failover pace until its lease runs out.
    m = machine_in(S.REREGISTERING)
    refused = RegistrationRejected(now=101.0, error_code=ErrorCode.BROKER_BUSY, retry_after=4.0)
    assert m.handle(refused) == [StopFetchers(), CloseConnection(), Discover(delay=5.0, jitter=1.0)]
    assert (state_of(m), m.owned, m.last_error) == (S.DISCOVERING, (), ErrorCode.BROKER_BUSY)
