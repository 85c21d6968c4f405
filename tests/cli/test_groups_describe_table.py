"""``groups describe``'s table: COMMITTED is durable only, REPORTED what is not written yet."""

from __future__ import annotations

import argparse
import json

import pytest

from cli.admin import _groups_describe
from consumer.admin import GroupReport, MemberReport, PartitionLag
from protocol.types import TopicPartition
from tests.support.invisible import DISGUISED, INVISIBLE, shown_escaped


async def test_the_text_table_shows_a_reported_offset_apart_from_the_committed_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    report = GroupReport(
        group="g",
        state="Stable",
        generation=3,
        members=(MemberReport(id="m", partitions=(TopicPartition(topic="t", partition=0),)),),
        partitions=(
            PartitionLag(
                topic="t",
                partition=0,
                owner="m",
                committed=5,
                reported=9,
                end=12,
                lag=7,
                lag_seconds=95.0,
            ),
            PartitionLag(
                topic="t", partition=1, owner=None, committed=-1, reported=None, end=0, lag=0
            ),
        ),
    )

    class Described:
        async def describe_group(self, group: str) -> GroupReport:
            return report

    await _groups_describe(Described(), argparse.Namespace(group="g", json=False))  # type: ignore[arg-type]
    assert capsys.readouterr().out.splitlines() == [
        "group g: Stable, generation 3, 1 members",
        "MEMBER  CLIENT ID  HOST  PARTITIONS",
        "m       -          -     t-0",
        "TOPIC  PARTITION  OWNER  COMMITTED  REPORTED  END  LAG  LAG TIME",
        "t      0          m      5          9         12   7    1.6m",
        "t      1          -      -          -         0    0    -",
    ]


def test_the_json_gives_a_members_partitions_as_objects_like_the_top_level_list() -> None:
    report = GroupReport(
        group="g",
        state="Stable",
        generation=3,
        members=(
            MemberReport(
                id="m",
                client_id="app",
                host="10.1.2.3",
                partitions=(TopicPartition(topic="my-topic", partition=10),),
            ),
        ),
        partitions=(
            PartitionLag(
                topic="my-topic", partition=10, owner="m", committed=5, reported=None, end=5, lag=0
            ),
        ),
    )
    described = json.loads(json.dumps(report.as_json()))
    (member,) = described["members"]
    assert member == {
        "id": "m",
        "client_id": "app",
        "host": "10.1.2.3",
        "awaiting": False,
        "partitions": [{"topic": "my-topic", "partition": 10}],
    }
    (row,) = described["partitions"]
    assert {k: row[k] for k in ("topic", "partition")} == member["partitions"][0]


async def test_the_text_table_shows_invisible_characters_escaped(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A member id with a right-to-left override or a zero-width space would disguise itself
    and misalign the columns after it: each such character is shown as its escape."""
    member = MemberReport(id=DISGUISED, partitions=(), client_id=INVISIBLE, host="h\u2066")
    report = GroupReport(
        group=DISGUISED, state="Empty", generation=1, members=(member,), partitions=()
    )

    class Described:
        async def describe_group(self, group: str) -> GroupReport:
            return report

    await _groups_describe(Described(), argparse.Namespace(group="g", json=False))  # type: ignore[arg-type]
    out = capsys.readouterr().out
    assert [c for c in INVISIBLE if c in out] == []
    header, member_header, row, *_ = out.splitlines()
    assert header == f"group {shown_escaped(DISGUISED)}: Empty, generation 1, 1 members"
    # The columns line up as the escapes are written.
    assert row.split() == [shown_escaped(DISGUISED), shown_escaped(INVISIBLE), r"h\u2066", "-"]
    assert row.index(shown_escaped(INVISIBLE)) == member_header.index("CLIENT ID")
