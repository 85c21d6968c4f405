"""Load for the benchmarks: thousands of simulated consumers in worker processes, and a bare
baseline server (:mod:`bench.harness` starts them and reads their figures).

Three kinds of process, all started by a benchmark (the parent):

* the coordinator: a real ``python -m cli serve --port 0`` subprocess;
* ``python -m bench.loadgen consumers ...``: a worker holding up to ~5,000 consumers that speak
  the real protocol (``transport.channel.Channel``), each the consumer library's own machine
  (:class:`statemachine.consumer.ConsumerMachine`): it decides how to register and what to answer
  to Ping, StopFetcher and StartFetcher, and the worker performs its effects (with no fetchers and
  no lease timer: a request read after the lease ran out finds the member stopped), recording
  when each request arrived; with ``--bootstrap`` each first finds its group's coordinator as the
  consumer library does (ClusterMetadata naming the group, :class:`consumer.discovery.Discovery`);
* ``python -m bench.loadgen bare-serve`` and ``... bare ...``: the bare baseline, a trio server
  and clients exchanging length-prefixed frames of the protocol's sizes with no decoding, no
  state machine and no timers on the server (the limit trio itself sets on one core).

Workers take one command per line on stdin and answer each with one JSON line on stdout, so the
parent can freeze one (SIGSTOP) without losing the others. A process may hold at most 20,000 open
files, so the parent spreads consumers over several workers, apart from the server's process.

Times that cross processes (a trigger in one worker, a StartFetcher receipt in another) are read
from :func:`bench.measure.now`, the one clock every process on the machine shares.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import attrs
import trio

from bench.bare import (
    BROADCAST_SIZES,
    CONNECT_CONCURRENCY,
    SETTLE_POLL,
    LineReader,
    bare_serve,
    run_bare_worker,
)
from bench.measure import now, percentile, rounded
from consumer.discovery import Discovery
from protocol import (
    AssignedPartition,
    AssignedStream,
    ClusterMetadataRequest,
    ClusterMetadataResponse,
    Connection,
    ErrorCode,
    PingRequest,
    PingResponse,
    RegisterConsumerRequest,
    RegisterConsumerResponse,
    Request,
    RequestMessage,
    Response,
    ResponseMessage,
    Role,
    StartFetcherRequest,
    StartFetcherResponse,
    StopFetcherRequest,
    StopFetcherResponse,
)
from protocol.types import BrokerInfo, Subscription, TopicPartition, TopicStreams
from statemachine import consumer as sm
from transport.channel import Channel, ChannelClosed, acknowledged_frames
from transport.security import ClientSecurity

MAX_FRAME = 64 * 1024 * 1024
#: Consumers per worker process: well under the 20,000 open files a process may hold.
PER_WORKER = 5000
LATENESS_SAMPLES = 20_000
#: With ``--bootstrap``: passes over the brokers, a second apart, before a consumer gives up
#: finding its coordinator; and how long one broker has to answer.
DISCOVERY_PASSES = 30
DISCOVERY_TIMEOUT = 30.0


# --- frame sizes --------------------------------------------------------------------------------


def _request_frame(message: Any) -> bytes:
    return Connection(Role.BROKER, max_frame_size=MAX_FRAME).send(
        Connection(Role.BROKER, max_frame_size=MAX_FRAME).new_request(message)
    )


def _response_frame(request: Any, response: ResponseMessage) -> int:
    broker = Connection(Role.BROKER, max_frame_size=MAX_FRAME)
    consumer = Connection(Role.CONSUMER, max_frame_size=MAX_FRAME)
    consumer.receive_data(broker.send(broker.new_request(request)))
    event = consumer.next_event()
    assert isinstance(event, Request)
    data = consumer.send(
        Response(correlation_id=event.correlation_id, message=response, request=event.message)
    )
    return len(data)


@attrs.frozen(kw_only=True)
class FrameSizes:
    """Bytes on the wire (size prefix included) of one coordinator round trip of each kind."""

    ping: tuple[int, int]
    stop: tuple[int, int]
    start: tuple[int, int]
    #: A consumer's join, each (its request, the answer): ClusterMetadata naming its group (with
    #: three brokers and 50 slot holders in the answer), then RegisterConsumer.
    discover: tuple[int, int]
    register: tuple[int, int]


def _client_round_trip(request: RequestMessage, response: ResponseMessage) -> tuple[int, int]:
    """Bytes on the wire of a request a client sends and the broker's answer."""
    consumer = Connection(Role.CONSUMER, max_frame_size=MAX_FRAME)
    broker = Connection(Role.BROKER, max_frame_size=MAX_FRAME)
    sent = consumer.send(consumer.new_request(request))
    broker.receive_data(sent)
    event = broker.next_event()
    assert isinstance(event, Request)
    answer = broker.send(
        Response(correlation_id=event.correlation_id, message=response, request=event.message)
    )
    return len(sent), len(answer)


