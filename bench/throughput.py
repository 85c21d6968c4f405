"""The data plane's rates, each next to a bare baseline measured in the same run.

Prints one JSON line per figure. The broker is a real ``python -m cli serve`` process on a
temporary data dir; the clients run here. The bare baseline is another process, a trio server
doing the broker's socket and file work with no protocol around it: receive a frame, CRC it,
append it to a file (fsync it under ``always``) and answer 8 bytes; or read a file range and send
it. Both servers get the same bytes: ready-made record batches of ``--batch-bytes``.

Figures (``--fsync`` never and always are separate runs):

* ``broker_produce`` / ``bare_produce``: a client sending ready-made batches, one request in
  flight, no Python object per record on either side;
* ``broker_fetch`` / ``bare_fetch``: a client reading whole batches back without decoding them;
* ``consumer_library``: ``open_consumer`` end to end, decoding every record's key and value
  through ``RecordStream.batches()`` (``ConsumerBatch.keys()`` and ``.values()``);
* ``producer_library``: ``Producer.enqueue`` (no checkpoint per record) then ``flush``;
* ``produce_check``: the broker's check of a Produce's batches, per batch, in this process: the
  CRC and header walk alone (all it did before issue 30) and with every record checked against
  its section (decompressed, for the JSON batches), beside the broker's whole produce round trip
  per batch from ``broker_produce``;
* ``compression``: zstd (and lz4) on compressible JSON values through the producer library:
  bytes on disk and on the wire, and the rates, next to no compression;
* ``broker_start_s`` (``--start-gib``, a run of its own): seconds from spawning a broker to every
  partition's first answered fetch, over a log written straight to its files: after an empty data
  dir (the process's own start), with no index files, after a clean stop, and after a kill -9
  that followed 10 MiB more acknowledged per partition.

    python bench/throughput.py --records 1000000 --value-bytes 100 --fsync always
"""

from __future__ import annotations

import argparse
import json
import os
import re
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from consumer import ConsumerSettings, ProducerConfig, open_consumer, open_producer
from protocol import (
    CreateTopicRequest,
    ErrorCode,
    FetchRequest,
    FetchResponse,
    ProduceRequest,
    ProduceResponse,
)
from protocol.batches import (
    BatchBuilder,
    Compression,
    batch_spans,
    build_batch,
    check_batches,
    walk_batches,
)
from transport.connect import connect_any, open_channel

ROOT = Path(__file__).resolve().parents[1]
FETCH_BYTES = 1024 * 1024
_FRAME = struct.Struct(">bi")  # op, length
_READ = struct.Struct(">qi")  # position, size


def emit(**figure: object) -> None:
    print(json.dumps({"benchmark": "throughput", **figure}), flush=True)


# --- the bare server ----------------------------------------------------------------------------


async def _receive_exactly(stream: trio.SocketStream, n: int, buf: bytearray) -> bytearray:
    while len(buf) < n:
        chunk = await stream.receive_some(max(65536, n - len(buf)))
        if not chunk:
            raise EOFError
        buf += chunk
    return buf


