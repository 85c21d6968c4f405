# mypy: ignore-errors
# (a third party's code, written once from SPEC.md and never changed: checked by running it)
"""A frozen client of level 1 (protocol/SPEC.md §3): it reads Ping 0-1, StopFetcher 0-1 and
StartFetcher 0-1 (version 1 carries `acknowledged_frames`, the ownership lease of §1), and sends
version 0 of every api, RegisterConsumer 0 included.

Written from SPEC.md's layouts with the standard library only, as a third party would, and never
changed afterwards: a new api version adds a new frozen client beside it. It runs a whole group
against the broker named on its command line: a topic, a member alone, a second one joining, a
leave, fetches and commits, and prints one JSON line with what it saw; it exits non-zero at the
first thing that goes wrong.

Level 1 keeps the ownership lease of SPEC.md §1: it counts the frames it sends on its coordinator
connection with the time it queued each, and fetches only until the queue time of the frame a
coordinator request acknowledges (or of its accepted RegisterConsumer) plus its session timeout.
When its lease runs out it stops fetching, closes its coordinator connection cleanly and registers
again; it stops too when that connection ends, and registers again (§5). Its RegisterConsumer 0
says nothing of what it reads, so a broker serves it version 0 of the coordinator requests (§3,
"Versions both ways"), which renew no lease: it then goes through that cycle every session
timeout, and must still read, commit, join and leave as a group.
"""

import contextlib
import json
import socket
import struct
import sys
import threading
import time
import zlib

LEVEL = 1
SESSION_TIMEOUT_MS = 4000
DEADLINE = 30.0

REQUEST, RESPONSE, ERROR = 0, 1, 2
PRODUCE, FETCH, CLUSTER_METADATA, REGISTER_CONSUMER = 0, 1, 3, 4
PING, STOP_FETCHER, START_FETCHER = 5, 6, 7
OFFSET_COMMIT, OFFSET_FETCH, CREATE_TOPIC, LEAVE_GROUP = 8, 9, 10, 14


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


def record(value):
    timestamp = int(time.time() * 1000)
    covered = i64(timestamp) + nbytes(None) + nbytes(value)
    return i64(-1) + struct.pack(">I", zlib.crc32(covered)) + covered


def read_record(r):
    offset = r.i64()
    r.take(">I")
    r.i64()
    r.nbytes()
    return offset, r.nbytes()


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
            self.sock.close()
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

    def create_topic(self, topic, partitions):
        r = self.conn.request(CREATE_TOPIC, 0, string(topic) + i32(partitions))
        check(r.i16(), "CreateTopic")

    def produce(self, topic, partition, values):
        body = string(topic) + i32(partition) + array(values, record)
        r = self.conn.request(PRODUCE, 0, body)
        check(r.i16(), "Produce")

    def fetch(self, topic, partition, offset):
        body = string(topic) + i32(partition) + i64(offset) + i32(1 << 20)
        r = self.conn.request(FETCH, 0, body)
        check(r.i16(), "Fetch")
        r.i64()
        r.i64()
        records = r.array(read_record)
        r.end()
        return [(o, v) for o, v in records if o >= offset]

    def close(self):
        self.conn.close()

    def coordinator(self, group):
        r = self.conn.request(CLUSTER_METADATA, 0, string(group) + array(None, string))
        check(r.i16(), "ClusterMetadata")
        coordinator_id = r.i32()
        r.i64()
        brokers = r.array(read_broker)
        r.array(read_topic_metadata)
        r.end()
        for broker_id, host, port in brokers:
            if broker_id == coordinator_id:
                return host, port
        raise Failed(f"no coordinator for {group} yet")

    def committed(self, group):
        r = self.conn.request(OFFSET_FETCH, 0, string(group) + array(None, topic_partition))
        check(r.i16(), "OffsetFetch")
        return {(t, p): o for t, p, o in r.array(read_partition_offset)}


def find_coordinator(bootstrap, group):
    """§11.1: ask the brokers in turn until one names a coordinator."""
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        for address in bootstrap:
            try:
                admin = Admin(address)
            except OSError:
                continue
            try:
                return admin.coordinator(group)
            except Failed:
                continue
            finally:
                admin.close()
        time.sleep(0.2)
    raise Failed(f"no coordinator for {group}")


def committed(bootstrap, group):
    admin = Admin(find_coordinator(bootstrap, group))
    try:
        return admin.committed(group)
    finally:
        admin.close()