def frame_sizes(consumer_id: str, topic: str, partitions_per_member: int) -> FrameSizes:
    ping = PingRequest(coordinator_epoch=1, generation=1, consumer_id=consumer_id, num_retries=0)
    stop = StopFetcherRequest(coordinator_epoch=1, generation=1, consumer_id=consumer_id)
    assigned = tuple(
        AssignedPartition(topic=topic, partition=p, offset=-1, broker_id=1)
        for p in range(partitions_per_member)
    )
    start = StartFetcherRequest(
        coordinator_epoch=1,
        generation=1,
        consumer_id=consumer_id,
        streams=(AssignedStream(stream_id=f"{consumer_id}-0", partitions=assigned),),
        brokers=(BrokerInfo(broker_id=1, host="127.0.0.1", port=9092),),
    )
    brokers = tuple(BrokerInfo(broker_id=b, host="127.0.0.1", port=40000 + b) for b in (1, 2, 3))
    register = RegisterConsumerRequest(
        group_id="g123",
        consumer_id=consumer_id,
        subscription=Subscription(topics=(TopicStreams(topic=topic, streams=1),)),
        auto_commit=False,
        auto_offset_reset="smallest",
        session_timeout_ms=30_000,
        generation=-1,
        owned_partitions=(),
    )
    return FrameSizes(
        discover=_client_round_trip(
            ClusterMetadataRequest(group_id="g123", topics=()),
            ClusterMetadataResponse(
                error_code=ErrorCode.NONE,
                coordinator_id=1,
                coordinator_epoch=1,
                brokers=brokers,
                topics=(),
                slot_holders=(1,) * 50,
            ),
        ),
        register=_client_round_trip(
            register,
            RegisterConsumerResponse(error_code=ErrorCode.NONE, coordinator_epoch=1, generation=0),
        ),
        ping=(
            len(_request_frame(ping)),
            _response_frame(
                ping, PingResponse(error_code=ErrorCode.NONE, consumer_id=consumer_id, offsets=())
            ),
        ),
        stop=(
            len(_request_frame(stop)),
            _response_frame(
                stop,
                StopFetcherResponse(error_code=ErrorCode.NONE, consumer_id=consumer_id, offsets=()),
            ),
        ),
        start=(
            len(_request_frame(start)),
            _response_frame(
                start, StartFetcherResponse(error_code=ErrorCode.NONE, consumer_id=consumer_id)
            ),
        ),
    )


# --- workers ------------------------------------------------------------------------------------


def coordinator_input(request: Request, now: float, anchor: float | None) -> sm.Input | None:
    """The consumer machine's input for a coordinator request read at ``now`` (trio time);
    ``anchor``: when this side queued the frame the request names (where the lease runs from).
    None for any other request."""
    message = request.message
    if not isinstance(message, PingRequest | StopFetcherRequest | StartFetcherRequest):
        return None
    return sm.coordinator_input(
        message, correlation_id=request.correlation_id, now=now, anchor=anchor
    )


def _names(partitions: Iterable[TopicPartition]) -> list[str]:
    return sorted(f"{p.topic}/{p.partition}" for p in partitions)


