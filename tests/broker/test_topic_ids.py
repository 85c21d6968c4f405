"""A topic deleted and created again under its name is another topic (docs/design.md#topic-ids):
each partition directory names its topic's id, and a broker serves only the incarnation in force,
whether it was down through the delete and the re-creation, its topic watch saw the two as one
change, or a consumer or a producer names the new id before the watch shows it. A log of format
2, whose directories name no id, is upgraded when the broker starts on it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import cast

import attrs
import trio

from broker.data_plane import BrokerLog, open_broker_log
from broker.log import FsyncPolicy, LogConfig, read_partition_id
from protocol import ErrorCode, FetchRequest, FetchResponse, ProduceResponse
from protocol.batches import read_batches
from protocol.types import NO_TOPIC_ID, TopicId, TopicPartition
from store import TopicPlacement, TopicStore, open_embedded_store
from tests.broker.test_topic_delete import DEADLINE, _produce

CONFIG = LogConfig(fsync=FsyncPolicy.NEVER)
T0 = TopicPartition(topic="t", partition=0)


async def _fetch(broker: BrokerLog, topic_id: TopicId = NO_TOPIC_ID) -> FetchResponse:
    """t-0 from its start: by name, or (a version-2 Fetch) naming ``topic_id``."""
    request = FetchRequest(topic="t", partition=0, offset=0, max_bytes=1 << 20, topic_id=topic_id)
    return await broker.fetch(request, 1 if topic_id == NO_TOPIC_ID else 2)


async def _produce_to(broker: BrokerLog, topic_id: TopicId, *values: bytes) -> ProduceResponse:
    """``values`` to t-0 by a version-2 Produce naming ``topic_id``."""
    return await broker.produce(attrs.evolve(_produce("t", 0, *values), topic_id=topic_id))


def _values(fetched: FetchResponse) -> list[bytes | None]:
    return [value for batch in read_batches(fetched.batches) for _, _, _, value in batch]


async def _topic_id(store: TopicStore) -> TopicId:
    return (await store.topics())["t"].topic_id


async def _write_old_records(store: TopicStore, data_dir: Path) -> None:
    """Topic t of one partition on broker 1, ``a`` and ``b`` in it, the broker stopped."""
    await store.create_topic("t", (1,))
    async with open_broker_log(store, 1, data_dir, CONFIG) as broker:
        assert (await broker.produce(_produce("t", 0, b"a", b"b"))).error_code is ErrorCode.NONE


async def _recreate(store: TopicStore) -> tuple[TopicId, TopicId]:
    """Delete t and create it again, as it was: the old id and the new one."""
    old = await _topic_id(store)
    await store.delete_topic("t")
    await store.create_topic("t", (1,))
    return old, await _topic_id(store)


@attrs.define(eq=False)
class _HeldWatch:
    """The store as a broker's log reads it, its topic watch showing only what the test sends:
    a lagging watch, or one that sees a delete and a re-creation as one change."""

    inner: TopicStore
    changes: trio.MemoryReceiveChannel[Mapping[str, TopicPlacement]]

    async def topics(self) -> Mapping[str, TopicPlacement]:
        return await self.inner.topics()

    async def topic_updates(self) -> AsyncIterator[Mapping[str, TopicPlacement]]:
        async for placement in self.changes:
            yield placement


def _hold_the_watch(
    store: TopicStore,
) -> tuple[TopicStore, trio.MemorySendChannel[Mapping[str, TopicPlacement]]]:
    """``store``, its topic watch held (:class:`_HeldWatch`), and where to send what it shows."""
    send, receive = trio.open_memory_channel[Mapping[str, TopicPlacement]](0)
    return cast(TopicStore, _HeldWatch(inner=store, changes=receive)), send


async def _shown(
    watch: trio.MemorySendChannel[Mapping[str, TopicPlacement]],
    placement: Mapping[str, TopicPlacement],
) -> None:
    """``placement`` shown by the held watch, and handled by the broker: the watch is
    unbuffered, and the broker takes the second copy only once it has handled the first."""
    await watch.send(placement)
    await watch.send(placement)


async def test_a_new_partition_names_its_topic_id(tmp_path: Path) -> None:
    async with (
        open_embedded_store(tmp_path / "metadata") as store,
        open_broker_log(store, 1, tmp_path, CONFIG) as broker,
    ):
        await store.create_topic("t", (1,))
        assert (await broker.produce(_produce("t", 0, b"a"))).error_code is ErrorCode.NONE
        assert read_partition_id(tmp_path / "log" / "t-0") == await _topic_id(store)
        assert (tmp_path / "log" / "log-format").read_text() == "3\n"


async def test_a_log_of_format_2_is_given_the_stores_ids_when_the_broker_starts(
    tmp_path: Path,
) -> None:
    log_dir = tmp_path / "log"
    async with open_embedded_store(tmp_path / "metadata") as store:
        await _write_old_records(store, tmp_path)
        # as a broker of format 2 left it: no partition.metadata
        (log_dir / "log-format").write_text("2\n")
        (log_dir / "t-0" / "partition.metadata").unlink()
        async with open_broker_log(store, 1, tmp_path, CONFIG) as broker:
            assert (log_dir / "log-format").read_text() == "3\n"
            assert read_partition_id(log_dir / "t-0") == await _topic_id(store)
            fetched = await _fetch(broker, await _topic_id(store))
            assert (fetched.error_code, _values(fetched)) == (ErrorCode.NONE, [b"a", b"b"])


async def test_a_log_of_another_incarnation_is_set_aside_at_start_and_never_served(
    tmp_path: Path,
) -> None:
    """The broker was down while the topic was deleted and created again."""
    log_dir = tmp_path / "log"
    async with open_embedded_store(tmp_path / "metadata") as store:
        await _write_old_records(store, tmp_path)
        old, new = await _recreate(store)
        async with open_broker_log(store, 1, tmp_path, CONFIG) as broker:
            (stray,) = log_dir.glob("t-0.*.stray")  # kept, as a deleted topic's is
            assert read_partition_id(stray) == old and any(stray.glob("*.log"))
            assert read_partition_id(log_dir / "t-0") == new
            for topic_id in (NO_TOPIC_ID, new):
                fetched = await _fetch(broker, topic_id)
                assert (fetched.error_code, fetched.high_watermark, fetched.batches) == (
                    ErrorCode.NONE,
                    0,
                    b"",
                )
            refused = await _fetch(broker, old)
            assert (refused.error_code, refused.batches) == (ErrorCode.UNKNOWN_TOPIC_ID, b"")


async def test_a_watch_that_sees_delete_and_create_as_one_change_retires_the_old_log(
    tmp_path: Path,
) -> None:
    log_dir = tmp_path / "log"
    async with open_embedded_store(tmp_path / "metadata") as store:
        await store.create_topic("t", (1,))
        held, watch = _hold_the_watch(store)
        async with open_broker_log(held, 1, tmp_path, CONFIG) as broker:
            assert (await broker.produce(_produce("t", 0, b"a", b"b"))).error_code is ErrorCode.NONE
            old, new = await _recreate(store)
            await watch.send(await store.topics())  # the two as one change
            with trio.fail_after(DEADLINE):
                while (partition := broker.partitions.get(T0)) is None or partition.topic_id != new:
                    await trio.sleep(0.01)
            assert read_partition_id(log_dir / "t-0") == new
            assert not list(log_dir.glob("t-0.*"))  # the old one removed, as a deleted topic's
            fetched = await _fetch(broker)
            assert (fetched.error_code, fetched.high_watermark) == (ErrorCode.NONE, 0)
            refused = await _fetch(broker, old)
            assert (refused.error_code, refused.batches) == (ErrorCode.UNKNOWN_TOPIC_ID, b"")
            produced = await broker.produce(_produce("t", 0, b"c"))
            assert (produced.error_code, produced.base_offset) == (ErrorCode.NONE, 0)
            assert _values(await _fetch(broker, new)) == [b"c"]


async def test_a_fetch_naming_the_new_id_is_served_before_the_watch_shows_it(
    tmp_path: Path,
) -> None:
    """A consumer the coordinator started on the new incarnation may fetch before this broker's
    watch shows it: the broker reads the store, and retires the old log then and there."""
    async with open_embedded_store(tmp_path / "metadata") as store:
        await store.create_topic("t", (1,))
        held, _ = _hold_the_watch(store)  # shows no change
        async with open_broker_log(held, 1, tmp_path, CONFIG) as broker:
            assert (await broker.produce(_produce("t", 0, b"a", b"b"))).error_code is ErrorCode.NONE
            old, new = await _recreate(store)
            fetched = await _fetch(broker, new)
            assert (fetched.error_code, fetched.high_watermark, fetched.batches) == (
                ErrorCode.NONE,
                0,
                b"",
            )
            by_name = await _fetch(broker)
            assert (by_name.error_code, by_name.high_watermark) == (ErrorCode.NONE, 0)
            refused = await _fetch(broker, old)
            assert refused.error_code is ErrorCode.UNKNOWN_TOPIC_ID
            assert not list((tmp_path / "log").glob("t-0.*"))


async def test_a_produce_naming_the_new_id_is_written_to_it_before_the_watch_shows_it(
    tmp_path: Path,
) -> None:
    """A producer that learned the new incarnation from another broker may produce to this one
    before its watch shows it: the record goes to the new incarnation's log (the old one's
    retired first), and is still there once the watch, catching up, shows the delete and the
    re-creation. A Produce naming the old id is refused and writes nothing."""
    async with open_embedded_store(tmp_path / "metadata") as store:
        await store.create_topic("t", (1,))
        held, watch = _hold_the_watch(store)
        async with open_broker_log(held, 1, tmp_path, CONFIG) as broker:
            old = await _topic_id(store)
            assert (await _produce_to(broker, old, b"a", b"b")).error_code is ErrorCode.NONE
            await store.delete_topic("t")
            deleted = await store.topics()
            await store.create_topic("t", (1,))
            new = await _topic_id(store)
            produced = await _produce_to(broker, new, b"c")
            assert (produced.error_code, produced.base_offset) == (ErrorCode.NONE, 0)
            refused = await _produce_to(broker, old, b"lost")
            assert (refused.error_code, refused.base_offset) == (ErrorCode.UNKNOWN_TOPIC_ID, -1)
            for placement in (deleted, await store.topics()):
                await _shown(watch, placement)
            assert read_partition_id(tmp_path / "log" / "t-0") == new
            fetched = await _fetch(broker, new)
            assert (fetched.error_code, _values(fetched)) == (ErrorCode.NONE, [b"c"])
            assert (await _produce_to(broker, old, b"lost")).error_code is (
                ErrorCode.UNKNOWN_TOPIC_ID
            )
            assert _values(await _fetch(broker)) == [b"c"]
