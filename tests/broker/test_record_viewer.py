"""The record viewer's login, without a broker: HTTP Basic checked against the store's SCRAM
credential, failures answered late and one at a time; and the pages, escaped and bounded."""

from __future__ import annotations

import base64
import re
import uuid

import attrs
import pytest
import trio

from broker.authorization import Access
from broker.metrics import GroupView, LogSize, PartitionLag, Snapshot
from broker.status import LAG_WARN_RECORDS, render_page, render_records
from broker.viewer import SHOWN_BYTES, RecordViewer, Tail, basic_login
from protocol.records import Record
from protocol.sasl import ScramCredential
from protocol.types import BrokerInfo, Subscription, TopicPartition
from statemachine.acl import Authorizer
from statemachine.consumer_group import MemberStatistics
from store import TopicPlacement
from transport.scram import make_credential, password_matches
from transport.security import FAILED_AUTHENTICATION_DELAY


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_a_password_matches_only_the_credential_made_from_it(mechanism: str) -> None:
    credential = make_credential(mechanism, "pässwörd")
    assert password_matches(credential, "pässwörd")
    assert not password_matches(credential, "passwörd")
    assert not password_matches(credential, "")
    # the same password under another salt: what is compared is derived from the stored salt
    other = make_credential(mechanism, "pässwörd")
    assert not password_matches(attrs.evolve(credential, salt=other.salt), "pässwörd")
    # both keys must match: a StoredKey alone (readable in a store dump) is not enough
    assert not password_matches(attrs.evolve(credential, server_key=other.server_key), "pässwörd")
    # a password SASLprep refuses (a control character) fails, it does not raise
    assert not password_matches(credential, "pass\x07")


