"""The metrics endpoint and the status page, on one HTTP port.

``/metrics`` is Prometheus' text format; ``/`` is a page a person reads: brokers, topics and
where their partitions live, groups with their members, partitions and lag, and the last
rebalances. The page is rendered here, refreshes itself every few seconds (a meta refresh, no
script), and escapes every id and name, since those come from clients: HTML's specials, and every
character a person cannot see (:mod:`protocol.shown`).

The server is deliberately small: HTTP/1.0, GET and HEAD only, one request a connection, a
request head of at most MAX_HEAD_BYTES read within HEAD_DEADLINE of the accept, the answer sent
within ANSWER_DEADLINE, at most MAX_CONNECTIONS connections open (more are accepted and closed at
once, as the broker's listener does) and MAX_CONCURRENT answered at once. Its connections are
kept out of the broker's file budget (transport.limits.FILE_RESERVE holds them), so no number of
clients of this port can take files from the broker's. The page and the metrics have no
authentication, which is why it listens on the loopback unless told otherwise (README: Metrics);
only the record viewer's page (``/records``, broker/viewer.py) logs its user in, since it shows
what clients wrote.

The page's layout is in sections (:func:`_topics_section`, :func:`_groups_section`), each a
function that adds its own HTML, so that a new figure is a new section.
"""

from __future__ import annotations

import collections
import contextlib
import html
import logging
import time
import urllib.parse
from collections.abc import Awaitable, Callable

import trio
from prometheus_client import CONTENT_TYPE_LATEST

from broker.door import BOUND
from broker.metrics import BrokerMetrics, PartitionLag, Snapshot
from broker.viewer import SHOWN_BYTES, TAIL_RECORDS, RecordViewer, Tail, basic_login, read_tail
from protocol.shown import escape_unprintable
from protocol.types import TopicPartition
from store import StoreError
from transport.channel import RateLimitedLog
from transport.listener import ConnectionGate, serve_listeners
from transport.security import Peer

log = logging.getLogger(__name__)

#: Seconds between the page's own reloads.
REFRESH_SECONDS = 5
#: The longest request head read, and how long a client may take to send it from its accept.
MAX_HEAD_BYTES = 8192
HEAD_DEADLINE = 10.0
#: How long the answer may take, waiting for a slot and being read by the client included.
ANSWER_DEADLINE = 30.0
#: Connections open at once; more are closed as soon as they are accepted.
MAX_CONNECTIONS = 32
#: Requests answered at once; more wait for a slot.
MAX_CONCURRENT = 8

#: A group's partition this far behind, in records or in time, is highlighted on the page.
LAG_WARN_RECORDS = 1000
LAG_WARN_SECONDS = 60.0
#: The orders of the page's group tables (``/?sort=``), the first the default.
SORTS = ("group", "topic", "lag")
VIEWER_OFF = (
    "record viewer off: this broker enforces no access rules, so it has no users to log in and "
    "no rights to check (README: Metrics)"
)

TakeSnapshot = Callable[[], Awaitable[Snapshot]]