async def bare_server(port_file: Path, path: Path, fsync: bool) -> None:
    """Append frames to ``path`` (op 0) and serve its ranges (op 1), one connection at a time."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)

    async def serve(stream: trio.SocketStream) -> None:
        buf = bytearray()
        try:
            while True:
                buf = await _receive_exactly(stream, _FRAME.size, buf)
                op, length = _FRAME.unpack_from(buf)
                buf = await _receive_exactly(stream, _FRAME.size + length, buf)
                payload = bytes(buf[_FRAME.size : _FRAME.size + length])
                del buf[: _FRAME.size + length]
                if op == 0:
                    crc = zlib.crc32(payload)
                    os.write(fd, payload)
                    if fsync:
                        os.fsync(fd)
                    await stream.send_all(struct.pack(">q", crc))
                else:
                    position, size = _READ.unpack(payload)
                    data = os.pread(fd, size, position)
                    await stream.send_all(struct.pack(">i", len(data)) + data)
        except (EOFError, trio.BrokenResourceError):
            return

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port_file.write_text(str(listeners[0].socket.getsockname()[1]))
    await trio.serve_listeners(serve, listeners)


def start_bare(tmp: Path, fsync: str) -> tuple[subprocess.Popen[bytes], int]:
    port_file = tmp / "bare.port"
    process = subprocess.Popen(
        [sys.executable, __file__, "--bare-server", str(port_file), str(tmp / "bare.log"), fsync],
        cwd=ROOT,
    )
    deadline = time.monotonic() + 30
    while not port_file.exists() or not port_file.read_text():
        if time.monotonic() > deadline or process.poll() is not None:
            process.kill()
            raise SystemExit("the bare server did not start")
        time.sleep(0.02)
    return process, int(port_file.read_text())


async def bare_rates(port: int, batch: bytes, count: int) -> tuple[float, float]:
    """Seconds to append ``count`` copies of ``batch``, and to read them all back."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    frame = _FRAME.pack(0, len(batch)) + batch
    buf = bytearray()
    start = time.perf_counter()
    for _ in range(count):
        await stream.send_all(frame)
        buf = await _receive_exactly(stream, 8, buf)
        del buf[:8]
    produce = time.perf_counter() - start
    total = len(batch) * count
    start = time.perf_counter()
    position = 0
    while position < total:
        await stream.send_all(_FRAME.pack(1, _READ.size) + _READ.pack(position, FETCH_BYTES))
        buf = await _receive_exactly(stream, 4, buf)
        (size,) = struct.unpack_from(">i", buf)
        buf = await _receive_exactly(stream, 4 + size, buf)
        del buf[: 4 + size]
        position += size
    fetch = time.perf_counter() - start
    await stream.aclose()
    return produce, fetch


# --- the broker ---------------------------------------------------------------------------------


def start_broker(data_dir: Path, fsync: str) -> tuple[subprocess.Popen[bytes], int]:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cli",
            "--log-level",
            "WARNING",
            "serve",
            "--port",
            "0",
            "--data-dir",
            str(data_dir),
            "--fsync",
            fsync,
        ],
        stdout=subprocess.PIPE,
        cwd=ROOT,
    )
    assert process.stdout is not None
    line = process.stdout.readline().decode()
    match = re.search(r"serving on \S+:(\d+)", line)
    if match is None:
        process.kill()
        raise SystemExit(f"broker did not start: {line!r}")
    return process, int(match.group(1))


async def broker_rates(
    port: int, batch: bytes, count: int, records: int, pid: int
) -> tuple[float, float, float]:
    """Seconds to produce ``count`` ready-made batches one request at a time, and to fetch them
    back as whole batches, walking only their headers; and the broker's CPU seconds (user and
    system, ``pid``'s) for the produces."""
    stream, _ = await connect_any([("127.0.0.1", port)])
    async with open_channel(stream, client_id="bench", max_frame_size=8 * FETCH_BYTES) as channel:
        await channel.request(CreateTopicRequest(topic="raw", partitions=1))
        request = ProduceRequest(topic="raw", partition=0, records=(), batches=batch)
        cpu_start = process_cpu_s(pid)
        start = time.perf_counter()
        for _ in range(count):
            response = await channel.request(request)
            assert isinstance(response, ProduceResponse), response
            assert response.error_code is ErrorCode.NONE, response
        produce = time.perf_counter() - start
        produce_cpu = process_cpu_s(pid) - cpu_start
        start = time.perf_counter()
        offset = 0
        while offset < records:
            answer = await channel.request(
                FetchRequest(topic="raw", partition=0, offset=offset, max_bytes=FETCH_BYTES)
            )
            assert isinstance(answer, FetchResponse) and answer.batches, answer.error_code
            for _, _, base, n, _ in walk_batches(answer.batches, check_crc=False):
                offset = base + n
        fetch = time.perf_counter() - start
    return produce, fetch, produce_cpu


