"""The ZooKeeper store's replicated partitions (docs/design.md#metadata-layout): one state node per
partition, under its topic's id, and a change note per write, which brokers follow through one
child watch.

Versions. A state node's version is the partition epoch: every write names the version its
writer read (``StateWrite.expected_version``; -1: the node must not exist yet) and is a
``set_data``/``create`` conditional on it. A transaction that fails on a stale state drops that
one write, which is reported lost so that its writer reads the state again and decides again,
and commits the rest: a lost write is never retried blind.

Offices. A controller's writes carry its slot's epoch: the transaction first checks the slot's
counter and election node (``Session._office_transaction``), so a deposed controller writes
nothing (``Deposed``), and the office must control every key written (``admits_partition``). A
leader's change of its in-sync replicas carries no epoch: the version alone orders it.

Change notes. Each transaction writing states also creates a sequential node under
``PARTITION_CHANGES`` holding those states with their new versions. A reader lists that
directory with a child watch, reads every state once, then applies the notes created since, in
order, keeping a state only if its version is above the one it holds, so a note read twice (or a
state read whole after its note was written) changes nothing. Writers delete notes older than a
minute, or beyond the newest ``_KEPT_NOTES``; a reader too far behind to find a note it needs
reads every state again. It finds out from the directory's ``cversion``, which every child
created or deleted moves on by one: from one listing to the next, it moved by the notes that
appeared, plus the known notes that went, plus two for each note created and deleted in between,
which the reader has missed.
"""

from __future__ import annotations

import contextlib
import logging
import math
import types
import uuid
from collections.abc import AsyncGenerator, Iterable, Mapping, Sequence
from typing import Any

import attrs
import trio

from statemachine.partition_state import PartitionKey, PartitionState, StateWrite

from .codec import decode_partition_state, encode_partition_state
from .interface import Deposed, StoreUnavailable
from .kazoo_bridge import BadVersionError, NodeExistsError, NoNodeError, NotEmptyError
from .zookeeper_layout import (
    PARTITION_CHANGES,
    PARTITION_STATES,
    json_bytes,
    partition_state_path,
)
from .zookeeper_session import _OP_OVERHEAD, _TX_BYTES, Events, Office, Op, Session, failure

__all__ = ["Partitions"]

log = logging.getLogger(__name__)

#: Notes younger than this (by ZooKeeper's clock) are kept, so a broker a little behind reads
#: the notes it missed instead of every state.
_NOTE_AGE_MS = 60_000
#: At most this many notes are kept, however young.
_KEPT_NOTES = 10_000
#: A writer prunes notes at most this often.
_PRUNE_INTERVAL = 10.0
#: The oldest notes a prune looks at the age of: enough to keep up with any writer.
_PRUNE_BATCH = 200
_NOTE_PREFIX = "c-"

StateView = Mapping[PartitionKey, PartitionState]


@attrs.frozen
class _Listing:
    """The change notes as listed, and the directory's ``cversion`` with them."""

    names: frozenset[str]
    cversion: int

    def missed_notes(self, later: _Listing) -> bool:
        """Whether a note was created and deleted between this listing and ``later``."""
        went = len(self.names - later.names)
        came = len(later.names - self.names)
        return later.cversion - self.cversion != went + came


def _seq(name: str) -> int:
    return int(name.removeprefix(_NOTE_PREFIX))


