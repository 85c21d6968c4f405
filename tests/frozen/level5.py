# mypy: ignore-errors
# (a third party's code, written once from SPEC.md and never changed: checked by running it)
"""A frozen client of level 5 (protocol/SPEC.md §3): DescribeGroup 2, which names each member's
address, and DeleteTopic 0; ClusterMetadata 1, which names the holder of each coordinator slot,
CreateTopic 1 and CreatePartitions 1, which name the brokers to place partitions on, as level 4;
Produce 1 and Fetch 1 with record batches (§6.2) as level 3; level 2's member:
RegisterConsumer 1, Ping 1, StopFetcher 2 and StartFetcher 2 (the ownership lease, partial stops,
incremental starts); version 0 of the rest. Level 4 also brought SaslHandshake 0 and
SaslAuthenticate 0, which a client sends only on a SASL listener (§12): the broker it runs against
listens in plaintext, so it sends neither.

Written from SPEC.md's layouts with the standard library only, as a third party would, and never
changed afterwards: a new api version adds a new frozen client beside it. It runs a whole group
against the broker named on its command line: a topic (created with half its partitions on the
brokers ClusterMetadata names, then grown to all of them), a member alone, a second one joining,
the group described while both are in, a leave, fetches and commits, a scratch topic created and
deleted, and prints one JSON line with what it saw; it exits non-zero at the first thing that goes
wrong.

Its batches are uncompressed, with a timestamp per record and no headers; it reads what a fetch
answers, checking each batch's CRC and records section as §6.2 asks, and refuses a compressed one
(lz4 and zstd are not in the standard library; nothing it produced is compressed).

Level 5 keeps the ownership lease of SPEC.md §1: it counts the frames it sends on its coordinator
connection with the time it queued each, and fetches only until the queue time of the frame a
coordinator request acknowledges plus its session timeout.
"""

import contextlib
import json
import socket
import struct
import sys
import threading
import time
import zlib

LEVEL = 5
SESSION_TIMEOUT_MS = 4000
DEADLINE = 30.0

REQUEST, RESPONSE, ERROR = 0, 1, 2
PRODUCE, FETCH, CLUSTER_METADATA, REGISTER_CONSUMER = 0, 1, 3, 4
PING, STOP_FETCHER, START_FETCHER = 5, 6, 7
OFFSET_COMMIT, OFFSET_FETCH, CREATE_TOPIC, CREATE_PARTITIONS = 8, 9, 10, 11
DESCRIBE_GROUP, LEAVE_GROUP, DELETE_TOPIC = 13, 14, 20


# --- §2 primitive types --------------------------------------------------------------------


def i8(v):
    return struct.pack(">b", v)


def i16(v):
    return struct.pack(">h", v)


def i32(v):
    return struct.pack(">i", v)


def i64(v):
    return struct.pack(">q", v)


def string(s):
    if s is None:
        return i16(-1)
    b = s.encode()
    return i16(len(b)) + b


def nbytes(b):
    if b is None:
        return i32(-1)
    return i32(len(b)) + b


def array(items, encode):
    if items is None:
        return i32(-1)
    return i32(len(items)) + b"".join(encode(x) for x in items)