def process_cpu_s(pid: int) -> float:
    """User and system CPU seconds of process ``pid`` so far (Linux's /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def library_rates(
    port: int,
    topic: str,
    values: list[bytes],
    batch_bytes: int,
    compression: Compression,
) -> tuple[float, float]:
    """Seconds for the producer library to send ``values``, and for the consumer library to
    decode them all back (keys and values, through the batch API; the first batch, which waits
    for the group to form, is left out and the rate scaled to every record)."""
    address = ("127.0.0.1", port)
    stream, _ = await connect_any([address])
    async with open_channel(stream, client_id="bench") as channel:
        await channel.request(CreateTopicRequest(topic=topic, partitions=1))
    config = ProducerConfig(
        linger=0.005,
        max_batch_bytes=batch_bytes,
        max_batch_records=1_000_000,
        compression=compression,
        max_pending_records=max(100_000, 4 * batch_bytes // 16),
    )
    start = time.perf_counter()
    async with open_producer([address], config=config) as producer:
        await producer.partitions_for(topic)
        enqueue = producer.enqueue_nowait
        for i, value in enumerate(values):
            try:
                enqueue(topic, value)
            except trio.WouldBlock:  # max_pending_records unacknowledged: wait for room
                await producer.enqueue(topic, value)
            if i % 5000 == 4999:
                await trio.sleep(0)
        await producer.flush()
    produce = time.perf_counter() - start

    settings = ConsumerSettings(auto_offset_reset="smallest", session_timeout=30.0)
    group = f"bench-{topic}"
    async with open_consumer([address], group, topics={topic: 1}, settings=settings) as consumer:
        (records,) = consumer.streams_for(topic)
        batches = records.batches()
        first = await anext(batches)  # timed from here: the group formed, the first fetch answered
        skipped = len(first.values())
        received = skipped
        start = time.perf_counter()
        while received < len(values):
            batch = await anext(batches)
            keys, decoded = batch.keys(), batch.values()
            assert len(keys) == len(decoded)
            received += len(decoded)
        consume = time.perf_counter() - start
    per_record = consume / max(1, received - skipped)
    return produce, per_record * len(values)


def log_bytes(data_dir: Path, topic: str) -> int:
    return sum(p.stat().st_size for p in (data_dir / "log" / f"{topic}-0").glob("*.log"))


def json_values(n: int) -> list[bytes]:
    """Compressible JSON events, about 200 bytes each, as a click stream would have them."""
    return [
        json.dumps(
            {
                "user": f"user-{i % 1000:04d}",
                "event": ("view", "click", "purchase")[i % 3],
                "page": f"/products/{i % 97}/details",
                "ts": 1_700_000_000_000 + i,
                "session": f"s-{i // 50:08d}",
                "amount": (i % 13) * 1.5,
            }
        ).encode()
        for i in range(n)
    ]


# --- start time with a large log ----------------------------------------------------------------


async def first_answered_fetch(port: int, partitions: int) -> None:
    """Wait until every partition answers a fetch at offset 0 (a poll, as a client would)."""
    while True:
        try:
            stream, _ = await connect_any([("127.0.0.1", port)])
            async with open_channel(stream, client_id="bench") as channel:
                for p in range(partitions):
                    answer = await channel.request(
                        FetchRequest(topic="big", partition=p, offset=0, max_bytes=1)
                    )
                    assert isinstance(answer, FetchResponse), answer
                    assert answer.error_code is ErrorCode.NONE, answer.error_code
                return
        except OSError:
            await trio.sleep(0.005)


def timed_start(data_dir: Path, partitions: int) -> tuple[subprocess.Popen[bytes], int, float]:
    """Seconds from spawning the broker to every partition's first answered fetch."""
    start = time.perf_counter()
    process, port = start_broker(data_dir, "always")
    trio.run(first_answered_fetch, port, partitions)
    return process, port, time.perf_counter() - start


async def create_big(port: int, partitions: int) -> None:
    stream, _ = await connect_any([("127.0.0.1", port)])
    async with open_channel(stream, client_id="bench") as channel:
        await channel.request(CreateTopicRequest(topic="big", partitions=partitions))