class Member:
    """A consumer of level 1: it registers, carries out Ping/StopFetcher/StartFetcher as they
    come, fetches what it holds while its lease lasts and commits. When its lease runs out or its
    coordinator connection ends it stops fetching and registers again, with whichever broker is
    the coordinator then."""

    def __init__(self, bootstrap, group, consumer_id, topic, admin):
        self.bootstrap = bootstrap
        self.admin = admin  # fetches go to the broker of the partitions
        self.group = group
        self.consumer_id = consumer_id
        self.topic = topic
        self.state = threading.Condition()
        self.generation = -1
        self.holding = {}  # (topic, partition) -> next offset to read
        self.requests = []
        self.registrations = 0
        self.lease_until = 0.0
        self.leaving = False
        self.turn = threading.Lock()  # held to register again, or to leave: one at a time
        self._register()
        threading.Thread(target=self._watch, daemon=True).start()

    def _registration(self):
        topics = array([self.topic], lambda t: string(t) + i32(1))
        return (
            string(self.group)
            + string(self.consumer_id)
            + topics
            + string(None)
            + i8(0)
            + i32(1)
            + i8(0)  # auto_commit: commits go in OffsetCommit
            + string("smallest")
            + i32(SESSION_TIMEOUT_MS)
            + i32(self.generation)
            + array([], topic_partition)  # it holds nothing: it stopped before registering
        )

    def _register(self):
        """§11.1: find the coordinator, register over a new connection; §11.7: try again."""
        deadline = time.monotonic() + DEADLINE
        while time.monotonic() < deadline:
            try:
                conn = Connection(find_coordinator(self.bootstrap, self.group), self._on_request)
                code = conn.request(REGISTER_CONSUMER, 0, self._registration()).i16()
            except (OSError, Failed):
                time.sleep(0.2)
                continue
            if code == 0:
                with self.state:  # §1: an accepted registration renews the lease
                    self.conn = conn
                    self.lease_until = conn.last_request_queued + SESSION_TIMEOUT_MS / 1000
                    self.registrations += 1
                    self.state.notify_all()
                return
            conn.close()
            # 1004: the coordinator has not yet seen its last connection end
            if code not in (14, 15, 16, 27, 1004):
                raise Failed(f"RegisterConsumer: error code {code}")
            time.sleep(0.05)
        raise Failed(f"{self.consumer_id} could not register")

    def _watch(self):
        while True:
            conn = self.conn
            while not conn.closed.is_set():
                with self.state:
                    left = self.lease_until - time.monotonic()
                if left <= 0:
                    break
                conn.closed.wait(left)
            with self.turn:
                if self.leaving:
                    return
                with self.state:  # §1, §5: it stops its fetchers, then registers again
                    self.holding = {}
                    self.state.notify_all()
                conn.close()  # cleanly: it fetches nothing any more
                self._register()

    def _on_request(self, conn, api_key, version, cid, r):
        self.requests.append((api_key, version))
        _epoch, generation, consumer_id = r.i64(), r.i32(), r.string()
        if version > 1:
            raise Failed(f"api {api_key} in version {version}: level 1 reads 0-1")
        if api_key == PING:
            r.i32()
            acknowledged = r.i64() if version >= 1 else -1
            r.end()
            self._renew(conn, acknowledged)
            body = i16(0) + string(consumer_id) + array([], partition_offset)
        elif api_key == STOP_FETCHER:
            acknowledged = r.i64() if version >= 1 else -1
            r.end()
            self._renew(conn, acknowledged)
            with self.state:
                self.holding = {}
                self.state.notify_all()
            body = i16(0) + string(consumer_id) + array([], partition_offset)
        elif api_key == START_FETCHER:
            streams = r.array(read_assigned_stream)
            r.array(read_broker)
            acknowledged = r.i64() if version >= 1 else -1
            r.end()
            self._renew(conn, acknowledged)
            holding = {}
            for _, partitions in streams:
                for topic, partition, offset, _ in partitions:
                    holding[topic, partition] = max(offset, 0)
            with self.state:
                self.holding = holding
                self.generation = generation
                self.state.notify_all()
            body = i16(0) + string(consumer_id)
        else:
            raise Failed(f"unexpected request {api_key}")
        conn.respond(api_key, version, cid, body)

    def _renew(self, conn, acknowledged):
        """SPEC.md §1: the lease runs to the queue time of the frame acknowledged plus T."""
        queued = conn.queued.get(acknowledged)
        if queued is None:
            return
        with self.state:
            self.lease_until = max(self.lease_until, queued + SESSION_TIMEOUT_MS / 1000)
            self.state.notify_all()
        for n in [n for n in list(conn.queued) if n < acknowledged]:
            conn.queued.pop(n, None)

    def _leased(self):
        return time.monotonic() < self.lease_until

    def wait_holding(self, count):
        """Until it holds ``count`` partitions under its lease."""
        with self.state:
            if not self.state.wait_for(
                lambda: len(self.holding) == count and self._leased(), DEADLINE
            ):
                raise Failed(f"{self.consumer_id} holds {sorted(self.holding)}, not {count}")
            return dict(self.holding)

    def consume(self, count):
        """Fetch every partition held to its end and commit, once it holds ``count`` under its
        lease; returns the records read. A lease that runs out before every fetch is sent, or a
        commit the coordinator does not take (its connection ended, or the group moved on), voids
        the round: nothing of it is committed, and it reads again from what is."""
        deadline = time.monotonic() + DEADLINE
        refused = None
        while time.monotonic() < deadline:
            self.wait_holding(count)
            with self.state:
                holding = dict(self.holding)
                generation = self.generation
                conn = self.conn
            read = 0
            for (topic, partition), offset in holding.items():
                if not self._leased():  # §1: never a fetch past the lease
                    break
                records = self.admin.fetch(topic, partition, offset)
                read += len(records)
                if records:
                    holding[topic, partition] = records[-1][0] + 1
            else:
                offsets = [(t, p, o) for (t, p), o in holding.items()]
                body = string(self.group) + string(self.consumer_id) + i32(generation)
                try:
                    r = conn.request(OFFSET_COMMIT, 0, body + array(offsets, partition_offset))
                    refused = r.i16()
                except (Failed, OSError):  # its connection ended: it registers again
                    continue
                if refused == 0:
                    with self.state:
                        for tp, o in holding.items():
                            if tp in self.holding:
                                self.holding[tp] = o
                    return read
                if refused not in (22, 25):  # ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID: it moved on
                    check(refused, "OffsetCommit")
                time.sleep(0.05)  # for the StartFetcher that follows
        raise Failed(f"{self.consumer_id} could not read and commit: last commit error {refused}")

    def leave(self):
        with self.turn:
            self.leaving = True
            with self.state:
                self.holding = {}
                generation = self.generation
            body = string(self.group) + string(self.consumer_id) + i32(generation)
            r = self.conn.request(LEAVE_GROUP, 0, body)
            check(r.i16(), "LeaveGroup")
            self.conn.close()


