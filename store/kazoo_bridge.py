"""Kazoo as trio sees it: the one module that imports kazoo. The ZooKeeper store and the seed-02
benchmark baseline (``bench/seed02_session.py``) drive their clients through a ``KazooBridge``;
the benchmarks' raw-kazoo baseline takes a plain blocking client from ``blocking_client``.

Threads. Kazoo runs its own threads. Requests are sent with kazoo's ``*_async`` calls from the trio
thread (they only queue), and their completions, watches and session state changes come back
through ``TrioToken.run_sync_soon``, which never blocks a kazoo thread. Only starting and stopping
the client block; they run in a worker thread under a limiter of their own, abandoned on cancel.
Every wait is bounded: a lost quorum leaves kazoo requests pending forever, so each one ends in
``StoreUnavailable`` after ``call_bound`` seconds.

The kazoo exceptions and state names its users interpret are re-exported from here, so that
nothing else needs kazoo's modules (kazoo ships no type hints: they are ``Any`` to mypy).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from functools import partial
from typing import Any

import attrs
import trio
from kazoo.client import KazooClient, KazooState  # type: ignore[import-untyped]
from kazoo.exceptions import (  # type: ignore[import-untyped]
    BadVersionError,
    KazooException,
    NoAuthError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    RolledBackError,
)
from kazoo.handlers.threading import KazooTimeoutError  # type: ignore[import-untyped]
from kazoo.security import make_digest_acl  # type: ignore[import-untyped]

from .interface import StoreUnavailable

log = logging.getLogger(__name__)

__all__ = [
    "BadVersionError",
    "DigestAuth",
    "KazooBridge",
    "KazooState",
    "NoAuthError",
    "NoNodeError",
    "NodeExistsError",
    "NotEmptyError",
    "RolledBackError",
    "blocking_client",
    "kazoo_bridge",
]


@attrs.frozen(kw_only=True)
class DigestAuth:
    """ZooKeeper digest authentication: the session authenticates as ``user``, and every node it
    creates carries an ACL that lets only that user (and so only the brokers and tools that know
    the password) read, write, create, delete or administer it."""

    user: str
    password: str = attrs.field(repr=False)

    def client_options(self) -> dict[str, Any]:
        return {
            "auth_data": [("digest", f"{self.user}:{self.password}")],
            "default_acl": [make_digest_acl(self.user, self.password, all=True)],
        }


@attrs.define(eq=False, repr=False)
class KazooBridge:
    """One kazoo client (one ZooKeeper session once running) bridged to the trio thread that made
    it; obtain one from ``kazoo_bridge`` and run it with ``running``.

    ``client`` is kazoo's ``KazooClient``: its ``*_async`` calls queue requests, whose results
    ``answer`` awaits.
    """

    client: Any  # KazooClient: untyped
    servers: str
    chroot: str
    call_bound: float
    _token: trio.lowlevel.TrioToken
    #: Requests awaited through ``answer`` (a transaction is one, so is creating the chroot).
    requests: int = 0

    def __repr__(self) -> str:
        return f"<KazooBridge {self.client.hosts!r}>"

    def soon(self, callback: Callable[[], object]) -> None:
        """Run ``callback`` on the trio thread; from any thread, never blocking, never raising."""
        with contextlib.suppress(trio.RunFinishedError):
            self._token.run_sync_soon(callback)

    def listen(self, callback: Callable[[str], object]) -> None:
        """Call ``callback`` with the new state (a ``KazooState``) on the trio thread whenever
        the session's state changes, from the start of ``running`` on."""
        self.client.add_listener(lambda state: self.soon(partial(callback, state)))

    async def answer(self, result: Any) -> Any:
        """The value of a kazoo async result, counted in ``requests``,
        waiting at most ``call_bound`` seconds for it, woken from kazoo's thread through ``soon``.

        Kazoo's own errors (no node, node exists, bad version, not empty) pass through for the
        caller to interpret; connection trouble becomes ``StoreUnavailable``.
        """
        self.requests += 1
        if not result.ready():  # of thousands of requests sent at once, most are answered by now
            done = trio.Event()
            result.rawlink(lambda _result: self.soon(done.set))
            with trio.move_on_after(self.call_bound):
                await done.wait()
            if not result.ready():
                raise StoreUnavailable(f"ZooKeeper did not answer within {self.call_bound} s")
        try:
            return result.get_nowait()
        except (NoNodeError, NodeExistsError, BadVersionError, NotEmptyError):
            raise
        except KazooException as exc:
            raise StoreUnavailable(f"ZooKeeper: {exc!r}") from exc

    def session_id(self) -> int | None:
        """The id of the session kazoo is connected under; None while it has no connection."""
        client_id = self.client.client_id
        return None if client_id is None else int(client_id[0])

    async def keep_heard(
        self,
        ask: Callable[[], Any],
        *,
        interval: float,
        heard: Callable[[int, float], None],
    ) -> None:
        """Until cancelled, send the request ``ask`` queues (a kazoo ``*_async`` call) every
        ``interval`` seconds and call ``heard(session, asked_at)`` for each one answered within
        one session, from a thread of its own and never through the trio loop.

        ``asked_at`` is taken before the request is queued, so the server heard from the session
        after it and cannot have expired the session before ``asked_at`` plus the session
        timeout; the time the answer arrives would not do, the server heard the request earlier.

        Whether the session is alive is a fact about the ensemble, not about this process's
        event loop: a task that asks and then waits its turn to read the answer falls behind
        with the loop, and a busy broker would count itself out of contact with a store that
        answered promptly (docs/design.md#a-slow-store-is-not-a-lost-store). The request is the
        session's heartbeat (kazoo sends no ping while requests flow, and its pings are answered
        inside its connection thread, unseen). ``heard`` runs on this method's thread: it must
        only store what it is given. ``asked_at`` is in trio's clock, which is
        ``time.perf_counter`` plus an offset, measured once here.
        """
        offset = trio.current_time() - time.perf_counter()
        stop = threading.Event()

        def beat() -> None:
            while not stop.is_set():
                session = self.session_id()
                asked = time.perf_counter()
                if session is not None:
                    try:
                        ask().get(timeout=self.call_bound)
                    except (KazooException, KazooTimeoutError) as exc:
                        log.debug("no answer from ZooKeeper: %r", exc)
                    else:
                        if self.session_id() == session:
                            heard(session, asked + offset)
                stop.wait(max(0.0, asked + interval - time.perf_counter()))

        try:
            await trio.to_thread.run_sync(
                beat, abandon_on_cancel=True, limiter=trio.CapacityLimiter(1)
            )
        finally:
            stop.set()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Start the client (creating the chroot if missing) and stop it when the block ends, so
        that the session's ephemeral nodes go at once; ``StoreUnavailable`` if no server of the
        ensemble answers within ``call_bound`` seconds."""
        limiter = trio.CapacityLimiter(1)
        try:
            try:
                await trio.to_thread.run_sync(
                    partial(self.client.start, timeout=self.call_bound),
                    abandon_on_cancel=True,
                    limiter=limiter,
                )
            except KazooTimeoutError:
                raise StoreUnavailable(f"cannot reach ZooKeeper at {self.servers}") from None
            if self.chroot:
                # Kazoo expects the chroot to exist before it connects through it.
                await self.answer(self.client.ensure_path_async(self.chroot))
                self.client.chroot = self.chroot
            yield
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(self.call_bound):
                await trio.to_thread.run_sync(
                    _stop, self.client, abandon_on_cancel=True, limiter=limiter
                )


def kazoo_bridge(
    hosts: str, *, session_timeout: float, call_bound: float, auth: DigestAuth | None = None
) -> KazooBridge:
    """A bridge to a client of ``hosts`` (``host:port,...`` with an optional ``/chroot``), not
    started yet, for the calling trio thread.

    ``session_timeout`` is how long the ensemble keeps the session's ephemeral nodes after it last
    heard from the client; ``call_bound`` is the longest any one wait lasts. The client reconnects
    for ever: whether to give up is its user's decision, through ``call_bound``. With ``auth``,
    the session authenticates and the nodes it creates (the chroot too) are its user's alone.
    """
    servers, slash, chroot = hosts.partition("/")
    chroot = "/" + chroot.strip("/") if slash and chroot.strip("/") else ""
    client = KazooClient(
        hosts=servers,
        timeout=session_timeout,
        connection_retry={"max_tries": -1, "delay": 0.1, "max_delay": 1.0},
        **({} if auth is None else auth.client_options()),
    )
    return KazooBridge(
        client=client,
        servers=servers,
        chroot=chroot,
        call_bound=call_bound,
        token=trio.lowlevel.current_trio_token(),
    )


@contextlib.contextmanager
def blocking_client(
    servers: str, *, start_timeout: float, auth: DigestAuth | None = None
) -> Iterator[Any]:
    """A started ``KazooClient`` of ``servers`` with kazoo's defaults and no bridge, for blocking
    calls in a worker thread (the benchmarks' raw-kazoo baseline); stopped when the block ends."""
    client = KazooClient(hosts=servers, **({} if auth is None else auth.client_options()))
    client.start(timeout=start_timeout)
    try:
        yield client
    finally:
        _stop(client)


def _stop(client: Any) -> None:
    """Close the session (its ephemeral nodes go at once) and the client's threads."""
    try:
        client.stop()
    finally:
        client.close()
