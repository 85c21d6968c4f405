"""Transition tables as data, in the manner of h11's ``_state.py``.

A machine's table maps ``(state, input type)`` to the next state. Looking an input up is the only
way a machine changes state, so an input the table does not list raises
:class:`IllegalTransition` before anything is touched, and the diagrams in ``docs/`` are rendered
from the same data the code runs.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Generic, TypeVar

import attrs

S = TypeVar("S", bound=enum.Enum)


class IllegalTransition(Exception):
    """An input arrived that the machine's table does not allow in its current state."""

    def __init__(self, machine: str, state: enum.Enum, event: object) -> None:
        self.machine = machine
        self.state = state
        self.event = event
        super().__init__(f"{machine}: {type(event).__name__} is not allowed in state {state.name}")


@attrs.frozen
class TransitionTable(Generic[S]):
    """An immutable ``(state, input type) -> next state`` table."""

    name: str
    transitions: Mapping[tuple[S, type], S]

    def next_state(self, state: S, event: object) -> S:
        try:
            return self.transitions[(state, type(event))]
        except KeyError:
            raise IllegalTransition(self.name, state, event) from None

    def allows(self, state: S, event_type: type) -> bool:
        return (state, event_type) in self.transitions

    def inputs(self) -> list[type]:
        """Every input type the table knows, in first-seen order (for diagrams and tests)."""
        seen: dict[type, None] = {}
        for _, event_type in self.transitions:
            seen.setdefault(event_type, None)
        return list(seen)
