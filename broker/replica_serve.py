"""A leader's answer to REPLICA_FETCH (DESIGN37 §2.3): for each partition a follower names, its
records from the fetch offset up to the log end with the epochs they were written under, the
high watermark and the log start; or where the follower's log diverges from this one (no data:
it truncates and asks again); or why not (an epoch of another election, not led here).

Each partition's fetch offset is the follower's position for the leader's machine
(``FollowerFetched``), which may move the high watermark and answer acks=all produces. A fetch
that finds nothing new is held, up to its ``max_wait_ms``, until a partition led here grows or
its high watermark moves (the long poll), so that an idle follower costs one request per wait.
"""

from __future__ import annotations

import trio

from broker.data_plane import MAX_FETCH_BYTES
from broker.log import OffsetOutOfRange
from broker.replicas import ReplicaManager
from protocol import (
    EpochStart,
    ErrorCode,
    ReplicaFetchData,
    ReplicaFetchPartition,
    ReplicaFetchRequest,
    ReplicaFetchResponse,
)
from protocol.batches import batch_spans
from protocol.replica_messages import MAX_REPLICA_WAIT_MS
from statemachine import replica_leader as rl
from statemachine.partition_state import PartitionKey


def _refused(wanted: ReplicaFetchPartition, code: ErrorCode, **fields: int) -> ReplicaFetchData:
    return ReplicaFetchData(
        topic_id=wanted.topic_id,
        partition=wanted.partition,
        error_code=code,
        high_watermark=fields.get("high_watermark", -1),
        log_start_offset=fields.get("log_start_offset", -1),
        diverging_epoch=fields.get("diverging_epoch", -1),
        diverging_end_offset=fields.get("diverging_end_offset", -1),
        epoch_starts=(),
        batches=b"",
    )


def _news(data: ReplicaFetchData, before: ReplicaFetchData | None) -> bool:
    """Whether an answer is worth sending before the wait is over: records, an error, a
    divergence, or a high watermark that moved while the fetch was held."""
    return (
        bool(data.batches)
        or data.error_code is not ErrorCode.NONE
        or data.diverging_end_offset >= 0
        or (before is not None and before.high_watermark != data.high_watermark)
    )


async def answer_replica_fetch(
    manager: ReplicaManager, message: ReplicaFetchRequest
) -> ReplicaFetchResponse:
    """The answer for every partition ``message`` names, held until there is news or its
    ``max_wait_ms`` passed (bounded by ``broker.dispatch`` before it gets here)."""
    wait = min(max(message.max_wait_ms, 0), MAX_REPLICA_WAIT_MS) / 1000
    deadline = trio.current_time() + wait
    first: tuple[ReplicaFetchData, ...] | None = None
    while True:
        changed = manager.changed
        answers = await _round(manager, message)
        if first is None:
            first = answers
        if any(_news(a, b) for a, b in zip(answers, first, strict=True)):
            break
        if trio.current_time() >= deadline:
            break
        with trio.move_on_at(deadline):
            await changed.wait()
    return ReplicaFetchResponse(error_code=ErrorCode.NONE, partitions=answers)


async def _round(
    manager: ReplicaManager, message: ReplicaFetchRequest
) -> tuple[ReplicaFetchData, ...]:
    budget = max(1, min(message.max_bytes, MAX_FETCH_BYTES))
    answers = []
    for wanted in message.partitions:
        answer = await _partition(manager, message, wanted, budget)
        budget -= len(answer.batches)
        answers.append(answer)
    return tuple(answers)


async def _partition(
    manager: ReplicaManager,
    message: ReplicaFetchRequest,
    wanted: ReplicaFetchPartition,
    budget: int,
) -> ReplicaFetchData:
    key = PartitionKey(topic_id=wanted.topic_id, partition=wanted.partition)
    led = manager.led.get(key)
    if led is None or not manager.current(led):
        placement = manager.by_topic_id().get(key.topic_id)
        if placement is None:
            return _refused(wanted, ErrorCode.UNKNOWN_TOPIC_ID)
        state = manager.states.get(key)
        if (
            state is not None
            and state.leader == manager.broker_id
            and state.leader_epoch >= wanted.leader_epoch
        ):
            # elected, not leading yet: the follower's view is ahead of this broker's
            return _refused(wanted, ErrorCode.UNKNOWN_LEADER_EPOCH)
        return _refused(wanted, ErrorCode.NOT_LEADER_OR_FOLLOWER)
    if wanted.leader_epoch < led.epoch:
        return _refused(wanted, ErrorCode.FENCED_LEADER_EPOCH)
    if wanted.leader_epoch > led.epoch:
        return _refused(wanted, ErrorCode.UNKNOWN_LEADER_EPOCH)
    partition_log = led.log
    cache = (await partition_log.leader_epochs()).entries
    end = partition_log.log_end_offset
    start = partition_log.log_start_offset
    split = rl.diverging(cache, end, wanted.last_fetched_epoch, wanted.fetch_offset)
    if split is not None:
        return _refused(
            wanted,
            ErrorCode.NONE,
            high_watermark=led.high_watermark,
            log_start_offset=start,
            diverging_epoch=split[0],
            diverging_end_offset=split[1],
        )
    if not start <= wanted.fetch_offset <= end:
        return _refused(wanted, ErrorCode.OFFSET_OUT_OF_RANGE, log_start_offset=start)
    await manager.registered_dirs(message.replica_id, message.log_dir)
    fetched = rl.FollowerFetched(
        broker_id=message.replica_id,
        log_dir=message.log_dir,
        fetch_offset=wanted.fetch_offset,
        now=trio.current_time(),
    )
    manager.feed(led, fetched)
    data = b""
    if budget > 0:
        try:
            data = await partition_log.read(wanted.fetch_offset, budget, limit=end)
        except OffsetOutOfRange:  # retention moved the start meanwhile
            start = partition_log.log_start_offset
            return _refused(wanted, ErrorCode.OFFSET_OUT_OF_RANGE, log_start_offset=start)
    after = wanted.fetch_offset
    for span in batch_spans(data, check_crc=False):
        after = span.base_offset + span.record_count
    starts = rl.epochs_between(cache, wanted.fetch_offset, after)
    return ReplicaFetchData(
        topic_id=wanted.topic_id,
        partition=wanted.partition,
        error_code=ErrorCode.NONE,
        high_watermark=led.high_watermark,
        log_start_offset=start,
        diverging_epoch=-1,
        diverging_end_offset=-1,
        epoch_starts=tuple(EpochStart(epoch=e.epoch, start_offset=e.start_offset) for e in starts),
        batches=data,
    )
