"""One broker process: its metadata store, its coordinator, its log, and its TCP listeners.

The pieces are opened in dependency order and closed in reverse by one ``AsyncExitStack``, so a
SIGTERM (a cancellation) stops accepting, closes every connection, flushes the offsets and closes
the store, in that order.
"""

from __future__ import annotations

import logging
import resource
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from functools import partial
from pathlib import Path

import attrs
import trio

from broker.authorization import open_access
from broker.data_plane import BrokerLog, log_directory, open_broker_log
from broker.dispatch import handle_connection
from broker.door import AcceptPace, Door
from broker.election import open_elector
from broker.leader_offsets import Connect
from broker.log import CorruptSegment, LogConfig, OffsetOutOfRange, check_log_format, log_dir_id
from broker.metrics import (
    BrokerMetrics,
    LogSize,
    MetricsConfig,
    Snapshot,
    TimedStore,
    first_timestamp,
    probe_store,
    take_snapshot,
)
from broker.offices import BySlot, whole_office
from broker.replica_fetcher import fetch_from
from broker.replica_serve import answer_replica_fetch
from broker.replicas import ReplicaManager, Requester
from broker.status import serve_status
from broker.viewer import RecordViewer
from coordinator.config import CoordinatorConfig
from coordinator.cpu_budget import CpuBudget, watch_cpu
from coordinator.group_coordinator import open_group_coordinator
from coordinator.loop_lag import LoopLag, watch_loop
from coordinator.observer import NULL_OBSERVER, CoordinatorObserver
from coordinator.validation import LogEnd
from protocol import RemoteProtocolError
from protocol.sasl import ANONYMOUS, MECHANISMS
from protocol.types import BrokerInfo, TopicPartition
from store import EmbeddedStore, MetadataStore, SecurityStore, TopicStore, open_embedded_store
from store.zookeeper import DigestAuth, ZooKeeperStore, open_zookeeper_store
from transport.channel import ReadBounds
from transport.connect import CONNECT_DEADLINE, open_channel
from transport.limits import ConnectionLimits, FileBudget
from transport.listener import ConnectionGate, SecuredListener, serve_listeners
from transport.scram import password_matches
from transport.security import (
    ClientSecurity,
    Endpoint,
    ListenerSecurity,
    Peer,
    SecurityProtocol,
    ServerTls,
    as_its_peers_see_it,
)

log = logging.getLogger(__name__)


