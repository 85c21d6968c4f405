"""Random and mutated request frames, the input of the broker fuzzers.

Driven by a ``random.Random``, so that the suite's test (which gets its Random from hypothesis: a
failure replays) and ``scripts/fuzz_broker.py`` (a seed, hundreds of thousands of frames) throw
the same inputs. Each :class:`Kind` is one class of bad input; a test or a run picks the kinds
it throws, so a class the broker is known to fail on can be set aside by name until it is fixed.

A fuzz connection never names the well-behaved group the fuzzers keep served, except in read-only
requests (DescribeGroup, OffsetFetch): the group is the witness that the broker still serves, and a
client that joins it or commits for it is a legitimate member, not an attack on the broker.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import math
import random
import struct
import uuid
import zlib
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, cast

import attrs
import trio

from protocol import (
    COORDINATOR_REQUESTS,
    REQUEST_TYPES,
    AclBinding,
    AlterUserScramCredentialsRequest,
    ApiKey,
    ClusterMetadataRequest,
    CreateAclsRequest,
    CreatePartitionsRequest,
    CreateTopicRequest,
    DeleteAclsRequest,
    DeleteGroupRequest,
    DeleteTopicRequest,
    DescribeAclsRequest,
    DescribeGroupRequest,
    DescribeUserScramCredentialsRequest,
    ErrorCode,
    FetchRequest,
    LeaveGroupRequest,
    ListGroupsRequest,
    ListOffsetsRequest,
    LocalProtocolError,
    OffsetCommitRequest,
    OffsetFetchRequest,
    PingRequest,
    ProduceRequest,
    ProtocolError,
    Record,
    RegisterConsumerRequest,
    ReplicaFetchPartition,
    ReplicaFetchRequest,
    RequestMessage,
    SaslAuthenticateRequest,
    SaslHandshakeRequest,
    ScramUpsertion,
    StartFetcherRequest,
    StopFetcherRequest,
)
from protocol.batches import (
    HEADERS,
    MAX_SECTION_BYTES,
    Compression,
    build_batch,
    encode_batch,
)
from protocol.codec import STRING, Reader
from protocol.framing import HEADER, SIZE, FrameKind, encode_frame
from protocol.messages import (
    NEWEST_VERSION,
    REQUEST_CODECS,
    RESPONSE_CODECS,
    AssignedPartition,
    AssignedStream,
    error_response,
)
from protocol.types import BrokerInfo, PartitionOffset, Subscription, TopicPartition, TopicStreams

SERVED_GROUP = "served-group"
SERVED_TOPIC = "served"
FUZZ_GROUPS = ("fz-g0", "fz-g1", "fz-g2")
FUZZ_TOPICS = ("fz-t0", "fz-t1", "fz-t2")
MAX_STRING_BYTES = 2**15 - 1
INT32_EXTREMES = (-1, 0, 1, -(2**31), 2**31 - 1, 2**31 - 2, 2**15, -(2**15))
INT64_EXTREMES = (-(2**63), 2**63 - 1, 2**63 - 2, -1, 0, 2**62, 2**32)
HUGE_COUNTS = (2**31 - 1, 5_000_000, 1_000_000, 100_000, 20_000)
COUNT_FIELDS = frozenset({"streams", "pattern_streams", "partitions", "total_partitions"})
"""Integer fields that size something the broker builds (stream lists, partition directories)."""
BAD_PATTERNS = (
    "(",
    "[",
    "*",
    "+a",
    "a{2,1}",
    "(?P<",
    "\\",
    "(?<=a+)b",
    "[z-a]",
    "(?P<x>a)(?P<x>b)",
)
SLOW_PATTERNS = ("(a+)+b", "(a|aa)+$", "(a*)*b")
"""Patterns that backtrack exponentially over a topic of a's (case 5)."""
CONTROL_INSERTS = (
    "\n",
    "\r\n",
    "\x00",
    "\x1b[31m",
    "\t",
    "\x7f",
    "\u2028",
    "\n2026-01-01 00:00:00,000 ERROR forged: a line",
)
ID_FIELDS = frozenset({"group_id", "consumer_id", "topic", "stream_id", "auto_offset_reset"})


