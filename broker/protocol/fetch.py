"""Fetch (v4–12), ListOffsets (v1–7) and OffsetForLeaderEpoch (v2–4), served by partition leaders.

**Fetch** — consumers (``replica_id`` < 0) read whole batches below the high watermark;
followers (``replica_id`` = their broker id) read up to the log end, and their fetch offset is
their log end offset: the leader records it (:meth:`Partition.on_follower_fetch`), which may
advance the high watermark or make the follower eligible to rejoin the ISR (an AlterPartition
is then proposed). Per partition errors: ``UNKNOWN_TOPIC_OR_PARTITION``,
``NOT_LEADER_OR_FOLLOWER``, ``KAFKA_STORAGE_ERROR`` (its log dir is offline here), ``FENCED_LEADER_EPOCH`` / ``UNKNOWN_LEADER_EPOCH`` (the request's
current leader epoch is older / newer than ours), ``OFFSET_OUT_OF_RANGE`` (outside [log start,
log end]). With fewer than ``min_bytes`` ready and no error, the fetch waits (DelayedFetch) up
to ``max_wait_ms``, woken by appends and high-watermark moves on its partitions (registered
before the request's handler returns, so no append is missed). Fetch v7+ may use incremental
fetch sessions (KIP-227, :mod:`broker.protocol.fetch_session`): an incremental fetch reads every
partition of its session and answers only those with something new.

**ListOffsets** — earliest (-2), latest (-1: the high watermark), max timestamp (-3), or the
first batch with a timestamp at or after the one given (batch granularity).

**OffsetForLeaderEpoch** — (largest epoch <= the requested one, its end offset) from the
leader-epoch cache, so a follower can truncate exactly where it diverged.
"""

from __future__ import annotations

import time

import trio
from kio.schema.errors import ErrorCode

from broker.protocol.data_codec import (
    API_LIST_OFFSETS,
    API_OFFSET_FOR_LEADER_EPOCH,
    FLEXIBLE_FROM,
    FetchPartition,
    FetchPartitionResult,
    FetchRequest,
    frame_raw_response,
    read_fetch,
    read_list_offsets,
    read_offset_for_leader_epoch,
    write_fetch_response,
    write_list_offsets_response,
    write_offset_for_leader_epoch_response,
)
from broker.protocol.fetch_session import (
    FetchContext,
    FetchSessionCache,
)
from broker.protocol.kafka_codec import API_FETCH, Deferred, Reader, RequestHeader
from broker.replica.log_dirs import KafkaStorageError
from broker.replica.partition import Partition
from broker.replica.partition_log import CorruptRecordError
from broker.replica.replica_manager import ReplicaManager

EARLIEST, LATEST, MAX_TIMESTAMP = -2, -1, -3
READ_COMMITTED = 1  # isolation.level: 0 read_uncommitted, 1 read_committed


