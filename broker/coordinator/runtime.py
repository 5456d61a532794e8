"""The coordinator runtime: runs a pure shard state machine over each partition of an internal
topic that this broker leads, the way Kafka 4's CoordinatorRuntime does.

* **Placement.** On every metadata publish (after the replica manager), partitions of ``topic``
  that this broker now leads (or leads in a new leader epoch) are *loaded*: their records are
  read from the log start to the log end and replayed into a fresh shard, while requests get
  ``COORDINATOR_LOAD_IN_PROGRESS``. Partitions it no longer leads are *unloaded*: the shard is
  dropped, its waiting requests are answered ``NOT_COORDINATOR``.
* **Writes.** :meth:`CoordinatorRuntime.write` runs ``fn(shard, token, now_ms)`` (pure, returns
  records plus completed responses) at once, in arrival order, and queues its records. The
  first writer of a partition yields once, so every write that arrives in the same scheduler
  round joins the queue, then appends the whole queue as one batch (group commit). Responses
  are released only once the high watermark covers their batch (acks=all): the partition calls
  back when its high watermark moves, so the follower fetch that moves it also releases the
  responses, with no extra task hop. The leader epoch changing first fails them with
  ``NOT_COORDINATOR``.
* **Timers.** ``shard.tick(now)`` runs at ``shard.next_deadline()`` and after a write to that
  shard (only that shard: the deadline of each shard is cached); ``shard.expire_offsets`` every
  ``offsets.retention.check.interval.ms``.

Nothing here is specific to groups: a shard needs ``replay``, ``on_loaded``, ``tick``,
``next_deadline``, ``pending_tokens`` and ``expire_offsets``, and the runtime is given the codec of
its records, so a transaction coordinator can run on ``__transaction_state`` with it. A result
with a ``producer`` (id, epoch) is appended as its own transactional batch; on load, records of
transactional batches go to ``shard.replay_txn(producer_id, record)`` and transaction markers
to ``shard.replay_marker(producer_id, commit)`` (shards without them ignore both).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import struct
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import trio
from kio.schema.errors import ErrorCode

from broker.coordinator.rate_meter import RateMeter
from broker.coordinator.record_batch import encode_batch, last_offset, read_entries, scan_plain
from broker.replica.log_dirs import KafkaStorageError
from broker.replica.partition import Partition
from broker.replica.partition_log import CorruptRecordError
from broker.replica.replica_manager import ReplicaManager

log = logging.getLogger(__name__)
LOAD_CHUNK_BYTES = 1 << 20
COMMIT_TIMEOUT_S = 30.0
BATCH_MAX_BYTES = 512 << 10  # queued records beyond this go into a further batch


class CoordinatorError(Exception):
    """The request cannot be served by this coordinator (the code says why)."""

    def __init__(self, code: ErrorCode, message: str = "") -> None:
        super().__init__(message or code.name)
        self.code = code


class Shard(Protocol):
    def replay(self, record: Any) -> None: ...
    def on_loaded(self, now: int) -> None: ...
    def tick(self, now: int) -> Any: ...
    def next_deadline(self) -> int | None: ...
    def pending_tokens(self) -> list[Any]: ...
    def expire_offsets(self, now: int) -> Any: ...


class Token:
    """A request waiting for its response (set once, by a completion or a failure)."""

    __slots__ = ("done", "error", "response")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.response: Any = None
        self.error: ErrorCode | None = None

    def complete(self, response: Any) -> None:
        if not self.done.is_set():
            self.response = response
            self.done.set()

    def fail(self, code: ErrorCode) -> None:
        if not self.done.is_set():
            self.error = code
            self.done.set()


@dataclass
class _Slot:
    partition: int
    leader_epoch: int
    shard: Any
    loading: bool = True
    # its log failed a CRC check while loading: never served (COORDINATOR_NOT_AVAILABLE)
    damaged: bool = False
    # (offset after the batch, the responses it releases), oldest first
    uncommitted: deque[tuple[int, list[tuple[Token, Any]]]] = field(default_factory=deque)
    queued: list[tuple[bytes, bytes | None]] = field(default_factory=list)  # not appended yet
    queued_bytes: int = 0
    queued_completions: list[tuple[Token, Any]] = field(default_factory=list)
    flush_pending: bool = False  # a writer will append the queue after yielding once
    dirty: bool = True  # written since its deadline was computed: tick and recompute
    deadline: int | None = None
    listener: Callable[[], None] | None = None  # registered on the partition's HW moves


class CoordinatorRuntime:
    """Shards of ``topic`` for the partitions this broker leads."""

    def __init__(
        self,
        replicas: ReplicaManager,
        topic: str,
        new_shard: Callable[[], Any],
        encode: Callable[[Any], tuple[bytes, bytes | None]],
        decode: Callable[[bytes, bytes | None], Any],
        *,
        clock: Callable[[], float] = time.time,
        expiry_interval_ms: int = 600_000,
    ) -> None:
        self.replicas = replicas
        self.topic = topic
        self.new_shard = new_shard
        self.encode = encode
        self.decode = decode
        self.clock = clock
        self.expiry_interval_ms = expiry_interval_ms
        self.slots: dict[int, _Slot] = {}
        self._wakeup = trio.Event()
        self._loads: list[_Slot] = []
        self.loads_done = 0
        self.last_load_seconds = 0.0
        self.max_load_seconds = 0.0
        # writes, records_appended, batches_appended
        self.counters: Counter[str] = Counter()
        # (trio deadline, seq, token) of the writes waiting for their response
        self._timeouts: list[tuple[float, int, Token]] = []
        self._timeout_seq = itertools.count()
        self._wake_by = -math.inf  # trio time the run task sleeps until (-inf: awake)
        self.meters: dict[str, RateMeter] = {}  # what the APIs count (offset-commit, ...)

    def meter(self, name: str) -> RateMeter:
        """The count-and-rate meter ``name`` (created on first use)."""
        m = self.meters.get(name)
        if m is None:
            m = self.meters[name] = RateMeter()
        return m

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    # ---- placement ------------------------------------------------------------------------------
    def publish(self, delta: Any, image: Any, full: bool = False) -> None:
        """Metadata publisher hook: load newly led partitions, unload lost ones."""
        led: dict[int, Partition] = {}
        for (name, pid), part in self.replicas.by_name.items():
            if name == self.topic and part.is_leader:
                led[pid] = part
        for pid, slot in list(self.slots.items()):
            now_led = led.get(pid)
            if now_led is None or now_led.leader_epoch != slot.leader_epoch:
                why = "no longer the leader" if now_led is None else "new leader epoch"
                self._unload(slot, why)
        for pid, part in led.items():
            if pid not in self.slots:
                slot = _Slot(pid, part.leader_epoch, self.new_shard())
                self.slots[pid] = slot
                self._loads.append(slot)
                log.info(
                    "coordinator %s-%d: loading (leader epoch %d, log end %d)",
                    self.topic,
                    pid,
                    part.leader_epoch,
                    part.log.log_end_offset,
                )
        self._wakeup.set()

    def _unload(self, slot: _Slot, why: str) -> None:
        if self.slots.get(slot.partition) is slot:
            del self.slots[slot.partition]
        self._unlisten(slot)
        for token in slot.shard.pending_tokens():
            token.fail(ErrorCode.not_coordinator)
        for _, completions in slot.uncommitted:
            for token, _ in completions:
                token.fail(ErrorCode.not_coordinator)
        for token, _ in slot.queued_completions:
            token.fail(ErrorCode.not_coordinator)
        slot.uncommitted.clear()
        slot.queued.clear()
        slot.queued_completions.clear()
        log.info("coordinator %s-%d: unloaded (%s)", self.topic, slot.partition, why)

    def status(self, pid: int) -> ErrorCode:
        """NONE if this broker serves partition ``pid`` now, else the error to answer."""
        slot = self.slots.get(pid)
        if slot is None:
            return ErrorCode.not_coordinator
        if slot.damaged:
            return ErrorCode.coordinator_not_available
        return ErrorCode.coordinator_load_in_progress if slot.loading else ErrorCode.none

    def shard(self, pid: int) -> Any:
        """The loaded shard of ``pid`` (raises :class:`CoordinatorError` otherwise)."""
        code = self.status(pid)
        if code != ErrorCode.none:
            raise CoordinatorError(code)
        return self.slots[pid].shard

    def loaded_shards(self) -> list[Any]:
        return [s.shard for s in self.slots.values() if not s.loading]

    # ---- writes ---------------------------------------------------------------------------------
    async def write(
        self, pid: int, fn: Callable[[Any, Token, int], Any], timeout_s: float = COMMIT_TIMEOUT_S
    ) -> Any:
        """Run ``fn(shard, token, now)`` and wait for the response to ``token``; after
        ``timeout_s`` the run task (:meth:`run`) fails it with ``REQUEST_TIMED_OUT``."""
        slot_shard = self.shard(pid)
        slot = self.slots[pid]
        token = Token()
        self.counters["writes"] += 1
        queued = self._apply(slot, fn(slot_shard, token, self.now_ms()))
        self._touch(slot)
        if queued and not slot.flush_pending:
            # Group commit: let the writes already runnable in this scheduler round queue
            # their records too, then append them all as one batch.
            slot.flush_pending = True
            try:
                await trio.lowlevel.cancel_shielded_checkpoint()
            finally:
                slot.flush_pending = False
                self._flush(slot)
        if not token.done.is_set():
            # The run task fails it at the deadline: a heap entry per write costs far less than
            # a cancel scope per write.
            deadline = trio.current_time() + timeout_s
            heapq.heappush(self._timeouts, (deadline, next(self._timeout_seq), token))
            if deadline < self._wake_by:
                self._wakeup.set()
            await token.done.wait()
        if token.error is not None:
            raise CoordinatorError(token.error)
        return token.response

    async def replicated(self, pid: int, timeout_s: float = COMMIT_TIMEOUT_S) -> None:
        """Wait until every record of partition ``pid`` appended (or loaded) so far is
        replicated: the shard's state as of now is then durable, whoever wrote it."""
        self.shard(pid)
        slot = self.slots[pid]
        self._flush(slot)
        part = self.replicas.get_by_name(self.topic, slot.partition)
        if part is None or not part.is_leader or part.leader_epoch != slot.leader_epoch:
            raise CoordinatorError(ErrorCode.not_coordinator)
        end = part.log.log_end_offset
        if part.high_watermark >= end:
            return
        token = Token()
        self._listen(slot, part)
        slot.uncommitted.append((end, [(token, None)]))  # every entry ends at or before ``end``
        heapq.heappush(
            self._timeouts, (trio.current_time() + timeout_s, next(self._timeout_seq), token)
        )
        self._wakeup.set()
        await token.done.wait()
        if token.error is not None:
            raise CoordinatorError(token.error)

    def _touch(self, slot: _Slot) -> None:
        """A write changed ``slot``'s shard: the timer task ticks it and recomputes its deadline."""
        slot.dirty = True
        self._wakeup.set()

    def _apply(self, slot: _Slot, result: Any) -> bool:
        """Queue ``result``'s records (True) or, with none, complete its responses now."""
        for event in getattr(result, "events", ()):
            log.info("%s-%d: %s", self.topic, slot.partition, event)
        completions = [(t, r) for t, r in result.completions if isinstance(t, Token)]
        if not result.records:
            for token, response in completions:
                token.complete(response)
            return False
        producer = getattr(result, "producer", None)
        if producer is not None:
            self._flush(slot)  # what was queued before goes first
            self._append_txn(slot, [self.encode(r) for r in result.records], producer, completions)
            return False
        for record in result.records:
            key, value = self.encode(record)
            slot.queued.append((key, value))
            slot.queued_bytes += len(key) + (len(value) if value is not None else 0) + 16
        slot.queued_completions.extend(completions)
        return True

    def _flush(self, slot: _Slot) -> None:
        """Append the queued records as leader (batches of up to :data:`BATCH_MAX_BYTES`)."""
        if not slot.queued:
            return
        records, completions = slot.queued, slot.queued_completions
        slot.queued, slot.queued_completions, slot.queued_bytes = [], [], 0
        part = self.replicas.get_by_name(self.topic, slot.partition)
        if (
            self.slots.get(slot.partition) is not slot
            or part is None
            or not part.is_leader
            or part.leader_epoch != slot.leader_epoch
        ):
            for token, _ in completions:
                token.fail(ErrorCode.not_coordinator)
            if self.slots.get(slot.partition) is slot:
                self._unload(slot, "lost leadership before appending")
            return
        self._listen(slot, part)
        now = self.now_ms()
        batch: list[tuple[bytes, bytes | None]] = []
        size = 0
        last = -1
        try:
            for record in records:
                batch.append(record)
                size += len(record[0]) + (len(record[1]) if record[1] is not None else 0) + 16
                if size >= BATCH_MAX_BYTES:
                    last = part.append_as_leader(encode_batch(batch, now)).last_offset
                    self.counters["batches_appended"] += 1
                    batch, size = [], 0
            if batch:
                last = part.append_as_leader(encode_batch(batch, now)).last_offset
                self.counters["batches_appended"] += 1
        except KafkaStorageError:
            self._storage_failed(slot, completions)
            return
        self.counters["records_appended"] += len(records)
        slot.uncommitted.append((last + 1, completions))
        self._release(slot, part)

    def _append_txn(
        self,
        slot: _Slot,
        records: list[tuple[bytes, bytes | None]],
        producer: tuple[int, int],
        completions: list[tuple[Token, Any]],
    ) -> None:
        """Append ``records`` as one transactional batch of ``producer`` (id, epoch)."""
        part = self.replicas.get_by_name(self.topic, slot.partition)
        if part is None or not part.is_leader or part.leader_epoch != slot.leader_epoch:
            for token, _ in completions:
                token.fail(ErrorCode.not_coordinator)
            if self.slots.get(slot.partition) is slot:
                self._unload(slot, "lost leadership before appending")
            return
        self._listen(slot, part)
        try:
            last = part.append_as_coordinator(encode_batch(records, self.now_ms(), producer))
        except KafkaStorageError:
            self._storage_failed(slot, completions)
            return
        self.counters["batches_appended"] += 1
        self.counters["records_appended"] += len(records)
        slot.uncommitted.append((last + 1, completions))
        self._release(slot, part)

    def _storage_failed(self, slot: _Slot, completions: list[tuple[Token, Any]]) -> None:
        """The coordinator partition's log dir went offline: fail what waits, unload it."""
        for token, _ in completions:
            token.fail(ErrorCode.not_coordinator)
        if self.slots.get(slot.partition) is slot:
            self._unload(slot, "its log dir went offline")

    def _listen(self, slot: _Slot, part: Partition) -> None:
        """Release ``slot``'s responses whenever ``part``'s high watermark moves."""
        if slot.listener is not None:
            return

        def on_high_watermark() -> None:
            if self.slots.get(slot.partition) is slot and part.leader_epoch == slot.leader_epoch:
                self._release(slot, part)

        slot.listener = on_high_watermark
        part.hw_listeners.append(on_high_watermark)

    def _unlisten(self, slot: _Slot) -> None:
        if slot.listener is None:
            return
        part = self.replicas.get_by_name(self.topic, slot.partition)
        if part is not None and slot.listener in part.hw_listeners:
            part.hw_listeners.remove(slot.listener)
        slot.listener = None

    def _release(self, slot: _Slot, part: Partition) -> None:
        hw = part.high_watermark
        while slot.uncommitted and slot.uncommitted[0][0] <= hw:
            _, completions = slot.uncommitted.popleft()
            for token, response in completions:
                token.complete(response)

    # ---- the runtime's task ---------------------------------------------------------------------
    async def run(self) -> None:
        """Load partitions, run timers and release committed responses until cancelled."""
        next_expiry = self.now_ms() + self.expiry_interval_ms
        while True:
            while self._loads:
                await self._load(self._loads.pop(0))
            now = self.now_ms()
            expire = now >= next_expiry
            deadlines = []
            for slot in list(self.slots.values()):
                if slot.loading:
                    continue
                due = slot.deadline is not None and slot.deadline <= now
                if slot.dirty or due or expire:
                    slot.dirty = False
                    self._apply(slot, slot.shard.tick(now))
                    if expire:
                        self._apply(slot, slot.shard.expire_offsets(now))
                    self._flush(slot)
                    slot.deadline = slot.shard.next_deadline()
                if slot.deadline is not None:
                    deadlines.append(slot.deadline)
            if expire:
                next_expiry = now + self.expiry_interval_ms
            for slot in list(self.slots.values()):  # a safety net: the listeners release
                part = self.replicas.get_by_name(self.topic, slot.partition)
                if part is not None and part.leader_epoch == slot.leader_epoch and part.is_leader:
                    self._release(slot, part)
            wake_at = min([*deadlines, next_expiry]) / 1000
            delay = max(0.0, min(1.0, wake_at - self.clock()))
            first_timeout = self._expire_writes()
            event = self._wakeup = trio.Event()
            self._wake_by = min(trio.current_time() + delay, first_timeout)
            with trio.move_on_at(self._wake_by):
                await event.wait()
            self._wake_by = -math.inf

    def _expire_writes(self) -> float:
        """Fail the writes past their timeout (``REQUEST_TIMED_OUT``); the next deadline."""
        now = trio.current_time()
        heap = self._timeouts
        while heap and (heap[0][2].done.is_set() or heap[0][0] <= now):
            _, _, token = heapq.heappop(heap)
            token.fail(ErrorCode.request_timed_out)  # no-op once answered
        return heap[0][0] if heap else math.inf

    async def _load(self, slot: _Slot) -> None:
        part = self.replicas.get_by_name(self.topic, slot.partition)
        if part is None or self.slots.get(slot.partition) is not slot:
            return
        started = time.monotonic()
        end = part.log.log_end_offset
        replayer = LogReplayer(slot.shard, self.decode, f"{self.topic}-{slot.partition}")
        try:
            for _ in replayer.chunks(part.log, end):
                await trio.sleep(0)
                if self.slots.get(slot.partition) is not slot:
                    return  # unloaded meanwhile
        except CorruptRecordError as e:
            slot.damaged = True
            log.error(
                "coordinator %s-%d: not loaded, its log is damaged: %s. Requests for it get "
                "COORDINATOR_NOT_AVAILABLE until its leadership moves to another replica",
                self.topic,
                slot.partition,
                e,
            )
            return
        slot.shard.on_loaded(self.now_ms())
        slot.loading = False
        slot.dirty = True
        self.loads_done += 1
        seconds = time.monotonic() - started
        self.last_load_seconds = seconds
        self.max_load_seconds = max(self.max_load_seconds, seconds)
        log.info(
            "coordinator %s-%d: loaded %d records (%d replayed) up to offset %d in %.0f ms",
            self.topic,
            slot.partition,
            replayer.records,
            replayer.replayed,
            end,
            seconds * 1000,
        )