async def serve_status(
    metrics: BrokerMetrics,
    take_snapshot: TakeSnapshot,
    viewer: RecordViewer | None = None,
    *,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until cancelled; ``task_status.started`` gets the bound port."""
    config = metrics.config
    assert config.port is not None
    listeners = await trio.open_tcp_listeners(config.port, host=config.host)
    port = listeners[0].socket.getsockname()[1]
    log.info("metrics and status page on http://%s:%d/", config.host, port)
    slots = trio.CapacityLimiter(MAX_CONCURRENT)

    async def handler(stream: trio.abc.Stream, peer: Peer) -> None:
        async with stream:
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                head = await _read_head(stream)
                if head is None:
                    return  # nothing whole within the deadline: closed unanswered
                with trio.move_on_after(ANSWER_DEADLINE):
                    async with slots:
                        await _serve_one(stream, head, metrics, take_snapshot, viewer)

    # its refusals logged under this module's name: they are the metrics port's
    gate = ConnectionGate(limit=MAX_CONNECTIONS, per_address=None, refusals=RateLimitedLog(log))
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_listeners, handler, listeners, gate)
        task_status.started(port)


async def _read_head(stream: trio.abc.Stream) -> bytes | None:
    """The request head, or as much of it as MAX_HEAD_BYTES holds; None if the client closed
    or the deadline passed before either."""
    head = b""
    with trio.move_on_after(HEAD_DEADLINE):
        while b"\r\n\r\n" not in head and b"\n\n" not in head and len(head) < MAX_HEAD_BYTES:
            chunk = await stream.receive_some(MAX_HEAD_BYTES - len(head))
            if not chunk:
                return None
            head += chunk
        return head
    return None


async def _serve_one(
    stream: trio.abc.Stream,
    head: bytes,
    metrics: BrokerMetrics,
    take: TakeSnapshot,
    viewer: RecordViewer | None = None,
) -> None:
    if b"\r\n\r\n" not in head and b"\n\n" not in head:
        await _respond(stream, 431, "text/plain; charset=utf-8", b"request head too large\n")
        return
    parts = head.split(b"\n", 1)[0].split()
    if len(parts) < 2:
        await _respond(stream, 400, "text/plain; charset=utf-8", b"bad request\n")
        return
    method, (target, _, query) = parts[0], parts[1].partition(b"?")
    if method not in (b"GET", b"HEAD"):
        await _respond(stream, 405, "text/plain; charset=utf-8", b"GET or HEAD only\n")
        return
    if target == b"/metrics":
        await take()
        body, kind = metrics.exposition(), CONTENT_TYPE_LATEST
    elif target == b"/":
        sort = _query(query).get("sort", "")
        on = viewer is not None and viewer.on
        page = render_page(await take(), sort=sort if sort in SORTS else SORTS[0], viewer=on)
        body, kind = page.encode(), "text/html; charset=utf-8"
    elif target == b"/records":
        await _serve_records(stream, method, head, query, viewer)
        return
    else:
        await _respond(stream, 404, "text/plain; charset=utf-8", b"not found: try / or /metrics\n")
        return
    await _respond(stream, 200, kind, b"" if method == b"HEAD" else body, len(body))


def _query(query: bytes) -> dict[str, str]:
    """A query string's parameters, the first of each name; empty if malformed (the head it is
    part of is bounded, so are they)."""
    try:
        pairs = urllib.parse.parse_qsl(query.decode("ascii"), max_num_fields=8)
    except (UnicodeDecodeError, ValueError):
        return {}
    found: dict[str, str] = {}
    for name, value in pairs:
        found.setdefault(name, value)
    return found


_PLAIN = "text/plain; charset=utf-8"


async def _serve_records(
    stream: trio.abc.Stream,
    method: bytes,
    head: bytes,
    query: bytes,
    viewer: RecordViewer | None,
) -> None:
    """``/records?topic=T&partition=P``: authenticated and authorized, or refused
    (broker/viewer.py)."""
    if viewer is None or not viewer.on:
        await _respond(stream, 404, _PLAIN, VIEWER_OFF.encode() + b"\n")
        return
    login = basic_login(head)
    principal = None
    if login is not None:
        try:
            principal = await viewer.principal(login)
        except StoreError:
            await _respond(stream, 503, _PLAIN, b"the broker's users cannot be read now\n")
            return
    if principal is None:
        refused = b"log in as one of the broker's users\n"
        await _respond(stream, 401, _PLAIN, refused, challenge=True)
        return
    asked = _query(query)
    topic, partition = asked.get("topic", ""), asked.get("partition", "")
    if not topic or not partition.isdigit() or len(partition) > 10:
        await _respond(stream, 400, _PLAIN, b"name a topic and a partition number\n")
        return
    # the right first, so that nobody learns which partitions exist from the answers
    if not viewer.may_read(principal, topic):
        await _respond(stream, 403, _PLAIN, b"no READ right on this topic\n")
        return
    tp = TopicPartition(topic=topic, partition=int(partition))
    log_ = viewer.partitions().get(tp)
    if log_ is None:
        await _respond(stream, 404, _PLAIN, b"no such partition on this broker\n")
        return
    body = render_records(tp, await read_tail(log_)).encode()
    kind = "text/html; charset=utf-8"
    await _respond(stream, 200, kind, b"" if method == b"HEAD" else body, len(body))


_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    431: "Request Header Fields Too Large",
    503: "Service Unavailable",
}


async def _respond(
    stream: trio.abc.Stream,
    status: int,
    kind: str,
    body: bytes,
    length: int | None = None,
    *,
    challenge: bool = False,
) -> None:
    head = (
        f"HTTP/1.0 {status} {_REASONS[status]}\r\nContent-Type: {kind}\r\n"
        f"Content-Length: {len(body) if length is None else length}\r\n"
        + ('WWW-Authenticate: Basic realm="broker", charset="UTF-8"\r\n' if challenge else "")
        + "Cache-Control: no-store\r\nConnection: close\r\n\r\n"
    )
    await stream.send_all(head.encode() + body)


def _e(value: object) -> str:
    return html.escape(escape_unprintable(str(value)), quote=True)


def format_age(seconds: float | None, unknown: str = "?") -> str:
    """A lag in time as a person reads it: ``4.2s``, ``3.5m``, ``1.2h``."""
    if seconds is None:
        return unknown
    if seconds < 60:
        return f"{seconds:.1f}s"
    if seconds < 3600:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"


def _partitions(tps: object) -> str:
    assert isinstance(tps, tuple)
    return ", ".join(f"{tp.topic}-{tp.partition}" for tp in tps) or "none"


def _behind(records: int, seconds: float | None) -> bool:
    return records >= LAG_WARN_RECORDS or (seconds or 0.0) >= LAG_WARN_SECONDS


def _lag_order(sort: str) -> Callable[[PartitionLag], tuple[object, ...]]:
    if sort == "topic":
        return lambda p: (p.tp.topic, p.tp.partition, p.group_id)
    if sort == "lag":
        return lambda p: (-p.records, -(p.seconds or 0.0), p.group_id, p.tp.topic, p.tp.partition)
    return lambda p: (p.group_id, p.tp.topic, p.tp.partition)


def _sort_links(sort: str) -> str:
    links = (
        f"<b>{name}</b>" if name == sort else f'<a href="?sort={name}" id=sort-{name}>{name}</a>'
        for name in SORTS
    )
    return "<p class=sort>Sort by: " + " | ".join(links) + "</p>"


def render_page(snapshot: Snapshot, *, sort: str = SORTS[0], viewer: bool = False) -> str:
    """The status page for ``snapshot``, its group tables in ``sort``'s order, a link to each
    partition's records if the ``viewer`` is on; every value from a client is escaped."""
    out: list[str] = []
    add = out.append
    me = snapshot.broker
    add("<!doctype html>\n<html lang=en><head><meta charset=utf-8>")
    add(f'<meta http-equiv="refresh" content="{REFRESH_SECONDS}">')
    add(f"<title>broker {me.broker_id} status</title>")
    add(
        "<style>body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse;"
        "margin-bottom:1em}td,th{border:1px solid #bbb;padding:2px 8px;text-align:left}"
        "th{background:#eee}.num{text-align:right}tr.behind td,p.behind{background:#fdd}</style>"
        "</head><body>"
    )
    add(f"<h1>Broker {me.broker_id} ({_e(me.host)}:{me.port})</h1>")
    coordinator = "unknown" if snapshot.coordinator_id is None else snapshot.coordinator_id
    shown = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(snapshot.taken_at))
    add(f"<p>Coordinator: broker <span id=coordinator>{_e(coordinator)}</span>; ")
    add(f"this broker holds <span id=slots>{len(snapshot.slots)}</span> coordinator slots. ")
    add(f"As of {shown}; this page reloads every {REFRESH_SECONDS} s.</p>")
    _health_section(add, snapshot)

    add("<h2>Brokers</h2><table id=brokers><tr><th>id</th><th>address</th></tr>")
    for b in snapshot.brokers:
        add(f"<tr><td>{b.broker_id}</td><td>{_e(b.host)}:{b.port}</td></tr>")
    add("</table>")

    _topics_section(add, snapshot, viewer)
    _groups_section(add, snapshot, sort)

    add("<h2>Last rebalances</h2><table id=rebalances><tr><th>completed</th><th>group</th>")
    add("<th>cause</th><th>generation</th><th>took</th></tr>")
    for r in snapshot.rebalances:
        when = time.strftime("%H:%M:%S", time.gmtime(r.completed_at))
        add(
            f"<tr><td>{when}</td><td>{_e(r.group_id)}</td><td>{_e(r.cause)}</td>"
            f"<td class=num>{r.generation}</td><td class=num>{r.duration:.3f} s</td></tr>"
        )
    add("</table></body></html>\n")
    return "".join(out)


