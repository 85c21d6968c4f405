"""The CPU budget the door keeps (broker/cpu_budget.py, docs/design.md#shedding-load): the
limit read from a cgroup as the kernel shows it (files written here, in the layouts of cgroup v1
and v2), the use over a window, and the door turning newcomers away once most is used."""

from __future__ import annotations

from pathlib import Path

from broker.cpu_budget import CpuBudget, cpu_limit
from broker.door import Door
from protocol import ClusterMetadataRequest, ClusterMetadataResponse, ErrorCode
from tests.broker.test_shedding import StubLag, _registration, _request


def _cgroup(tmp_path: Path, line: str, files: dict[str, str]) -> tuple[Path, Path]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    proc = tmp_path / "cgroup"
    proc.write_text(line + "\n")
    root = tmp_path / "sys"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return proc, root


def test_the_limit_is_the_quota_of_cgroup_v2_or_v1_and_one_core_at_most(tmp_path: Path) -> None:
    v2 = _cgroup(tmp_path / "v2", "0::/pod/broker", {"pod/broker/cpu.max": "25000 100000\n"})
    assert cpu_limit(*v2) == 0.25
    unlimited = _cgroup(tmp_path / "max", "0::/", {"cpu.max": "max 100000\n"})
    assert cpu_limit(*unlimited) == 1.0
    v1 = _cgroup(
        tmp_path / "v1",
        "4:cpu,cpuacct:/bench\n3:memory:/bench",
        {
            "cpu,cpuacct/bench/cpu.cfs_quota_us": "12500\n",
            "cpu,cpuacct/bench/cpu.cfs_period_us": "100000\n",
        },
    )
    assert cpu_limit(*v1) == 0.125
    v1_none = _cgroup(
        tmp_path / "v1none",
        "4:cpu,cpuacct:/",
        {"cpu,cpuacct/cpu.cfs_quota_us": "-1\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n"},
    )
    assert cpu_limit(*v1_none) == 1.0
    # Two cores of quota: the loop's one thread still uses one at most.
    wide = _cgroup(tmp_path / "wide", "0::/", {"cpu.max": "200000 100000\n"})
    assert cpu_limit(*wide) == 1.0
    assert cpu_limit(tmp_path / "missing", tmp_path) == 1.0


def test_the_budget_is_spent_above_its_share_of_the_limit_over_the_window() -> None:
    budget = CpuBudget(share=0.8)
    assert budget.used() == 0.0 and not budget.spent()
    for second in range(6):
        budget.sample(float(second), 0.2 * second, limit=0.25)
    assert round(budget.used(), 6) == 0.2 and not budget.spent()  # 0.2 of 0.25: 80%, not above
    budget.sample(6.0, 0.2 * 5 + 0.9, limit=0.25)  # a second at 0.9 cores: the window's 0.36
    assert budget.used() > 0.2 and budget.spent()


def test_the_door_turns_newcomers_away_while_the_budget_is_spent_though_the_loop_is_on_time() -> (
    None
):
    budget = CpuBudget(share=0.8)
    door = Door(lag=StubLag(0.0), bound=0.5, budget=budget)
    metadata = ClusterMetadataRequest(group_id="g", topics=None)
    budget.sample(0.0, 0.0, limit=0.3)
    budget.sample(5.0, 1.0, limit=0.3)  # 0.2 cores of 0.3: room
    assert door.refusal(_request(metadata, 4), first=True) is None
    assert door.refusal(_request(_registration(), 3), first=True) is None
    budget.sample(6.0, 1.0 + 0.6, limit=0.3)  # 0.267 cores over the window: past 0.24
    answer = door.refusal(_request(metadata, 4), first=True)
    assert isinstance(answer, ClusterMetadataResponse)
    # Only members leaving make room: come back after the longest hint.
    assert (answer.error_code, answer.throttle_time_ms) == (ErrorCode.BROKER_BUSY, 10_000)
    # The members in are never turned away.
    assert door.refusal(_request(metadata, 4), first=False) is None
