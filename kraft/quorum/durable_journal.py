"""A PySyncObj journal that is on disk, checksummed, before anything depending on it leaves.

PySyncObj's ``FileJournal`` writes entries through an mmap, never syncs and has no checksums.
:class:`DurableJournal` implements the same journal interface over pykraft's own format
(:mod:`kraft.quorum.journal_file`: a CRC32C per entry and on the term/vote file; a v1 journal
of PySyncObj's is read once and rewritten), written with ``pwrite`` into zero-filled space
(:class:`PwriteFile`). It tracks whether anything was appended or truncated since the last
sync. ``start_sync()`` runs a sync on a thread of its own (the leader, after sending an entry
to its followers); ``sync()`` waits for it before anything depending on it. ``sync()``
fdatasyncs the journal file, releasing the GIL. The quorum calls ``sync()`` before the outgoing
Raft messages that depend on the journal (see ``raft._SyncingTransport`` and
``raft._sync_before_send``), so a follower's acknowledgement and a leader's replication request
are always preceded by the sync of the entries they cover. Group commit makes that one sync per
batch of appends. ``setCurrentTerm`` (term + vote: write, fsync, rename, directory fsync) is
durable before it returns.

A write or sync error stops the node at once (:mod:`kraft.storage.failure`): a failed fsync is
never retried, and a node that cannot persist must not vote or acknowledge.

With ``fsync=False`` nothing is synced (documented risk: an OS crash may lose acknowledged
entries; a process crash does not). ``journal_syncs`` counts real syncs for tests and metrics.

This module does not import pysyncobj (``raft.py`` is the only one that does).
PySyncObj creates its journal with the module-level ``pysyncobj.syncobj.createJournal``.
``register_journal(path, factory)`` installs, once, a dispatcher in its place that builds our
journal for the registered path (one registration per constructed ``SyncObj``) and leaves any
other ``SyncObj`` in the process with PySyncObj's own journal.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Any, cast

from kraft.quorum import journal_file as jf
from kraft.storage.failure import storage_failed

logger = logging.getLogger(__name__)

_registry: dict[str, Callable[[str], Any]] = {}
_registry_lock = threading.Lock()
_original_create_journal: Callable[..., Any] | None = None


def _create_journal(journalFile: str | None = None) -> Any:
    with _registry_lock:
        factory = _registry.pop(journalFile, None) if journalFile is not None else None
    if factory is None:
        assert _original_create_journal is not None
        return _original_create_journal(journalFile)
    return factory(cast(str, journalFile))  # a factory is found only for a str


def register_journal(syncobj_module: Any, path: str, factory: Callable[[str], Any]) -> None:
    """Make the next ``SyncObj`` constructed with ``journalFile=path`` use ``factory(path)``.
    ``syncobj_module`` is ``pysyncobj.syncobj`` (passed in: only ``raft.py`` imports pysyncobj)."""
    global _original_create_journal
    with _registry_lock:
        _registry[path] = factory
        current = syncobj_module.createJournal
        if current is not _create_journal:
            _original_create_journal = current
            syncobj_module.createJournal = _create_journal


def unregister_journal(path: str) -> None:
    """Drop an unused registration (construction failed before the journal was created)."""
    with _registry_lock:
        _registry.pop(path, None)


class PwriteFile:
    """The journal's file written with ``pwrite`` into space that was zero-filled beforehand,
    in place of PySyncObj's mmap (same bytes at the same offsets: a journal written by either
    reads back with the other).

    Through the mmap, every entry written after a sync write-faults its page again, and entries
    land in sparse space, so each ``fdatasync`` also commits block allocations to the ext4
    journal. Here the space ahead of the writes is real zeros, written ``GROW_BYTES`` at a time:
    a sync writes only the entry's data and the header page."""

    GROW_BYTES = 8 << 20
    _ZEROS = bytes(1 << 20)

    def __init__(self, path: str, fill_from: int) -> None:
        self._fd = os.open(path, os.O_RDWR)
        self._filled = 0
        self._fill(fill_from, max(os.fstat(self._fd).st_size, fill_from + self.GROW_BYTES))

    def _fill(self, start: int, end: int) -> None:
        """Write zeros over the holes of [start, end); ``start`` is at or past the last entry,
        so nothing there is data the journal needs, and allocated blocks are left alone."""
        fd = self._fd
        size = os.fstat(fd).st_size
        pos = start
        while pos < end:
            if pos >= size:
                hole, data = pos, end
            else:
                try:
                    hole = os.lseek(fd, pos, os.SEEK_HOLE)  # == size when no hole before the end
                except OSError:  # no SEEK_HOLE on this file system: fill everything
                    hole, data = pos, end
                else:
                    if hole >= end:
                        break
                    try:
                        data = os.lseek(fd, hole, os.SEEK_DATA)
                    except OSError:  # ENXIO: holes only, up to the end of the file
                        data = end
            stop = min(max(data, hole + 1), end)
            while hole < stop:
                n = min(len(self._ZEROS), stop - hole)
                os.pwrite(fd, self._ZEROS[:n], hole)
                hole += n
            pos = stop
        self._filled = max(self._filled, end)

    def write(self, offset: int, values: bytes) -> None:
        end = offset + len(values)
        if end > self._filled:
            self._fill(self._filled, max(end, self._filled + self.GROW_BYTES))
        os.pwrite(self._fd, values, offset)

    def read(self, offset: int, size: int) -> bytes:
        return os.pread(self._fd, size, offset)

    def flush(self) -> None:
        """Nothing to do: ``DurableJournal.sync`` syncs the file."""

    def _destroy(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class DurableJournal:
    """PySyncObj's journal interface over the checksummed format of :mod:`journal_file`, with
    ``sync()``/``start_sync()``; every call happens inside a PySyncObj tick (the trio thread).
    Any write or sync error stops the node (:func:`~kraft.storage.failure.storage_failed`)."""

    def __init__(self, path: str, fsync: bool) -> None:
        self.fsync = fsync
        self.path = path
        self.journal_syncs = 0
        self.background_syncs = 0
        self.meta_syncs = 0
        self.synced_index = 0  # highest Raft index known to be on disk
        self.upgraded = False  # read a v1 (PySyncObj) journal or meta file and rewrote it
        self.truncated_torn_tail: jf.TornTail | None = None  # dropped on load (a crash's append)
        self._dirty = False
        # a sync running on the syncer thread (start_sync), and what it covers
        self._cond = threading.Condition()
        self._background_target: int | None = None  # index being synced in the background
        self._syncer: threading.Thread | None = None
        self._stopping = False
        self._entries, self._offsets, self._end = self._load()
        self._meta, old_meta = jf.read_meta(path + ".meta")
        if self.truncated_torn_tail is not None:  # a commit index past the journal's new end
            last = self._entries[-1][1] if self._entries else 1
            if int(self._meta.get("raftCommitIndex", 1)) > last:
                self._meta["raftCommitIndex"] = last
        if old_meta:
            self._store_meta()
            self.upgraded = True
        self._meta_saved = True
        self._file = PwriteFile(path, self._end)
        self._sync_fd = os.open(path, os.O_RDONLY) if fsync else -1
        if self._entries:
            self.synced_index = self._entries[-1][1]

    def _load(self) -> tuple[list[tuple[bytes, int, int]], list[int], int]:
        """Read (and verify) the journal; create an empty one, or rewrite a v1 one, first."""
        path = self.path
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            data = b""
        if not data or jf.is_v1(data):
            entries = jf.read_v1_entries(path, data) if data else []
            if data:
                logger.warning(
                    "raft journal %s is in PySyncObj's format (no checksums): rewriting its "
                    "%d entries in pykraft's v2 format",
                    path,
                    len(entries),
                )
                self.upgraded = True
            self._guard(
                "raft journal write",
                lambda: jf.write_file_atomically(path, jf.new_journal_bytes(entries), self.fsync),
            )
            with open(path, "rb") as f:
                data = f.read()
        elif data[:8] != jf.JOURNAL_MAGIC:
            raise jf.JournalCorruptError(path, 0, None, f"not a raft journal (magic {data[:8]!r})")
        entries, offsets, end, torn = jf.read_entries_repairing(path, data)
        if torn is not None:
            self._drop_torn_tail(entries, end, torn)
        return entries, offsets, end

    def _drop_torn_tail(
        self, entries: list[tuple[bytes, int, int]], end: int, torn: jf.TornTail
    ) -> None:
        """Make the last whole entry the journal's end, on disk, before anything else."""
        last = f"raft index {entries[-1][1]}" if entries else "no entries left"
        logger.warning(
            "raft journal %s: its last entry (#%d at byte %d) is torn (%s), an append cut short "
            "by a crash: truncated back to the last whole entry (%s). It was never synced, so "
            "this node never acknowledged it; the leader sends it again if it was committed",
            self.path,
            torn.entry,
            torn.position,
            torn.reason,
            last,
        )
        self.truncated_torn_tail = torn

        def write_end() -> None:
            fd = os.open(self.path, os.O_WRONLY)
            try:
                os.pwrite(fd, jf.end_offset_bytes(end), jf.END_AT)
                if self.fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)

        self._guard("raft journal write", write_end)

    def _guard(self, what: str, action: Callable[[], Any]) -> Any:
        try:
            return action()
        except OSError as exc:
            storage_failed(what, self.path, exc)

    # ---- PySyncObj's journal interface ----------------------------------------------------
    def __len__(self) -> int:
        return len(self._entries)

    def __getitem__(self, item: Any) -> Any:
        return self._entries[item]

    def add(self, command: bytes, idx: int, term: int) -> None:
        record = jf.encode_entry(command, idx, term)
        offset = self._end
        end = offset + len(record)
        try:
            self._file.write(offset, record)
            self._file.write(jf.END_AT, jf.end_offset_bytes(end))
        except OSError as exc:
            storage_failed("raft journal write", self.path, exc)
        self._entries.append((command, idx, term))
        self._offsets.append(offset)
        self._end = end
        self._dirty = True

    def _set_end(self, end: int) -> None:
        self._guard(
            "raft journal write", lambda: self._file.write(jf.END_AT, jf.end_offset_bytes(end))
        )
        self._end = end

    def clear(self) -> None:
        self._wait_background()  # its index must not be claimed for what replaces it
        self._set_end(jf.FIRST_ENTRY)
        self._entries, self._offsets = [], []
        self._dirty = True
        self.synced_index = 0

    def deleteEntriesFrom(self, entryFrom: int) -> None:
        self._wait_background()
        if entryFrom >= len(self._entries):
            return
        self._set_end(self._offsets[entryFrom] if entryFrom >= 0 else jf.FIRST_ENTRY)
        del self._entries[entryFrom:]
        del self._offsets[entryFrom:]
        self._dirty = True
        self.synced_index = min(self.synced_index, self[-1][1] if len(self) else 0)

    def deleteEntriesTo(self, entryTo: int) -> None:
        kept = self._entries[entryTo:]
        self.clear()
        for entry in kept:
            self.add(*entry)

    def flush(self) -> None:
        self.sync()

    def setRaftCommitIndex(self, raftCommitIndex: int) -> None:
        self._meta["raftCommitIndex"] = raftCommitIndex
        self._meta_saved = False

    def getRaftCommitIndex(self) -> int:
        return int(self._meta.get("raftCommitIndex", 1))

    def getCurrentTerm(self) -> int:
        return int(self._meta.get("currentTerm", 0))

    def getVotedForNodeId(self) -> Any:
        return self._meta.get("votedForNodeId")

    def onOneSecondTimer(self) -> None:
        if not self._meta_saved:
            self._store_meta(sync=False)  # the commit index is a hint: no sync needed

    def _store_meta(self, sync: bool = True) -> None:
        data = jf.meta_bytes(self._meta)
        self._guard(
            "raft term/vote write",
            lambda: jf.write_file_atomically(self.path + ".meta", data, self.fsync and sync),
        )
        self._meta_saved = True

    # ---- durability ------------------------------------------------------------------------
    @property
    def dirty(self) -> bool:
        return self._dirty

    def sync(self) -> bool:
        """Flush appended entries to disk if any (after a background sync still running, if
        any, has finished); return True if a sync happened here."""
        if self._background_target is not None:
            self._wait_background()
        if not self._dirty:
            return False
        self._dirty = False
        if not self.fsync:
            return False
        self._guard("raft journal sync", lambda: os.fdatasync(self._sync_fd))
        self.journal_syncs += 1
        self.synced_index = self[-1][1] if len(self) else 0
        return True

    def start_sync(self) -> None:
        """Start syncing what was appended so far on the syncer thread and return at once (the
        leader, right after sending an entry to its followers: its own write overlaps theirs
        without holding up the thread that serves requests). ``sync()`` waits for it."""
        if not self.fsync:
            self._dirty = False
            return
        if not self._dirty:
            return
        if self._background_target is not None:
            return  # the running one is waited for, then ``sync()`` covers the rest
        self._dirty = False
        target = self[-1][1] if len(self) else 0
        with self._cond:
            self._background_target = target
            if self._syncer is None:
                self._syncer = threading.Thread(
                    target=self._sync_loop, name="journal-sync", daemon=True
                )
                self._syncer.start()
            self._cond.notify_all()

    def _sync_loop(self) -> None:  # the syncer thread
        with self._cond:
            while not self._stopping:
                target = self._background_target
                if target is None:
                    self._cond.wait()
                    continue
                self._cond.release()
                try:
                    os.fdatasync(self._sync_fd)  # releases the GIL
                except OSError as exc:  # never retried: the pages may already be dropped
                    storage_failed("raft journal sync", self.path, exc)
                finally:
                    self._cond.acquire()
                self.journal_syncs += 1
                self.background_syncs += 1
                self.synced_index = max(self.synced_index, target)
                self._background_target = None
                self._cond.notify_all()

    def _wait_background(self) -> None:
        with self._cond:
            while self._background_target is not None:
                self._cond.wait()

    def setCurrentTerm(self, term: int, votedForNodeId: object) -> None:
        """Term and vote are on disk (synced, renamed, directory synced) before any message
        reflecting them leaves: Raft requires it."""
        self._meta["currentTerm"] = term
        self._meta["votedForNodeId"] = votedForNodeId
        self._store_meta()
        if self.fsync:
            self.meta_syncs += 1

    def _destroy(self) -> None:
        self.sync()
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._syncer is not None:
            self._syncer.join()
            self._syncer = None
        if not self._meta_saved:
            self._store_meta(sync=False)
        self._file._destroy()
        if self._sync_fd >= 0:
            os.close(self._sync_fd)
            self._sync_fd = -1
