"""The metrics endpoint and the status page of a real broker, watched while a real consumer of a
running group is killed with SIGKILL: what an operator's Prometheus and browser would see."""

from __future__ import annotations

import html
import re
import shutil
import urllib.request
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from launch.processes import BrokerProcess, run_broker
from statemachine.slots import DEFAULT_SLOTS
from tests.cli.cli_process import bootstrap, describe_group, open_cli, run_cli, stop

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
    return _visible_text(done.stdout.decode())


def _group_row(text: str) -> tuple[str, int, int, int]:
    """The Groups table's row for ``g``: state, generation, members, maximum lag."""
    row = re.search(r"\bg (\w+) (\d+) (\d+) (\d+) \d+ [\d.]+[smh]\b", text)
    assert row is not None, text
    return row.group(1), int(row.group(2)), int(row.group(3)), int(row.group(4))


async def test_the_status_page_in_a_browser_shows_the_group_and_its_new_generation(
    tmp_path: Path,
) -> None:
    async with running_group(tmp_path) as scene:
        text = await open_in_chromium(scene.base, tmp_path)
        state, generation, members, lag = _group_row(text)
        assert (state, members, lag) == ("Stable", 2, 0)
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
