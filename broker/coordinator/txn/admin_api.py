"""DescribeTransactions (API 65) and ListTransactions (API 66) on the broker listener: what
``kafka-transactions.sh describe|list`` (and ``kraft transactions``) ask each transaction
coordinator.

ListTransactions answers for the ``__transaction_state`` partitions this broker leads (an admin
client asks every broker and merges), filtered as Kafka does: by state names (an unknown name is
echoed in ``unknown_state_filters`` and matches nothing), by producer ids, by "running longer
than" (v1) and by a transactional-id regular expression (v2). DescribeTransactions answers per
transactional id: ``NOT_COORDINATOR`` if another broker leads its partition,
``COORDINATOR_LOAD_IN_PROGRESS`` while loading, ``TRANSACTIONAL_ID_NOT_FOUND`` if unknown.
The selection and the answers are pure functions of the shards' transactions and ``now``.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from kio.schema.errors import ErrorCode as E

from broker.coordinator.placement import TXN_TOPIC
from broker.coordinator.runtime import CoordinatorError, CoordinatorRuntime
from broker.coordinator.txn.records import STATE_NAMES
from broker.coordinator.txn.state_machine import Txn
from broker.protocol.kafka_codec import RequestHeader

API_DESCRIBE_TRANSACTIONS, API_LIST_TRANSACTIONS = 65, 66
ADMIN_RANGES: dict[int, tuple[int, int]] = {
    API_DESCRIBE_TRANSACTIONS: (0, 0),
    API_LIST_TRANSACTIONS: (0, 2),
}
_ZERO = timedelta(0)
_KNOWN_STATES = frozenset(STATE_NAMES.values())


def select(
    txns: Iterable[Txn],
    now_ms: int,
    states: Iterable[str] = (),
    producer_ids: Iterable[int] = (),
    running_longer_than_ms: int = -1,
    id_pattern: str | None = None,
) -> tuple[list[Txn], list[str]]:
    """The transactions a ListTransactions request asks for, by transactional id, and the
    state filters this coordinator does not know. Raises ``re.error`` on a bad pattern."""
    wanted_states = set(states)
    unknown = sorted(wanted_states - _KNOWN_STATES)
    pids = set(producer_ids)
    pattern = re.compile(id_pattern) if id_pattern else None
    out = []
    for t in txns:
        if wanted_states and t.state_name not in wanted_states:
            continue
        if pids and t.producer_id not in pids:
            continue
        if running_longer_than_ms >= 0 and (
            t.start_ms < 0 or now_ms - t.start_ms <= running_longer_than_ms
        ):
            continue
        if pattern is not None and not pattern.fullmatch(t.transactional_id):
            continue
        out.append(t)
    return sorted(out, key=lambda t: t.transactional_id), unknown


def described(txn: Txn) -> dict[str, Any]:
    """One DescribeTransactions entry for a known transaction."""
    topics: dict[str, list[int]] = {}
    for topic, partition in sorted(txn.partitions):
        topics.setdefault(topic, []).append(partition)
    return {
        "error_code": E.none,
        "transactional_id": txn.transactional_id,
        "transaction_state": txn.state_name,
        "transaction_timeout": timedelta(milliseconds=txn.timeout_ms),
        "transaction_start_time": datetime.fromtimestamp(txn.start_ms / 1000, UTC),
        "producer_id": txn.producer_id,
        "producer_epoch": txn.producer_epoch,
        "topics": [{"topic": t, "partitions": ps} for t, ps in topics.items()],
    }


def not_described(tid: str, code: E) -> dict[str, Any]:
    """A DescribeTransactions entry carrying only an error."""
    return {
        "error_code": code,
        "transactional_id": tid,
        "transaction_state": "",
        "transaction_timeout": _ZERO,
        "transaction_start_time": datetime.fromtimestamp(0, UTC),  # Kafka's default: 0
        "producer_id": -1,
        "producer_epoch": -1,
        "topics": [],
    }


class TxnAdminApis:
    """The two read-only transaction APIs; ``partition(tid)`` raises CoordinatorError when
    ``__transaction_state`` does not exist yet."""

    def __init__(self, runtime: CoordinatorRuntime, partition: Callable[[str], int]) -> None:
        self.runtime = runtime
        self.partition = partition

    def handlers(
        self,
    ) -> dict[int, Callable[[RequestHeader, Any], Awaitable[dict[str, Any]]]]:
        return {
            API_DESCRIBE_TRANSACTIONS: self._describe,
            API_LIST_TRANSACTIONS: self._list,
        }

    async def _describe(self, header: RequestHeader, req: Any) -> dict[str, Any]:
        states = []
        for tid in req.transactional_ids:
            try:
                txn = self.runtime.shard(self.partition(tid)).describe(tid)
            except CoordinatorError as e:
                states.append(not_described(tid, e.code))
                continue
            if txn is None:
                states.append(not_described(tid, E.transactional_id_not_found))
            else:
                states.append(described(txn))
        return {"throttle_time": _ZERO, "transaction_states": states}

    async def _list(self, header: RequestHeader, req: Any) -> dict[str, Any]:
        out: dict[str, Any] = {
            "throttle_time": _ZERO,
            "error_code": E.none,
            "unknown_state_filters": [],
            "transaction_states": [],
        }
        if any(self.runtime.status(p) == E.coordinator_load_in_progress for p in self._served()):
            return dict(out, error_code=E.coordinator_load_in_progress)
        txns = [t for shard in self.runtime.loaded_shards() for t in shard.txns.values()]
        try:
            chosen, unknown = select(
                txns,
                self.runtime.now_ms(),
                req.state_filters,
                req.producer_id_filters,
                int(getattr(req, "duration_filter", -1)),
                getattr(req, "transactional_id_pattern", None),
            )
        except re.error:
            return dict(out, error_code=E.invalid_regular_expression)
        return dict(
            out,
            unknown_state_filters=unknown,
            transaction_states=[
                {
                    "transactional_id": t.transactional_id,
                    "producer_id": t.producer_id,
                    "transaction_state": t.state_name,
                }
                for t in chosen
            ],
        )

    def _served(self) -> list[int]:
        """The ``__transaction_state`` partitions this broker leads (loaded or loading)."""
        assert self.runtime.topic == TXN_TOPIC
        return list(self.runtime.slots)
