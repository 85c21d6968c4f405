"""The metrics endpoint and the status page of a real broker, watched while a real consumer of a
running group is killed with SIGKILL: what an operator's Prometheus and browser would see."""

from __future__ import annotations

import base64
import html
import re
import shutil
import signal
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from broker import status, viewer
from launch.processes import BrokerProcess, run_broker
from statemachine.slots import DEFAULT_SLOTS
from tests.cli.cli_process import bootstrap, describe_group, open_cli, run_cli, stop
from tests.security.conftest import add_user, run_secured_broker
from transport.security import FAILED_AUTHENTICATION_DELAY

pytestmark = pytest.mark.realtime

#: Generous: CI has two shared cores.
WAIT = 60.0
PARTITIONS = 4
_METRICS_URL = re.compile(r"metrics and status page on (http://\S+/)")

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        body: bytes = response.read()
        return body.decode()


async def scrape(base: str) -> Samples:
    text = await trio.to_thread.run_sync(_fetch, base + "metrics")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def wait_for(base: str, what: str, check: Callable[[Samples], bool]) -> Samples:
    """Scrape until ``check`` holds, as a dashboard refreshing would; bounded."""
    samples: Samples = {}
    with trio.move_on_after(WAIT):
        while not check(samples := await scrape(base)):
            await trio.sleep(0.2)
        return samples
    raise AssertionError(f"never saw {what}; last scrape: {samples}")


@attrs.define
class Scene:
    broker: BrokerProcess
    base: str
    consumers: list[trio.Process]
    tmp: Path

    async def produce(self, count: int) -> None:
        lines = "".join(f"{i}\n" for i in range(count)).encode()
        done = await run_cli("produce", "t", "--bootstrap", bootstrap(self.broker), stdin=lines)
        assert done.returncode == 0, done.stderr


@asynccontextmanager
async def running_group(tmp_path: Path) -> AsyncIterator[Scene]:
    """A broker with its metrics endpoint, a topic, and a group of two consumers that has
    consumed and reported an offset on every partition."""
    async with run_broker(
        tmp_path / "data", "--metrics-port", "0", "--metrics-partition-lag"
    ) as broker:
        match = _METRICS_URL.search(broker.log_text())
        assert match is not None, broker.log_text()
        base = match.group(1)
        created = await run_cli(
            "topics",
            "create",
            "t",
            "--partitions",
            str(PARTITIONS),
            "--bootstrap",
            bootstrap(broker),
        )
        assert created.returncode == 0, created.stderr
        consumers = []
        try:
            for name in ("a", "b"):
                consumers.append(
                    await open_cli(
                        "consume",
                        "t",
                        "--group",
                        "g",
                        "--from-beginning",
                        "--session-timeout",
                        "6",
                        "--bootstrap",
                        bootstrap(broker),
                        stdout=tmp_path / f"{name}.out",
                        stderr=tmp_path / f"{name}.err",
                    )
                )
            scene = Scene(broker=broker, base=base, consumers=consumers, tmp=tmp_path)
            await wait_for(
                base,
                "a Stable group of two",
                lambda s: (
                    value(s, "coordinator_groups", state="Stable") == 1
                    and value(s, "coordinator_members") == 2
                    # Alone on its store, the broker holds every coordinator slot.
                    and value(s, "broker_coordinator_slots") == DEFAULT_SLOTS
                ),
            )
            await scene.produce(200)
            await wait_for(
                base,
                "every partition consumed and reported",
                lambda s: (
                    value(s, "broker_produced_records_total", topic="t") == 200
                    and sum(1 for name, _ in s if name == "coordinator_partition_lag_records")
                    == PARTITIONS
                    and value(s, "coordinator_group_lag_records_sum", group="g") == 0
                ),
            )
            yield scene
        finally:
            for consumer in consumers:
                await stop(consumer)


