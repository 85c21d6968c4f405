"""The group offset committer never moves a group's offsets back to an earlier micro-batch's:
Spark delivers listener events asynchronously, so a batch's progress event may arrive after the
next batch's, or after ``commit_last`` committed the final batch (issue 38's session noticed the
group going backwards until the last event landed). Fake progress events; no Spark session."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

import pipeline.commits
from pipeline import GroupOffsetCommitter


def progress(query_id: str, batch_id: int, end: int) -> SimpleNamespace:
    return SimpleNamespace(
        name="q",
        id=query_id,
        batchId=batch_id,
        sources=[{"endOffset": json.dumps({"t": {"0": end}})}],
    )


@pytest.fixture
def committed(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any]]:
    calls: list[tuple[str, Any]] = []

    def commit(bootstrap: str, group: str, offsets: Any, security: Any = None) -> None:
        calls.append((group, offsets))

    monkeypatch.setattr(pipeline.commits, "commit_group_offsets", commit)
    return calls


def test_a_late_event_of_an_earlier_batch_is_not_committed(
    committed: list[tuple[str, Any]],
) -> None:
    committer = GroupOffsetCommitter("127.0.0.1:9092", "g", query_name="q")
    committer.onQueryProgress(SimpleNamespace(progress=progress("a", 0, 10)))
    committer.onQueryProgress(SimpleNamespace(progress=progress("a", 2, 30)))
    committer.onQueryProgress(SimpleNamespace(progress=progress("a", 1, 20)))  # late
    committer.commit_last(SimpleNamespace(lastProgress=progress("a", 2, 30)))  # type: ignore[arg-type]
    assert committed == [("g", {"t": {"0": 10}}), ("g", {"t": {"0": 30}})]


def test_a_new_query_starts_its_own_count_and_other_queries_are_ignored(
    committed: list[tuple[str, Any]],
) -> None:
    committer = GroupOffsetCommitter("127.0.0.1:9092", "g", query_name="q")
    committer.onQueryProgress(SimpleNamespace(progress=progress("a", 5, 50)))
    # A fresh checkpoint: a new query id, whose batches count from 0 again.
    committer.onQueryProgress(SimpleNamespace(progress=progress("b", 0, 7)))
    other = SimpleNamespace(progress=SimpleNamespace(**{**vars(progress("c", 9, 90)), "name": "x"}))
    committer.onQueryProgress(other)
    assert committed == [("g", {"t": {"0": 50}}), ("g", {"t": {"0": 7}})]