class Reader:
    def __init__(self, data):
        self.data = data
        self.pos = 0

    def take(self, fmt):
        (v,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return v

    def i8(self):
        return self.take(">b")

    def i16(self):
        return self.take(">h")

    def i32(self):
        return self.take(">i")

    def i64(self):
        return self.take(">q")

    def string(self):
        n = self.i16()
        if n < 0:
            return None
        s = self.data[self.pos : self.pos + n].decode()
        self.pos += n
        return s

    def nbytes(self):
        n = self.i32()
        if n < 0:
            return None
        b = self.data[self.pos : self.pos + n]
        self.pos += n
        return b

    def array(self, decode):
        n = self.i32()
        if n < 0:
            return None
        return [decode(self) for _ in range(n)]

    def end(self):
        if self.pos != len(self.data):
            raise ValueError(f"{len(self.data) - self.pos} bytes left over")


# --- §6 records and §7 structures ----------------------------------------------------------


def batch(values):
    """§6.2: one batch as a producer sends it: base offset 0, no append time, the reserved fields
    -1, null keys, every record stamped now."""
    n = len(values)
    timestamp = int(time.time() * 1000)
    section = (
        struct.pack(f"<{n}i", *[0] * n)  # timestamp_deltas
        + struct.pack(f"<{n}i", *[-1] * n)  # key_lengths: null keys
        + struct.pack(f"<{n}i", *[len(v) for v in values])
        + b"".join(values)
    )
    covered = (
        i8(2)  # magic
        + i16(0)  # attributes: not compressed, timestamps of their own, no headers
        + i32(n - 1)
        + i64(timestamp)
        + i64(timestamp)
        + i64(-1)  # producer_id
        + i16(-1)  # producer_epoch
        + i32(-1)  # base_sequence
        + i32(n)
        + section
    )
    crc = struct.pack(">I", zlib.crc32(covered))
    return i64(0) + i32(8 + 4 + len(covered)) + i64(-1) + crc + covered


def read_batches(data):
    """§6.2: the (offset, value) of every record of batches back to back, each checked: its CRC,
    then its records section filling the batch exactly."""
    records = []
    pos = 0
    while pos < len(data):
        if len(data) - pos < 65:
            raise Failed(f"a batch header cut short at byte {pos}")
        base_offset, length = struct.unpack_from(">qi", data, pos)
        end = pos + 12 + length
        if length < 53 or end > len(data):
            raise Failed(f"batch at offset {base_offset}: length {length} runs past the answer")
        (crc,) = struct.unpack_from(">I", data, pos + 20)
        if zlib.crc32(data[pos + 24 : end]) != crc:
            raise Failed(f"batch at offset {base_offset}: its CRC does not match")
        magic, attributes, last_delta = struct.unpack_from(">bhi", data, pos + 24)
        (count,) = struct.unpack_from(">i", data, pos + 61)
        if magic != 2 or attributes & ~0b11000 or count < 1 or last_delta != count - 1:
            raise Failed(f"batch at offset {base_offset}: magic {magic}, attributes {attributes}")
        section = data[pos + 65 : end]
        columns = 4 if attributes & 0b10000 else 3
        if len(section) < 4 * count * columns:
            raise Failed(f"batch at offset {base_offset}: its records section is cut short")
        key_lengths = struct.unpack_from(f"<{count}i", section, 4 * count)
        value_lengths = struct.unpack_from(f"<{count}i", section, 8 * count)
        at = 12 * count + sum(max(k, 0) for k in key_lengths)
        values = []
        for n in value_lengths:
            if n < -1:
                raise Failed(f"batch at offset {base_offset}: a value length {n}")
            values.append(None if n < 0 else section[at : at + max(n, 0)])
            at += max(n, 0)
        if columns == 4:
            header_lengths = struct.unpack_from(f"<{count}i", section, at)
            at += 4 * count + sum(header_lengths)
        if min(key_lengths) < -1 or at != len(section):
            raise Failed(f"batch at offset {base_offset}: its records section does not fit it")
        records.extend((base_offset + i, v) for i, v in enumerate(values))
        pos = end
    return records


def topic_partition(tp):
    return string(tp[0]) + i32(tp[1])


def partition_offset(po):
    return string(po[0]) + i32(po[1]) + i64(po[2])


def read_partition_offset(r):
    return r.string(), r.i32(), r.i64()


def read_broker(r):
    return r.i32(), r.string(), r.i32()


def read_topic_metadata(r):
    return r.string(), r.i16(), r.array(lambda r: (r.i32(), r.i32()))


def read_assigned_stream(r):
    return r.string(), r.array(lambda r: (r.string(), r.i32(), r.i64(), r.i32()))


def read_subscription(r):
    topics = r.array(lambda r: (r.string(), r.i32()))
    pattern = r.string()
    return topics, pattern, r.i8(), r.i32()


def read_member_description(r):
    member_id = r.string()
    r.string()
    r.i32()
    read_subscription(r)
    return member_id, sorted(r.array(lambda r: (r.string(), r.i32())))


# --- §3 frames over one connection ---------------------------------------------------------


class Failed(Exception):
    pass


class Connection:
    """One connection: requests we send and their answers; coordinator requests, if a handler
    is given, answered from the reader thread."""

    def __init__(self, address, on_request=None):
        self.sock = socket.create_connection(address, timeout=DEADLINE)
        self.sock.settimeout(None)
        self.on_request = on_request
        self.lock = threading.Lock()
        self.next_id = 0
        self.waiting = {}
        self.closed = threading.Event()
        self.error = None
        self.frames_sent = 0
        self.queued = {}  # frame number (1-based) -> when it was queued
        threading.Thread(target=self._read, daemon=True).start()

    def _send_frame(self, frame):
        with self.lock:
            self.frames_sent += 1
            self.queued[self.frames_sent] = time.monotonic()
            self.sock.sendall(i32(len(frame)) + frame)

    def request(self, api_key, version, body):
        with self.lock:
            cid = self.next_id
            self.next_id += 1
            slot = [threading.Event(), None]
            self.waiting[cid] = slot
        header = i8(REQUEST) + i16(api_key) + i16(version) + i32(cid) + string(f"level{LEVEL}")
        self._send_frame(header + body)
        slot.append(self.queued[self.frames_sent])
        if not slot[0].wait(DEADLINE) or slot[1] is None:
            raise Failed(f"no answer to api {api_key}: {self.error}")
        self.last_request_queued = slot[2]
        return slot[1]

    def respond(self, api_key, version, cid, body):
        self._send_frame(i8(RESPONSE) + i16(api_key) + i16(version) + i32(cid) + body)

    def _read_exactly(self, n):
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise EOFError
            data += chunk
        return data

    def _read(self):
        try:
            while True:
                (size,) = struct.unpack(">i", self._read_exactly(4))
                frame = Reader(self._read_exactly(size))
                kind, api_key, version, cid = frame.i8(), frame.i16(), frame.i16(), frame.i32()
                if kind == RESPONSE:
                    slot = self.waiting.pop(cid)
                    slot[1] = frame
                    slot[0].set()
                elif kind == REQUEST:
                    frame.string()  # client_id
                    try:
                        self.on_request(self, api_key, version, cid, frame)
                    except Failed as exc:  # §3: refuse the version with an error frame, close
                        self.error = (35, str(exc))
                        body = i16(35) + string(str(exc))
                        self._send_frame(i8(ERROR) + i16(api_key) + i16(0) + i32(cid) + body)
                        self.sock.close()
                        return
                else:
                    self.error = (frame.i16(), frame.string())
                    return
        except (EOFError, OSError):
            pass
        finally:
            self.closed.set()
            for slot in list(self.waiting.values()):
                slot[0].set()

    def close(self):
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_WR)
        self.closed.wait(DEADLINE)
        self.sock.close()


