"""A follower's fetcher (DESIGN37 §2.4): one task per leader broker, sending it one REPLICA_FETCH
per round for every partition this broker follows there, and doing what
``statemachine.replica_follower.next_step`` says with each partition's answer: write the epochs
the records span, then append them; cut the log back where it diverges from the leader's; wait
for the state view to name another leader; back off.

Each partition's answer is applied under the partition's lock (``ReplicaManager.lock``), and only
if the partition is still followed there under the epoch the fetch named: a role change that
came while the request was out makes its answer moot.
"""

from __future__ import annotations

import logging

import attrs
import trio
import trio_util

from broker.log import (
    CorruptCheckpoint,
    CorruptSegment,
    EpochRefused,
    LogFailed,
    NotContiguous,
    OffsetOutOfRange,
)
from broker.replicas import Following, ReplicaManager, Requester
from consumer.runtime import first_cause
from protocol import (
    ErrorCode,
    RemoteProtocolError,
    ReplicaFetchData,
    ReplicaFetchPartition,
    ReplicaFetchRequest,
    ReplicaFetchResponse,
)
from protocol.replica_messages import MAX_REPLICA_WAIT_MS
from statemachine import replica_follower as rf
from statemachine.partition_state import EpochStart, PartitionKey
from store import StoreError
from transport.refusals import ChannelClosed

log = logging.getLogger(__name__)

#: How long a partition whose answer was an error waits before it is fetched again, and how
#: long a fetcher waits after its connection to the leader failed.
BACKOFF = 0.5
#: How long a partition waits whose leader answered that it does not know the follower's epoch
#: yet (it learns of its election from the store moments after its followers do).
ELECTION_BACKOFF = 0.05
#: Bytes one REPLICA_FETCH asks for, every partition together.
MAX_BYTES = 1024 * 1024


async def fetch_from(manager: ReplicaManager, leader: int) -> None:
    """Fetch the partitions ``manager`` follows at ``leader`` until cancelled."""
    await ReplicaFetcher(manager=manager, leader=leader).run()