@attrs.frozen(kw_only=True)
class NodeSettings:
    broker_id: int = 1
    host: str = "127.0.0.1"
    port: int = 9092
    #: The address other brokers and clients use to reach this one (defaults to host).
    advertised_host: str | None = None
    data_dir: Path = Path("data")
    coordinator: CoordinatorConfig = attrs.field(factory=CoordinatorConfig)
    connections: ConnectionLimits = attrs.field(factory=ConnectionLimits)
    log: LogConfig = attrs.field(factory=LogConfig)
    #: ``host:port[,host:port...][/chroot]`` of a ZooKeeper ensemble shared by the brokers of a
    #: cluster, which then elect one coordinator among them; None: the embedded store, and this
    #: broker is the coordinator.
    zookeeper: str | None = None
    #: How long ZooKeeper keeps this broker's registration and office after losing touch with it.
    #: A successor takes office that long (plus up to a ZooKeeper tick) after the coordinator
    #: died, which must fit in a third of the consumers' session timeout for their leases to
    #: outlast the failover (docs/design.md#defaults-that-fit-a-failover).
    zookeeper_session_timeout: float = 8.0
    #: ZooKeeper digest authentication: the project's znodes are then this user's alone.
    zookeeper_auth: DigestAuth | None = None
    #: ``NAME://HOST:PORT`` listeners (transport/security.py); none: one PLAINTEXT listener on
    #: ``host:port``. The first one's port is the one ``run_node`` reports.
    listeners: tuple[Endpoint, ...] = ()
    #: The address each listener is advertised under in ClusterMetadata, by name (Kafka's
    #: ``advertised.listeners``); a listener not named is advertised under ``advertised_host``
    #: (or its own host) and its bound port.
    advertised_listeners: tuple[Endpoint, ...] = ()
    #: The certificate of the TLS listeners (SSL, SASL_SSL), and the CA for mutual TLS.
    tls: ServerTls | None = None
    #: The CA this broker trusts for its peers' certificates when it connects to their TLS
    #: inter-broker listener; None: the CA of mutual TLS (``tls.client_ca``), else the system's.
    tls_ca: Path | None = None
    #: The SCRAM mechanisms the SASL listeners offer.
    sasl_mechanisms: tuple[str, ...] = MECHANISMS
    #: A client certificate's principal is ``User:<CN>`` rather than ``User:<subject>``.
    tls_principal_is_cn: bool = False
    #: Principals every access rule lets do everything (``User:admin``); the brokers' own
    #: principals among them, as only a super user may fetch as a replica (docs/security.md).
    super_users: frozenset[str] = frozenset()
    #: The name of the listener brokers reach each other on (Kafka's
    #: ``inter.broker.listener.name``); None: the first listener's.
    inter_broker_listener: str | None = None
    #: How this broker authenticates itself to its peers' SASL listeners: a SCRAM user of the
    #: cluster, its password and the mechanism (None: the first of ``sasl_mechanisms``).
    inter_broker_user: str | None = None
    inter_broker_password: str | None = attrs.field(default=None, repr=False)
    inter_broker_sasl_mechanism: str | None = None
    #: The Prometheus endpoint and status page (broker/metrics.py, broker/status.py).
    metrics: MetricsConfig = attrs.field(factory=MetricsConfig)
    #: The loop lag in seconds above which the broker sheds new work at the door
    #: (docs/design.md#shedding-load); None: it never does, the default until shedding is shown
    #: not to slow a coordinator failover on a loaded machine.
    shed_above_lag: float | None = None

    def endpoints(self) -> tuple[Endpoint, ...]:
        return self.listeners or (
            Endpoint(listener=SecurityProtocol.PLAINTEXT.value, host=self.host, port=self.port),
        )

    def authenticates(self, endpoint: Endpoint) -> bool:
        """Whether the listener knows who its clients are (SASL, or TLS with client
        certificates)."""
        protocol = endpoint.protocol
        return protocol.sasl or (
            protocol.tls and self.tls is not None and self.tls.client_ca is not None
        )

    def inter_broker_endpoint(self) -> Endpoint:
        """This broker's listener of the name its peers reach it on."""
        endpoints = self.endpoints()
        if self.inter_broker_listener is None:
            return endpoints[0]
        for endpoint in endpoints:
            if endpoint.listener == self.inter_broker_listener:
                return endpoint
        names = ", ".join(endpoint.listener for endpoint in endpoints)
        raise ValueError(
            f"--inter-broker-listener {self.inter_broker_listener} is none of this broker's "
            f"listeners ({names})"
        )

    def peer_security(self) -> ClientSecurity:
        """How this broker connects to its peers' inter-broker listener: TLS trusting
        ``tls_ca`` (else the CA of the cluster's client certificates, else the system's CAs)
        and presenting its own certificate, and SASL as its own user. ValueError when the
        listener asks for what this broker was not given."""
        protocol = self.inter_broker_endpoint().protocol
        tls = self.tls if protocol.tls else None
        if protocol.tls and tls is None:
            raise ValueError(f"the inter-broker listener {protocol.value} needs --tls-cert")
        if not protocol.sasl:
            if self.inter_broker_user is not None:
                raise ValueError(
                    f"--inter-broker-user: the inter-broker listener {protocol.value} does "
                    "not use SASL"
                )
            user = password = mechanism = None
        else:
            if self.inter_broker_user is None or self.inter_broker_password is None:
                raise ValueError(
                    f"the inter-broker listener {protocol.value} authenticates with SASL: "
                    "replication needs --inter-broker-user and its password "
                    "(--inter-broker-password-file or $COORDINATOR_INTER_BROKER_PASSWORD)"
                )
            user, password = self.inter_broker_user, self.inter_broker_password
            mechanism = self.inter_broker_sasl_mechanism or self.sasl_mechanisms[0]
            if mechanism not in self.sasl_mechanisms:
                raise ValueError(
                    f"--inter-broker-sasl-mechanism {mechanism} is not among the mechanisms "
                    f"the SASL listeners offer ({', '.join(self.sasl_mechanisms)})"
                )
        return ClientSecurity(
            tls=tls is not None,
            ca=None if tls is None else self.tls_ca or tls.client_ca,
            cert=None if tls is None else tls.cert,
            key=None if tls is None else tls.key,
            sasl_mechanism=mechanism,
            username=user,
            password=password,
        )

    def peer_principal(self) -> str:
        """Who this broker is to its peers on the inter-broker listener, as they authenticate
        it: its SASL user, else its certificate's subject where they require client
        certificates, else nobody (User:ANONYMOUS). Over TLS, found by the broker's handshake
        with itself: ssl.SSLError where a peer would refuse it (its certificate not from the
        CA they trust, or not naming the address it advertises on that listener)."""
        endpoint = self.inter_broker_endpoint()
        found = None
        if endpoint.protocol.tls:
            assert self.tls is not None
            found = as_its_peers_see_it(
                self.tls,
                self.peer_security(),
                self.advertised(endpoint, endpoint.port)[0],
                common_name=self.tls_principal_is_cn,
            )
        if endpoint.protocol.sasl and self.inter_broker_user is not None:
            return f"User:{self.inter_broker_user}"
        return found or ANONYMOUS

    def advertised(self, endpoint: Endpoint, port: int) -> tuple[str, int]:
        """The address a listener bound at ``port`` is advertised under (ClusterMetadata, and
        the broker's registration)."""
        for public in self.advertised_listeners:
            if public.listener == endpoint.listener:
                return public.host, public.port
        return self.advertised_host or endpoint.host, port

    @property
    def authorization(self) -> bool:
        """Access rules are enforced once any listener authenticates its clients: then whatever
        no rule allows is denied, on every listener (an unauthenticated client is
        User:ANONYMOUS)."""
        return any(self.authenticates(endpoint) for endpoint in self.endpoints())


