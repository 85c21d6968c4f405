"""A third-party client in ~100 lines: the ``protocol`` package and a blocking socket, nothing else.

No trio, no ``coordinator``: this is the proof that the sans-IO layer is all a client needs. It
creates a topic if missing, joins a group as a consumer, answers the coordinator's Ping,
StopFetcher and StartFetcher, and prints its assignment as one JSON line per StartFetcher (and
what an incremental rebalance revokes as one line per StopFetcher naming partitions)::

    python examples/raw_client.py --bootstrap 127.0.0.1:9092 --topic demo --group g

With ``--instance-id`` it is a static member (protocol/SPEC.md §11.11); told it is fenced (a
newer process took the instance id), it answers, closes and exits 3 without registering again.

It does not fetch records (a real consumer would, within its ownership lease:
docs/design.md#ownership-lease).
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from protocol import (
    NEED_DATA,
    Connection,
    ConnectionClosed,
    CreateTopicRequest,
    ErrorCode,
    PeerError,
    PingRequest,
    PingResponse,
    RegisterConsumerRequest,
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
from protocol.types import Subscription, TopicStreams


class RawClient:
    def __init__(self, host: str, port: int, client_id: str) -> None:
        self.sock = socket.create_connection((host, port), timeout=30)
        self.conn = Connection(Role.CONSUMER, client_id=client_id)

    def _send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def next_event(self) -> Request | Response:
        """Block until the broker sends a whole frame (a request or a response)."""
        while True:
            event = self.conn.next_event()
            if event is NEED_DATA:
                self.conn.receive_data(self.sock.recv(65536))
            elif isinstance(event, Request | Response):
                return event
            elif isinstance(event, ConnectionClosed | PeerError):
                raise SystemExit(f"the broker closed the connection: {event}")

    def call(self, message: RequestMessage) -> ResponseMessage:
        """Send a request and answer the broker's own requests until its response comes."""
        request = self.conn.new_request(message)
        self._send(self.conn.send(request))
        while True:
            event = self.next_event()
            if isinstance(event, Response) and event.correlation_id == request.correlation_id:
                return event.message
            if isinstance(event, Request):
                self.answer(event)

    def answer(self, request: Request) -> bool:
        """Answer one coordinator request; True once it was a StartFetcher (an assignment)."""
        message = request.message
        reply: ResponseMessage
        started = False
        if isinstance(message, PingRequest):
            reply = PingResponse(
                error_code=ErrorCode.NONE, consumer_id=message.consumer_id, offsets=()
            )
        elif isinstance(message, StopFetcherRequest):
            # Nothing is fetched, so there are no final offsets to report (SPEC.md §11.5); a real
            # client stops the fetchers of ``partitions`` (None: all) before it answers.
            reply = StopFetcherResponse(
                error_code=ErrorCode.NONE, consumer_id=message.consumer_id, offsets=()
            )
            if message.partitions is not None:
                revoked = sorted([p.topic, p.partition] for p in message.partitions)
                print("revoked " + json.dumps(revoked), flush=True)
            if message.reason is ErrorCode.FENCED_INSTANCE_ID:
                self._answer(request, reply)
                self.sock.close()  # a clean close: it has stopped; and it never registers again
                print("fenced: a newer process took this instance id", flush=True)
                raise SystemExit(3)
        elif isinstance(message, StartFetcherRequest):
            reply = StartFetcherResponse(error_code=ErrorCode.NONE, consumer_id=message.consumer_id)
            assignment = {
                "generation": message.generation,
                # true: partitions already fetched go on; the streams are still the whole set
                "incremental": message.incremental,
                "streams": {
                    s.stream_id: [
                        [p.topic, p.partition, p.offset, p.broker_id] for p in s.partitions
                    ]
                    for s in message.streams
                },
            }
            print("assignment " + json.dumps(assignment, sort_keys=True), flush=True)
            started = True
        else:
            raise SystemExit(f"unexpected request from the broker: {message}")
        self._answer(request, reply)
        return started

    def _answer(self, request: Request, reply: ResponseMessage) -> None:
        self._send(
            self.conn.send(
                Response(
                    correlation_id=request.correlation_id, message=reply, request=request.message
                )
            )
        )


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
    client = RawClient(host, int(port), client_id=args.consumer_id)

    created = client.call(CreateTopicRequest(topic=args.topic, partitions=args.partitions))
    if created.error_code not in (ErrorCode.NONE, ErrorCode.TOPIC_ALREADY_EXISTS):
        raise SystemExit(f"cannot create {args.topic}: {created.error_code.name}")
    registered = client.call(
        RegisterConsumerRequest(
            group_id=args.group,
            consumer_id=args.consumer_id,
            subscription=Subscription(topics=(TopicStreams(topic=args.topic, streams=1),)),
            auto_commit=False,
            auto_offset_reset="smallest",
            session_timeout_ms=args.session_timeout_ms,
            generation=-1,
            owned_partitions=(),
            instance_id=args.instance_id,
        )
    )
    if registered.error_code is ErrorCode.FENCED_INSTANCE_ID:
        print("fenced: a newer process took this instance id", flush=True)
        return 3
    if registered.error_code is not ErrorCode.NONE:
        raise SystemExit(f"cannot register: {registered.error_code.name}")
    print(f"registered in {args.group} as {args.consumer_id}", flush=True)
    client.sock.settimeout(None)  # from here the coordinator talks; it pings every T/3
    while True:
        event = client.next_event()
        if isinstance(event, Request) and client.answer(event) and not args.forever:
            client.sock.close()
            return 0


if __name__ == "__main__":
    sys.exit(main())
