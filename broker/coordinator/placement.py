"""Where a group lives: ``abs(hashCode(group_id)) % partitions`` of ``__consumer_offsets``, with
Java's String.hashCode (over UTF-16 code units, wrapped to signed 32 bits) and Kafka's
``Utils.abs`` (Integer.MIN_VALUE maps to 0), so a group lands on the partition Kafka picks."""

from __future__ import annotations

from functools import lru_cache

OFFSETS_TOPIC = "__consumer_offsets"
TXN_TOPIC = "__transaction_state"
INTERNAL_TOPICS = frozenset({OFFSETS_TOPIC, TXN_TOPIC})


@lru_cache(maxsize=65536)  # every group request hashes its group id; most ids come back
def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode()`` of ``text``."""
    data = text.encode("utf-16-be")
    h = 0
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def kafka_abs(n: int) -> int:
    """Kafka's ``Utils.abs``: Integer.MIN_VALUE becomes 0, anything else its absolute value."""
    return 0 if n == -(1 << 31) else abs(n)


def partition_for(key: str, partitions: int) -> int:
    """The ``__consumer_offsets`` partition of group ``key`` (or ``__transaction_state``
    partition of transactional id ``key``)."""
    return kafka_abs(java_string_hash(key)) % partitions
