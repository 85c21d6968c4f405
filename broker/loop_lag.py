"""How late the broker's own event loop is: one task sleeps a short interval again and again and
records how much later than asked it woke. A loop that is behind wakes everything late (reads,
Ping deadlines, this task alike), so its lateness is the broker's own delay, not its peers'.

``LoopLag.now()`` is the figure the rest of the broker reads, cheaply and without waiting: the
largest lateness of the last ``window`` seconds, so one punctual wake between two stalls does not
make a busy loop look idle, or how overdue the task's own wake is now, if more: the work a stall
held back runs before the task wakes, and must see the stall.
"""

from __future__ import annotations

import collections

import attrs
import trio

__all__ = ["LoopLag"]


@attrs.define(eq=False)
class LoopLag:
    interval: float = 0.1
    """How long the task asks to sleep each time."""
    window: float = 1.0
    """How long a late wake counts."""
    _wakes: collections.deque[tuple[float, float]] = attrs.field(factory=collections.deque)
    """(when it woke, how late), oldest first, for the last ``window``."""
    _due: float = float("inf")
    """When the task asked to wake next."""

    def now(self) -> float:
        """The loop's lateness in seconds: 0 for a loop that keeps up."""
        now = trio.current_time()
        self._forget(now)
        return max(now - self._due, max((late for _, late in self._wakes), default=0.0), 0.0)

    def record(self, woke: float, late: float) -> None:
        self._forget(woke)
        self._wakes.append((woke, max(0.0, late)))

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            due = self._due = trio.current_time() + self.interval
            await trio.sleep_until(due)
            woke = trio.current_time()
            self.record(woke, woke - due)

    def _forget(self, now: float) -> None:
        while self._wakes and self._wakes[0][0] < now - self.window:
            self._wakes.popleft()
