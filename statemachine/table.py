"""Transition tables as data, in the manner of h11's ``_state.py``.

A machine's table maps ``(state, input type)`` to the next state. Looking an input up is the only
way a machine changes state, so an input the table does not list raises
:class:`IllegalTransition` before anything is touched, and the diagrams in ``docs/`` are rendered
from the same data the code runs.

Where the same input can end in different states (the last member leaving empties a group, the
miss that uses up a member's allowance kills it), the entry is :class:`Guarded`: a choice among
named pure predicates over the machine and the input, exactly one of which holds. The table still
decides the next state, and the diagram prints each outcome with its guard's name
(``MemberDeparted [last]``), so no code has to correct the table's answer afterwards.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Generic, TypeVar

import attrs

from protocol.errors import IllegalInput

S = TypeVar("S", bound=enum.Enum)


class IllegalTransition(IllegalInput):
    """An input arrived that the machine's table does not allow in its current state: the
    machines' kind of :class:`~protocol.errors.IllegalInput`, the one family of illegal inputs."""

    def __init__(self, machine: str, state: enum.Enum, event: object) -> None:
        self.machine = machine
        self.state = state
        self.event = event
        super().__init__(f"{machine}: {type(event).__name__} is not allowed in state {state.name}")


class GuardConflict(Exception):
    """The guards of an entry did not single out one outcome: the table itself is wrong."""


@attrs.frozen
class Guard:
    """A named pure predicate over ``(machine, input)``, evaluated before the machine changes.

    ``~guard`` is its complement, named ``otherwise`` (``not <name>`` if that is not given), so an
    entry can list both outcomes of one test without writing the test twice.
    """

    name: str
    holds: Callable[[Any, Any], bool] = attrs.field(eq=False)
    otherwise: str | None = None

    def __invert__(self) -> Guard:
        holds = self.holds
        return Guard(
            self.otherwise or f"not {self.name}",
            lambda machine, event: not holds(machine, event),
            otherwise=self.name,
        )


@attrs.frozen
class Guarded(Generic[S]):
    """An entry with several outcomes: ``(guard, next state)`` pairs; exactly one guard holds."""

    outcomes: tuple[tuple[Guard, S], ...]

    def __attrs_post_init__(self) -> None:
        names = [guard.name for guard, _ in self.outcomes]
        if len(names) < 2 or len(set(names)) != len(names):
            raise ValueError(f"a guarded entry needs two or more distinctly named guards: {names}")


@attrs.frozen(kw_only=True)
class Transition(Generic[S]):
    """One outcome of the table: ``guard`` is None for an entry with a single outcome."""

    source: S
    event_type: type
    guard: str | None
    target: S


@attrs.frozen
class TransitionTable(Generic[S]):
    """An immutable ``(state, input type) -> next state`` table, some entries guarded."""

    name: str
    transitions: Mapping[tuple[S, type], S | Guarded[S]]

    def lookup(self, state: S, event: object, machine: object = None) -> Transition[S]:
        """The outcome the table gives ``event`` in ``state``; guards are asked about ``machine``
        as it is before the input, so the lookup changes nothing and may be repeated."""
        try:
            entry = self.transitions[(state, type(event))]
        except KeyError:
            raise IllegalTransition(self.name, state, event) from None
        if not isinstance(entry, Guarded):
            return Transition(source=state, event_type=type(event), guard=None, target=entry)
        chosen = [(g, target) for g, target in entry.outcomes if g.holds(machine, event)]
        if len(chosen) != 1:
            held = [g.name for g, _ in chosen]
            raise GuardConflict(
                f"{self.name}: {type(event).__name__} in {state.name}: guards {held} hold"
            )
        ((guard, target),) = chosen
        return Transition(source=state, event_type=type(event), guard=guard.name, target=target)

    def next_state(self, state: S, event: object, machine: object = None) -> S:
        return self.lookup(state, event, machine).target

    def allows(self, state: S, event_type: type) -> bool:
        return (state, event_type) in self.transitions

    def inputs(self) -> list[type]:
        """Every input type the table knows, in first-seen order (for diagrams and tests)."""
        seen: dict[type, None] = {}
        for _, event_type in self.transitions:
            seen.setdefault(event_type, None)
        return list(seen)

    def entries(self) -> Iterator[Transition[S]]:
        """Every outcome the table can give, each guarded outcome on its own (for diagrams and
        for tests that drive every one)."""
        for (source, event_type), entry in self.transitions.items():
            if isinstance(entry, Guarded):
                for guard, target in entry.outcomes:
                    yield Transition(
                        source=source, event_type=event_type, guard=guard.name, target=target
                    )
            else:
                yield Transition(source=source, event_type=event_type, guard=None, target=entry)
