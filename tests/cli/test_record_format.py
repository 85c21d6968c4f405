"""``consume --format`` reads kcat's ``-f`` templates, and refuses what it cannot print;
``--offset`` takes kcat's and the console consumer's ways to name where to start."""

from __future__ import annotations

import pytest

from cli.data import RecordFormat, _From, start_at
from cli.main import _parser
from protocol.batches import BatchBuilder, batch_at, walk_batches
from protocol.types import TopicPartition


def test_a_template_prints_every_field_of_a_record() -> None:
    builder = BatchBuilder()
    builder.append(b"v0", None, 1_000, ())
    builder.append(b"v1", b"k1", 2_000, (("a", b"1"), ("b", None)))
    buf = builder.build()  # offsets from 0, as the producer sends them
    ((position, size, *_),) = list(walk_batches(buf))
    records = _From(batch_at(buf, position, size), 0)
    template = RecordFormat.parse(r"%t/%p@%o %T [%k|%K] %s %S {%h} 100%%\t.\n")
    assert template.render("t", 3, records) == [
        b"t/3@0 1000 [|-1] v0 2 {} 100%\t.\n",
        b"t/3@1 2000 [k1|2] v1 2 {a=1,b} 100%\t.\n",
    ]
    assert RecordFormat.parse("%o").render("t", 3, _From(records.batch, 1)) == [b"1"]


@pytest.mark.parametrize(
    ("template", "error"),
    [
        ("%x", "unknown field %x"),
        ("%s\\q", r"unknown escape \q"),
        ("%s %", "ends in '%'"),
        ("%s \\", r"ends in '\\'"),
    ],
)
def test_a_template_with_an_unknown_field_is_refused(template: str, error: str) -> None:
    with pytest.raises(SystemExit):
        _parser().parse_args(["consume", "t", "--format", template])
    with pytest.raises(Exception, match=error.replace("\\", "\\\\")):
        RecordFormat.parse(template)


@pytest.mark.parametrize(
    ("offset", "at"), [("beginning", 5), ("end", 9), (-3, 6), (-100, 5), (7, 7), (9, 9)]
)
def test_where_an_offset_starts(offset: str | int, at: int) -> None:
    assert start_at(offset, TopicPartition(topic="t", partition=0), 5, 9) == at


def test_an_offset_outside_the_log_is_refused() -> None:
    with pytest.raises(ValueError, match=r"offset 4 is outside t-0's log \[5, 9\]"):
        start_at(4, TopicPartition(topic="t", partition=0), 5, 9)
