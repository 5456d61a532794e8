"""Idempotent-producer state of one partition: for each producer id, its epoch and the sequence
and offset ranges of its last 5 batches (Kafka's ``ProducerStateManager``).

The leader checks a client batch against it before appending (:meth:`ProducerStateManager.check`):

* a batch whose epoch and sequence range equal one of the last 5 is a **duplicate** (a retry):
  the leader answers with the offsets it got the first time and appends nothing;
* an epoch older than the producer's → ``INVALID_PRODUCER_EPOCH``;
* a newer epoch must start at sequence 0, the same epoch must continue at last sequence + 1
  (wrapping after 2^31-1), else ``OUT_OF_ORDER_SEQUENCE_NUMBER``; a producer id this partition
  has never seen may start at any sequence (its earlier batches may have been deleted).

Leader and followers alike :meth:`~ProducerStateManager.update` it with every batch they append,
and a log rebuilds it by replaying batches from its latest snapshot (:func:`encode_snapshot`),
so it survives leader failover and restarts. Pure: no I/O, no clock.
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

import crc32c
import msgpack

MAX_BATCHES = 5  # batches remembered per producer: a client has at most 5 in flight
INT32_MAX = 2**31 - 1
_SNAPSHOT_MAGIC = b"PSN1"


class ProducerStateError(Exception):
    """A batch the producer state refuses; ``error`` is Kafka's error name (lower case, as in
    ``kio.schema.errors.ErrorCode``)."""

    def __init__(self, error: str, message: str) -> None:
        super().__init__(message)
        self.error = error


class SnapshotError(ValueError):
    """A producer-state snapshot that cannot be read (torn, corrupt or another format)."""


@dataclass(frozen=True, slots=True)
class BatchMeta:
    """Sequence and offset range of one appended batch."""

    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int


@dataclass(slots=True)
class ProducerEntry:
    """What a partition remembers of one producer id."""

    producer_id: int
    epoch: int
    batches: deque[BatchMeta] = field(default_factory=lambda: deque(maxlen=MAX_BATCHES))
    last_timestamp: int = -1

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else -1

    @property
    def last_offset(self) -> int:
        return self.batches[-1].last_offset if self.batches else -1


def last_sequence(base_sequence: int, last_offset_delta: int) -> int:
    """The sequence of a batch's last record (sequences wrap to 0 after 2^31-1)."""
    if base_sequence > INT32_MAX - last_offset_delta:
        return last_offset_delta - (INT32_MAX - base_sequence) - 1
    return base_sequence + last_offset_delta


def _in_sequence(last_seq: int, next_seq: int) -> bool:
    return next_seq == last_seq + 1 or (next_seq == 0 and last_seq == INT32_MAX)


