"""Shedding whole groups when the broker cannot keep every member (docs/design.md#shedding-load).

The door keeps new work out while the broker's loop is behind, but the members already in may be
more than the broker can serve: a CPU quota lowered, a machine that got busy. Then every Ping is
late, every member's lease runs out, and all of them die together, each death a rebalance that
adds to the load: a collapse, not a degradation. So while the loop stays behind, each coordinator
lets whole groups go, the newest first, a share of its members at a time, until the lag comes
down: the members it keeps are served on time, and those it let go are told so over the
connection they have (StopFetcher 3, reason BROKER_BUSY, with the rest of their group's hold as
the hint), which costs one request each and no reconnection; they come back after the hint,
through the door as any newcomer. A member of an older level, which cannot read that, has its
connection closed and is refused until the hold is over.

A steady lag, not a stop: a stopped broker resumes once far behind and is on time at its next
wake (the stall test's broker keeps its members), so groups are shed only after the loop was
behind at several wakes in a row.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Protocol

import attrs
import trio

from coordinator.driver import GroupDriver

__all__ = ["Governor", "Lag"]

log = logging.getLogger(__name__)


class Lag(Protocol):
    @property
    def latest(self) -> float:
        """How late the loop's latest measured wake was (``coordinator.loop_lag.LoopLag``)."""
        ...


@attrs.define(eq=False)
class Governor:
    """One coordinator's share of the shedding: which of its groups to let go, and which of
    its groups are held out."""

    lag: Lag
    bound: float
    """Above this lag (seconds) at ``wakes`` wakes in a row, groups are shed: the door's bound,
    since a broker that already refuses newcomers and is still behind has more members than it
    can serve."""
    step: float = 0.5
    """Seconds between looks at the lag; the loop's lag lengthens each."""
    wakes: int = 2
    share: float = 0.25
    """Of the coordinator's live members, let go at each step the loop is still behind: the
    newest groups until at least this share."""
    held: dict[str, float] = attrs.field(factory=dict)
    """The groups shed, and until when each refuses registrations."""
    _behind: int = 0

    def retry_after(self, group_id: str, now: float) -> float | None:
        """How long a registration in ``group_id`` must wait (its group's hold), or None."""
        until = self.held.get(group_id)
        if until is None:
            return None
        if now >= until:
            del self.held[group_id]
            return None
        return until - now

    def look(self, groups: Mapping[str, GroupDriver], now: float) -> list[GroupDriver]:
        """The groups to shed now (none unless the loop has stayed behind): the newest first
        (``groups`` keeps the order they came to this coordinator), until ``share`` of the
        live members."""
        for group_id in [g for g, until in self.held.items() if until <= now]:
            del self.held[group_id]
        self._behind = self._behind + 1 if self.lag.latest > self.bound else 0
        if self._behind < self.wakes:
            return []
        # What is shed now shows in the lag only after the loop has caught up with the work
        # already queued: the next shedding waits for as many looks again.
        self._behind = 0
        live = {d: sum(m.machine.alive for m in d.group.members.values()) for d in groups.values()}
        wanted = math.ceil(self.share * sum(live.values()))
        chosen: list[GroupDriver] = []
        for driver in reversed(list(groups.values())):
            if wanted <= 0:
                break
            if live[driver] and driver.group_id not in self.held:
                chosen.append(driver)
                wanted -= live[driver]
        return chosen

    def shed(self, driver: GroupDriver, now: float) -> None:
        """Let ``driver``'s group go, and hold it out for its longest session timeout, by when
        its members' leases have run out and their re-registrations hold nothing; the members
        told are asked to wait that long."""
        hold = driver.group.longest_session_timeout()
        self.held[driver.group_id] = now + hold
        driver.feed(driver.group.shed, now, hold)

    async def run(
        self,
        groups: Mapping[str, GroupDriver],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        task_status.started()
        while True:
            await trio.sleep(self.step)
            now = trio.current_time()
            chosen = self.look(groups, now)
            if chosen:
                log.warning(
                    "the loop is %.1f s behind at %d looks in a row: shedding %d groups (%s)",
                    self.lag.latest,
                    self.wakes,
                    len(chosen),
                    ", ".join(d.group_id for d in chosen[:5]),
                )
            for driver in chosen:
                self.shed(driver, now)
