"""A follower's side of replication (DESIGN37 §2.3 REPLICA_FETCH, §2.4): what to fetch, and what
to do with the leader's answer. Pure: the runtime (broker/replica_fetcher.py) holds the log and
its epoch cache, asks :func:`fetch_position` what to send, and performs the :func:`next_step`.

Truncation rides in the fetch (KIP-320/595's diverging epoch, which replaces KIP-101's separate
OffsetsForLeaderEpoch round trip). Each fetch names the epoch of the follower's last record; a
leader whose log does not have that epoch up to the fetch offset answers with its own largest
epoch at or below it and where that ends, and no data. The follower truncates to the lesser of
that end and its own end of the same epoch, or, when it does not know the leader's epoch, to the
end of its own largest epoch below it, and fetches again. Each round cuts the follower's log
back to a point both logs agree on or further, so after repeated leader changes (KIP-279: a log
with several epochs the leader never had) it converges on the longest common prefix; never to the
follower's high watermark, which may be ahead of what the new leader has (KIP-101).

The epoch cache is the source of the epochs, since the batch header has no epoch field: a
leader's answer carries the entries of its cache that the returned records span, and the
follower writes them (durably) before it appends those records.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from protocol.errors import ErrorCode
from statemachine.partition_state import (
    NO_EPOCH,
    EpochStart,
    assign_epoch,
    epoch_end,
    truncate_epochs,
)

__all__ = [
    "Append",
    "BackOff",
    "FetchPosition",
    "LeaderAnswer",
    "RefreshLeader",
    "StartOver",
    "Step",
    "Truncate",
    "fetch_position",
    "learned_high_watermark",
    "next_step",
    "recovered_cache",
]


@attrs.frozen(kw_only=True)
class FetchPosition:
    """What a follower's fetch names for a partition."""

    fetch_offset: int
    #: The epoch of the follower's last record (NO_EPOCH: its log is empty).
    last_fetched_epoch: int


@attrs.frozen(kw_only=True)
class LeaderAnswer:
    """The leader's answer for one partition (REPLICA_FETCH's ReplicaFetchData): an error, or a
    diverging epoch (``diverging_end_offset`` >= 0), or data with the epochs it spans."""

    error_code: int = ErrorCode.NONE
    high_watermark: int = -1
    log_start_offset: int = -1
    diverging_epoch: int = NO_EPOCH
    diverging_end_offset: int = -1
    epoch_starts: tuple[EpochStart, ...] = ()


# --- what to do next -------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Append:
    """Write ``cache`` (durably) as the epoch cache, then append the answer's records, then
    learn the high watermark (:func:`learned_high_watermark`)."""

    cache: tuple[EpochStart, ...]
    leader_high_watermark: int


@attrs.frozen(kw_only=True)
class Truncate:
    """Cut the log to end at ``offset`` and write ``cache``, then fetch again (the leader
    checks the new position)."""

    offset: int
    cache: tuple[EpochStart, ...]


@attrs.frozen(kw_only=True)
class StartOver:
    """The leader no longer has the records the follower needs next (its log starts later):
    empty the log and the epoch cache, and start it at ``offset``."""

    offset: int


@attrs.frozen(kw_only=True)
class RefreshLeader:
    """This broker is not the partition's leader under the follower's epoch, or the topic is
    gone: follow the leader and epoch the state view shows once it shows others; while it still
    shows these (the leader has not learned its election, or the view lags), fetch again after
    the backoff."""

    code: int


@attrs.frozen(kw_only=True)
class BackOff:
    """Fetch again after the backoff: a leader that has not learned its election yet, a
    transient error, or an answer that does not fit the follower's log."""

    code: int
    reason: str


Step = Append | Truncate | StartOver | RefreshLeader | BackOff

#: Codes that say the follower's idea of the leader is out of date.
_REFRESH = frozenset(
    {
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        ErrorCode.FENCED_LEADER_EPOCH,
        ErrorCode.UNKNOWN_TOPIC_ID,
    }
)


def recovered_cache(cache: Sequence[EpochStart], log_end: int) -> tuple[EpochStart, ...]:
    """The epoch cache read at start, for the log as recovered: entries at or past its end
    (records lost with a torn tail, or a leader elected that wrote nothing) are dropped, so the
    first fetch names the epoch of the last record there really is."""
    return truncate_epochs(sorted(cache), log_end)


def fetch_position(cache: Sequence[EpochStart], log_end: int) -> FetchPosition:
    """The position to fetch from: the log end, and the epoch of the record before it."""
    epoch = NO_EPOCH
    for entry in cache:
        if entry.start_offset < log_end:
            epoch = entry.epoch
    return FetchPosition(fetch_offset=log_end, last_fetched_epoch=epoch)


def learned_high_watermark(leader_high_watermark: int, log_end: int) -> int:
    """A follower's high watermark: the leader's, as far as its own log reaches."""
    return min(leader_high_watermark, log_end)


def next_step(cache: Sequence[EpochStart], log_end: int, answer: LeaderAnswer) -> Step:
    """What a follower whose log ends at ``log_end`` with ``cache`` does with ``answer``."""
    code = answer.error_code
    if code in _REFRESH:
        return RefreshLeader(code=code)
    if code == ErrorCode.OFFSET_OUT_OF_RANGE and answer.log_start_offset > log_end:
        return StartOver(offset=answer.log_start_offset)
    if code != ErrorCode.NONE:
        return BackOff(code=code, reason="the leader could not answer")
    if answer.diverging_end_offset >= 0:
        return _truncation(cache, log_end, answer.diverging_epoch, answer.diverging_end_offset)
    return _append(cache, log_end, answer)


def _truncation(
    cache: Sequence[EpochStart], log_end: int, leader_epoch: int, leader_end: int
) -> Truncate:
    """Where to cut: both logs agree up to the lesser end of the leader's epoch on each side.
    If the follower does not have the leader's epoch, the end of its own largest epoch below it
    is as far as they can agree; the next fetch checks further back if need be."""
    own_epoch, own_end = epoch_end(cache, log_end, leader_epoch)
    if own_epoch == NO_EPOCH:
        offset = min(leader_end, log_end)
    elif own_epoch != leader_epoch:
        offset = min(own_end, log_end)
    else:
        offset = min(own_end, leader_end, log_end)
    offset = max(offset, 0)
    return Truncate(offset=offset, cache=truncate_epochs(cache, offset))


def _append(cache: Sequence[EpochStart], log_end: int, answer: LeaderAnswer) -> Step:
    """The cache once the answer's records are appended at ``log_end``: each epoch they start
    is assigned where it starts. An entry before ``log_end`` must be the follower's own last
    epoch, or the leader should have said the logs diverge. An epoch of this replica's own
    that begins at ``log_end`` holds no record (it led, wrote nothing, and was deposed): the
    records appended there are the leader's, of the leader's epochs, so it goes."""
    new = truncate_epochs(cache, log_end)
    last = fetch_position(cache, log_end).last_fetched_epoch
    for entry in sorted(answer.epoch_starts):
        if entry.start_offset < log_end:
            if entry.epoch != last:
                return BackOff(code=ErrorCode.NONE, reason=f"{entry} does not fit this log")
            continue
        new = assign_epoch(new, entry.epoch, entry.start_offset)
    return Append(cache=new, leader_high_watermark=answer.high_watermark)
