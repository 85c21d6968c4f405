"""The ZooKeeper store's topic ids (docs/design.md#topic-ids): which incarnation of a name is in
force, read from its topic node and its ids node together.

Each name has one ids node (``/brokers/topic_ids/<topic>``, ``{"topic_id": uuid | null}``),
which every create and delete of the name writes, version-checked, in the transaction that
creates or deletes the topic node; so two racing requests cannot both act on one incarnation.
The id it names belongs to the topic node in place only if the ids node was written at or after
that node's creation (its mzxid is not below the topic node's czxid): a create writes both in one
transaction (one zxid), and a topic node created later was created by a broker of layout 2, which
knows no ids (a rolling upgrade), as one with no ids node or a null id was. Such a topic is given
a new id on sight, by a version-checked write that also checks the topic node is still the one
read; of two brokers that see it at once one wins and the other reads the winner's id, so all
agree, and no topic is ever published without an id.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import trio_util

from protocol.topic_configs import checked_configs
from protocol.types import NO_TOPIC_ID, TopicId

from .codec import decode_placement
from .interface import StoreUnavailable, TopicPlacement
from .kazoo_bridge import NoNodeError
from .zookeeper_layout import json_bytes, topic_config_path, topic_id_path, topic_path
from .zookeeper_session import RETRIES, Session, failure

__all__ = ["Incarnation", "TopicIds", "TopicsView", "ids_value"]

TopicsView = Mapping[str, TopicPlacement]


@attrs.frozen
class Incarnation:
    """A topic in force: its placement (with its id) and the versions of its two nodes, which a
    write of the topic checks."""

    placement: TopicPlacement
    topic_version: int
    ids_version: int
    #: The version of the settings node written with this incarnation (None: it has none, as a
    #: topic created by a broker older than topic settings).
    config_version: int | None = None


@attrs.frozen
class _Read:
    """One name's two nodes as read: the topic node's data and stat (none: no such topic), and
    the ids node's id and version (None: no node; an id of None: it names none or a stale one)."""

    topic: str
    data: bytes
    stat: Any
    recorded: TopicId | None
    ids_version: int | None
    #: The settings written with this topic node, and their node's version (None: none).
    configs: tuple[tuple[str, str], ...] = ()
    config_version: int | None = None