async def run_node(
    settings: NodeSettings, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED
) -> None:
    """Serve until cancelled; ``task_status.started`` gets the first listener's bound port
    (useful with port 0)."""
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    # A log this broker cannot read refuses the start before anything listens or says so.
    await trio.to_thread.run_sync(check_log_format, log_directory(settings.data_dir))
    # Its identity: the replicas in it are in sync only while it is the one registered.
    log_dir = await trio.to_thread.run_sync(log_dir_id, log_directory(settings.data_dir))
    tls = None if settings.tls is None else settings.tls.context()
    # A broker its peers cannot reach or would refuse says so now, not at its first fetch.
    to_peers = await trio.to_thread.run_sync(_peer_security, settings)
    async with _open_store(settings) as store:
        if to_peers is not None:
            await _check_peer_credential(settings, to_peers, store)
        peers = _Peers(
            store=store,
            listener=settings.inter_broker_endpoint().listener,
            connect=(to_peers or ClientSecurity()).connector(),
        )
        listeners: list[SecuredListener] = []
        advertised: dict[str, tuple[str, int]] = {}
        for endpoint in settings.endpoints():
            opened = await trio.open_tcp_listeners(endpoint.port, host=endpoint.host)
            port = opened[0].socket.getsockname()[1]
            advertised[endpoint.listener] = settings.advertised(endpoint, port)
            security = _listener_security(settings, endpoint, tls, store)
            listeners.extend(SecuredListener(listener=one, security=security) for one in opened)
            log.info(
                "listening on %s (%s)",
                Endpoint(listener=endpoint.listener, host=endpoint.host, port=port),
                _describe(settings, endpoint),
            )
        first = settings.endpoints()[0].listener
        broker = BrokerInfo(
            broker_id=settings.broker_id, host=advertised[first][0], port=advertised[first][1]
        )
        await store.register_broker(broker, advertised, log_dir=log_dir)
        metrics = None if settings.metrics.port is None else BrokerMetrics(config=settings.metrics)
        budget = _file_budget(settings.connections)

        # The coordinators see the store through the metrics' timing, the election the store.
        def timed(store: MetadataStore) -> MetadataStore:
            if metrics is None:
                return store
            return TimedStore(inner=store, metrics=metrics)

        async with (
            open_access(
                store, enabled=settings.authorization, super_users=settings.super_users
            ) as access,
            open_broker_log(
                store,
                broker.broker_id,
                settings.data_dir,
                settings.log,
                observer=metrics,
                budget=budget,
            ) as data_plane,
            _open_coordination(
                store,
                timed,
                settings.coordinator,
                broker,
                data_plane.log_end_offset,
                NULL_OBSERVER if metrics is None else metrics,
                peers.connect_first,
            ) as (serve_connection, current),
            trio.open_nursery() as nursery,
        ):
            replicas = ReplicaManager(
                broker_id=broker.broker_id,
                log_dir=log_dir,
                store=store,
                logs=data_plane,
                connect=partial(_replica_channel, peers),
                fetch_from=fetch_from,
                serve=answer_replica_fetch,
            )
            data_plane.replication = replicas
            await nursery.start(replicas.run)
            bounds = ReadBounds.of(settings.connections)
            door = (
                None
                if settings.shed_above_lag is None
                else Door(
                    lag=LoopLag.of_run(),
                    bound=settings.shed_above_lag,
                    on_shed=None if metrics is None else metrics.request_shed,
                    budget=CpuBudget.of_run(),
                )
            )
            if door is not None and door.budget is not None:
                await nursery.start(watch_cpu, door.budget)
            serve = partial(
                serve_connection,
                data_plane=data_plane,
                bounds=bounds,
                access=access,
                door=door,
            )

            async def handler(stream: trio.abc.Stream, peer: Peer) -> None:
                if metrics is None:
                    await serve(stream, peer=peer)
                    return
                metrics.connections.inc()
                try:
                    await serve(stream, peer=peer)
                finally:
                    metrics.connections.dec()

            # The heartbeat and the door read the loop's lag
            # (docs/design.md#a-broker-that-falls-behind, #shedding-load).
            if metrics is None:
                await nursery.start(watch_loop)
            else:
                await nursery.start(watch_loop, metrics.loop_lagged)

                async def snapshot() -> Snapshot:
                    return await _snapshot(metrics, broker, current(), store, data_plane)

                viewer = RecordViewer(
                    access=access,
                    credential=store.scram_credential,
                    partitions=lambda: data_plane.partitions,
                )
                await nursery.start(serve_status, metrics, snapshot, viewer)
                await nursery.start(probe_store, store, metrics)
            gate = ConnectionGate.of(settings.connections, budget)
            pace = None if door is None else AcceptPace(door=door)
            await nursery.start(partial(serve_listeners, handler, listeners, gate, pace=pace))
            log.info("broker %d serving, data in %s", broker.broker_id, settings.data_dir)
            task_status.started(listeners[0].listener.socket.getsockname()[1])


