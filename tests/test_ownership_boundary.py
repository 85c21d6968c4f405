"""Who may fetch which partition is decided by ``statemachine.ownership`` alone: the trio code feeds
the machine and performs its effects, and never writes ownership state itself."""

import ast
import pathlib

import attrs

from coordinator.driver import GroupDriver, Member
from statemachine.consumer_group import ConsumerGroup, GroupMember

ROOT = pathlib.Path(__file__).resolve().parents[1]
#: Packages with trio code that handles groups and members.
TRIO_PACKAGES = ("coordinator", "simulation", "broker")
#: Attributes that held ownership state outside the machine, and the machine itself.
OWNERSHIP_STATE = frozenset(
    {"owned", "owned_generation", "free_at", "leases", "holding", "holdings", "ownership"}
)
MUTATORS = frozenset(
    {"pop", "popitem", "clear", "update", "setdefault", "add", "discard", "remove", "append"}
)


def _writes(source: str) -> list[str]:
    """Assignments and deletions to ``x.<state>`` or ``x.<state>[...]``, mutating calls on them
    (``x.<state>.pop(...)``), and any use of the machine's private attributes
    (``x.ownership._...``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = node.targets
        for target in targets:
            while isinstance(target, ast.Subscript):
                target = target.value
            if isinstance(target, ast.Attribute) and target.attr in OWNERSHIP_STATE:
                found.append(f"line {target.lineno}: {ast.unparse(node)}")
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in MUTATORS
            and isinstance(node.func.value, ast.Attribute)
            and node.func.value.attr in OWNERSHIP_STATE
        ):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
        if (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and isinstance(node.value, ast.Attribute)
            and node.value.attr == "ownership"
        ):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_the_scan_finds_writes_to_ownership_state() -> None:
    source = (
        "member.owned = frozenset()\n"
        "group.free_at[tp] = 3.0\n"
        "del group.leases[member_id]\n"
        "group.free_at.pop(tp, None)\n"
        "group.ownership._held.clear()\n"
        "owned = group.ownership.holding(incarnation).partitions\n"
        "group.ownership.handle(event)\n"
    )
    assert len(_writes(source)) == 5


def test_no_trio_code_writes_ownership_state() -> None:
    offenders = [
        f"{path.relative_to(ROOT)} {write}"
        for package in TRIO_PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        for write in _writes(path.read_text())
    ]
    assert offenders == []


def test_members_and_groups_keep_no_ownership_state_of_their_own() -> None:
    for member in (Member, GroupMember, GroupDriver):
        assert not {f.name for f in attrs.fields(member)} & OWNERSHIP_STATE
    assert {f.name for f in attrs.fields(ConsumerGroup)} & OWNERSHIP_STATE == {"ownership"}
