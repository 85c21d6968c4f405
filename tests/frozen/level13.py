# mypy: ignore-errors
# (a third party's code, written once from SPEC.md and never changed: checked by running it)
"""A frozen client of level 13 (protocol/SPEC.md §3): level 12's member and admin, reading
STOP_FETCHER 3, the version in which a busy broker lets a member go over its connection (§11.7, "A
group let go"): a StopFetcher with reason BROKER_BUSY and `throttle_time_ms`, which it carries out
(stop everything, answer, close cleanly) and then registers again after the hint, lengthened at
random by up to half of it. It reports the reason and hint of every StopFetcher it received.

Written from SPEC.md's layouts with the standard library only, as a third party would, and never
changed afterwards: a new api version adds a new frozen client beside it. It runs a whole group
against the broker named on its command line: a topic, a member alone, a second one joining, a
leave, fetches and commits, and prints one JSON line with what it saw; it exits non-zero at the
first thing that goes wrong.

Level 13 keeps the ownership lease of SPEC.md §1: it counts the frames it sends on its coordinator
connection with the time it queued each, and fetches only until the queue time of the frame a
coordinator request acknowledges plus its session timeout.
"""

import contextlib
import hashlib
import hmac
import json
import os
import random
import socket
import struct
import sys
import threading
import time
import zlib

LEVEL = 13
SESSION_TIMEOUT_MS = 4000
DEADLINE = 30.0

REQUEST, RESPONSE, ERROR = 0, 1, 2
PRODUCE, FETCH, LIST_OFFSETS, CLUSTER_METADATA, REGISTER_CONSUMER = 0, 1, 2, 3, 4
PING, STOP_FETCHER, START_FETCHER = 5, 6, 7
OFFSET_COMMIT, OFFSET_FETCH, CREATE_TOPIC, DESCRIBE_GROUP, LEAVE_GROUP = 8, 9, 10, 13, 14
DESCRIBE_ACLS, CREATE_ACLS, DELETE_ACLS = 29, 30, 31
DESCRIBE_USER_SCRAM_CREDENTIALS, ALTER_USER_SCRAM_CREDENTIALS = 50, 51
REPLICA_FETCH = 1000
NONE, BROKER_BUSY = 0, 1009
#: acks=all (§8, 0: Produce 3).
ALL = -1
#: Every throttle_time_ms a ClusterMetadata 5 or RegisterConsumer 3 answer carried.
HINTS = []
#: The newest version of each coordinator request this client reads (RegisterConsumer's
#: served_versions, each from 0).
READS = {PING: 1, STOP_FETCHER: 3, START_FETCHER: 3}
#: Every StopFetcher 3's [reason, throttle_time_ms].
STOPS = []
#: A topic id no topic has (§2: all zero means none, so not that).
NO_SUCH_ID = bytes(range(1, 17))


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


def uuid(b):
    if len(b) != 16:
        raise ValueError("a uuid is 16 bytes")
    return b


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

    def uuid(self):
        b = self.data[self.pos : self.pos + 16]
        if len(b) != 16:
            raise ValueError("a truncated uuid")
        self.pos += 16
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


def read_topic_identity(r):
    return r.string(), r.uuid()


def read_topic_configs(r):
    """§7 TopicConfigs: topic, configs (ConfigEntry: name, value)."""
    return r.string(), r.array(lambda r: (r.string(), r.string()))


def acl_binding(acl):
    """§7 AclBinding: principal, resource_type, name, operation."""
    return b"".join(string(word) for word in acl)


def read_acl_binding(r):
    return r.string(), r.string(), r.string(), r.string()


def scram_sha_256(password, salt, iterations):
    """RFC 5802 §3, as §12 asks a client to derive a credential: (StoredKey, ServerKey)."""
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    server_key = hmac.new(salted, b"Server Key", hashlib.sha256).digest()
    return hashlib.sha256(client_key).digest(), server_key


