"""A small blocking client on ``protocol.Connection`` and a socket, for Spark's processes.

Spark runs the data source in the driver and in Python worker processes that are forked and
reused at Spark's pleasure, often with no event loop of their own; a plain socket per broker is
all they need (``examples/raw_client.py`` is the same idea). Nothing here is shared between
processes: each process opens its own connections, so the data source itself stays picklable.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import attrs

from consumer.leaders import LEADER_CODES
from pipeline import offsets as om
from pipeline.offsets import OptionError
from protocol import (
    NEED_DATA,
    NO_TOPIC_ID,
    ClusterMetadataRequest,
    ClusterMetadataResponse,
    Connection,
    ConnectionClosed,
    ErrorCode,
    FetchRequest,
    FetchResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    PartitionOffset,
    PeerError,
    ProduceRequest,
    ProduceResponse,
    RequestMessage,
    Response,
    ResponseMessage,
    Role,
    TopicId,
    TopicPartition,
)
from transport.connect import parse_bootstrap
from transport.security import ClientSecurity

#: Seconds a broker may take to accept a connection or answer one request.
REQUEST_TIMEOUT = 30.0
#: Above the broker's 2 MiB fetch cap, so that a whole fetch response always fits one frame.
MAX_FRAME_SIZE = 16 * 1024 * 1024
CLIENT_ID = "spark-pipeline"

Address = tuple[str, int]


#: The security options of the source and the sink, as documented.
SECURITY_OPTIONS = (
    "tls",
    "tls.ca",
    "tls.cert",
    "tls.key",
    "sasl.mechanism",
    "sasl.user",
    "sasl.password",
)


#: Spark's Kafka source's and sink's options (lowercased, as Spark hands keys over), and what
#: this source calls each: code written for ``format("kafka")`` gets the name to use instead.
KAFKA_OPTIONS = {
    "kafka.bootstrap.servers": "bootstrap",
    "subscribe": "topics (or topic)",
    "subscribepattern": "pattern",
    "assign": "topics (whole topics: no partition list)",
    "kafka.group.id": "group",
    "groupidprefix": "group",
    "maxoffsetspertrigger": "maxRecordsPerTrigger",
    "kafka.security.protocol": "tls and sasl.mechanism",
    "kafka.sasl.mechanism": "sasl.mechanism",
    "kafka.ssl.truststore.location": "tls.ca (a PEM file)",
    "kafka.ssl.keystore.location": "tls.cert and tls.key (PEM files)",
}


def check_options(options: Mapping[str, str], known: Sequence[str], what: str) -> None:
    """OptionError naming every unknown option and the known ones: a misspelt option
    (``groupId``, ``startingOffset``) must not be ignored, which would silently read from
    elsewhere; a Kafka source's (``kafka.bootstrap.servers``, ``subscribe``) is named with this
    source's name for it. Spark hands the keys over lowercased, so they are compared
    lowercased."""
    by_key = {name.lower(): name for name in (*known, *SECURITY_OPTIONS)}
    unknown = sorted(key for key in options if key.lower() not in by_key)
    if unknown:
        named = ", ".join(
            repr(key)
            + (
                f" (Kafka's; here: {KAFKA_OPTIONS[key.lower()]})"
                if key.lower() in KAFKA_OPTIONS
                else ""
            )
            for key in unknown
        )
        raise OptionError(
            f"unknown option{'s' if len(unknown) > 1 else ''} {named} "
            f"for {what}; the known options are {', '.join(sorted(by_key.values()))}"
        )


#: This package's own errors as Spark shows them: the last line of the Python traceback it
#: wraps in an AnalysisException or a StreamingQueryException.
_OWN_ERROR = re.compile(
    r"^pipeline\.(?:offsets\.OptionError|wire\.PipelineError|offsets\.TopicRecreated): (.+?)"
    r"(?: SQLSTATE: \w+)*$",
    re.MULTILINE,
)


def error_line(exc: BaseException) -> str | None:
    """The one line saying what is wrong, when ``exc`` is Spark's exception around an error of
    the source or the sink (None otherwise): Spark shows it inside its own error class and the
    Python worker's traceback, several frames deep."""
    found = _OWN_ERROR.findall(str(exc))
    return found[-1] if found else None


def client_security(options: Mapping[str, str]) -> ClientSecurity:
    """The source's and sink's security options (keys lowercased, as Spark hands them over):
    ``tls`` (true/false), ``tls.ca``, ``tls.cert``, ``tls.key``, ``sasl.mechanism``,
    ``sasl.user``, ``sasl.password``; none: plaintext, no authentication."""
    options = {key.lower(): value for key, value in options.items()}

    def path(key: str) -> Path | None:
        return Path(options[key]) if options.get(key) else None

    return ClientSecurity(
        tls=options.get("tls", "false").lower() == "true",
        ca=path("tls.ca"),
        cert=path("tls.cert"),
        key=path("tls.key"),
        sasl_mechanism=options.get("sasl.mechanism") or None,
        username=options.get("sasl.user") or None,
        password=options.get("sasl.password"),
    )


