"""Failure detection (docs/design.md#failure-detection) for every member of a coordinator, from
one task.

Each member is sent a Ping every T/3, each due within 2T/3, and none while the previous one is
outstanding. A task per member costs a timer wake-up, a cancel scope and an Event per Ping, and at
thousands of members those are most of the coordinator's CPU. Here one scheduler keeps every due
Ping and every Ping deadline in one heap, sends Pings with :meth:`Channel.request_nowait`, and the
connection's reader hands each answer straight back: a Ping round trip costs the coordinator a
frame out, a frame in, and two heap operations.

A broker that falls behind (docs/design.md#a-broker-that-falls-behind) judges its members on
what they did, not on what it failed to read: answers already waiting are read before a deadline
is judged, and a miss while the loop was behind is not counted, the next Ping going out at once
instead.
"""

from __future__ import annotations

import heapq
import itertools
import math

import attrs
import trio

from coordinator.context import CoordinatorContext
from coordinator.driver import Member
from coordinator.loop_lag import LoopLag
from protocol import LocalProtocolError, PingRequest, PingResponse, ResponseMessage
from transport.channel import ChannelClosed

#: Due Pings sent before the scheduler lets other tasks run: a crowd whose Pings fall due
#: together must not hold up the connections that carry their answers.
BATCH = 64

#: A Ping held back while the coordinator is out of contact with its store is tried again after
#: this fraction of the Ping interval.
OUT_OF_CONTACT_RETRY = 1 / 4


@attrs.define(eq=False)
class _Ping:
    """A Ping sent and not yet answered or given up on."""

    member: Member
    sent_at: float
    #: When the Ping before this one was sent (-inf: this is the member's first).
    previous_sent_at: float
    generation: int
    correlation_id: int