@attrs.define(eq=False)
class ReplicaFetcher:
    """The fetcher of the partitions followed at ``leader``; owned by the manager's nursery,
    cancelled by it once it follows nothing there."""

    manager: ReplicaManager
    leader: int
    max_wait_ms: int = MAX_REPLICA_WAIT_MS
    #: Partitions left out of the requests until then (trio clock): their last answer said wait.
    paused: dict[PartitionKey, float] = attrs.field(factory=dict)

    async def run(self) -> None:
        while True:
            try:
                async with self.manager.connect(self.leader) as channel:
                    while True:
                        await self._round(channel)
            except* (
                OSError,
                trio.BrokenResourceError,  # a TLS handshake that failed
                RemoteProtocolError,
                ChannelClosed,
                StoreError,
            ) as failed:
                # the channel's own nursery wraps what ended it (a leader's kill -9 among them)
                log.warning(
                    "fetching from broker %d: %s; again in %g s",
                    self.leader,
                    first_cause(failed),
                    BACKOFF,
                )
            await trio.sleep(BACKOFF)

    async def _round(self, channel: Requester) -> None:
        followed_more = self.manager.followed_more  # in force before the request names any
        now = trio.current_time()
        here = self.manager.followed_at(self.leader)
        # a partition no longer followed here (its topic deleted, say) waits for nothing
        self.paused = {key: until for key, until in self.paused.items() if key in here}
        followed = {key: f for key, f in here.items() if self.paused.get(key, now) <= now}
        if not followed:
            await trio.sleep(max(min(self.paused.values(), default=now + BACKOFF) - now, 0.01))
            return
        wanted = []
        for key, f in followed.items():
            try:
                cache = (await f.log.leader_epochs()).entries
            except CorruptCheckpoint as exc:
                self._broken(key, f, exc)
                continue
            position = rf.fetch_position(cache, f.log.log_end_offset)
            wanted.append(
                ReplicaFetchPartition(
                    topic_id=key.topic_id,
                    partition=key.partition,
                    leader_epoch=f.epoch,
                    fetch_offset=position.fetch_offset,
                    last_fetched_epoch=position.last_fetched_epoch,
                )
            )
        request = ReplicaFetchRequest(
            replica_id=self.manager.broker_id,
            log_dir=self.manager.log_dir,
            max_wait_ms=self.max_wait_ms,
            max_bytes=MAX_BYTES,
            partitions=tuple(wanted),
        )
        # A partition followed here since the request was built cuts it short: the leader may
        # hold it (max_wait_ms) while the new one's leader waits for this follower's first fetch.
        response: object = None
        async with trio_util.move_on_when(followed_more.wait):
            response = await channel.request(request)
        if response is None:
            return
        if not isinstance(response, ReplicaFetchResponse) or response.error_code != ErrorCode.NONE:
            code = getattr(response, "error_code", None)
            log.warning("broker %d refused a replica fetch: %s", self.leader, code)
            await trio.sleep(BACKOFF)
            return
        for data in response.partitions:
            key = PartitionKey(topic_id=data.topic_id, partition=data.partition)
            asked = followed.get(key)
            if asked is not None:
                await self._apply(key, asked, data)

    async def _apply(self, key: PartitionKey, asked: Following, data: ReplicaFetchData) -> None:
        async with self.manager.lock(key):
            if self.manager.following.get(key) is not asked:
                return  # the role changed while the request was out
            try:
                await self._step(key, asked, data)
            except (NotContiguous, EpochRefused, OffsetOutOfRange, RemoteProtocolError) as exc:
                log.warning(
                    "%s: the answer of broker %d does not fit: %s", asked.tp, self.leader, exc
                )
                self.paused[key] = trio.current_time() + BACKOFF
            except (LogFailed, CorruptSegment, CorruptCheckpoint) as exc:
                self._broken(key, asked, exc)

    def _broken(self, key: PartitionKey, asked: Following, exc: Exception) -> None:
        """This broker's copy of the partition cannot be read or written now: that partition
        waits, the others go on (an error of one partition's files never ends the fetcher,
        which would end the broker)."""
        log.error("%s: %s", asked.tp, exc)
        self.paused[key] = trio.current_time() + BACKOFF

    async def _step(self, key: PartitionKey, asked: Following, data: ReplicaFetchData) -> None:
        """(the partition's lock held) Do what ``next_step`` says with the leader's answer."""
        partition_log = asked.log
        cache = (await partition_log.leader_epochs()).entries
        answer = rf.LeaderAnswer(
            error_code=data.error_code,
            high_watermark=data.high_watermark,
            log_start_offset=data.log_start_offset,
            diverging_epoch=data.diverging_epoch,
            diverging_end_offset=data.diverging_end_offset,
            epoch_starts=tuple(
                EpochStart(epoch=e.epoch, start_offset=e.start_offset) for e in data.epoch_starts
            ),
        )
        step = rf.next_step(cache, partition_log.log_end_offset, answer)
        match step:
            case rf.Append():
                for entry in step.cache:
                    if entry not in cache:
                        await partition_log.assign_epoch(entry.epoch, entry.start_offset)
                end = await partition_log.append_replicated(data.batches)
                self.manager.follower_hw[key] = rf.learned_high_watermark(
                    step.leader_high_watermark, end
                )
            case rf.Truncate() if step.offset < partition_log.log_start_offset:
                # the logs agree on nothing this one still has (a leader elected uncleanly
                # with a shorter log): it starts over where they part
                await self._start_over(key, asked, step.offset)
            case rf.Truncate():
                end = await partition_log.truncate_to(step.offset)
                log.info("%s: truncated to %d to match broker %d", asked.tp, end, self.leader)
            case rf.StartOver():
                await self._start_over(key, asked, step.offset)
            case rf.BackOff(code=ErrorCode.UNKNOWN_LEADER_EPOCH):
                # the leader has not learned its election yet, and will within moments: every
                # acks=all write waits for this follower meanwhile
                self.paused[key] = trio.current_time() + ELECTION_BACKOFF
            case rf.RefreshLeader() | rf.BackOff():
                self.paused[key] = trio.current_time() + BACKOFF

    async def _start_over(self, key: PartitionKey, asked: Following, offset: int) -> None:
        """(the partition's lock held) This log has nothing to keep of the leader's: the
        leader's starts at ``offset``, past this one's end, or this one starts past where they
        part. Empty it and start it at ``offset``, its high watermark with it (nothing below it
        is here to read), and write that down at once, so that a restart does not take the high
        watermark of the records gone."""
        start, end = asked.log.log_start_offset, asked.log.log_end_offset
        await asked.log.start_at(offset)
        self.manager.follower_hw[key] = offset
        log.warning(
            "%s: this log [%d, %d) starts over at %d to follow broker %d",
            asked.tp,
            start,
            end,
            offset,
            self.leader,
        )
        try:
            await self.manager.checkpoint()
        except OSError as exc:
            log.warning("writing the high watermarks failed: %s", exc)