@attrs.define(eq=False)
class _Consumer:
    """One member: the consumer library's own machine (:mod:`statemachine.consumer`), whose
    effects the worker performs with no fetcher behind them, and what it was told when."""

    consumer_id: str
    group_id: str
    machine: sm.ConsumerMachine
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    #: Set once the registration answer is in the machine; a request read before waits for it.
    answered: trio.Event | None = None
    #: How the machine said to close the connection (CloseConnection); False: cleanly.
    reset: bool = False
    registered: bool = False
    #: Its registrations a busy broker refused (BROKER_BUSY): each is retried after the broker's
    #: hint, and none uses up a look.
    refused_busy: int = 0
    #: When its registration was answered, or when it gave up (CLOCK_MONOTONIC): the end of
    #: its join.
    settled_at: float | None = None
    closing: bool = False
    dropped: bool = False
    #: How often its registered connection ended under it (more than once only with ``rejoin``).
    drops: int = 0
    #: How often its broker let its group go and told it so (StopFetcher 3, reason BROKER_BUSY:
    #: docs/design.md#shedding-load): not a drop; it comes back after the hint, as the library.
    shed: int = 0
    #: The look its machine asked for when it was let go, for its session to return.
    comeback: list[sm.Effect] = attrs.field(factory=list)
    last_ping: float | None = None
    last_answer: float | None = None
    started_at: float | None = None
    #: The broker id it registered with (found by discovery; -1 without ``--bootstrap``).
    coordinator: int = -1
    #: What it was told when: each StopFetcher answer (the partitions it stopped), each
    #: StartFetcher (those it had not held before it), and its clean close (what it held), as
    #: (CLOCK_MONOTONIC, partitions).
    stopped: list[tuple[float, list[str]]] = attrs.field(factory=list)
    started: list[tuple[float, list[str], int]] = attrs.field(factory=list)
    closed_at: float | None = None

    @property
    def generation(self) -> int:
        return self.machine.generation

    @property
    def live(self) -> bool:
        return self.registered and not self.dropped and not self.closing