class PipelineError(Exception):
    """The cluster refused an operation (``error_code``) or could not be reached (no code)."""

    def __init__(self, what: str, error_code: ErrorCode | None = None) -> None:
        super().__init__(what if error_code is None else f"{what}: {error_code.name}")
        self.error_code = error_code


class BrokerConnection:
    """One blocking connection: ``call(request)`` sends it and returns its response."""

    def __init__(self, address: Address, security: ClientSecurity | None = None) -> None:
        self.address = address
        self._sock = (security or ClientSecurity()).connect_blocking(address, REQUEST_TIMEOUT)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._conn = Connection(Role.CONSUMER, client_id=CLIENT_ID, max_frame_size=MAX_FRAME_SIZE)

    def call(self, message: RequestMessage) -> ResponseMessage:
        request = self._conn.new_request(message)
        self._sock.sendall(self._conn.send(request))
        while True:
            event = self._conn.next_event()
            if event is NEED_DATA:
                self._conn.receive_data(self._sock.recv(1 << 20))
            elif isinstance(event, Response) and event.correlation_id == request.correlation_id:
                return event.message
            elif isinstance(event, ConnectionClosed | PeerError):
                raise PipelineError(f"broker {self.address} closed the connection: {event}")
            # anything else (the coordinator's own requests) is not for a plain client

    def close(self) -> None:
        self._sock.close()


@attrs.frozen(kw_only=True)
class Placement:
    """Where one partition lives, and of which incarnation of its topic."""

    topic: str
    partition: int
    host: str
    port: int
    #: The topic's id (docs/design.md#topic-ids); NO_TOPIC_ID (any) from a broker without ids.
    topic_id: TopicId = NO_TOPIC_ID


