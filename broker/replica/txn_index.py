"""Transaction state of one partition log: open transactions, the last stable offset (LSO) and
the aborted-transactions index that ``read_committed`` fetches return.

Fed every batch the log appends, in offset order (leader append, follower append, or the scan
of the whole in-memory batch index when a log is opened or truncated), so leaders and
followers hold the same state and it survives restarts and failovers: it is rebuilt from the
log. A transactional data batch opens its producer's transaction at its base offset (unless
one is open); a control batch (marker) closes it, and an abort marker adds
``(producer id, first offset, marker offset)`` to the aborted index. A closed transaction stays
*unstable* until the high watermark passes its marker, so the LSO never exposes a
transaction's records before its marker is readable. Pure: no I/O.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

MARKER_ABORT, MARKER_COMMIT = 0, 1


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    producer_id: int
    first_offset: int
    last_offset: int  # the abort marker's offset


@dataclass
class TxnIndex:
    """Open transactions (producer id -> first offset) and the aborted ones."""

    ongoing: dict[int, int] = field(default_factory=dict)
    completing: list[tuple[int, int]] = field(default_factory=list)  # (first, marker offset)
    aborted: list[AbortedTxn] = field(default_factory=list)  # ascending marker offset

    def on_batch(
        self,
        producer_id: int,
        base_offset: int,
        last_offset: int,
        transactional: bool,
        control_type: int,
    ) -> None:
        """Account for one appended batch (``control_type`` -1 for data batches)."""
        if producer_id < 0 or not transactional:
            return
        if control_type < 0:
            self.ongoing.setdefault(producer_id, base_offset)
            return
        first = self.ongoing.pop(producer_id, None)
        if first is None:
            return  # a marker for a transaction with no data here (a retried marker, say)
        self.completing.append((first, last_offset))
        if control_type == MARKER_ABORT:
            self.aborted.append(AbortedTxn(producer_id, first, last_offset))

    def first_unstable_offset(self, high_watermark: int) -> int | None:
        """The first offset of the oldest transaction not yet stable at ``high_watermark``."""
        if not self.completing:  # read on every fetch of every partition: keep it cheap
            return min(self.ongoing.values()) if self.ongoing else None
        self.completing = [(f, m) for f, m in self.completing if m >= high_watermark]
        firsts = [*self.ongoing.values(), *(f for f, _ in self.completing)]
        return min(firsts, default=None)

    def last_stable_offset(self, high_watermark: int) -> int:
        """Kafka's LSO: the high watermark, or the first offset of an unstable transaction."""
        first = self.first_unstable_offset(high_watermark)
        return high_watermark if first is None else min(first, high_watermark)

    def aborted_in(self, start: int, end: int) -> list[AbortedTxn]:
        """Aborted transactions overlapping offsets [start, end): what a read_committed fetch
        of that range must be told about, oldest first."""
        lasts = [a.last_offset for a in self.aborted]
        i = bisect.bisect_left(lasts, start)
        return [a for a in self.aborted[i:] if a.first_offset < end]

    def remove_before(self, log_start_offset: int) -> None:
        """Forget aborted transactions whose marker lies below the log start."""
        self.aborted = [a for a in self.aborted if a.last_offset >= log_start_offset]