class ProducerStateManager:
    """Producer id → :class:`ProducerEntry` for one partition."""

    def __init__(self) -> None:
        self.producers: dict[int, ProducerEntry] = {}

    def __len__(self) -> int:
        return len(self.producers)

    def check(
        self, producer_id: int, epoch: int, first_seq: int, last_seq: int
    ) -> BatchMeta | None:
        """Validate a leader append: the original batch if this one is a duplicate, None if it
        may be appended; raises :class:`ProducerStateError` otherwise."""
        entry = self.producers.get(producer_id)
        if entry is None:
            return None
        if epoch < entry.epoch:
            raise ProducerStateError(
                "invalid_producer_epoch",
                f"Producer {producer_id}'s epoch {epoch} is older than the current {entry.epoch}.",
            )
        if epoch == entry.epoch:
            for b in entry.batches:
                if b.first_seq == first_seq and b.last_seq == last_seq:
                    return b
            if entry.batches and not _in_sequence(entry.last_seq, first_seq):
                raise ProducerStateError(
                    "out_of_order_sequence_number",
                    f"Producer {producer_id} epoch {epoch}: sequence {first_seq} does not follow "
                    f"the last appended sequence {entry.last_seq}.",
                )
        elif first_seq != 0:
            raise ProducerStateError(
                "out_of_order_sequence_number",
                f"Producer {producer_id}: a new epoch {epoch} must start at sequence 0, "
                f"not {first_seq}.",
            )
        return None

    def update(
        self,
        producer_id: int,
        epoch: int,
        first_seq: int,
        last_seq: int,
        first_offset: int,
        last_offset: int,
        timestamp: int = -1,
    ) -> None:
        """Record an appended batch (leader append, follower append or replay)."""
        entry = self.producers.get(producer_id)
        if entry is None or epoch > entry.epoch:
            entry = self.producers[producer_id] = ProducerEntry(producer_id, epoch)
        elif epoch < entry.epoch:
            return  # replaying a fenced producer's late batch: the newer epoch stands
        entry.batches.append(BatchMeta(first_seq, last_seq, first_offset, last_offset))
        entry.last_timestamp = max(entry.last_timestamp, timestamp)

    def update_epoch(self, producer_id: int, epoch: int) -> None:
        """A transaction marker of ``epoch`` was appended: a newer epoch replaces the entry
        (the next batch of that epoch starts a fresh sequence)."""
        entry = self.producers.get(producer_id)
        if entry is None or epoch > entry.epoch:
            self.producers[producer_id] = ProducerEntry(producer_id, epoch)

    def remove_before(self, log_start_offset: int) -> None:
        """Forget producers whose last batch lies wholly below the log start (DeleteRecords or
        retention removed it), as Kafka does when the log start moves."""
        for pid in [
            p
            for p, e in self.producers.items()
            if e.batches and e.last_offset < log_start_offset  # no batches: a marker epoch
        ]:
            del self.producers[pid]

    def remove_expired(self, now_ms: int, expiration_ms: int, keep: Iterable[int] = ()) -> int:
        """Forget producers whose newest batch timestamp is ``expiration_ms`` or more before
        ``now_ms`` (Kafka's ``producer.id.expiration.ms``), except those in ``keep`` (with a
        transaction in progress) and those without a timestamp; how many went."""
        kept = set(keep)
        expired = [
            p
            for p, e in self.producers.items()
            if p not in kept
            and e.last_timestamp >= 0
            and now_ms - e.last_timestamp >= expiration_ms
        ]
        for pid in expired:
            del self.producers[pid]
        return len(expired)


def encode_snapshot(state: ProducerStateManager) -> bytes:
    """The snapshot bytes of ``state``: magic, CRC32C of the payload, msgpack payload."""
    payload: bytes = msgpack.packb(
        [
            [
                e.producer_id,
                e.epoch,
                e.last_timestamp,
                [[b.first_seq, b.last_seq, b.first_offset, b.last_offset] for b in e.batches],
            ]
            for e in state.producers.values()
        ]
    )
    return _SNAPSHOT_MAGIC + struct.pack(">I", crc32c.crc32c(payload)) + payload


def decode_snapshot(data: bytes) -> ProducerStateManager:
    """The state held by snapshot bytes; :class:`SnapshotError` if they are not intact."""
    if len(data) < 8 or data[:4] != _SNAPSHOT_MAGIC:
        raise SnapshotError("not a producer-state snapshot")
    (crc,) = struct.unpack_from(">I", data, 4)
    payload = data[8:]
    if crc32c.crc32c(payload) != crc:
        raise SnapshotError("checksum mismatch")
    state = ProducerStateManager()
    try:
        for pid, epoch, ts, batches in msgpack.unpackb(payload):
            entry = ProducerEntry(int(pid), int(epoch), last_timestamp=int(ts))
            for fs, ls, fo, lo in batches:
                entry.batches.append(BatchMeta(int(fs), int(ls), int(fo), int(lo)))
            state.producers[entry.producer_id] = entry
    except (ValueError, TypeError) as e:
        raise SnapshotError(f"malformed payload: {e}") from None
    return state
