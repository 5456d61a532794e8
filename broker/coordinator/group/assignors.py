"""Server-side assignors of consumer-protocol groups (KIP-848), chosen per group by the members'
``ServerAssignor`` and the broker's ``group.consumer.assignors`` (the first is the default).

An assignor is a pure function ``(members, topics, previous) -> target``: ``members`` maps a
member id to the topic names it subscribes to, ``topics`` maps a topic name to its (topic id,
partition count) for the subscribed topics that exist, ``previous`` is the group's current
target assignment; the result maps every member to ``{topic id: partitions}``.

* ``uniform``: every partition goes to one subscribed member, as evenly as the subscriptions
  allow (counts within one of each other when all members subscribe to the same topics), and a
  partition stays with its previous owner unless balance needs it elsewhere, so a rebalance
  moves as few partitions as possible.
* ``range``: per topic, its subscribers in member-id order get contiguous ranges of partitions,
  the first ``partitions % subscribers`` one more than the others.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping

Target = dict[str, dict[uuid.UUID, set[int]]]
Assignor = Callable[
    [
        Mapping[str, frozenset[str]],
        Mapping[str, tuple[uuid.UUID, int]],
        Mapping[str, Mapping[uuid.UUID, set[int]]],
    ],
    Target,
]


def _subscribers(
    members: Mapping[str, frozenset[str]], topics: Mapping[str, tuple[uuid.UUID, int]]
) -> dict[str, list[str]]:
    """Topic name -> its subscribing members in id order (existing topics only)."""
    return {t: sorted(m for m, subs in members.items() if t in subs) for t in sorted(topics)}


def uniform(
    members: Mapping[str, frozenset[str]],
    topics: Mapping[str, tuple[uuid.UUID, int]],
    previous: Mapping[str, Mapping[uuid.UUID, set[int]]],
) -> Target:
    subs = _subscribers(members, topics)
    name_of = {tid: name for name, (tid, _) in topics.items()}
    owner: dict[tuple[str, int], str] = {}
    load = dict.fromkeys(members, 0)
    for m in sorted(members):  # stickiness: keep what a member still subscribes to
        for tid, ps in sorted(previous.get(m, {}).items()):
            name = name_of.get(tid)
            if name is None or name not in members[m]:
                continue
            for p in sorted(ps):
                if p < topics[name][1] and (name, p) not in owner:
                    owner[(name, p)] = m
                    load[m] += 1
    order = [(t, p) for t in subs for p in range(topics[t][1])]
    for tp in order:  # new or orphaned partitions to the least loaded subscriber
        if tp not in owner and subs[tp[0]]:
            m = min(subs[tp[0]], key=lambda x: (load[x], x))
            owner[tp] = m
            load[m] += 1
    moved = True
    while moved:  # move from the most to the least loaded until within one (sticky: few moves)
        moved = False
        for tp in reversed(order):
            if tp not in owner:
                continue
            src = owner[tp]
            dst = min(subs[tp[0]], key=lambda x: (load[x], x))
            if load[src] - load[dst] > 1:
                owner[tp] = dst
                load[src] -= 1
                load[dst] += 1
                moved = True
    out: Target = {m: {} for m in members}
    for (name, p), m in owner.items():
        out[m].setdefault(topics[name][0], set()).add(p)
    return out


def range_assignor(
    members: Mapping[str, frozenset[str]],
    topics: Mapping[str, tuple[uuid.UUID, int]],
    previous: Mapping[str, Mapping[uuid.UUID, set[int]]],
) -> Target:
    out: Target = {m: {} for m in members}
    for name, subscribers in _subscribers(members, topics).items():
        if not subscribers:
            continue
        tid, count = topics[name]
        each, extra = divmod(count, len(subscribers))
        start = 0
        for i, m in enumerate(subscribers):
            n = each + (1 if i < extra else 0)
            if n:
                out[m][tid] = set(range(start, start + n))
            start += n
    return out


ASSIGNORS: dict[str, Assignor] = {"uniform": uniform, "range": range_assignor}
# Kafka's class names for the same assignors (group.consumer.assignors accepts either)
CLASS_NAMES = {
    "org.apache.kafka.coordinator.group.assignor.UniformAssignor": "uniform",
    "org.apache.kafka.coordinator.group.assignor.RangeAssignor": "range",
}


def parse_assignors(value: str | list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """``group.consumer.assignors`` (comma-separated names or Kafka class names) -> names;
    ValueError names what is unknown."""
    items = value.split(",") if isinstance(value, str) else list(value)
    names = []
    for item in (i.strip() for i in items):
        if not item:
            continue
        name = CLASS_NAMES.get(item, item)
        if name not in ASSIGNORS:
            raise ValueError(f"unknown assignor {item!r} (known: {', '.join(ASSIGNORS)})")
        if name not in names:
            names.append(name)
    if not names:
        raise ValueError("no assignor given")
    return tuple(names)
