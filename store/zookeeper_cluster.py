"""The ZooKeeper store's cluster: the live brokers, the layout every broker of it runs, and the
coordinator slots' offices (docs/design.md#coordinator-slots).

A slot's office is the only office on ZooKeeper: layout 1's single office, whose holder
coordinated every group, is kept occupied by nobody so that no old broker takes it
(``occupy_single_office``), and one coordinator of every group, where a benchmark or a test wants
one, holds the one slot of a count of 1 (store/slot_store.py).

Contact. ``slot_in_contact_until`` tells a slot's coordinator until when it may renew consumers'
leases: a session timeout, less a margin, after it asked something that its office's session
answered (docs/design.md#coordinator-epochs-and-the-election). A thread reads a node every third
of the session to keep that fresh (kazoo's own session pings are not seen from here), so that a
broker whose event loop is behind is not out of contact with a store that answers
(docs/design.md#a-slow-store-is-not-a-lost-store).
"""

from __future__ import annotations

import contextlib
import logging
import math
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import trio
import trio_util

from protocol.types import BrokerInfo

from .interface import InvalidReplicationFactor, LayoutMismatch, StoreUnavailable, on_listener
from .kazoo_bridge import BadVersionError, KazooState, NodeExistsError, NoNodeError
from .zookeeper_layout import (
    BROKER_IDS,
    ELECTION,
    LAYOUT,
    LAYOUT_VERSION,
    SLOT_ELECTIONS,
    SLOT_EPOCHS,
    json_bytes,
)
from .zookeeper_session import RETRIES, Events, Office, Session, failure

__all__ = ["CONTACT_MARGIN_FRACTION", "Cluster"]

log = logging.getLogger(__name__)

#: ``slot_in_contact_until`` ends this fraction of the session timeout before the session could
#: expire on the server: it covers the time between the coordinator's check and its request
#: leaving, and the difference between the two clocks' rates. With a read every third of the
#: session (its own, ``_keep_in_contact``), contact normally reaches at least half a session ahead.
CONTACT_MARGIN_FRACTION = 1 / 6

#: The layout versions a broker of this code finds and upgrades to ``LAYOUT_VERSION``.
_UPGRADED_LAYOUTS = (2, 3)