class Kind(enum.Enum):
    """One class of input; see each value's docstring."""

    VALID = "valid"
    """Well-formed requests of every type with ordinary values."""
    NUMBERS = "numbers"
    """One integer field at an extreme (offsets near 2**63, generations near 2**31, -1, 0)."""
    COUNTS = "counts"
    """One count (streams, partitions) huge, past its limit in docs/limits.md."""
    STRINGS = "strings"
    """One string field long, up to the 32,767 bytes the codec allows: case 3."""
    CONTROL = "control"
    """Control characters in ids, names and the client id: case 9."""
    REGEX = "regex"
    """Invalid patterns, and a catastrophic one over a topic that triggers it: cases 2 and 5."""
    ROLE = "role"
    """A request only the broker may send (Ping, StopFetcher, StartFetcher), as a connection's
    first frame."""
    ARRAYS = "arrays"
    """One array repeated many times: answers whose size a client controls."""
    BYTES = "bytes"
    """A well-formed frame with bytes flipped, cut, inserted, or its header changed."""
    SIZE = "size"
    """The size field set to -1, 0, less than a header, or more than the frame limit."""
    TRUNCATED = "truncated"
    """A frame whose end never comes: the broker must give up on it (case 7's frame deadline)."""
    PIPELINED = "pipelined"
    """Good requests and then a bad frame in the same write: case 1."""
    BATCHES = "batches"
    """Produce of CRC-valid batches no consumer could decode (lengths past the section, bad
    header blocks, a compression bomb), or of a million empty records in a few hundred bytes of
    zstd, then a version-0 Fetch (the one path on which the broker decodes records): issue 30."""


ALL_KINDS = tuple(Kind)


@attrs.frozen(kw_only=True)
class Frame:
    data: bytes
    intact: bool
    """Built by the encoder and left alone: the broker must answer it (or close the connection)."""
    correlation_id: int
    label: str


@attrs.frozen(kw_only=True)
class Script:
    """What one fuzz connection sends: frames, cut into the writes it makes."""

    kind: Kind
    frames: tuple[Frame, ...]
    writes: tuple[bytes, ...]
    linger: float = 0.0
    """Seconds to stay connected once answered, so that what a request started (a registration's
    rebalance, a StartFetcher) runs while the connection is still there."""

    @property
    def expected(self) -> frozenset[int]:
        """Correlation ids the broker must answer unless it closes the connection first: the
        intact frames before the first one that is not."""
        ids = set()
        for frame in self.frames:
            if not frame.intact:
                break
            ids.add(frame.correlation_id)
        return frozenset(ids)

    def hex(self) -> list[str]:
        return [frame.data.hex() for frame in self.frames]

    def describe(self) -> str:
        lines = [f"{self.kind.value} connection, {len(self.writes)} writes:"]
        lines += [f"  {frame.label}: {frame.data[:512].hex()}" for frame in self.frames]
        return "\n".join(lines)


# --- well-formed requests -----------------------------------------------------------------------


def _group(rng: random.Random, *, read_only: bool = False) -> str:
    if read_only and rng.random() < 0.3:
        return SERVED_GROUP
    return rng.choice(FUZZ_GROUPS)


def _topic(rng: random.Random, *, read_only: bool = False) -> str:
    if read_only and rng.random() < 0.3:
        return SERVED_TOPIC
    return rng.choice(FUZZ_TOPICS)


def _tp(rng: random.Random, read_only: bool = False) -> TopicPartition:
    return TopicPartition(topic=_topic(rng, read_only=read_only), partition=rng.randrange(4))


def _subscription(rng: random.Random) -> Subscription:
    if rng.random() < 0.5:
        topics = tuple(
            TopicStreams(
                topic=rng.choice((SERVED_TOPIC, *FUZZ_TOPICS[:2])), streams=rng.randint(1, 3)
            )
            for _ in range(rng.randint(1, 2))
        )
        return Subscription(topics=topics)
    return Subscription(
        pattern=rng.choice(("fz-.*", r"fz-t[01]", "served|fz-t2", ".*")),
        pattern_is_blacklist=rng.random() < 0.2,
        pattern_streams=rng.randint(1, 2),
    )


FUZZ_USER = "fz-u"
FUZZ_PRINCIPAL = f"User:{FUZZ_USER}"


def _acl(rng: random.Random) -> AclBinding:
    return AclBinding(
        principal=FUZZ_PRINCIPAL,
        resource_type="topic",
        name=_topic(rng),
        operation=rng.choice(("read", "write")),
    )


def _member(rng: random.Random) -> str:
    return f"fz-m{rng.randrange(4)}"