def batch_offsets(data):
    """§6.2: the offsets of the records of whole batches back to back, from their headers
    alone (base_offset at byte 0, batch_length at 8, record_count at 61)."""
    offsets = []
    pos = 0
    while pos < len(data):
        if len(data) - pos < 65:
            raise ValueError("a truncated batch header")
        (base,) = struct.unpack_from(">q", data, pos)
        (length,) = struct.unpack_from(">i", data, pos + 8)
        (count,) = struct.unpack_from(">i", data, pos + 61)
        if length < 53 or pos + 12 + length > len(data) or count < 1:
            raise ValueError("a malformed batch")
        offsets.extend(range(base, base + count))
        pos += 12 + length
    return offsets


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


def back_off(hint_ms):
    """§11.7: BROKER_BUSY's hint, lengthened at random by up to half of it."""
    time.sleep(hint_ms / 1000 * (1 + random.random() / 2))


def read_hint(r, last=True):
    """The back-off hint (RegisterConsumer 3's last field, ClusterMetadata 5's last but one),
    0 unless BROKER_BUSY."""
    hint = r.i32()
    if last:
        r.end()
    HINTS.append(hint)
    return hint


def read_partition_replicas(r):
    """§7 PartitionReplicas: partition, leader_epoch, replicas, isr."""
    return r.i32(), r.i64(), r.array(lambda r: r.i32()), r.array(lambda r: r.i32())


def read_replicas(r):
    """ClusterMetadata 5's last field: topic -> {partition: (leader_epoch, replicas, isr)}."""
    found = {}
    for topic, partitions in r.array(lambda r: (r.string(), r.array(read_partition_replicas))):
        found[topic] = {p: (epoch, replicas, isr) for p, epoch, replicas, isr in partitions}
    r.end()
    return found


# --- the client ----------------------------------------------------------------------------


