"""What every part of the ZooKeeper store stands on: one session's requests, bounded and counted,
and the transactions that check an office before they write.

Deposed writers. Taking a slot's office is one transaction that creates the slot's ephemeral
election node and bumps the version of its counter; the transaction's zxid (the node's czxid) is
the epoch. Every write of the office is a transaction that first checks that the counter still
has the version this office gave it (nobody took office since) and that the election node exists
(the session that holds it has not ended). Both checks are on the server, so a coordinator that
wakes up from a pause with a new kazoo session cannot write, whatever its memory says: its write
raises ``Deposed``.

Size. ZooKeeper refuses a request over its jute.maxbuffer (1 MiB by default), and a group of
thousands of members over 10,000 partitions takes more than that to write: its record alone can
approach it, its owner nodes or offsets exceed it. So a write is a list of operations cut into
transactions of at most 512 KiB, each checking the office, committed in order.

Threads. Requests are sent with kazoo's ``*_async`` calls from the trio thread and awaited, and
watches and session changes reach the trio thread, through the ``KazooBridge``: no kazoo thread
ever blocks on trio, and every call is bounded, ending in ``StoreUnavailable`` after
``call_bound`` seconds (a lost quorum leaves kazoo requests pending forever).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, Literal

import attrs
import trio_util

from statemachine.partition_state import PartitionKey, slot_key
from statemachine.slots import slot_of

from .interface import Deposed, StoreUnavailable
from .kazoo_bridge import (
    BadVersionError,
    KazooBridge,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    RolledBackError,
)

__all__ = ["RETRIES", "Events", "Office", "Op", "Session", "failure"]

#: How often a write that lost a race with another write of the same nodes is tried again.
RETRIES = 5

#: ZooKeeper drops the connection of a request over its jute.maxbuffer (1 MiB by default), which
#: one transaction of a 10,000-partition group's owners or offsets exceeds: transactions are cut
#: into parts of at most this many bytes.
_TX_BYTES = 512 * 1024
#: An operation's bytes in a request besides its path and data (headers, lengths, an ACL).
_OP_OVERHEAD = 64


@attrs.frozen
class Office:
    """A coordinator slot's office held by this handle (docs/design.md#coordinator-slots)."""

    epoch: int
    counter_version: int
    #: The session that holds the election node: contact under any other proves nothing.
    session: int | None
    #: The election node and the counter whose version every write of this office checks.
    election: str
    counter: str
    #: The slot and the count, so that the office writes only its slot's groups.
    slot: int
    slots: int

    def admits(self, group_id: str) -> bool:
        return slot_of(group_id, self.slots) == self.slot

    def admits_partition(self, key: PartitionKey) -> bool:
        """Whether the slot controls the partition (its ``slot_key``'s slot)."""
        return slot_of(slot_key(key), self.slots) == self.slot


@attrs.frozen
class Op:
    """One operation of a transaction, as data, so that a long list of them can be cut into
    transactions that each fit under ZooKeeper's request limit."""

    kind: Literal["create", "set", "delete"]
    path: str
    data: bytes = b""
    version: int = -1

    @property
    def size(self) -> int:
        return len(self.path) + len(self.data)  # paths are ASCII: ``segment`` quotes the rest

    def add_to(self, tx: Any) -> None:
        if self.kind == "create":
            tx.create(self.path, self.data)
        elif self.kind == "set":
            tx.set_data(self.path, self.data, self.version)
        else:
            tx.delete(self.path, self.version)


@attrs.define(eq=False)
class Events:
    """A count of events a waiter must not miss: it notes the count (``seen``) before it looks,
    then waits for the count to move (``after``), so no event between the two is lost.
    ``watch`` is a kazoo watch callback: called on a kazoo thread, it counts on the trio thread
    through the bridge, and never blocks."""

    bridge: KazooBridge
    count: trio_util.AsyncValue[int] = attrs.Factory(lambda: trio_util.AsyncValue(0))

    @property
    def seen(self) -> int:
        seen: int = self.count.value
        return seen

    def watch(self, _event: object) -> None:
        self.bridge.soon(self.note)

    def note(self) -> None:
        self.count.value += 1

    async def after(self, seen: int) -> None:
        await self.count.wait_value(lambda count: count != seen)


def failure(results: Sequence[Any]) -> tuple[int, Exception] | None:
    """The operation that made a transaction fail (the others say RolledBackError), if any."""
    for index, result in enumerate(results):
        if isinstance(result, Exception) and not isinstance(result, RolledBackError):
            return index, result
    return None