def _health_section(add: Callable[[str], object], snapshot: Snapshot) -> None:
    """Whether the broker keeps up: a loop behind judges its members late and sheds new work
    (docs/design.md#a-broker-that-falls-behind); marked when the lag is past the door's bound."""
    health = snapshot.health
    if health is None:
        return
    store = "-" if health.store_read is None else f"{health.store_read * 1000:.0f} ms"
    mark = " class=behind" if health.worst_loop_lag > BOUND else ""
    add(
        f"<p id=health{mark}>Loop lag <span id=loop-lag>{health.loop_lag:.3f} s</span>"
        f" (worst in the last minute <span id=worst-loop-lag>{health.worst_loop_lag:.3f} s"
        f"</span>); store read <span id=store-read>{store}</span>; requests shed at the door"
        f" <span id=shed>{health.shed}</span>; Ping misses excused"
        f" <span id=excused>{health.pings_excused}</span>.</p>"
    )


def _topics_section(add: Callable[[str], object], snapshot: Snapshot, viewer: bool) -> None:
    """Where each partition lives; for those on this broker, its log's extent and size, and a
    link to its last records where the viewer is on."""
    sizes = snapshot.log_sizes
    add("<h2>Topics</h2><table id=topics><tr><th>topic</th><th>partition</th><th>broker</th>")
    add("<th>log end offset</th><th>records</th><th>bytes</th>")
    add("<th>last records</th></tr>" if viewer else "</tr>")
    for topic, placement in sorted(snapshot.topics.items()):
        for partition, broker_id in enumerate(placement.brokers):
            tp = TopicPartition(topic=topic, partition=partition)
            end, size = snapshot.log_ends.get(tp), sizes.get(tp)
            add(
                f"<tr><td>{_e(topic)}</td><td class=num>{partition}</td><td class=num>{broker_id}"
                f"</td><td class=num>{'' if end is None else end}</td>"
                f"<td class=num>{'' if size is None else size.records}</td>"
                f"<td class=num>{'' if size is None else size.bytes}</td>"
            )
            if viewer:
                query = urllib.parse.urlencode({"topic": topic, "partition": partition})
                link = f'<a href="/records?{_e(query)}">last {TAIL_RECORDS}</a>' if size else ""
                add(f"<td>{link}</td>")
            add("</tr>")
    add("</table>")
    add("<h3>Topic sizes on this broker</h3><table id=sizes><tr><th>topic</th>")
    add("<th>partitions here</th><th>records</th><th>bytes</th></tr>")
    totals: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0, 0])
    for tp, size in sizes.items():
        total = totals[tp.topic]
        total[0] += 1
        total[1] += size.records
        total[2] += size.bytes
    for topic, (partitions, records, size_bytes) in sorted(totals.items()):
        add(
            f'<tr data-topic="{_e(topic)}"><td>{_e(topic)}</td><td class=num>{partitions}</td>'
            f"<td class=num>{records}</td><td class=num>{size_bytes}</td></tr>"
        )
    add("</table>")
    add(
        "<p id=viewer>Record viewer: "
        + (
            f"the last {TAIL_RECORDS} records of a partition on this broker, each key and value "
            f"cut at {SHOWN_BYTES} bytes, for one of the broker's users with READ on the topic "
            "(HTTP Basic: put TLS in front of this port unless it is on the loopback)."
            if viewer
            else _e(VIEWER_OFF[len("record viewer ") :]) + "."
        )
        + "</p>"
    )


