"""The accept loop: connection limits in total and by address, refusals and EMFILE logged at most
once per 10 s with a count, and a brief backoff instead of a tight loop at the file limit."""

from __future__ import annotations

import errno
import logging
import resource
from typing import cast

import attrs
import pytest
import trio
import trio.testing

from transport.limits import ConnectionLimits, FileBudget
from transport.listener import ConnectionGate, serve_listeners
from transport.security import Peer


async def test_the_gate_counts_connections_in_total_and_by_address() -> None:
    gate = ConnectionGate.of(ConnectionLimits(max_connections=3, max_connections_per_address=2))
    assert gate.admit("10.0.0.1") and gate.admit("10.0.0.1")
    assert not gate.admit("10.0.0.1")  # per address
    assert gate.admit("10.0.0.2")
    assert not gate.admit("10.0.0.3")  # in total
    gate.leave("10.0.0.1")
    assert gate.admit("10.0.0.3")
    assert gate.open == 3 and dict(gate.by_address) == {"10.0.0.1": 1, "10.0.0.2": 1, "10.0.0.3": 1}


def test_by_default_the_limit_is_the_file_limit_less_a_reserve_and_none_per_address() -> None:
    gate = ConnectionGate.of(ConnectionLimits())
    assert gate.limit == ConnectionLimits().connection_limit() > 0
    assert gate.per_address is None


async def test_refusals_are_logged_once_per_10_s_with_a_count(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    gate = ConnectionGate.of(ConnectionLimits(max_connections=1))
    assert gate.admit("a")
    for _ in range(50):  # 5 s of refusals, one every 0.1 s
        assert not gate.admit("b")
        await trio.sleep(0.1)
    await trio.sleep(6)
    assert not gate.admit("b")
    lines = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(lines) == 2
    assert "and 49 more like it" in lines[1]


@attrs.define(eq=False)
class _FullSocket:
    """A listening socket at the process's file limit: every accept fails with EMFILE."""

    accepts: int = 0

    async def accept(self) -> object:
        await trio.lowlevel.checkpoint()
        self.accepts += 1
        raise OSError(errno.EMFILE, "Too many open files")


@attrs.define(eq=False)
class _FullListener:
    socket: _FullSocket = attrs.field(factory=_FullSocket)


async def test_at_the_file_limit_accepting_backs_off_and_logs_once_per_10_s(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    listener = _FullListener()

    async def handler(stream: trio.abc.Stream, peer: Peer) -> None:
        raise AssertionError("nothing was accepted")

    gate = ConnectionGate.of(ConnectionLimits())
    with trio.move_on_after(30):
        await serve_listeners(handler, [cast(trio.SocketListener, listener)], gate)
    assert 300 <= listener.socket.accepts <= 301  # one every 0.1 s (as floats add up)
    lines = [r for r in caplog.records if "cannot accept" in r.getMessage()]
    assert len(lines) == 3  # at 0, 10 and 20 s
    assert all(r.exc_info is None for r in lines)
    assert "Too many open files" in lines[0].getMessage()


def test_the_file_budget_is_the_file_limit_less_a_reserve_or_half_of_a_small_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # (soft limit, budget for connections and segment files, connections when no file is open)
    for soft, budget, connections in ((256, 128, 64), (1024, 768, 704), (65536, 65280, 65216)):
        monkeypatch.setattr(resource, "getrlimit", lambda _, soft=soft: (soft, 65536))
        assert FileBudget.of_process().limit == budget
        assert ConnectionLimits().connection_limit() == connections


async def test_connections_and_segment_files_share_the_budget_and_idle_files_give_way() -> None:
    budget = FileBudget(limit=6, floor=2)
    idle = [0]  # segment files open that no thread uses

    def reclaim() -> bool:
        if not idle[0]:
            return False
        idle[0] -= 1
        budget.return_file()
        return True

    budget.reclaim = reclaim
    gate = ConnectionGate(limit=100, per_address=None, budget=budget)
    assert all(budget.take_file() for _ in range(6))
    assert not budget.take_file()  # full: the log must close one of its own first
    idle[0] = 4  # two of the six are in use
    assert gate.admit("a")  # one idle file closed for it
    assert (budget.connections, budget.files) == (1, 5)
    assert gate.admit("a") and gate.admit("a")
    assert (budget.connections, budget.files, idle[0]) == (3, 3, 1)
    # the last idle file gives way, and then the floor of 2 is kept for segment files
    assert gate.admit("a")
    assert (budget.connections, budget.files, idle[0]) == (4, 2, 0)
    assert not gate.admit("b")
    gate.leave("a")
    assert budget.connections == 3 and budget.take_file()


async def test_segment_files_past_their_floor_leave_headroom_for_new_connections() -> None:
    budget = FileBudget(limit=10, floor=2, headroom=3)
    assert sum(budget.take_file() for _ in range(10)) == 7  # then 3 places are left
    gate = ConnectionGate(limit=100, per_address=None, budget=budget)
    assert gate.admit("a") and gate.admit("a") and gate.admit("a")  # nothing to reclaim
    assert not gate.admit("a")
    assert not budget.take_file() and budget.take_file(beyond=True)
