"""Error codes, the two protocol exceptions, and the one family of illegal inputs.

Codes below 1000 are Kafka's numbers, reused only where Kafka means the same thing, so that anyone
who knows Kafka reads them correctly; ours start above 1000 so the two ranges never collide. The
exceptions follow h11: :class:`LocalProtocolError` means *we* were about to break the protocol (a
bug on our side, nothing was sent), :class:`RemoteProtocolError` means the *peer* broke it (the
connection is finished: tell the peer why with an error frame and close it).

:class:`IllegalInput` is what every sans-IO layer raises for an input it does not take in its
state, having changed nothing: the protocol connection (:class:`LocalProtocolError`), the SASL
exchange (``protocol.sasl.IllegalSaslState``) and the state machines
(``statemachine.table.IllegalTransition``, or the base itself where no table decides), so a
caller catches one type for "the caller broke a rule", whichever layer it used.
"""

from __future__ import annotations

import enum


class ErrorCode(enum.IntEnum):
    NONE = 0
    UNKNOWN_SERVER_ERROR = -1
    OFFSET_OUT_OF_RANGE = 1
    CORRUPT_MESSAGE = 2
    """A record's CRC does not match its contents."""
    UNKNOWN_TOPIC_OR_PARTITION = 3
    LEADER_NOT_AVAILABLE = 5
    """The partition has no leader now (an election under way, or every replica offline):
    refresh metadata and retry."""
    NOT_LEADER_OR_FOLLOWER = 6
    """This broker does not lead the partition (nor, for REPLICA_FETCH, follow it as asked):
    refresh metadata, or take the answer's leader hint, and go to the leader."""
    REQUEST_TIMED_OUT = 7
    """A frame begun was not finished within the receiver's frame timeout; in a Produce
    version 3 answer, an acks=all write not confirmed by the in-sync replicas in time (the
    records may be stored)."""
    MESSAGE_TOO_LARGE = 10
    COORDINATOR_LOAD_IN_PROGRESS = 14
    """The seeds' CoordinatorStartupNotComplete."""
    COORDINATOR_NOT_AVAILABLE = 15
    NOT_COORDINATOR = 16
    INVALID_TOPIC_EXCEPTION = 17
    ILLEGAL_GENERATION = 22
    NOT_ENOUGH_REPLICAS = 19
    """An acks=all Produce while fewer replicas are in sync than the topic's
    ``min.insync.replicas``: nothing was written; retriable."""
    NOT_ENOUGH_REPLICAS_AFTER_APPEND = 20
    """Written on the leader, but the in-sync replicas fell below the minimum before they all
    had it: not acknowledged, and a retry may store the records twice; retriable."""
    INVALID_REQUIRED_ACKS = 21
    """A Produce's ``acks`` is neither 1 nor -1 (all)."""
    INVALID_GROUP_ID = 24
    """Empty, longer than the broker's ``max_id_bytes``, or holding a control character."""
    UNKNOWN_MEMBER_ID = 25
    INVALID_SESSION_TIMEOUT = 26
    REBALANCE_IN_PROGRESS = 27
    TOPIC_AUTHORIZATION_FAILED = 29
    GROUP_AUTHORIZATION_FAILED = 30
    CLUSTER_AUTHORIZATION_FAILED = 31
    UNSUPPORTED_SASL_MECHANISM = 33
    ILLEGAL_SASL_STATE = 34
    UNSUPPORTED_VERSION = 35
    TOPIC_ALREADY_EXISTS = 36
    INVALID_PARTITIONS = 37
    INVALID_REPLICATION_FACTOR = 38
    """A CreateTopic's ``replication_factor`` below 1 (other than -1, the broker's default),
    or above what the cluster can place (more replicas than live brokers)."""
    INVALID_REPLICA_ASSIGNMENT = 39
    """CreateTopic or CreatePartitions named a broker that is not live, or one twice."""
    INVALID_CONFIG = 40
    """A CreateTopic's setting with an unknown name, a value out of bounds, or named twice
    (protocol/topic_configs.py)."""
    INVALID_REQUEST = 42
    POLICY_VIOLATION = 44
    """A CreateTopic or CreatePartitions would place more partitions on the broker than its
    ``max_partitions_per_broker``."""
    SASL_AUTHENTICATION_FAILED = 58
    """Wrong credentials, an unknown user, or a broken exchange; the broker closes the
    connection after answering."""
    NON_EMPTY_GROUP = 68
    GROUP_ID_NOT_FOUND = 69
    GROUP_MAX_SIZE_REACHED = 81
    FENCED_INSTANCE_ID = 82
    """A newer process registered under this member's instance id (static membership)."""
    RESOURCE_NOT_FOUND = 91
    """AlterUserScramCredentials would delete a user that has no credential."""
    UNACCEPTABLE_CREDENTIAL = 93
    """A credential upserted with an unknown mechanism, iterations outside the broker's bounds,
    or a salt or keys of the wrong size."""
    FENCED_LEADER_EPOCH = 74
    """The request's leader epoch is older than the partition's (KIP-320): the sender's view is
    stale; refresh metadata."""
    UNKNOWN_LEADER_EPOCH = 75
    """The request's leader epoch is newer than this broker knows: it has not learned of the
    election yet; retry."""
    UNKNOWN_TOPIC_ID = 100
    """A request named a topic id the topic of that name no longer has: the topic was deleted,
    and perhaps created again, since the client learned the id (docs/design.md#topic-ids)."""
    INVALID_REGULAR_EXPRESSION = 128
    """A subscription pattern RE2 cannot compile, or longer than ``max_pattern_bytes``."""

    FRAME_TOO_LARGE = 1001
    MALFORMED_FRAME = 1002
    UNKNOWN_API_KEY = 1003
    DUPLICATE_MEMBER_ID = 1004
    """The consumer id is already registered in the group."""
    STALE_COORDINATOR_EPOCH = 1005
    UNEXPECTED_RESPONSE = 1006
    """A response matching no outstanding request, or a request this side may not receive."""
    INVALID_OFFSET_RESET = 1007
    RESPONSE_TOO_LARGE = 1008
    """The answer to the request would not fit one frame: ask for less (fewer topics, a group
    with fewer members)."""
    BROKER_BUSY = 1009
    """The broker's own loop is behind, so it takes no new client, registration or admin
    request now: ask again after the answer's ``throttle_time_ms``, with jitter (SPEC.md §11.7).
    Only answers of versions that carry ``throttle_time_ms`` use it; older ones get
    COORDINATOR_NOT_AVAILABLE, which every level retries with backoff."""

    @classmethod
    def from_wire(cls, value: int) -> ErrorCode:
        """Read a code from a peer that may be newer than us.

        Like Kafka's clients, an unknown number becomes UNKNOWN_SERVER_ERROR instead of breaking
        the connection: a code added later must not turn an ordinary error reply into a protocol
        failure.
        """
        return _BY_VALUE.get(value, ErrorCode.UNKNOWN_SERVER_ERROR)


