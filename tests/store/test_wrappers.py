"""The store's wrappers (the metrics' timing, the simulation's faults, a coordinator slot's view)
name every call they pass on, so that mypy checks each of them: none forwards through
``__getattr__``, and each has every method of the interface it stands in for."""

from __future__ import annotations

import inspect

import pytest

from broker.metrics import TimedStore
from simulation.store_faults import ContactStore, RecordingStore, SlowStore
from store import (
    ForwardingStore,
    GroupStore,
    MetadataStore,
    OfficeStore,
    ReplicationStore,
    SecurityStore,
    TopicStore,
)
from store.slot_store import SlotStore


def _methods(protocol: type) -> set[str]:
    return {
        name
        for klass in protocol.__mro__
        if klass.__module__ == "store.interface"
        for name, value in vars(klass).items()
        if inspect.isfunction(value) and not name.startswith("_")
    }


WRAPPERS = [TimedStore, RecordingStore, ContactStore, SlowStore, SlotStore, ForwardingStore]


@pytest.mark.parametrize("wrapper", WRAPPERS, ids=lambda wrapper: wrapper.__name__)
def test_a_wrapper_defines_every_method_it_passes_on(wrapper: type) -> None:
    assert not any("__getattr__" in vars(klass) for klass in wrapper.__mro__[:-1])
    defined = {name for name in dir(wrapper) if inspect.isfunction(getattr(wrapper, name))}
    assert _methods(MetadataStore) <= defined


def test_the_interface_is_its_five_protocols() -> None:
    """Every method of ``MetadataStore`` belongs to exactly one of its parts."""
    parts = [TopicStore, SecurityStore, GroupStore, ReplicationStore, OfficeStore]
    names = [name for part in parts for name in _methods(part)]
    assert sorted(names) == sorted(set(names)) == sorted(_methods(MetadataStore))