@attrs.define(eq=False, repr=False, slots=False)
class Cluster(Session):
    """The brokers, the layout and the slots' offices of one session (``ZooKeeperStore``)."""

    #: Election watch events and session state changes.
    _election_events: Events = attrs.field(
        init=False, default=attrs.Factory(lambda self: Events(self._bridge), takes_self=True)
    )
    _session_events: trio_util.AsyncValue[int] = attrs.Factory(lambda: trio_util.AsyncValue(0))
    #: Child watch events on the live brokers and the slots' offices (``read_cluster``).
    _cluster_events: Events = attrs.field(
        init=False, default=attrs.Factory(lambda self: Events(self._bridge), takes_self=True)
    )
    #: (session, instant) of the latest request the server answered within one session, asked
    #: at that instant: the session lives at least a session timeout past it.
    _contact: tuple[int, float] | None = None
    #: The latest ``(session, asked_at)`` that ``_keep_in_contact``'s thread heard answered.
    _beat: tuple[int, float] | None = None
    _brokers: dict[int, BrokerInfo] = attrs.Factory(dict)
    _advertised: dict[int, dict[str, tuple[str, int]]] = attrs.Factory(dict)
    _log_dirs: dict[int, uuid.UUID] = attrs.Factory(dict)

    # Brokers

    async def register_broker(
        self,
        broker: BrokerInfo,
        advertised: Mapping[str, tuple[str, int]] | None = None,
        *,
        log_dir: uuid.UUID | None = None,
    ) -> None:
        self._brokers[broker.broker_id] = broker
        self._advertised[broker.broker_id] = dict(advertised or {})
        if log_dir is None:
            self._log_dirs.pop(broker.broker_id, None)
        else:
            self._log_dirs[broker.broker_id] = log_dir
        await self._register(broker)

    async def _register(self, broker: BrokerInfo) -> None:
        path = f"{BROKER_IDS}/{broker.broker_id}"
        listeners = {
            name: {"host": host, "port": port}
            for name, (host, port) in self._advertised.get(broker.broker_id, {}).items()
        }
        value: dict[str, Any] = {"host": broker.host, "port": broker.port}
        if listeners:
            value["listeners"] = listeners
        # The layout it runs, so that no topic a registered broker could not read is written
        # (``check_every_broker_reads_replicas``); keys a broker of layout 3 ignores.
        value["layout"] = LAYOUT_VERSION
        log_dir = self._log_dirs.get(broker.broker_id)
        if log_dir is not None:
            value["log_dir"] = str(log_dir)
        data = json_bytes(value)
        for _ in range(RETRIES):
            try:
                await self._wait(self._client.create_async(path, data, ephemeral=True))
                return
            except NodeExistsError:
                pass
            # Someone (perhaps this broker's previous session) holds the id: replace it.
            tx = self._client.transaction()
            tx.delete(path)
            tx.create(path, data, ephemeral=True)
            if failure(await self._wait(tx.commit_async())) is None:
                return
        raise StoreUnavailable(f"cannot register broker {broker.broker_id}: {path} keeps changing")

    async def brokers(self, listener: str | None = None) -> tuple[BrokerInfo, ...]:
        return await self._read_brokers(listener, watch=None)

    async def _read_brokers(
        self, listener: str | None, watch: Callable[[Any], None] | None
    ) -> tuple[BrokerInfo, ...]:
        registrations = await self._read_registrations(watch)
        found = []
        advertised: dict[int, dict[str, tuple[str, int]]] = {}
        for broker_id, value in registrations.items():
            found.append(BrokerInfo(broker_id=broker_id, host=value["host"], port=value["port"]))
            advertised[broker_id] = {
                str(name): (str(address["host"]), int(address["port"]))
                for name, address in value.get("listeners", {}).items()
            }
        found.sort(key=lambda broker: broker.broker_id)
        return on_listener(found, advertised, listener)

    async def _read_registrations(
        self, watch: Callable[[Any], None] | None = None
    ) -> dict[int, Any]:
        """Each live broker's registration node, decoded, by id."""
        ids = await self._children(BROKER_IDS, watch=watch)
        pending = [(int(i), self._client.get_async(f"{BROKER_IDS}/{i}")) for i in ids]
        found = {}
        for broker_id, result in pending:
            try:
                data, _stat = await self._wait(result)
            except NoNodeError:
                continue
            found[broker_id] = self._decode(data)
        return found

    async def broker_dirs(self) -> Mapping[int, uuid.UUID]:
        found = {}
        for broker_id, value in sorted((await self._read_registrations()).items()):
            log_dir = value.get("log_dir")
            if log_dir is not None:
                try:
                    found[broker_id] = uuid.UUID(str(log_dir))
                except ValueError as exc:
                    raise StoreUnavailable(f"unreadable log_dir of broker {broker_id}") from exc
        return found

    async def check_every_broker_reads_replicas(self) -> None:
        """Raise ``InvalidReplicationFactor`` while a registered broker runs a layout before 4:
        it reads a topic node with replica lists, or settings it does not know, as unreadable,
        and would fail every read of the topics (docs/design.md#coordinator-slots)."""
        for broker_id, value in sorted((await self._read_registrations()).items()):
            layout = value.get("layout")
            if not isinstance(layout, int) or layout < LAYOUT_VERSION:
                runs = "3 or older" if layout is None else layout  # none: it predates the key
                raise InvalidReplicationFactor(
                    f"broker {broker_id} runs layout {runs}: restart it first"
                )

    async def _keep_registrations(self) -> None:
        """Register this handle's brokers again whenever kazoo had to open a new session."""
        session = self._session_id()
        async for _ in self._session_events.eventual_values():
            if self._client.state != KazooState.CONNECTED or self._session_id() == session:
                continue
            session = self._session_id()
            for broker in list(self._brokers.values()):
                try:
                    await self._register(broker)
                except StoreUnavailable as exc:
                    log.warning("cannot register broker %d again: %s", broker.broker_id, exc)

    # The cluster's layout

    async def check_layout(self, slots: int) -> None:
        """Pin the cluster's layout version and coordinator slot count if this is the first
        broker to ask, or raise ``LayoutMismatch`` if the store holds others: the count is fixed
        when the cluster's store is created (docs/design.md#coordinator-slots).

        A store of layout 2 (topics without ids) or 3 (without replicas) is upgraded to 4 by a
        version-checked write, so that a cluster upgrades by restarting its brokers one at a
        time: a broker checks the layout only when it starts, so those still running go on
        beside the new ones. They write topic and offset nodes of the shapes they always did,
        which layout 4 reads (a topic without an id is given one on sight, an offset without one
        is the current incarnation's: docs/design.md#topic-ids), and read nodes whose shapes did
        not change (an offset node's added ``topic_id``, a registration's ``layout`` are keys
        they ignore); no topic they could not read is written while one of them is registered
        (``check_every_broker_reads_replicas``). A broker of an older layout started after the
        upgrade refuses the store with its one line ("has layout version 4, this broker runs
        version 3")."""
        wanted = {"version": LAYOUT_VERSION, "slots": slots}
        for _ in range(RETRIES):
            try:
                await self._wait(self._client.create_async(LAYOUT, json_bytes(wanted)))
                return
            except NodeExistsError:
                pass
            data, stat = await self._wait(self._client.get_async(LAYOUT))
            found = self._decode(data)
            if found.get("version") not in (*_UPGRADED_LAYOUTS, LAYOUT_VERSION):
                raise LayoutMismatch(
                    f"the cluster's ZooKeeper store has layout version {found.get('version')}, "
                    f"this broker runs version {LAYOUT_VERSION} "
                    f"(and upgrades versions {' and '.join(map(str, _UPGRADED_LAYOUTS))})"
                )
            if found.get("slots") != slots:
                raise LayoutMismatch(
                    f"the cluster's ZooKeeper store has {found.get('slots')} coordinator slots, "
                    f"this broker is configured with {slots} "
                    f"(start it with --coordinator-slots {found.get('slots')})"
                )
            if found.get("version") == LAYOUT_VERSION:
                return
            with contextlib.suppress(BadVersionError, NoNodeError):  # changed meanwhile: again
                await self._wait(
                    self._client.set_async(LAYOUT, json_bytes(wanted), version=stat.version)
                )
                log.info(
                    "upgraded the store from layout %s to %d", found["version"], LAYOUT_VERSION
                )
                return
        raise StoreUnavailable(f"cannot check {LAYOUT}: it keeps changing")

    # The slots' offices

    async def take_slot(self, broker_id: int, slot: int, slots: int) -> int:
        """Take the office of one coordinator slot, waiting while another session holds it, and
        return its epoch: the zxid of the one transaction that created the slot's election node
        (ephemeral) and bumped the slot's counter, so larger than every earlier epoch of any
        slot. Writes under it check that slot's counter and node, and admit only the slot's
        groups."""
        election, counter = f"{SLOT_ELECTIONS}/{slot}", f"{SLOT_EPOCHS}/{slot}"
        for path in (SLOT_ELECTIONS, counter):
            await self._wait(self._client.ensure_path_async(path))
        data = json_bytes({"broker_id": broker_id})
        while True:
            seen = self._election_events.seen
            stat = await self._wait(
                self._client.exists_async(election, watch=self._election_events.watch)
            )
            tx = self._client.transaction()
            if stat is not None:
                if stat.ephemeralOwner != self._session_id():
                    # Someone else's office: stand again once it is gone.
                    await self._election_events.after(seen)
                    continue
                tx.delete(election)  # ours already: a new term, with a new epoch
            tx.create(election, data, ephemeral=True)
            tx.set_data(counter, data)
            session, asked_at = self._session_id(), trio.current_time()
            results = await self._wait(tx.commit_async())
            if failure(results) is not None:
                continue  # lost the race to another broker
            break
        stamp = results[-1]
        # One transaction, one zxid: the election node's czxid is the counter's mzxid.
        owner = self._session_id()
        if owner is not None and owner == session:
            self._heard(owner, asked_at)
        office = Office(
            epoch=int(stamp.mzxid),
            counter_version=stamp.version,
            session=owner,
            election=election,
            counter=counter,
            slot=slot,
            slots=slots,
        )
        self._offices[slot] = office
        log.info("broker %d took slot %d, epoch %d", broker_id, slot, office.epoch)
        return office.epoch

    async def release_slot(self, slot: int) -> None:
        """Give the slot's office up (a handoff: the caller stopped renewing leases and flushed
        its offsets first); its writes are refused from here on, and another may take it."""
        office = self._offices.pop(slot, None)
        if office is None:
            return
        self._election_events.note()  # wakes wait_slot_lost
        # Checked like a write: if the node is no longer this office's (the session ended and
        # another broker took the slot), the counter moved on and nothing is deleted.
        tx = self._office_transaction(office)
        tx.delete(office.election)
        failed = failure(await self._wait(tx.commit_async()))
        if failed is not None:
            log.info("slot %d was no longer this broker's to release: %r", slot, failed[1])

    async def abandon_slot(self, slot: int) -> None:
        """Delete the slot's election node if this session created it but holds no office for it
        (a wait for the slot given up while its transaction went through): nobody else could
        take the slot before the session ended. ZooKeeper answers one session's requests in
        order, so the transaction has been applied when this read is answered."""
        if slot in self._offices:
            return
        election = f"{SLOT_ELECTIONS}/{slot}"
        stat = await self._wait(self._client.exists_async(election))
        if stat is None or stat.ephemeralOwner != self._session_id():
            return
        tx = self._client.transaction()
        tx.check(election, stat.version)
        tx.delete(election)
        if failure(await self._wait(tx.commit_async())) is None:
            log.info("gave up slot %d, taken while no longer wanted", slot)

    async def occupy_single_office(self) -> None:
        """Keep the election node of layout 1 occupied by nobody's session, so that a broker of
        a release before the layout check, which would elect itself coordinator of every group
        there, waits for ever instead (docs/design.md#coordinator-slots)."""
        with contextlib.suppress(NodeExistsError):
            await self._wait(
                self._client.create_async(ELECTION, json_bytes({"broker_id": -1}), makepath=True)
            )

    async def slot_holders(self) -> dict[int, int]:
        """Who holds each slot's office now (slot -> broker id); a slot nobody holds is left
        out."""
        return await self._read_slot_holders(watch=None)

    async def _read_slot_holders(self, watch: Callable[[Any], None] | None) -> dict[int, int]:
        slots = await self._children(SLOT_ELECTIONS, watch=watch, missing_ok=True)
        pending = [(int(s), self._client.get_async(f"{SLOT_ELECTIONS}/{s}")) for s in slots]
        holders = {}
        for slot, result in pending:
            try:
                data, _stat = await self._wait(result)
            except NoNodeError:
                continue
            holders[slot] = int(self._decode(data)["broker_id"])
        return dict(sorted(holders.items()))

    async def read_cluster(self) -> tuple[int, tuple[BrokerInfo, ...], dict[int, int]]:
        """The live brokers and the slots' holders, each list read with a one-shot watch on it,
        and the count of cluster events before the reads: ``cluster_changed`` with that count
        returns once a broker registered or went, or a slot's office was taken or given up,
        after they were read. A watch fires once: each read arms it again."""
        seen = self._cluster_events.seen
        brokers = await self._read_brokers(None, watch=self._cluster_events.watch)
        holders = await self._read_slot_holders(watch=self._cluster_events.watch)
        return seen, brokers, holders

    async def cluster_changed(self, seen: int) -> None:
        """Return once a watch armed after ``seen`` (``read_cluster``) has fired."""
        await self._cluster_events.after(seen)

    def slot_in_contact_until(self, slot: int) -> float:
        """``OfficeStore.in_contact_until`` for the office of ``slot`` (``take_slot``): the
        instant until which its coordinator may renew leases, ``-inf`` while this handle does
        not hold it."""
        office = self._offices.get(slot)
        if self._closed or office is None:
            return -math.inf
        heard = max(
            (
                contact[1]
                for contact in (self._contact, self._beat)
                if contact is not None and contact[0] == office.session
            ),
            default=-math.inf,
        )
        return heard + self._session_timeout * (1 - CONTACT_MARGIN_FRACTION)

    def _heard(self, session: int, asked_at: float) -> None:
        if self._contact is None or self._contact[0] != session or self._contact[1] < asked_at:
            self._contact = (session, asked_at)

    def _heartbeat(self, session: int, asked_at: float) -> None:
        """``_heard`` for ``_keep_in_contact``'s thread: it alone writes ``_beat``, one
        assignment, so the trio thread never sees half of it."""
        self._beat = (session, asked_at)

    async def _keep_in_contact(self) -> None:
        """Ask ZooKeeper something cheap every third of the session, from a thread
        (``KazooBridge.keep_heard``), so that ``in_contact_until`` stays ahead while the session
        lives, however far behind the broker's event loop is. Each answer within one session
        moves the contact forward; a failure or a new session leaves it to run out."""
        await self._bridge.keep_heard(
            lambda: self._client.exists_async(ELECTION),
            interval=self._session_timeout / 3,
            heard=self._heartbeat,
        )

    async def wait_slot_lost(self, slot: int, *, suspended_grace: float | None = None) -> None:
        """Return once this handle's office of ``slot`` may be over: another session holds the
        slot's node, the session ended, the connection has been lost for ``suspended_grace``
        seconds, or this handle released the slot or was deposed from it.

        The session outlives a lost connection by about a third of its timeout, and consumers
        keep fetching until they have not heard from their coordinator for their own session
        timeout; a coordinator that steps down within the grace has long stopped pinging when
        its successor starts moving partitions.
        """
        office = self._offices.get(slot)
        if office is None:
            return
        if suspended_grace is None:
            suspended_grace = self._session_timeout / 3
        while self._offices.get(slot) is office:
            seen = self._election_events.seen
            if self._client.state == KazooState.LOST:
                break
            if self._client.state == KazooState.SUSPENDED:
                with trio.move_on_after(suspended_grace) as grace:
                    await self._election_events.after(seen)
                if grace.cancelled_caught:
                    break
                continue
            with contextlib.suppress(StoreUnavailable):
                stat = await self._wait(
                    self._client.exists_async(office.election, watch=self._election_events.watch)
                )
                if stat is None or stat.ephemeralOwner != self._session_id():
                    break
            await self._election_events.after(seen)
        self._drop(office)