class Admin:
    def __init__(self, address):
        self.conn = Connection(address)
        self.metadata_ids = {}  # topic -> id, as ClusterMetadata 5 names them
        self.fetched_with_id = 0  # Fetch 3 naming a topic id, served
        self.produced_with_id = 0  # Produce 3 naming a topic id, written
        self.leaders = {}  # (topic, partition) -> leader id, from ClusterMetadata's topics
        self.replicas = {}  # topic -> {partition: (leader_epoch, replicas, isr)} (v5)
        self.hints = set()  # every (leader_id, leader_epoch) a Produce, Fetch or ListOffsets gave

    def create_topic(self, topic, partitions, factor=1):
        """CreateTopic 3: every live broker, no settings of its own, ``factor`` replicas."""
        check(self.create_topic_error(topic, partitions, factor), "CreateTopic")

    def create_topic_error(self, topic, partitions, factor):
        body = string(topic) + i32(partitions) + array(None, i32) + array([], None) + i16(factor)
        r = self.conn.request(CREATE_TOPIC, 3, body)
        code = r.i16()
        r.end()
        return code

    def describe_acls(self, principal):
        """DescribeAcls 0: the rules of ``principal`` (the other filters null)."""
        body = string(principal) + string(None) + string(None) + string(None)
        r = self.conn.request(DESCRIBE_ACLS, 0, body)
        check(r.i16(), "DescribeAcls")
        acls = r.array(read_acl_binding)
        r.end()
        return acls

    def create_acls(self, acls):
        r = self.conn.request(CREATE_ACLS, 0, array(acls, acl_binding))
        check(r.i16(), "CreateAcls")
        r.end()

    def delete_acls(self, acls):
        r = self.conn.request(DELETE_ACLS, 0, array(acls, acl_binding))
        check(r.i16(), "DeleteAcls")
        deleted = r.array(read_acl_binding)
        r.end()
        return deleted

    def alter_users(self, deletions, upsertions):
        """AlterUserScramCredentials 0: (user, error code) for each user named."""

        def upsertion(u):
            user, password, iterations = u
            salt = os.urandom(16)
            stored_key, server_key = scram_sha_256(password, salt, iterations)
            return (
                string(user) + string("SCRAM-SHA-256") + i32(iterations)
                + nbytes(salt) + nbytes(stored_key) + nbytes(server_key)
            )  # fmt: skip

        body = array(deletions, string) + array(upsertions, upsertion)
        r = self.conn.request(ALTER_USER_SCRAM_CREDENTIALS, 0, body)
        check(r.i16(), "AlterUserScramCredentials")
        results = r.array(lambda r: (r.string(), r.i16()))
        r.end()
        return results

    def describe_users(self, users):
        """DescribeUserScramCredentials 0: each user's (mechanism, iterations), never a key."""
        r = self.conn.request(DESCRIBE_USER_SCRAM_CREDENTIALS, 0, array(users, string))
        check(r.i16(), "DescribeUserScramCredentials")
        found = r.array(lambda r: (r.string(), r.array(lambda r: (r.string(), r.i32()))))
        r.end()
        return found

    def learn_id(self, topic):
        """ClusterMetadata 5 naming ``topic``: its id (§11.12), its partitions' leaders and
        replicas (§11.13), asked until the broker knows it."""
        give_up = time.monotonic() + DEADLINE
        while True:
            body = string(None) + array([topic], string) + i8(0)  # leased (v4): no
            r = self.conn.request(CLUSTER_METADATA, 5, body)
            code = r.i16()
            r.i32()
            r.i64()
            r.array(read_broker)
            topics = r.array(read_topic_metadata)
            r.array(lambda r: r.i32())  # slot_holders (v1)
            ids = dict(r.array(read_topic_identity))  # topic_ids (v2)
            r.array(read_topic_configs)  # topic_configs (v3)
            hint = read_hint(r, last=False)
            replicas = read_replicas(r)  # replicas (v5)
            if code == BROKER_BUSY and time.monotonic() <= give_up:
                back_off(hint)
                continue
            check(code, "ClusterMetadata")
            if topic in ids:
                self.metadata_ids[topic] = ids[topic]
                for name, _, partitions in topics:
                    for p, leader in partitions:
                        self.leaders[name, p] = leader
                # A topic of one replica per partition is left out (SPEC.md §7): each partition's
                # only replica is its leader, in sync, at epoch 0.
                alone = {
                    p: (0, [leader], [leader])
                    for name, _, partitions in topics
                    if name == topic
                    for p, leader in partitions
                }
                self.replicas[topic] = replicas.get(topic, alone)
                return ids[topic]
            if time.monotonic() > give_up:
                raise Failed(f"ClusterMetadata 5 names no id for {topic}")
            time.sleep(0.05)

    def epoch(self, topic, partition):
        """The leader epoch ClusterMetadata 5 gave the partition."""
        return self.replicas[topic][partition][0]

    def produce(self, topic, partition, values):
        """Produce 3 (§11.12, §11.13): to the incarnation of ``topic`` ClusterMetadata 5 named,
        acknowledged once every in-sync replica has it."""
        check(self.produce_error(topic, partition, values, self.metadata_ids[topic]), "Produce")
        self.produced_with_id += 1

    def produce_error(self, topic, partition, values, topic_id, acks=ALL):
        """The error code of a Produce 3 of ``values`` naming ``topic_id``."""
        body = string(topic) + i32(partition) + array([], None) + nbytes(batch(values))
        body += uuid(topic_id) + i16(acks) + i32(10_000)  # timeout_ms
        r = self.conn.request(PRODUCE, 3, body)
        code = r.i16()
        r.i64()
        hint = (r.i32(), r.i64())
        r.end()
        if code == NONE:
            self.hints.add(hint)
        return code

    def fetch(self, topic, partition, offset, topic_id):
        """Fetch 3 (§11.12, §11.13): only from the incarnation ``topic_id`` names, under the
        leader epoch ClusterMetadata 5 gave; the offsets of the records from ``offset`` on."""
        body = string(topic) + i32(partition) + i64(offset) + i32(1 << 20) + uuid(topic_id)
        r = self.conn.request(FETCH, 3, body + i64(self.epoch(topic, partition)))
        check(r.i16(), "Fetch")
        r.i64()
        r.i64()
        if r.array(read_record) != []:
            raise Failed("Fetch 1 on answers batches, not records")
        offsets = batch_offsets(r.nbytes())
        self.hints.add((r.i32(), r.i64()))
        r.end()
        if topic_id != bytes(16):
            self.fetched_with_id += 1
        return [(o, None) for o in offsets if o >= offset]

    def fetch_error(self, topic, partition, topic_id, epoch=-1):
        """The error code of a Fetch 3 of ``topic`` naming ``topic_id`` and ``epoch``."""
        body = string(topic) + i32(partition) + i64(0) + i32(1 << 20) + uuid(topic_id)
        return self.conn.request(FETCH, 3, body + i64(epoch)).i16()

    def list_offsets(self, topic, partition, epoch):
        """ListOffsets 2 naming the leader epoch ``epoch``, no lookup by time: (error, log
        start, high watermark)."""
        body = string(topic) + i32(partition) + i64(-1) + i64(epoch)
        r = self.conn.request(LIST_OFFSETS, 2, body)
        answer = (r.i16(), r.i64(), r.i64())
        r.i64()
        r.i64()
        hint = (r.i32(), r.i64())
        r.end()
        if answer[0] == NONE:
            self.hints.add(hint)
        return answer

    def replica_fetch(self, topic, partitions):
        """REPLICA_FETCH 0 (§8, 1000) as a follower (broker 99) of ``partitions`` of ``topic``
        would send it: (partition, error code) of each answered, and the request's error."""

        def wanted(p):
            topic_id = self.metadata_ids[topic]
            return uuid(topic_id) + i32(p) + i64(self.epoch(topic, p)) + i64(0) + i64(-1)

        body = i32(99) + uuid(bytes(range(16))) + i32(0) + i32(1 << 20)
        r = self.conn.request(REPLICA_FETCH, 0, body + array(partitions, wanted))
        code = r.i16()

        def data(r):
            r.uuid()
            partition, error = r.i32(), r.i16()
            r.i64()  # high_watermark
            r.i64()  # log_start_offset
            r.i64()  # diverging_epoch
            r.i64()  # diverging_end_offset
            r.array(lambda r: (r.i64(), r.i64()))  # epoch_starts
            r.nbytes()
            return partition, error

        answered = r.array(data)
        r.end()
        return code, answered

    def coordinator(self, group):
        give_up = time.monotonic() + DEADLINE
        while True:
            body = string(group) + array(None, string) + i8(0)  # leased (v4): no
            r = self.conn.request(CLUSTER_METADATA, 5, body)
            code = r.i16()
            coordinator_id = r.i32()
            r.i64()
            brokers = r.array(read_broker)
            r.array(read_topic_metadata)
            r.array(lambda r: r.i32())  # slot_holders (v1)
            ids = dict(r.array(read_topic_identity))  # topic_ids (v2)
            r.array(read_topic_configs)  # topic_configs (v3)
            hint = read_hint(r, last=False)
            read_replicas(r)  # replicas (v5)
            if code != BROKER_BUSY or time.monotonic() > give_up:
                break
            back_off(hint)
        check(code, "ClusterMetadata")
        self.metadata_ids = ids
        for broker_id, host, port in brokers:
            if broker_id == coordinator_id:
                return host, port
        raise Failed(f"no coordinator for {group} yet")

    def describe(self, group):
        """DescribeGroup 3 (§8): its state, its members' ids with their partitions, and the
        members it awaits after a failover."""
        r = self.conn.request(DESCRIBE_GROUP, 3, string(group))
        check(r.i16(), "DescribeGroup")
        r.string()
        state = r.string()
        r.i32()
        members = r.array(read_member_description)
        r.array(read_partition_offset)
        r.array(read_partition_offset)
        r.array(lambda r: (r.string(), r.string()))
        awaiting = r.array(lambda r: r.string())
        r.end()
        return state, members, awaiting

    def committed(self, group):
        r = self.conn.request(OFFSET_FETCH, 0, string(group) + array(None, topic_partition))
        check(r.i16(), "OffsetFetch")
        return {(t, p): o for t, p, o in r.array(read_partition_offset)}


