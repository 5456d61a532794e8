"""ListTransactions' selection and DescribeTransactions' answers (pure)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from kio.schema.errors import ErrorCode as E

from broker.coordinator.txn.admin_api import described, not_described, select
from broker.coordinator.txn.records import COMPLETE_COMMIT, EMPTY, ONGOING
from broker.coordinator.txn.state_machine import Txn


def txn(tid: str, pid: int, state: int, start_ms: int = -1, parts=()) -> Txn:
    return Txn(tid, pid, 0, 60_000, state, frozenset(parts), 0, start_ms)


TXNS = [
    txn("pay-1", 10, ONGOING, start_ms=1_000),
    txn("pay-2", 11, ONGOING, start_ms=9_000),
    txn("ship-1", 12, COMPLETE_COMMIT, start_ms=2_000),
    txn("idle", 13, EMPTY),
]


def ids(found: list[Txn]) -> list[str]:
    return [t.transactional_id for t in found]


def test_select_filters_like_kafka() -> None:
    now = 10_000
    assert ids(select(TXNS, now)[0]) == ["idle", "pay-1", "pay-2", "ship-1"]
    assert ids(select(TXNS, now, states=["Ongoing"])[0]) == ["pay-1", "pay-2"]
    assert ids(select(TXNS, now, producer_ids=[12, 13])[0]) == ["idle", "ship-1"]
    # open longer than 5 s: pay-1 (9 s); pay-2 (1 s) is too young, idle never started
    assert ids(select(TXNS, now, running_longer_than_ms=5_000)[0]) == ["pay-1", "ship-1"]
    assert ids(select(TXNS, now, id_pattern="pay-.*")[0]) == ["pay-1", "pay-2"]
    assert ids(select(TXNS, now, id_pattern="pay")[0]) == []  # the whole id must match
    found, unknown = select(TXNS, now, states=["Ongoing", "Running", "Bogus"])
    assert ids(found) == ["pay-1", "pay-2"] and unknown == ["Bogus", "Running"]
    with pytest.raises(re.error):
        select(TXNS, now, id_pattern="(")


def test_described_groups_partitions_by_topic() -> None:
    d = described(txn("pay-1", 10, ONGOING, 1_000, {("b", 2), ("a", 1), ("b", 0)}))
    assert d["error_code"] == E.none and d["transaction_state"] == "Ongoing"
    assert d["topics"] == [{"topic": "a", "partitions": [1]}, {"topic": "b", "partitions": [0, 2]}]
    assert d["transaction_timeout"] == timedelta(seconds=60)
    assert d["transaction_start_time"] == datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC)
    e = not_described("nope", E.transactional_id_not_found)
    assert e["error_code"] == E.transactional_id_not_found and e["producer_id"] == -1
    assert e["transaction_start_time"].timestamp() == 0
    never = described(txn("idle", 13, EMPTY))  # no transaction yet: Kafka's -1
    assert round(never["transaction_start_time"].timestamp() * 1000) == -1