class LogReplayer:
    """Replays a coordinator partition's records into a shard, as a load does. Records outside
    transactions are replayed latest-per-key: a record whose key comes again before the next
    transactional record or marker is skipped (what compaction would leave; every record's
    value is the whole state of its key), so a long uncompacted log costs a parse per record
    but a decode and a replay per key."""

    def __init__(self, shard: Any, decode: Callable[[bytes, bytes | None], Any], name: str) -> None:
        self.shard = shard
        self.decode = decode
        self.name = name
        self.records = 0  # records read
        self.replayed = 0  # records decoded and replayed
        self._pending: dict[bytes, tuple[int, bytes | None]] = {}  # key -> (offset, value)
        self._replay_txn = getattr(shard, "replay_txn", None)
        self._replay_marker = getattr(shard, "replay_marker", None)

    def chunks(self, plog: Any, end: int, chunk_bytes: int = LOAD_CHUNK_BYTES) -> Iterator[int]:
        """Read and replay ``plog`` from its start to ``end``, yielding after each chunk (the
        offset reached); the last pending records are replayed before the end."""
        offset = plog.log_start_offset
        while offset < end:
            data = plog.read(offset, chunk_bytes, max_offset=end)
            if not data:
                break
            self.feed(data)
            last = last_offset(data)
            offset = last + 1 if last >= 0 else end
            yield offset
        self.flush()

    def feed(self, data: bytes) -> None:
        """Whole batches, in offset order."""
        if not isinstance(data, bytes):
            data = bytes(data)
        pos, n = 0, len(data)
        while pos + 61 <= n:
            pos, folded = scan_plain(data, pos, self._pending)
            self.records += folded
            if pos + 61 > n:
                break
            (length,) = struct.unpack_from(">i", data, pos + 8)
            end = pos + 12 + length
            self.flush()  # a transactional batch or marker: what came before goes first
            for rec_offset, key, value, producer_id, marker in read_entries(data[pos:end]):
                if marker is not None:
                    if self._replay_marker is not None:
                        self._replay_marker(producer_id, marker)
                elif key is not None:
                    self.records += 1
                    self._apply(rec_offset, key, value, producer_id)
            pos = end

    def flush(self) -> None:
        """Replay the pending records (each key's latest), in the order they last came."""
        pending, self._pending = self._pending, {}
        for key, (rec_offset, value) in pending.items():
            self._apply(rec_offset, key, value, -1)

    def _apply(self, rec_offset: int, key: bytes, value: bytes | None, producer_id: int) -> None:
        self.replayed += 1
        try:
            if producer_id >= 0 and self._replay_txn is not None:
                self._replay_txn(producer_id, self.decode(key, value))
            else:
                self.shard.replay(self.decode(key, value))
        except ValueError as e:
            log.warning(
                "coordinator %s: skipping unreadable record at offset %d: %s",
                self.name,
                rec_offset,
                e,
            )