_BY_VALUE: dict[int, ErrorCode] = {code.value: code for code in ErrorCode}

#: The codes after which the same request may succeed if sent again (Kafka's
#: ``RetriableException``s, and BROKER_BUSY): the condition passes (a failover, an election, a
#: busy loop) or a metadata refresh finds where to send it (:data:`STALE_METADATA`).
RETRIABLE: frozenset[ErrorCode] = frozenset(
    {
        ErrorCode.CORRUPT_MESSAGE,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.LEADER_NOT_AVAILABLE,
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        ErrorCode.REQUEST_TIMED_OUT,
        ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
        ErrorCode.COORDINATOR_NOT_AVAILABLE,
        ErrorCode.NOT_COORDINATOR,
        ErrorCode.NOT_ENOUGH_REPLICAS,
        ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        ErrorCode.FENCED_LEADER_EPOCH,
        ErrorCode.UNKNOWN_LEADER_EPOCH,
        ErrorCode.UNKNOWN_TOPIC_ID,
        ErrorCode.BROKER_BUSY,
    }
)
#: Of those, the codes that mean the client's view of the partitions is stale (Kafka's
#: ``InvalidMetadataException``s): refresh metadata before sending again.
STALE_METADATA: frozenset[ErrorCode] = frozenset(
    {
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.LEADER_NOT_AVAILABLE,
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        ErrorCode.FENCED_LEADER_EPOCH,
        ErrorCode.UNKNOWN_TOPIC_ID,
    }
)


class IllegalInput(Exception):
    """An input a sans-IO layer does not take in its state (a bug of the caller's): it raised
    before changing anything."""


class ProtocolError(Exception):
    """Base of the two protocol exceptions; never raised itself (which side is at fault matters).

    ``correlation_id`` and ``api_key`` are set once the offending frame's header had been parsed, so
    the error frame sent back can point at the request that caused it.
    """

    def __init__(
        self,
        msg: str,
        error_code: ErrorCode,
        *,
        correlation_id: int | None = None,
        api_key: int | None = None,
    ) -> None:
        if type(self) is ProtocolError:
            raise TypeError("raise LocalProtocolError or RemoteProtocolError, not ProtocolError")
        super().__init__(msg)
        self.error_code = error_code
        self.correlation_id = correlation_id
        self.api_key = api_key


class LocalProtocolError(ProtocolError, IllegalInput):
    """We tried to send something the protocol forbids; nothing was sent and no state changed."""


class RemoteProtocolError(ProtocolError):
    """The peer sent something the protocol forbids; the connection is unusable from now on."""