class Member:
    """A consumer of level 0: it registers, carries out Ping/StopFetcher/StartFetcher as they
    come, fetches what it holds and commits."""

    def __init__(self, admin, address, group, consumer_id, topic):
        self.admin = admin
        self.group = group
        self.consumer_id = consumer_id
        self.state = threading.Condition()
        self.generation = -1
        self.holding = {}  # (topic, partition) -> next offset to read
        self.topic_ids = {}  # topic -> the id of its incarnation, as StartFetcher 3 named it
        self.ids_seen = {}  # topic -> every id a StartFetcher named for it
        self.requests = []
        self.lease_until = 0.0
        self.address = address
        self.registrations = 0
        self.topic = topic
        self._register()

    def _register(self):
        """§11.1; a member let go registers again the same way, holding nothing, under the
        generation of the last StartFetcher it carried out."""
        with self.state:
            generation = self.generation
        subscription = (
            array([self.topic], lambda t: string(t) + i32(1)) + string(None) + i8(0) + i32(1)
        )
        body = (
            string(self.group)
            + string(self.consumer_id)
            + subscription
            + i8(0)  # auto_commit: commits go in OffsetCommit
            + string("smallest")
            + i32(SESSION_TIMEOUT_MS)
            + i32(generation)
            + array([], topic_partition)
            + string(None)  # instance_id: a dynamic member
            + array(list(READS.items()), lambda kv: i16(kv[0]) + i16(0) + i16(kv[1]))
        )
        give_up = time.monotonic() + DEADLINE
        while True:
            self.conn = Connection(self.address, self._on_request)
            r = self.conn.request(REGISTER_CONSUMER, 3, body)
            code = r.i16()
            r.i64()
            r.i32()
            hint = read_hint(r)
            if code != BROKER_BUSY or time.monotonic() > give_up:
                break
            # §11.1: a refused registration closes its connection; the next one is new.
            self.conn.close()
            back_off(hint)
        check(code, "RegisterConsumer")
        with self.state:
            self.lease_until = self.conn.last_request_queued + SESSION_TIMEOUT_MS / 1000
            self.registrations += 1

    def _on_request(self, conn, api_key, version, cid, r):
        self.requests.append((api_key, version))
        _epoch, generation, consumer_id = r.i64(), r.i32(), r.string()
        newest = READS[api_key]
        if version > newest:
            raise Failed(f"api {api_key} in version {version}: level 13 reads 0-{newest}")
        let_go = None
        if api_key == PING:
            r.i32()
            acknowledged = r.i64() if version >= 1 else -1
            r.end()
            self._renew(acknowledged)
            body = i16(0) + string(consumer_id) + array([], partition_offset)
        elif api_key == STOP_FETCHER:
            acknowledged = r.i64() if version >= 1 else -1
            stop = r.array(lambda r: (r.string(), r.i32())) if version >= 2 else None
            # reason: only a static member is fenced, and this one is dynamic
            reason = r.i16() if version >= 2 else NONE
            if version >= 3:
                hint = r.i32()
                STOPS.append([reason, hint])
                if reason == BROKER_BUSY:  # §11.7: let go; stop everything, back after the hint
                    stop, let_go = None, hint
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
            ids = dict(r.array(read_topic_identity)) if version >= 3 else {}
            r.end()
            self._renew(acknowledged)
            holding = {}
            with self.state:
                for _, partitions in streams:
                    for topic, partition, offset, _ in partitions:
                        kept = self.holding.get((topic, partition)) if incremental else None
                        holding[topic, partition] = max(offset, 0) if kept is None else kept
                self.holding = holding
                self.topic_ids = ids
                for topic, topic_id in ids.items():
                    self.ids_seen.setdefault(topic, set()).add(topic_id)
                self.generation = generation
                self.state.notify_all()
            body = i16(0) + string(consumer_id)
        else:
            raise Failed(f"unexpected request {api_key}")
        conn.respond(api_key, version, cid, body)
        if let_go is not None:
            # Answered: close cleanly (it has stopped), and come back after the hint.
            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_WR)
            threading.Thread(target=self._come_back, args=(let_go,), daemon=True).start()

    def _come_back(self, hint_ms):
        back_off(hint_ms)
        self._register()

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
            ids = dict(self.topic_ids)
            generation = self.generation
            if time.monotonic() >= self.lease_until:
                raise Failed(f"{self.consumer_id}'s lease ran out: it may not fetch")
        read = 0
        for (topic, partition), offset in holding.items():
            records = self.admin.fetch(topic, partition, offset, ids.get(topic, bytes(16)))
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