def _head(authorization: str | None) -> bytes:
    lines = ["GET /records?topic=t&partition=0 HTTP/1.1", "Host: x"]
    if authorization is not None:
        lines.append(f"Authorization: {authorization}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _basic(text: str) -> str:
    return "Basic " + base64.b64encode(text.encode()).decode()


def test_a_basic_login_is_read_only_when_well_formed_and_bounded() -> None:
    login = basic_login(_head(_basic("alice:se:cret")))
    assert login is not None and (login.user, login.password) == ("alice", "se:cret")
    assert "se:cret" not in repr(login)
    assert basic_login(_head(None)) is None
    assert basic_login(_head("Bearer abc")) is None
    assert basic_login(_head("Basic not-base64!")) is None
    assert basic_login(_head(_basic("no-colon"))) is None
    assert basic_login(_head(_basic(":no-user"))) is None
    assert basic_login(_head(_basic("alice:" + "x" * 257))) is None
    assert basic_login(_head("basic " + base64.b64encode(b"a:\xff").decode())) is None


def _viewer(users: dict[str, str], *, enabled: bool = True) -> RecordViewer:
    credentials = {
        (user, mechanism): make_credential(mechanism, password)
        for user, password in users.items()
        for mechanism in ("SCRAM-SHA-512",)
    }

    async def credential(user: str, mechanism: str) -> ScramCredential | None:
        return credentials.get((user, mechanism))

    return RecordViewer(
        access=Access(current=Authorizer(enabled=enabled)),
        credential=credential,
        partitions=dict,
    )


async def test_a_failed_login_is_answered_late_and_failures_one_at_a_time(
    autojump_clock: trio.abc.Clock,
) -> None:
    viewer = _viewer({"alice": "alice-pw"})
    assert viewer.on and not _viewer({}, enabled=False).on
    start = trio.current_time()
    right = basic_login(_head(_basic("alice:alice-pw")))
    assert right is not None
    assert await viewer.principal(right) == "User:alice"
    assert trio.current_time() == start  # a right password is not slowed
    answered: dict[str, float] = {}

    async def attempt(text: str) -> None:
        login = basic_login(_head(_basic(text)))
        assert login is not None
        assert await viewer.principal(login) is None
        answered[text] = trio.current_time() - start

    async with trio.open_nursery() as nursery:
        # a wrong password, and an unknown user (checked against a decoy, so it fails alike)
        nursery.start_soon(attempt, "alice:wrong")
        nursery.start_soon(attempt, "mallory:alice-pw")
    assert sorted(answered.values()) == [
        FAILED_AUTHENTICATION_DELAY,
        2 * FAILED_AUTHENTICATION_DELAY,
    ]


def _snapshot() -> Snapshot:
    broker = BrokerInfo(broker_id=1, host="127.0.0.1", port=9092)

    def lag(group: str, topic: str, partition: int, committed: int, end: int) -> PartitionLag:
        return PartitionLag(
            group_id=group,
            tp=TopicPartition(topic=topic, partition=partition),
            records=end - committed,
            seconds=1.0,
            offset=committed,
            end=end,
            committed=committed,
        )

    away = MemberStatistics(
        member_id="static-1",
        client_id="c",
        session_timeout_ms=30000,
        subscription=Subscription(),
        partitions=(),
        away=True,
    )
    groups = (
        GroupView(
            group_id="a",
            state="Stable",
            generation=3,
            members=(),
            lag=(lag("a", "u", 0, 5, 10), lag("a", "t", 1, 0, LAG_WARN_RECORDS + 7)),
        ),
        GroupView(
            group_id="b",
            state="Empty",
            generation=4,
            members=(away,),
            lag=(lag("b", "t", 0, 2, 9),),
        ),
    )
    return Snapshot(
        broker=broker,
        coordinator_id=1,
        brokers=(broker,),
        topics={"t": TopicPlacement(topic="t", brokers=(1, 1), topic_id=uuid.uuid4())},
        log_ends={},
        groups=groups,
        rebalances=(),
        taken_at=0.0,
        log_sizes={
            TopicPartition(topic="t", partition=0): LogSize(bytes=300, records=9),
            TopicPartition(topic="t", partition=1): LogSize(bytes=4000, records=1007),
        },
    )


def _rows(page: str, table: str) -> list[tuple[str, list[str]]]:
    """A table's rows after its header: each row's attributes and its cells' text."""
    body = page.split(f"<table id={table}>", 1)[1].split("</table>", 1)[0]
    return [
        (attributes, re.findall(r"<td[^>]*>(.*?)</td>", cells))
        for attributes, cells in re.findall(r"<tr([^>]*)>(.*?)</tr>", body)[1:]
    ]


def test_the_page_sorts_offsets_highlights_lag_and_counts_away_members_apart() -> None:
    by_lag = render_page(_snapshot(), sort="lag")
    offsets = _rows(by_lag, "offsets")
    # group, topic, partition, committed, reported, end, lag, lag time
    assert [cells[:8] for _, cells in offsets] == [
        ["a", "t", "1", "0", "", str(LAG_WARN_RECORDS + 7), str(LAG_WARN_RECORDS + 7), "1.0s"],
        ["b", "t", "0", "2", "", "9", "7", "1.0s"],
        ["a", "u", "0", "5", "", "10", "5", "1.0s"],
    ]
    assert [" class=behind" in attributes for attributes, _ in offsets] == [True, False, False]
    by_topic = render_page(_snapshot(), sort="topic")
    assert [cells[1:3] for _, cells in _rows(by_topic, "offsets")] == [
        ["t", "0"],
        ["t", "1"],
        ["u", "0"],
    ]
    assert 'href="?sort=lag"' in by_topic and 'href="?sort=topic"' not in by_topic
    # the groups: members are live ones; a static member away is counted apart
    groups = _rows(render_page(_snapshot()), "groups")
    assert [cells[:5] for _, cells in groups] == [
        ["a", "Stable", "3", "0", "0"],
        ["b", "Empty", "4", "0", "1"],
    ]
    assert f"at least {LAG_WARN_RECORDS} records" in by_lag
    # topic sizes: each partition's and the topic's over this broker's partitions
    assert [cells for _, cells in _rows(by_lag, "sizes")] == [["t", "2", "1016", "4300"]]
    assert [cells[4:6] for _, cells in _rows(by_lag, "topics")] == [["9", "300"], ["1007", "4000"]]


def test_the_viewer_link_is_there_only_where_the_viewer_is_on() -> None:
    off = render_page(_snapshot())
    assert "/records?" not in off and "Record viewer: off" in off
    on = render_page(_snapshot(), viewer=True)
    assert 'href="/records?topic=t&amp;partition=1"' in on


def test_the_records_page_escapes_and_cuts_keys_and_values() -> None:
    hostile = b'<script>alert("x")</script>\xe2\x80\xae'
    tail = Tail(
        log_start=0,
        end=3,
        records=(
            Record(offset=1, timestamp_ms=1_700_000_000_123, key=hostile, value=b"v" * 1000),
            Record(offset=2, timestamp_ms=1_700_000_000_456, key=None, value=b"\xff\x00ok"),
        ),
    )
    page = render_records(TopicPartition(topic="<t>", partition=0), tail)
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert "\u202e" not in page and "\\u202e" in page
    assert (
        "v" * SHOWN_BYTES + " <i>… (1000 bytes)</i>" in page and "v" * (SHOWN_BYTES + 1) not in page
    )
    assert "\ufffd\\x00ok" in page
    assert "<i>null</i>" in page and "2023-11-14 22:13:20.123" in page
    assert "&lt;t&gt;-0" in page
