"""How far behind the event loop is (docs/design.md#a-broker-that-falls-behind).

A broker starved of CPU (a busy machine, a CPU quota, a stop) runs every task late, its Ping
deadlines included: an answer that arrived in time may still sit in a socket buffer when the
deadline is judged. The broker cannot tell such a miss from a silent member unless it knows that
it was itself behind, so one task per broker sleeps a short interval again and again and records
how late it woke. The lag belongs to the trio run, not to a broker (brokers run in one process
share its loop), so the figure lives in a run variable that any code in the run reads for free.
"""

from __future__ import annotations

import collections
from collections.abc import Callable

import attrs
import trio

__all__ = ["BEHIND", "SAMPLE_INTERVAL", "LoopLag", "watch_loop"]

#: How often the watcher wakes: the lag it sees is at most this stale.
SAMPLE_INTERVAL = 0.1
#: A lag at least this long means the loop is behind: a loop that keeps up wakes a sleeper within
#: a few milliseconds, and a tenth of a second is beyond any Ping round trip the broker measures
#: on a machine that keeps up (docs/benchmarks.md).
BEHIND = 0.1
#: Lags of at least BEHIND kept, newest last: enough to cover a Ping's life (2T/3) at any T the
#: broker accepts when the loop is behind at every sample.
KEPT = 4096

_RUN: trio.lowlevel.RunVar[LoopLag] = trio.lowlevel.RunVar("loop_lag")


@attrs.define(eq=False)
class LoopLag:
    """The loop's lag as the watchers last measured it, and when it was behind."""

    #: How late the latest wake-up was.
    latest: float = 0.0
    #: When a watcher asked to wake next (inf: no watcher is asleep).
    _asked: float = float("inf")
    #: (woke at, lag) for each wake-up at least BEHIND late: the loop was behind from
    #: ``woke at - lag`` to ``woke at``.
    _behind: collections.deque[tuple[float, float]] = attrs.field(
        factory=lambda: collections.deque(maxlen=KEPT)
    )

    @staticmethod
    def of_run() -> LoopLag:
        """The current trio run's: each run has one loop, so one lag."""
        try:
            return _RUN.get()
        except LookupError:
            lag = LoopLag()
            _RUN.set(lag)
            return lag

    def now(self) -> float:
        """The lag now: the latest measured, or longer if a watcher's wake-up is overdue (the
        loop is that far behind at this moment, though the watcher has not run yet)."""
        return max(self.latest, trio.current_time() - self._asked)

    def worst_since(self, since: float) -> float:
        """The longest lag of the loop at any time from ``since`` to now (0 if it was never
        :data:`BEHIND`)."""
        worst = self.now()
        for woke_at, lag in reversed(self._behind):
            if woke_at < since:
                break
            worst = max(worst, lag)
        return worst if worst >= BEHIND else 0.0

    def behind_since(self, since: float) -> bool:
        """Whether the loop was :data:`BEHIND` at any time from ``since`` to now: what
        ``worst_since(since) > 0`` says, without walking the kept lags (the heartbeat asks it
        for every deadline that passes, most often when the loop is behind)."""
        return self.now() >= BEHIND or (bool(self._behind) and self._behind[-1][0] >= since)

    def recent(self, window: float = 1.0) -> float:
        """The longest lag of the last ``window`` seconds, or now's if longer: one punctual
        wake between two stalls must not make a busy loop look idle (the door's figure,
        docs/design.md#shedding-load)."""
        return self.worst_since(trio.current_time() - window)

    def _sample(self, asked: float, woke_at: float) -> float:
        lag = max(0.0, woke_at - asked)
        self.latest = lag
        if lag >= BEHIND:
            self._behind.append((woke_at, lag))
        return lag


async def watch_loop(
    on_sample: Callable[[float], None] = lambda lag: None,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Measure the loop's lag until cancelled, telling ``on_sample`` each measure (a metric)."""
    lag = LoopLag.of_run()
    task_status.started()
    try:
        while True:
            asked = trio.current_time() + SAMPLE_INTERVAL
            lag._asked = min(lag._asked, asked)
            await trio.sleep_until(asked)
            lag._asked = float("inf")
            on_sample(lag._sample(asked, trio.current_time()))
    finally:
        lag._asked = float("inf")
