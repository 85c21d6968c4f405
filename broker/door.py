"""Shedding load at the door: while the broker's own loop is behind, it takes no new work it
can put off, so that the members it already serves keep getting their Pings on time
(docs/design.md#shedding-load).

What is put off: the requests of a new connection (one none of whose requests was served
yet: a newcomer's discovery, a registration), and admin requests. What never is: a
re-registration that lists partitions it still fetches (a member whose lease is at stake, which
a refusal could cost its partitions) nor the discovery before it (a ClusterMetadata marked
``leased``), and every request of a member or a fetcher already in. A
shed request is answered at once, without touching the store or a coordinator: BROKER_BUSY with
a back-off hint where the request's version carries ``throttle_time_ms``, COORDINATOR_NOT_AVAILABLE
otherwise (every level's reference client retries it with backoff; SPEC.md §11.7).

A refusal costs the broker about what a Ping round trip costs several times over (a connection
accepted, a request read, an answer, a close: about 250 µs of a core, measured), and a broker
over its quota with thousands of members let go and coming back after their hints would spend
all it has refusing them. So while it is busy the broker also paces its accepts
(``AcceptPace``): newcomers wait in the kernel's listen queue, shortened meanwhile, at no cost to
the broker, and the few accepted are refused as before; what the kernel turns away is tried
again by the client's own connect.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import attrs

from broker import rights
from coordinator.cpu_budget import ONE_CORE, CpuBudget
from protocol import (
    ApiKey,
    ClusterMetadataRequest,
    ClusterMetadataResponse,
    CreatePartitionsRequest,
    CreateTopicRequest,
    DeleteGroupRequest,
    DeleteTopicRequest,
    DescribeGroupRequest,
    ErrorCode,
    ListGroupsRequest,
    RegisterConsumerRequest,
    RegisterConsumerResponse,
    Request,
    ResponseMessage,
    error_response,
)

__all__ = ["BOUND", "AcceptPace", "Door", "Lag"]

#: The first version of ClusterMetadata and of RegisterConsumer whose answer carries
#: ``throttle_time_ms`` (level 11).
HINTED_VERSION = {ApiKey.CLUSTER_METADATA: 4, ApiKey.REGISTER_CONSUMER: 3}

#: Requests put off wherever they come on a connection.
ADMIN = (
    CreateTopicRequest
    | CreatePartitionsRequest
    | DeleteTopicRequest
    | ListGroupsRequest
    | DescribeGroupRequest
    | DeleteGroupRequest
    | rights.RightsRequest
)


class Lag(Protocol):
    def recent(self) -> float:
        """How late the broker's own loop has been lately, in seconds
        (``coordinator.loop_lag.LoopLag.recent``)."""
        ...


#: The loop lag (seconds) above which new work waits (``Door.bound``'s default).
BOUND = 0.5


@attrs.define(eq=False)
class Door:
    lag: Lag
    bound: float = BOUND
    """Above this loop lag (seconds), new work waits: a third of what a member with T = 6 s can
    bear (T/3 less the lease margin, docs/design.md#shedding-load), so shedding starts long
    before lag could cost a member; and above the pauses a loaded machine gives a process now
    and then, so a broker that keeps up does not turn clients away for them."""
    retry_after: float = 1.0
    """The least back-off hint sent; a loop further behind asks for twice its lag, up to
    ``max_retry_after``."""
    max_retry_after: float = 10.0
    shed: int = 0
    """Requests refused so far."""
    on_shed: Callable[[], object] | None = None
    """Called for each request refused (the broker's metric)."""
    budget: CpuBudget | None = None
    """The broker's CPU time against what it may have: while most of it is used, new work waits
    whatever the lag says (``coordinator/cpu_budget.py``), and is told to come back after
    ``max_retry_after``, since only members leaving free room."""

    def busy(self) -> bool:
        """Whether new work waits now: the loop behind, or the CPU budget spent."""
        return self._pressure() is not None

    def _pressure(self) -> tuple[float, bool] | None:
        """(the loop's lag, whether the CPU budget is spent) while new work waits, else None."""
        lag = self.lag.recent()
        spent = self.budget is not None and self.budget.spent()
        return (lag, spent) if lag > self.bound or spent else None

    def refusal(self, request: Request, *, first: bool) -> ResponseMessage | None:
        """The answer that puts ``request`` off (``first``: no request of its connection was
        served yet), or None to serve it."""
        message = request.message
        if not (first or isinstance(message, ADMIN)):
            return None
        if isinstance(message, RegisterConsumerRequest) and message.owned_partitions:
            return None
        if isinstance(message, ClusterMetadataRequest) and message.leased:
            return None  # the discovery before such a re-registration
        if not isinstance(message, ClusterMetadataRequest | RegisterConsumerRequest | ADMIN):
            return None  # a fetcher's or a producer's data, not the group's load
        pressure = self._pressure()
        if pressure is None:
            return None
        lag, spent = pressure
        self.shed += 1
        if self.on_shed is not None:
            self.on_shed()
        if isinstance(message, ADMIN) or request.api_version < HINTED_VERSION[message.API_KEY]:
            return error_response(message, ErrorCode.COORDINATOR_NOT_AVAILABLE)
        longest = self.max_retry_after if spent else max(self.retry_after, 2 * lag)
        wait = round(1000 * min(self.max_retry_after, longest))
        if isinstance(message, RegisterConsumerRequest):
            return RegisterConsumerResponse(
                error_code=ErrorCode.BROKER_BUSY,
                coordinator_epoch=-1,
                generation=-1,
                throttle_time_ms=wait,
            )
        return ClusterMetadataResponse(
            error_code=ErrorCode.BROKER_BUSY,
            coordinator_id=-1,
            coordinator_epoch=-1,
            brokers=(),
            topics=(),
            throttle_time_ms=wait,
        )


#: CPU seconds a newcomer refused at the door costs the broker: accepted, its first request read
#: and answered, closed (measured with a loop of connecting clients: 252 µs on this project's
#: machines).
REFUSAL_COST = 250e-6
#: The listen queue while accepts are paced: about a second of paced accepts at an eighth to a
#: quarter of a core (50 to 100 a second), so that a client queued is accepted before its request
#: times out, and few wait for an answer from a broker that can give none.
PACED_BACKLOG = 64


@attrs.define(eq=False)
class AcceptPace:
    """How fast the broker accepts connections: at once while the door is open, and while it is
    busy so that accepting and refusing takes at most ``share`` of the CPU the broker may have
    (Kafka paces its accepts the same way for its connection-rate quota, KIP-612)."""

    door: Door
    share: float = 0.1
    backlog: int = PACED_BACKLOG
    _next: float = 0.0

    def delay(self, now: float) -> float | None:
        """Seconds to wait before the next accept (0: accept now, and count it); None while
        the door is open."""
        if not self.door.busy():
            return None
        if now < self._next:
            return self._next - now
        limit = ONE_CORE if self.door.budget is None else self.door.budget.limit
        self._next = now + REFUSAL_COST / (self.share * limit)
        return 0.0
