"""The transaction coordinator of one ``__transaction_state`` partition, as a pure state machine.

Every request is ``method(..., token, now_ms) -> Result``: the records to append (already
replayed into this shard, the only mutation of persisted state) and the responses they
complete, each paired with the opaque token of its request; the runtime releases a response
once its records are replicated. No I/O, no clock but ``now_ms``; new producer ids are handed in
by the caller (they come from the controller).

States (Kafka's): Empty -> Ongoing (AddPartitionsToTxn) -> PrepareCommit / PrepareAbort
(EndTxn, a timeout, or an InitProducerId fencing an open transaction) -> CompleteCommit /
CompleteAbort (:meth:`TxnShard.complete`, once every partition has its marker) -> Ongoing
again, and so on. A transaction in a Prepare state is listed by :meth:`TxnShard.pending_markers`
until completed, so a coordinator that loads the partition after a failover finishes it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from kio.schema.errors import ErrorCode as E

from broker.coordinator.txn.records import (
    COMPLETE_ABORT,
    COMPLETE_COMMIT,
    EMPTY,
    ONGOING,
    PREPARE_ABORT,
    PREPARE_COMMIT,
    STATE_NAMES,
    TxnKey,
    TxnRecord,
    TxnValue,
)

MAX_EPOCH = 32767 - 1  # epochs are int16; Short.MAX_VALUE is reserved, as in Kafka
_IDLE = (EMPTY, COMPLETE_COMMIT, COMPLETE_ABORT)  # no transaction in progress: may expire
NO_PRODUCER = -1


@dataclass(frozen=True)
class TxnConfig:
    """Kafka's transaction coordinator settings (same names with dots)."""

    max_timeout_ms: int = 900_000  # transaction.max.timeout.ms
    id_expiration_ms: int = 604_800_000  # transactional.id.expiration.ms (7 days)


@dataclass
class Result:
    records: list[TxnRecord] = field(default_factory=list)
    completions: list[tuple[Any, dict[str, Any]]] = field(default_factory=list)

    def answer(self, token: Any, response: dict[str, Any]) -> Result:
        self.completions.append((token, response))
        return self


@dataclass
class Txn:
    """What the coordinator knows of one transactional id."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: int
    partitions: frozenset[tuple[str, int]]
    last_update_ms: int
    start_ms: int

    @property
    def state_name(self) -> str:
        return STATE_NAMES.get(self.state, str(self.state))

    def value(self, **changes: Any) -> TxnValue:
        """This transaction as a record value, with ``changes`` applied."""
        current = TxnValue(
            self.producer_id,
            self.producer_epoch,
            self.timeout_ms,
            self.state,
            tuple(sorted(self.partitions)),
            self.last_update_ms,
            self.start_ms,
        )
        if "partitions" in changes:
            changes["partitions"] = tuple(sorted(changes["partitions"]))
        return dataclasses.replace(current, **changes)


@dataclass(frozen=True)
class PendingMarkers:
    """A transaction whose markers still have to be written to its partitions."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    commit: bool
    partitions: frozenset[tuple[str, int]]


def _init_answer(code: E, pid: int = NO_PRODUCER, epoch: int = -1) -> dict[str, Any]:
    return {"error_code": code, "producer_id": pid, "producer_epoch": epoch}