def check(code, what):
    if code != 0:
        raise Failed(f"{what}: error code {code}")


# --- the client ----------------------------------------------------------------------------


class Admin:
    def __init__(self, address):
        self.conn = Connection(address)

    def create_topic(self, topic, partitions, broker_ids):
        body = string(topic) + i32(partitions) + array(broker_ids, i32)
        r = self.conn.request(CREATE_TOPIC, 1, body)
        check(r.i16(), "CreateTopic")

    def create_partitions(self, topic, total, broker_ids):
        body = string(topic) + i32(total) + array(broker_ids, i32)
        r = self.conn.request(CREATE_PARTITIONS, 1, body)
        check(r.i16(), "CreatePartitions")

    def produce(self, topic, partition, values):
        body = string(topic) + i32(partition) + array([], None) + nbytes(batch(values))
        r = self.conn.request(PRODUCE, 1, body)
        check(r.i16(), "Produce")

    def fetch(self, topic, partition, offset):
        body = string(topic) + i32(partition) + i64(offset) + i32(1 << 20)
        r = self.conn.request(FETCH, 1, body)
        check(r.i16(), "Fetch")
        r.i64()
        r.i64()
        if r.i32() != 0:
            raise Failed("Fetch 1 answered records, which it leaves empty")
        records = read_batches(r.nbytes())
        r.end()
        return [(o, v) for o, v in records if o >= offset]

    def metadata(self, group):
        """ClusterMetadata 1: the coordinator's id, the brokers, and the slot holders (§8)."""
        r = self.conn.request(CLUSTER_METADATA, 1, string(group) + array(None, string))
        check(r.i16(), "ClusterMetadata")
        coordinator_id = r.i32()
        r.i64()
        brokers = r.array(read_broker)
        r.array(read_topic_metadata)
        slot_holders = r.array(lambda r: r.i32())
        r.end()
        return coordinator_id, brokers, slot_holders

    def coordinator(self, group):
        coordinator_id, brokers, slot_holders = self.metadata(group)
        if not slot_holders:
            raise Failed("ClusterMetadata 1 names no coordinator slot")
        # §8: a group's slot is crc32 of its id modulo the slot count
        holder = slot_holders[zlib.crc32(group.encode()) % len(slot_holders)]
        if holder != coordinator_id:
            raise Failed(f"{group}'s slot is held by {holder}, its coordinator is {coordinator_id}")
        for broker_id, host, port in brokers:
            if broker_id == coordinator_id:
                return (host, port), {
                    "slots": len(slot_holders),
                    "holders": sorted(set(slot_holders)),
                }
        raise Failed(f"no coordinator for {group} yet")

    def describe(self, group):
        """DescribeGroup 2 (§8): its state, its members' ids with their partitions, and the
        address of each member, in the order of the members."""
        r = self.conn.request(DESCRIBE_GROUP, 2, string(group))
        check(r.i16(), "DescribeGroup")
        r.string()
        state = r.string()
        r.i32()
        members = r.array(read_member_description)
        r.array(read_partition_offset)
        r.array(read_partition_offset)
        hosts = r.array(lambda r: (r.string(), r.string()))
        r.end()
        if [member_id for member_id, _ in hosts] != [member_id for member_id, _ in members]:
            raise Failed(f"member_hosts {hosts} not in the order of the members {members}")
        return state, members, hosts

    def delete_topic(self, topic):
        """DeleteTopic 0 (§8): the error code, 0 once the topic is gone from the store."""
        r = self.conn.request(DELETE_TOPIC, 0, string(topic))
        code = r.i16()
        r.end()
        return code

    def committed(self, group):
        r = self.conn.request(OFFSET_FETCH, 0, string(group) + array(None, topic_partition))
        check(r.i16(), "OffsetFetch")
        return {(t, p): o for t, p, o in r.array(read_partition_offset)}


