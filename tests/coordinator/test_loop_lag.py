"""The loop-lag watcher (coordinator/loop_lag.py) on the autojump clock: a stopped loop is a jump
of the clock with no task running, as SIGSTOP leaves a process."""

import pytest
import trio
import trio.testing

from coordinator.loop_lag import LoopLag, watch_loop


async def test_the_lag_is_how_late_the_watcher_woke(
    autojump_clock: trio.testing.MockClock,
) -> None:
    lag = LoopLag.of_run()
    samples: list[float] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(watch_loop, samples.append)  # at 0.0, asks to wake at 0.1
        await trio.sleep(0.05)
        assert lag.now() == 0.0
        autojump_clock.jump(0.5)  # the loop stopped from 0.05 to 0.55
        # Behind already, before the watcher has run: its wake-up is overdue.
        assert lag.now() == pytest.approx(0.45)
        await trio.sleep(0.01)
        assert samples == [pytest.approx(0.45)]
        await trio.sleep_until(0.7)  # woke at 0.65, on time
        assert samples[-1] == 0.0
        assert lag.now() == 0.0
        # Behind from 0.1 to 0.55: seen from any instant up to then, not from later.
        assert lag.worst_since(0.0) == pytest.approx(0.45)
        assert lag.worst_since(0.55) == pytest.approx(0.45)
        assert lag.worst_since(0.6) == 0.0
        assert (lag.behind_since(0.0), lag.behind_since(0.55), lag.behind_since(0.6)) == (
            True,
            True,
            False,
        )
        nursery.cancel_scope.cancel()


async def test_a_lag_under_a_tenth_of_a_second_is_not_behind(
    autojump_clock: trio.testing.MockClock,
) -> None:
    lag = LoopLag.of_run()
    async with trio.open_nursery() as nursery:
        await nursery.start(watch_loop)
        await trio.sleep(0.05)
        autojump_clock.jump(0.1)  # woke at 0.15 for 0.1: 0.05 late
        await trio.sleep(0.01)
        assert lag.latest == pytest.approx(0.05)
        assert lag.worst_since(0.0) == 0.0
        assert not lag.behind_since(0.0)
        nursery.cancel_scope.cancel()


async def test_without_a_watcher_the_loop_is_never_behind() -> None:
    lag = LoopLag.of_run()
    assert lag.now() == 0.0
    assert lag.worst_since(-1.0) == 0.0
    assert not lag.behind_since(-1.0)
