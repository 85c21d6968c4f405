"""A consumer's fetchers: one task per assigned partition, each with a cancel scope of its own."""

from __future__ import annotations

import trio

from protocol import AssignedStream, TopicIdentity
from protocol.types import NO_TOPIC_ID, TopicPartition

from .core import ConsumerCore, _Fetcher, log
from .fetcher import FetchSettings, run_fetcher
from .streams import PartitionClaim, RecordStream


class FetcherControl(ConsumerCore):
    """The fetchers of the assigned partitions, started, moved and stopped on the coordinator's
    word (one fetcher's task is :func:`consumer.fetcher.run_fetcher`)."""

    __slots__ = ()

    async def _start_fetchers(
        self,
        generation: int,
        assigned: tuple[AssignedStream, ...],
        kept: tuple[TopicPartition, ...],
        topic_ids: tuple[TopicIdentity, ...] = (),
    ) -> None:
        """Fetch exactly ``assigned``: the fetchers of ``kept`` go on where they are (moved with
        their buffered records if their stream changed), every other partition starts at its
        offset, and ``on_assigned`` hears only those others. Each fetches the incarnation of its
        topic ``topic_ids`` names (SPEC.md §11.12); a kept one a broker refused as another's
        starts again."""
        ids = {t.topic: t.topic_id for t in topic_ids}
        gone = [f for tp in kept if (f := self._fetchers.get(tp)) and f.claim.topic_gone]
        for stale in gone:
            del self._fetchers[stale.claim.partition]
        await self._halt(gone)
        going_on = {tp: self._fetchers[tp] for tp in kept if tp in self._fetchers}
        claims: dict[TopicPartition, PartitionClaim] = {}
        by_stream: dict[int, list[PartitionClaim]] = {id(s): [] for s in self.streams}
        added: list[_Fetcher] = []
        for assigned_stream in assigned:
            for p in assigned_stream.partitions:
                tp = TopicPartition(topic=p.topic, partition=p.partition)
                stream = self._route(assigned_stream.stream_id, p.topic)
                if stream is None:
                    log.error(
                        "%s: no stream %s for %s", self.member_id, assigned_stream.stream_id, tp
                    )
                    continue
                fetcher = going_on.pop(tp, None)
                if fetcher is None:
                    claim = PartitionClaim(
                        partition=tp,
                        generation=generation,
                        broker_id=p.broker_id,
                        position=p.offset,
                        consumed=p.offset if p.offset >= 0 else None,
                        topic_id=ids.get(p.topic, NO_TOPIC_ID),
                    )
                    fetcher = _Fetcher(claim=claim, stream=stream)
                    added.append(fetcher)
                elif fetcher.stream is not stream:
                    fetcher = await self._move(fetcher, stream)
                claims[tp] = fetcher.claim
                by_stream[id(stream)].append(fetcher.claim)
        for tp, orphan in going_on.items():  # kept, but in no stream of ours: not ours to fetch
            del self._fetchers[tp]
            await self._halt([orphan])
        for stream in self.streams:
            stream.assign(by_stream[id(stream)])
        self._claims = claims
        for fetcher in added:
            self._fetchers[fetcher.claim.partition] = fetcher
            self._nursery.start_soon(self._fetch, fetcher)
        self.assignment.value = frozenset(self._fetchers)
        log.info(
            "%s: generation %d, fetching %d partitions (%d new)",
            self.member_id,
            generation,
            len(self._fetchers),
            len(added),
        )
        if self._on_assigned is not None:
            await self._on_assigned(frozenset(f.claim.partition for f in added))

    def _route(self, stream_id: str, topic: str) -> RecordStream | None:
        prefix, _, index = stream_id.rpartition("-")
        # A static member's streams are named after its instance id, its member id (§11.11).
        if prefix not in (self.member_id, self.instance_id) or not index.isdigit():
            return None
        wanted = None if self.subscription.is_wildcard else topic
        return next((s for s in self.streams if s.index == int(index) and s.topic == wanted), None)

    async def _fetch(self, fetcher: _Fetcher) -> None:
        settings = FetchSettings(
            auto_offset_reset=self.settings.auto_offset_reset,
            max_bytes=self.settings.fetch_max_bytes,
            idle_interval=self.settings.fetch_idle_interval,
            retry_backoff=self.settings.retry_backoff,
            request_timeout=self.settings.request_timeout,
        )
        try:
            with fetcher.scope:
                await run_fetcher(
                    fetcher.claim,
                    fetcher.stream,
                    self._brokers,
                    self._leaders,
                    settings,
                    self._machine.lease_deadline,
                )
        finally:
            fetcher.done.set()

    async def _move(self, fetcher: _Fetcher, stream: RecordStream) -> _Fetcher:
        """A partition that goes on in another of our streams: its fetcher stops between two
        batches, its buffered records move with it, and it fetches on from where it was, so the
        application misses nothing and sees nothing twice."""
        fetcher.scope.cancel()
        with trio.CancelScope(shield=True):
            await fetcher.done.wait()
        stream.give(fetcher.stream.take(fetcher.claim))
        moved = self._fetchers[fetcher.claim.partition] = _Fetcher(
            claim=fetcher.claim, stream=stream
        )
        self._nursery.start_soon(self._fetch, moved)
        return moved

    async def _stop_fetchers(self, partitions: tuple[TopicPartition, ...] | None) -> None:
        """Stop the fetchers of ``partitions`` (None: all) and only those, then tell
        ``on_revoked``, before the StopFetcher answer leaves."""
        if partitions is None:
            names = list(self._fetchers)
            for claim in self._claims.values():
                claim.active = False
        else:
            names = [tp for tp in partitions if tp in self._fetchers]
        stopped = [self._fetchers.pop(tp) for tp in names]
        await self._halt(stopped)
        self._revoking.update((f.claim.partition, f.claim) for f in stopped)
        revoked = frozenset(f.claim.partition for f in stopped)
        self.assignment.value = frozenset(self._fetchers)
        log.info(
            "%s: stopped fetching %d partitions, %d go on",
            self.member_id,
            len(revoked),
            len(self._fetchers),
        )
        if revoked and self._on_revoked is not None:
            await self._on_revoked(revoked)

    async def _halt(self, fetchers: list[_Fetcher]) -> None:
        """Stop these fetchers and drop what they buffered: once this returns nothing of theirs is
        fetched or handed to the application (their claims are inactive, so a batch in flight is
        refused by its stream)."""
        for fetcher in fetchers:
            fetcher.claim.active = False
            fetcher.scope.cancel()
        for stream in {id(f.stream): f.stream for f in fetchers}.values():
            stream.drop_inactive()
        with trio.CancelScope(shield=True):
            for fetcher in fetchers:
                await fetcher.done.wait()