@attrs.define(eq=False, repr=False, slots=False)
class TopicIds(Session):
    """The topics' ids as one session reads and gives them (``ZooKeeperStore``)."""

    #: The topics as last read by the topic watch (None once the store is closed), which offset
    #: commits consult before asking ZooKeeper (``Groups.commit_offsets``).
    _topic_watch: trio_util.AsyncValue[TopicsView | None] = attrs.Factory(
        lambda: trio_util.AsyncValue(None)
    )

    async def _incarnations(
        self, names: Sequence[str], watch: Callable[[Any], None] | None = None
    ) -> dict[str, Incarnation]:
        """The topics in force among ``names`` (those that have none are left out), each with its
        id, given on sight to a topic that has none. ``watch`` is armed on both nodes of each:
        the ids node changes without its topic node only when an id is given on sight, and no
        broker publishes a topic before it has one, so its watch is a backstop."""
        found: dict[str, Incarnation] = {}
        pending = list(dict.fromkeys(names))
        for _ in range(RETRIES):
            lacking = []
            for read in await self._read_nodes(pending, watch):
                if read.recorded is not None and read.ids_version is not None:  # the id holds
                    found[read.topic] = self._incarnation(read, read.recorded, read.ids_version)
                else:
                    lacking.append(read)
            # Given on sight: each a version-checked transaction, all sent before any is awaited.
            given = []
            for read in lacking:
                topic_id = uuid.uuid4()
                given.append((read, topic_id, self._give_id(read, topic_id).commit_async()))
            pending = []
            for read, topic_id, result in given:
                results = await self._wait(result)
                if failure(results) is not None:
                    pending.append(read.topic)  # someone else wrote the name meanwhile: again
                    continue
                stamp = results[-1]  # the set's stat; a created node is at version 0
                version = 0 if read.ids_version is None else int(stamp.version)
                found[read.topic] = self._incarnation(read, topic_id, version)
            if not pending:
                return found
        raise StoreUnavailable(f"cannot give topics {pending!r} ids: their nodes keep changing")

    async def _read_nodes(
        self, names: Sequence[str], watch: Callable[[Any], None] | None
    ) -> list[_Read]:
        # Every question is asked before any answer is awaited: one round trip for all names.
        # The ids node is asked first, and one session's requests are answered in order: an id
        # written at or after the creation of the topic node read next was in force, for that
        # node, when the ids node was read (a node re-created between the reads is younger).
        # A settings node is written only with its topic node (in one transaction), so the
        # topic node's watch covers it.
        pending = []
        for name in names:
            ids_result = self._client.get_async(topic_id_path(name), watch=watch)
            pending.append(
                (
                    name,
                    ids_result,
                    self._client.get_async(topic_path(name), watch=watch),
                    self._client.get_async(topic_config_path(name)),
                )
            )
        reads = []
        for name, ids_result, topic_result, config_result in pending:
            try:
                ids_data, ids_stat = await self._wait(ids_result)
            except NoNodeError:
                ids_data, ids_stat = None, None
            try:
                data, stat = await self._wait(topic_result)
            except NoNodeError:
                continue  # no topic of the name (deleted since it was listed)
            recorded = None
            if ids_stat is not None and ids_stat.mzxid >= stat.czxid:
                recorded = self._decode_id(name, ids_data)
                if recorded == NO_TOPIC_ID:  # names no incarnation (another tool wrote it)
                    recorded = None
            version = None if ids_stat is None else int(ids_stat.version)
            configs, config_version = await self._read_configs(name, config_result, stat.czxid)
            reads.append(_Read(name, data, stat, recorded, version, configs, config_version))
        return reads

    async def _read_configs(
        self, topic: str, result: Any, created: int
    ) -> tuple[tuple[tuple[str, str], ...], int | None]:
        """The settings of the topic node created at zxid ``created``, and their node's version:
        none if the node is older than the topic node (a deleted incarnation's, left by a
        broker that knew no settings nodes)."""
        try:
            data, stat = await self._wait(result)
        except NoNodeError:
            return (), None
        if stat.mzxid < created:
            return (), None
        try:
            found = json.loads(data)["config"]
            configs = checked_configs((str(k), str(v)) for k, v in found.items())
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise StoreUnavailable(f"unreadable settings of topic {topic!r}: {exc}") from exc
        return configs, int(stat.version)

    def _give_id(self, read: _Read, topic_id: TopicId) -> Any:
        """A transaction giving the topic node read the id, if it is still that node (its
        version) and the ids node is as read."""
        tx = self._client.transaction()
        tx.check(topic_path(read.topic), read.stat.version)
        if read.ids_version is None:
            tx.create(topic_id_path(read.topic), ids_value(topic_id))
        else:
            tx.set_data(topic_id_path(read.topic), ids_value(topic_id), read.ids_version)
        return tx

    def _incarnation(self, read: _Read, topic_id: TopicId, ids_version: int) -> Incarnation:
        try:
            placement = decode_placement(read.topic, self._decode(read.data), topic_id)
        except (KeyError, TypeError, ValueError) as exc:
            raise StoreUnavailable(f"unreadable placement of topic {read.topic!r}: {exc}") from exc
        return Incarnation(
            placement=attrs.evolve(placement, configs=read.configs),
            topic_version=int(read.stat.version),
            ids_version=ids_version,
            config_version=read.config_version,
        )

    def _decode_id(self, topic: str, data: bytes) -> TopicId | None:
        try:
            value = json.loads(data)["topic_id"]
            return None if value is None else uuid.UUID(str(value))
        except (KeyError, TypeError, ValueError) as exc:
            raise StoreUnavailable(f"unreadable id of topic {topic!r}: {exc}") from exc

    async def _current_ids(self, names: Sequence[str]) -> dict[str, TopicId]:
        """The id of each name's incarnation in force, read now; NO_TOPIC_ID for a name that has
        none."""
        found = await self._incarnations(names)
        return {
            name: found[name].placement.topic_id if name in found else NO_TOPIC_ID for name in names
        }


def ids_value(topic_id: TopicId | None) -> bytes:
    """An ids node's data."""
    return json_bytes({"topic_id": None if topic_id is None else str(topic_id)})
