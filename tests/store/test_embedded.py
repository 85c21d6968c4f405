"""What only the embedded store promises: its files survive crashes and real disk faults.

Faults are real, not mocked: files are cut and corrupted on disk between a close and a reopen, and a
failing write comes from the kernel. Permission tricks do not work when the tests run as root (root
writes anywhere), so an unusable directory is a path that is a regular file where a directory must
be, or a directory where the journal must be, and a failing write is an ``RLIMIT_FSIZE`` that the
kernel enforces even for root.
"""

from __future__ import annotations

import itertools
import json
import pathlib
import resource
import signal
import uuid
import zlib
from collections.abc import Iterator
from contextlib import aclosing, contextmanager
from typing import Any

import attrs
import pytest
import trio
import trio.testing

from protocol.types import BrokerInfo, ConsumerThread, Subscription, TopicPartition, TopicStreams
from statemachine.partition_state import (
    UNKNOWN_LOG_DIR,
    PartitionKey,
    StateWrite,
    sole_replica_state,
)
from store import (
    EmbeddedStore,
    GroupRecord,
    InvalidReplicationFactor,
    MemberRecord,
    OffsetBatch,
    StoreUnavailable,
    codec,
    open_embedded_store,
)
from store.embedded import JOURNAL_NAME, SNAPSHOT_NAME
from store.journal import Journal


def tp(topic: str, partition: int) -> TopicPartition:
    return TopicPartition(topic=topic, partition=partition)


def offsets_batch(group_id: str, generation: int, base: int, count: int = 3) -> OffsetBatch:
    return OffsetBatch(
        group_id=group_id,
        generation=generation,
        offsets={tp("orders", p): base + p for p in range(count)},
    )


def member(member_id: str) -> MemberRecord:
    return MemberRecord(
        member_id=member_id,
        client_id="client",
        subscription=Subscription(topics=(TopicStreams(topic="orders", streams=1),)),
        session_timeout_ms=6000,
        auto_commit=True,
        auto_offset_reset="smallest",
    )


def group(group_id: str, generation: int) -> GroupRecord:
    """A record that changes with each generation, as after a rebalance: a member leaves and
    another joins, a partition moves and another leaves the assignment."""
    alternate = f"m{generation % 2}"
    return GroupRecord(
        group_id=group_id,
        generation=generation,
        members=(member("m9"), member(alternate)),
        assignment={
            tp("orders", 0): ConsumerThread(member_id=alternate, index=0),
            tp("orders", 1 + generation % 2): ConsumerThread(member_id="m9", index=0),
        },
    )


def rebalanced(previous: GroupRecord, joiner: str) -> GroupRecord:
    """``previous`` after ``joiner`` joined and took an even share, as the sticky assignor does."""
    members = (*previous.members, member(joiner))
    share = len(previous.assignment) // len(members)
    thread = ConsumerThread(member_id=joiner, index=0)
    moved = dict.fromkeys(list(previous.assignment)[:: len(members)][:share], thread)
    return GroupRecord(
        group_id=previous.group_id,
        generation=previous.generation + 1,
        members=members,
        assignment={**previous.assignment, **moved},
    )


async def state_of(store: EmbeddedStore) -> dict[str, Any]:
    groups = dict(await store.groups())
    return {
        "topics": dict(await store.topics()),
        "groups": groups,
        "offsets": {g: dict(await store.fetch_offsets(g)) for g in ("billing", "audit")},
    }


async def write_history(store: EmbeddedStore) -> list[dict[str, Any]]:
    """A mix of every kind of write; the state after each, starting with the empty one."""
    states = [await state_of(store)]
    epoch = await store.take_office(1)
    states.append(await state_of(store))
    await store.create_topic("orders", (1, 1, 2))
    states.append(await state_of(store))
    for generation in range(1, 4):
        await store.write_group(epoch, group("billing", generation))
        states.append(await state_of(store))
        await store.commit_offsets(
            epoch,
            [offsets_batch("billing", generation, 10 * generation), offsets_batch("audit", 1, 0)],
        )
        states.append(await state_of(store))
    await store.add_partitions("orders", (2,))
    states.append(await state_of(store))
    await store.delete_group(epoch, "audit")
    states.append(await state_of(store))
    await store.commit_offsets(epoch, [offsets_batch("billing", 3, 100)])
    states.append(await state_of(store))
    return states


