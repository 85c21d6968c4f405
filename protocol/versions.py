"""Which versions of its requests the coordinator may send a member (SPEC.md §3, "Versions both
ways"), and the rule it serves the member by.

Requests flow both ways, so the broker too must send only what its peer reads. A consumer says
what it reads of the three coordinator requests in RegisterConsumer (version 2 on); a request of
an older version says nothing in words, but its version dates the client: version 1 appeared
together with PING 1, STOP_FETCHER 2 and START_FETCHER 2, so a client that sends it was written
against a broker sending those; version 0 is taken as a client of version 0 of everything (the
levels before RegisterConsumer 1 are indistinguishable on the wire). The coordinator then sends
each request in the newest version both sides serve, and a member that cannot read a field a
rule needs is served by the rule it can follow (:class:`PeerVersions`), or refused at
registration where no such rule keeps the invariants.

Pure functions of the request: no I/O, as everything in ``protocol``.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TypeVar

import attrs

from .errors import ErrorCode
from .messages import (
    COORDINATOR_REQUESTS,
    NEWEST_VERSION,
    ApiKey,
    RegisterConsumerRequest,
    RequestMessage,
    StartFetcherRequest,
)

__all__ = ["IMPLIED", "SHED_STOP_VERSION", "PeerVersions", "Refusal", "fit", "negotiate"]

#: What a RegisterConsumer of each version before 2 says the consumer reads of the coordinator
#: requests: the newest the brokers of its time sent (SPEC.md §3's levels).
IMPLIED: Mapping[int, Mapping[ApiKey, int]] = MappingProxyType(
    {
        0: MappingProxyType({ApiKey.PING: 0, ApiKey.STOP_FETCHER: 0, ApiKey.START_FETCHER: 0}),
        1: MappingProxyType({ApiKey.PING: 1, ApiKey.STOP_FETCHER: 2, ApiKey.START_FETCHER: 2}),
    }
)

#: Ranges a RegisterConsumer may list: one per api key at most, and there are not many keys.
MAX_RANGES = 64

#: The first StopFetcher that can tell a member its group was let go, with a back-off hint
#: (reason BROKER_BUSY and ``throttle_time_ms``, level 13), and the first RegisterConsumer whose
#: answer carries that hint: a consumer registering with an older one is sent no StopFetcher
#: newer than version 2, so that a member told it was shed is always one that can be refused
#: BROKER_BUSY with the hint when it comes back early (SPEC.md §11.7).
SHED_STOP_VERSION = 3
HINTED_REGISTRATION = 3


@attrs.frozen(kw_only=True)
class PeerVersions:
    """The version of each coordinator request the coordinator sends one member."""

    ping: int
    stop_fetcher: int
    start_fetcher: int

    def of(self, api_key: ApiKey) -> int:
        if api_key is ApiKey.PING:
            return self.ping
        if api_key is ApiKey.STOP_FETCHER:
            return self.stop_fetcher
        if api_key is ApiKey.START_FETCHER:
            return self.start_fetcher
        return NEWEST_VERSION[api_key]

    @property
    def follows_lease(self) -> bool:
        """Whether the member keeps the ownership lease (SPEC.md §1): it reads the frame counts
        its lease runs from. A member that does not fetches until it is told to stop or its
        connection ends, and is served by docs/design.md#old-clients' weaker rule."""
        return self.ping >= 1

    @property
    def incremental(self) -> bool:
        """Whether the member reads a partial StopFetcher and an incremental StartFetcher; one
        that does not is stopped and started whole (the eager protocol) whenever its assignment
        changes, inside a group that is otherwise incremental."""
        return self.stop_fetcher >= 2 and self.start_fetcher >= 2

    @property
    def told_when_shed(self) -> bool:
        """Whether a broker that lets the member's group go tells it over its connection
        (StopFetcher 3, reason BROKER_BUSY, with the hint), and refuses it BROKER_BUSY with the
        hint if it registers again before the hold ends; one that does not is let go by closing
        its connection, and refused COORDINATOR_NOT_AVAILABLE (docs/design.md#shedding-load)."""
        return self.stop_fetcher >= SHED_STOP_VERSION

    @property
    def level(self) -> str:
        return (
            f"PING {self.ping}, STOP_FETCHER {self.stop_fetcher},"
            f" START_FETCHER {self.start_fetcher}"
        )