def _builders() -> dict[ApiKey, Callable[[random.Random], RequestMessage]]:
    """An ordinary request of each type; every array has an element, so a mutation can grow it."""

    def record(rng: random.Random) -> Record:
        return Record(offset=-1, timestamp_ms=-1, key=None, value=rng.randbytes(rng.randrange(8)))

    return {
        ApiKey.PRODUCE: lambda rng: ProduceRequest(
            topic=_topic(rng, read_only=True),
            partition=rng.randrange(4),
            records=(record(rng),),
        ),
        ApiKey.FETCH: lambda rng: FetchRequest(
            topic=_topic(rng, read_only=True),
            partition=rng.randrange(4),
            offset=rng.randrange(4),
            max_bytes=rng.choice((1, 1024, 65536)),
        ),
        ApiKey.LIST_OFFSETS: lambda rng: ListOffsetsRequest(
            topic=_topic(rng, read_only=True), partition=rng.randrange(4)
        ),
        ApiKey.CLUSTER_METADATA: lambda rng: ClusterMetadataRequest(
            group_id=rng.choice((None, _group(rng, read_only=True))),
            topics=rng.choice((None, (_topic(rng, read_only=True),))),
        ),
        ApiKey.REGISTER_CONSUMER: lambda rng: RegisterConsumerRequest(
            group_id=_group(rng),
            consumer_id=_member(rng),
            subscription=_subscription(rng),
            auto_commit=rng.random() < 0.5,
            auto_offset_reset=rng.choice(("smallest", "largest")),
            session_timeout_ms=rng.choice((3000, 6000, 10000)),
            generation=rng.choice((-1, 0, 1)),
            owned_partitions=(_tp(rng),),
        ),
        ApiKey.PING: lambda rng: PingRequest(
            coordinator_epoch=rng.randrange(3),
            generation=rng.randrange(3),
            consumer_id=_member(rng),
            num_retries=0,
        ),
        ApiKey.STOP_FETCHER: lambda rng: StopFetcherRequest(
            coordinator_epoch=rng.randrange(3),
            generation=rng.randrange(3),
            consumer_id=_member(rng),
        ),
        ApiKey.START_FETCHER: lambda rng: StartFetcherRequest(
            coordinator_epoch=rng.randrange(3),
            generation=rng.randrange(3),
            consumer_id=_member(rng),
            streams=(
                AssignedStream(
                    stream_id="s-0",
                    partitions=(
                        AssignedPartition(topic=_topic(rng), partition=0, offset=0, broker_id=1),
                    ),
                ),
            ),
            brokers=(BrokerInfo(broker_id=1, host="127.0.0.1", port=9092),),
        ),
        ApiKey.OFFSET_COMMIT: lambda rng: OffsetCommitRequest(
            group_id=_group(rng),
            consumer_id=rng.choice((None, _member(rng))),
            generation=rng.choice((-1, 0, 1)),
            offsets=(
                PartitionOffset(
                    topic=_topic(rng), partition=rng.randrange(4), offset=rng.randrange(9)
                ),
            ),
        ),
        ApiKey.OFFSET_FETCH: lambda rng: OffsetFetchRequest(
            group_id=_group(rng, read_only=True),
            partitions=rng.choice((None, (_tp(rng, read_only=True),))),
        ),
        ApiKey.CREATE_TOPIC: lambda rng: CreateTopicRequest(
            topic=_topic(rng), partitions=rng.randint(1, 4)
        ),
        ApiKey.CREATE_PARTITIONS: lambda rng: CreatePartitionsRequest(
            topic=_topic(rng), total_partitions=rng.randint(1, 6)
        ),
        ApiKey.LIST_GROUPS: lambda rng: ListGroupsRequest(),
        ApiKey.DESCRIBE_GROUP: lambda rng: DescribeGroupRequest(
            group_id=_group(rng, read_only=True)
        ),
        ApiKey.LEAVE_GROUP: lambda rng: LeaveGroupRequest(
            group_id=_group(rng), consumer_id=_member(rng), generation=rng.randrange(3)
        ),
        ApiKey.DELETE_GROUP: lambda rng: DeleteGroupRequest(group_id=_group(rng)),
        # Only the fuzz's own topics: the served topic stays for the requests that read it.
        ApiKey.DELETE_TOPIC: lambda rng: DeleteTopicRequest(topic=_topic(rng)),
        # On a plaintext listener without authentication both are refused (ILLEGAL_SASL_STATE).
        ApiKey.SASL_HANDSHAKE: lambda rng: SaslHandshakeRequest(
            mechanism=rng.choice(("SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"))
        ),
        ApiKey.SASL_AUTHENTICATE: lambda rng: SaslAuthenticateRequest(
            auth_bytes=rng.randbytes(rng.randrange(40))
        ),
        # Rules and users of the fuzz's own principal alone.
        ApiKey.DESCRIBE_ACLS: lambda rng: DescribeAclsRequest(
            principal=rng.choice((None, FUZZ_PRINCIPAL)),
            resource_type=rng.choice((None, "topic", "group")),
            name=None,
            operation=None,
        ),
        ApiKey.CREATE_ACLS: lambda rng: CreateAclsRequest(acls=(_acl(rng),)),
        ApiKey.DELETE_ACLS: lambda rng: DeleteAclsRequest(acls=(_acl(rng),)),
        ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: lambda rng: DescribeUserScramCredentialsRequest(
            users=rng.choice((None, (FUZZ_USER,)))
        ),
        ApiKey.ALTER_USER_SCRAM_CREDENTIALS: lambda rng: AlterUserScramCredentialsRequest(
            deletions=rng.choice(((), (FUZZ_USER,))),
            upsertions=(
                ScramUpsertion(
                    user=FUZZ_USER,
                    mechanism=rng.choice(("SCRAM-SHA-256", "SCRAM-SHA-512")),
                    iterations=4096,
                    salt=rng.randbytes(16),
                    stored_key=rng.randbytes(32),
                    server_key=rng.randbytes(32),
                ),
            ),
        ),
        # A follower's fetch: every partition is answered NOT_LEADER_OR_FOLLOWER, or refused
        # with the rest if the request is out of bounds.
        ApiKey.REPLICA_FETCH: lambda rng: ReplicaFetchRequest(
            replica_id=rng.randrange(4),
            log_dir=uuid.UUID(bytes=rng.randbytes(16)),
            max_wait_ms=rng.randrange(501),
            max_bytes=1 << 16,
            partitions=(
                ReplicaFetchPartition(
                    topic_id=uuid.UUID(bytes=rng.randbytes(16)),
                    partition=rng.randrange(4),
                    leader_epoch=rng.randrange(2),
                    fetch_offset=rng.randrange(4),
                    last_fetched_epoch=-1,
                ),
            ),
        ),
    }


