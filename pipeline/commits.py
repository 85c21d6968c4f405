"""Moving a consumer group's committed offsets with a Spark job's progress.

The job's own truth is its checkpoint; the group's offsets are a mirror of it for operators, so
that ``coordinator groups describe G`` shows the job's lag. Each finished micro-batch's end
offsets are committed with the standalone OffsetCommit (generation -1, no member), which the
coordinator accepts only while the group has no live members: a Spark job and a consumer group
never share one group.

Why a query listener: Spark reports progress after a micro-batch's commit-log entry is written,
for every batch including the last one under ``availableNow``; the stream reader's ``commit``
runs one batch late and not at all for that last one. Listener events are delivered
asynchronously, so after ``awaitTermination`` call :meth:`GroupOffsetCommitter.commit_last` to
commit the final batch synchronously. An event delivered after that (or after a later batch's)
names an earlier batch: it is skipped, so the group's offsets never move back to it.
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

from pyspark.sql.streaming.listener import StreamingQueryListener
from pyspark.sql.streaming.query import StreamingQuery

from pipeline import offsets as om
from pipeline.wire import Cluster
from transport.security import ClientSecurity

log = logging.getLogger(__name__)


def commit_group_offsets(
    bootstrap: str,
    group: str,
    offsets: om.OffsetsJson | str,
    security: ClientSecurity | None = None,
) -> None:
    """Commit ``offsets`` (a source offset map, as JSON text or dict) as ``group``'s offsets.

    The commit names topics, not their ids (SPEC.md §11.12): the coordinator applies it to the
    topic of that name when it arrives. So that a batch read from a topic since deleted and
    created again does not move the new topic's offsets, the ids the map names are checked
    first (``pipeline.offsets.TopicRecreated``, nothing committed); a re-creation between that
    check and the commit is not seen."""
    text = offsets if isinstance(offsets, str) else json.dumps(offsets)
    parsed = om.from_json(text)
    if parsed:
        with Cluster(bootstrap, security) as cluster:
            cluster.commit_offsets(group, parsed, om.ids_from_json(text))


def _source_offsets(source: Any) -> om.OffsetsJson | None:
    """A progress source's end offsets if they are this data source's offset map."""
    text = source["endOffset"] if isinstance(source, dict) else source.endOffset
    try:
        data = json.loads(text) if isinstance(text, str) else text
    except (TypeError, ValueError):
        return None
    if not isinstance(data, dict) or not all(
        isinstance(partitions, dict)
        and all(
            (isinstance(o, int) and p.isdigit()) or (p == om.ID_KEY and isinstance(o, str))
            for p, o in partitions.items()
        )
        for partitions in data.values()
    ):
        return None
    return data


class GroupOffsetCommitter(StreamingQueryListener):
    """``spark.streams.addListener(GroupOffsetCommitter(bootstrap, group, query_name))``: commits
    the end offsets of each finished micro-batch of the query named ``query_name``, connecting
    as ``security`` says (``pipeline.client_security(options)`` makes it from the source's
    options)."""

    def __init__(
        self,
        bootstrap: str,
        group: str,
        query_name: str,
        security: ClientSecurity | None = None,
    ) -> None:
        self.bootstrap = bootstrap
        self.security = security
        self.group = group
        self.query_name = query_name
        #: The latest batch committed, by query id (which a restart from the checkpoint keeps):
        #: the listener's thread and ``commit_last``'s both commit, and an event may come late.
        self._committed: dict[str, int] = {}
        self._lock = threading.Lock()

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        progress = event.progress
        if progress.name != self.query_name:
            return
        self._commit(str(progress.id), progress.batchId, progress.sources)

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        pass

    def commit_last(self, query: StreamingQuery) -> None:
        """Commit the query's last reported batch now (the listener may not have caught up)."""
        progress = query.lastProgress
        if progress is not None:
            query_id, batch_id, sources = (
                _field(progress, n) for n in ("id", "batchId", "sources")
            )
            self._commit(str(query_id), batch_id, sources)

    def _commit(self, query_id: str, batch_id: int, sources: Any) -> None:
        with self._lock:  # one batch at a time, and never one older than the latest committed
            if batch_id <= self._committed.get(query_id, -1):
                return
            for source in sources:
                offsets = _source_offsets(source)
                if offsets is None:
                    continue
                try:
                    commit_group_offsets(self.bootstrap, self.group, offsets, self.security)
                except Exception:  # the listener bus must survive an unreachable coordinator
                    log.exception("committing offsets of group %s failed", self.group)
                    return  # the next batch's event commits again
            self._committed[query_id] = batch_id


def _field(progress: Any, name: str) -> Any:
    """A field of a progress report: an object from a listener, a dict from ``lastProgress`` in
    some PySpark versions."""
    return getattr(progress, name) if hasattr(progress, name) else progress[name]
