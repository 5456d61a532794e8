"""A PySyncObj journal that is on disk before anything that depends on it leaves the node.

PySyncObj's ``FileJournal`` writes entries through an mmap and never syncs: a process crash
loses nothing, but an OS crash or power loss can lose entries a node has already acknowledged,
and then a "committed" entry may exist on fewer than a majority of disks. ``DurableJournal``
is a subclass of it (no fork of PySyncObj) and tracks whether anything was appended or truncated
since the last sync. ``start_sync()`` runs a sync on a thread of its own (the leader, after
sending an entry to its followers); ``sync()`` waits for it before anything depending on it. It reads the journal at start-up through PySyncObj's mmap, then writes it
with ``pwrite`` into zero-filled space (:class:`PwriteFile`: the same bytes at the same offsets,
so either can read what the other wrote). ``sync()`` fdatasyncs the journal file, releasing the
GIL (``mmap.flush`` holds it, so a sync used to freeze the node's trio thread for the length of
the disk write). The quorum calls ``sync()`` before the outgoing Raft messages that depend on
the journal (see ``raft._SyncingTransport`` and ``raft._sync_before_send``), so a follower's acknowledgement and a leader's replication request are always preceded by the
sync of the entries they cover. Group commit makes that one sync per batch of appends: all
entries appended in one tick go out behind a single sync, and repeated sends find nothing dirty.
``setCurrentTerm`` (term + vote, written by PySyncObj with write + rename) is fsynced as well.

With ``fsync=False`` nothing is synced (documented risk: an OS crash may lose acknowledged
entries; a process crash does not). ``journal_syncs`` counts real syncs for tests and metrics.

This module does not import pysyncobj (``raft.py`` is the only one that does): ``raft.py``
builds ``DurableJournal(DurableJournalMixin, FileJournal)`` and passes the module in.
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
from types import ModuleType
from typing import Any

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
    return factory(journalFile)  # type: ignore[arg-type]


def register_journal(syncobj_module: ModuleType, path: str, factory: Callable[[str], Any]) -> None:
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


def _fsync_path(path: str, directory: bool = False) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
        """Nothing to do: ``DurableJournalMixin.sync`` syncs the file."""

    def _destroy(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class DurableJournalMixin:
    """Mix in before PySyncObj's ``FileJournal`` (``raft.DurableJournal``): tracks appends and
    adds ``sync()``; every call happens inside a PySyncObj tick (the trio thread)."""

    # provided by FileJournal
    flush: Callable[[], None]
    __len__: Callable[[], int]
    __getitem__: Callable[[int], Any]

    def __init__(self, path: str, fsync: bool) -> None:
        self.fsync = fsync
        self.path = path
        self.journal_syncs = 0
        self.background_syncs = 0
        self.meta_syncs = 0
        self.synced_index = 0  # highest Raft index known to be on disk
        self._dirty = False
        # a sync running on the syncer thread (start_sync), and what it covers
        self._cond = threading.Condition()
        self._background_target: int | None = None  # index being synced in the background
        self._syncer: threading.Thread | None = None
        self._stopping = False
        super().__init__(path)  # type: ignore[call-arg]  (reads the journal through an mmap)
        if fsync:  # from here on: pwrite into zero-filled space (see PwriteFile)
            mapped = self._FileJournal__journalFile  # type: ignore[attr-defined]
            mapped._destroy()
            self._FileJournal__journalFile = PwriteFile(  # type: ignore[attr-defined]
                path, self._FileJournal__currentOffset
            )  # type: ignore[attr-defined]
        # PySyncObj never replaces the journal file (it resizes it in place), so one descriptor
        # of our own stays valid for syncing.
        self._sync_fd = os.open(path, os.O_RDONLY) if fsync else -1
        if len(self):
            self.synced_index = self[-1][1]
        if fsync:
            _fsync_path(os.path.dirname(os.path.abspath(path)) or ".", directory=True)

    # ---- writes mark the journal dirty --------------------------------------------------
    def add(self, command: bytes, idx: int, term: int) -> None:
        super().add(command, idx, term)  # type: ignore[misc]
        self._dirty = True

    def clear(self) -> None:
        self._wait_background()  # its index must not be claimed for what replaces it
        super().clear()  # type: ignore[misc]
        self._dirty = True
        self.synced_index = 0

    def deleteEntriesFrom(self, entryFrom: int) -> None:
        self._wait_background()
        super().deleteEntriesFrom(entryFrom)  # type: ignore[misc]
        self._dirty = True
        self.synced_index = min(self.synced_index, self[-1][1] if len(self) else 0)

    # deleteEntriesTo is clear() + add() in FileJournal: already covered.

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
        os.fdatasync(self._sync_fd)
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
                error: OSError | None = None
                self._cond.release()
                try:
                    os.fdatasync(self._sync_fd)  # releases the GIL
                except OSError as exc:
                    error = exc
                finally:
                    self._cond.acquire()
                if error is not None:
                    logger.error("journal sync failed: %s", error)
                    self._dirty = True  # the waiter syncs again itself (and sees the error)
                else:
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
        super().setCurrentTerm(term, votedForNodeId)  # type: ignore[misc]
        if self.fsync:
            meta = self.path + ".meta"
            _fsync_path(meta)
            _fsync_path(os.path.dirname(os.path.abspath(meta)) or ".", directory=True)
            self.meta_syncs += 1

    def _destroy(self) -> None:
        self.sync()
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._syncer is not None:
            self._syncer.join()
            self._syncer = None
        super()._destroy()  # type: ignore[misc]
        if self._sync_fd >= 0:
            os.close(self._sync_fd)
            self._sync_fd = -1