@attrs.define(eq=False, repr=False, slots=False)
class Session:
    """One ZooKeeper session's requests and the offices it holds, for the store's parts
    (``ZooKeeperStore``)."""

    _bridge: KazooBridge
    _session_timeout: float
    #: The bridge's KazooClient (untyped), named for brevity on every request.
    _client: Any = attrs.field(
        init=False, default=attrs.Factory(lambda self: self._bridge.client, takes_self=True)
    )
    #: The slot offices this handle holds, by slot (``take_slot``).
    _offices: dict[int, Office] = attrs.Factory(dict)
    _closed: bool = False

    def _check_open(self) -> None:
        if self._closed:
            raise StoreUnavailable("the store is closed")

    def _check_epoch(self, epoch: int, *group_ids: str) -> Office:
        """The office of ``epoch``, which must admit every group written under it: a slot's
        office writes the slot's groups alone."""
        office = self._office_of(epoch)
        for group_id in group_ids:
            if not office.admits(group_id):
                raise Deposed(f"group {group_id!r} is not in the slot of epoch {epoch}")
        return office

    def _office_of(self, epoch: int) -> Office:
        office = next((o for o in self._offices.values() if o.epoch == epoch), None)
        if office is None:
            held = sorted(o.epoch for o in self._offices.values())
            raise Deposed(f"epoch {epoch} is not the epoch of an office this store holds {held}")
        return office

    def _office_transaction(self, office: Office | None) -> Any:
        """A transaction checking ``office`` first; None: a write any broker may make."""
        tx = self._client.transaction()
        if office is None:
            return tx
        tx.check(office.counter, office.counter_version)
        tx.check(office.election, 0)  # exists: an election node is never written after creation
        return tx

    def _drop(self, office: Office) -> None:
        if self._offices.get(office.slot) is office:
            del self._offices[office.slot]

    async def _commit_in_office(self, tx: Any, office: Office | None) -> bool:
        """Commit a transaction from ``_office_transaction``: True if it happened, False if it
        lost a race with another write (retry), ``Deposed`` if the office is over."""
        failed = failure(await self._wait(tx.commit_async()))
        if failed is None:
            return True
        self._check_office_held(office, failed)
        if isinstance(failed[1], NoNodeError | NodeExistsError | BadVersionError | NotEmptyError):
            return False
        raise StoreUnavailable(f"transaction failed: {failed[1]!r}")

    def _check_office_held(self, office: Office | None, failed: tuple[int, Exception]) -> None:
        """Raise ``Deposed`` if a transaction from ``_office_transaction`` failed on its office's
        checks (its first two operations)."""
        index, exc = failed
        if office is not None and index < 2:
            self._drop(office)
            raise Deposed(f"the coordinator office of this store is over ({exc!r})")

    async def _commit_in_parts(self, office: Office | None, ops: Sequence[Op]) -> int:
        """Commit ``ops`` in order, as transactions checking ``office`` that each fit well under
        ZooKeeper's request limit; how many of them (a prefix) are committed: all, or fewer when a
        part lost a race with another write. A part committed stays committed, so callers order
        ``ops`` such that every prefix leaves a state readers may see. Raises as
        ``_commit_in_office``."""
        overhead = _OP_OVERHEAD + len(self._client.chroot)
        done = 0
        while done < len(ops):
            tx = self._office_transaction(office)
            end, size = done, 0
            while end < len(ops) and (end == done or size + ops[end].size + overhead <= _TX_BYTES):
                ops[end].add_to(tx)
                size += ops[end].size + overhead
                end += 1
            if not await self._commit_in_office(tx, office):
                return done
            done = end
        return done

    async def _children(
        self, path: str, *, watch: Callable[[Any], None] | None = None, missing_ok: bool = False
    ) -> list[str]:
        try:
            return list(await self._wait(self._client.get_children_async(path, watch=watch)))
        except NoNodeError:
            if missing_ok:
                return []
            raise StoreUnavailable(f"{path} is missing") from None

    async def _wait(self, result: Any) -> Any:
        """A request's answer (``KazooBridge.answer``), counted in ``operations``."""
        self._check_open()
        return await self._bridge.answer(result)

    def _session_id(self) -> int | None:
        return self._bridge.session_id()

    def _decode(self, data: bytes) -> Any:
        try:
            return json.loads(data)
        except ValueError as exc:
            raise StoreUnavailable(f"unreadable node: {data[:200]!r}") from exc