@attrs.frozen(kw_only=True)
class _Peers:
    """How this broker reaches the others: at the address each advertises on the inter-broker
    listener (Kafka's ``inter.broker.listener.name``), secured as that listener asks."""

    store: TopicStore
    listener: str
    connect: Connect

    async def address(self, broker_id: int) -> tuple[str, int]:
        found = {b.broker_id: b for b in await self.store.brokers(self.listener)}
        peer = found.get(broker_id)
        if peer is None:
            raise ConnectionError(f"broker {broker_id} has no {self.listener} listener registered")
        return peer.host, peer.port

    async def connect_first(self, host: str, port: int) -> trio.abc.Stream:
        """A connection to the broker whose first listener is at ``host:port`` (the address its
        registration holds, and the elector's view of the live brokers), made to its
        inter-broker listener."""
        firsts = {(b.host, b.port): b.broker_id for b in await self.store.brokers()}
        broker_id = firsts.get((host, port))
        if broker_id is None:
            raise ConnectionError(f"no live broker's first listener is at {host}:{port}")
        return await self.connect(*await self.address(broker_id))


@asynccontextmanager
async def _replica_channel(peers: _Peers, broker_id: int) -> AsyncIterator[Requester]:
    """A follower's channel to its leader (DESIGN37 §2.4), on the inter-broker listener."""
    host, port = await peers.address(broker_id)
    stream: trio.abc.Stream | None = None
    with trio.move_on_after(CONNECT_DEADLINE):
        stream = await peers.connect(host, port)
    if stream is None:
        raise ConnectionError(f"broker {broker_id}: no answer in {CONNECT_DEADLINE:g} s")
    async with open_channel(stream, client_id=f"replica-{broker_id}") as channel:
        yield channel


