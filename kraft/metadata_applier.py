"""The apply side of the quorum: committed Raft entries → metadata log → committed image.

:class:`MetadataApplier` is the ``ApplyTarget`` that ``RaftQuorum`` calls for every committed
entry; all of its methods run inside PySyncObj's ticks (the trio thread), one at a time. An entry
holds a group of record batches, each built by the active controller that proposed it
(``QuorumStateMachine.propose``). Every controller appends them to its metadata log verbatim and
replays them into its committed state machine; nobody re-runs a handler.

The chain check (a deterministic safety net): a batch is appended only if it continues the
committed log, i.e. its ``base_offset`` is the image's offset + 1 and its ``prev_hash`` the
image's last hash. Every controller holds the same committed image before each entry, so every
controller skips the same batches. A batch that does not fit was built on a speculative image
that did not become the committed one: a deposed leader's proposal, or one chained on an earlier
skipped batch. Its proposer hears ``NOT_CONTROLLER`` and its client retries. A batch at or below
the image's offset is one this controller has already (PySyncObj re-applying its journal after a
restart) and is skipped silently; an entry that does not decode as batches (a pre-v2 command
group already reflected in the log) is skipped the same way on every controller.

Durability: the results go back to the waiting callers without syncing the metadata log. The
Raft journal is what makes an acknowledged batch durable (``metadata.log.fsync=always``: it is
synced on a majority before the commit); the metadata log is synced by the node every
``metadata.log.flush.interval.ms`` and before every snapshot, and a tail lost to a power cut is
appended again from the journal on restart (the chain check lets exactly the missing batches in).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from kraft.controller.state_machine import QuorumStateMachine
from kraft.errors import ErrorCode
from kraft.heap import HeapFreezer, freeze_heap, gc_paused
from kraft.log.metadata_log import MetadataLog
from kraft.metadata.image import MetadataImage
from kraft.records import Batch, RecordDecodeError, decode_batch, decode_batch_envelope
from kraft.snapshotter import Snapshotter
from kraft.storage.failure import node_failed, storage_failed

log = logging.getLogger(__name__)

APPLIED: dict[str, Any] = {"error_code": 0, "error_message": "", "applied": True}

# Records applied between two heap freezes. Each freeze's full collection walks what was
# allocated since the last one, inside a Raft tick: the fewer records, the shorter that pause
# (a 2M-partition broker transition writes ~100k records; docs/performance.md).
FREEZE_EVERY_RECORDS = 20_000


class MetadataApplier:
    """Applies committed batch groups; owns the committed state machine and the log writes."""

    def __init__(
        self,
        state_machine: QuorumStateMachine,
        metadata_log: MetadataLog,
        snapshotter: Snapshotter,
        on_applied: Callable[[], None] | None = None,
    ) -> None:
        self.state_machine = state_machine
        self.log = metadata_log
        self.snapshotter = snapshotter
        self._on_applied = on_applied or (lambda: None)
        # Entries at or below this Raft index are already reflected (format-1 batches carry
        # their entry's index; later ones are recognised by the chain check instead).
        self._last_raft_index = metadata_log.last_raft_index
        self.fatal_error: BaseException | None = None
        # Called between the batches of an entry (the quorum's heartbeat check: a long entry
        # must not starve the followers into an election).
        self.between_commands: Callable[[], None] = lambda: None
        # Batches this controller proposed, by their bytes, while their commit is awaited, with
        # the image they were built on and the image they made: applying one takes the object
        # instead of decoding the bytes, and adopts the image instead of replaying the batch
        # again when the committed image is the one it was built on (images are immutable).
        self.own_batches: dict[bytes, tuple[Batch, MetadataImage, MetadataImage]] = {}
        # Told of every committed batch this controller proposed, and whether it was appended
        # (the active controller drops its speculative state when one of its own was skipped).
        self.on_own_batch: Callable[[bytes, bool], None] = lambda raw, applied: None
        self.skipped = 0  # batches the chain check refused (deposed-leader proposals)
        # The image replayed so far (snapshot + log at start-up) leaves the cyclic GC's reach,
        # and so does every further FREEZE_EVERY_RECORDS records' growth (kraft/heap.py).
        self._heap = HeapFreezer(FREEZE_EVERY_RECORDS)
        freeze_heap()

    # ---- ApplyTarget --------------------------------------------------------------------------

    def last_applied_raft_index(self) -> int:
        """Entries at or below this index are fully reflected in our log (see module doc)."""
        return self._last_raft_index - 1 if self._last_raft_index > 0 else 0

    def apply_entry(self, raft_index: int, term: int, batches: list[bytes]) -> list[Any]:
        """Append and replay one committed entry's batches in order; one result per batch."""
        if self.fatal_error is not None:
            return [
                _error(ErrorCode.UNKNOWN_SERVER_ERROR, "controller has stopped applying")
            ] * len(batches)
        results: list[Any] = []
        written: list[tuple[bytes, Batch, bytes]] = []  # the entry's batches: one write
        try:
            try:
                for raw in batches:
                    with gc_paused():  # one young collection after the batch, not dozens in it
                        results.append(self._apply_one(raw, raft_index, written))
                    self.between_commands()
            finally:
                if written:
                    self.log.append_many(written)
        except Exception as e:  # a disk error or a record that fails to replay: fatal
            self.fatal_error = e
            if isinstance(e, OSError):
                storage_failed("metadata log write", self.log.directory, e)
            node_failed(f"applying raft entry {raft_index} failed: {e!r}")
        self._last_raft_index = max(self._last_raft_index, raft_index)
        self._on_applied()
        return results

    def _apply_one(
        self, raw: bytes, raft_index: int, written: list[tuple[bytes, Batch, bytes]]
    ) -> Any:
        own = self.own_batches.pop(raw, None)
        batch = own[0] if own is not None else None
        if batch is None:
            try:
                envelope = decode_batch_envelope(raw)  # ~13x cheaper: a restart re-applies all
                if envelope.base_offset <= self.state_machine.image.offset:  # in our log already
                    return _error(ErrorCode.NOT_CONTROLLER, "batch already applied")
                batch = decode_batch(raw)
            except (RecordDecodeError, TypeError, ValueError) as e:
                log.warning(
                    "raft entry %d: skipped an entry that is not a batch: %s", raft_index, e
                )
                return _error(ErrorCode.INVALID_REQUEST, f"not a record batch: {e}")
        image = self.state_machine.image
        if batch.base_offset <= image.offset:  # already in our log (journal re-applied)
            result = _error(ErrorCode.NOT_CONTROLLER, "batch already applied")
        elif batch.base_offset != image.offset + 1 or batch.prev_hash != image.last_hash:
            self.skipped += 1
            log.warning(
                "raft entry %d: skipped a batch that does not continue the log (base offset %d, "
                "log at %d; prev_hash %s, last hash %s): proposed by a %s on an image that was "
                "not committed",
                raft_index,
                batch.base_offset,
                image.offset,
                batch.prev_hash.hex()[:12],
                image.last_hash.hex()[:12],
                f"controller in term {batch.term}",
            )
            result = _error(
                ErrorCode.NOT_CONTROLLER,
                "the batch was built on an image that was not committed; retry",
            )
        else:
            if own is not None and own[1] is image:
                self.state_machine.adopt(batch, own[2])
            else:
                self.state_machine.replay_batch(batch, raw)
            written.append((raw, batch, self.state_machine.image.last_hash))
            self._heap.note(len(batch.records))
            result = APPLIED
        if own is not None:
            self.on_own_batch(raw, result is APPLIED)
        return result

    def dump(self) -> bytes:
        """PySyncObj compaction: write a snapshot of the current image and return its bytes."""
        return self.snapshotter.write(*self.state_machine.snapshot_state()).read_bytes()

    def load(self, data: bytes) -> None:
        """PySyncObj hands us a dump: on a restart our own log already covers it; a lagging
        follower that received the leader's installs it as its new starting point."""
        try:
            incoming = self.snapshotter.install(data, self.state_machine.image)
        except OSError as e:
            storage_failed("snapshot write", self.snapshotter.directory, e)
        if incoming is None:
            return
        self.state_machine.reset(incoming, self.snapshotter.request_ids)
        log.info(
            "installed snapshot at offset %d (raft index %d)", incoming.offset, incoming.raft_index
        )
        freeze_heap()
        self._on_applied()


def _error(code: ErrorCode, message: str) -> dict[str, Any]:
    return {"error_code": int(code), "error_message": message}