def rights(admin, name, topic):
    """Users and rules over the wire (§8, 29-31 and 50-51), on a broker that authenticates
    nobody, where the rules are kept for when it does."""
    principal = f"User:{name}"
    rule = [principal, "topic", topic, "read"]
    admin.create_acls([rule])
    listed = admin.describe_acls(principal)
    added = admin.alter_users([], [(name, "frozen password", 4096)])
    described = admin.describe_users([name])
    deleted = admin.alter_users([name], [])
    again = admin.alter_users([name], [])
    removed = admin.delete_acls([rule])
    return {
        "listed": listed,
        "added": added,
        "described": described,
        "deleted": deleted + again,
        "removed": removed,
        "after": admin.describe_acls(principal) + admin.describe_users([name]),
    }


def run(address, name, partitions=4):
    topic = group = f"frozen-{name}"
    admin = Admin(address)
    refused_factor = admin.create_topic_error(f"{topic}-replicated", partitions, 2)
    admin.create_topic(topic, partitions)
    admin.learn_id(topic)
    for p in range(partitions):
        admin.produce(topic, p, [f"{p}-{i}".encode() for i in range(10)])
    coordinator = admin.coordinator(group)
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
    state, members, awaiting = admin.describe(group)
    admin.coordinator(group)  # ClusterMetadata 5 names the topic's id
    wrong_id_error = admin.fetch_error(topic, 0, NO_SUCH_ID)
    # refused, and nothing written: the group's commits count 15 records
    wrong_id_produce_error = admin.produce_error(topic, 0, [b"refused"], NO_SUCH_ID)
    managed = rights(admin, name, topic)
    epoch = admin.epoch(topic, 0)
    replication = {
        "refused_factor": refused_factor,
        "replicas": {
            str(p): [epoch, replicas, isr, admin.leaders[topic, p]]
            for p, (epoch, replicas, isr) in sorted(admin.replicas[topic].items())
        },
        "hints": sorted(admin.hints),
        "listed": admin.list_offsets(topic, 0, epoch),
        "newer_epoch": [
            admin.fetch_error(topic, 0, admin.metadata_ids[topic], epoch + 1),
            admin.list_offsets(topic, 0, epoch + 1)[0],
        ],
        "acks_0": admin.produce_error(topic, 0, [b"refused"], admin.metadata_ids[topic], acks=0),
        "replica_fetch": admin.replica_fetch(topic, list(range(partitions))),
    }
    b.leave()
    a.wait_holding(partitions)
    a.consume()
    committed = admin.committed(group)
    a.leave()
    return {
        "level": LEVEL,
        "alone": len(alone),
        "read_alone": read_alone,
        "read_shared": read_shared,
        "committed": sorted(committed.values()),
        "versions_received": sorted(set(a.requests + b.requests)),
        "topic_ids": {
            "started": {t: sorted(i.hex() for i in ids) for t, ids in a.ids_seen.items()},
            "started_b": {t: sorted(i.hex() for i in ids) for t, ids in b.ids_seen.items()},
            "metadata": {t: i.hex() for t, i in admin.metadata_ids.items() if t == topic},
            "fetched_with_id": admin.fetched_with_id,
            "wrong_id_error": wrong_id_error,
            "produced_with_id": admin.produced_with_id,
            "wrong_id_produce_error": wrong_id_produce_error,
        },
        "rights": managed,
        "replication": replication,
        "throttle_hints": HINTS,
        "stop_fetcher_3": {"stops": STOPS, "registrations": a.registrations + b.registrations},
        "described": {
            "state": state,
            "members": {member_id: len(held) for member_id, held in members},
            "awaiting": awaiting,
        },
    }


if __name__ == "__main__":
    host, _, port = sys.argv[1].rpartition(":")
    print(json.dumps(run((host, int(port)), sys.argv[2] if len(sys.argv) > 2 else "level13")))
