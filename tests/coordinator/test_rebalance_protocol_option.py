"""``serve --rebalance-protocol`` reaches the coordinator's config, incremental by default."""

import pytest

from cli.main import _parser
from coordinator.config import CoordinatorConfig, RebalanceProtocol


def test_the_default_is_incremental() -> None:
    assert CoordinatorConfig().rebalance_protocol is RebalanceProtocol.INCREMENTAL
    assert _parser().parse_args(["serve"]).rebalance_protocol == "incremental"


@pytest.mark.parametrize("name", ["incremental", "eager"])
def test_serve_takes_either_protocol(name: str) -> None:
    args = _parser().parse_args(["serve", "--rebalance-protocol", name])
    assert CoordinatorConfig(rebalance_protocol=args.rebalance_protocol).rebalance_protocol is (
        RebalanceProtocol(name)
    )


def test_serve_refuses_another(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _parser().parse_args(["serve", "--rebalance-protocol", "cooperative"])
    assert "invalid choice" in capsys.readouterr().err
