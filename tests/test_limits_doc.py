"""docs/limits.md lists every limit `coordinator serve` has, with the default it really uses."""

import argparse
import re
from pathlib import Path

from cli.main import _parser

DOC = Path(__file__).resolve().parents[1] / "docs" / "limits.md"
#: How the table writes a default of None.
UNBOUNDED = {
    "--max-connections": "the file limit less 1024, at least half of it",
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
