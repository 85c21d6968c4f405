"""The ZooKeeper store's nodes (docs/design.md#metadata-layout; Kafka 0.8's paths where the seeds
keep them)::

    /brokers/ids/<id>                                 ephemeral {"host": h, "port": p, "listeners":
                                                      {name: {"host": h, "port": p}, ...},
                                                      "layout": 4, "log_dir": uuid}
    /brokers/topics/<topic>                           {"0": broker_id, "1": broker_id, ...}, or
                                                      {"0": [broker_id, ...], ...} replicated
    /brokers/partition_states/<topic_id>/<p>          {"leader": id, "leader_epoch": e, "isr":
                                                      [[id, dir uuid], ...], "controller_epoch":
                                                      slot epoch (absent: a leader's write)}; its
                                                      version is the partition epoch
    /brokers/partition_changes/c-<seq>                {"states": [[topic_id, p, state + "version"],
                                                      ...]}: each write of states, in order
    /brokers/topic_ids/<topic>                        {"topic_id": uuid | null}: the id of the
                                                      incarnation in force (null: none), written
                                                      with every create and delete of the name
    /consumers/coordinator                            persistent {"broker_id": -1}: layout 1's
                                                      office, kept occupied (occupy_single_office)
    /coordinator_layout                               {"version": v, "slots": n}, written once
    /coordinator_slots/<slot>                         ephemeral {"broker_id": id}; czxid = epoch
    /coordinator_slot_epochs/<slot>                   persistent; its version counts its terms
    /config/topics/<topic>                            {"version": 1, "config": {name: value}}:
                                                      Kafka's node of the topic's settings,
                                                      written in the transaction creating the
                                                      topic node; one older than that node is a
                                                      deleted incarnation's and counts for none
    /config/users/<user>                              {mechanism: {"salt", "stored_key",
                                                      "server_key", "iterations"}} (SCRAM)
    /config/acls                                      [{"principal", "resource_type", "name",
                                                      "operation"}, ...]
    /consumers/<group>/registry                       {"generation": g, "record": r, "chunks": k}
    /consumers/<group>/records/<r>-<i>                chunk i of record r: the GroupRecord's JSON
                                                      (codec.encode_group), cut into k pieces
    /consumers/<group>/owners                         the record r its owner nodes mirror
    /consumers/<group>/owners/<topic>/<partition>     "<member_id>-<index>" (intended owner)
    /consumers/<group>/offsets/<topic>/<partition>    {"offset": next, "generation": g,
                                                      "topic_id": uuid}: the incarnation's id
                                                      (absent: written before topics had ids)

Group and topic names are percent-encoded where a znode name needs it (``/``, ``%``, and the name
``coordinator``, which the election node takes); ordinary names read as themselves.

The path helpers (``group_path``, ``topic_path``, ``segment_name``) are public because seed 02's
client-side rebalancing (``bench/seed02_session.py``, the benchmarks' baseline) keeps its nodes in
the same layout.
"""

from __future__ import annotations

import json
import urllib.parse
from functools import lru_cache
from typing import Any

__all__ = [
    "ACLS",
    "BROKER_IDS",
    "CONSUMERS",
    "ELECTION",
    "LAYOUT",
    "LAYOUT_VERSION",
    "PARTITION_CHANGES",
    "PARTITION_STATES",
    "SLOT_ELECTIONS",
    "SLOT_EPOCHS",
    "TOPICS",
    "TOPIC_CONFIGS",
    "TOPIC_IDS",
    "USERS",
    "group_path",
    "json_bytes",
    "partition_state_path",
    "record_path",
    "segment",
    "segment_name",
    "topic_config_path",
    "topic_config_value",
    "topic_id_path",
    "topic_path",
    "user_path",
]

