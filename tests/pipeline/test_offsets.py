"""Offset planning of the Spark source and its check of topic ids: pure functions, no Spark."""

from __future__ import annotations

import json
import pickle
import uuid

import pytest

from pipeline import offsets as om
from protocol import TopicPartition

A0 = TopicPartition(topic="a", partition=0)
A1 = TopicPartition(topic="a", partition=1)
B0 = TopicPartition(topic="b", partition=0)


def test_offset_maps_round_trip_through_spark_json() -> None:
    offsets = {A0: 3, A1: 0, B0: 12}
    assert om.to_json(offsets) == {"a": {"0": 3, "1": 0}, "b": {"0": 12}}
    assert om.from_json(om.to_json(offsets)) == offsets
    assert om.from_json('{"a": {"1": 5}}') == {A1: 5}


def test_starting_offsets_resolve_against_log_bounds() -> None:
    bounds = {A0: (2, 10), A1: (0, 4)}
    assert om.starting_offsets("earliest", bounds, {}) == {A0: 2, A1: 0}
    assert om.starting_offsets("latest", bounds, {}) == {A0: 10, A1: 4}
    # a partition without a committed offset starts at its log start; one below it is clamped
    assert om.starting_offsets("group", bounds, {A1: 3}) == {A0: 2, A1: 3}
    assert om.starting_offsets("group", bounds, {A0: 1}) == {A0: 2, A1: 0}
    assert om.starting_offsets('{"a": {"0": 7, "1": -1}}', bounds, {}) == {A0: 7, A1: 4}
    with pytest.raises(ValueError, match="startingOffsets"):
        om.starting_offsets("newest", bounds, {})


def test_a_read_limit_is_shared_fairly_and_never_exceeded() -> None:
    start = {A0: 0, A1: 0, B0: 100}
    ends = {A0: 1000, A1: 2, B0: 1000}
    limited = om.limit_ends(start, ends, 100)
    assert limited == {A0: 49, A1: 2, B0: 149}
    assert sum(limited[tp] - start[tp] for tp in start) == 100
    assert om.limit_ends(start, ends, 10_000) == ends


def test_topic_selection_takes_exactly_one_of_topic_topics_pattern() -> None:
    assert om.TopicSelector({"topics": "a, b"}).names == ("a", "b")
    pattern = om.TopicSelector({"pattern": "ev.*"})
    assert pattern.matches("events") and not pattern.matches("xevents")
    with pytest.raises(ValueError, match="exactly one"):
        om.TopicSelector({"topic": "a", "pattern": "a.*"})


def test_a_batch_range_skips_empty_partitions_and_starts_new_ones_at_zero() -> None:
    assert list(om.ranges({A0: 5, A1: 2}, {A0: 5, A1: 4, B0: 3})) == [(A1, 2, 4), (B0, 0, 3)]


def test_min_partitions_cuts_long_ranges_in_proportion_without_gaps() -> None:
    pieces = om.split([(A0, 0, 900), (A1, 10, 110), (B0, 0, 2)], 10)
    assert [(tp, a, b) for tp, a, b in pieces if tp == A0] == [
        (A0, i * 100, (i + 1) * 100) for i in range(9)
    ]
    assert [(tp, a, b) for tp, a, b in pieces if tp != A0] == [(A1, 10, 110), (B0, 0, 2)]
    assert om.split([(A0, 0, 3)], 10) == [(A0, 0, 1), (A0, 1, 2), (A0, 2, 3)]
    assert om.split([(A0, 0, 900), (A1, 0, 5)], 2) == [(A0, 0, 900), (A1, 0, 5)]


OLD_ID = uuid.UUID("11111111-1111-4111-8111-111111111111")
NEW_ID = uuid.UUID("22222222-2222-4222-8222-222222222222")


def test_offset_maps_name_each_topics_id_and_read_maps_without_ids() -> None:
    offsets = {A0: 3, A1: 0, B0: 12}
    written = om.to_json(offsets, {"a": OLD_ID})
    assert written == {"a": {"id": str(OLD_ID), "0": 3, "1": 0}, "b": {"0": 12}}
    assert om.from_json(written) == offsets
    assert om.ids_from_json(json.dumps(written)) == {"a": OLD_ID}
    # a checkpoint written before ids names none
    assert om.ids_from_json({"a": {"0": 3}}) == {}


def test_a_topic_created_again_under_its_name_fails_the_next_offsets() -> None:
    with pytest.raises(om.TopicRecreated) as caught:
        om.carry_ids({"a": OLD_ID, "b": NEW_ID}, {"a": NEW_ID, "b": NEW_ID})
    message = str(caught.value)
    assert "topic 'a' was deleted and created again" in message
    assert f"its id was {OLD_ID}, it is now {NEW_ID}" in message
    assert "new checkpoint location" in message
    assert (caught.value.topic, caught.value.old, caught.value.new) == ("a", OLD_ID, NEW_ID)
    # Spark's driver and workers may hand the error between processes
    assert str(pickle.loads(pickle.dumps(caught.value))) == message


def test_ids_are_taken_where_the_offsets_had_none_and_kept_while_a_topic_is_gone() -> None:
    # a checkpoint written before ids: the topics' current ids from now on
    assert om.carry_ids({}, {"a": NEW_ID}) == {"a": NEW_ID}
    # unchanged; a topic gone from the metadata keeps its id, so that its return is noticed
    assert om.carry_ids({"a": OLD_ID, "b": NEW_ID}, {"a": OLD_ID}) == {"a": OLD_ID, "b": NEW_ID}
    with pytest.raises(om.TopicRecreated, match="topic 'b'"):
        om.carry_ids({"a": OLD_ID, "b": NEW_ID}, {"a": OLD_ID, "b": OLD_ID})