async def test_a_scrape_sees_the_death_the_rebalance_and_the_lag_move(tmp_path: Path) -> None:
    async with running_group(tmp_path) as scene:
        before = await scrape(scene.base)
        assert _killed(before) == 0
        deaths_before = value(before, "coordinator_rebalances_total", cause="death")
        victim = scene.consumers[0]
        # Paused, the consumer holds its partitions and fetches nothing: records pile up there.
        victim.send_signal(19)  # SIGSTOP
        await scene.produce(200)
        behind = await wait_for(
            scene.base,
            "lag on the paused consumer's partitions",
            lambda s: value(s, "coordinator_group_lag_records_sum", group="g") > 0,
        )
        assert value(behind, "coordinator_group_lag_seconds_max", group="g") >= 0
        # groups describe shows the same: who the members are, and lag in time as in records
        with trio.fail_after(WAIT):
            while True:
                report = await describe_group(scene.broker, "g")
                lagging = [p for p in report["partitions"] if p["lag"]]
                if lagging and all(p["lag_seconds"] is not None for p in lagging):
                    break
                await trio.sleep(0.2)
        assert [(m["host"], bool(m["client_id"])) for m in report["members"]] == [
            ("127.0.0.1", True),
            ("127.0.0.1", True),
        ]
        assert all(p["lag_seconds"] > 0 for p in lagging)
        owned = [tp for m in report["members"] for tp in m["partitions"]]
        assert sorted((tp["topic"], tp["partition"]) for tp in owned) == [
            ("t", p) for p in range(PARTITIONS)
        ]
        victim.kill()  # SIGKILL
        await victim.wait()
        after = await wait_for(
            scene.base,
            "the death, a rebalance for it and the lag back to zero",
            lambda s: (
                _killed(s) == 1
                and value(s, "coordinator_rebalances_total", cause="death") == deaths_before + 1
                and value(s, "coordinator_group_lag_records_sum", group="g") == 0
                and value(s, "coordinator_members") == 1
            ),
        )
        assert value(after, "coordinator_groups", state="Stable") == 1
        assert value(after, "coordinator_member_deaths_total", cause="silent") == 0
        assert value(after, "coordinator_group_lag_seconds_max", group="g") == 0
        assert value(after, "broker_produced_records_total", topic="t") == 400
        assert value(after, "coordinator_rebalance_duration_seconds_count", cause="death") >= 1


def _killed(samples: Samples) -> float:
    """Deaths of a killed process: its kernel ends the connection with a FIN (closed) or, with
    unread bytes in its socket (a paused consumer has Pings waiting), a reset (broken)."""
    return sum(
        value(samples, "coordinator_member_deaths_total", cause=cause)
        for cause in ("closed", "broken")
    )


def _visible_text(dom: str) -> str:
    """The text a person reads: tags dropped, entities decoded, whitespace collapsed."""
    text = re.sub(r"<(style|script)[^>]*>.*?</\1>", " ", dom, flags=re.S)
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", text)).split())


async def open_in_chromium(url: str, tmp: Path) -> str:
    """The page as headless Chromium loaded it: its DOM after load, as visible text."""
    return _visible_text(await chromium_dom(url, tmp))


async def chromium_dom(url: str, tmp: Path) -> str:
    """The page as headless Chromium loaded it: its DOM after load, serialized."""
    browser = shutil.which("chromium")
    assert browser is not None, "Debian's chromium: scripts/bootstrap.sh installs it"
    done = await trio.run_process(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            f"--user-data-dir={tmp / 'chromium'}",
            "--dump-dom",
            url,
        ],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    return done.stdout.decode()


def _group_row(text: str, group: str = "g") -> tuple[str, int, int, int, int]:
    """The Groups table's row for ``group``: state, generation, members, members away, maximum
    lag (a number, or ``-`` read as -1: no offset reported)."""
    row = re.search(
        rf"\b{group} (\w+) (\d+) (\d+) (\d+) (\d+|-) (?:\d+ [\d.]+[smh]|- -)(?: |$)", text
    )
    assert row is not None, text
    lag = -1 if row.group(5) == "-" else int(row.group(5))
    return row.group(1), int(row.group(2)), int(row.group(3)), int(row.group(4)), lag


def _table(dom: str, table: str) -> list[tuple[str, list[str]]]:
    """A table of the DOM Chromium serialized: each row after the header, as its attributes and
    its cells' visible text."""
    found = re.search(rf'<table id="{table}">(.*?)</table>', dom, flags=re.S)
    assert found is not None, dom
    return [
        (attributes, [_visible_text(cell) for cell in re.findall(r"<td[^>]*>(.*?)</td>", row)])
        for attributes, row in re.findall(r"<tr([^>]*)>(.*?)</tr>", found.group(1), flags=re.S)
    ][1:]