class FetchHandler:
    """Answers the read-side data-plane APIs from a :class:`ReplicaManager`."""

    def __init__(self, replicas: ReplicaManager, sessions: FetchSessionCache | None = None) -> None:
        self.replicas = replicas
        self.sessions = sessions if sessions is not None else FetchSessionCache()

    # ---- lookups -------------------------------------------------------------------------------
    def _leader(self, topic: str, pid: int, current_epoch: int) -> tuple[Partition | None, int]:
        """The partition if we lead it and the caller's epoch matches; else (None, error code)."""
        part = self.replicas.get_by_name(topic, pid)
        if part is None:
            if self.replicas.is_offline(topic, pid):
                return None, ErrorCode.kafka_storage_error.value
            known = self.replicas.has_partition(topic, pid)
            return None, (
                ErrorCode.not_leader_or_follower if known else ErrorCode.unknown_topic_or_partition
            ).value
        if current_epoch >= 0 and current_epoch < part.leader_epoch:
            return None, ErrorCode.fenced_leader_epoch.value
        if current_epoch > part.leader_epoch:
            return None, ErrorCode.unknown_leader_epoch.value
        if not part.is_leader:
            return None, ErrorCode.not_leader_or_follower.value
        return part, 0

    # ---- Fetch ---------------------------------------------------------------------------------
    async def fetch(self, header: RequestHeader, reader: Reader) -> bytes | Deferred:
        req = read_fetch(header.api_version, reader)
        ctx = self.sessions.context(req, time.monotonic() * 1000)
        if ctx.error:
            return self._respond(header, ctx, [])
        results, size, errors, parts = self._read(req, ctx.topics)
        if errors or size >= max(1, req.min_bytes) or req.max_wait_ms <= 0 or not parts:
            return self._respond(header, ctx, results)
        deadline = trio.current_time() + req.max_wait_ms / 1000
        # Registered now, in the same step as the read above: the response task runs the
        # delayed fetch later, and an append in between must still wake it (else it sleeps
        # the whole max_wait_ms with data ready, and acks=all waits with it).
        # A follower waits for bytes only: high-watermark moves do not wake it.
        follower = req.replica_id >= 0
        event = trio.Event()
        for p in parts:
            (p.data_waiters if follower else p.waiters).add(event)

        async def delayed() -> bytes:
            nonlocal results, event
            try:
                while True:
                    with trio.move_on_at(deadline):
                        await event.wait()
                    for p in parts:
                        (p.data_waiters if follower else p.waiters).discard(event)
                    results, size, errors, _ = self._read(req, ctx.topics)
                    now = trio.current_time()
                    if errors or size >= max(1, req.min_bytes) or now >= deadline:
                        return self._respond(header, ctx, results)
                    event = trio.Event()
                    for p in parts:
                        (p.data_waiters if follower else p.waiters).add(event)
            finally:
                for p in parts:
                    (p.data_waiters if follower else p.waiters).discard(event)

        return Deferred(delayed)

    def _read(
        self, req: FetchRequest, topics: list[tuple[str, list[FetchPartition]]]
    ) -> tuple[list[tuple[str, list[FetchPartitionResult]]], int, bool, list[Partition]]:
        """One pass over ``topics`` (the request's, or its session's): (results per topic,
        bytes read, any error, partitions)."""
        follower = req.replica_id >= 0
        now_ms = time.monotonic() * 1000
        budget = req.max_bytes if req.max_bytes > 0 else 1 << 30
        parts: list[Partition]
        size, errors, parts = 0, False, []
        results: list[tuple[str, list[FetchPartitionResult]]] = []
        for name, fparts in topics:
            out: list[FetchPartitionResult] = []
            for fp in fparts:
                res, part = self._read_partition(
                    name,
                    fp,
                    follower,
                    req.replica_id,
                    now_ms,
                    budget - size if size else budget,
                    req.isolation_level,
                )
                out.append(res)
                if res.error_code:
                    errors = True
                else:
                    assert part is not None  # a result without an error comes with its partition
                    parts.append(part)
                    size += len(res.records or b"")
            results.append((name, out))
        return results, size, errors, parts

    def _read_partition(
        self,
        topic: str,
        fp: FetchPartition,
        follower: bool,
        replica_id: int,
        now_ms: float,
        budget: int,
        isolation: int = 0,
    ) -> tuple[FetchPartitionResult, Partition | None]:
        part, err = self._leader(topic, fp.partition, fp.current_leader_epoch)
        if part is None:
            return FetchPartitionResult(fp.partition, err), None
        plog = part.log
        if not plog.log_start_offset <= fp.fetch_offset <= plog.log_end_offset:
            return FetchPartitionResult(
                fp.partition,
                ErrorCode.offset_out_of_range.value,
                plog.high_watermark,
                plog.high_watermark,
                plog.log_start_offset,
            ), None
        if follower and part.on_follower_fetch(replica_id, fp.fetch_offset, now_ms):
            self.replicas.propose_isr(
                part, part.isr + (replica_id,), f"isr-expand: replica {replica_id} caught up"
            )
        lso = plog.last_stable_offset
        read_committed = not follower and isolation == READ_COMMITTED
        limit = plog.log_end_offset if follower else lso if read_committed else plog.high_watermark
        records = b""
        if fp.fetch_offset < limit and budget > 0:
            try:
                records = plog.read(
                    fp.fetch_offset, min(max(1, fp.max_bytes), budget), max_offset=limit
                )
            except OSError as e:  # the log dir failed under a read (EIO)
                try:
                    part.storage_error("partition log read", e)
                except KafkaStorageError:
                    return FetchPartitionResult(
                        fp.partition, ErrorCode.kafka_storage_error.value
                    ), None
            except CorruptRecordError:  # damage below the recovery point (logged by the log)
                return FetchPartitionResult(fp.partition, ErrorCode.corrupt_message.value), None
        aborted = None
        if read_committed and records:
            found = plog.aborted_transactions(fp.fetch_offset, limit)
            aborted = [(a.producer_id, a.first_offset) for a in found] or None
        hw = plog.high_watermark
        return FetchPartitionResult(
            fp.partition, 0, hw, lso, plog.log_start_offset, records, aborted
        ), part

    @staticmethod
    def _respond(
        header: RequestHeader,
        ctx: FetchContext,
        results: list[tuple[str, list[FetchPartitionResult]]],
    ) -> bytes:
        error, session_id, out = ctx.respond(results, time.monotonic() * 1000)
        body = write_fetch_response(header.api_version, error, out, session_id)
        return frame_raw_response(
            header.correlation_id, body, header.api_version >= FLEXIBLE_FROM[API_FETCH]
        )

    # ---- ListOffsets ---------------------------------------------------------------------------
    async def list_offsets(self, header: RequestHeader, reader: Reader) -> bytes:
        req = read_list_offsets(header.api_version, reader)
        results = []
        for name, parts in req.topics:
            out = []
            for pid, current_epoch, ts in parts:
                part, err = self._leader(name, pid, current_epoch)
                if part is None:
                    out.append((pid, err, -1, -1, -1))
                    continue
                plog = part.log
                limit = plog.log_end_offset if req.replica_id >= 0 else plog.high_watermark
                if req.replica_id < 0 and req.isolation_level == READ_COMMITTED:
                    limit = plog.last_stable_offset
                if ts == EARLIEST:
                    found = (-1, plog.log_start_offset)
                elif ts == LATEST:
                    found = (-1, limit)
                elif ts == MAX_TIMESTAMP:
                    found = plog.max_timestamp_offset(limit) or (-1, -1)
                else:
                    found = plog.offset_for_timestamp(ts, limit) or (-1, -1)
                ts_out, offset = found
                epoch = plog.epoch_for_offset(offset) if offset >= 0 else -1
                if ts == LATEST:
                    epoch = plog.latest_epoch
                out.append((pid, 0, ts_out, offset, epoch))
            results.append((name, out))
        body = write_list_offsets_response(header.api_version, results)
        return frame_raw_response(
            header.correlation_id, body, header.api_version >= FLEXIBLE_FROM[API_LIST_OFFSETS]
        )

    # ---- OffsetForLeaderEpoch ------------------------------------------------------------------
    async def offset_for_leader_epoch(self, header: RequestHeader, reader: Reader) -> bytes:
        req = read_offset_for_leader_epoch(header.api_version, reader)
        results = []
        for name, parts in req.topics:
            out = []
            for pid, current_epoch, epoch in parts:
                part, err = self._leader(name, pid, current_epoch)
                if part is None:
                    out.append((pid, err, -1, -1))
                else:
                    out.append((pid, 0, *part.log.end_offset_for_epoch(epoch)))
            results.append((name, out))
        body = write_offset_for_leader_epoch_response(header.api_version, results)
        return frame_raw_response(
            header.correlation_id,
            body,
            header.api_version >= FLEXIBLE_FROM[API_OFFSET_FOR_LEADER_EPOCH],
        )
