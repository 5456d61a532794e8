"""A PySyncObj journal that is on disk before anything that depends on it leaves the node.

PySyncObj's ``FileJournal`` writes entries through an mmap and never syncs: a process crash
loses nothing, but an OS crash or power loss can lose entries a node has already acknowledged,
and then a "committed" entry may exist on fewer than a majority of disks. ``DurableJournal``
is a subclass of it (no fork of PySyncObj) and tracks whether anything was appended or truncated
since the last sync; ``sync()`` fdatasyncs the journal file, which writes back the pages dirtied
through the mapping just as ``msync(MS_SYNC)`` would, but releases the GIL (``mmap.flush`` holds
it, so every sync used to freeze the node's trio thread for the length of the disk write). The
quorum calls ``sync()`` right before every outgoing Raft message (see ``raft._SyncingTransport``),
so a follower's acknowledgement and a leader's replication request are always preceded by the
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
from types import ModuleType
from typing import Any, Callable

logger = logging.getLogger(__name__)

_registry: dict[str, Callable[[str], Any]] = {}
_registry_lock = threading.Lock()
_original_create_journal: Callable[..., Any] | None = None


def _create_journal(journalFile: str | None = None) -> Any:  # noqa: N803 (PySyncObj's name)
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


class DurableJournalMixin:
    """Mix in before PySyncObj's ``FileJournal`` (``raft.DurableJournal``): tracks appends and
    adds ``sync()``; every call happens on PySyncObj's tick thread."""

    # provided by FileJournal
    flush: Callable[[], None]
    __len__: Callable[[], int]
    __getitem__: Callable[[int], Any]

    def __init__(self, path: str, fsync: bool) -> None:
        self.fsync = fsync
        self.path = path
        self.journal_syncs = 0
        self.meta_syncs = 0
        self.synced_index = 0  # highest Raft index known to be on disk
        self._dirty = False
        super().__init__(path)  # type: ignore[call-arg]
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
        super().clear()  # type: ignore[misc]
        self._dirty = True
        self.synced_index = 0

    def deleteEntriesFrom(self, entryFrom: int) -> None:  # noqa: N802,N803
        super().deleteEntriesFrom(entryFrom)  # type: ignore[misc]
        self._dirty = True
        self.synced_index = min(self.synced_index, self[-1][1] if len(self) else 0)

    # deleteEntriesTo is clear() + add() in FileJournal: already covered.

    @property
    def dirty(self) -> bool:
        return self._dirty

    def sync(self) -> bool:
        """Flush appended entries to disk if any; return True if a sync happened."""
        if not self._dirty:
            return False
        self._dirty = False
        if not self.fsync:
            return False
        os.fdatasync(self._sync_fd)
        self.journal_syncs += 1
        self.synced_index = self[-1][1] if len(self) else 0
        return True

    def setCurrentTerm(self, term: int, votedForNodeId: object) -> None:  # noqa: N802,N803
        super().setCurrentTerm(term, votedForNodeId)  # type: ignore[misc]
        if self.fsync:
            meta = self.path + ".meta"
            _fsync_path(meta)
            _fsync_path(os.path.dirname(os.path.abspath(meta)) or ".", directory=True)
            self.meta_syncs += 1

    def _destroy(self) -> None:
        self.sync()
        super()._destroy()  # type: ignore[misc]
        if self._sync_fd >= 0:
            os.close(self._sync_fd)
            self._sync_fd = -1