async def test_the_status_page_in_a_browser_shows_the_group_and_its_new_generation(
    tmp_path: Path,
) -> None:
    async with running_group(tmp_path) as scene:
        text = await open_in_chromium(scene.base, tmp_path)
        state, generation, members, away, lag = _group_row(text)
        assert (state, members, away, lag) == ("Stable", 2, 0, 0)
        assert generation >= 1
        assert "Last rebalances" in text and " t 0 1 " in text  # partition 0 of t on broker 1
        victim = scene.consumers[0]
        victim.kill()
        await victim.wait()
        with trio.fail_after(WAIT):
            while True:
                now = _group_row(await open_in_chromium(scene.base, tmp_path))
                if now[0] == "Stable" and now[1] > generation:
                    break
                await trio.sleep(0.5)
        assert now[2] == 1
        assert f"g death {now[1]}" in await open_in_chromium(scene.base, tmp_path)


async def test_the_status_page_in_a_browser_shows_offsets_and_sizes_and_sorts_by_lag(
    tmp_path: Path,
) -> None:
    # produced while a consumer is paused: its partitions' lag passes the highlighting threshold
    behind = 4 * status.LAG_WARN_RECORDS
    async with running_group(tmp_path) as scene:
        first = await chromium_dom(scene.base, tmp_path)
        assert 'href="?sort=lag"' in first  # the order is a link: no script needed
        victim = scene.consumers[0]
        victim.send_signal(signal.SIGSTOP)
        try:
            await scene.produce(behind)
            await wait_for(
                scene.base,
                "the paused consumer's partitions past the threshold",
                lambda s: (
                    value(s, "coordinator_group_lag_records_max", group="g")
                    >= status.LAG_WARN_RECORDS
                ),
            )
            dom = await chromium_dom(scene.base + "?sort=lag", tmp_path)
            with pytest.raises(urllib.error.HTTPError) as refused:
                await trio.to_thread.run_sync(_fetch, scene.base + "records?topic=t&partition=0")
            off = refused.value
        finally:
            victim.kill()
            await victim.wait()
    offsets = _table(dom, "offsets")
    # group, topic, partition, committed, reported, log end, lag (records), lag (time)
    assert sorted((cells[1], int(cells[2])) for _, cells in offsets) == [
        ("t", p) for p in range(PARTITIONS)
    ]
    lags = [int(cells[6]) for _, cells in offsets]
    assert lags == sorted(lags, reverse=True) and lags[0] >= status.LAG_WARN_RECORDS
    assert [attributes == ' class="behind"' for attributes, _ in offsets] == [
        lag >= status.LAG_WARN_RECORDS for lag in lags
    ]
    ends = {}
    for _, (_, _, partition, committed, reported, end, lag, _) in offsets:
        assert int(reported or committed) + int(lag) == int(end)
        ends[int(partition)] = int(end)
    assert sum(ends.values()) == 200 + behind
    # the Topics table shows the same log ends, and each partition's records and bytes
    topics = {int(cells[1]): cells for _, cells in _table(dom, "topics")}
    assert {p: int(cells[3]) for p, cells in topics.items()} == ends
    assert {p: int(cells[4]) for p, cells in topics.items()} == ends  # nothing deleted yet
    assert all(int(cells[5]) > 0 for cells in topics.values())
    [(_, sizes)] = _table(dom, "sizes")
    assert sizes[:3] == ["t", str(PARTITIONS), str(200 + behind)]
    assert int(sizes[3]) == sum(int(cells[5]) for cells in topics.values())
    # no users and no access rules: no record viewer, and the page says so
    assert "Record viewer: off" in _visible_text(dom) and "/records?" not in dom
    assert off.code == 404 and off.read().decode().strip() == status.VIEWER_OFF


async def test_a_static_member_away_counts_alike_in_groups_describe_and_on_the_page(
    tmp_path: Path,
) -> None:
    """A static member whose process is gone holds its place for its session timeout: the page
    and ``groups describe`` both count it out of the members (no process, no partitions), and
    the page shows it apart, as away."""
    async with run_broker(tmp_path / "data", "--metrics-port", "0") as broker:
        match = _METRICS_URL.search(broker.log_text())
        assert match is not None, broker.log_text()
        base = match.group(1)
        created = await run_cli(
            "topics", "create", "t", "--partitions", "2", "--bootstrap", bootstrap(broker)
        )
        assert created.returncode == 0, created.stderr
        member = await open_cli(
            "consume", "t", "--group", "s", "--instance-id", "one", "--session-timeout", "60",
            "--bootstrap", bootstrap(broker),
            stdout=tmp_path / "s.out", stderr=tmp_path / "s.err",
        )  # fmt: skip
        try:
            await wait_for(
                base,
                "a Stable group of one",
                lambda s: (
                    value(s, "coordinator_groups", state="Stable") == 1
                    and value(s, "coordinator_members") == 1
                ),
            )
        finally:
            member.kill()
            await member.wait()
        await wait_for(base, "the member away", lambda s: value(s, "coordinator_members_away") == 1)
        members, away = _member_counts(await chromium_dom(base, tmp_path), "s")
        described = await run_cli("groups", "describe", "s", "--bootstrap", bootstrap(broker))
        assert described.returncode == 0, described.stderr
        report = await describe_group(broker, "s")
    assert (members, away) == (0, 1)
    assert ", 0 members" in described.stdout.decode().splitlines()[0]
    assert len(report["members"]) == members