BUILDERS = _builders()
assert set(BUILDERS) == set(REQUEST_TYPES), "a builder for every request"


CONSUMER_KEYS = sorted(set(BUILDERS) - COORDINATOR_REQUESTS)
"""What a client may send; the coordinator's own three from a client break the protocol."""


def valid_request(rng: random.Random, api_key: ApiKey | None = None) -> RequestMessage:
    return BUILDERS[rng.choice(CONSUMER_KEYS) if api_key is None else api_key](rng)


# --- one field changed --------------------------------------------------------------------------

FieldPath = tuple[str | int, ...]


def _leaves(value: object, path: FieldPath = ()) -> Iterator[tuple[FieldPath, object]]:
    """Every field inside ``value`` (nested classes and array elements too), with its path."""
    if attrs.has(type(value)):
        for field in attrs.fields(cast(Any, type(value))):
            yield from _leaves(getattr(value, field.name), (*path, field.name))
        return
    yield path, value
    if isinstance(value, tuple):
        for index, item in enumerate(value):
            yield from _leaves(item, (*path, index))


def _replace(value: Any, path: FieldPath, new: object) -> Any:
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(head, int):
        items = list(value)
        items[head] = _replace(items[head], rest, new)
        return tuple(items)
    return attrs.evolve(value, **{head: _replace(getattr(value, head), rest, new)})


def _with_field(message: RequestMessage, path: FieldPath, new: object) -> RequestMessage:
    return cast(RequestMessage, _replace(message, path, new))


