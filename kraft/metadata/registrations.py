"""Registrations: a registered broker and one partition's replicas, leader and epochs.

Both are immutable and shared between images until a record changes them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from operator import attrgetter, itemgetter
from typing import Any, NamedTuple

from kraft.records import (
    LEADER_NONE,
    LEADER_UNCHANGED,
    RECOVERY_UNCHANGED,
    PartitionChangeRecord,
    PartitionRecord,
    RegisterBrokerRecord,
)
from kraft.slots import slot_init

__all__ = [
    "BrokerRegistration",
    "PartitionRegistration",
    "new_registration",
    "partition_record_values",
    "registration_values",
]


@dataclass(frozen=True, slots=True)
class BrokerRegistration:
    """A registered broker. ``epoch`` is the offset of its latest RegisterBrokerRecord."""

    broker_id: int
    incarnation_id: str
    epoch: int
    endpoints: tuple[dict[str, Any], ...]
    features: tuple[dict[str, Any], ...]
    rack: str | None
    fenced: bool
    in_controlled_shutdown: bool

    @property
    def is_active(self) -> bool:
        """Unfenced and not in controlled shutdown: may lead, join ISRs and get new replicas."""
        return not self.fenced and not self.in_controlled_shutdown

    @classmethod
    def from_record(cls, r: RegisterBrokerRecord) -> BrokerRegistration:
        return cls(
            r.broker_id,
            r.incarnation_id,
            r.broker_epoch,
            r.endpoints,
            r.features,
            r.rack,
            r.fenced,
            r.in_controlled_shutdown,
        )

    def to_record(self) -> RegisterBrokerRecord:
        return RegisterBrokerRecord(
            self.broker_id,
            self.incarnation_id,
            self.epoch,
            self.endpoints,
            self.features,
            self.rack,
            self.fenced,
            self.in_controlled_shutdown,
        )


class PartitionRegistration(NamedTuple):
    """One partition's replicas (preferred order first), ISR, leader and epochs.

    A named tuple of exactly these fields in this order (immutable), so that a snapshot row's
    values ``row[2:]`` become a registration in one C call and a topic's checksum digest packs
    registrations as they are."""

    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    removing_replicas: tuple[int, ...]
    adding_replicas: tuple[int, ...]
    leader: int
    leader_recovery_state: int
    leader_epoch: int
    partition_epoch: int

    @classmethod
    def from_record(cls, r: PartitionRecord) -> PartitionRegistration:
        return new_registration(partition_record_values(r))

    def to_record(self, topic_id: str, partition_id: int) -> PartitionRecord:
        return PartitionRecord(partition_id, topic_id, *self)

    @property
    def preferred_leader(self) -> int:
        """replicas[0], or LEADER_NONE for a partition without replicas."""
        return self.replicas[0] if self.replicas else LEADER_NONE

    def merge(self, change: PartitionChangeRecord) -> PartitionRegistration:
        """The registration after ``change``: unchanged fields stay, partition epoch + 1 always,
        leader epoch + 1 iff the change sets the leader (even to the same broker)."""
        replicas, isr, removing, adding, leader, recovery, leader_epoch, partition_epoch = self
        if change.leader != LEADER_UNCHANGED:
            leader, leader_epoch = change.leader, leader_epoch + 1
        if change.leader_recovery_state != RECOVERY_UNCHANGED:
            recovery = change.leader_recovery_state
        return new_registration(
            (
                replicas if change.replicas is None else change.replicas,
                isr if change.isr is None else change.isr,
                removing if change.removing_replicas is None else change.removing_replicas,
                adding if change.adding_replicas is None else change.adding_replicas,
                leader,
                recovery,
                leader_epoch,
                partition_epoch + 1,
            )
        )


# PartitionRegistration from a tuple of its 8 values, without the keyword-handling __new__.
new_registration: Callable[[tuple[Any, ...]], PartitionRegistration] = partial(
    tuple.__new__, PartitionRegistration
)
# A PartitionRecord's values after partition_id and topic_id: its registration's fields.
partition_record_values = attrgetter(*PartitionRegistration._fields)

registration_values = itemgetter(slice(2, None))  # a PartitionRecord row's registration fields

# built once per changed registration: a slot-setting __init__
BrokerRegistration.__init__ = slot_init(BrokerRegistration)  # type: ignore[method-assign]  # a faster generated __init__, same signature