#: What a consumer of this package reads: the newest of each.
NEWEST = PeerVersions(
    ping=NEWEST_VERSION[ApiKey.PING],
    stop_fetcher=NEWEST_VERSION[ApiKey.STOP_FETCHER],
    start_fetcher=NEWEST_VERSION[ApiKey.START_FETCHER],
)


@attrs.frozen(kw_only=True)
class Refusal:
    """A registration no rule can serve: refused with ``error_code`` and ``message`` (an error
    frame), never accepted and then lost."""

    error_code: ErrorCode
    message: str


def negotiate(request: RegisterConsumerRequest, api_version: int) -> PeerVersions | Refusal:
    """The versions to send the consumer that registered with ``request`` (sent in version
    ``api_version``), or why it cannot be a member."""
    if api_version in IMPLIED:
        served = {key: (0, newest) for key, newest in IMPLIED[api_version].items()}
    else:
        listed = request.served_versions
        if len(listed) > MAX_RANGES:
            return Refusal(
                error_code=ErrorCode.INVALID_REQUEST,
                message=f"served_versions lists {len(listed)} ranges, more than {MAX_RANGES}",
            )
        served = {key: (0, 0) for key in COORDINATOR_REQUESTS}
        seen: set[int] = set()
        for entry in listed:
            if entry.api_key in seen or not 0 <= entry.min_version <= entry.max_version:
                return Refusal(
                    error_code=ErrorCode.INVALID_REQUEST,
                    message=f"served_versions: a repeated api key or a bad range: {entry}",
                )
            seen.add(entry.api_key)
            if entry.api_key in COORDINATOR_REQUESTS:  # the others are not ours to send
                served[ApiKey(entry.api_key)] = (entry.min_version, entry.max_version)
    if api_version < HINTED_REGISTRATION:
        low, high = served[ApiKey.STOP_FETCHER]
        served[ApiKey.STOP_FETCHER] = (low, min(high, SHED_STOP_VERSION - 1))
    chosen: dict[ApiKey, int] = {}
    for key, (low, high) in served.items():
        version = min(high, NEWEST_VERSION[key])
        if version < low:
            return Refusal(
                error_code=ErrorCode.UNSUPPORTED_VERSION,
                message=f"{key.name}: the consumer reads versions {low}-{high}, this broker sends"
                f" 0-{NEWEST_VERSION[key]}",
            )
        chosen[key] = version
    versions = PeerVersions(
        ping=chosen[ApiKey.PING],
        stop_fetcher=chosen[ApiKey.STOP_FETCHER],
        start_fetcher=chosen[ApiKey.START_FETCHER],
    )
    if request.instance_id is not None and versions.stop_fetcher < 2:
        # Fencing an older process says why in StopFetcher's reason (version 2), and nothing
        # else tells it never to come back: SPEC.md §11.11.
        return Refusal(
            error_code=ErrorCode.UNSUPPORTED_VERSION,
            message="a static member (instance_id) must read STOP_FETCHER version 2 or newer;"
            f" this one reads {versions.stop_fetcher}",
        )
    return versions


M = TypeVar("M", bound=RequestMessage)


def fit(message: M, version: int) -> M:
    """``message`` as version ``version`` carries it: ``acknowledged_frames``, which an older
    version lacks, becomes -1 (SPEC.md §1: not given, renews nothing), and StartFetcher's
    ``topic_ids`` are left out before version 3 (SPEC.md §11.12). Every other field the version
    lacks must already hold its default, or the Connection refuses to send it: dropping it would
    change what the request means."""
    if version < 1 and getattr(message, "acknowledged_frames", -1) != -1:
        message = attrs.evolve(message, acknowledged_frames=-1)  # type: ignore[arg-type]
    if isinstance(message, StartFetcherRequest) and version < 3 and message.topic_ids:
        # A consumer before version 3 fetches by name alone: docs/design.md#topic-ids says
        # what it is promised when a topic it reads is created again.
        message = attrs.evolve(message, topic_ids=())
    return message
