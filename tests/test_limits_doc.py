"""docs/limits.md lists every limit `coordinator serve` has, with the default it really uses."""

import argparse
import re
import resource
from pathlib import Path

import pytest

from broker import status
from cli.main import _parser
from coordinator.limits import RequestLimits
from transport.limits import ConnectionLimits, FileBudget

DOC = Path(__file__).resolve().parents[1] / "docs" / "limits.md"
#: How the table writes a default of None.
UNBOUNDED = {
    "--max-connections": "the file budget less 64 (see Files)",
    "--max-connections-per-address": "no limit",
}


def _limit_options() -> dict[str, object]:
    serve = next(
        action for action in _parser()._actions if isinstance(action, argparse._SubParsersAction)
    ).choices["serve"]
    (group,) = [g for g in serve._action_groups if g.title and g.title.startswith("limits")]
    return {action.option_strings[0]: action.default for action in group._group_actions}


def test_every_limit_is_documented_with_its_default() -> None:
    rows = dict(re.findall(r"^\| `(--[a-z-]+)` \| ([^|]+?) \|", DOC.read_text(), re.MULTILINE))
    options = _limit_options()
    assert set(rows) == set(options)
    for option, default in options.items():
        expected = UNBOUNDED[option] if default is None else str(default)
        assert rows[option] == expected, option


def test_the_file_arithmetic_is_the_budget_serve_derives(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Files table, under the 20,000-file limit it is worked out for: the budget, the
    connections and the partitions' default are the ones the code computes."""
    rows = {
        label: int(files.replace(",", ""))
        for label, files in re.findall(r"^\| ([^|]+?) \| ([\d,]+) \|$", DOC.read_text(), re.M)
    }
    monkeypatch.setattr(resource, "getrlimit", lambda _: (20_000, 20_000))
    budget = FileBudget.of_process()
    partitions = RequestLimits().max_partitions_per_broker
    assert rows == {
        "file limit": 20_000,
        "reserve": 20_000 - budget.limit,
        "budget: client connections and open segment files together": budget.limit,
        "kept for segment files": budget.floor,
        "client connections at most (no partition in use)": ConnectionLimits().connection_limit(),
        "`--max-partitions-per-broker`, one segment file each while in use": partitions,
        "client connections beside all 10,000 partitions in use, no file reopened": (
            budget.limit - partitions
        ),
    }
    assert partitions + budget.floor <= budget.limit  # the default fits the budget


def test_the_metrics_ports_bounds_are_the_ones_it_keeps() -> None:
    (section,) = re.findall(r"^## The metrics port\n(.*?)\n## ", DOC.read_text(), re.M | re.S)
    said = " ".join(section.split())
    assert f"at most {status.MAX_CONNECTIONS} connections open" in said
    assert f"a request head of at most {status.MAX_HEAD_BYTES // 1024} KiB" in said
    assert f"whole within {status.HEAD_DEADLINE:g} s of the accept" in said
    assert f"the answer sent within {status.ANSWER_DEADLINE:g} s" in said
    assert f"{status.MAX_CONCURRENT} answered at once" in said
