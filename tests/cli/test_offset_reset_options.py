"""``consume`` names offset resets as the library and the Spark source do: earliest / latest."""

import pytest

from cli.data import _offset_reset
from cli.main import _parser


@pytest.mark.parametrize(
    ("argv", "reset"),
    [
        ([], "latest"),
        (["--auto-offset-reset", "earliest"], "earliest"),
        (["--auto-offset-reset", "latest"], "latest"),
        (["--from-beginning"], "earliest"),
        (["--from-beginning", "--auto-offset-reset", "earliest"], "earliest"),
    ],
)
def test_consume_takes_earliest_and_latest(argv: list[str], reset: str) -> None:
    args = _parser().parse_args(["consume", "t", *argv])
    assert _offset_reset(args) == reset


def test_from_beginning_and_latest_contradict() -> None:
    args = _parser().parse_args(
        ["consume", "t", "--from-beginning", "--auto-offset-reset", "latest"]
    )
    with pytest.raises(ValueError, match="contradicts"):
        _offset_reset(args)