class Member:
    """A consumer of level 5: it registers, carries out Ping/StopFetcher/StartFetcher as they
    come, fetches what it holds and commits."""

    def __init__(self, admin, address, group, consumer_id, topic):
        self.admin = admin
        self.group = group
        self.consumer_id = consumer_id
        self.state = threading.Condition()
        self.generation = -1
        self.holding = {}  # (topic, partition) -> next offset to read
        self.requests = []
        self.lease_until = 0.0
        self.conn = Connection(address, self._on_request)
        subscription = array([topic], lambda t: string(t) + i32(1)) + string(None) + i8(0) + i32(1)
        body = (
            string(group)
            + string(consumer_id)
            + subscription
            + i8(0)  # auto_commit: commits go in OffsetCommit
            + string("smallest")
            + i32(SESSION_TIMEOUT_MS)
            + i32(-1)
            + array([], topic_partition)
            + string(None)  # instance_id: a dynamic member
        )
        r = self.conn.request(REGISTER_CONSUMER, 1, body)
        check(r.i16(), "RegisterConsumer")
        with self.state:
            self.lease_until = self.conn.last_request_queued + SESSION_TIMEOUT_MS / 1000

    def _on_request(self, conn, api_key, version, cid, r):
        self.requests.append((api_key, version))
        _epoch, generation, consumer_id = r.i64(), r.i32(), r.string()
        newest = {PING: 1, STOP_FETCHER: 2, START_FETCHER: 2}[api_key]
        if version > newest:
            raise Failed(f"api {api_key} in version {version}: level 5 reads 0-{newest}")
        if api_key == PING:
            r.i32()
            acknowledged = r.i64() if version >= 1 else -1
            r.end()
            self._renew(acknowledged)
            body = i16(0) + string(consumer_id) + array([], partition_offset)
        elif api_key == STOP_FETCHER:
            acknowledged = r.i64() if version >= 1 else -1
            stop = r.array(lambda r: (r.string(), r.i32())) if version >= 2 else None
            if version >= 2:
                r.i16()  # reason: only a static member is fenced, and this one is dynamic
            r.end()
            self._renew(acknowledged)
            with self.state:
                if stop is None:
                    self.holding = {}
                else:
                    for tp in stop:
                        self.holding.pop(tuple(tp), None)
                self.state.notify_all()
            body = i16(0) + string(consumer_id) + array([], partition_offset)
        elif api_key == START_FETCHER:
            streams = r.array(read_assigned_stream)
            r.array(read_broker)
            acknowledged = r.i64() if version >= 1 else -1
            incremental = r.i8() == 1 if version >= 2 else False
            r.end()
            self._renew(acknowledged)
            holding = {}
            with self.state:
                for _, partitions in streams:
                    for topic, partition, offset, _ in partitions:
                        kept = self.holding.get((topic, partition)) if incremental else None
                        holding[topic, partition] = max(offset, 0) if kept is None else kept
                self.holding = holding
                self.generation = generation
                self.state.notify_all()
            body = i16(0) + string(consumer_id)
        else:
            raise Failed(f"unexpected request {api_key}")
        conn.respond(api_key, version, cid, body)

    def _renew(self, acknowledged):
        """SPEC.md §1: the lease runs to the queue time of the frame acknowledged plus T."""
        queued = self.conn.queued.get(acknowledged)
        if queued is None:
            return
        with self.state:
            self.lease_until = max(self.lease_until, queued + SESSION_TIMEOUT_MS / 1000)
        for n in [n for n in list(self.conn.queued) if n < acknowledged]:
            self.conn.queued.pop(n, None)

    def wait_holding(self, count):
        with self.state:
            if not self.state.wait_for(lambda: len(self.holding) == count, DEADLINE):
                raise Failed(f"{self.consumer_id} holds {sorted(self.holding)}, not {count}")
            return dict(self.holding)

    def consume(self):
        """Fetch every partition held to its end and commit; returns the records read."""
        with self.state:
            holding = dict(self.holding)
            generation = self.generation
            if time.monotonic() >= self.lease_until:
                raise Failed(f"{self.consumer_id}'s lease ran out: it may not fetch")
        read = 0
        for (topic, partition), offset in holding.items():
            records = self.admin.fetch(topic, partition, offset)
            read += len(records)
            if records:
                holding[topic, partition] = records[-1][0] + 1
        offsets = [(t, p, o) for (t, p), o in holding.items()]
        body = string(self.group) + string(self.consumer_id) + i32(generation)
        r = self.conn.request(OFFSET_COMMIT, 0, body + array(offsets, partition_offset))
        check(r.i16(), "OffsetCommit")
        with self.state:
            for tp, o in holding.items():
                if tp in self.holding:
                    self.holding[tp] = o
        return read

    def leave(self):
        with self.state:
            self.holding = {}
            generation = self.generation
        body = string(self.group) + string(self.consumer_id) + i32(generation)
        r = self.conn.request(LEAVE_GROUP, 0, body)
        check(r.i16(), "LeaveGroup")
        self.conn.close()


