"""One local replica: its log, what the metadata says about it, and its replication state.

As **leader** it appends client batches, tracks each follower's fetch position
(:mod:`broker.replica.isr_tracker`) and advances the high watermark to the smallest log end offset of
the ISR. As **follower** it appends what its fetcher brings and takes the leader's high
watermark (capped at its own log end). Anything waiting for progress — a produce in purgatory,
a long-polling fetch — registers a :class:`trio.Event` in :attr:`Partition.waiters`; appends and
high-watermark moves set them all (:meth:`Partition.wake`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn

import trio

from broker.replica.isr_tracker import FollowerState, high_watermark, may_join, out_of_sync
from broker.replica.log_dirs import KafkaStorageError
from broker.replica.partition_log import LeaderAppend, PartitionLog
from kraft.storage.failure import storage_failed


@dataclass(eq=False)
class Partition:
    """One local replica: its log and what the latest metadata says about it."""

    topic: str
    topic_id: str
    partition: int
    log: PartitionLog
    role: str = "none"  # "leader" | "follower"
    leader: int = -1
    leader_epoch: int = -1
    partition_epoch: int = -1
    isr: tuple[int, ...] = ()
    replicas: tuple[int, ...] = field(default_factory=tuple)
    followers: dict[int, FollowerState] = field(default_factory=dict)  # leader only
    waiters: set[trio.Event] = field(default_factory=set)
    # woken by appends and role changes but not by high-watermark moves alone: a follower's
    # long-polling fetch waits for bytes, and an HW move brings none
    data_waiters: set[trio.Event] = field(default_factory=set)
    # called (leader only) right after the high watermark moves: a coordinator releases the
    # responses it covers from inside the follower fetch that moved it
    hw_listeners: list[Callable[[], None]] = field(default_factory=list)
    isr_change_pending: bool = False
    isr_retry_at: float = 0.0  # monotonic time before which a refused ISR change is not re-proposed
    # told of a write error in this partition's log (the replica manager takes its log dir
    # offline, or stops the broker); None: stop the broker (docs/design.md, Failure model)
    on_storage_error: Callable[[Partition, str, OSError], None] | None = None

    def storage_error(self, what: str, exc: OSError) -> NoReturn:
        """``what`` failed on this partition's log: report it, then raise KafkaStorageError
        (the caller answers KAFKA_STORAGE_ERROR) unless the report stopped the broker."""
        if self.on_storage_error is None:
            storage_failed(what, self.log.dir, exc)
        self.on_storage_error(self, what, exc)
        raise KafkaStorageError(f"{self.topic}-{self.partition}: {what} failed: {exc}") from exc

    @property
    def high_watermark(self) -> int:
        return self.log.high_watermark

    @property
    def is_leader(self) -> bool:
        return self.role == "leader"

    def wake(self, data: bool = True) -> None:
        """Tell everything waiting on this partition that something changed (``data`` False:
        only the high watermark moved, so :attr:`data_waiters` keep waiting)."""
        for e in self.waiters:
            e.set()
        self.waiters.clear()
        if data:
            for e in self.data_waiters:
                e.set()
            self.data_waiters.clear()

    # ---- leader ------------------------------------------------------------------------------
    def reset_followers(self, broker_id: int, now_ms: float) -> None:
        """A new leader epoch: follower positions are unknown, ISR members count as caught up now
        (so they are not dropped before they had a chance to fetch)."""
        self.followers = {
            b: FollowerState(last_caught_up_ms=now_ms) for b in self.replicas if b != broker_id
        }

    def append_as_leader(self, data: bytes, max_batch_bytes: int | None = None) -> LeaderAppend:
        """Append client batches in the current leader epoch (see
        :meth:`PartitionLog.append_as_leader`: a retried idempotent batch is not appended)."""
        try:
            result = self.log.append_as_leader(data, self.leader_epoch, max_batch_bytes)
        except OSError as e:  # the log dir failed (docs/design.md, Failure model)
            self.storage_error("partition log write", e)
        if not result.duplicate:
            self.maybe_advance_high_watermark()
            self.wake()
        return result

    def append_as_coordinator(self, data: bytes) -> int:
        """Append a coordinator's own batch in the current leader epoch, without the
        idempotence checks of client batches (a transactional batch of TxnOffsetCommit records
        carries sequence -1, as in Kafka); its last offset."""
        try:
            _, last = self.log.append(data, self.leader_epoch)
        except OSError as e:  # the log dir failed (docs/design.md, Failure model)
            self.storage_error("partition log write", e)
        self.maybe_advance_high_watermark()
        self.wake()
        return last

    def append_marker(
        self,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        coordinator_epoch: int,
        timestamp_ms: int,
    ) -> int:
        """Append a transaction marker in the current leader epoch; its offset (see
        :meth:`PartitionLog.append_marker`)."""
        try:
            offset = self.log.append_marker(
                producer_id,
                producer_epoch,
                commit,
                coordinator_epoch,
                self.leader_epoch,
                timestamp_ms,
            )
        except OSError as e:
            self.storage_error("partition log write", e)
        self.maybe_advance_high_watermark()
        self.wake()
        return offset

    def maybe_advance_high_watermark(self) -> bool:
        hw = high_watermark(
            self.leader, self.log.log_end_offset, self.isr, self.followers, self.log.high_watermark
        )
        if hw > self.log.high_watermark:
            self.log.advance_high_watermark(hw)
            for listener in list(self.hw_listeners):
                listener()
            self.wake(data=False)
            return True
        return False

    def on_follower_fetch(self, replica_id: int, fetch_offset: int, now_ms: float) -> bool:
        """Record a follower's fetch position; True if that follower may now join the ISR."""
        f = self.followers.get(replica_id)
        if f is None:
            if replica_id not in self.replicas:
                return False
            f = self.followers[replica_id] = FollowerState()
        f.on_fetch(fetch_offset, self.log.log_end_offset, now_ms)
        self.maybe_advance_high_watermark()
        if replica_id in self.isr:
            return False
        epoch_start = self.log.epochs[-1][1] if self.log.epochs else 0
        return may_join(f, self.log.high_watermark, epoch_start)

    def out_of_sync_replicas(self, now_ms: float, lag_ms: int) -> list[int]:
        return out_of_sync(
            self.leader, self.log.log_end_offset, self.isr, self.followers, now_ms, lag_ms
        )

    def adopt_isr(self, isr: tuple[int, ...], partition_epoch: int) -> None:
        """The controller accepted an ISR change (same leader epoch)."""
        if partition_epoch > self.partition_epoch:
            self.isr, self.partition_epoch = isr, partition_epoch
            self.maybe_advance_high_watermark()
            self.wake()

    # ---- follower ----------------------------------------------------------------------------
    def append_as_follower(
        self, data: bytes, leader_high_watermark: int, leader_log_start: int = -1
    ) -> None:
        """Append fetched batches and adopt the leader's high watermark and log start offset
        (DeleteRecords), both up to our log end."""
        if data:
            try:
                self.log.append_as_follower(data)
            except OSError as e:
                self.storage_error("partition log write", e)
        if leader_log_start > self.log.log_start_offset:
            self.log.delete_records_before(leader_log_start)
        hw = min(leader_high_watermark, self.log.log_end_offset)
        if hw > self.log.high_watermark:
            self.log.advance_high_watermark(hw)
        self.wake()

    def describe(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "topic_id": self.topic_id,
            "partition": self.partition,
            "role": self.role,
            "leader": self.leader,
            "leader_epoch": self.leader_epoch,
            "partition_epoch": self.partition_epoch,
            "isr": list(self.isr),
            "replicas": list(self.replicas),
            "high_watermark": self.log.high_watermark,
            "log_start_offset": self.log.log_start_offset,
            "log_end_offset": self.log.log_end_offset,
            "producers": len(self.log.producers),
            "last_stable_offset": self.log.last_stable_offset,
            "open_transactions": len(self.log.txns.ongoing),
            "cleaner_checkpoint": self.log.first_dirty_offset,
            "aborted_transactions": len(self.log.txns.aborted),
            "dir": str(self.log.dir),
        }