def _name(path: FieldPath) -> str:
    return next((p for p in reversed(path) if isinstance(p, str)), "")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _long_string(rng: random.Random) -> str:
    size = rng.choice((256, 4096, MAX_STRING_BYTES - 1, MAX_STRING_BYTES))
    if rng.random() < 0.2:
        return "\u00e9" * (size // 2)  # two bytes each
    return "x" * size


def _with_control(rng: random.Random, text: str) -> str:
    cut = rng.randint(0, len(text))
    return text[:cut] + rng.choice(CONTROL_INSERTS) + text[cut:]


FOCUS: dict[Kind, tuple[tuple[ApiKey, ...], frozenset[str]]] = {
    Kind.NUMBERS: (
        (ApiKey.REGISTER_CONSUMER, ApiKey.OFFSET_COMMIT, ApiKey.FETCH),
        frozenset({"generation", "offset", "max_bytes", "session_timeout_ms", "partition"}),
    ),
    Kind.COUNTS: (
        (ApiKey.REGISTER_CONSUMER, ApiKey.CREATE_TOPIC, ApiKey.CREATE_PARTITIONS),
        COUNT_FIELDS,
    ),
    Kind.STRINGS: ((ApiKey.REGISTER_CONSUMER,), frozenset({"consumer_id"})),
    Kind.CONTROL: ((ApiKey.REGISTER_CONSUMER,), frozenset({"consumer_id", "group_id"})),
    Kind.ARRAYS: (
        (ApiKey.CLUSTER_METADATA, ApiKey.OFFSET_FETCH, ApiKey.REGISTER_CONSUMER),
        frozenset({"topics", "partitions", "owned_partitions"}),
    ),
}
"""Half of the time a field class changes these requests and fields: the ones whose handling
goes furthest into the broker (a registration reaches the assignor and StartFetcher)."""


def _focused(
    rng: random.Random, kind: Kind, leaves: list[tuple[FieldPath, object]]
) -> list[tuple[FieldPath, object]]:
    names = FOCUS[kind][1]
    focused = [(p, v) for p, v in leaves if _name(p) in names]
    return focused if focused and rng.random() < 0.5 else leaves


def _mutate_field(rng: random.Random, kind: Kind, message: RequestMessage) -> RequestMessage | None:
    """``message`` with one field of the kind's choosing changed; None if it has no such field."""
    leaves = _focused(rng, kind, list(_leaves(message)))
    if kind is Kind.NUMBERS:
        choices = [(p, v) for p, v in leaves if _is_int(v) and _name(p) not in COUNT_FIELDS]
        if not choices:
            return None
        path, _ = rng.choice(choices)
        extremes = INT32_EXTREMES if rng.random() < 0.6 else INT64_EXTREMES
        return _with_field(message, path, rng.choice(extremes))
    if kind is Kind.COUNTS:
        choices = [(p, v) for p, v in leaves if _is_int(v) and _name(p) in COUNT_FIELDS]
        if not choices:
            return None
        path, _ = rng.choice(choices)
        return _with_field(message, path, rng.choice(HUGE_COUNTS))
    if kind is Kind.STRINGS:
        choices = [(p, v) for p, v in leaves if isinstance(v, str)]
        if not choices:
            return None
        path, _ = rng.choice(choices)
        return _with_field(message, path, _long_string(rng))
    if kind is Kind.CONTROL:
        choices = [(p, v) for p, v in leaves if isinstance(v, str) and _name(p) in ID_FIELDS]
        if not choices:
            return None
        path, text = rng.choice(choices)
        assert isinstance(text, str)
        return _with_field(message, path, _with_control(rng, text))
    if kind is Kind.ARRAYS:
        choices = [(p, v) for p, v in leaves if isinstance(v, tuple) and v]
        if not choices:
            return None
        path, items = rng.choice(choices)
        assert isinstance(items, tuple)
        return _with_field(message, path, items * rng.choice((100, 1000, 20_000, 70_000)))
    raise ValueError(kind)


def encode_request(
    message: RequestMessage,
    correlation_id: int,
    client_id: str = "fuzz",
    version: int | None = None,
) -> bytes:
    """A request frame (at the newest version unless told), whatever the values (the codec
    refuses only what its wire type cannot carry: LocalProtocolError)."""
    key = message.API_KEY
    version = NEWEST_VERSION[key] if version is None else version
    frame = encode_frame(
        FrameKind.REQUEST,
        key,
        correlation_id,
        REQUEST_CODECS[key, version],
        message,
        client_id,
        api_version=version,
    )
    return bytes(frame)


def _field_frame(rng: random.Random, kind: Kind, correlation_id: int) -> Frame:
    """A well-formed frame with one field of the kind's class changed."""
    for _ in range(50):
        if kind is Kind.REGEX:
            return _regex_frame(rng, correlation_id)
        focus = FOCUS[kind][0]
        base = valid_request(rng, rng.choice(focus) if rng.random() < 0.5 else None)
        client_id = "fuzz"
        if kind is Kind.CONTROL and rng.random() < 0.25:
            mutated: RequestMessage | None = base
            client_id = _with_control(rng, client_id)
        else:
            mutated = _mutate_field(rng, kind, base)
        if mutated is None:
            continue
        try:
            data = encode_request(mutated, correlation_id, client_id)
        except LocalProtocolError:
            continue  # a value its wire type cannot carry (int64 extreme in an int32)
        return Frame(
            data=data,
            intact=True,
            correlation_id=correlation_id,
            label=f"{kind.value} {type(mutated).__name__}",
        )
    raise AssertionError(f"no {kind.value} frame after 50 tries")


def _regex_frame(rng: random.Random, correlation_id: int) -> Frame:
    pattern = rng.choice((*BAD_PATTERNS, *SLOW_PATTERNS))
    message = RegisterConsumerRequest(
        group_id=_group(rng),
        consumer_id=_member(rng),
        subscription=Subscription(pattern=pattern, pattern_streams=1),
        auto_commit=False,
        auto_offset_reset="smallest",
        session_timeout_ms=6000,
        generation=-1,
        owned_partitions=(),
    )
    return Frame(
        data=encode_request(message, correlation_id),
        intact=True,
        correlation_id=correlation_id,
        label=f"regex RegisterConsumer pattern={pattern!r}",
    )


def backtracking_topic(length: int) -> CreateTopicRequest:
    """A topic on which ``(a+)+b``-like patterns backtrack for 2**length steps."""
    return CreateTopicRequest(topic="a" * length, partitions=1)


# --- byte mutations -----------------------------------------------------------------------------


def _valid_frame(rng: random.Random, correlation_id: int) -> Frame:
    message = valid_request(rng)
    return Frame(
        data=encode_request(message, correlation_id),
        intact=True,
        correlation_id=correlation_id,
        label=f"valid {type(message).__name__}",
    )


def _mutate_bytes(rng: random.Random, data: bytes) -> tuple[bytes, str]:
    """``data`` changed inside, its size field still counting its bytes: the broker has the whole
    frame and must judge it at once."""
    frame = bytearray(data)
    how = rng.choice(
        ("flip", "flip-many", "cut", "insert", "delete", "kind", "api-key", "version", "garbage",
         "tail")
    )  # fmt: skip
    if how == "flip":
        i = rng.randrange(SIZE.size, len(frame))
        frame[i] ^= 1 << rng.randrange(8)
    elif how == "flip-many":
        for _ in range(rng.randint(2, 8)):
            frame[rng.randrange(SIZE.size, len(frame))] = rng.randrange(256)
    elif how == "cut":
        frame = frame[: rng.randrange(SIZE.size, len(frame))]
    elif how == "insert":
        i = rng.randrange(SIZE.size, len(frame) + 1)
        frame[i:i] = rng.randbytes(rng.randint(1, 8))
    elif how == "delete":
        i = rng.randrange(SIZE.size, len(frame))
        del frame[i : i + rng.randint(1, 8)]
    elif how == "kind":
        frame[4] = rng.choice((1, 2, 3, 0x7F, 0x80, 0xFF))
    elif how == "api-key":
        struct.pack_into(">h", frame, 5, rng.choice((-1, 16, 99, 2**15 - 1, -(2**15))))
    elif how == "version":
        struct.pack_into(">h", frame, 7, rng.choice((-1, 1, 2**15 - 1)))
    elif how == "garbage":
        frame = bytearray(SIZE.size) + rng.randbytes(rng.randint(0, 64))
    else:  # bytes after the body, inside the frame
        frame += rng.randbytes(rng.randint(1, 16))
    SIZE.pack_into(frame, 0, len(frame) - SIZE.size)
    return bytes(frame), how


def _truncate(rng: random.Random, data: bytes) -> tuple[bytes, str]:
    """A frame the broker never gets the end of: cut short, or its size field promising more."""
    frame = bytearray(data)
    if rng.random() < 0.5:
        return bytes(frame[: rng.randrange(1, len(frame))]), "truncated"
    size = rng.choice((len(frame), len(frame) + 100, 64 * 1024))
    SIZE.pack_into(frame, 0, size)
    return bytes(frame), f"size={size} of {len(frame) - SIZE.size}"


def _size_frame(rng: random.Random, data: bytes, max_frame_size: int) -> tuple[bytes, str]:
    """A size field the broker can refuse from its four bytes alone."""
    size = rng.choice((-1, -(2**31), 0, 1, 8, max_frame_size + 1, 2**31 - 1))
    frame = bytearray(data)
    SIZE.pack_into(frame, 0, size)
    if rng.random() < 0.3:
        frame = frame[: SIZE.size]
    return bytes(frame), f"size={size}"


def _role_frame(rng: random.Random, correlation_id: int) -> Frame:
    message = valid_request(rng, rng.choice(sorted(COORDINATOR_REQUESTS)))
    return Frame(
        data=encode_request(message, correlation_id),
        intact=False,
        correlation_id=correlation_id,
        label=f"from a client: {type(message).__name__}",
    )


def _bad_frame(rng: random.Random, kind: Kind, correlation_id: int, max_frame_size: int) -> Frame:
    if kind is Kind.ROLE or (kind is Kind.PIPELINED and rng.random() < 0.2):
        return _role_frame(rng, correlation_id)
    good = _valid_frame(rng, correlation_id)
    if kind is Kind.SIZE or (kind is Kind.PIPELINED and rng.random() < 0.4):
        data, how = _size_frame(rng, good.data, max_frame_size)
    elif kind is Kind.TRUNCATED:
        data, how = _truncate(rng, good.data)
    else:
        data, how = _mutate_bytes(rng, good.data)
    return Frame(
        data=data, intact=False, correlation_id=correlation_id, label=f"{how} of {good.label}"
    )


# --- connections --------------------------------------------------------------------------------


def _chunk(rng: random.Random, frames: Sequence[Frame]) -> tuple[bytes, ...]:
    """Cut the frames into writes: one per frame, all in one, a byte at a time, or anywhere."""
    whole = b"".join(frame.data for frame in frames)
    how = rng.choice(("per-frame", "one-write", "bytes", "random"))
    if how == "per-frame":
        return tuple(frame.data for frame in frames)
    if how == "one-write" or not whole:
        return (whole,)
    if how == "bytes" and len(whole) <= 4096:
        return tuple(whole[i : i + 1] for i in range(len(whole)))
    cuts = sorted(rng.sample(range(1, len(whole)), min(len(whole) - 1, rng.randint(1, 8))))
    return tuple(whole[a:b] for a, b in zip([0, *cuts], [*cuts, len(whole)], strict=True))


def connection_script(
    rng: random.Random,
    kind: Kind,
    *,
    max_frame_size: int = 4 * 1024 * 1024,
    slow_topic_max: int = 20,
) -> Script:
    """What one fuzz connection of class ``kind`` sends. A REGEX connection may first create a
    topic of up to ``slow_topic_max`` a's, on which a backtracking engine takes 2**n steps."""
    frames: list[Frame] = []
    correlation_ids = iter(range(2**31))
    if kind is Kind.VALID:
        frames = [_valid_frame(rng, next(correlation_ids)) for _ in range(rng.randint(1, 6))]
    elif kind in (Kind.BYTES, Kind.SIZE, Kind.ROLE, Kind.TRUNCATED):
        frames = [_bad_frame(rng, kind, next(correlation_ids), max_frame_size)]
    elif kind is Kind.BATCHES:
        frames = _batch_frames(rng, correlation_ids)
    elif kind is Kind.PIPELINED:
        frames = [_valid_frame(rng, next(correlation_ids)) for _ in range(rng.randint(1, 4))]
        frames.append(_bad_frame(rng, kind, next(correlation_ids), max_frame_size))
        frames += [_valid_frame(rng, next(correlation_ids)) for _ in range(rng.randint(0, 2))]
    else:
        if kind is Kind.REGEX and rng.random() < 0.5:
            topic = backtracking_topic(rng.randint(12, slow_topic_max))
            frames.append(
                Frame(
                    data=encode_request(topic, 0),
                    intact=True,
                    correlation_id=next(correlation_ids),
                    label=f"CreateTopic {topic.topic}",
                )
            )
        frames += [
            rng.choice((_valid_frame, partial_field(kind)))(rng, next(correlation_ids))
            for _ in range(rng.randint(1, 4))
        ]
    linger = rng.choice((0.0, 0.0, 1.0, 5.0, 12.0))
    return Script(kind=kind, frames=tuple(frames), writes=_chunk(rng, frames), linger=linger)


@functools.cache
def _bomb() -> bytes:
    return _raw_batch(bytes(MAX_SECTION_BYTES + 12), 1, Compression.ZSTD)


@functools.cache
def _million_empty_records() -> bytes:
    count = 1_000_000
    section = bytes(4 * count) + b"\xff" * (4 * count) + bytes(4 * count)
    return _raw_batch(section, count, Compression.ZSTD)


def _raw_batch(section: bytes, count: int, codec: Compression = Compression.NONE) -> bytes:
    return encode_batch(
        section, count, first_timestamp_ms=-1, max_timestamp_ms=-1, compression=codec
    )


def _hostile_batch(rng: random.Random) -> tuple[bytes, str]:
    how = rng.choice(("past", "key", "tail", "count", "header", "bomb", "million"))
    if how == "million":
        return _million_empty_records(), how
    codec = rng.choice((Compression.NONE, Compression.ZSTD, Compression.LZ4))
    if how == "past":  # a value length past the section
        n = rng.choice((8, 1000, 2**31 - 1))
        return _raw_batch(struct.pack("<iii", 0, -1, n) + b"short", 1, codec), how
    if how == "key":
        return _raw_batch(struct.pack("<iii", 0, rng.choice((-2, -(2**31))), 0), 1, codec), how
    if how == "tail":
        return _raw_batch(
            struct.pack("<iii", 0, -1, 0) + rng.randbytes(rng.randint(1, 9)), 1, codec
        ), how
    if how == "count":  # a section for two records, a header claiming more
        return _raw_batch(struct.pack("<iii", 0, -1, 0) * 2, rng.choice((3, 5000)), codec), how
    if how == "header":
        block = struct.pack("<i", 2) + rng.choice((b"\xff\xfe", b"\xc3(")) + struct.pack("<i", -1)
        section = struct.pack("<iii", 0, -1, 0) + struct.pack("<i", len(block)) + block
        batch = bytearray(_raw_batch(section, 1))
        struct.pack_into(">h", batch, 25, 0x08 | HEADERS)
        struct.pack_into(">I", batch, 20, zlib.crc32(bytes(batch[24:])))
        return bytes(batch), how
    return _bomb(), how  # a zstd frame that decompresses past what a section may hold


def _batch_frames(rng: random.Random, correlation_ids: Iterator[int]) -> list[Frame]:
    """A Produce of a hostile batch (after a good one, sometimes), then Fetches of the
    partition from its start: version 0, which the broker decodes, and the newest."""
    topic = SERVED_TOPIC if rng.random() < 0.5 else rng.choice(FUZZ_TOPICS)
    partition = rng.randrange(4)
    batch, how = _hostile_batch(rng)
    if rng.random() < 0.3:
        batch = build_batch([b"good"]) + batch
    produce = ProduceRequest(topic=topic, partition=partition, records=(), batches=batch)
    frames = [
        Frame(
            data=encode_request(produce, next(correlation_ids)),
            intact=True,
            correlation_id=next(correlation_ids) - 1,
            label=f"Produce of a hostile batch ({how})",
        )
    ]
    for version in (0, NEWEST_VERSION[ApiKey.FETCH]):
        fetch = FetchRequest(
            topic=topic,
            partition=partition,
            offset=0,
            max_bytes=rng.choice((0, 1024, 2**31 - 1)),
        )
        correlation_id = next(correlation_ids)
        frames.append(
            Frame(
                data=encode_request(fetch, correlation_id, version=version),
                intact=True,
                correlation_id=correlation_id,
                label=f"Fetch v{version} after a hostile batch",
            )
        )
    return frames


def partial_field(kind: Kind) -> Callable[[random.Random, int], Frame]:
    return lambda rng, correlation_id: _field_frame(rng, kind, correlation_id)


# --- what the broker answers --------------------------------------------------------------------


@attrs.define
class Answers:
    """The broker's side of one fuzz connection, parsed from raw bytes (a protocol.Connection would
    refuse answers to requests it did not send itself)."""

    answered: set[int] = attrs.field(factory=set)
    responses: int = 0
    codes: list[str] = attrs.field(factory=list)
    """The error code of every response and error frame, by name (NONE included)."""
    requests: int = 0
    """Requests the broker sent us (Pings and the like, to a fuzz connection that registered)."""
    replies: list[bytes] = attrs.field(factory=list)
    """Answers to those requests, not yet sent: a registered fuzz connection answers Ping,
    StopFetcher and StartFetcher as a consumer owning nothing would, so that its rebalances go
    on to StartFetcher."""
    closed: bool = False
    _buf: bytearray = attrs.field(factory=bytearray)

    def feed(self, data: bytes) -> None:
        if not data:
            self.closed = True
            return
        self._buf += data
        while len(self._buf) >= 4:
            (size,) = SIZE.unpack_from(self._buf)
            if len(self._buf) < 4 + size:
                return
            body = bytes(self._buf[4 : 4 + size])
            del self._buf[: 4 + size]
            self._frame(body)

    def _frame(self, body: bytes) -> None:
        kind, _api_key, _version, correlation_id = struct.unpack_from(">bhhi", body)
        if kind == FrameKind.REQUEST:
            self.requests += 1
            reply = _reply(body, _api_key, correlation_id)
            if reply is not None:
                self.replies.append(reply)
        elif kind == FrameKind.ERROR:
            self.codes.append(_code_name(struct.unpack_from(">h", body, 9)[0]))
        else:
            self.responses += 1
            self.answered.add(correlation_id)
            if len(body) >= 11:  # every response body starts with its error code (int16)
                self.codes.append(_code_name(struct.unpack_from(">h", body, 9)[0]))

    def done(self, script: Script) -> bool:
        """Whether the broker has said all it must about ``script``: it closed the connection
        (after a frame it refused, it must), or it answered every intact request and as many
        frames as were sent (a mutated frame may still be a valid request)."""
        return self.closed or (
            script.expected <= self.answered and self.responses >= len(script.frames)
        )


def _reply(body: bytes, api_key: int, correlation_id: int) -> bytes | None:
    try:
        key = ApiKey(api_key)
        version = HEADER.unpack_from(body, 0)[2]
        r = Reader(body, HEADER.size)
        STRING.decode(r)  # the client id
        request = REQUEST_CODECS[key, version].decode(r)
        response: Any = error_response(request, ErrorCode.NONE)
        if hasattr(response, "consumer_id"):
            response = attrs.evolve(response, consumer_id=request.consumer_id)
        frame = encode_frame(
            FrameKind.RESPONSE,
            key,
            correlation_id,
            RESPONSE_CODECS[key, version],
            response,
            api_version=version,
        )
    except (ValueError, KeyError, ProtocolError):
        return None
    return bytes(frame)


async def converse(
    stream: trio.abc.Stream, script: Script, *, answer_timeout: float, linger: float
) -> tuple[Answers, bool]:
    """Send ``script`` on ``stream``, answer the broker's requests, wait up to
    ``answer_timeout`` until the broker has said all it must (:meth:`Answers.done`), stay
    ``linger`` seconds more if it has, and close. Returns the answers and whether they were
    done in time."""
    answers = Answers()
    finished = trio.Event()
    written = trio.Event()
    send_reply, replies = trio.open_memory_channel[bytes](math.inf)

    async def read() -> None:
        while not answers.closed:
            try:
                answers.feed(bytes(await stream.receive_some(65536)))
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                answers.closed = True
            for frame in answers.replies:
                send_reply.send_nowait(frame)
            answers.replies.clear()
            if answers.done(script):
                finished.set()

    async def reply() -> None:
        await written.wait()  # only between whole frames: after the script's last write
        async for frame in replies:
            await stream.send_all(frame)

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            for chunk in script.writes:
                try:
                    await stream.send_all(chunk)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    break  # the broker closed the connection: that is an answer
            written.set()
            nursery.start_soon(_quietly, reply)
            with trio.move_on_after(answer_timeout):
                await finished.wait()
            if finished.is_set():
                await trio.sleep(linger)
            nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            await stream.aclose()
    return answers, finished.is_set()


async def _quietly(task: Callable[[], Awaitable[None]]) -> None:
    """A broken connection ends ``task``; the reader reports it."""
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        await task()


def _code_name(code: int) -> str:
    try:
        return ErrorCode(code).name
    except ValueError:
        return str(code)
