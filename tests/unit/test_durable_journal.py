"""The Raft journal's file: pwrite into zero-filled space, readable by PySyncObj's own journal."""

from __future__ import annotations

import os
from pathlib import Path

from kraft.quorum.durable_journal import PwriteFile
from kraft.quorum.raft import DurableJournal, FileJournal  # PySyncObj's own journal


def _entries(n: int, start: int = 1) -> list[tuple[bytes, int, int]]:
    return [(os.urandom(50 + i % 700), start + i, 1 + i // 100) for i in range(n)]


def test_journal_round_trips_through_pysyncobj_and_back(tmp_path: Path) -> None:
    path = str(tmp_path / "journal.bin")
    first = _entries(3000)  # > 2 MiB: grows past the first zero-filled stretch
    journal = DurableJournal(path, fsync=True)
    for entry in first:
        journal.add(*entry)
    assert journal.sync()
    journal._destroy()

    plain = FileJournal(path)  # PySyncObj's mmap journal reads what we wrote
    assert [plain[i] for i in range(len(plain))] == first
    more = _entries(10, start=3001)
    for entry in more:
        plain.add(*entry)
    plain._destroy()

    reopened = DurableJournal(path, fsync=True)  # and we read what it appended
    assert [reopened[i] for i in range(len(reopened))] == first + more
    reopened.deleteEntriesFrom(2000)
    reopened.add(b"after truncation", 2001, 99)
    reopened.sync()
    reopened._destroy()
    final = FileJournal(path)
    assert [final[i] for i in range(len(final))] == first[:2000] + [(b"after truncation", 2001, 99)]
    final._destroy()


def test_space_ahead_is_zero_filled_without_touching_data(tmp_path: Path) -> None:
    path = tmp_path / "file"
    with open(path, "wb") as f:
        f.write(b"D" * 5000)
        f.truncate(3 << 20)  # a sparse tail, as PySyncObj's mmap journal leaves it
    pf = PwriteFile(str(path), fill_from=5000)
    try:
        size = os.fstat(pf._fd).st_size
        assert size >= 5000 + PwriteFile.GROW_BYTES
        assert os.lseek(pf._fd, 0, os.SEEK_HOLE) == size  # no hole left before the end
        assert pf.read(0, 5000) == b"D" * 5000
        assert pf.read(5000, 4096) == bytes(4096)
        end = size
        pf.write(end - 3, b"xyzuvw")  # crossing the filled end grows the filled space
        assert os.fstat(pf._fd).st_size >= end + PwriteFile.GROW_BYTES
        assert pf.read(end - 3, 6) == b"xyzuvw"
        assert os.lseek(pf._fd, 0, os.SEEK_HOLE) == os.fstat(pf._fd).st_size
    finally:
        pf._destroy()


def test_unsynced_journal_keeps_pysyncobjs_mmap(tmp_path: Path) -> None:
    journal = DurableJournal(str(tmp_path / "j"), fsync=False)
    try:
        assert not isinstance(journal._FileJournal__journalFile, PwriteFile)
        journal.add(b"x", 1, 1)
        assert journal[0] == (b"x", 1, 1)
    finally:
        journal._destroy()


def test_a_background_sync_is_waited_for_and_the_rest_synced_after_it(tmp_path: Path) -> None:
    """start_sync() syncs on the syncer thread; sync() waits for it, then syncs what came after;
    a truncation waits for it too (its index must not be claimed for replaced entries)."""
    import time

    journal = DurableJournal(str(tmp_path / "journal.bin"), fsync=True)
    try:
        entries = _entries(20)
        for entry in entries[:10]:
            journal.add(*entry)
        journal.start_sync()
        journal.start_sync()  # one at a time: nothing new to start
        for entry in entries[10:]:
            journal.add(*entry)
        assert journal.sync()  # waited for the background one, then synced entries 11..20
        assert journal.synced_index == 20 and journal.journal_syncs == 2
        assert journal.background_syncs == 1
        assert not journal.sync()  # nothing dirty
        journal.add(b"x", 21, 1)
        journal.start_sync()
        deadline = time.monotonic() + 10
        while journal.synced_index < 21 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert journal.synced_index == 21 and journal.background_syncs == 2
        journal.add(b"y", 22, 1)
        journal.start_sync()
        journal.deleteEntriesFrom(20)  # (a list position) waits for the sync of 22, truncates
        assert journal.synced_index == 20 and len(journal) == 20 and journal[-1][1] == 20
    finally:
        journal._destroy()
    assert journal._syncer is None  # the syncer thread is stopped with the journal


def test_without_fsync_start_sync_syncs_nothing(tmp_path: Path) -> None:
    journal = DurableJournal(str(tmp_path / "journal.bin"), fsync=False)
    try:
        journal.add(b"a", 1, 1)
        journal.start_sync()
        assert journal._syncer is None and journal.journal_syncs == 0 and not journal.dirty
    finally:
        journal._destroy()
