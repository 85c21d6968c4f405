"""The api keys: which message a frame carries (SPEC.md §3), in a module of their own so that
the message modules (:mod:`protocol.messages`, :mod:`protocol.replica_messages`) share them."""

from __future__ import annotations

import enum


class ApiKey(enum.IntEnum):
    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    CLUSTER_METADATA = 3
    REGISTER_CONSUMER = 4
    PING = 5
    STOP_FETCHER = 6
    START_FETCHER = 7
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    CREATE_TOPIC = 10
    CREATE_PARTITIONS = 11
    LIST_GROUPS = 12
    DESCRIBE_GROUP = 13
    LEAVE_GROUP = 14
    DELETE_GROUP = 15
    SASL_HANDSHAKE = 17
    DELETE_TOPIC = 20
    DESCRIBE_ACLS = 29
    CREATE_ACLS = 30
    DELETE_ACLS = 31
    SASL_AUTHENTICATE = 36
    DESCRIBE_USER_SCRAM_CREDENTIALS = 50
    ALTER_USER_SCRAM_CREDENTIALS = 51
    REPLICA_FETCH = 1000
    """Our own number, like the error codes above 1000: Kafka's followers fetch with Fetch and a
    ``replica_id``, which would change what FETCH means for clients (SPEC.md §8, 1000)."""


COORDINATOR_REQUESTS: frozenset[ApiKey] = frozenset(
    {ApiKey.PING, ApiKey.STOP_FETCHER, ApiKey.START_FETCHER}
)
"""Requests only the broker side sends (over the connection the consumer opened); the consumer side
sends every other request and never these."""
