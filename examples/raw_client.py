"""A third-party client: the sans-IO ``protocol`` package and consumer machine, a blocking socket.

No trio, no ``consumer`` library: this is the proof that the sans-IO layers are all a client
needs. The consumer's own machine (``statemachine.consumer``) decides everything: what to answer,
what to stop and start, when its ownership lease runs out; the script moves bytes and performs
the machine's effects. It creates a topic if missing, joins a group as a consumer, and prints its
assignment as one JSON line per start (with the partitions it ``kept``: an incremental rebalance
leaves them fetching) and what a rebalance revokes as one line per stop naming partitions::

    python examples/raw_client.py --bootstrap 127.0.0.1:9092 --topic demo --group g

With ``--instance-id`` it is a static member (protocol/SPEC.md §11.11); told it is fenced (a
newer process took the instance id), it answers, closes and exits 3 without registering again.

It registers with the broker it is given (a client of a cluster first asks a broker for the
ClusterMetadata naming its group), does not fetch records (a real consumer would, within its
ownership lease: docs/design.md#ownership-lease), and exits where a real client would look for
its coordinator again.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from protocol import (
    NEED_DATA,
    Connection,
    ConnectionClosed,
    CreateTopicRequest,
    ErrorCode,
    LeaveGroupRequest,
    PeerError,
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
from protocol.types import BrokerInfo, Subscription, TopicStreams
from statemachine import consumer as sm

#: Seconds to wait for an answer while no lease bounds the wait (before registering).
REQUEST_TIMEOUT = 30.0


class RawClient:
    """One consumer over one socket. Time is ``time.monotonic()``, the machine's clock here."""

    def __init__(
        self, sock: socket.socket, group_id: str, consumer_id: str, machine: sm.ConsumerMachine
    ) -> None:
        self.sock = sock
        self.group_id = group_id
        self.consumer_id = consumer_id
        self.conn = Connection(Role.CONSUMER, client_id=consumer_id)
        self.machine = machine
        #: Frame number -> when it was queued: a coordinator request names the latest frame it
        #: had received, and the lease runs from that frame's queue time.
        self.sent_at: dict[int, float] = {}

    def _send(self, data: bytes) -> None:
        self.sent_at[self.conn.frames_sent] = time.monotonic()
        self.sock.sendall(data)

    def next_event(self) -> Request | Response | None:
        """Block until the broker sends a whole frame; None when the lease runs out first."""
        while True:
            event = self.conn.next_event()
            if isinstance(event, Request | Response):
                return event
            if isinstance(event, ConnectionClosed | PeerError):
                raise SystemExit(f"the broker closed the connection: {event}")
            assert event is NEED_DATA
            deadline = self.machine.lease_deadline()
            wait = REQUEST_TIMEOUT if deadline is None else deadline - time.monotonic()
            self.sock.settimeout(max(wait, 0.001))
            try:
                self.conn.receive_data(self.sock.recv(65536))
            except TimeoutError:
                if deadline is None:
                    raise SystemExit("the broker did not answer") from None
                return None

    def call(self, message: RequestMessage) -> ResponseMessage:
        """Send a request and answer the broker's own requests until its response comes."""
        request = self.conn.new_request(message)
        self._send(self.conn.send(request))
        while True:
            event = self.next_event()
            if event is None:
                self.perform(self.machine.check_lease(time.monotonic()))
            elif isinstance(event, Response) and event.correlation_id == request.correlation_id:
                return event.message
            elif isinstance(event, Request):
                self.answer(event)

    def answer(self, request: Request) -> bool:
        """Feed one coordinator request to the machine and perform what it says; True once it
        started fetchers (an assignment)."""
        now, message, cid = time.monotonic(), request.message, request.correlation_id
        if not isinstance(message, PingRequest | StopFetcherRequest | StartFetcherRequest):
            raise SystemExit(f"unexpected request from the broker: {message}")
        for older in [frame for frame in self.sent_at if frame < message.acknowledged_frames]:
            del self.sent_at[older]  # requests name ever later frames: these are done with
        anchor = self.sent_at.get(message.acknowledged_frames)
        event = sm.coordinator_input(message, correlation_id=cid, now=now, anchor=anchor)
        if not sm.TABLE.allows(self.machine.state, type(event)):
            return False  # closing: no longer a member, nothing to answer
        return self.perform(self.machine.handle(event), request)

    def perform(self, effects: list[sm.Effect], request: Request | None = None) -> bool:
        """The machine's effects, in order; True if one started fetchers."""
        started = False
        for effect in effects:
            match effect:
                case sm.StopFetchers(partitions=partitions) if partitions is not None:
                    # A real client stops these fetchers here, before it answers.
                    revoked = sorted([p.topic, p.partition] for p in partitions)
                    print("revoked " + json.dumps(revoked), flush=True)
                case sm.StartFetchers(generation=generation, streams=streams, kept=kept):
                    assignment = {
                        "generation": generation,
                        "kept": sorted([p.topic, p.partition] for p in kept),
                        "streams": {
                            s.stream_id: [
                                [p.topic, p.partition, p.offset, p.broker_id] for p in s.partitions
                            ]
                            for s in streams
                        },
                    }
                    print("assignment " + json.dumps(assignment, sort_keys=True), flush=True)
                    started = True
                case sm.RespondPing() | sm.RespondStop() | sm.RespondStart():
                    assert request is not None
                    # Nothing is consumed, so there are no offsets to report (SPEC.md §11.5).
                    self._answer(request, self._reply(effect))
                case sm.CommitAndLeave(generation=generation, leave=True):
                    self.call(
                        LeaveGroupRequest(
                            group_id=self.group_id,
                            consumer_id=self.consumer_id,
                            generation=generation,
                        )
                    )
                case sm.CloseConnection():
                    self.sock.close()  # after the fetchers stopped: a clean close proves it
                    if self.machine.state is sm.ConsumerState.FENCED:
                        print("fenced: a newer process took this instance id", flush=True)
                        raise SystemExit(3)
                case sm.Discover():
                    raise SystemExit("lost the coordinator (a real client looks for it again)")
        return started

    def _reply(self, effect: sm.RespondPing | sm.RespondStop | sm.RespondStart) -> ResponseMessage:
        if isinstance(effect, sm.RespondPing):
            return PingResponse(error_code=ErrorCode.NONE, consumer_id=self.consumer_id, offsets=())
        if isinstance(effect, sm.RespondStop):
            return StopFetcherResponse(
                error_code=ErrorCode.NONE, consumer_id=self.consumer_id, offsets=()
            )
        return StartFetcherResponse(error_code=ErrorCode.NONE, consumer_id=self.consumer_id)

    def _answer(self, request: Request, reply: ResponseMessage) -> None:
        self._send(self.conn.send(request.response(reply)))

    def register(self, topic: str, session_timeout_ms: int) -> None:
        """Register with the broker it is connected to, as the machine says."""
        now = time.monotonic()
        self.machine.handle(sm.Start())  # Discover: the caller named the broker
        host, port = self.sock.getpeername()[:2]
        broker = BrokerInfo(broker_id=-1, host=host, port=port)
        found = sm.CoordinatorFound(now=now, coordinator=broker, epoch=sm.UNKNOWN_EPOCH)
        (register,) = self.machine.handle(found)
        assert isinstance(register, sm.Register)
        queued = time.monotonic()
        answer = self.call(
            RegisterConsumerRequest(
                group_id=self.group_id,
                consumer_id=self.consumer_id,
                subscription=Subscription(topics=(TopicStreams(topic=topic, streams=1),)),
                auto_commit=False,
                auto_offset_reset="smallest",
                session_timeout_ms=session_timeout_ms,
                generation=register.generation,
                owned_partitions=register.owned,
                instance_id=register.instance_id,
            )
        )
        assert isinstance(answer, RegisterConsumerResponse)
        code, now = answer.error_code, time.monotonic()
        if code is ErrorCode.NONE:
            epoch, generation = answer.coordinator_epoch, answer.generation
            self.machine.handle(
                sm.Registered(now=now, anchor=queued, generation=generation, epoch=epoch)
            )
            return
        effects = self.machine.handle(sm.RegistrationRejected(now=now, error_code=code))
        self.perform([e for e in effects if not isinstance(e, sm.Discover)])  # fenced: exits 3
        raise SystemExit(f"cannot register: {code.name}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", default="127.0.0.1:9092", help="HOST:PORT")
    parser.add_argument("--topic", default="demo")
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--group", default="raw-clients")
    parser.add_argument("--consumer-id", default="raw-1")
    parser.add_argument("--instance-id", default=None, help="register as this static member")
    parser.add_argument("--session-timeout-ms", type=int, default=6000)
    parser.add_argument("--forever", action="store_true", help="keep answering after the first")
    args = parser.parse_args()
    host, _, port = args.bootstrap.rpartition(":")
    config = sm.ConsumerConfig(
        session_timeout=args.session_timeout_ms / 1000, instance_id=args.instance_id
    )
    sock = socket.create_connection((host, int(port)), timeout=REQUEST_TIMEOUT)
    client = RawClient(sock, args.group, args.consumer_id, sm.ConsumerMachine(config=config))

    created = client.call(CreateTopicRequest(topic=args.topic, partitions=args.partitions))
    if created.error_code not in (ErrorCode.NONE, ErrorCode.TOPIC_ALREADY_EXISTS):
        raise SystemExit(f"cannot create {args.topic}: {created.error_code.name}")
    client.register(args.topic, args.session_timeout_ms)
    print(f"registered in {args.group} as {args.consumer_id}", flush=True)
    while True:  # from here the coordinator talks; it pings every T/3
        event = client.next_event()
        if event is None:
            client.perform(client.machine.check_lease(time.monotonic()))
        elif isinstance(event, Request) and client.answer(event) and not args.forever:
            # Stop, leave the group, and only then close the connection (cleanly).
            client.perform(client.machine.handle(sm.Close()))
            return 0


if __name__ == "__main__":
    sys.exit(main())
