"""Random and mutated frames from many connections at a real coordinator, while a well-behaved group
is being served: the group stays served, every fuzz connection is answered or closed, and the broker
logs no traceback and nothing at ERROR.

One test per class of input (:class:`tests.fuzz.frames.Kind`), each example a fresh broker on the
embedded store over in-memory connections on an autojump MockClock (so the deadlines below are
virtual seconds), driven by ``trio.run`` because hypothesis runs the body once per example.
``scripts/fuzz_broker.py`` throws the same frames at a real broker process for as long as asked.

``KNOWN_FAILURES`` and ``NOT_RUN`` name the classes the broker is known to fail on, with the
reason; both are empty, so the test holds the broker to every class.
"""

from __future__ import annotations

import logging
import random
import tempfile
import unicodedata
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import trio
import trio.testing
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from coordinator.config import CoordinatorConfig
from simulation import SimulatedCluster, open_simulated_cluster
from tests.fuzz.frames import (
    SERVED_GROUP,
    SERVED_TOPIC,
    Kind,
    Script,
    connection_script,
    converse,
)
from transport.limits import ConnectionLimits

CONFIG = CoordinatorConfig(initial_rebalance_delay=1.0, max_frame_size=1024 * 1024)
SERVED_MEMBERS = 3
SERVED_PARTITIONS = 6
CONNECTIONS = 12
"""Fuzz connections per example, opened at random instants of the first ``SPREAD`` seconds."""
SPREAD = 5.0
ANSWER_DEADLINE = ConnectionLimits().frame_timeout + 30.0
"""Virtual seconds a fuzz connection waits for the broker to answer every intact request or close
(a frame that never ends is closed after the frame timeout)."""
SETTLE_DEADLINE = 60.0
EXAMPLES = 8

KNOWN_FAILURES: dict[Kind, str] = {}
"""Classes the broker is known to fail on (xfail, not strict): an entry goes once its fix is in."""
NOT_RUN: dict[Kind, str] = {}
"""Classes that would take the test machine down with the broker (not run): an entry goes once its
fix is in."""


def _marks(kind: Kind) -> list[pytest.MarkDecorator]:
    if kind in NOT_RUN:
        return [pytest.mark.xfail(run=False, reason=NOT_RUN[kind])]
    if kind in KNOWN_FAILURES:
        return [pytest.mark.xfail(strict=False, reason=KNOWN_FAILURES[kind])]
    return []


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "kind", [pytest.param(kind, marks=_marks(kind), id=kind.value) for kind in Kind]
)
@settings(max_examples=EXAMPLES, phases=(Phase.explicit, Phase.reuse, Phase.generate))
@given(rng=st.randoms(use_true_random=False))
def test_fuzzed_connections_do_not_disturb_a_served_group(kind: Kind, rng: random.Random) -> None:
    scripts = [
        connection_script(rng, kind, max_frame_size=CONFIG.max_frame_size)
        for _ in range(CONNECTIONS)
    ]
    starts = sorted(rng.uniform(0, SPREAD) for _ in scripts)
    try:
        with _broker_log() as records, tempfile.TemporaryDirectory() as data_dir:
            trio.run(
                _fuzz,
                Path(data_dir),
                scripts,
                starts,
                clock=trio.testing.MockClock(autojump_threshold=0),
            )
        _check_log(records)
    except BaseException as exc:
        exc.add_note("\n".join(script.describe() for script in scripts))
        raise


async def _fuzz(data_dir: Path, scripts: list[Script], starts: list[float]) -> None:
    async with open_simulated_cluster(data_dir, CONFIG) as cluster:
        await cluster.create_topic(SERVED_TOPIC, partitions=SERVED_PARTITIONS)
        for i in range(SERVED_MEMBERS):
            await cluster.start_consumer(
                f"served-{i}", group=SERVED_GROUP, topics={SERVED_TOPIC: 1}
            )
        with trio.fail_after(SETTLE_DEADLINE):
            await cluster.wait_settled()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_monitor, cluster)
            async with trio.open_nursery() as connections:
                for script, start in zip(scripts, starts, strict=True):
                    connections.start_soon(_fuzz_connection, cluster, script, start)
            nursery.cancel_scope.cancel()
        with trio.fail_after(SETTLE_DEADLINE):
            await cluster.wait_settled()
        await cluster.check_invariants(settled=True)
        assert cluster.coordinator.group(SERVED_GROUP).members.keys() == {
            f"served-{i}" for i in range(SERVED_MEMBERS)
        }


async def _monitor(cluster: SimulatedCluster) -> None:
    """The invariants that hold at every instant, checked every virtual second of the fuzzing."""
    while True:
        await cluster.check_invariants()
        await trio.sleep(1.0)


async def _fuzz_connection(cluster: SimulatedCluster, script: Script, start: float) -> None:
    await trio.sleep(start)
    answers, done = await converse(
        await cluster.connect(), script, answer_timeout=ANSWER_DEADLINE, linger=script.linger
    )
    if not done:
        raise AssertionError(
            f"the broker neither answered {sorted(script.expected - answers.answered)} "
            f"nor closed within {ANSWER_DEADLINE} s:\n{script.describe()}"
        )


# --- the broker's log ---------------------------------------------------------------------------


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextmanager
def _broker_log() -> Iterator[list[logging.LogRecord]]:
    """Every record the broker logs at INFO and above while the block runs."""
    handler = _Records()
    logger = logging.getLogger()
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield handler.records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def _check_log(records: list[logging.LogRecord]) -> None:
    """A peer's bad input may be logged as a warning, never as an error or with a traceback, and
    what it sent must not forge a line (no control characters reach the log)."""
    bad = [r for r in records if r.levelno >= logging.ERROR or r.exc_info is not None]
    assert not bad, "the broker logged:\n" + "\n".join(
        f"{r.levelname} {r.name}: {r.getMessage()}" for r in bad
    )
    forged = [r for r in records if any(_control(c) for c in r.getMessage())]
    assert not forged, "control characters in the log:\n" + "\n".join(
        repr(r.getMessage()) for r in forged
    )


def _control(char: str) -> bool:
    return unicodedata.category(char) in ("Cc", "Zl", "Zp")