BROKER_IDS = "/brokers/ids"
TOPICS = "/brokers/topics"
#: One node per topic name: the id of its incarnation in force (docs/design.md#topic-ids).
TOPIC_IDS = "/brokers/topic_ids"
#: One node per replicated partition, under its topic's id (docs/design.md#metadata-layout):
#: not under the topic node, which a broker of layout 3 deletes alone (it would fail, not empty),
#: and a name created again starts with none.
PARTITION_STATES = "/brokers/partition_states"
#: A sequential node per write of states, holding them with their new versions, so that a
#: broker follows every state through one child watch instead of one data watch each.
PARTITION_CHANGES = "/brokers/partition_changes"
CONSUMERS = "/consumers"
#: Layout 1's single office, which no broker of layout 2 takes (``occupy_single_office``).
ELECTION = "/consumers/coordinator"
LAYOUT = "/coordinator_layout"
#: Per coordinator slot: ephemeral ``<slot>`` election nodes, and persistent counters whose
#: versions count each slot's terms (docs/design.md#coordinator-slots).
SLOT_ELECTIONS = "/coordinator_slots"
SLOT_EPOCHS = "/coordinator_slot_epochs"
USERS = "/config/users"
#: One node per topic created with this layout: its settings (protocol/topic_configs.py), in
#: Kafka's shape. Brokers that predate it read no such node and serve every topic with their own
#: settings, as they always did; so it adds a node without changing any, and no layout version.
TOPIC_CONFIGS = "/config/topics"
ACLS = "/config/acls"

#: The layout of the nodes above that this code reads and writes: version 1 was one election node
#: whose holder coordinated every slot; version 2 elects a holder per slot, and a broker of either
#: refuses to start on the other's store (docs/design.md#coordinator-slots); version 3 gives
#: topics ids (``TOPIC_IDS``, the offsets' ``topic_id``), and a broker of it upgrades a store of
#: version 2 (``Cluster.check_layout``), which a broker of version 2 then refuses; version 4
#: adds replicas (replica lists in topic nodes, ``PARTITION_STATES``, ``PARTITION_CHANGES``, a
#: broker's layout and log directory in its registration), upgrading a store of 2 or 3 alike.
LAYOUT_VERSION = 4


def json_bytes(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()


#: Names that cannot be znode names, or that this layout uses for itself.
_RESERVED = frozenset({".", "..", "coordinator"})


@lru_cache(maxsize=4096)  # offset commits build every path anew, quoting each name
def segment(name: str) -> str:
    """A group or topic name as one znode name: percent-encoded where it must be (``/``, ``%``,
    anything outside ``[A-Za-z0-9_.~-]``), and a reserved name spelled out in full, so that the
    encoding is reversible and ordinary names read as themselves in other tools."""
    quoted = urllib.parse.quote(name, safe="")
    if quoted in _RESERVED:
        return "".join(f"%{byte:02X}" for byte in name.encode())
    return quoted or "%"


def segment_name(segment: str) -> str:
    """The group or topic name a znode name (``segment``) spells."""
    return "" if segment == "%" else urllib.parse.unquote(segment)


def group_path(group_id: str, *parts: object) -> str:
    """``/consumers/<group>/<part>/...``, each name one znode name."""
    return "/".join((CONSUMERS, segment(group_id), *(segment(str(part)) for part in parts)))


def record_path(group_id: str, record: str, index: int) -> str:
    return group_path(group_id, "records", f"{record}-{index}")


def user_path(user: str) -> str:
    return f"{USERS}/{segment(user)}"


def topic_path(topic: str) -> str:
    """``/brokers/topics/<topic>``: the topic's placement."""
    return f"{TOPICS}/{segment(topic)}"


def topic_id_path(topic: str) -> str:
    """``/brokers/topic_ids/<topic>``: the id of the name's incarnation in force."""
    return f"{TOPIC_IDS}/{segment(topic)}"


def partition_state_path(topic_id: object, partition: int | None = None) -> str:
    """``/brokers/partition_states/<topic_id>[/<partition>]``."""
    path = f"{PARTITION_STATES}/{topic_id}"
    return path if partition is None else f"{path}/{partition}"


def topic_config_path(topic: str) -> str:
    """``/config/topics/<topic>``: the settings the topic was created with."""
    return f"{TOPIC_CONFIGS}/{segment(topic)}"


def topic_config_value(configs: tuple[tuple[str, str], ...]) -> bytes:
    """A settings node's data, as Kafka writes it."""
    return json_bytes({"version": 1, "config": dict(configs)})