@attrs.define(eq=False)
class Pinger:
    """Sends the Pings and posts what becomes of each to the member's group driver."""

    context: CoordinatorContext
    #: (when, tie-breaker, what): a Member whose next Ping is due then, or a _Ping whose deadline
    #: passes then. Entries that no longer apply (a dead member, an answered Ping) are skipped.
    _due: list[tuple[float, int, Member | _Ping]] = attrs.field(factory=list)
    _order: itertools.count[int] = attrs.field(factory=itertools.count)
    _outstanding: dict[Member, _Ping] = attrs.field(factory=dict)
    _sleep: trio.CancelScope | None = None

    def add(self, member: Member) -> None:
        """A member registered: its first Ping is due one interval from now."""
        self._schedule(trio.current_time() + member.machine.timeouts.ping_interval, member)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            with trio.CancelScope(deadline=self._due[0][0] if self._due else math.inf) as sleep:
                self._sleep = sleep
                await trio.sleep_forever()
            self._sleep = None
            sent = 0
            passed: list[_Ping] = []
            while self._due and self._due[0][0] <= trio.current_time():
                _, _, item = heapq.heappop(self._due)
                if isinstance(item, _Ping):
                    passed.append(item)
                elif self._send(item):
                    sent += 1
                    if sent % BATCH == 0:
                        await trio.lowlevel.checkpoint()
            if passed:
                # Answers that arrived before their deadline may still wait in socket buffers
                # (the loop was stopped, or is behind): the first pass lets the loop poll the
                # sockets and wake their readers, the second lets the readers hand the answers
                # back, before any deadline is judged.
                await trio.lowlevel.checkpoint()
                await trio.lowlevel.checkpoint()
                for ping in passed:
                    self._deadline_passed(ping)

    def _schedule(self, at: float, item: Member | _Ping) -> None:
        heapq.heappush(self._due, (at, next(self._order), item))
        if self._sleep is not None and at < self._sleep.deadline:
            self._sleep.deadline = at

    def _send(self, member: Member) -> bool:
        state = member.state
        machine = state.machine
        if not machine.alive or member in self._outstanding:
            return False
        now = trio.current_time()
        if now >= self.context.store.in_contact_until():
            # Perhaps deposed: renew no lease (docs/design.md#coordinator-epochs-and-the-election).
            # No deadline runs, since nothing was sent; the Ping is tried again soon, so that it
            # reaches the member within its lease once contact comes back.
            member.driver.ping_withheld(member)
            if not machine.timeouts.follows_lease:
                return False
            self._schedule(now + machine.timeouts.ping_interval * OUT_OF_CONTACT_RETRY, member)
            return False
        # A member whose lease ran out stopped by its own rule; a Ping would restart it, so its
        # group declares it dead instead (docs/design.md#ownership-lease).
        if not member.driver.ping_sent(member, now):
            return False
        request = PingRequest(
            coordinator_epoch=self.context.epoch,
            generation=machine.generation,
            consumer_id=state.record.member_id,
            num_retries=machine.missed,
            acknowledged_frames=member.channel.frames_received,
        )
        ping = _Ping(
            member=member,
            sent_at=now,
            previous_sent_at=member.pinged_at,
            generation=request.generation,
            correlation_id=-1,
        )
        member.pinged_at = now

        def on_response(response: ResponseMessage | None) -> None:
            self._answered(ping, response)

        try:
            ping.correlation_id = member.request_nowait(request, on_response)
        except ChannelClosed:
            return False  # the connection task declares the member dead
        except LocalProtocolError as exc:
            # Only this member's failure: the scheduler serves every member of the broker.
            self.context.nursery.start_soon(member.driver.close_unsendable, member, exc)
            return False
        self._outstanding[member] = ping
        self._schedule(now + machine.timeouts.response_deadline, ping)
        return True

    def _answered(self, ping: _Ping, response: ResponseMessage | None) -> None:
        member = ping.member
        if self._outstanding.get(member) is not ping:
            return
        del self._outstanding[member]
        if response is None:
            return  # the connection ended; its task declares the member dead
        now = trio.current_time()
        machine = member.state.machine
        if isinstance(response, PingResponse) and machine.alive:
            member.driver.ping_answered(member, ping.generation, response.offsets, now)
            self.context.observer.ping_answered(now - ping.sent_at)
        self._schedule(max(_next_due(ping, machine.timeouts.ping_interval), now), member)

    def _deadline_passed(self, ping: _Ping) -> None:
        member = ping.member
        if self._outstanding.get(member) is not ping:
            return  # answered in time
        del self._outstanding[member]
        member.channel.abandon(ping.correlation_id)
        if not member.machine.alive:
            return
        now = trio.current_time()
        if self._excused(ping, now):
            # The next Ping goes now, through the member machine: if the lease as the
            # coordinator counts it has run out, sending it declares the member dead instead.
            self.context.observer.ping_excused()
            self._schedule(now, member)
            return
        self.context.observer.ping_missed()
        member.driver.ping_missed(member)
        if member.machine.alive:  # more misses allowed: the next Ping goes now
            self._schedule(now, member)

    @staticmethod
    def _excused(ping: _Ping, now: float) -> bool:
        """Whether a miss says more about this broker than about the member: the loop was
        behind while the Ping was out, so the answer may be late for the broker's own reasons,
        and the broker read the member's last answer less than T ago. The member's lease runs
        at most T from a frame it queued before the broker read it, so past that a Ping could
        only reach a lease that has lapsed (docs/design.md#a-broker-that-falls-behind), and
        the miss counts as it always did: a silent member dies at most one deadline later."""
        machine = ping.member.machine
        behind = LoopLag.of_run().behind_since(ping.sent_at)
        return behind and now < machine.last_heard + machine.timeouts.session_timeout


def _next_due(ping: _Ping, interval: float) -> float:
    """When the Ping after ``ping`` falls due: two intervals after the one before ``ping`` was
    sent, but at least half an interval after ``ping`` (docs/design.md#a-broker-that-falls-behind).
    A member's lease spans two of its Pings, so what keeps it is that no two Pings in a row are
    more than T apart: after a Ping sent D late the next comes D early (at most half an interval
    early), and a broker steadily L behind sends them T/3 + L/2 apart, fewer than on time, each
    pair at most 2T/3 + L apart. The half interval keeps a broker that was stopped from sending
    every member two Pings at once when it resumes, when it is furthest behind. On time, as for a
    member's first Ping, it is one interval after ``ping`` was sent."""
    if ping.previous_sent_at == -math.inf:
        return ping.sent_at + interval
    return max(ping.previous_sent_at + 2 * interval, ping.sent_at + interval / 2)
