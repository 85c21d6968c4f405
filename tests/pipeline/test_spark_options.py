"""The Spark source's mistakes a user makes, each one clear line: a misspelt option, a topic
that does not exist, a broker that is not there; and ``register`` pointing Spark's Python workers
at this interpreter. The driver-side planning is called as Spark calls it, without a JVM."""

from __future__ import annotations

import socket
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from pipeline import OptionError, error_line, register
from pipeline.local import local_broker
from pipeline.source import BatchReader, BatchWriter, StreamWriter
from pipeline.wire import Cluster, PipelineError


def test_a_misspelt_read_option_is_an_error_naming_the_known_ones() -> None:
    with pytest.raises(ValueError) as raised:
        BatchReader({"topic": "events", "groupId": "g", "startingOffset": "earliest"})
    message = str(raised.value)
    assert message.startswith(
        "unknown options 'groupId', 'startingOffset' for reading format coordinator; "
        "the known options are bootstrap, endingOffsets, group, maxRecordsPerTrigger, "
    )
    assert "startingOffsets" in message and "sasl.user" in message
    # Spark lowercases the keys it hands over: the right names still pass
    BatchReader({"topic": "events", "group": "g", "startingoffsets": "earliest"})


def test_a_kafka_sources_option_names_this_sources_own() -> None:
    with pytest.raises(OptionError) as raised:
        # as Spark hands a streaming read's keys over: lowercased
        BatchReader({"kafka.bootstrap.servers": "b:9092", "subscribepattern": "ev.*"})
    assert str(raised.value).startswith(
        "unknown options 'kafka.bootstrap.servers' (Kafka's; here: bootstrap), "
        "'subscribepattern' (Kafka's; here: pattern) for reading format coordinator; "
    )
    with pytest.raises(OptionError, match=r"'maxOffsetsPerTrigger' \(Kafka's; here: maxRecords"):
        BatchReader({"topic": "t", "maxOffsetsPerTrigger": "100"})
    with pytest.raises(OptionError, match=r"'kafka.bootstrap.servers' \(Kafka's; here: bootstrap"):
        BatchWriter({"topic": "t", "kafka.bootstrap.servers": "b:9092"})


def test_the_line_of_a_sources_error_is_found_inside_sparks_exception() -> None:
    """As Spark 4 wraps it: its error class, the worker's traceback, the SQL state."""
    wrapped = Exception(
        "[PYTHON_DATA_SOURCE_ERROR] Failed to create Python data source instance: Traceback "
        "(most recent call last):\n"
        '  File "pipeline/source.py", line 96, in schema\n'
        "    check_options(...)\n"
        "pipeline.offsets.OptionError: unknown option 'subscribe' (Kafka's; here: topics (or "
        "topic)) for format coordinator; the known options are bootstrap SQLSTATE: 38000"
    )
    assert error_line(wrapped) == (
        "unknown option 'subscribe' (Kafka's; here: topics (or topic)) for format coordinator; "
        "the known options are bootstrap"
    )
    assert error_line(Exception("[STREAM_FAILED] ... ValueError: something else")) is None


def test_a_misspelt_write_option_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown option 'topics' for writing format coordinator"):
        StreamWriter({"topics": "out"})
    with pytest.raises(ValueError, match="unknown option 'path' for writing format coordinator"):
        BatchWriter({"topic": "out", "path": "/tmp/out"})  # save(path): the topic is the target


def test_the_options_spark_hands_a_named_streaming_sink_are_accepted() -> None:
    # as a named query's sink gets them (lowercased) besides the user's own
    StreamWriter({"topic": "out", "checkpointlocation": "/tmp/c", "queryname": "totals"})


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_an_unreachable_broker_is_one_clear_line() -> None:
    port = free_port()
    with (
        Cluster(f"127.0.0.1:{port}") as cluster,
        pytest.raises(
            PipelineError,
            match=rf"^cannot reach any broker of the bootstrap list: "
            rf"cannot reach broker 127\.0\.0\.1:{port}: ",
        ),
    ):
        cluster.placements(["events"])


@pytest.fixture(scope="module")
def bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with local_broker(tmp_path_factory.mktemp("options") / "broker") as address:
        yield address


@pytest.mark.realtime
def test_an_unknown_topic_is_one_clear_line(bootstrap: str) -> None:
    reader = BatchReader({"bootstrap": bootstrap, "topic": "no-such-topic"})
    with pytest.raises(
        PipelineError, match=f"^topic 'no-such-topic' does not exist at {bootstrap}$"
    ):
        reader.partitions()


class FakeContext:
    def __init__(self, conf: dict[str, str]) -> None:
        self.pythonExec = "python3"
        self.conf = conf

    def getConf(self) -> dict[str, str]:
        return self.conf


class FakeSession:
    def __init__(self, conf: dict[str, str]) -> None:
        self.sparkContext = FakeContext(conf)
        self.registered: list[Any] = []
        self.dataSource = self

    def register(self, source: Any) -> None:
        self.registered.append(source)


def test_register_makes_the_workers_run_this_interpreter_when_pyspark_python_is_unset(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    session = FakeSession({})
    register(session)
    assert session.sparkContext.pythonExec == sys.executable
    assert session.registered

    # a choice the user made is left alone
    monkeypatch.setenv("PYSPARK_PYTHON", "/opt/env/bin/python")
    chosen = FakeSession({})
    register(chosen)
    assert chosen.sparkContext.pythonExec == "python3"
    monkeypatch.delenv("PYSPARK_PYTHON")
    configured = FakeSession({"spark.pyspark.python": "/opt/env/bin/python"})
    register(configured)
    assert configured.sparkContext.pythonExec == "python3"
