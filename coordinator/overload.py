"""Shedding whole groups when the broker cannot keep every member (docs/design.md#shedding-load).

The door keeps new work out while the broker is busy, but the members already in may be more
than the broker can serve: a CPU quota lowered, a machine that got busy. Then every Ping is late,
every member's lease runs out, and all of them die together, each death a rebalance that adds to
the load: a collapse, not a degradation. So while the broker is over what it can do, each
coordinator lets whole groups go, the newest first, until it is not: the members it keeps are
served on time, and those it let go are told so over the connection they have (StopFetcher 3,
reason BROKER_BUSY, with the rest of their group's hold as the hint), which costs one request
each and no reconnection; they come back after the hint, through the door as any newcomer. A
member of an older level, which cannot read that, has its connection closed and is refused until
the hold is over.

Over is either of two signs, each seen at several looks in a row. The broker used all the CPU it
may have (``coordinator/cpu_budget.py``): under a quota that is the first sign, seconds before
the loop's lag shows anything, and by the time the lag does every lease is at stake. Or the
loop stays behind: a machine busy with other work shows nothing else. One late wake is not
over: a stopped broker resumes once far behind and is on time at its next wake (the stall test's
broker keeps its members).

How much to let go: what is shed costs one more request per member and the end of its
connection before it saves anything, and each step is a burst of work for a loop already short,
so the first step should be the last. The broker knows what a member cost it while it kept up
(``CpuBudget.cost``), and so how many fit in what it may have now: when it uses all of it, it
lets go those beyond (with 9,000 members at 0.27 of a core and a quota of 0.125, 63% of them)
and no more while those kept fit, since then the CPU goes to the door's refusals and to members
leaving, not to the members (a crowd of newcomers uses all of it too, and is the door's to turn
away). Where the cost is unknown, or the loop is behind while the CPU is not all used (a machine
grown busy), half at the first step, then a quarter of those left at each.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Protocol

import attrs
import trio

from coordinator.driver import GroupDriver

__all__ = ["Budget", "Governor", "Lag"]

log = logging.getLogger(__name__)


class Lag(Protocol):
    @property
    def latest(self) -> float:
        """How late the loop's latest measured wake was (``coordinator.loop_lag.LoopLag``)."""
        ...


class Budget(Protocol):
    """The broker's CPU time against what it may have, and what a member costs it
    (``coordinator.cpu_budget.CpuBudget``)."""

    members: dict[object, int]

    def saturated(self) -> bool:
        """Whether the broker lately used all the CPU it may have."""
        ...

    def held(self) -> int:
        """Members held by every coordinator of the broker."""
        ...

    def room(self, keep: float) -> float | None:
        """How many members fit within ``keep`` of what the broker may have (None: unknown)."""
        ...


@attrs.define(eq=False)
class Governor:
    """One coordinator's share of the shedding: which of its groups to let go, and which of
    its groups are held out."""

    lag: Lag
    bound: float
    """Above this lag (seconds) at ``wakes`` looks in a row, the broker is over: the door's
    bound, since a broker that already refuses newcomers and is still behind has more members
    than it can serve."""
    budget: Budget | None = None
    """Saturated at ``wakes`` looks in a row, the broker is over, whatever the lag."""
    step: float = 0.5
    """Seconds between looks; the loop's lag lengthens each."""
    wakes: int = 2
    first_share: float = 0.5
    """Of the coordinator's members, let go at the first step the loop is behind: the newest
    groups until at least this share."""
    keep: float = 0.8
    """Of what the broker may have, what the members it keeps should need at most, at what a
    member cost it while it kept up: the rest is for the refusals, and for rebalances."""
    share: float = 0.25
    """Of those left, let go at each later step, while groups are still held out."""
    settle: float = 2.0
    """Seconds after a step before the next look counts: what was shed shows in the CPU used
    and in the lag only once the work already queued is done."""
    held: dict[str, float] = attrs.field(factory=dict)
    """The groups shed, and until when each refuses registrations."""
    _behind: int = 0
    _settled_at: float = -math.inf

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
        """The groups to shed now (none unless the broker has stayed over): the newest first
        (``groups`` keeps the order they came to this coordinator), until the step's share of
        the members."""
        for group_id in [g for g, until in self.held.items() if until <= now]:
            del self.held[group_id]
        members = {d: len(d.group.members) for d in groups.values()}
        if self.budget is not None:
            self.budget.members[self] = sum(members.values())
        if now < self._settled_at:
            return []
        share = self._over()
        self._behind = self._behind + 1 if share else 0
        if self._behind < self.wakes:
            return []
        self._behind = 0
        self._settled_at = now + self.settle
        wanted = math.ceil(
            share * sum(n for d, n in members.items() if d.group_id not in self.held)
        )
        chosen: list[GroupDriver] = []
        for driver in reversed(list(groups.values())):
            if wanted <= 0:
                break
            if members[driver] and driver.group_id not in self.held:
                chosen.append(driver)
                wanted -= members[driver]
        return chosen

    def _over(self) -> float:
        """The share of the members to let go if the broker is over now, else 0: as many as
        it holds beyond its room when it uses all its CPU; a step's share when its loop is
        behind."""
        share = 0.0
        if self.lag.latest > self.bound:
            share = self.share if self.held else self.first_share
        budget = self.budget
        if budget is not None and budget.saturated():
            room, held = budget.room(self.keep), budget.held()
            if room is not None and held > room:
                share = max(share, 1.0 - room / held)
        return share

    def forget(self) -> None:
        """This coordinator holds nothing any more (it stopped)."""
        if self.budget is not None:
            self.budget.members.pop(self, None)

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
        try:
            while True:
                await trio.sleep(self.step)
                now = trio.current_time()
                chosen = self.look(groups, now)
                if chosen:
                    budget = self.budget
                    log.warning(
                        "over capacity at %d looks in a row (the loop %.1f s behind; the CPU "
                        "%s; %s members held, room for %s): shedding %d groups, %d members (%s)",
                        self.wakes,
                        self.lag.latest,
                        "all used" if budget is not None and budget.saturated() else "not all used",
                        "?" if budget is None else budget.held(),
                        "?" if budget is None else _rounded(budget.room(self.keep)),
                        len(chosen),
                        sum(len(d.group.members) for d in chosen),
                        ", ".join(d.group_id for d in chosen[:5]),
                    )
                for driver in chosen:
                    self.shed(driver, now)
        finally:
            self.forget()


def _rounded(room: float | None) -> str:
    return "?" if room is None else str(math.floor(room))
