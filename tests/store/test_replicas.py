"""Replica assignments as the stores spell them (store/codec.py): a topic of one replica per
partition keeps the shape it always had, so a broker of an older layout reads it; a replicated
one lists each partition's replicas, its preferred leader first. And the two replication
settings of a topic (protocol/topic_configs.py)."""

from __future__ import annotations

import uuid

import pytest

from protocol.topic_configs import (
    InvalidTopicConfig,
    checked_configs,
    min_insync_replicas,
    parse_config_argument,
    unclean_leader_election,
)
from statemachine.partition_state import IsrEntry, PartitionState
from store import TopicPlacement
from store.codec import (
    decode_partition_state,
    decode_placement,
    encode_partition_state,
    encode_placement,
)

TOPIC_ID = uuid.uuid4()


def test_one_replica_per_partition_is_encoded_as_it_always_was() -> None:
    placement = TopicPlacement(topic="t", brokers=(1, 2, 1), topic_id=TOPIC_ID)
    assert encode_placement(placement) == {"0": 1, "1": 2, "2": 1}
    assert decode_placement("t", {"0": 1, "1": 2, "2": 1}, TOPIC_ID) == placement


def test_replicas_are_encoded_as_lists_led_by_the_preferred_leader() -> None:
    placement = TopicPlacement.of(
        topic="t", assignment=((1, 2, 3), (2, 3, 1)), topic_id=TOPIC_ID, configs=()
    )
    assert placement.brokers == (1, 2)
    assert placement.replication_factor == 3
    assert encode_placement(placement) == {"0": [1, 2, 3], "1": [2, 3, 1]}
    assert decode_placement("t", {"0": [1, 2, 3], "1": [2, 3, 1]}, TOPIC_ID) == placement


@pytest.mark.parametrize(
    "value",
    [
        {"0": [1, 2], "1": 2},  # two shapes
        {"0": [1, 2], "1": [2]},  # two factors
        {"0": [1, 1]},  # one broker twice
        {"0": []},
    ],
)
def test_a_placement_of_no_one_shape_is_unreadable(value: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        decode_placement("t", value, TOPIC_ID)


def test_brokers_must_be_the_first_replicas() -> None:
    with pytest.raises(ValueError, match="led by broker 2"):
        TopicPlacement(topic="t", brokers=(2,), replicas=((1, 2),), topic_id=TOPIC_ID)


def test_a_state_round_trips_with_the_version_it_was_read_at() -> None:
    state = PartitionState(
        leader=2,
        leader_epoch=7,
        isr=(
            IsrEntry(broker_id=2, log_dir=uuid.uuid4()),
            IsrEntry(broker_id=3, log_dir=uuid.uuid4()),
        ),
        version=4,
    )
    encoded = encode_partition_state(state)
    assert encoded == {
        "leader": 2,
        "leader_epoch": 7,
        "isr": [[2, str(state.isr[0].log_dir)], [3, str(state.isr[1].log_dir)]],
    }
    assert decode_partition_state(encoded, 4) == state


def test_min_insync_replicas_defaults_to_two_from_a_factor_of_three() -> None:
    assert [min_insync_replicas((), factor) for factor in (1, 2, 3, 5)] == [1, 1, 2, 2]
    assert min_insync_replicas((("min.insync.replicas", "3"),), 3) == 3
    assert checked_configs([("min.insync.replicas", "3")], replication_factor=3) == (
        ("min.insync.replicas", "3"),
    )
    with pytest.raises(InvalidTopicConfig, match="between 1 and 2147483647, not 0"):
        checked_configs([("min.insync.replicas", "0")])


def test_unclean_election_is_off_unless_a_topic_says_so() -> None:
    assert not unclean_leader_election(())
    assert unclean_leader_election(checked_configs([("unclean.leader.election.enable", "True")]))
    assert not unclean_leader_election((("unclean.leader.election.enable", "false"),))
    assert parse_config_argument("unclean.leader.election.enable=false") == (
        "unclean.leader.election.enable",
        "false",
    )
    with pytest.raises(InvalidTopicConfig, match="must be true or false, not '1'"):
        parse_config_argument("unclean.leader.election.enable=1")
