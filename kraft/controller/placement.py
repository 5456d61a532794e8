"""Replica placement for new partitions: striped and rack-aware (docs/kraft-notes.md, Replica placement).

Rules (Kafka's StripedReplicaPlacer, re-derived from its description):

* candidates are the registered brokers that are not in controlled shutdown, grouped by rack;
  inside a rack unfenced brokers come first, fenced ones only when the unfenced ones run out;
* racks are visited round-robin from a random start that moves by one per partition (the
  "stripe"), and each rack hands out its brokers round-robin from a random start that moves by
  one each time the rack is used, so leaders and followers spread evenly;
* replica 0 (the first leader) is always unfenced; the other replicas go one per rack per turn,
  so spreading across racks wins over spreading across brokers;
* no broker twice in a partition; the replication factor may not exceed the candidates.

Failures raise ``KraftError(INVALID_REPLICATION_FACTOR, ...)``. The result depends only on the
brokers and the ``random.Random`` passed in, so every controller computes the same placement.
"""

from __future__ import annotations

import os
import random
from collections.abc import Sequence
from typing import Any, NamedTuple

from kraft.errors import ErrorCode, KraftError

__all__ = ["PlacementBroker", "place_replicas"]

# Test-only hook (tests/integration/test_rolling_upgrade.py): ``KRAFT_TEST_PLACEMENT=followers-
# reversed`` in a controller's environment makes its placer list each partition's followers in
# reverse order, standing in for a controller running a changed placement rule during a rolling
# upgrade. Read once at import; never set it in production.
_TEST_PLACEMENT = os.environ.get("KRAFT_TEST_PLACEMENT", "")


class PlacementBroker(NamedTuple):
    """A broker as the placer sees it."""

    id: int
    rack: str | None
    fenced: bool


def _as_placement_broker(broker: Any) -> PlacementBroker | None:
    """Accept a PlacementBroker or a ``BrokerRegistration``; None for one in controlled shutdown."""
    if isinstance(broker, PlacementBroker):
        return broker
    if getattr(broker, "in_controlled_shutdown", False):
        return None
    broker_id = broker.broker_id if hasattr(broker, "broker_id") else broker.id
    return PlacementBroker(broker_id, broker.rack, bool(broker.fenced))


class _Rack:
    """One rack's candidates (unfenced and fenced, each by id) and its round-robin cursors: one
    for the leaders it gives, one each for the unfenced and fenced followers it gives. Every
    cursor starts at a random position."""

    __slots__ = ("fenced", "next_fenced", "next_leader", "next_unfenced", "unfenced")

    def __init__(self, unfenced: list[int], fenced: list[int], rng: random.Random) -> None:
        self.unfenced = unfenced
        self.fenced = fenced
        self.next_leader = rng.randrange(len(unfenced)) if unfenced else 0
        self.next_unfenced = rng.randrange(len(unfenced)) if unfenced else 0
        self.next_fenced = rng.randrange(len(fenced)) if fenced else 0

    def take_leader(self) -> int:
        """The rack's next leader (unfenced; the caller checks that it has one)."""
        broker = self.unfenced[self.next_leader % len(self.unfenced)]
        self.next_leader += 1
        return broker

    def take_follower(self, chosen: list[int]) -> int | None:
        """The rack's next broker not in ``chosen``: unfenced first, then fenced; None if the
        rack has no broker left for this partition."""
        broker, self.next_unfenced = _next_not_chosen(self.unfenced, self.next_unfenced, chosen)
        if broker is None:
            broker, self.next_fenced = _next_not_chosen(self.fenced, self.next_fenced, chosen)
        return broker


def _next_not_chosen(members: list[int], start: int, chosen: list[int]) -> tuple[int | None, int]:
    """The first of ``members`` from cursor ``start`` (cyclic) not in ``chosen``, and the cursor
    after it; (None, start) when all are chosen."""
    n = len(members)
    for k in range(n):
        broker = members[(start + k) % n]
        if broker not in chosen:
            return broker, start + k + 1
    return None, start


def _rack_sort_key(rack: str | None) -> tuple[bool, str]:
    return (rack is not None, rack or "")


def place_replicas(
    brokers: Sequence[Any],
    start_partition: int,
    num_partitions: int,
    replication_factor: int,
    rng: random.Random,
) -> list[list[int]]:
    """Replica lists (preferred leader first) for partitions ``start_partition`` ..
    ``start_partition + num_partitions - 1``. ``brokers`` are :class:`PlacementBroker`\\ s or
    broker registrations (those in controlled shutdown are skipped)."""
    candidates = [b for b in map(_as_placement_broker, brokers) if b is not None]
    skipped = len(brokers) - len(candidates)
    if replication_factor <= 0:
        raise KraftError(
            ErrorCode.INVALID_REPLICATION_FACTOR,
            f"Invalid replication factor {replication_factor}: it must be at least 1.",
        )
    if replication_factor > len(candidates):
        where = f" ({skipped} more are in controlled shutdown)" if skipped else ""
        raise KraftError(
            ErrorCode.INVALID_REPLICATION_FACTOR,
            f"The target replication factor of {replication_factor} cannot be reached "
            f"because only {len(candidates)} broker(s) are registered{where}.",
        )
    if all(b.fenced for b in candidates):
        raise KraftError(
            ErrorCode.INVALID_REPLICATION_FACTOR,
            f"Unable to place replicas: all {len(candidates)} usable broker(s) are "
            "currently fenced, and the first replica must be on an unfenced broker.",
        )
    if len({b.id for b in candidates}) != len(candidates):
        raise ValueError("place_replicas: duplicate broker ids")
    if num_partitions <= 0:
        return []

    by_rack: dict[str | None, tuple[list[int], list[int]]] = {}
    for b in candidates:
        unfenced, fenced = by_rack.setdefault(b.rack, ([], []))
        (fenced if b.fenced else unfenced).append(b.id)
    racks: list[_Rack] = []
    for name in sorted(by_rack, key=_rack_sort_key):
        unfenced, fenced = by_rack[name]
        racks.append(_Rack(sorted(unfenced), sorted(fenced), rng))
    rack_count = len(racks)
    first_rack = (rng.randrange(rack_count) + start_partition) % rack_count

    out: list[list[int]] = []
    for i in range(num_partitions):
        start = (first_rack + i) % rack_count
        # replica 0: from the first rack of the stripe that has an unfenced broker
        leader_rack = start
        while not racks[leader_rack].unfenced:
            leader_rack = (leader_rack + 1) % rack_count
        chosen = [racks[leader_rack].take_leader()]
        # the others: one per rack per turn from the stripe start; the leader's rack sits out
        # its first turn so that the second replica goes to another rack when one exists
        r = start
        leader_rack_skipped = False
        while len(chosen) < replication_factor:
            if r == leader_rack and not leader_rack_skipped:
                leader_rack_skipped = True
            else:
                broker = racks[r].take_follower(chosen)
                if broker is not None:
                    chosen.append(broker)
            r += 1
            if r == rack_count:
                r = 0
        if _TEST_PLACEMENT == "followers-reversed":
            chosen[1:] = chosen[:0:-1]
        out.append(chosen)
    return out