def _groups_section(add: Callable[[str], object], snapshot: Snapshot, sort: str) -> None:
    """Each group, its members, and its offsets beside the log ends, in ``sort``'s order; lag
    past the stated threshold highlighted."""
    me = snapshot.broker
    add("<h2>Groups</h2>")
    if not snapshot.groups:
        add(
            "<p>No groups"
            + (
                ""
                if snapshot.coordinator_id == me.broker_id
                else " here: this broker is not the coordinator"
            )
            + ".</p>"
        )
    add(_sort_links(sort))
    add(
        f"<p>Lag of at least {LAG_WARN_RECORDS} records or {LAG_WARN_SECONDS:.0f} s is "
        "highlighted.</p>"
    )
    add(
        "<table id=groups><tr><th>group</th><th>state</th><th>generation</th><th>members</th>"
        "<th>away</th><th>lag (records, max)</th><th>lag (records, sum)</th>"
        "<th>lag (time, max)</th></tr>"
    )
    groups = sorted(snapshot.groups, key=lambda g: g.group_id)
    if sort == "lag":
        groups.sort(key=lambda g: (-g.lag_records_max, -g.lag_seconds_max))
    for g in groups:
        away = sum(1 for m in g.members if m.away)
        behind = " class=behind" if _behind(g.lag_records_max, g.lag_seconds_max) else ""
        add(
            f'<tr data-group="{_e(g.group_id)}"{behind}><td>{_e(g.group_id)}</td>'
            f"<td class=state>{_e(g.state)}</td><td class='num generation'>{g.generation}</td>"
            f"<td class='num members'>{len(g.members) - away}</td>"
            f"<td class='num away'>{away}</td>"
            + (
                f"<td class='num lag-max'>{g.lag_records_max}</td>"
                f"<td class=num>{g.lag_records_sum}</td>"
                f"<td class='num lag-time'>{format_age(g.lag_seconds_max)}</td></tr>"
                if g.lag
                else "<td class='num lag-max'>-</td><td class=num>-</td>"
                "<td class='num lag-time'>-</td></tr>"
            )
        )
    add("</table>")
    add(
        "<h3>Offsets</h3><table id=offsets><tr><th>group</th><th>topic</th><th>partition</th>"
        "<th>committed</th><th>reported</th><th>log end</th><th>lag (records)</th>"
        "<th>lag (time)</th></tr>"
    )
    for lag in sorted((p for g in snapshot.groups for p in g.lag), key=_lag_order(sort)):
        behind = " class=behind" if _behind(lag.records, lag.seconds) else ""
        committed = "-" if lag.committed is None else lag.committed
        reported = "" if lag.committed == lag.offset else lag.offset
        add(
            f"<tr{behind}><td>{_e(lag.group_id)}</td><td>{_e(lag.tp.topic)}</td>"
            f"<td class=num>{lag.tp.partition}</td><td class=num>{committed}</td>"
            f"<td class=num>{reported}</td><td class=num>{lag.end}</td>"
            f"<td class=num>{lag.records}</td><td class=num>{format_age(lag.seconds)}</td></tr>"
        )
    add("</table>")
    for g in snapshot.groups:
        add(f"<h3>Group {_e(g.group_id)}</h3>")
        add("<table class=members><tr><th>member</th><th>client id</th><th>partitions</th></tr>")
        for m in g.members:
            what = (
                "away (static member, waiting for a restart)"
                if m.away
                else _partitions(m.partitions)
            )
            add(f"<tr><td>{_e(m.member_id)}</td><td>{_e(m.client_id)}</td><td>{_e(what)}</td></tr>")
        add("</table>")