@attrs.define(eq=False)
class ConsumerWorker:
    """One process's consumers, and the command loop the parent drives them with."""

    host: str
    port: int
    topic: str
    session_timeout_ms: int
    #: How a consumer connects: TCP, or TLS trusting ``--tls-ca`` (the TLS benchmark).
    connect: Callable[[str, int], Awaitable[trio.abc.Stream]] = attrs.field(
        factory=lambda: ClientSecurity().connector()
    )
    consumers: list[_Consumer] = attrs.field(factory=list)
    pings: int = 0
    stops: int = 0
    errors: list[str] = attrs.field(factory=list)
    #: The latest lateness samples only: the parent polls stats often, and each poll sorts them.
    lateness: deque[float] = attrs.field(factory=lambda: deque(maxlen=LATENESS_SAMPLES))
    lateness_max: float = -math.inf
    limiter: trio.CapacityLimiter = attrs.field(
        factory=lambda: trio.CapacityLimiter(CONNECT_CONCURRENCY)
    )
    #: Brokers to find each group's coordinator through; empty: register at host:port.
    bootstrap: list[tuple[str, int]] = attrs.field(factory=list)
    #: A member whose registered connection ended registers again, as the consumer library
    #: does; False: it is done, and counted dropped.
    rejoin: bool = False
    #: Consumers that found a coordinator which then did not take their registration (the
    #: office moved in between) and looked again, as the consumer library does.
    rediscovered: int = 0
    #: Members whose machine closed their connection on a coordinator request: its lease ran
    #: out before the request was read (the worker fell behind), or it was fenced.
    closed_by_machine: int = 0
    #: Consumers added that have not yet registered nor given up.
    joining: int = 0
    config: sm.ConsumerConfig = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.config = sm.ConsumerConfig(session_timeout=self.session_timeout_ms / 1000)

    async def run_consumer(self, consumer: _Consumer, index: int = 0) -> None:
        """Perform the machine's effects until the consumer closes, is dropped, or gives up:
        each Discover is one look (at ``bootstrap``, each consumer starting its round robin at
        another broker; else at host:port), each Register a session. A member whose
        registered connection ended is done (the parent counts it dropped), and one that used up
        its looks without registering is an error."""
        start = index % max(1, len(self.bootstrap))
        discovery = Discovery(
            group_id=consumer.group_id,
            addresses=self.bootstrap[start:] + self.bootstrap[:start],
            connect=self.connect,
            client_id="loadgen",
            max_frame_size=MAX_FRAME,
            request_timeout=DISCOVERY_TIMEOUT,
        )
        looks = DISCOVERY_PASSES if self.bootstrap else 1
        effects = consumer.machine.handle(sm.Start())
        while effects:
            effect = effects.pop(0)
            if isinstance(effect, sm.Discover):
                if consumer.registered:
                    return
                if looks == 0:
                    problem = discovery.last_problem or "registrations refused"
                    self.errors.append(f"no coordinator for {consumer.consumer_id}: {problem}")
                    return
                looks -= 1
                jitter = random.uniform(-effect.jitter, effect.jitter)
                await trio.sleep(max(0.0, effect.delay + jitter))
                effects = consumer.machine.handle(await self._look(consumer, discovery))
            elif isinstance(effect, sm.Register):
                refused, drops, shed = consumer.refused_busy, consumer.drops, consumer.shed
                effects = await self._session(consumer, effect)
                looks += consumer.refused_busy - refused + consumer.drops - drops
                looks += consumer.shed - shed

    async def _look(self, consumer: _Consumer, discovery: Discovery) -> sm.Input:
        if not self.bootstrap:
            here = BrokerInfo(broker_id=-1, host=self.host, port=self.port)
            return sm.CoordinatorFound(
                now=trio.current_time(), coordinator=here, epoch=sm.UNKNOWN_EPOCH
            )
        async with self.limiter:
            found = await discovery.find()
        if found is None:
            return sm.DiscoveryFailed(now=trio.current_time(), error_code=discovery.last_code)
        consumer.coordinator = found.coordinator.broker_id
        return sm.CoordinatorFound(
            now=trio.current_time(), coordinator=found.coordinator, epoch=found.epoch
        )

    async def _session(self, consumer: _Consumer, register: sm.Register) -> list[sm.Effect]:
        """Connect where ``register`` says, register, and answer until the connection ends
        (the peer closed it, or the machine did); the look the machine asks for after a
        refusal that says the coordinator moved (with ``bootstrap``), else none."""
        coordinator = register.coordinator
        consumer.scope = trio.CancelScope()
        consumer.reset = False
        looks: list[sm.Effect] = []
        event: sm.Input | None = None
        with consumer.scope:
            async with self.limiter:
                try:
                    stream = await self.connect(coordinator.host, coordinator.port)
                except OSError as exc:
                    self.errors.append(f"connect: {exc}")
                    return []
            channel = Channel.open(
                stream, Role.CONSUMER, client_id="loadgen", max_frame_size=MAX_FRAME
            )
            async with trio.open_nursery() as nursery:

                async def read() -> None:
                    await channel.run(lambda request: self.answer(consumer, channel, request))
                    nursery.cancel_scope.cancel()

                nursery.start_soon(read)
                event = await self._register(consumer, channel, register)
                effects = self._closing(consumer, consumer.machine.handle(event))
                if consumer.machine.state is sm.ConsumerState.STOPPED:
                    consumer.registered = True
                    consumer.dropped = False
                    self._settle(consumer)
                    if consumer.answered is not None:
                        consumer.answered.set()
                else:
                    code = event.error_code if isinstance(event, sm.RegistrationRejected) else None
                    if code is ErrorCode.BROKER_BUSY:
                        consumer.refused_busy += 1
                        looks = effects
                    elif self.bootstrap and code in sm.FAILOVER_CODES:
                        self.rediscovered += 1
                        looks = effects
                    else:
                        self.errors.append(f"register {consumer.consumer_id}: {event}")
                    nursery.cancel_scope.cancel()
        if event is None:
            self.errors.append(f"register {consumer.consumer_id}: the connection closed first")
        # Registered, and not closed by the application: the peer closed the connection, or
        # the machine did (a lease that ran out, a fence).
        consumer.dropped = consumer.registered and not consumer.closing
        consumer.drops += consumer.dropped
        if consumer.dropped and sm.TABLE.allows(consumer.machine.state, sm.ConnectionLost):
            again = self._closing(
                consumer, consumer.machine.handle(sm.ConnectionLost(now=trio.current_time()))
            )
            if self.rejoin:
                looks = [e for e in again if isinstance(e, sm.Discover)]
        if consumer.dropped and self.rejoin:
            consumer.registered = False
            consumer.answered = None
            consumer.last_ping = None
        if consumer.comeback:
            looks, consumer.comeback = consumer.comeback, []
        with trio.CancelScope(shield=True):
            await (channel.abort() if consumer.reset else channel.aclose())
        return looks

    @staticmethod
    def _closing(consumer: _Consumer, effects: list[sm.Effect]) -> list[sm.Effect]:
        """Take how the machine says to close the connection (the session's end closes it)."""
        for effect in effects:
            if isinstance(effect, sm.CloseConnection):
                consumer.reset = effect.reset
                consumer.scope.cancel()
        return effects

    async def _register(
        self, consumer: _Consumer, channel: Channel, register: sm.Register
    ) -> sm.Input:
        request = RegisterConsumerRequest(
            group_id=consumer.group_id,
            consumer_id=consumer.consumer_id,
            subscription=Subscription(topics=(TopicStreams(topic=self.topic, streams=1),)),
            auto_commit=False,
            auto_offset_reset="smallest",
            session_timeout_ms=self.session_timeout_ms,
            generation=register.generation,
            owned_partitions=register.owned,
            instance_id=register.instance_id,
        )
        async with self.limiter:
            # The request is queued before request() first yields: the lease runs from here.
            queued = trio.current_time()
            try:
                response = await channel.request(request)
            except ChannelClosed:
                return sm.ConnectionLost(now=trio.current_time())
        if not isinstance(response, RegisterConsumerResponse):  # an error frame's answer
            code = getattr(response, "error_code", ErrorCode.UNKNOWN_SERVER_ERROR)
            return sm.RegistrationRejected(now=trio.current_time(), error_code=code)
        if response.error_code is not ErrorCode.NONE:
            return sm.RegistrationRejected(
                now=trio.current_time(),
                error_code=response.error_code,
                retry_after=response.throttle_time_ms / 1000,
            )
        return sm.Registered(
            now=trio.current_time(),
            anchor=queued,
            generation=response.generation,
            epoch=response.coordinator_epoch,
        )

    async def answer(self, consumer: _Consumer, channel: Channel, request: Request) -> None:
        """Feed a coordinator request to the consumer's machine and perform what it says."""
        arrived = now()
        message = request.message
        if isinstance(message, PingRequest):
            self.pings += 1
            if consumer.last_ping is not None:
                late = arrived - consumer.last_ping - self.session_timeout_ms / 3000
                self.lateness.append(late)
                self.lateness_max = max(self.lateness_max, late)
            consumer.last_ping = arrived
        elif isinstance(message, StopFetcherRequest):
            self.stops += 1
        # Looked up as the request is read: a later one forgets the frames before its own.
        anchor = channel.sent_at(acknowledged_frames(message))
        event = coordinator_input(request, trio.current_time(), anchor)
        if event is None:
            return
        if not consumer.registered:
            if consumer.answered is None:
                consumer.answered = trio.Event()
            await consumer.answered.wait()
        if consumer.closing or not sm.TABLE.allows(consumer.machine.state, type(event)):
            return
        held = consumer.machine.owned
        await self._perform(consumer, channel, request, consumer.machine.handle(event), held)

    async def _perform(
        self,
        consumer: _Consumer,
        channel: Channel,
        request: Request,
        effects: list[sm.Effect],
        held: tuple[TopicPartition, ...],
    ) -> None:
        """The machine's effects for one coordinator request, in order; ``held``: what it
        fetched before. Stops and starts are stamped for the parent: a StopFetcher's stop from
        its answer on (the coordinator may hand the partitions on once it reads it), a
        StartFetcher's from its arrival."""
        arrived = now()
        stopping: list[str] = []
        answer: ResponseMessage | None = None
        for effect in effects:
            match effect:
                case sm.StopFetchers(partitions=partitions):
                    stopping += _names(held if partitions is None else partitions)
                case sm.StartFetchers(generation=generation, streams=streams, kept=kept):
                    whole = {f"{p.topic}/{p.partition}" for s in streams for p in s.partitions}
                    if outside := sorted(set(stopping) - whole):
                        consumer.stopped.append((arrived, outside))
                    consumer.started.append(
                        (arrived, sorted(whole - set(_names(kept))), generation)
                    )
                    consumer.started_at = arrived
                case sm.RespondPing():
                    answer = PingResponse(
                        error_code=ErrorCode.NONE, consumer_id=consumer.consumer_id, offsets=()
                    )
                case sm.RespondStop():
                    answer = StopFetcherResponse(
                        error_code=ErrorCode.NONE, consumer_id=consumer.consumer_id, offsets=()
                    )
                case sm.RespondStart():
                    answer = StartFetcherResponse(
                        error_code=ErrorCode.NONE, consumer_id=consumer.consumer_id
                    )
                case sm.CloseConnection() if consumer.machine.last_error is ErrorCode.BROKER_BUSY:
                    # Let go with its group: it answered, and comes back after the hint.
                    consumer.shed += 1
                    consumer.registered = False
                    consumer.answered = None
                    consumer.last_ping = None
                    consumer.comeback = [e for e in effects if isinstance(e, sm.Discover)]
                    self._closing(consumer, [effect])
                case sm.CloseConnection():
                    # A lease that ran out before the request was read (or a fence): with
                    # ``rejoin``, it looks again when the machine says, as the library does.
                    self.closed_by_machine += 1
                    if self.rejoin:
                        consumer.comeback = [e for e in effects if isinstance(e, sm.Discover)]
                    self._closing(consumer, [effect])
            if answer is not None:
                try:
                    await channel.respond(request, answer)
                except ChannelClosed:
                    return
                consumer.last_answer = now()
                if isinstance(answer, StopFetcherResponse):
                    consumer.stopped.append((consumer.last_answer, sorted(stopping)))
                answer = None

    def close(self, consumer: _Consumer) -> None:
        """Close the consumer as the application would (the machine stops, then closes the
        connection cleanly, which proves the stop: SPEC.md §11.9). Its final commit and
        LeaveGroup are left out: this load leaves by the clean close alone."""
        consumer.closing = True
        consumer.closed_at = now()
        self._closing(consumer, consumer.machine.handle(sm.Close()))

    def stats(self) -> dict[str, Any]:
        live = [c for c in self.consumers if c.live]
        generations: dict[int, list[float]] = {}
        for c in live:
            entry = generations.setdefault(c.generation, [0, 0.0])
            entry[0] += 1
            entry[1] = max(entry[1], c.started_at or 0.0)
        answers = [c.last_answer for c in live if c.last_answer is not None]
        return {
            "consumers": len(self.consumers),
            "registered": sum(c.registered for c in self.consumers),
            "live": len(live),
            "dropped": sum(c.drops for c in self.consumers),
            "pings": self.pings,
            "stops": self.stops,
            "errors": self.errors[:5],
            "error_count": len(self.errors),
            "generations": {str(g): v for g, v in generations.items()},
            "last_answer": max(answers) if answers else None,
            "held": sum(len(c.machine.owned) for c in live),
            "rediscovered": self.rediscovered,
            "refused_busy": sum(c.refused_busy for c in self.consumers),
            "shed": sum(c.shed for c in self.consumers),
            "closed_by_machine": self.closed_by_machine,
            "coordinators": dict(Counter(str(c.coordinator) for c in live)),
            "groups_at": {
                str(broker): sorted({c.group_id for c in live if c.coordinator == broker})
                for broker in {c.coordinator for c in live}
            },
            "max_generation": max((c.generation for c in live), default=-1),
            "lateness_p50": rounded(percentile(self.lateness, 50)),
            "lateness_p99": rounded(percentile(self.lateness, 99)),
            "lateness_max": rounded(self.lateness_max if self.lateness else math.nan),
        }

    def holdings(self) -> dict[str, list[str]]:
        """What each live consumer holds now, by consumer id."""
        return {c.consumer_id: _names(c.machine.owned) for c in self.consumers if c.live}

    def handoffs(self, since: float) -> list[dict[str, Any]]:
        """Every consumer's stops, starts and clean close at or after ``since``."""
        found = []
        for c in self.consumers:
            stops = [[t, ps] for t, ps in c.stopped if t >= since]
            starts = [[t, ps, g] for t, ps, g in c.started if t >= since]
            closed = c.closed_at if c.closed_at is not None and c.closed_at >= since else None
            if stops or starts or closed is not None:
                entry = {"id": c.consumer_id, "stops": stops, "starts": starts, "closed": closed}
                found.append(entry)
        return found

    def add(self, nursery: trio.Nursery, group_id: str, consumer_id: str) -> _Consumer:
        machine = sm.ConsumerMachine(config=self.config)
        consumer = _Consumer(consumer_id=consumer_id, group_id=group_id, machine=machine)
        self.consumers.append(consumer)
        self.joining += 1
        nursery.start_soon(self._run, consumer, len(self.consumers))
        return consumer

    async def _run(self, consumer: _Consumer, index: int) -> None:
        try:
            await self.run_consumer(consumer, index)
        finally:
            self._settle(consumer)

    def _settle(self, consumer: _Consumer) -> None:
        """The consumer's join is over: it registered, or gave up."""
        if consumer.settled_at is None:
            consumer.settled_at = now()
            self.joining -= 1

    async def settled(self) -> dict[str, Any]:
        """Once every consumer added so far has registered or given up: when the last of them
        did (the end of the join, not when this noticed it), and how many registered."""
        while self.joining:
            await trio.sleep(SETTLE_POLL)
        return {
            "t": max((c.settled_at or 0.0 for c in self.consumers), default=now()),
            "registered": sum(c.registered for c in self.consumers),
            "error_count": len(self.errors),
            "errors": self.errors[:5],
        }


