"""The active controller's proposals that have not committed yet, in proposal order.

Each proposal was built on the speculative image the one before it left, so together they
chain onto the committed image. Two facts keep the speculative state machine right:

* a proposal that commits proves that every proposal before it committed too (it chains on
  them), including one whose writer stopped waiting (a timeout) and was not told;
* rebuilding the speculative state (a proposal was refused before Raft, or skipped by the chain
  check) starts from the committed state machine and replays only the proposals that continue
  it: one it already holds is dropped, never replayed a second time.

Pure: no I/O.
"""

from __future__ import annotations

from kraft.controller.state_machine import QuorumStateMachine
from kraft.records import Batch


class InFlightProposals:
    """Proposals by their bytes, oldest first."""

    def __init__(self) -> None:
        self._chain: dict[bytes, Batch] = {}

    def __contains__(self, raw: bytes) -> bool:
        return raw in self._chain

    def __len__(self) -> int:
        return len(self._chain)

    def add(self, raw: bytes, batch: Batch) -> None:
        """A new proposal, built on the one added last."""
        self._chain[raw] = batch

    def clear(self) -> None:
        self._chain.clear()

    def committed(self, raw: bytes) -> None:
        """``raw`` committed: it and every proposal before it leave the chain."""
        while self._chain:
            first = next(iter(self._chain))
            del self._chain[first]
            if first == raw:
                return

    def rebuild(self, committed: QuorumStateMachine, failed: bytes) -> QuorumStateMachine:
        """A new speculative state machine: ``committed`` forked, then the proposals made before
        ``failed`` that continue it (``failed`` empty: none). The chain keeps only those; the
        ones after ``failed`` chain on it and will be skipped."""
        spec = committed.fork()
        keep: dict[bytes, Batch] = {}
        if failed:
            for raw, batch in self._chain.items():
                if raw == failed:
                    break
                image = spec.image
                if batch.base_offset <= image.offset:  # committed while its writer gave up
                    continue
                if batch.base_offset != image.offset + 1 or batch.prev_hash != image.last_hash:
                    break  # built on one that did not commit: so is every later one
                spec.replay_batch(batch, raw)
                keep[raw] = batch
        self._chain = keep
        return spec