def render_records(tp: TopicPartition, tail: Tail) -> str:
    """The record viewer's page: ``tail``'s records, each key and value cut at
    :data:`SHOWN_BYTES`, decoded as UTF-8 (what is not shown as U+FFFD) and escaped."""
    out: list[str] = []
    add = out.append
    name = f"{_e(tp.topic)}-{tp.partition}"
    add(f"<!doctype html>\n<html lang=en><head><meta charset=utf-8><title>{name}</title>")
    add(
        "<style>body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse}"
        "td,th{border:1px solid #bbb;padding:2px 8px;text-align:left;vertical-align:top}"
        "th{background:#eee}.num{text-align:right}td.bytes{font-family:monospace;"
        "white-space:pre-wrap;word-break:break-all}</style></head><body>"
    )
    add(f"<h1>Partition {name}</h1><p><a href='/'>status page</a></p>")
    first = tail.records[0].offset if tail.records else tail.end
    add(
        f"<p>Offsets {first} to {tail.end} of a log from {tail.log_start} to {tail.end}: "
        f"<span id=shown>{len(tail.records)}</span> records (at most the last {TAIL_RECORDS}; "
        f"keys and values cut at {SHOWN_BYTES} bytes).</p>"
    )
    add("<table id=records><tr><th>offset</th><th>timestamp</th><th>key</th><th>value</th></tr>")
    for r in tail.records:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(r.timestamp_ms / 1000))
        add(
            f"<tr><td class=num>{r.offset}</td><td>{when}.{r.timestamp_ms % 1000:03d}</td>"
            f"<td class=bytes>{_bytes_shown(r.key)}</td>"
            f"<td class=bytes>{_bytes_shown(r.value)}</td></tr>"
        )
    add("</table></body></html>\n")
    return "".join(out)


def _bytes_shown(data: bytes | None) -> str:
    if data is None:
        return "<i>null</i>"
    shown = _e(data[:SHOWN_BYTES].decode("utf-8", errors="replace"))
    if len(data) > SHOWN_BYTES:
        shown += f" <i>… ({len(data)} bytes)</i>"
    return shown