def _peer_security(settings: NodeSettings) -> ClientSecurity | None:
    """How this broker connects to its peers (None: it has none, on the embedded store), once
    checked that they would admit it: over TLS, that they accept its certificate; with access
    rules on, that it is a super user, as only one may fetch as a replica
    (broker/authorization.py)."""
    endpoint = settings.inter_broker_endpoint()
    if settings.zookeeper is None:
        return None
    security = settings.peer_security()
    try:
        principal = settings.peer_principal()
    except ssl.SSLError as exc:
        raise ValueError(
            f"its peers would refuse this broker's certificate on the inter-broker listener "
            f"{endpoint.listener}: {getattr(exc, 'verify_message', None) or exc.reason or exc} "
            "(docs/security.md)"
        ) from None
    if settings.authorization and principal not in settings.super_users:
        raise ValueError(
            f"access rules are on, and this broker is {principal} to its peers on the "
            f"inter-broker listener {endpoint.listener}: they would refuse its replica "
            "fetches; name it in --super-users (docs/security.md)"
        )
    return security


async def _check_peer_credential(
    settings: NodeSettings, security: ClientSecurity, store: SecurityStore
) -> None:
    """The broker's own SCRAM user is one its peers know, with the password it was given."""
    if security.sasl_mechanism is None:
        return
    assert security.username is not None and security.password is not None
    credential = await store.scram_credential(security.username, security.sasl_mechanism)
    if credential is None:
        raise ValueError(
            f"--inter-broker-user {security.username} has no {security.sasl_mechanism} "
            "credential in the cluster's store: add it first (coordinator users add "
            f"{security.username} --zookeeper {settings.zookeeper})"
        )
    if not await trio.to_thread.run_sync(password_matches, credential, security.password):
        raise ValueError(
            f"the inter-broker password is not --inter-broker-user {security.username}'s"
        )


def _file_budget(limits: ConnectionLimits) -> FileBudget:
    """The process's file budget, said at start: what it allows is what an operator sizing a
    broker's partitions and clients must know (docs/limits.md#files)."""
    budget = FileBudget.of_process()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    log.info(
        "file limit %d (hard %s): %d files for client connections and segment files together, "
        "at least %d of them kept for segment files, %d kept back for the rest; at most %d "
        "client connections",
        soft,
        "unlimited" if hard == resource.RLIM_INFINITY else hard,
        budget.limit,
        budget.floor,
        soft - budget.limit,
        min(limits.connection_limit(), budget.limit - budget.floor),
    )
    return budget


