"""A store that hands every call to another, named method by method, for the wrappers that
change a few of them (the metrics' timing, the simulation's faults, a coordinator slot's view):
a wrapper subclasses it and overrides what it changes, and mypy checks every call that passes
through, as it cannot through ``__getattr__``."""

from __future__ import annotations

import uuid
from collections.abc import AsyncGenerator, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Generic, TypeVar

import attrs

from protocol.sasl import ScramCredential
from protocol.types import BrokerInfo, TopicPartition
from statemachine.acl import Acl
from statemachine.partition_state import PartitionKey, PartitionState, StateWrite

from .interface import (
    Assignment,
    ClusterStore,
    GroupRecord,
    MetadataStore,
    OffsetBatch,
    TopicPlacement,
)

__all__ = ["ForwardingCluster", "ForwardingStore"]

Inner = TypeVar("Inner", bound=ClusterStore)


@attrs.define(eq=False)
class ForwardingCluster(Generic[Inner]):
    """``inner``'s topics, security and groups by id (``ClusterStore``), passed through; a
    subclass adds the office (``OfficeStore``)."""

    inner: Inner

    async def register_broker(
        self,
        broker: BrokerInfo,
        advertised: Mapping[str, tuple[str, int]] | None = None,
        *,
        log_dir: uuid.UUID | None = None,
    ) -> None:
        await self.inner.register_broker(broker, advertised, log_dir=log_dir)

    async def brokers(self, listener: str | None = None) -> tuple[BrokerInfo, ...]:
        return await self.inner.brokers(listener)

    async def create_topic(
        self, topic: str, brokers: Assignment, configs: tuple[tuple[str, str], ...] = ()
    ) -> TopicPlacement:
        return await self.inner.create_topic(topic, brokers, configs)

    async def add_partitions(self, topic: str, brokers: Assignment) -> TopicPlacement:
        return await self.inner.add_partitions(topic, brokers)

    async def delete_topic(self, topic: str) -> None:
        await self.inner.delete_topic(topic)

    async def topics(self) -> Mapping[str, TopicPlacement]:
        return await self.inner.topics()

    def topic_updates(self) -> AsyncGenerator[Mapping[str, TopicPlacement], None]:
        return self.inner.topic_updates()

    async def write_group(self, epoch: int, group: GroupRecord) -> None:
        await self.inner.write_group(epoch, group)

    async def delete_group(self, epoch: int, group_id: str) -> None:
        await self.inner.delete_group(epoch, group_id)

    async def commit_offsets(self, epoch: int, batches: Sequence[OffsetBatch]) -> None:
        await self.inner.commit_offsets(epoch, batches)

    async def delete_offsets(self, epoch: int, group_id: str, topic: str) -> None:
        await self.inner.delete_offsets(epoch, group_id, topic)

    async def fetch_offsets(self, group_id: str) -> Mapping[TopicPartition, int]:
        return await self.inner.fetch_offsets(group_id)

    async def partition_states(self) -> Mapping[PartitionKey, PartitionState]:
        return await self.inner.partition_states()

    def partition_state_updates(
        self,
    ) -> AsyncGenerator[Mapping[PartitionKey, PartitionState], None]:
        return self.inner.partition_state_updates()

    async def read_partition_states(
        self, keys: Iterable[PartitionKey]
    ) -> Mapping[PartitionKey, PartitionState]:
        return await self.inner.read_partition_states(keys)

    async def write_partition_states(
        self, epoch: int | None, writes: Sequence[StateWrite]
    ) -> tuple[PartitionKey, ...]:
        return await self.inner.write_partition_states(epoch, writes)

    async def broker_dirs(self) -> Mapping[int, uuid.UUID]:
        return await self.inner.broker_dirs()

    async def scram_credential(self, user: str, mechanism: str) -> ScramCredential | None:
        return await self.inner.scram_credential(user, mechanism)

    async def set_scram_credential(self, user: str, credential: ScramCredential) -> None:
        await self.inner.set_scram_credential(user, credential)

    async def delete_user(self, user: str) -> bool:
        return await self.inner.delete_user(user)

    async def users(self) -> Mapping[str, tuple[str, ...]]:
        return await self.inner.users()

    async def acls(self) -> frozenset[Acl]:
        return await self.inner.acls()

    async def change_acls(self, added: Sequence[Acl], removed: Sequence[Acl]) -> frozenset[Acl]:
        return await self.inner.change_acls(added, removed)


@attrs.define(eq=False)
class ForwardingStore(ForwardingCluster[MetadataStore]):
    """``inner`` whole, office included, passed through."""

    async def take_office(self, broker_id: int) -> int:
        return await self.inner.take_office(broker_id)

    async def coordinator_id(self) -> int | None:
        return await self.inner.coordinator_id()

    def in_contact_until(self) -> float:
        return self.inner.in_contact_until()

    async def groups(self) -> Mapping[str, GroupRecord]:
        return await self.inner.groups()

    async def offset_only_groups(self) -> frozenset[str]:
        return await self.inner.offset_only_groups()


if TYPE_CHECKING:  # mypy proves here that the classes meet the interface
    _cluster: type[ClusterStore] = ForwardingCluster[ClusterStore]
    _whole: type[MetadataStore] = ForwardingStore
