"""The apply side of the quorum: committed Raft entries → state machine → metadata log.

:class:`MetadataApplier` is the ``ApplyTarget`` that ``RaftQuorum`` calls for every committed
entry; all of its methods run inside PySyncObj's ticks (the trio thread), one at a time. Each
entry holds a group of commands; each command is applied by the deterministic
:class:`QuorumStateMachine`, and the
batches an entry produces are appended to the metadata log together (one write), each with the
entry's Raft index and its command's position inside the entry.

Durability: the results go back to the waiting callers without syncing the metadata log. The
Raft journal is what makes an acknowledged command durable (``metadata.log.fsync=always``: it is
synced on a majority before the commit); the metadata log is derived from it deterministically,
is synced by the node every ``metadata.log.flush.interval.ms`` and before every snapshot, and a
tail lost to a power cut is re-derived from the journal on restart (the skip rules below).

Restart safety: PySyncObj re-applies its journal after a restart. Entries before the last one in
our log are skipped; the last one is re-applied only from the command after the last batch it
wrote, which reproduces exactly what a crash in the middle of that entry left unwritten (commands
after the last written batch were evaluated against the same state the first time).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

from kraft.controller.commands import Command
from kraft.controller.state_machine import QuorumStateMachine
from kraft.errors import ErrorCode
from kraft.heap import HeapFreezer, freeze_heap
from kraft.log.metadata_log import MetadataLog
from kraft.records import Batch
from kraft.snapshotter import Snapshotter

log = logging.getLogger(__name__)


class MetadataApplier:
    """Applies committed command groups; owns the state machine and the metadata log writes."""

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
        # Where our log stands in Raft terms: the entry of the last batch, and that batch's
        # position inside it. Entries up to last_raft_index - 1 are complete.
        self._last_raft_index = metadata_log.last_raft_index
        self._last_position = (
            metadata_log.last_raft_position if metadata_log.next_offset > 0 else -1
        )
        self.fatal_error: BaseException | None = None
        # Called between the commands of an entry (the quorum's heartbeat check: a long entry
        # must not starve the followers into an election).
        self.between_commands: Callable[[], None] = lambda: None
        # Commands this controller submitted, by their encoding, while their commit is awaited:
        # applying one of them takes the object instead of decoding the bytes (see
        # ControllerNode._submit: only commands whose body came off the wire, so the object is
        # exactly what decoding would give).
        self.own_commands: dict[bytes, Command] = {}
        # The image replayed so far (snapshot + log at start-up) leaves the cyclic GC's reach,
        # and so does every further 100k records' growth (kraft/heap.py).
        self._heap = HeapFreezer()
        freeze_heap()

    # ---- ApplyTarget --------------------------------------------------------------------------

    def last_applied_raft_index(self) -> int:
        """Entries at or below this index are fully reflected in our log (see module doc)."""
        return self._last_raft_index - 1 if self._last_raft_index > 0 else 0

    def apply_entry(self, raft_index: int, term: int, commands: list[bytes]) -> list[Any]:
        """Apply one committed entry's commands in order; return one response per command."""
        if self.fatal_error is not None:
            return [
                _error(ErrorCode.UNKNOWN_SERVER_ERROR, "controller has stopped applying")
            ] * len(commands)
        if raft_index < self._last_raft_index:
            return [None] * len(commands)
        skip_through = self._last_position if raft_index == self._last_raft_index else -1
        results: list[Any] = []
        written: list[tuple[bytes, Batch, bytes]] = []  # the entry's batches: one write
        try:
            try:
                for position, raw in enumerate(commands):
                    if position <= skip_through:
                        results.append(None)
                        continue
                    results.append(self._apply_one(raw, raft_index, term, position, written))
                    self.between_commands()
            finally:
                if written:
                    self.log.append_many(written)
                    self._last_raft_index = raft_index
                    self._last_position = written[-1][1].raft_position
        except BaseException as e:  # a record that fails to replay is a fatal fault
            self.fatal_error = e
            log.critical(
                "fatal: applying raft entry %d failed; this controller stops applying: %r",
                raft_index,
                e,
            )
            raise
        self._on_applied()
        return results

    def _apply_one(
        self,
        raw: bytes,
        raft_index: int,
        term: int,
        position: int,
        written: list[tuple[bytes, Batch, bytes]],
    ) -> Any:
        command = self.own_commands.pop(raw, None)
        if command is None:
            try:
                command = Command.decode(raw)
            except ValueError as e:
                return _error(ErrorCode.INVALID_REQUEST, f"undecodable command: {e}")
        batch, response = self.state_machine.apply(
            command, raft_index, term, raft_position=position
        )
        if batch is not None:  # the image's last hash is the hash of that encoding
            encoded = self.state_machine.last_encoded
            assert encoded is not None  # apply() sets it with every batch it returns
            written.append((encoded, batch, self.state_machine.image.last_hash))
            self._heap.note(len(batch.records))
        return response

    def dump(self) -> bytes:
        """PySyncObj compaction: write a snapshot of the current image and return its bytes."""
        return self.snapshotter.write(*self.state_machine.snapshot_state()).read_bytes()

    def load(self, data: bytes) -> None:
        """PySyncObj hands us a dump: on a restart our own log already covers it; a lagging
        follower that received the leader's installs it as its new starting point."""
        incoming = self.snapshotter.install(data, self.state_machine.image)
        if incoming is None:
            return
        self.state_machine.reset(incoming, self.snapshotter.request_ids)
        # Everything up to the snapshot's last batch is in it; PySyncObj continues after the dump.
        self._last_raft_index, self._last_position = incoming.raft_index, sys.maxsize
        log.info(
            "installed snapshot at offset %d (raft index %d)", incoming.offset, incoming.raft_index
        )
        freeze_heap()
        self._on_applied()


def _error(code: ErrorCode, message: str) -> dict[str, Any]:
    return {"error_code": int(code), "error_message": message}