def journal_lines(data_dir: pathlib.Path) -> list[bytes]:
    return (data_dir / JOURNAL_NAME).read_bytes().splitlines(keepends=True)


async def test_a_torn_last_write_is_dropped_and_everything_before_survives(
    tmp_path: pathlib.Path,
) -> None:
    async with open_embedded_store(tmp_path) as store:
        states = await write_history(store)
    journal = tmp_path / JOURNAL_NAME
    data = journal.read_bytes()
    journal.write_bytes(data[: len(data) - 7])  # mid-line: the last write never finished

    async with open_embedded_store(tmp_path) as store:
        assert await state_of(store) == states[-2]
        assert journal.read_bytes() == data[: data.rindex(b"\n", 0, len(data) - 1) + 1]
        epoch = await store.take_office(1)
        await store.commit_offsets(epoch, [offsets_batch("billing", 3, 200)])
        after = await state_of(store)
    async with open_embedded_store(tmp_path) as store:  # the new line did not land on the torn one
        assert await state_of(store) == after


async def test_every_cut_of_the_journal_reopens_to_a_prefix_of_the_writes(
    tmp_path: pathlib.Path,
) -> None:
    async with open_embedded_store(tmp_path) as store:
        states = await write_history(store)
    journal = tmp_path / JOURNAL_NAME
    data = journal.read_bytes()
    ends = [0]
    for line in journal_lines(tmp_path):
        ends.append(ends[-1] + len(line))
    assert len(ends) == len(states)

    cuts = {end + delta for end in ends for delta in (-1, 0, 1)}
    cuts |= {(a + b) // 2 for a, b in itertools.pairwise(ends)}
    for cut in sorted(c for c in cuts if 0 <= c <= len(data)):
        journal.write_bytes(data[:cut])
        async with open_embedded_store(tmp_path) as store:
            whole_lines = sum(1 for end in ends[1:] if end <= cut)
            assert await state_of(store) == states[whole_lines], cut


async def test_a_corrupt_last_line_is_dropped(tmp_path: pathlib.Path) -> None:
    async with open_embedded_store(tmp_path) as store:
        states = await write_history(store)
    lines = journal_lines(tmp_path)
    last = bytearray(lines[-1])
    last[20] ^= 0x01  # inside the JSON: the checksum no longer matches
    (tmp_path / JOURNAL_NAME).write_bytes(b"".join(lines[:-1]) + bytes(last))

    async with open_embedded_store(tmp_path) as store:
        assert await state_of(store) == states[-2]


async def test_damage_before_acknowledged_writes_refuses_to_open(tmp_path: pathlib.Path) -> None:
    async with open_embedded_store(tmp_path) as store:
        await write_history(store)
    lines = journal_lines(tmp_path)
    damaged = bytearray(lines[2])
    damaged[20] ^= 0x01
    original = b"".join(lines)
    (tmp_path / JOURNAL_NAME).write_bytes(b"".join([*lines[:2], bytes(damaged), *lines[3:]]))

    with pytest.raises(StoreUnavailable, match="damaged"):
        async with open_embedded_store(tmp_path):
            pass  # pragma: no cover
    # Nothing was cut away: an operator can still restore or inspect the file.
    assert len((tmp_path / JOURNAL_NAME).read_bytes()) == len(original)


async def test_compaction_keeps_everything(tmp_path: pathlib.Path) -> None:
    async with open_embedded_store(tmp_path, compact_after_bytes=600) as store:
        epochs = [await store.take_office(1)]
        await store.create_topic("orders", (1, 2, 3))
        for generation in range(1, 40):
            await store.write_group(epochs[-1], group("billing", generation))
            await store.commit_offsets(
                epochs[-1], [offsets_batch("billing", generation, generation, count=3)]
            )
            if generation % 10 == 0:
                epochs.append(await store.take_office(1))
        before = await state_of(store)
        journal_size = (tmp_path / JOURNAL_NAME).stat().st_size
    assert (tmp_path / SNAPSHOT_NAME).exists()
    assert journal_size < 2000  # compacted, or it would hold ~80 lines of well over 100 bytes

    async with open_embedded_store(tmp_path) as store:
        assert await state_of(store) == before
        assert (await store.groups())["billing"].generation == 39
        assert await store.take_office(1) > max(epochs)


async def test_a_rebalance_journals_only_what_changed(tmp_path: pathlib.Path) -> None:
    members = tuple(member(f"m{i:02}") for i in range(10))
    first = GroupRecord(
        group_id="billing",
        generation=1,
        members=members,
        assignment={
            tp("orders", p): ConsumerThread(member_id=f"m{p % 10:02}", index=0) for p in range(1000)
        },
    )
    joined = rebalanced(first, "m10")
    assert sum(1 for t in joined.assignment.values() if t.member_id == "m10") == 90
    async with open_embedded_store(tmp_path) as store:
        epoch = await store.take_office(1)
        await store.write_group(epoch, first)
        await store.write_group(epoch, joined)
        assert await store.groups() == {"billing": joined}
    whole, update = journal_lines(tmp_path)[-2:]
    # the 90 partitions that moved and the one member that joined, not 1,000 owners and 11 members
    assert len(update) < len(whole) / 8
    async with open_embedded_store(tmp_path) as store:
        assert await store.groups() == {"billing": joined}


async def test_members_whose_own_generation_alone_changed_are_journaled_as_kept(
    tmp_path: pathlib.Path,
) -> None:
    """An incremental rebalance starts a few members under the new generation and leaves the
    rest at theirs: the update names the few by id and generation, not every member anew."""
    members = tuple(member(f"m{i:02}") for i in range(100))
    first = GroupRecord(group_id="billing", generation=1, members=members, assignment={})
    later = attrs.evolve(
        first,
        generation=2,
        members=(
            attrs.evolve(members[0], generation=2),
            *members[1:50],
            attrs.evolve(members[50], generation=2),
            *members[51:],
        ),
    )
    async with open_embedded_store(tmp_path) as store:
        epoch = await store.take_office(1)
        await store.write_group(epoch, first)
        await store.write_group(epoch, later)
        assert await store.groups() == {"billing": later}
    update = json.loads(journal_lines(tmp_path)[-1].split(b" ", 1)[1])
    assert update["joined"] == [] and update["left"] == []
    assert update["generations"] == {"m00": 2, "m50": 2}
    async with open_embedded_store(tmp_path) as store:
        assert await store.groups() == {"billing": later}


async def test_a_journal_of_rebalances_compacts_and_reopens_to_the_last(
    tmp_path: pathlib.Path,
) -> None:
    record = GroupRecord(
        group_id="billing",
        generation=1,
        members=(member("m00"),),
        assignment={tp("orders", p): ConsumerThread(member_id="m00", index=0) for p in range(200)},
    )
    async with open_embedded_store(tmp_path, compact_after_bytes=4000) as store:
        epoch = await store.take_office(1)
        for joiner in range(1, 30):
            await store.write_group(epoch, record)
            record = rebalanced(record, f"m{joiner:02}")
        await store.write_group(epoch, record)
        assert await store.groups() == {"billing": record}
    assert (tmp_path / SNAPSHOT_NAME).exists()
    assert journal_lines(tmp_path)  # some updates came after the last snapshot
    async with open_embedded_store(tmp_path) as store:
        assert await store.groups() == {"billing": record}


async def test_an_update_that_does_not_follow_its_record_refuses_to_open(
    tmp_path: pathlib.Path,
) -> None:
    """An update names the generation it was computed against; a journal whose update would
    apply to another record (a lost or reordered write) is refused, not folded into garbage."""
    async with open_embedded_store(tmp_path) as store:
        epoch = await store.take_office(1)
        await store.write_group(epoch, group("billing", 1))
        await store.write_group(epoch, group("billing", 2))
    *before, update = journal_lines(tmp_path)
    entry = json.loads(update.split(b" ", 1)[1])
    assert (entry["op"], entry["from"]) == ("group_update", 1)
    entry["from"] = 0
    payload = json.dumps(entry, separators=(",", ":")).encode()
    forged = b"%08x %s\n" % (zlib.crc32(payload), payload)  # a checksum that matches
    (tmp_path / JOURNAL_NAME).write_bytes(b"".join(before) + forged)

    with pytest.raises(StoreUnavailable, match="generation"):
        async with open_embedded_store(tmp_path):
            pass  # pragma: no cover


async def test_a_journal_the_snapshot_already_covers_is_skipped(tmp_path: pathlib.Path) -> None:
    """A crash between installing a snapshot and emptying the journal leaves both on disk."""
    async with open_embedded_store(tmp_path) as store:
        await write_history(store)
    old_journal = (tmp_path / JOURNAL_NAME).read_bytes()
    async with open_embedded_store(tmp_path, compact_after_bytes=0) as store:
        epoch = await store.take_office(1)  # compacts everything into the snapshot
        expected = await state_of(store)
    assert (tmp_path / JOURNAL_NAME).stat().st_size == 0
    (tmp_path / JOURNAL_NAME).write_bytes(old_journal)

    async with open_embedded_store(tmp_path) as store:
        assert await state_of(store) == expected
        assert await store.take_office(1) == epoch + 1


async def test_a_data_dir_that_is_a_file_is_unavailable(tmp_path: pathlib.Path) -> None:
    not_a_dir = tmp_path / "data"
    not_a_dir.write_text("")
    with pytest.raises(StoreUnavailable):
        async with open_embedded_store(not_a_dir):
            pass  # pragma: no cover


async def test_a_journal_that_cannot_be_opened_is_unavailable(tmp_path: pathlib.Path) -> None:
    (tmp_path / JOURNAL_NAME).mkdir()
    with pytest.raises(StoreUnavailable):
        async with open_embedded_store(tmp_path):
            pass  # pragma: no cover
    # The lock was released on the way out.
    (tmp_path / JOURNAL_NAME).rmdir()
    async with open_embedded_store(tmp_path) as store:
        assert await store.topics() == {}


@contextmanager
def file_size_limit(limit: int) -> Iterator[None]:
    """Make the kernel refuse writes past ``limit`` bytes in any file, root or not.

    SIGXFSZ would kill the process; ignored, the write fails with EFBIG instead (after a short write
    up to the limit, so a half-written line is really left on disk).
    """
    old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, old_limit[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
        signal.signal(signal.SIGXFSZ, old_handler)


async def test_a_failed_write_is_unavailable_and_changes_nothing(tmp_path: pathlib.Path) -> None:
    async with open_embedded_store(tmp_path) as store:
        epoch = await store.take_office(1)
        await store.commit_offsets(epoch, [offsets_batch("billing", 1, 10)])
        before = await state_of(store)
        size = (tmp_path / JOURNAL_NAME).stat().st_size

        with file_size_limit(size + 10), pytest.raises(StoreUnavailable):
            await store.commit_offsets(epoch, [offsets_batch("billing", 2, 20)])
        assert await state_of(store) == before
        assert (tmp_path / JOURNAL_NAME).stat().st_size == size  # the partial line was removed

        with file_size_limit(size + 10), pytest.raises(StoreUnavailable):
            await store.create_topic("orders", (1,))
        assert await store.topics() == {}

        await store.commit_offsets(epoch, [offsets_batch("billing", 2, 30)])
        after = await state_of(store)
    assert after["offsets"]["billing"][tp("orders", 0)] == 30
    async with open_embedded_store(tmp_path) as store:
        assert await state_of(store) == after


async def test_a_data_dir_holds_one_store_at_a_time(tmp_path: pathlib.Path) -> None:
    async with open_embedded_store(tmp_path) as store:
        with pytest.raises(StoreUnavailable, match="in use"):
            async with open_embedded_store(tmp_path):
                pass  # pragma: no cover
        await store.create_topic("orders", (1,))
    async with open_embedded_store(tmp_path) as store:
        assert set(await store.topics()) == {"orders"}


async def test_a_closed_store_is_unavailable_and_ends_its_watches(tmp_path: pathlib.Path) -> None:
    async with open_embedded_store(tmp_path) as store:
        updates = store.topic_updates()
        assert await anext(updates) == {}
    with pytest.raises(StoreUnavailable):
        await anext(updates)
    with pytest.raises(StoreUnavailable):
        await store.topics()
    await updates.aclose()


async def test_a_burst_of_topic_changes_reaches_a_slow_reader_as_one(
    tmp_path: pathlib.Path,
) -> None:
    async with open_embedded_store(tmp_path) as store, aclosing(store.topic_updates()) as updates:
        assert await anext(updates) == {}
        await store.create_topic("a", (1,))
        await store.create_topic("b", (1,))
        await store.add_partitions("a", (2,))
        update = await anext(updates)
        assert {name: placement.brokers for name, placement in update.items()} == {
            "a": (1, 2),
            "b": (1,),
        }


async def test_writes_take_no_virtual_time(
    tmp_path: pathlib.Path, autojump_clock: trio.testing.MockClock
) -> None:
    """The simulation tests rely on this: a store write must not let MockClock's autojump fire
    every pending timer, as it would if the write waited on a thread."""
    async with open_embedded_store(tmp_path) as store:
        start = trio.current_time()
        epoch = await store.take_office(1)
        await store.create_topic("orders", (1,))
        await store.commit_offsets(epoch, [offsets_batch("billing", 1, 0, count=100)])
        assert trio.current_time() == start


async def test_offsets_are_journaled_compactly(tmp_path: pathlib.Path) -> None:
    async with open_embedded_store(tmp_path) as store:
        epoch = await store.take_office(1)
        before = (tmp_path / JOURNAL_NAME).stat().st_size
        await store.commit_offsets(epoch, [offsets_batch("billing", 1, 1_000_000, count=100)])
        line = (tmp_path / JOURNAL_NAME).stat().st_size - before
    assert line < 100 * 16  # "[partition,offset]," per offset, and the batch header once


async def test_a_store_written_before_topic_ids_opens_with_ids_and_its_offsets(
    tmp_path: pathlib.Path,
) -> None:
    """A snapshot of format 1 and journal entries naming no ids (docs/design.md#topic-ids): the
    topics get ids when the store opens, offsets written without one count as the current
    incarnation's, also once compacted into a snapshot of format 2, and a re-create drops them."""
    snapshot = {
        "format": 1,
        "seq": 1,
        "last_epoch": 1,
        "topics": {"orders": {"0": 1, "1": 2}},
        "groups": {},
        "offsets": {"billing": {"orders": [[0, 17, 3]]}},
    }
    (tmp_path / SNAPSHOT_NAME).write_text(json.dumps(snapshot))
    journal, _entries = Journal.open(tmp_path / JOURNAL_NAME)
    journal.append({"seq": 2, "op": "topic", "topic": "logs", "placement": {"0": 1}})
    journal.append(
        {
            "seq": 3,
            "op": "offsets",
            "batches": [["billing", 4, {"orders": [[1, 5]], "logs": [[0, 2]]}]],
        }
    )
    journal.close()
    expected = {tp("orders", 0): 17, tp("orders", 1): 5, tp("logs", 0): 2}
    async with open_embedded_store(tmp_path, compact_after_bytes=1) as store:  # every write
        topics = await store.topics()
        assert {p.topic_id.version for p in topics.values()} == {4}
        assert await store.fetch_offsets("billing") == expected
        epoch = await store.take_office(1)
        # A commit for the incarnation in force joins the offsets written before ids.
        await store.commit_offsets(
            epoch,
            [
                OffsetBatch(
                    group_id="billing",
                    generation=5,
                    offsets={tp("orders", 1): 6},
                    topic_ids={"orders": topics["orders"].topic_id},
                )
            ],
        )
        expected[tp("orders", 1)] = 6
        assert await store.fetch_offsets("billing") == expected
    assert json.loads((tmp_path / SNAPSHOT_NAME).read_text())["format"] == 2
    async with open_embedded_store(tmp_path) as store:
        assert await store.topics() == topics
        assert await store.fetch_offsets("billing") == expected
        await store.delete_topic("logs")
        await store.create_topic("logs", (1,))
        del expected[tp("logs", 0)]
        assert await store.fetch_offsets("billing") == expected


def test_a_member_record_written_before_static_members_still_loads() -> None:
    """A group record as stores wrote it before members had instance ids (the same JSON on the
    embedded journal and in ZooKeeper's chunks) loads as a dynamic member, and a dynamic member
    is written without one."""
    written_before = {
        "group_id": "billing",
        "generation": 4,
        "members": [
            {
                "member_id": "m1",
                "client_id": "client",
                "subscription": {
                    "topics": [["orders", 1]],
                    "pattern": None,
                    "pattern_is_blacklist": False,
                    "pattern_streams": 1,
                },
                "session_timeout_ms": 6000,
                "auto_commit": True,
                "auto_offset_reset": "smallest",
            }
        ],
        "assignment": {"orders": [[0, "m1", 0]]},
        "complete": True,
    }
    record = codec.decode_group(written_before)
    assert record.members == (member("m1"),)
    assert record.members[0].instance_id is None
    encoded = codec.encode_group(record)
    assert all("instance_id" not in member for member in encoded["members"])
    assert codec.decode_group(encoded) == record


async def test_a_topics_settings_survive_compaction_into_the_snapshot(
    tmp_path: pathlib.Path,
) -> None:
    """Written only where a topic has settings: a topic without keeps the snapshot's old shape."""
    async with open_embedded_store(tmp_path, compact_after_bytes=1) as store:
        plain = await store.create_topic("logs", (1,))
        created = await store.create_topic("orders", (1,), (("retention.ms", "60000"),))
        for n in range(50):  # a snapshot is due once the journal outgrows the last one
            if "orders" in json.loads((tmp_path / SNAPSHOT_NAME).read_text())["topics"]:
                break
            await store.create_topic(f"filler{n}", (1,))
    topics = json.loads((tmp_path / SNAPSHOT_NAME).read_text())["topics"]
    assert topics["orders"]["configs"] == {"retention.ms": "60000"}
    assert "configs" not in topics["logs"]
    async with open_embedded_store(tmp_path) as store:
        found = await store.topics()
        assert (found["orders"], found["logs"]) == (created, plain)


# Replication: one broker, so one replica of every partition


async def test_a_replicated_topic_is_refused_and_nothing_is_written(tmp_path: pathlib.Path) -> None:
    async with open_embedded_store(tmp_path) as store:
        with pytest.raises(InvalidReplicationFactor, match="needs a cluster"):
            await store.create_topic("orders", ((1, 2), (2, 1)))
        assert await store.topics() == {}
        lines = journal_lines(tmp_path)
        epoch = await store.take_office(1)
        write = StateWrite(
            key=PartitionKey(topic_id=uuid.uuid4(), partition=0),
            state=sole_replica_state(1, uuid.uuid4()),
            expected_version=0,
        )
        with pytest.raises(InvalidReplicationFactor):
            await store.write_partition_states(epoch, [write])
        with pytest.raises(InvalidReplicationFactor):
            await store.write_partition_states(None, [write])
        assert len(journal_lines(tmp_path)) == len(lines) + 1  # the office's entry alone


async def test_every_partition_is_led_by_its_broker_at_epoch_zero(tmp_path: pathlib.Path) -> None:
    """The states nobody writes, synthesized from the topics and the broker's log directory:
    all at once, then those that changed (a new topic's, a new directory's)."""
    first, wiped = uuid.uuid4(), uuid.uuid4()
    broker = BrokerInfo(broker_id=1, host="127.0.0.1", port=9092)
    async with open_embedded_store(tmp_path) as store:
        await store.register_broker(broker, log_dir=first)
        orders = await store.create_topic("orders", (1, 1))
        async with aclosing(store.partition_state_updates()) as updates:
            keys = [PartitionKey(topic_id=orders.topic_id, partition=p) for p in (0, 1)]
            assert await anext(updates) == {key: sole_replica_state(1, first) for key in keys}
            logs = await store.create_topic("logs", (1,))
            new = PartitionKey(topic_id=logs.topic_id, partition=0)
            with trio.fail_after(1):
                assert await anext(updates) == {new: sole_replica_state(1, first)}
            await store.register_broker(broker, log_dir=wiped)
            with trio.fail_after(1):
                assert await anext(updates) == {
                    key: sole_replica_state(1, wiped) for key in [*keys, new]
                }
        assert await store.partition_states() == {
            key: sole_replica_state(1, wiped) for key in [*keys, new]
        }
        assert await store.read_partition_states([keys[1]]) == {
            keys[1]: sole_replica_state(1, wiped)
        }
        # A broker that registered no directory: its replicas are in sync in none known.
        await store.register_broker(broker)
        assert await store.read_partition_states([new]) == {
            new: sole_replica_state(1, UNKNOWN_LOG_DIR)
        }
