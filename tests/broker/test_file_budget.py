"""A real broker under a small file limit: records written to more partitions than the limit
allows files, or more idle connections to the metrics port than it allows sockets, and the
broker still answers its clients, old and new (docs/limits.md#files)."""

from __future__ import annotations

import contextlib
import re
import urllib.request
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
import trio

from launch.processes import BrokerProcess, run_broker
from protocol import (
    CreateTopicRequest,
    CreateTopicResponse,
    ErrorCode,
    FetchRequest,
    FetchResponse,
    ListGroupsRequest,
    ListGroupsResponse,
    ProduceRequest,
    ProduceResponse,
)
from protocol.batches import records_from_batches
from protocol.records import Record
from tests.broker.test_hostile_connections import DEADLINE, client

pytestmark = pytest.mark.realtime

#: RLIMIT_NOFILE of the broker: a budget of 128 files, 64 of them kept for segment files.
FILE_LIMIT = 256
#: Partitions written, each with a file of its own: more than the whole file limit.
PARTITIONS = 300
_METRICS_URL = re.compile(r"metrics and status page on http://([\d.]+):(\d+)/")


async def answers(broker: BrokerProcess, clients: int = 3) -> None:
    """New clients connect and are answered, each within the deadline."""
    for _ in range(clients):
        async with client(broker) as channel:
            with trio.fail_after(DEADLINE):
                response = await channel.request(ListGroupsRequest())
            assert isinstance(response, ListGroupsResponse)
            assert response.error_code is ErrorCode.NONE


def value(partition: int) -> bytes:
    return f"record of partition {partition}".encode()


@pytest.mark.parametrize("fsync", ["always", "interval"])
async def test_records_in_more_partitions_than_the_file_limit_are_written_and_read(
    tmp_path: Path, fsync: str
) -> None:
    """Under ``interval`` the files to close are not flushed yet: each is fsynced first."""
    async with (
        run_broker(tmp_path / "data", "--fsync", fsync, file_limit=FILE_LIMIT) as broker,
        client(broker) as channel,
    ):
        assert f"file limit {FILE_LIMIT} (hard {FILE_LIMIT}): 128 files" in broker.log_text()
        with trio.fail_after(DEADLINE):
            created = await channel.request(CreateTopicRequest(topic="wide", partitions=PARTITIONS))
        assert isinstance(created, CreateTopicResponse)
        assert created.error_code is ErrorCode.NONE
        for p in range(PARTITIONS):
            record = Record(offset=-1, timestamp_ms=1, key=None, value=value(p))
            with trio.fail_after(DEADLINE):
                produced = await channel.request(
                    ProduceRequest(topic="wide", partition=p, records=(record,))
                )
            assert isinstance(produced, ProduceResponse)
            assert (p, produced.error_code, produced.base_offset) == (p, ErrorCode.NONE, 0)
        await answers(broker)
        for p in range(PARTITIONS):  # each file reopened, most of them, since evicted
            with trio.fail_after(DEADLINE):
                fetched = await channel.request(
                    FetchRequest(topic="wide", partition=p, offset=0, max_bytes=65536)
                )
            assert isinstance(fetched, FetchResponse)
            assert fetched.error_code is ErrorCode.NONE
            assert [r.value for r in records_from_batches(fetched.batches, 0)] == [value(p)]
        await answers(broker)
        assert "Too many open files" not in broker.log_text()
        assert broker.process.returncode is None


async def test_idle_connections_to_the_metrics_port_leave_the_broker_its_files(
    tmp_path: Path,
) -> None:
    async with (
        run_broker(tmp_path / "data", "--metrics-port", "0", file_limit=FILE_LIMIT) as broker,
        AsyncExitStack() as idle,
    ):
        match = _METRICS_URL.search(broker.log_text())
        assert match is not None, broker.log_text()
        host, port = match.group(1), int(match.group(2))
        for _ in range(FILE_LIMIT + 50):  # each sends nothing, and keeps its socket open
            with trio.fail_after(DEADLINE):
                stream = await trio.open_tcp_stream(host, port)
            idle.push_async_callback(stream.aclose)
        await answers(broker)
        await idle.aclose()
        url = f"http://{host}:{port}/metrics"
        with trio.fail_after(DEADLINE):
            while True:  # the port itself serves again once the idle ones are gone
                with contextlib.suppress(OSError):
                    body = await trio.to_thread.run_sync(_get, url)
                    break
                await trio.sleep(0.1)
        assert "coordinator_" in body
        assert "refused a connection" in broker.log_text()
        assert "Too many open files" not in broker.log_text()


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=DEADLINE) as response:
        body: bytes = response.read()
        return body.decode()