class TxnShard:
    """The transactional ids of one ``__transaction_state`` partition."""

    def __init__(self, config: TxnConfig | None = None) -> None:
        self.config = config or TxnConfig()
        self.txns: dict[str, Txn] = {}

    # ---- replay (the only mutation of persisted state) ---------------------------------------
    def replay(self, record: TxnRecord) -> None:
        key, value = record
        if value is None:
            self.txns.pop(key.transactional_id, None)
            return
        self.txns[key.transactional_id] = Txn(
            key.transactional_id,
            value.producer_id,
            value.producer_epoch,
            value.timeout_ms,
            value.state,
            frozenset(value.partitions),
            value.last_update_ms,
            value.start_ms,
        )

    def _emit(self, out: Result, tid: str, value: TxnValue | None) -> None:
        record: TxnRecord = (TxnKey(tid), value)
        out.records.append(record)
        self.replay(record)

    # ---- runtime hooks -------------------------------------------------------------------------
    def on_loaded(self, now: int) -> None:
        """Nothing to do: open transactions keep their start time, Prepare ones get finished."""

    def pending_tokens(self) -> list[Any]:
        return []  # no request waits inside the shard

    def expire_offsets(self, now: int) -> Result:
        return Result()

    def next_deadline(self) -> int | None:
        """When the oldest open transaction times out, or the longest idle transactional id
        expires, whichever comes first."""
        return min(
            (
                t.start_ms + t.timeout_ms
                if t.state == ONGOING
                else t.last_update_ms + self.config.id_expiration_ms
                for t in self.txns.values()
                if t.state == ONGOING or t.state in _IDLE
            ),
            default=None,
        )

    def tick(self, now: int) -> Result:
        """Abort every open transaction older than its timeout, bumping the epoch so that the
        producer that let it expire is fenced (Kafka's abortTimedOutTransactions); forget every
        transactional id with no transaction in progress and no update for
        ``transactional.id.expiration.ms`` (a tombstone; Kafka's removeExpiredTransactionalIds).
        """
        out = Result()
        for t in list(self.txns.values()):
            if t.state == ONGOING and now >= t.start_ms + t.timeout_ms:
                epoch = min(t.producer_epoch + 1, MAX_EPOCH)
                self._emit(
                    out,
                    t.transactional_id,
                    t.value(producer_epoch=epoch, state=PREPARE_ABORT, last_update_ms=now),
                )
            elif t.state in _IDLE and now >= t.last_update_ms + self.config.id_expiration_ms:
                self._emit(out, t.transactional_id, None)
        return out

    # ---- lookups -------------------------------------------------------------------------------
    def needs_new_producer_id(self, tid: str) -> bool:
        """Whether InitProducerId for ``tid`` needs a fresh producer id from the caller."""
        t = self.txns.get(tid)
        return t is None or t.producer_epoch >= MAX_EPOCH

    def pending_markers(self) -> list[PendingMarkers]:
        """Transactions in PrepareCommit / PrepareAbort, oldest update first."""
        found = [t for t in self.txns.values() if t.state in (PREPARE_COMMIT, PREPARE_ABORT)]
        found.sort(key=lambda t: t.last_update_ms)
        return [
            PendingMarkers(
                t.transactional_id,
                t.producer_id,
                t.producer_epoch,
                t.state == PREPARE_COMMIT,
                t.partitions,
            )
            for t in found
        ]

    def describe(self, tid: str) -> Txn | None:
        return self.txns.get(tid)

    def _check(self, tid: str, pid: int, epoch: int) -> tuple[Txn | None, E]:
        t = self.txns.get(tid)
        if t is None or t.producer_id != pid:
            return None, E.invalid_producer_id_mapping
        if epoch != t.producer_epoch:
            return None, E.producer_fenced
        return t, E.none

    # ---- requests ------------------------------------------------------------------------------
    def init_producer_id(
        self,
        tid: str,
        timeout_ms: int,
        req_pid: int,
        req_epoch: int,
        new_pid: int | None,
        token: Any,
        now: int,
    ) -> Result:
        """InitProducerId with a transactional id: a new producer id, or the old one with its
        epoch bumped (fencing any older producer of ``tid``). An open transaction is aborted
        first (answer CONCURRENT_TRANSACTIONS: the client retries)."""
        out = Result()
        if not tid:
            return out.answer(token, _init_answer(E.invalid_request))
        if timeout_ms <= 0 or timeout_ms > self.config.max_timeout_ms:
            return out.answer(token, _init_answer(E.invalid_transaction_timeout))
        t = self.txns.get(tid)
        if (
            t is not None
            and req_pid >= 0
            and (req_pid, req_epoch) != (t.producer_id, t.producer_epoch)
        ):
            return out.answer(token, _init_answer(E.producer_fenced))
        if t is None:
            if new_pid is None:
                return out.answer(token, _init_answer(E.coordinator_not_available))
            self._emit(out, tid, TxnValue(new_pid, 0, timeout_ms, EMPTY, (), now, -1))
            return out.answer(token, _init_answer(E.none, new_pid, 0))
        if t.state in (PREPARE_COMMIT, PREPARE_ABORT):
            return out.answer(token, _init_answer(E.concurrent_transactions))
        if t.state == ONGOING:
            epoch = min(t.producer_epoch + 1, MAX_EPOCH)
            self._emit(
                out, tid, t.value(producer_epoch=epoch, state=PREPARE_ABORT, last_update_ms=now)
            )
            return out.answer(token, _init_answer(E.concurrent_transactions))
        if t.producer_epoch >= MAX_EPOCH:
            if new_pid is None:
                return out.answer(token, _init_answer(E.coordinator_not_available))
            pid, epoch = new_pid, 0
        else:
            pid, epoch = t.producer_id, t.producer_epoch + 1
        self._emit(out, tid, TxnValue(pid, epoch, timeout_ms, EMPTY, (), now, -1))
        return out.answer(token, _init_answer(E.none, pid, epoch))

    def add_partitions(
        self,
        tid: str,
        pid: int,
        epoch: int,
        partitions: list[tuple[str, int]],
        token: Any,
        now: int,
    ) -> tuple[Result, E]:
        """AddPartitionsToTxn / AddOffsetsToTxn: (result, the error of every partition)."""
        out = Result()
        t, code = self._check(tid, pid, epoch)
        if t is None:
            return out.answer(token, {}), code
        if t.state in (PREPARE_COMMIT, PREPARE_ABORT):
            return out.answer(token, {}), E.concurrent_transactions
        if t.state == ONGOING and set(partitions) <= t.partitions:
            return out.answer(token, {}), E.none
        ongoing = t.state == ONGOING
        self._emit(
            out,
            tid,
            t.value(
                state=ONGOING,
                partitions=(t.partitions if ongoing else frozenset()) | set(partitions),
                last_update_ms=now,
                start_ms=t.start_ms if ongoing else now,
            ),
        )
        return out.answer(token, {}), E.none

    def end_txn(
        self, tid: str, pid: int, epoch: int, commit: bool, token: Any, now: int
    ) -> tuple[Result, E]:
        """EndTxn: Ongoing -> PrepareCommit / PrepareAbort (markers are written after); a retry
        of a finished EndTxn succeeds again; anything else is INVALID_TXN_STATE."""
        out = Result()
        t, code = self._check(tid, pid, epoch)
        if t is None:
            return out.answer(token, {}), code
        if t.state == ONGOING:
            state = PREPARE_COMMIT if commit else PREPARE_ABORT
            self._emit(out, tid, t.value(state=state, last_update_ms=now))
            return out.answer(token, {}), E.none
        done = COMPLETE_COMMIT if commit else COMPLETE_ABORT
        preparing = PREPARE_COMMIT if commit else PREPARE_ABORT
        if t.state == done:
            return out.answer(token, {}), E.none
        if t.state == preparing:
            return out.answer(token, {}), E.concurrent_transactions
        return out.answer(token, {}), E.invalid_txn_state

    def complete(self, tid: str, pid: int, epoch: int, now: int) -> Result:
        """Every marker of a PrepareCommit / PrepareAbort transaction is written: complete it."""
        out = Result()
        t = self.txns.get(tid)
        if t is None or t.producer_id != pid or t.producer_epoch != epoch:
            return out
        if t.state not in (PREPARE_COMMIT, PREPARE_ABORT):
            return out
        state = COMPLETE_COMMIT if t.state == PREPARE_COMMIT else COMPLETE_ABORT
        self._emit(out, tid, t.value(state=state, partitions=(), last_update_ms=now))
        return out
