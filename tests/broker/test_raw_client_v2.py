"""The third-party client example answering version 2 of StopFetcher, over a socket pair (no
broker): a revocation is answered and reported, a fenced stop is answered before the client
closes the connection and exits for good (protocol/SPEC.md §11.5, §11.11)."""

from __future__ import annotations

import importlib.util
import socket
import time
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest

from launch.processes import REPO
from protocol import (
    NEED_DATA,
    AssignedPartition,
    AssignedStream,
    Connection,
    ConnectionClosed,
    ErrorCode,
    PingRequest,
    Request,
    Response,
    Role,
    StartFetcherRequest,
    StopFetcherRequest,
    StopFetcherResponse,
)
from protocol.types import BrokerInfo, TopicPartition
from statemachine import consumer as sm

CONFIG = sm.ConsumerConfig(session_timeout=60.0)


def raw_client_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("raw_client", REPO / "examples" / "raw_client.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def pair() -> Iterator[tuple[Any, socket.socket, Connection]]:
    """The example's client on one end of a socket pair, registered and fetching raw 0-2 (its
    machine told so directly, and the StartFetcher answered); the coordinator's side on the
    other."""
    module = raw_client_module()
    ours, theirs = socket.socketpair()
    client = module.RawClient(theirs, "g", "raw-1", sm.ConsumerMachine(config=CONFIG))
    coordinator = Connection(Role.BROKER)
    here = BrokerInfo(broker_id=1, host="127.0.0.1", port=9092)
    now = time.monotonic()
    client.machine.handle(sm.Start())
    client.machine.handle(sm.CoordinatorFound(now=now, coordinator=here, epoch=1))
    client.machine.handle(sm.Registered(now=now, anchor=now, generation=2, epoch=1))
    assigned = tuple(
        AssignedPartition(topic="raw", partition=p, offset=-1, broker_id=1) for p in range(3)
    )
    start = StartFetcherRequest(
        coordinator_epoch=1,
        generation=2,
        consumer_id="raw-1",
        streams=(AssignedStream(stream_id="raw-1-0", partitions=assigned),),
        brokers=(here,),
    )
    assert client.answer(ask(client, ours, coordinator, start)) is True
    assert isinstance(read(ours, coordinator), Response)
    yield client, ours, coordinator
    ours.close()
    theirs.close()


def ask(client: Any, sock: socket.socket, coordinator: Connection, message: Any) -> Request:
    request = coordinator.new_request(message)
    sock.sendall(coordinator.send(request))
    event = client.next_event()
    assert isinstance(event, Request)
    return event


def read(sock: socket.socket, coordinator: Connection) -> object:
    while (event := coordinator.next_event()) is NEED_DATA:
        coordinator.receive_data(sock.recv(65536))
    return event


def stop(**fields: Any) -> StopFetcherRequest:
    return StopFetcherRequest(coordinator_epoch=1, generation=2, consumer_id="raw-1", **fields)


def test_a_revocation_is_answered_and_reported(
    pair: tuple[Any, socket.socket, Connection], capsys: pytest.CaptureFixture[str]
) -> None:
    client, sock, coordinator = pair
    capsys.readouterr()  # the assignment
    revoke = stop(partitions=(TopicPartition(topic="raw", partition=2),))
    assert client.answer(ask(client, sock, coordinator, revoke)) is False
    response = read(sock, coordinator)
    assert isinstance(response, Response) and isinstance(response.message, StopFetcherResponse)
    assert response.message.error_code is ErrorCode.NONE
    assert capsys.readouterr().out == 'revoked [["raw", 2]]\n'


def test_a_fenced_stop_is_answered_then_the_client_closes_and_exits(
    pair: tuple[Any, socket.socket, Connection], capsys: pytest.CaptureFixture[str]
) -> None:
    client, sock, coordinator = pair
    request = ask(client, sock, coordinator, stop(reason=ErrorCode.FENCED_INSTANCE_ID))
    with pytest.raises(SystemExit) as exited:
        client.answer(request)
    assert exited.value.code == 3
    response = read(sock, coordinator)
    assert isinstance(response, Response) and isinstance(response.message, StopFetcherResponse)
    assert isinstance(read(sock, coordinator), ConnectionClosed)  # then a clean close
    assert "fenced" in capsys.readouterr().out


def test_a_request_read_after_the_lease_ran_out_is_not_answered_and_the_client_stops() -> None:
    """The machine, not the script, decides: a Ping that comes after the lease ran out (the
    coordinator was silent for longer than T) finds the member stopped; it closes and exits."""
    module = raw_client_module()
    ours, theirs = socket.socketpair()
    with ours, theirs:
        client = module.RawClient(theirs, "g", "raw-1", sm.ConsumerMachine(config=CONFIG))
        coordinator = Connection(Role.BROKER)
        here = BrokerInfo(broker_id=1, host="127.0.0.1", port=9092)
        now = time.monotonic()
        client.machine.handle(sm.Start())
        client.machine.handle(sm.CoordinatorFound(now=now, coordinator=here, epoch=1))
        # Registered with a frame queued 2 T ago: the lease ran out T ago.
        anchor = now - 2 * CONFIG.session_timeout
        client.machine.handle(sm.Registered(now=now, anchor=anchor, generation=2, epoch=1))
        ping = PingRequest(coordinator_epoch=1, generation=2, consumer_id="raw-1", num_retries=0)
        request = ask(client, ours, coordinator, ping)
        with pytest.raises(SystemExit):
            client.answer(request)
        assert isinstance(read(ours, coordinator), ConnectionClosed)  # closed, not answered