def run(address, name, partitions=4):
    """A whole group on one broker: alone, a join, a leave."""
    topic = group = f"frozen-{name}"
    admin = Admin(address)
    admin.create_topic(topic, partitions)
    for p in range(partitions):
        admin.produce(topic, p, [f"{p}-{i}".encode() for i in range(10)])
    a = Member([address], group, "a", topic, admin)
    alone = a.wait_holding(partitions)
    read_alone = a.consume(partitions)
    b = Member([address], group, "b", topic, admin)
    half = partitions // 2
    held_b = set(b.wait_holding(half))
    held_a = set(a.wait_holding(partitions - half))
    if held_a & held_b or len(held_a | held_b) != partitions:
        raise Failed(f"a holds {sorted(held_a)}, b holds {sorted(held_b)}")
    for p in range(partitions):
        admin.produce(topic, p, [f"{p}-{i}".encode() for i in range(10, 15)])
    read_shared = a.consume(partitions - half) + b.consume(half)
    b.leave()
    a.wait_holding(partitions)
    a.consume(partitions)
    offsets = committed([address], group)
    a.leave()
    return {
        "level": LEVEL,
        "alone": len(alone),
        "read_alone": read_alone,
        "read_shared": read_shared,
        "committed": sorted(offsets.values()),
        "registrations": a.registrations + b.registrations,
        "versions_received": sorted(set(a.requests + b.requests)),
    }


if __name__ == "__main__":
    host, _, port = sys.argv[1].rpartition(":")
    print(json.dumps(run((host, int(port)), sys.argv[2] if len(sys.argv) > 2 else "level1")))
