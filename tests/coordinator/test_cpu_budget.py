"""The CPU budget the door keeps (coordinator/cpu_budget.py, docs/design.md#shedding-load): the
limit read from a cgroup as the kernel shows it (files written here, in the layouts of cgroup v1
and v2), the use over a window, and the door turning newcomers away once most is used."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.door import Door
from coordinator.cpu_budget import CpuBudget, cpu_limit
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


def test_saturated_is_all_the_limit_used_over_the_last_second_even_when_sampled_late() -> None:
    budget = CpuBudget()
    for tick in range(9):  # 0.1 cores of 0.125 for two seconds, sampled every 0.25 s
        budget.sample(tick * 0.25, tick * 0.25 * 0.1, limit=0.125)
    assert not budget.saturated()
    # Then all of it, and the sampler itself late: the next sample comes 3 s later. The use
    # is measured back to the sample before, not over the one sample in the last second.
    budget.sample(5.0, 2.0 * 0.1 + 3.0 * 0.125, limit=0.125)
    assert budget.used(1.0) == pytest.approx(0.125) and budget.saturated()
    # The door's window is the longer one: five seconds back, or the oldest sample kept.
    assert round(budget.used(), 4) == round((0.2 + 0.375) / 5.0, 4)


def test_a_member_s_cost_is_learned_from_steady_windows_only() -> None:
    """A join costs far more per member than holding them: the cost is what the CPU used over a
    whole window, kept up and with a steady member count, says per member."""
    budget = CpuBudget()
    coordinator = object()
    clock = [0.0, 0.0]

    def second(cores: float, members: int) -> None:
        budget.members[coordinator] = members
        for _ in range(4):
            clock[0] += 0.25
            clock[1] += 0.25 * cores
            budget.sample(clock[0], clock[1], limit=1.0)

    for members in range(1000, 9001, 1000):  # joining: 0.9 cores, members growing
        second(0.9, members)
    assert budget.cost is None and budget.room(0.8) is None
    for _ in range(6):  # held: 9,000 at 0.27 cores
        second(0.27, 9000)
    assert budget.cost == pytest.approx(0.27 / 9000)
    # A quota of an eighth comes down on it: room for 3,333, and the cost is not relearned
    # from the windows it uses all of.
    for _ in range(6):
        budget.members[coordinator] = 9000
        for _ in range(4):
            clock[0] += 0.25
            clock[1] += 0.25 * 0.125
            budget.sample(clock[0], clock[1], limit=0.125)
    assert budget.saturated() and budget.held() == 9000
    assert budget.cost == pytest.approx(0.27 / 9000)
    assert budget.room(0.8) == pytest.approx(0.8 * 0.125 * 9000 / 0.27)
    # A handful of members says nothing of a member's cost (the broker's own upkeep).
    idle = CpuBudget()
    idle.members[coordinator] = 10
    for tick in range(40):
        idle.sample(tick * 0.25, tick * 0.25 * 0.01, limit=1.0)
    assert idle.cost is None