async def run_consumer_worker(args: argparse.Namespace) -> None:
    worker = ConsumerWorker(
        host=args.host,
        port=args.port,
        topic=args.topic,
        session_timeout_ms=args.session_timeout_ms,
        connect=ClientSecurity(ca=args.tls_ca).connector(),
        bootstrap=[_address(a) for a in args.bootstrap.split(",")] if args.bootstrap else [],
        rejoin=args.rejoin,
    )
    joined = 0

    def next_id() -> tuple[str, str]:
        nonlocal joined
        index = args.first + joined
        joined += 1
        return f"{args.group_prefix}{index // args.group_size}", f"{args.member_prefix}{index}"

    async with trio.open_nursery() as nursery:
        for _ in range(args.count):
            worker.add(nursery, *next_id())
        stdin = trio.lowlevel.FdStream(os.dup(0))
        lines = LineReader(stdin)
        while (line := await lines.next()) is not None:
            verb, _, arg = line.partition(" ")
            reply: dict[str, Any]
            if verb == "stats":
                reply = worker.stats()
            elif verb == "reset":
                worker.pings = 0
                worker.lateness.clear()
                worker.lateness_max = -math.inf
                reply = {}
            elif verb == "join":
                reply = {"t0": now()}
                for _ in range(int(arg)):
                    worker.add(nursery, *next_id())
            elif verb == "close":
                reply = {"t0": now(), "closed": []}
                live = [c for c in worker.consumers if c.registered and not c.closing]
                for consumer in live[: int(arg)]:
                    # What it held is unowned from here.
                    worker.close(consumer)
                    reply["closed"].append(consumer.consumer_id)
            elif verb == "settled":
                reply = await worker.settled()
            elif verb == "holdings":
                reply = worker.holdings()
            elif verb == "handoffs":
                reply = {"consumers": worker.handoffs(float(arg))}
            else:
                break
            print(json.dumps(reply), flush=True)
        nursery.cancel_scope.cancel()


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


