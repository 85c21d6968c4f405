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
clients of this port can take files from the broker's. It has no authentication, which is why it
listens on the loopback unless told otherwise (README: Metrics).
"""

from __future__ import annotations

import contextlib
import html
import logging
import time
from collections.abc import Awaitable, Callable

import trio
from prometheus_client import CONTENT_TYPE_LATEST

from broker.metrics import BrokerMetrics, Snapshot
from protocol.shown import escape_unprintable
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

TakeSnapshot = Callable[[], Awaitable[Snapshot]]


async def serve_status(
    metrics: BrokerMetrics,
    take_snapshot: TakeSnapshot,
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
                        await _serve_one(stream, head, metrics, take_snapshot)

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
    stream: trio.abc.Stream, head: bytes, metrics: BrokerMetrics, take: TakeSnapshot
) -> None:
    if b"\r\n\r\n" not in head and b"\n\n" not in head:
        await _respond(stream, 431, "text/plain; charset=utf-8", b"request head too large\n")
        return
    parts = head.split(b"\n", 1)[0].split()
    if len(parts) < 2:
        await _respond(stream, 400, "text/plain; charset=utf-8", b"bad request\n")
        return
    method, target = parts[0], parts[1].split(b"?", 1)[0]
    if method not in (b"GET", b"HEAD"):
        await _respond(stream, 405, "text/plain; charset=utf-8", b"GET or HEAD only\n")
        return
    if target == b"/metrics":
        await take()
        body, kind = metrics.exposition(), CONTENT_TYPE_LATEST
    elif target == b"/":
        body, kind = render_page(await take()).encode(), "text/html; charset=utf-8"
    else:
        await _respond(stream, 404, "text/plain; charset=utf-8", b"not found: try / or /metrics\n")
        return
    await _respond(stream, 200, kind, b"" if method == b"HEAD" else body, len(body))


_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    431: "Request Header Fields Too Large",
}


async def _respond(
    stream: trio.abc.Stream, status: int, kind: str, body: bytes, length: int | None = None
) -> None:
    head = (
        f"HTTP/1.0 {status} {_REASONS[status]}\r\nContent-Type: {kind}\r\n"
        f"Content-Length: {len(body) if length is None else length}\r\n"
        "Cache-Control: no-store\r\nConnection: close\r\n\r\n"
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


def render_page(snapshot: Snapshot) -> str:
    """The status page for ``snapshot``; every value from a client is escaped."""
    out: list[str] = []
    add = out.append
    me = snapshot.broker
    add("<!doctype html>\n<html lang=en><head><meta charset=utf-8>")
    add(f'<meta http-equiv="refresh" content="{REFRESH_SECONDS}">')
    add(f"<title>broker {me.broker_id} status</title>")
    add(
        "<style>body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse;"
        "margin-bottom:1em}td,th{border:1px solid #bbb;padding:2px 8px;text-align:left}"
        "th{background:#eee}.num{text-align:right}</style></head><body>"
    )
    add(f"<h1>Broker {me.broker_id} ({_e(me.host)}:{me.port})</h1>")
    coordinator = "unknown" if snapshot.coordinator_id is None else snapshot.coordinator_id
    shown = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(snapshot.taken_at))
    add(f"<p>Coordinator: broker <span id=coordinator>{_e(coordinator)}</span>; ")
    add(f"this broker holds <span id=slots>{len(snapshot.slots)}</span> coordinator slots. ")
    add(f"As of {shown}; this page reloads every {REFRESH_SECONDS} s.</p>")

    add("<h2>Brokers</h2><table id=brokers><tr><th>id</th><th>address</th></tr>")
    for b in snapshot.brokers:
        add(f"<tr><td>{b.broker_id}</td><td>{_e(b.host)}:{b.port}</td></tr>")
    add("</table>")

    add("<h2>Topics</h2><table id=topics><tr><th>topic</th><th>partition</th><th>broker</th>")
    add("<th>log end offset</th></tr>")
    for topic, placement in sorted(snapshot.topics.items()):
        for partition, broker_id in enumerate(placement.brokers):
            end = next(
                (
                    e
                    for tp, e in snapshot.log_ends.items()
                    if tp.topic == topic and tp.partition == partition
                ),
                None,
            )
            add(
                f"<tr><td>{_e(topic)}</td><td class=num>{partition}</td><td class=num>{broker_id}"
                f"</td><td class=num>{'' if end is None else end}</td></tr>"
            )
    add("</table>")

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
    add(
        "<table id=groups><tr><th>group</th><th>state</th><th>generation</th><th>members</th>"
        "<th>lag (records, max)</th><th>lag (records, sum)</th><th>lag (time, max)</th></tr>"
    )
    for g in snapshot.groups:
        add(
            f'<tr data-group="{_e(g.group_id)}"><td>{_e(g.group_id)}</td>'
            f"<td class=state>{_e(g.state)}</td><td class='num generation'>{g.generation}</td>"
            f"<td class='num members'>{len(g.members)}</td>"
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
        if g.lag:
            add(
                "<table class=lag><tr><th>partition</th><th>lag (records)</th>"
                "<th>lag (time)</th></tr>"
            )
            for lag in g.lag:
                add(
                    f"<tr><td>{_e(lag.tp.topic)}-{lag.tp.partition}</td>"
                    f"<td class=num>{lag.records}</td>"
                    f"<td class=num>{format_age(lag.seconds)}</td></tr>"
                )
            add("</table>")

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
