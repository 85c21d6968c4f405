"""The topic watch: a new topic, new partitions, a deleted topic or one created again rebalance
every interested group (docs/design.md#rebalance-triggers); a deleted topic's offsets, and those
of an incarnation no longer in force (docs/design.md#topic-ids), are forgotten first."""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping

import trio

from coordinator.context import CoordinatorContext
from coordinator.driver import GroupDriver
from store import StoreUnavailable

log = logging.getLogger(__name__)


async def watch_topics(
    context: CoordinatorContext,
    groups: Mapping[str, GroupDriver],
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Keep ``context.topics`` as the store has them, and tell each group what changed."""
    started = False
    async for topics in context.store.topic_updates():
        known = context.topics
        deleted = known.keys() - topics.keys()
        # Deleted and created again since the last report, seen as one change: another topic.
        recreated = {
            name
            for name, placement in topics.items()
            if name in known and known[name].topic_id != placement.topic_id
        }
        changed = (
            deleted
            | recreated
            | {
                name
                for name, placement in topics.items()
                if name not in known or known[name].partition_count != placement.partition_count
            }
        )
        context.topics = topics
        context.offsets.topic_ids = {name: placement.topic_id for name, placement in topics.items()}
        if deleted or recreated:
            await _forget_topics(context, deleted | recreated)
        if changed:
            for driver in list(groups.values()):
                driver.feed(driver.group.topics_changed, changed, trio.current_time())
        if not started:
            started = True
            task_status.started()


async def _forget_topics(context: CoordinatorContext, deleted: Collection[str]) -> None:
    """Forget deleted topics' offsets, or those of an incarnation no longer in force: in memory,
    and in the store those the committer wrote after the store deleted the topic with every
    group's offsets for it (before this coordinator saw it gone). A report or commit for them
    from now on counts for nothing (``context.topics`` no longer has them, or has another
    incarnation), so none is written again."""
    written = await context.offsets.forget_topics(deleted)
    for group_id, topics in sorted(written.items()):
        for topic in sorted(topics):
            try:
                await context.store.delete_offsets(context.epoch, group_id, topic)
            except StoreUnavailable as exc:
                log.warning(
                    "group %r: offsets of deleted topic %r may remain in the store: %s",
                    group_id,
                    topic,
                    exc,
                )