class Cluster:
    """The brokers of one bootstrap list, with a connection per broker opened on first use."""

    def __init__(self, bootstrap: str, security: ClientSecurity | None = None) -> None:
        self.bootstrap = parse_bootstrap(bootstrap)
        self.security = security
        self._connections: dict[Address, BrokerConnection] = {}
        #: Where a planned placement's leader was found since (:meth:`at_leader`).
        self._moved: dict[Placement, Placement] = {}

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        for connection in self._connections.values():
            connection.close()
        self._connections.clear()

    def connection(self, address: Address) -> BrokerConnection:
        connection = self._connections.get(address)
        if connection is None:
            connection = self._connections[address] = BrokerConnection(address, self.security)
        return connection

    def call(self, address: Address, message: RequestMessage) -> ResponseMessage:
        """One request; a broken connection is reopened once before giving up. PipelineError
        when the broker cannot be reached."""
        try:
            try:
                return self.connection(address).call(message)
            except (OSError, PipelineError):
                broken = self._connections.pop(address, None)
                if broken is None:
                    raise  # it never connected: nothing to reopen
                broken.close()
                return self.connection(address).call(message)
        except OSError as exc:
            self._connections.pop(address, None)
            raise PipelineError(f"cannot reach broker {address[0]}:{address[1]}: {exc}") from exc

    def call_any(self, message: RequestMessage) -> ResponseMessage:
        errors = []
        for address in self.bootstrap:
            try:
                return self.call(address, message)
            except PipelineError as exc:
                self._connections.pop(address, None)
                errors.append(str(exc))
        raise PipelineError("cannot reach any broker of the bootstrap list: " + "; ".join(errors))

    # --- metadata ---------------------------------------------------------------------------------

    def metadata(
        self, topics: Sequence[str] | None = None, group: str | None = None
    ) -> ClusterMetadataResponse:
        response = self.call_any(
            ClusterMetadataRequest(group_id=group, topics=None if topics is None else tuple(topics))
        )
        assert isinstance(response, ClusterMetadataResponse)
        return response

    def placements(self, topics: Sequence[str] | None = None) -> dict[TopicPartition, Placement]:
        """Every partition of ``topics`` (all when None) with the broker that holds it and its
        topic's id; topics that do not exist are left out."""
        metadata = self.metadata(topics)
        brokers = {b.broker_id: b for b in metadata.brokers}
        ids = {i.topic: i.topic_id for i in metadata.topic_ids}
        found = {}
        for topic in metadata.topics:
            if topic.error_code is not ErrorCode.NONE:
                continue
            for p in topic.partitions:
                broker = brokers.get(p.broker_id)
                if broker is not None:
                    tp = TopicPartition(topic=topic.topic, partition=p.partition)
                    found[tp] = Placement(
                        topic=topic.topic,
                        partition=p.partition,
                        host=broker.host,
                        port=broker.port,
                        topic_id=ids.get(topic.topic, NO_TOPIC_ID),
                    )
        return found

    def leader_of(self, placement: Placement) -> Placement | None:
        """``placement`` at the broker that leads its partition now, as the bootstrap brokers'
        metadata says (its topic id kept: the incarnation planned); None if none leads it."""
        tp = TopicPartition(topic=placement.topic, partition=placement.partition)
        now = self.placements([placement.topic]).get(tp)
        return None if now is None else attrs.evolve(placement, host=now.host, port=now.port)

    def at_leader(self, placement: Placement, message: RequestMessage) -> ResponseMessage:
        """``message`` to ``placement``'s broker, a first guess: if that broker no longer leads
        the partition (:data:`~consumer.leaders.LEADER_CODES`) or cannot be reached, once more
        to the leader the metadata names now, where this cluster's next requests for it go."""
        at = self._moved.get(placement, placement)
        try:
            response = self.call((at.host, at.port), message)
        except PipelineError:
            moved = self.leader_of(placement)
            if moved is None or moved == at:
                raise
        else:
            if getattr(response, "error_code", ErrorCode.NONE) not in LEADER_CODES:
                return response
            moved = self.leader_of(placement)
            if moved is None or moved == at:
                return response
        self._moved[placement] = moved
        return self.call((moved.host, moved.port), message)

    def log_bounds(self, placements: Iterable[Placement]) -> dict[TopicPartition, tuple[int, int]]:
        """(log start, end) of each partition, asked of the broker that leads it."""
        bounds = {}
        for p in placements:
            response = self.at_leader(p, ListOffsetsRequest(topic=p.topic, partition=p.partition))
            assert isinstance(response, ListOffsetsResponse)
            if response.error_code is not ErrorCode.NONE:
                raise PipelineError(f"offsets of {p.topic}-{p.partition}", response.error_code)
            tp = TopicPartition(topic=p.topic, partition=p.partition)
            bounds[tp] = (response.log_start_offset, response.high_watermark)
        return bounds

    # --- data -------------------------------------------------------------------------------------

    def fetch(self, placement: Placement, offset: int, max_bytes: int) -> FetchResponse:
        """Records of ``placement``'s incarnation only: a broker whose topic of that name has
        another id answers UNKNOWN_TOPIC_ID."""
        response = self.at_leader(
            placement,
            FetchRequest(
                topic=placement.topic,
                partition=placement.partition,
                offset=offset,
                max_bytes=max_bytes,
                topic_id=placement.topic_id,
            ),
        )
        assert isinstance(response, FetchResponse)
        return response

    def produce(self, placement: Placement, batches: bytes) -> int:
        """Append record ``batches`` (acknowledged under the broker's fsync policy) to the
        placement's incarnation of the topic: the base offset. UNKNOWN_TOPIC_ID (PipelineError):
        that incarnation is gone."""
        response = self.at_leader(
            placement,
            ProduceRequest(
                topic=placement.topic,
                partition=placement.partition,
                records=(),
                batches=batches,
                topic_id=placement.topic_id,
            ),
        )
        assert isinstance(response, ProduceResponse)
        if response.error_code is not ErrorCode.NONE:
            raise PipelineError(
                f"produce to {placement.topic}-{placement.partition}", response.error_code
            )
        return response.base_offset

    # --- group offsets ----------------------------------------------------------------------------

    def _coordinator(self, group: str, ids: Mapping[str, TopicId] | None = None) -> Address:
        """The group's coordinator; with ``ids``, TopicRecreated if one of those topics has
        another id now (asked in the same request)."""
        metadata = self.metadata(topics=sorted(ids or ()), group=group)
        if ids:
            om.carry_ids(ids, {i.topic: i.topic_id for i in metadata.topic_ids})
        for broker in metadata.brokers:
            if broker.broker_id == metadata.coordinator_id:
                return (broker.host, broker.port)
        raise PipelineError(
            f"no coordinator for group {group}", ErrorCode.COORDINATOR_NOT_AVAILABLE
        )

    def committed_offsets(self, group: str) -> dict[TopicPartition, int]:
        """The group's committed offsets (the next offset to read); partitions without one are
        left out."""
        response = self.call(
            self._coordinator(group), OffsetFetchRequest(group_id=group, partitions=None)
        )
        assert isinstance(response, OffsetFetchResponse)
        if response.error_code is not ErrorCode.NONE:
            raise PipelineError(f"offsets of group {group}", response.error_code)
        return {po.topic_partition: po.offset for po in response.offsets if po.offset >= 0}

    def commit_offsets(
        self,
        group: str,
        offsets: dict[TopicPartition, int],
        ids: Mapping[str, TopicId] | None = None,
    ) -> None:
        """The standalone commit (generation -1, no member): accepted only while the group has no
        live members, so a Spark job and a consumer group cannot both move one group's offsets.
        ``ids``: the topic ids the offsets were read under, checked first (TopicRecreated)."""
        request = OffsetCommitRequest(
            group_id=group,
            consumer_id=None,
            generation=-1,
            offsets=tuple(
                PartitionOffset(topic=tp.topic, partition=tp.partition, offset=offset)
                for tp, offset in sorted(offsets.items())
            ),
        )
        response = self.call(self._coordinator(group, ids), request)
        assert isinstance(response, OffsetCommitResponse)
        if response.error_code is not ErrorCode.NONE:
            raise PipelineError(f"commit offsets of group {group}", response.error_code)