async def _snapshot(
    metrics: BrokerMetrics,
    broker: BrokerInfo,
    by_slot: BySlot,
    store: TopicStore,
    data_plane: BrokerLog,
) -> Snapshot:
    log_ends = {tp: p.high_watermark for tp, p in data_plane.partitions.items()}
    log_sizes = {
        tp: LogSize(bytes=p.size_bytes, records=p.high_watermark - p.log_start_offset)
        for tp, p in data_plane.partitions.items()
    }

    async def read_timestamp(tp: TopicPartition, offset: int) -> int | None:
        partition = data_plane.partitions.get(tp)
        if partition is None:
            return None
        try:
            return await first_timestamp(partial(partition.read, max_bytes=1), offset)
        except (OffsetOutOfRange, CorruptSegment, RemoteProtocolError):
            return None  # gone by retention, or unreadable: the page says "?"

    return await take_snapshot(metrics, broker, by_slot, store, log_ends, read_timestamp, log_sizes)


def _listener_security(
    settings: NodeSettings, endpoint: Endpoint, tls: ssl.SSLContext | None, store: SecurityStore
) -> ListenerSecurity | None:
    protocol = endpoint.protocol
    if protocol is SecurityProtocol.PLAINTEXT:
        return None
    if protocol.tls and tls is None:
        raise ValueError(f"the {endpoint} listener needs --tls-cert and --tls-key")
    return ListenerSecurity(
        protocol=protocol,
        tls=tls if protocol.tls else None,
        credentials=store.scram_credential if protocol.sasl else None,
        mechanisms=settings.sasl_mechanisms,
        handshake_timeout=settings.connections.handshake_timeout,
        principal_is_cn=settings.tls_principal_is_cn,
    )


def _describe(settings: NodeSettings, endpoint: Endpoint) -> str:
    """What a listener lets in, said at start; a warning where anyone who reaches its port may
    do anything."""
    protocol = endpoint.protocol
    if protocol.sasl:
        return "SASL/SCRAM authentication" + (" over TLS" if protocol.tls else "")
    if settings.authenticates(endpoint):
        return "TLS, clients authenticated by their certificates"
    if not settings.authorization:
        log.warning(
            "the %s listener on %s:%d authenticates nobody and no access rules apply: anyone "
            "who can reach its port can do anything (README: Security)",
            endpoint.listener,
            endpoint.host,
            endpoint.port,
        )
    what = "TLS" if protocol.tls else "plaintext"
    return f"{what}, clients unauthenticated: User:ANONYMOUS"


def _open_store(
    settings: NodeSettings,
) -> AbstractAsyncContextManager[EmbeddedStore | ZooKeeperStore]:
    if settings.zookeeper is None:
        return open_embedded_store(settings.data_dir / "metadata")
    return open_zookeeper_store(
        settings.zookeeper,
        session_timeout=settings.zookeeper_session_timeout,
        auth=settings.zookeeper_auth,
        coordinator_slots=settings.coordinator.coordinator_slots,
    )


#: ``handler(stream, data_plane=...)``: serves one connection.
ConnectionHandler = Callable[..., Awaitable[None]]


@asynccontextmanager
async def _open_coordination(
    store: EmbeddedStore | ZooKeeperStore,
    timed: Callable[[MetadataStore], MetadataStore],
    config: CoordinatorConfig,
    broker: BrokerInfo,
    log_end: LogEnd,
    observer: CoordinatorObserver,
    connect: Connect,
) -> AsyncIterator[tuple[ConnectionHandler, Callable[[], BySlot]]]:
    """Alone on its store, a broker coordinates every group; sharing ZooKeeper, it coordinates
    the groups of the slots its election gives it (docs/design.md#coordinator-slots). Also
    yields how to find the coordinators this broker runs now, by slot."""
    if isinstance(store, ZooKeeperStore):
        async with open_elector(
            store, config, broker, log_end=log_end, observer=observer, timed=timed, connect=connect
        ) as elector:
            yield partial(handle_connection, elector), lambda: elector.by_slot.value
    else:
        async with open_group_coordinator(
            timed(store), config, broker, log_end=log_end, observer=observer
        ) as coordinator:
            offices = whole_office(coordinator)
            yield partial(handle_connection, offices), lambda: offices.by_slot.value
