"""A deleted topic's partitions leave the broker: closed, their directories removed, Produce and
Fetch answered UNKNOWN_TOPIC_OR_PARTITION; created again under the name, the topic is empty."""

from __future__ import annotations

from pathlib import Path

import trio

from broker.data_plane import open_broker_log
from broker.log import FsyncPolicy, LogConfig
from protocol import ErrorCode, FetchRequest, ProduceRequest
from protocol.batches import build_batch
from store import open_embedded_store

#: Bounds a wait on the broker's topic watch and its file I/O threads.
DEADLINE = 10.0


def _produce(topic: str, partition: int, *values: bytes) -> ProduceRequest:
    return ProduceRequest(topic=topic, partition=partition, records=(), batches=build_batch(values))


def _fetch(topic: str, partition: int) -> FetchRequest:
    return FetchRequest(topic=topic, partition=partition, offset=0, max_bytes=1 << 20)


async def test_a_deleted_topics_partitions_are_closed_and_their_files_removed(
    tmp_path: Path,
) -> None:
    log_dir = tmp_path / "log"
    async with (
        open_embedded_store(tmp_path / "metadata") as store,
        open_broker_log(store, 1, tmp_path, LogConfig(fsync=FsyncPolicy.NEVER)) as broker,
    ):
        await store.create_topic("t", (1, 1))
        await store.create_topic("kept", (1,))
        for topic, partition in (("t", 0), ("t", 1), ("kept", 0)):
            produced = await broker.produce(_produce(topic, partition, b"a", b"b"))
            assert produced.error_code is ErrorCode.NONE
        assert {p.name for p in log_dir.iterdir() if p.is_dir()} == {"t-0", "t-1", "kept-0"}

        await store.delete_topic("t")
        with trio.fail_after(DEADLINE):
            while any(p.is_dir() and p.name.startswith("t-") for p in log_dir.iterdir()):
                await trio.sleep(0.01)
        assert {p.name for p in log_dir.iterdir()} == {"kept-0", "log-format"}
        produced = await broker.produce(_produce("t", 0, b"c"))
        assert produced.error_code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        fetched = await broker.fetch(_fetch("t", 0))
        assert fetched.error_code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        fetched = await broker.fetch(_fetch("kept", 0))
        assert (fetched.error_code, fetched.high_watermark) == (ErrorCode.NONE, 2)

        await store.create_topic("t", (1,))
        fetched = await broker.fetch(_fetch("t", 0))
        assert (fetched.error_code, fetched.high_watermark, fetched.batches) == (
            ErrorCode.NONE,
            0,
            b"",
        )


async def test_a_topic_deleted_while_the_broker_was_down_is_set_aside_when_it_starts(
    tmp_path: Path,
) -> None:
    log_dir = tmp_path / "log"
    config = LogConfig(fsync=FsyncPolicy.NEVER)
    async with open_embedded_store(tmp_path / "metadata") as store:
        await store.create_topic("t", (1,))
        async with open_broker_log(store, 1, tmp_path, config) as broker:
            produced = await broker.produce(_produce("t", 0, b"a", b"b"))
            assert produced.error_code is ErrorCode.NONE
        await store.delete_topic("t")  # while the broker is down
        async with open_broker_log(store, 1, tmp_path, config) as broker:
            (stray,) = log_dir.glob("t-0.*.stray")  # kept, in case the store was the wrong one
            assert any(stray.glob("*.log"))
            assert not (log_dir / "t-0").exists()
            await store.create_topic("t", (1,))
            fetched = await broker.fetch(_fetch("t", 0))
            assert (fetched.error_code, fetched.high_watermark) == (ErrorCode.NONE, 0)