def run(address, name, partitions=4):
    topic = group = f"frozen-{name}"
    admin = Admin(address)
    _, brokers, _ = admin.metadata(None)
    broker_ids = sorted(broker_id for broker_id, _, _ in brokers)
    admin.create_topic(topic, partitions // 2, broker_ids)
    admin.create_partitions(topic, partitions, broker_ids)
    for p in range(partitions):
        admin.produce(topic, p, [f"{p}-{i}".encode() for i in range(10)])
    coordinator, slot = admin.coordinator(group)
    a = Member(admin, coordinator, group, "a", topic)
    alone = a.wait_holding(partitions)
    read_alone = a.consume()
    b = Member(admin, coordinator, group, "b", topic)
    half = partitions // 2
    held_b = set(b.wait_holding(half))
    held_a = set(a.wait_holding(partitions - half))
    if held_a & held_b or len(held_a | held_b) != partitions:
        raise Failed(f"a holds {sorted(held_a)}, b holds {sorted(held_b)}")
    for p in range(partitions):
        admin.produce(topic, p, [f"{p}-{i}".encode() for i in range(10, 15)])
    read_shared = a.consume() + b.consume()
    state, members, hosts = admin.describe(group)
    b.leave()
    a.wait_holding(partitions)
    a.consume()
    committed = admin.committed(group)
    a.leave()
    scratch = f"{topic}-scratch"
    admin.create_topic(scratch, 1, broker_ids)
    # Once answered the topic is gone from the store: deleting it again finds no such topic.
    deleted = [admin.delete_topic(scratch), admin.delete_topic(scratch)]
    return {
        "level": LEVEL,
        "alone": len(alone),
        "read_alone": read_alone,
        "read_shared": read_shared,
        "committed": sorted(committed.values()),
        "slot_holders": slot,
        "described_hosts": {
            "state": state,
            "members": {member_id: len(held) for member_id, held in members},
            "hosts": {member_id: bool(host) for member_id, host in hosts},
        },
        "deleted": deleted,
        "versions_received": sorted(set(a.requests + b.requests)),
    }


if __name__ == "__main__":
    host, _, port = sys.argv[1].rpartition(":")
    print(json.dumps(run((host, int(port)), sys.argv[2] if len(sys.argv) > 2 else "level5")))
