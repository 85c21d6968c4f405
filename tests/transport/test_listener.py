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

from transport.limits import ConnectionLimits
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


def test_under_a_small_file_limit_half_of_it_is_kept_for_connections(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(resource, "getrlimit", lambda _: (1024, 4096))
    assert ConnectionLimits().connection_limit() == 512
    monkeypatch.setattr(resource, "getrlimit", lambda _: (65536, 65536))
    assert ConnectionLimits().connection_limit() == 65536 - 1024
