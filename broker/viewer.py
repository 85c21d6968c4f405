"""The status page's record viewer: the last records of a partition on this broker, for a user
the page authenticated against the broker's users and whom the broker's access rules let read
the topic.

A login is HTTP Basic, checked against the store's SCRAM credential (the salted password derived
again and compared, :func:`transport.scram.password_matches`): the password crosses the wire in
the request, so the metrics port should be behind TLS (a reverse proxy) wherever it is not on the
loopback (README: Metrics). A failed login is answered :data:`FAILED_AUTHENTICATION_DELAY` late,
as the broker answers a failed SASL exchange, and failures are answered one at a time, so that a
client guessing passwords gets at most ten answers a second from a port however many
connections it opens; the PBKDF2 work runs in at most :data:`CHECKS_AT_ONCE` threads.

Where the broker enforces no access rules (no listener authenticates its clients), there are no
users to log in as and no rights to check: the viewer is off, since anyone reaching the port
could otherwise read every topic.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Awaitable, Callable

import attrs
import trio

from broker.authorization import Access
from broker.log import CorruptSegment, OffsetOutOfRange, PartitionLog
from protocol import RemoteProtocolError
from protocol.batches import records_from_batches
from protocol.records import Record
from protocol.sasl import MECHANISMS, ScramCredential, principal_of
from protocol.types import TopicPartition
from statemachine.acl import Operation, ResourceType
from transport.scram import SCRAMP, password_matches
from transport.security import FAILED_AUTHENTICATION_DELAY

__all__ = [
    "CHECKS_AT_ONCE",
    "MAX_LOGIN_CHARS",
    "READ_BYTES",
    "SHOWN_BYTES",
    "TAIL_RECORDS",
    "Login",
    "RecordViewer",
    "Tail",
    "basic_login",
    "read_tail",
]

#: Records shown: the partition's last ones.
TAIL_RECORDS = 20
#: Bytes of a key or value shown; the rest is counted, not shown.
SHOWN_BYTES = 200
#: Bytes read from the log and decoded for one view (at least one whole batch is read).
READ_BYTES = 64 * 1024
#: The longest user name or password taken from a request.
MAX_LOGIN_CHARS = 256
#: Password checks (PBKDF2, milliseconds each) computed at once.
CHECKS_AT_ONCE = 2

#: A user's credential for a mechanism, from the store (None: none).
FindCredential = Callable[[str, str], Awaitable[ScramCredential | None]]


@attrs.frozen(kw_only=True)
class Login:
    user: str
    password: str = attrs.field(repr=False)


def basic_login(head: bytes) -> Login | None:
    """The ``Authorization: Basic`` credentials of a request head (RFC 7617, UTF-8); None if it
    has none, or none well formed and within :data:`MAX_LOGIN_CHARS`."""
    for line in head.split(b"\n")[1:]:
        name, colon, value = line.partition(b":")
        if not colon or name.strip().lower() != b"authorization":
            continue
        scheme, _, encoded = value.strip().partition(b" ")
        if scheme.lower() != b"basic":
            return None
        try:
            text = base64.b64decode(encoded.strip(), validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            return None
        user, separator, password = text.partition(":")
        too_long = max(len(user), len(password)) > MAX_LOGIN_CHARS
        if not separator or not user or too_long:
            return None
        return Login(user=user, password=password)
    return None


@attrs.frozen(kw_only=True)
class Tail:
    """A partition's last records, and the offsets its log spans."""

    log_start: int
    end: int
    records: tuple[Record, ...]


async def read_tail(partition: PartitionLog, count: int = TAIL_RECORDS) -> Tail:
    """The last ``count`` records below the high watermark, as many of them as
    :data:`READ_BYTES` decodes (the first ones of them, then)."""
    end, start = partition.high_watermark, partition.log_start_offset
    first = max(start, end - count)
    records: tuple[Record, ...] = ()
    if first < end:
        try:
            data = await partition.read(first, READ_BYTES)
            records = records_from_batches(data, first, max_bytes=READ_BYTES)[:count]
        except (OffsetOutOfRange, CorruptSegment, RemoteProtocolError):
            pass  # gone by retention meanwhile, or unreadable: shown as none
    return Tail(log_start=start, end=end, records=records)


@attrs.define(eq=False)
class RecordViewer:
    """Who may see records, and where they are."""

    access: Access
    credential: FindCredential
    #: The partitions whose logs are on this broker.
    partitions: Callable[[], dict[TopicPartition, PartitionLog]]
    _checks: trio.CapacityLimiter = attrs.field(
        factory=lambda: trio.CapacityLimiter(CHECKS_AT_ONCE)
    )
    _failures: trio.Lock = attrs.field(factory=trio.Lock)

    @property
    def on(self) -> bool:
        return self.access.current.enabled

    async def principal(self, login: Login) -> str | None:
        """The principal ``login`` authenticates as; None, :data:`FAILED_AUTHENTICATION_DELAY`
        late and after any earlier failure's answer, if it does not. The password is checked
        against the user's credential for every mechanism, a decoy's where it has none, so that
        an unknown user takes as long as a wrong password."""
        matched = False
        for mechanism in MECHANISMS:
            credential = await self.credential(login.user, mechanism)
            checked = credential or SCRAMP.decoy(mechanism)
            right = await trio.to_thread.run_sync(
                password_matches, checked, login.password, limiter=self._checks
            )
            matched |= right and credential is not None
        if matched:
            return principal_of(login.user)
        async with self._failures:
            await trio.sleep(FAILED_AUTHENTICATION_DELAY)
        return None

    def may_read(self, principal: str, topic: str) -> bool:
        return self.access.current.allows(principal, Operation.READ, ResourceType.TOPIC, topic)