# --- command line of the worker processes -------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="loadgen")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("bare-serve")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--sizes", type=int, nargs=4, default=[64, 64, 64, 64])
    consumers = commands.add_parser("consumers")
    bare = commands.add_parser("bare")
    for sub in (consumers, bare):
        sub.add_argument("--host", default="127.0.0.1")
        sub.add_argument("--port", type=int, required=True)
        sub.add_argument("--count", type=int, required=True)
    consumers.add_argument(
        "--bootstrap",
        default=None,
        help="HOST:PORT,...: find each group's coordinator through these brokers (ClusterMetadata) "
        "instead of registering at --host:--port",
    )
    consumers.add_argument("--first", type=int, default=0)
    consumers.add_argument("--group-size", type=int, default=100)
    consumers.add_argument("--group-prefix", default="g")
    consumers.add_argument("--member-prefix", default="m")
    consumers.add_argument("--topic", default="bench")
    consumers.add_argument("--session-timeout-ms", type=int, default=3000)
    consumers.add_argument("--tls-ca", type=Path, default=None, help="connect with TLS")
    consumers.add_argument(
        "--rejoin", action="store_true", help="a member dropped registers again, as the library"
    )
    bare.add_argument("--interval", type=float, default=0.0)
    bare.add_argument("--request-size", type=int, default=64)
    bare.add_argument("--reply-size", type=int, default=64)
    bare.add_argument(
        "--join-sizes",
        type=int,
        nargs=4,
        default=None,
        help="DISCOVER_REQUEST DISCOVER_REPLY REGISTER_REQUEST REGISTER_REPLY: join as a consumer "
        "does on the wire (a connection of its own for discovery, then one for registering)",
    )
    args = parser.parse_args(argv)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    if args.command == "bare-serve":
        s = args.sizes
        BROADCAST_SIZES[:] = [(s[0], s[1]), (s[2], s[3])]
        trio.run(bare_serve, args.host)
    elif args.command == "consumers":
        trio.run(run_consumer_worker, args)
    else:
        trio.run(run_bare_worker, args)


if __name__ == "__main__":
    main()