@attrs.define(eq=False, repr=False, slots=False)
class Partitions(Session):
    """The replicated partitions' states as one session reads and writes them
    (``ZooKeeperStore``)."""

    #: Child watch events on the change notes, and session state changes (a watch may not
    #: outlive its session).
    _partition_events: Events = attrs.field(
        init=False, default=attrs.Factory(lambda self: Events(self._bridge), takes_self=True)
    )
    _last_prune: float = -math.inf

    # Reads

    async def partition_states(self) -> StateView:
        return types.MappingProxyType(await self._read_all_states())

    async def read_partition_states(self, keys: Iterable[PartitionKey]) -> StateView:
        return types.MappingProxyType(await self._read_states(list(dict.fromkeys(keys))))

    async def _read_all_states(self) -> dict[PartitionKey, PartitionState]:
        listed = [
            (topic_id, self._client.get_children_async(partition_state_path(topic_id)))
            for topic_id in await self._children(PARTITION_STATES, missing_ok=True)
        ]
        keys: list[PartitionKey] = []
        for topic_id, result in listed:
            try:
                partitions = await self._wait(result)
            except NoNodeError:
                continue  # the topic's deleted
            try:
                keys.extend(
                    PartitionKey(topic_id=uuid.UUID(topic_id), partition=int(partition))
                    for partition in partitions
                )
            except ValueError as exc:
                raise StoreUnavailable(f"unreadable partition state name: {exc}") from exc
        return await self._read_states(keys)

    async def _read_states(
        self, keys: Sequence[PartitionKey]
    ) -> dict[PartitionKey, PartitionState]:
        # Every question is asked before any answer is awaited: one round trip for all.
        pending = [
            (key, self._client.get_async(partition_state_path(key.topic_id, key.partition)))
            for key in keys
        ]
        found = {}
        for key, result in pending:
            try:
                data, stat = await self._wait(result)
            except NoNodeError:
                continue
            found[key] = self._decode_state(key, self._decode(data), int(stat.version))
        return found

    def _decode_state(self, key: PartitionKey, value: Any, version: int) -> PartitionState:
        try:
            return decode_partition_state(value, version)
        except (KeyError, TypeError, ValueError) as exc:
            raise StoreUnavailable(f"unreadable state of {key}: {exc!r}") from exc

    # The watch

    async def partition_state_updates(self) -> AsyncGenerator[StateView, None]:
        """``ReplicationStore.partition_state_updates``: a read that fails once the first
        view is out is tried again on the next event, or after a second (a lost connection,
        which a new session may follow), unless the store is closed."""
        self._check_open()
        events = self._partition_events
        seen = events.seen
        listing = await self._list_notes()
        held = await self._read_all_states()
        yield types.MappingProxyType(dict(held))
        while True:
            await events.after(seen)
            seen = events.seen
            try:
                later = await self._list_notes()
                changed = await self._changes(listing, later, held)
            except StoreUnavailable as exc:
                if self._closed:
                    raise
                log.warning("cannot read the partition states (%s); retrying", exc)
                with trio.move_on_after(1.0):
                    await events.after(seen)
                events.note()  # read again at once, whatever woke this
                continue
            listing = later
            held.update(changed)
            if changed:
                yield types.MappingProxyType(changed)

    async def _changes(
        self, listing: _Listing, later: _Listing, held: Mapping[PartitionKey, PartitionState]
    ) -> dict[PartitionKey, PartitionState]:
        """The states that moved on from ``held`` between the two listings of the notes."""
        if not listing.missed_notes(later):
            changed = await self._read_notes(sorted(later.names - listing.names, key=_seq), held)
            if changed is not None:
                return changed
        # A note went before it was read: every state afresh.
        log.info("partition state notes were missed; reading every state")
        return _newer(await self._read_all_states(), held)

    async def _list_notes(self) -> _Listing:
        try:
            names, stat = await self._wait(
                self._client.get_children_async(
                    PARTITION_CHANGES, watch=self._partition_events.watch, include_data=True
                )
            )
        except NoNodeError:
            raise StoreUnavailable(f"{PARTITION_CHANGES} is missing") from None
        return _Listing(frozenset(names), int(stat.cversion))

    async def _read_notes(
        self, names: Sequence[str], held: Mapping[PartitionKey, PartitionState]
    ) -> dict[PartitionKey, PartitionState] | None:
        """The states the notes ``names`` (in order) move on from ``held``; None if one of them
        is gone already."""
        pending = [self._client.get_async(f"{PARTITION_CHANGES}/{name}") for name in names]
        found: dict[PartitionKey, PartitionState] = {}
        for result in pending:
            try:
                data, _stat = await self._wait(result)
            except NoNodeError:
                return None
            found.update(_newer(self._decode_note(data), found))
        return _newer(found, held)

    def _decode_note(self, data: bytes) -> dict[PartitionKey, PartitionState]:
        found = {}
        try:
            for topic_id, partition, value in self._decode(data)["states"]:
                key = PartitionKey(topic_id=uuid.UUID(topic_id), partition=int(partition))
                found[key] = decode_partition_state(value, int(value["version"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise StoreUnavailable(f"unreadable partition change note: {exc!r}") from exc
        return found

    # Writes

    async def write_partition_states(
        self, epoch: int | None, writes: Sequence[StateWrite]
    ) -> tuple[PartitionKey, ...]:
        self._check_open()
        office = None if epoch is None else self._office_of(epoch)
        keys = [write.key for write in writes]
        if len(set(keys)) < len(keys):
            raise ValueError("a partition's state is written twice in one call")
        if office is not None:
            for key in keys:
                if not office.admits_partition(key):
                    raise Deposed(f"partition {key} is not in the slot of epoch {epoch}")
        # A new state's parent: made apart, since a transaction cannot make parents.
        for topic_id in {w.key.topic_id for w in writes if w.expected_version == -1}:
            await self._wait(self._client.ensure_path_async(partition_state_path(topic_id)))
        lost: list[PartitionKey] = []
        for part in self._parts(office, writes):
            lost.extend(await self._write_part(office, epoch, part))
        if writes:
            await self._prune_notes()
        return tuple(lost)

    def _parts(self, office: Office | None, writes: Sequence[StateWrite]) -> list[list[StateWrite]]:
        """``writes`` cut into transactions that fit well under ZooKeeper's request limit,
        each state counted twice: in its node and in the note."""
        overhead = _OP_OVERHEAD + len(self._client.chroot)
        budget = _TX_BYTES - overhead * (3 if office is not None else 1)  # checks and the note
        parts: list[list[StateWrite]] = []
        size = budget
        for write in writes:
            path = partition_state_path(write.key.topic_id, write.key.partition)
            cost = overhead + len(path) + 2 * len(json_bytes(_note_entry(write)))
            if size + cost > budget:
                parts.append([])
                size = 0
            parts[-1].append(write)
            size += cost
        return parts

    async def _write_part(
        self, office: Office | None, epoch: int | None, part: list[StateWrite]
    ) -> list[PartitionKey]:
        """Commit ``part`` and its note in one transaction, without each write that lost its
        race (returned)."""
        lost: list[PartitionKey] = []
        first = 0 if office is None else 2  # the office's checks come first
        while part:
            tx = self._office_transaction(office)
            for write in part:
                value = encode_partition_state(write.state)
                if epoch is not None:
                    value["controller_epoch"] = epoch
                path = partition_state_path(write.key.topic_id, write.key.partition)
                if write.expected_version == -1:
                    tx.create(path, json_bytes(value))
                else:
                    tx.set_data(path, json_bytes(value), write.expected_version)
            note = json_bytes({"states": [_note_entry(write) for write in part]})
            tx.create(f"{PARTITION_CHANGES}/{_NOTE_PREFIX}", note, sequence=True)
            failed = failure(await self._wait(tx.commit_async()))
            if failed is None:
                return lost
            self._check_office_held(office, failed)
            index, exc = failed[0] - first, failed[1]
            if not (
                0 <= index < len(part)
                and isinstance(exc, BadVersionError | NoNodeError | NodeExistsError)
            ):
                raise StoreUnavailable(f"cannot write partition states: {exc!r}")
            lost.append(part[index].key)
            part = part[:index] + part[index + 1 :]
        return lost

    async def _prune_notes(self) -> None:
        """Delete the notes older than a minute (by the newest note's creation time, so that
        only ZooKeeper's clock counts) or beyond the newest ``_KEPT_NOTES``; at most every
        ``_PRUNE_INTERVAL`` seconds, best effort: a note left is only read once more."""
        now = trio.current_time()
        if now - self._last_prune < _PRUNE_INTERVAL:
            return
        self._last_prune = now
        try:
            names = sorted(await self._children(PARTITION_CHANGES), key=_seq)
            doomed = names[: max(0, len(names) - _KEPT_NOTES)]
            candidates = names[len(doomed) : len(doomed) + _PRUNE_BATCH]
            stats = [
                self._client.exists_async(f"{PARTITION_CHANGES}/{name}")
                for name in [*candidates, names[-1]]
            ]
            ages = [await self._wait(result) for result in stats]
            newest = ages.pop()
            if newest is not None:
                for name, stat in zip(candidates, ages, strict=True):
                    if stat is None or stat.ctime >= newest.ctime - _NOTE_AGE_MS:
                        break
                    doomed.append(name)
            deletes = [self._client.delete_async(f"{PARTITION_CHANGES}/{name}") for name in doomed]
            for result in deletes:
                with contextlib.suppress(NoNodeError):  # another writer's prune came first
                    await self._wait(result)
        except StoreUnavailable as exc:
            log.warning("cannot prune partition change notes: %s", exc)

    # The sweeper's (broker/state_sweeper.py)

    async def partition_state_ids(self) -> frozenset[uuid.UUID]:
        """The topic ids that have partition states now: those of topics in force, and those of
        deleted topics whose states are left (a delete cut short, a controller that wrote one
        before it saw the topic go) until :meth:`remove_partition_states` removes them."""
        found = set()
        for name in await self._children(PARTITION_STATES, missing_ok=True):
            try:
                found.add(uuid.UUID(name))
            except ValueError:
                log.warning("%s/%s names no topic id: left alone", PARTITION_STATES, name)
        return frozenset(found)

    async def remove_partition_states(self, epoch: int, topic_id: uuid.UUID) -> bool:
        """Remove every state of ``topic_id``, a topic no longer in force, and its node, under
        the office of ``epoch`` (the sweeper's slot's: ``Deposed``, nothing removed, once it
        is over);
        whether they are all gone. A state written meanwhile (a controller that has not seen
        the topic go yet) or one removed by another first stops it: the next sweep goes on.
        Each transaction removes a part, the node last, so what is left is states a reader may
        see (a deleted topic's, which no reader takes for its topic's)."""
        office = self._office_of(epoch)
        path = partition_state_path(topic_id)
        partitions = await self._children(path, missing_ok=True)
        if not partitions and await self._wait(self._client.exists_async(path)) is None:
            return True
        ops = [Op(kind="delete", path=f"{path}/{p}") for p in partitions]
        ops.append(Op(kind="delete", path=path))
        return await self._commit_in_parts(office, ops) == len(ops)

    async def _delete_partition_states(self, topic_id: uuid.UUID) -> None:
        """Remove a deleted topic's states, best effort: a controller writing one meanwhile
        leaves the rest to the next delete of a state of that id."""
        path = partition_state_path(topic_id)
        try:
            partitions = await self._children(path, missing_ok=True)
            if not partitions:
                return
            deletes = [self._client.delete_async(f"{path}/{p}") for p in partitions]
            for result in deletes:
                with contextlib.suppress(NoNodeError):
                    await self._wait(result)
            with contextlib.suppress(NoNodeError, NotEmptyError):
                await self._wait(self._client.delete_async(path))
        except StoreUnavailable as exc:
            log.warning("cannot remove the partition states of topic id %s: %s", topic_id, exc)


def _note_entry(write: StateWrite) -> list[Any]:
    """A state as a note holds it: with the version its node has once the write is done."""
    value: dict[str, Any] = encode_partition_state(write.state)
    value["version"] = write.expected_version + 1  # -1 (a new node): 0
    return [str(write.key.topic_id), write.key.partition, value]


def _newer(
    found: Mapping[PartitionKey, PartitionState], held: Mapping[PartitionKey, PartitionState]
) -> dict[PartitionKey, PartitionState]:
    """The states of ``found`` that are new or of a later version than ``held``'s."""
    return {
        key: state
        for key, state in found.items()
        if (known := held.get(key)) is None or known.version < state.version
    }
