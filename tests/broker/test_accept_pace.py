"""While the door is shut the broker accepts at a pace it can afford and shortens its listen
queue (broker/door.py ``AcceptPace``, transport/listener.py; docs/design.md#shedding-load): a
crowd of newcomers waits in the kernel, at no cost to the broker, instead of costing it a
refusal each. On the autojump clock with exact virtual times; the listening socket is a stand-in
that records its ``listen`` calls (the kernel's queue is not observable from a test), and every
connection it hands out is a real socket pair."""

from __future__ import annotations

from typing import cast

import attrs
import pytest
import trio
import trio.testing

from broker.door import PACED_BACKLOG, REFUSAL_COST, AcceptPace, Door
from coordinator.cpu_budget import CpuBudget
from tests.broker.test_shedding import StubLag
from transport.limits import ConnectionLimits
from transport.listener import FULL_BACKLOG, ConnectionGate, serve_listeners
from transport.security import Peer

#: A newcomer arrives every ARRIVAL seconds.
ARRIVAL = 0.1


@attrs.define(eq=False)
class _QueueingSocket:
    """A listening socket with a newcomer arriving every ARRIVAL s from 0 on: an accept takes
    the oldest one waiting, or waits for the next."""

    accepted: list[float] = attrs.field(factory=list)
    listens: list[tuple[float, int]] = attrs.field(factory=list)
    _peers: list[trio.socket.SocketType] = attrs.field(factory=list)

    async def accept(self) -> tuple[trio.socket.SocketType, object]:
        await trio.sleep_until(len(self.accepted) * ARRIVAL)
        self.accepted.append(trio.current_time())
        ours, theirs = trio.socket.socketpair()
        self._peers.append(theirs)
        return ours, None

    def listen(self, backlog: int) -> None:
        self.listens.append((trio.current_time(), backlog))


@attrs.define(eq=False)
class _Listener:
    socket: _QueueingSocket = attrs.field(factory=_QueueingSocket)


async def test_a_busy_broker_accepts_at_a_pace_it_can_afford_and_shortens_its_listen_queue(
    autojump_clock: trio.testing.MockClock,
) -> None:
    lag = StubLag()
    budget = CpuBudget()
    budget.limit = 0.01  # a hundredth of a core: at a tenth of it, one accept per 0.25 s
    door = Door(lag=lag, bound=0.5, budget=budget)
    pace = AcceptPace(door=door, share=0.1)
    interval = REFUSAL_COST / (0.1 * 0.01)
    assert interval == 0.25
    listener = _Listener()
    served = 0

    async def handler(stream: trio.abc.Stream, peer: Peer) -> None:
        nonlocal served
        served += 1

    async with trio.open_nursery() as nursery:
        gate = ConnectionGate.of(ConnectionLimits())
        await nursery.start(
            lambda task_status: serve_listeners(
                handler,
                [cast(trio.SocketListener, listener)],
                gate,
                pace=pace,
                task_status=task_status,
            )
        )
        await trio.sleep_until(4.95)
        lag.value = 1.0  # the loop behind from here: the door shuts
        await trio.sleep_until(14.95)
        lag.value = 0.0
        # Between two arrivals: one due at the same instant as the cancellation would be taken
        # or not as trio orders the two.
        await trio.sleep_until(19.95)
        nursery.cancel_scope.cancel()

    accepted = listener.socket.accepted
    before = [t for t in accepted if t < 4.95]
    during = [t for t in accepted if 4.95 <= t < 14.95]
    # Open: every newcomer as it arrives.
    assert before == pytest.approx([k * ARRIVAL for k in range(50)])
    # Shut at 4.95, with an accept waiting for the arrival of 5.0: the queue is shortened then,
    # one more is accepted at once (the pace's first) and then one per interval, while the
    # others wait in the kernel's queue.
    paced = [5.25 + k * interval for k in range(39)]
    assert during == pytest.approx([5.0, 5.1, *paced])
    assert listener.socket.listens == [(5.0, PACED_BACKLOG), (15.0, FULL_BACKLOG)]
    # Open again at 14.95 (seen at the accept loop's next wake): what queued meanwhile is taken
    # at once, then each newcomer as it arrives.
    assert len(accepted) == 200  # every arrival by 19.95 s: 0.0 to 19.9
    assert served == len(accepted)
