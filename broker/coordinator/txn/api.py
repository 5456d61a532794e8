"""The transaction APIs on the broker listener: InitProducerId (22), AddPartitionsToTxn (24),
AddOffsetsToTxn (25), EndTxn (26) on the transaction coordinator, TxnOffsetCommit (28) on the
group coordinator, WriteTxnMarkers (27) on partition leaders, and DescribeTransactions (65) and
ListTransactions (66) from :mod:`broker.coordinator.txn.admin_api`.

A transactional id is routed to its ``__transaction_state`` partition; a broker that does not
lead it answers ``NOT_COORDINATOR``, one still loading it ``COORDINATOR_LOAD_IN_PROGRESS``, no
such topic yet ``COORDINATOR_NOT_AVAILABLE`` (FindCoordinator creates it). InitProducerId
without a transactional id is the idempotent path (a fresh producer id, epoch 0). A producer id
is asked of the controller only when the transactional id needs one (first use, or its epoch is
exhausted). AddPartitionsToTxn refuses partitions the metadata does not know
(``UNKNOWN_TOPIC_OR_PARTITION``, the others ``OPERATION_NOT_ATTEMPTED``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import trio
from kio.schema.errors import ErrorCode as E

from broker.coordinator.group.state_machine import CommitPartition
from broker.coordinator.placement import OFFSETS_TOPIC, TXN_TOPIC, partition_for
from broker.coordinator.producer_id_manager import ProducerIdManager
from broker.coordinator.runtime import CoordinatorError, CoordinatorRuntime
from broker.coordinator.txn.admin_api import ADMIN_RANGES, TxnAdminApis
from broker.coordinator.txn.records import ONGOING
from broker.coordinator.txn.service import TxnCoordinator
from broker.metadata.metadata_cache import MetadataCache
from broker.protocol.admin_decode import decode_request
from broker.protocol.kafka_admin import build_entity
from broker.protocol.kafka_codec import (
    DecodeError,
    Reader,
    RequestHeader,
    encode_body,
    frame_response,
    response_class,
)
from broker.protocol.write_txn_markers import (
    API_WRITE_TXN_MARKERS,
    WRITE_TXN_MARKERS_VERSIONS,
    WriteTxnMarkersHandler,
)
from kraft.errors import KraftError

log = logging.getLogger(__name__)

API_INIT_PRODUCER_ID, API_ADD_PARTITIONS_TO_TXN, API_ADD_OFFSETS_TO_TXN = 22, 24, 25
API_END_TXN, API_TXN_OFFSET_COMMIT = 26, 28
RANGES: dict[int, tuple[int, int]] = {
    API_INIT_PRODUCER_ID: (0, 5),
    API_ADD_PARTITIONS_TO_TXN: (0, 3),
    API_ADD_OFFSETS_TO_TXN: (0, 3),
    API_END_TXN: (0, 3),
    API_WRITE_TXN_MARKERS: WRITE_TXN_MARKERS_VERSIONS,
    API_TXN_OFFSET_COMMIT: (0, 3),
    **ADMIN_RANGES,  # DescribeTransactions, ListTransactions
}
_ZERO = timedelta(0)
HOLD_S = 5.0  # a request meeting a transaction that writes its markers waits this long at most


def _begins(shard: Any, tid: str) -> bool:
    """Whether a successful AddPartitionsToTxn / AddOffsetsToTxn for ``tid`` now begins a
    transaction (none is open), for the metrics."""
    t = shard.describe(tid)
    return t is not None and t.state != ONGOING


def _ms(value: Any) -> int:
    return int(value.total_seconds() * 1000) if isinstance(value, timedelta) else int(value)


class TxnApis:
    """Listener handler for the transaction APIs (one per listener: its own metadata cache)."""

    def __init__(
        self,
        cache: MetadataCache,
        txn: TxnCoordinator,
        groups: CoordinatorRuntime,
        ids: ProducerIdManager,
    ) -> None:
        self.cache = cache
        self.txn = txn
        self.runtime = txn.runtime
        self.groups = groups
        self.ids = ids
        self.markers = WriteTxnMarkersHandler(txn.markers)
        self._apis: dict[int, Callable[[RequestHeader, Any], Awaitable[dict[str, Any]]]] = {
            API_INIT_PRODUCER_ID: self._init_producer_id,
            API_ADD_PARTITIONS_TO_TXN: self._add_partitions,
            API_ADD_OFFSETS_TO_TXN: self._add_offsets,
            API_END_TXN: self._end_txn,
            API_TXN_OFFSET_COMMIT: self._txn_offset_commit,
        }
        self._apis.update(
            TxnAdminApis(self.runtime, lambda tid: self._partition_of(TXN_TOPIC, tid)).handlers()
        )

    def api_ranges(self) -> dict[int, tuple[int, int]]:
        return dict(RANGES)

    async def handle(self, header: RequestHeader, reader: Reader) -> bytes:
        if header.api_key == API_WRITE_TXN_MARKERS:
            return await self.markers.write_txn_markers(header, reader)
        req = decode_request(header, reader)
        try:
            values = await self._apis[header.api_key](header, req)
        except Exception as e:  # a bug here closes one connection, never the broker
            log.exception("transaction API %d v%d failed", header.api_key, header.api_version)
            raise DecodeError(f"internal error: {e}") from None
        cls = response_class(header.api_key, header.api_version)
        return frame_response(cls, header.correlation_id, encode_body(build_entity(cls, values)))

    # ---- routing -----------------------------------------------------------------------------
    def _partition_of(self, topic: str, key: str) -> int:
        image = self.cache.image
        tid = image.topics_by_name.get(topic) if image is not None else None
        if tid is None:
            raise CoordinatorError(E.coordinator_not_available)
        return partition_for(key, len(image.topics_by_id[tid].partitions))

    def _known(self, topic: str, partition: int) -> bool:
        image = self.cache.image
        tid = image.topics_by_name.get(topic) if image is not None else None
        return tid is not None and partition in image.topics_by_id[tid].partitions

    async def _txn_write(self, tid: str, fn: Callable[[Any, Any, int], Any]) -> Any:
        response = await self.runtime.write(self._partition_of(TXN_TOPIC, tid), fn)
        self.txn.poke()
        return response

    async def _held(self, tid: str, attempt: Callable[[], Awaitable[E]]) -> E:
        """Run ``attempt`` (one request on ``tid``'s coordinator shard, its error code); while it
        meets the previous transaction in PrepareCommit / PrepareAbort
        (``CONCURRENT_TRANSACTIONS``), wait for that one's markers and run it again, for
        ``HOLD_S`` at most: EndTxn answers before the markers, and holding the client's next
        request spares it a retry with backoff. The bound expired, the client gets the error.
        """
        deadline = trio.current_time() + HOLD_S
        while True:
            code = await attempt()
            left = deadline - trio.current_time()
            if code != E.concurrent_transactions or left <= 0:
                return code
            await self.txn.wait_completed(self._partition_of(TXN_TOPIC, tid), tid, left)

    # ---- APIs --------------------------------------------------------------------------------
    async def _init_producer_id(self, header: RequestHeader, req: Any) -> dict[str, Any]:
        out: dict[str, Any] = {"throttle_time": _ZERO, "producer_id": -1, "producer_epoch": -1}
        tid = req.transactional_id
        try:
            if tid is None:
                return dict(
                    out, error_code=E.none, producer_id=await self.ids.next_id(), producer_epoch=0
                )
            part = self._partition_of(TXN_TOPIC, tid)
            timeout = _ms(req.transaction_timeout)
            req_pid = int(getattr(req, "producer_id", -1))
            req_epoch = int(getattr(req, "producer_epoch", -1))
            resp: dict[str, Any] = {}

            async def attempt() -> E:
                nonlocal resp
                new_pid = None
                if self.runtime.shard(part).needs_new_producer_id(tid):
                    new_pid = await self.ids.next_id()
                resp = await self._txn_write(
                    tid,
                    lambda s, t, now: s.init_producer_id(
                        tid, timeout, req_pid, req_epoch, new_pid, t, now
                    ),
                )
                return E(resp["error_code"])

            await self._held(tid, attempt)
        except CoordinatorError as e:
            return dict(out, error_code=e.code)
        except KraftError as e:
            log.warning("InitProducerId for %r: no producer id: %s", tid, e)
            return dict(out, error_code=E.coordinator_not_available)
        code = resp["error_code"]
        if code == E.producer_fenced and header.api_version < 4:
            code = E.invalid_producer_epoch  # PRODUCER_FENCED is new in v4 (KIP-588)
        return dict(out, **dict(resp, error_code=code))

    async def _add_partitions(self, header: RequestHeader, req: Any) -> dict[str, Any]:
        tid = req.v3_and_below_transactional_id
        pid, epoch = int(req.v3_and_below_producer_id), int(req.v3_and_below_producer_epoch)
        asked = [(t.name, int(p)) for t in req.v3_and_below_topics for p in t.partitions]
        unknown = {tp for tp in asked if not self._known(*tp)}
        codes: dict[tuple[str, int], E] = {}
        if unknown:
            codes = {
                tp: E.unknown_topic_or_partition if tp in unknown else E.operation_not_attempted
                for tp in asked
            }
        else:
            code = E.none
            began = False

            def fn(s: Any, t: Any, now: int) -> Any:
                nonlocal code, began
                began = _begins(s, tid)
                result, code = s.add_partitions(tid, pid, epoch, asked, t, now)
                began = began and code == E.none
                return result

            async def attempt() -> E:
                await self._txn_write(tid, fn)
                return code

            try:
                await self._held(tid, attempt)
                self.txn.started += began
            except CoordinatorError as e:
                code = e.code
            if code == E.producer_fenced and header.api_version < 2:
                code = E.invalid_producer_epoch
            codes = dict.fromkeys(asked, code)
        by_topic: dict[str, list[dict[str, Any]]] = {}
        for (topic, p), code in codes.items():
            by_topic.setdefault(topic, []).append(
                {"partition_index": p, "partition_error_code": code}
            )
        return {
            "throttle_time": _ZERO,
            "results_by_topic_v3_and_below": [
                {"name": name, "results_by_partition": rows} for name, rows in by_topic.items()
            ],
        }

    async def _add_offsets(self, header: RequestHeader, req: Any) -> dict[str, Any]:
        tid, pid, epoch = req.transactional_id, int(req.producer_id), int(req.producer_epoch)
        code = E.none
        try:
            offsets_part = self._partition_of(OFFSETS_TOPIC, req.group_id)
            began = False

            def fn(s: Any, t: Any, now: int) -> Any:
                nonlocal code, began
                began = _begins(s, tid)
                result, code = s.add_partitions(
                    tid, pid, epoch, [(OFFSETS_TOPIC, offsets_part)], t, now
                )
                began = began and code == E.none
                return result

            async def attempt() -> E:
                await self._txn_write(tid, fn)
                return code

            await self._held(tid, attempt)
            self.txn.started += began
        except CoordinatorError as e:
            code = e.code
        if code == E.producer_fenced and header.api_version < 2:
            code = E.invalid_producer_epoch
        return {"throttle_time": _ZERO, "error_code": code}

    async def _end_txn(self, header: RequestHeader, req: Any) -> dict[str, Any]:
        tid, pid, epoch = req.transactional_id, int(req.producer_id), int(req.producer_epoch)
        commit = bool(req.committed)
        code = E.none

        def fn(s: Any, t: Any, now: int) -> Any:
            nonlocal code
            result, code = s.end_txn(tid, pid, epoch, commit, t, now)
            return result

        async def attempt() -> E:
            await self._txn_write(tid, fn)
            return code

        try:  # answered once the Prepare record is replicated; the markers follow (service.py)
            await self._held(tid, attempt)
        except CoordinatorError as e:
            code = e.code
        if code == E.producer_fenced and header.api_version < 2:
            code = E.invalid_producer_epoch
        return {"throttle_time": _ZERO, "error_code": code}

    async def _txn_offset_commit(self, header: RequestHeader, req: Any) -> dict[str, Any]:
        parts = [
            CommitPartition(
                t.name,
                int(p.partition_index),
                int(p.committed_offset),
                int(getattr(p, "committed_leader_epoch", -1)),
                p.committed_metadata,
            )
            for t in req.topics
            for p in t.partitions
        ]
        errors: list[E] = []

        def fn(shard: Any, token: Any, now: int) -> Any:
            nonlocal errors
            result, errors = shard.txn_commit(
                req.group_id, int(req.producer_id), int(req.producer_epoch), parts, now
            )
            return result.answer(token, {})

        try:  # answered once the records are replicated (acks=all), like OffsetCommit
            await self.groups.write(self._partition_of(OFFSETS_TOPIC, req.group_id), fn)
        except CoordinatorError as e:
            errors = [e.code] * len(parts)
        codes = {(p.topic, p.partition): code for p, code in zip(parts, errors)}
        return {
            "throttle_time": _ZERO,
            "topics": [
                {
                    "name": t.name,
                    "partitions": [
                        {
                            "partition_index": p.partition_index,
                            "error_code": codes[(t.name, int(p.partition_index))],
                        }
                        for p in t.partitions
                    ],
                }
                for t in req.topics
            ],
        }