def _member_counts(dom: str, group: str) -> tuple[int | None, int | None]:
    """The Groups table's member and away counts for ``group`` (None: no such cell)."""
    row = re.search(rf'<tr data-group="{group}"[^>]*>(.*?)</tr>', dom, flags=re.S)
    assert row is not None, dom

    def cell(name: str) -> int | None:
        found = re.search(rf'<td class="num {name}">(\d+)</td>', row.group(1))
        return None if found is None else int(found.group(1))

    return cell("members"), cell("away")


async def test_the_record_viewer_shows_a_reader_the_last_records_and_nobody_else(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "broker"
    for user in ("admin", "alice", "bob"):
        await add_user(data_dir, user, f"{user}-pw")
    done = await run_cli(
        "acls", "add", "--principal", "User:alice", "--operation", "read", "--topic", "t",
        "--data-dir", str(data_dir),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    async with run_secured_broker(
        data_dir, ["SASL_PLAINTEXT"], "--super-users=User:admin", "--metrics-port", "0"
    ) as broker:
        match = _METRICS_URL.search(broker.process.log_text())
        assert match is not None
        base = match.group(1)
        password = tmp_path / "admin.password"
        password.write_text("admin-pw\n")
        admin = [
            "--bootstrap", broker.bootstrap("SASL_PLAINTEXT"), "--sasl-mechanism=SCRAM-SHA-512",
            "--user=admin", f"--password-file={password}",
        ]  # fmt: skip
        done = await run_cli("topics", "create", "t", "--partitions", "1", *admin)
        assert done.returncode == 0, done.stderr
        hostile = '<script>document.title="owned"</script>'
        lines = [f"r{i}" for i in range(30)] + [hostile, "v" * 1000]
        done = await run_cli(
            "produce", "t", *admin, stdin="".join(f"{x}\n" for x in lines).encode()
        )
        assert done.returncode == 0, done.stderr

        records = base + "records?topic=t&partition=0"
        address = base.removeprefix("http://")
        dom = await chromium_dom(
            f"http://alice:alice-pw@{address}records?topic=t&partition=0", tmp_path
        )
        text = _visible_text(dom)
        shown = [cells for _, cells in _table(dom, "records")]
        assert [int(cells[0]) for cells in shown] == list(range(12, 32))
        assert [cells[3] for cells in shown[:-2]] == [f"r{i}" for i in range(12, 30)]
        assert shown[-2][3] == hostile and "<script" not in dom  # shown, not run
        assert shown[-1][3] == "v" * viewer.SHOWN_BYTES + " … (1000 bytes)"
        assert "Partition t-0" in text

        # the page links to it, and says who may use it
        page = await chromium_dom(base, tmp_path)
        assert 'href="/records?topic=t&amp;partition=0"' in page
        assert "for one of the broker's users with READ on the topic" in _visible_text(page)

        async def refused(url: str, user: str | None = None, password: str = "") -> int:
            with pytest.raises(urllib.error.HTTPError) as answer:
                await trio.to_thread.run_sync(_fetch_as, url, user, password)
            return answer.value.code

        assert await refused(records) == 401  # no login
        started = trio.current_time()
        assert await refused(records, "alice", "wrong") == 401
        assert trio.current_time() - started >= FAILED_AUTHENTICATION_DELAY
        assert await refused(records, "mallory", "alice-pw") == 401
        assert await refused(records, "bob", "bob-pw") == 403  # a user, without READ on t
        assert await refused(base + "records?topic=nowhere&partition=0", "admin", "admin-pw") == 404
        assert "t-0" in await trio.to_thread.run_sync(_fetch_as, records, "admin", "admin-pw")


def _fetch_as(url: str, user: str | None, password: str) -> str:
    """``url``'s body, logged in as ``user`` with HTTP Basic (None: not logged in)."""
    request = urllib.request.Request(url)
    if user is not None:
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    with urllib.request.urlopen(request, timeout=10) as response:
        body: bytes = response.read()
        return body.decode()
