"""The coordinator runtime: runs a pure shard state machine over each partition of an internal
topic that this broker leads, the way Kafka 4's CoordinatorRuntime does.

* **Placement.** On every metadata publish (after the replica manager), partitions of ``topic``
  that this broker now leads (or leads in a new leader epoch) are *loaded*: their records are
  read from the log start to the log end and replayed into a fresh shard, while requests get
  ``COORDINATOR_LOAD_IN_PROGRESS``. Partitions it no longer leads are *unloaded*: the shard is
  dropped, its waiting requests are answered ``NOT_COORDINATOR``.
* **Writes.** :meth:`CoordinatorRuntime.write` runs ``fn(shard, token, now_ms)`` (pure, returns
  records plus completed responses), appends the records as one batch to the partition as
  leader, and releases the responses only once the high watermark covers that batch (acks=all);
  the leader epoch changing first fails them with ``NOT_COORDINATOR``.
* **Timers.** ``shard.tick(now)`` runs at ``shard.next_deadline()``; ``shard.expire_offsets``
  every ``offsets.retention.check.interval.ms``.

Nothing here is specific to groups: a shard needs ``replay``, ``on_loaded``, ``tick``,
``next_deadline``, ``pending_tokens`` and ``expire_offsets``, and the runtime is given the codec of
its records, so a transaction coordinator can run on ``__transaction_state`` with it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import trio
from kio.schema.errors import ErrorCode

from broker.coordinator.record_batch import encode_batch, read_records
from broker.replica.partition import Partition
from broker.replica.partition_log import parse_batches
from broker.replica.replica_manager import ReplicaManager

log = logging.getLogger(__name__)
LOAD_CHUNK_BYTES = 1 << 20
COMMIT_TIMEOUT_S = 30.0


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
    uncommitted: list[tuple[int, list[tuple[Token, Any]]]] = field(default_factory=list)


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
        self.slots.pop(slot.partition, None)
        for token in slot.shard.pending_tokens():
            token.fail(ErrorCode.not_coordinator)
        for _, completions in slot.uncommitted:
            for token, _ in completions:
                token.fail(ErrorCode.not_coordinator)
        slot.uncommitted.clear()
        log.info("coordinator %s-%d: unloaded (%s)", self.topic, slot.partition, why)

    def status(self, pid: int) -> ErrorCode:
        """NONE if this broker serves partition ``pid`` now, else the error to answer."""
        slot = self.slots.get(pid)
        if slot is None:
            return ErrorCode.not_coordinator
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
        """Run ``fn(shard, token, now)`` and wait for the response to ``token``."""
        slot_shard = self.shard(pid)
        slot = self.slots[pid]
        token = Token()
        self._apply(slot, fn(slot_shard, token, self.now_ms()))
        with trio.move_on_after(timeout_s):
            await token.done.wait()
        if not token.done.is_set():
            raise CoordinatorError(ErrorCode.request_timed_out)
        if token.error is not None:
            raise CoordinatorError(token.error)
        return token.response

    def _apply(self, slot: _Slot, result: Any) -> None:
        """Append ``result``'s records; complete its responses now or once committed."""
        completions = [(t, r) for t, r in result.completions if isinstance(t, Token)]
        if not result.records:
            for token, response in completions:
                token.complete(response)
            return
        part = self.replicas.get_by_name(self.topic, slot.partition)
        if part is None or not part.is_leader or part.leader_epoch != slot.leader_epoch:
            self._unload(slot, "lost leadership before appending")
            for token, _ in completions:
                token.fail(ErrorCode.not_coordinator)
            return
        batch = encode_batch([self.encode(r) for r in result.records], self.now_ms())
        last = part.append_as_leader(batch).last_offset
        slot.uncommitted.append((last + 1, completions))
        self._release(slot, part)
        self._wakeup.set()

    def _release(self, slot: _Slot, part: Partition) -> None:
        hw = part.high_watermark
        while slot.uncommitted and slot.uncommitted[0][0] <= hw:
            _, completions = slot.uncommitted.pop(0)
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
            deadlines = []
            for slot in list(self.slots.values()):
                if slot.loading:
                    continue
                self._apply(slot, slot.shard.tick(now))
                if now >= next_expiry:
                    self._apply(slot, slot.shard.expire_offsets(now))
                d = slot.shard.next_deadline()
                if d is not None:
                    deadlines.append(d)
            if now >= next_expiry:
                next_expiry = now + self.expiry_interval_ms
            waiting = []
            for slot in self.slots.values():
                part = self.replicas.get_by_name(self.topic, slot.partition)
                if part is None or part.leader_epoch != slot.leader_epoch or not part.is_leader:
                    continue
                self._release(slot, part)
                if slot.uncommitted:
                    waiting.append(part)
            wake_at = min([*deadlines, next_expiry]) / 1000
            event = self._wakeup = trio.Event()
            for part in waiting:
                part.waiters.add(event)
            with trio.move_on_after(max(0.0, min(1.0, wake_at - self.clock()))):
                await event.wait()
            for part in waiting:
                part.waiters.discard(event)

    async def _load(self, slot: _Slot) -> None:
        part = self.replicas.get_by_name(self.topic, slot.partition)
        if part is None or self.slots.get(slot.partition) is not slot:
            return
        started = time.monotonic()
        offset, end, count = part.log.log_start_offset, part.log.log_end_offset, 0
        while offset < end:
            data = part.log.read(offset, LOAD_CHUNK_BYTES, max_offset=end)
            if not data:
                break
            for rec_offset, key, value in read_records(data):
                offset = rec_offset + 1
                if key is None:
                    continue
                try:
                    slot.shard.replay(self.decode(key, value))
                except ValueError as e:
                    log.warning(
                        "coordinator %s-%d: skipping unreadable record at offset %d: %s",
                        self.topic,
                        slot.partition,
                        rec_offset,
                        e,
                    )
                count += 1
            batches, _ = parse_batches(data, check_crc=False)
            if batches:
                offset = max(offset, batches[-1].last_offset + 1)
            await trio.sleep(0)
            if self.slots.get(slot.partition) is not slot:
                return  # unloaded meanwhile
        slot.shard.on_loaded(self.now_ms())
        slot.loading = False
        self.loads_done += 1
        log.info(
            "coordinator %s-%d: loaded %d records up to offset %d in %.0f ms",
            self.topic,
            slot.partition,
            count,
            end,
            (time.monotonic() - started) * 1000,
        )