async def produce_more(port: int, partitions: int, batch: bytes, count: int) -> None:
    stream, _ = await connect_any([("127.0.0.1", port)])
    async with open_channel(stream, client_id="bench") as channel:
        for _ in range(count):
            for p in range(partitions):
                answer = await channel.request(
                    ProduceRequest(topic="big", partition=p, records=(), batches=batch)
                )
                assert isinstance(answer, ProduceResponse), answer
                assert answer.error_code is ErrorCode.NONE, answer.error_code


def fill_log(data_dir: Path, partitions: int, total: int, batch: bytes, per_batch: int) -> None:
    """``total`` bytes of stamped batches spread over the partitions' first segments, written
    straight to the files (a broker producing 1 GiB here would take minutes of CPU)."""
    per_partition = total // partitions
    count = max(1, per_partition // len(batch))
    for p in range(partitions):
        path = data_dir / "log" / f"big-{p}" / f"{0:020d}.log"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as f:
            for i in range(count):
                f.write(struct.pack(">q", i * per_batch) + batch[8:])
            f.flush()
            os.fsync(f.fileno())


def start_figures(gib: float, batch_bytes: int, value_bytes: int, partitions: int) -> None:
    value = b"x" * value_bytes
    per_batch = max(1, batch_bytes // (value_bytes + 12))
    batch = build_batch([value] * per_batch)
    total = int(gib * 2**30)
    with tempfile.TemporaryDirectory() as tmp_name:
        data_dir = Path(tmp_name) / "data"
        process, port, empty_s = timed_start(data_dir, 0)
        trio.run(create_big, port, partitions)
        process.terminate()
        process.wait(60)
        fill_log(data_dir, partitions, total, batch, per_batch)
        on_disk = sum(p.stat().st_size for p in (data_dir / "log").glob("big-*/*.log"))
        common = {"bytes": on_disk, "partitions": partitions, "segment_bytes": 64 * 2**20}
        emit(figure="broker_start_s", after="an empty data dir", seconds=round(empty_s, 3))
        more = 10 * 2**20 // len(batch) + 1
        for after in ("no index (files written behind its back)", "a clean stop", "a kill -9"):
            process, port, seconds = timed_start(data_dir, partitions)
            emit(figure="broker_start_s", after=after, seconds=round(seconds, 3), **common)
            if after == "a clean stop":
                # 10 MiB more acknowledged per partition, then a crash before any clean stop
                trio.run(produce_more, port, partitions, batch, more)
                process.kill()
            else:
                process.terminate()
            process.wait(60)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--batch-bytes", type=int, default=256 * 1024, help="a batch's size")
    parser.add_argument("--fsync", choices=["always", "interval", "never"], default="always")
    parser.add_argument("--compression-records", type=int, default=None, metavar="N")
    parser.add_argument(
        "--start-gib",
        type=float,
        default=None,
        metavar="GIB",
        help="only the start-time figures, with this much log over --start-partitions",
    )
    parser.add_argument("--start-partitions", type=int, default=16)
    parser.add_argument("--bare-server", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.start_gib is not None:
        start_figures(args.start_gib, args.batch_bytes, args.value_bytes, args.start_partitions)
        return 0
    if args.bare_server:
        port_file, path, fsync = args.bare_server
        trio.run(bare_server, Path(port_file), Path(path), fsync == "always")
        return 0

    value = b"x" * args.value_bytes
    per_batch = max(1, args.batch_bytes // (args.value_bytes + 12))
    count = max(1, args.records // per_batch)
    records = count * per_batch
    batch = build_batch([value] * per_batch)
    common = {
        "records": records,
        "value_bytes": args.value_bytes,
        "batch_records": per_batch,
        "batch_bytes": len(batch),
        "fsync": args.fsync,
    }
    total_bytes = len(batch) * count
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        bare, bare_port = start_bare(tmp, args.fsync)
        try:
            bare_produce, bare_fetch = trio.run(bare_rates, bare_port, batch, count)
        finally:
            bare.kill()
            bare.wait(10)
        (tmp / "bare.log").unlink()
        data_dir = tmp / "data"
        process, port = start_broker(data_dir, args.fsync)
        try:
            produce, fetch, produce_cpu = trio.run(
                broker_rates, port, batch, count, records, process.pid
            )
            values = [value] * records
            lib_produce, lib_consume = trio.run(
                library_rates, port, "lib", values, args.batch_bytes, Compression.NONE
            )
            compressed: dict[str, tuple[float, float, int]] = {}
            n_json = args.compression_records or min(records, 200_000)
            events = json_values(n_json)
            for codec in (Compression.NONE, Compression.ZSTD, Compression.LZ4):
                topic = f"json-{codec.name.lower()}"
                p, c = trio.run(library_rates, port, topic, events, args.batch_bytes, codec)
                compressed[codec.name.lower()] = (p, c, log_bytes(data_dir, topic))
        finally:
            process.terminate()
            process.wait(30)

    for path, broker_s, bare_s in (
        ("produce", produce, bare_produce),
        ("fetch", fetch, bare_fetch),
    ):
        emit(
            figure=f"broker_{path}",
            records_per_s=round(records / broker_s),
            mb_per_s=round(total_bytes / broker_s / 1e6, 1),
            bare_records_per_s=round(records / bare_s),
            bare_mb_per_s=round(total_bytes / bare_s / 1e6, 1),
            ratio=round(bare_s / broker_s, 3),
            target_ratio=0.5,
            **common,
        )
    emit(
        figure="broker_produce_cpu",
        cpu_us_per_produce=round(produce_cpu / count * 1e6, 1),
        produces=count,
        **common,
    )
    emit(
        figure="consumer_library",
        api="RecordStream.batches(): ConsumerBatch.keys() and .values()",
        records_per_s=round(records / lib_consume),
        target_records_per_s=500_000,
        **common,
    )
    emit(
        figure="producer_library",
        api="Producer.enqueue_nowait (a checkpoint every 5000 records), then flush",
        records_per_s=round(records / lib_produce),
        target_records_per_s=300_000,
        **common,
    )
    round_trip_us = produce / count * 1e6
    check_batches_of = [("raw", batch)] + [
        (f"json-{codec.name.lower()}", _json_batch(events, args.batch_bytes, codec))
        for codec in (Compression.NONE, Compression.ZSTD, Compression.LZ4)
    ]
    for name, checked in check_batches_of:
        crc_us, whole_us = check_cost(checked)
        emit(
            figure="produce_check",
            batch=name,
            batch_bytes=len(checked),
            crc_only_us=round(crc_us, 1),
            whole_us=round(whole_us, 1),
            ratio=round(whole_us / crc_us, 2),
            broker_produce_round_trip_us=round(round_trip_us, 1) if name == "raw" else None,
            fsync=args.fsync,
        )
    raw = sum(len(v) for v in events)
    plain = compressed["none"]
    for name, (p, c, on_disk) in compressed.items():
        emit(
            figure="compression",
            codec=name,
            records=n_json,
            value_bytes_total=raw,
            bytes_on_disk=on_disk,
            bytes_on_wire=on_disk,  # a fetch answers the stored batches byte for byte
            ratio_to_uncompressed=round(on_disk / plain[2], 3),
            produce_records_per_s=round(n_json / p),
            consume_records_per_s=round(n_json / c),
            produce_cost=round(p / plain[0], 3),
            consume_cost=round(c / plain[1], 3),
            fsync=args.fsync,
        )
    return 0


def _json_batch(values: list[bytes], batch_bytes: int, codec: Compression) -> bytes:
    """The first batch the producer library would build of ``values``."""
    builder = BatchBuilder(compression=codec, max_bytes=batch_bytes)
    for value in values:
        if not builder.append(value):
            break
    return builder.build()


def check_cost(batch: bytes, rounds: int = 200) -> tuple[float, float]:
    """Microseconds per batch (best of five runs of ``rounds``): what the broker checked before
    issue 30 (headers and CRC), and what it checks now (that, and every record's section)."""

    def best(check: Callable[[], object]) -> float:
        runs = []
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(rounds):
                check()
            runs.append((time.perf_counter() - start) / rounds * 1e6)
        return min(runs)

    crc = best(lambda: batch_spans(batch))
    whole = best(lambda: check_batches(batch, batch_spans(batch)))
    return crc, whole


if __name__ == "__main__":
    sys.exit(main())
