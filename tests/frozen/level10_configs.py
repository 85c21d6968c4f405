# mypy: ignore-errors
# (a third party's code, written once from SPEC.md and never changed: checked by running it)
"""A frozen client of level 10's topic settings (protocol/SPEC.md §8, 10): an admin that creates
a topic with settings of its own by CreateTopic 2's ``configs``, is refused one with a setting the
broker does not know (INVALID_CONFIG, and no topic), and reads the settings back from
ClusterMetadata 3's ``topic_configs``.

Written from SPEC.md's layouts with the standard library only, as a third party would, and never
changed afterwards. It talks to the broker named on its command line, one request at a time,
and prints one JSON line with what it saw; it exits non-zero at the first thing that goes wrong.
"""

import json
import socket
import struct
import sys

LEVEL = 10
DEADLINE = 30.0
REQUEST, RESPONSE, ERROR = 0, 1, 2
CLUSTER_METADATA, CREATE_TOPIC = 3, 10


def i8(v):
    return struct.pack(">b", v)


def i16(v):
    return struct.pack(">h", v)


def i32(v):
    return struct.pack(">i", v)


def string(s):
    if s is None:
        return i16(-1)
    b = s.encode()
    return i16(len(b)) + b


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


class Failed(Exception):
    pass


class Connection:
    """One connection, one request at a time (§3, §4)."""

    def __init__(self, address):
        self.sock = socket.create_connection(address, timeout=DEADLINE)
        self.next_id = 0

    def _read_exactly(self, n):
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise EOFError
            data += chunk
        return data

    def request(self, api_key, version, body):
        cid = self.next_id
        self.next_id += 1
        header = i8(REQUEST) + i16(api_key) + i16(version) + i32(cid) + string(f"level{LEVEL}")
        frame = header + body
        self.sock.sendall(i32(len(frame)) + frame)
        (size,) = struct.unpack(">i", self._read_exactly(4))
        r = Reader(self._read_exactly(size))
        kind, got_key, got_version, got_cid = r.i8(), r.i16(), r.i16(), r.i32()
        if kind == ERROR:
            raise Failed(f"error frame: {r.i16()} {r.string()}")
        if (kind, got_key, got_version, got_cid) != (RESPONSE, api_key, version, cid):
            raise Failed(f"unexpected frame {(kind, got_key, got_version, got_cid)}")
        return r

    def close(self):
        self.sock.close()


def config_entry(entry):
    """§7 ConfigEntry: name, value."""
    return string(entry[0]) + string(entry[1])


def create_topic(conn, topic, partitions, configs):
    """CreateTopic 2: broker_ids null (every live broker), then the topic's own settings."""
    body = string(topic) + i32(partitions) + array(None, i32) + array(configs, config_entry)
    r = conn.request(CREATE_TOPIC, 2, body)
    code = r.i16()
    r.end()
    return code


def metadata(conn, topics):
    """ClusterMetadata 3: (each topic's error code, each topic's settings)."""
    r = conn.request(CLUSTER_METADATA, 3, string(None) + array(topics, string))
    if r.i16() != 0:
        raise Failed("ClusterMetadata refused")
    r.i32()  # coordinator_id
    r.i64()  # coordinator_epoch
    r.array(lambda r: (r.i32(), r.string(), r.i32()))  # brokers
    found = r.array(lambda r: (r.string(), r.i16(), r.array(lambda r: (r.i32(), r.i32()))))
    r.array(lambda r: r.i32())  # slot_holders
    r.array(lambda r: (r.string(), r.uuid()))  # topic_ids
    configs = r.array(lambda r: (r.string(), r.array(lambda r: [r.string(), r.string()])))
    r.end()
    return {t: code for t, code, _partitions in found}, {t: c for t, c in configs}


def main():
    host, port = sys.argv[1].rsplit(":", 1)
    name = sys.argv[2]
    topic, refused_topic = f"{name}-settings", f"{name}-refused"
    conn = Connection((host, int(port)))
    try:
        created = create_topic(
            conn, topic, 2, [("segment.bytes", "1048576"), ("retention.ms", "86400000")]
        )
        refused = create_topic(conn, refused_topic, 1, [("cleanup.policy", "compact")])
        again = create_topic(conn, topic, 2, [])
        codes, configs = metadata(conn, [topic, refused_topic])
    finally:
        conn.close()
    print(
        json.dumps(
            {
                "created": created,
                "refused": refused,
                "again": again,
                "codes": codes,
                "configs": configs,
            }
        )
    )


if __name__ == "__main__":
    main()
