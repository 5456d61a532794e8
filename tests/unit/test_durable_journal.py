"""The Raft journal: checksummed entries and term/vote, pwrite into zero-filled space, v1 read."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kraft.quorum import journal_file as jf
from kraft.quorum.durable_journal import PwriteFile
from kraft.quorum.raft import DurableJournal, FileJournal  # PySyncObj's own journal
from kraft.storage import failure


def _entries(n: int, start: int = 1) -> list[tuple[bytes, int, int]]:
    return [(os.urandom(50 + i % 700), start + i, 1 + i // 100) for i in range(n)]


def test_journal_round_trips_truncates_and_reopens(tmp_path: Path) -> None:
    path = str(tmp_path / "journal.bin")
    first = _entries(3000)  # > 2 MiB: grows past the first zero-filled stretch
    journal = DurableJournal(path, fsync=True)
    for entry in first:
        journal.add(*entry)
    assert journal.sync()
    journal._destroy()

    reopened = DurableJournal(path, fsync=True)
    assert [reopened[i] for i in range(len(reopened))] == first
    reopened.deleteEntriesFrom(2000)
    reopened.add(b"after truncation", 2001, 99)
    reopened.sync()
    reopened._destroy()
    final = DurableJournal(path, fsync=False)
    assert [final[i] for i in range(len(final))] == first[:2000] + [(b"after truncation", 2001, 99)]
    final.deleteEntriesTo(1990)  # PySyncObj's compaction: keep the tail
    assert final[0][1] == 1991 and len(final) == 11
    final._destroy()
    assert [e[1] for e in DurableJournal(path, fsync=False)._entries] == list(range(1991, 2002))


def test_a_v1_journal_and_meta_of_pysyncobj_are_read_and_rewritten(tmp_path: Path) -> None:
    """Old format still readable: PySyncObj's own FileJournal (v1, no checksums) is converted."""
    path = str(tmp_path / "journal.bin")
    old = _entries(500)
    plain = FileJournal(path)
    for entry in old:
        plain.add(*entry)
    plain.setCurrentTerm(7, "127.0.0.1:9001")
    plain._destroy()
    journal = DurableJournal(path, fsync=True)
    try:
        assert journal.upgraded
        assert [journal[i] for i in range(len(journal))] == old
        assert journal.getCurrentTerm() == 7 and journal.getVotedForNodeId() == "127.0.0.1:9001"
        journal.add(b"new", 501, 7)
        journal.sync()
    finally:
        journal._destroy()
    with open(path, "rb") as f:
        assert f.read(8) == jf.JOURNAL_MAGIC
    again = DurableJournal(path, fsync=True)
    try:
        assert not again.upgraded and len(again) == 501 and again[-1] == (b"new", 501, 7)
        assert again.getCurrentTerm() == 7
    finally:
        again._destroy()


def _journal_with(tmp_path: Path, n: int) -> tuple[str, list[int]]:
    path = str(tmp_path / "journal.bin")
    journal = DurableJournal(path, fsync=True)
    for entry in _entries(n):
        journal.add(*entry)
    journal.setCurrentTerm(3, "127.0.0.1:9002")
    offsets = list(journal._offsets)
    journal._destroy()
    return path, offsets


def _flip(path: str, position: int) -> None:
    with open(path, "r+b") as f:
        f.seek(position)
        byte = f.read(1)[0]
        f.seek(position)
        f.write(bytes([byte ^ 0x01]))


def test_a_flipped_byte_in_an_entry_is_refused_naming_file_position_and_entry(
    tmp_path: Path,
) -> None:
    path, offsets = _journal_with(tmp_path, 50)
    _flip(path, offsets[17] + 30)  # inside entry #17's command
    with pytest.raises(jf.JournalCorruptError) as err:
        DurableJournal(path, fsync=True)
    e = err.value
    assert e.path == path and e.position == offsets[17] and e.entry == 17
    assert "checksum mismatch" in str(e) and "kraft storage recover" in str(e)
    assert str(offsets[17]) in str(e) and path in str(e)


def test_a_flipped_byte_in_the_term_or_the_header_is_refused(tmp_path: Path) -> None:
    path, offsets = _journal_with(tmp_path, 5)
    _flip(path, offsets[0] + 4 + 8 + 3)  # entry #0's term: a different term, caught
    with pytest.raises(jf.JournalCorruptError, match="entry #0"):
        DurableJournal(path, fsync=True)
    _flip(path, offsets[0] + 4 + 8 + 3)  # restored
    DurableJournal(path, fsync=False)._destroy()
    _flip(path, 8 + 8 + 2)  # the end offset in the header
    with pytest.raises(jf.JournalCorruptError, match="header"):
        DurableJournal(path, fsync=True)


def test_a_flipped_byte_in_the_term_vote_file_is_refused(tmp_path: Path) -> None:
    path, _ = _journal_with(tmp_path, 3)
    meta = path + ".meta"
    assert DurableJournal(path, fsync=False).getCurrentTerm() == 3
    _flip(meta, os.path.getsize(meta) - 2)
    with pytest.raises(jf.JournalCorruptError, match="term/vote checksum mismatch"):
        DurableJournal(path, fsync=True)


def test_a_write_error_stops_the_node(tmp_path: Path) -> None:
    """ENOSPC (or any I/O error) on an append goes to the storage failure handler."""
    failures: list[str] = []

    def record(message: str) -> None:
        failures.append(message)
        raise failure.StorageFailure(message)

    journal = DurableJournal(str(tmp_path / "journal.bin"), fsync=True)
    failure.set_failure_handler(record)
    try:
        os.close(journal._file._fd)  # every further write fails with EBADF
        with pytest.raises(failure.StorageFailure):
            journal.add(b"x", 1, 1)
        assert len(journal) == 0 and "raft journal write failed" in failures[0]
    finally:
        failure.set_failure_handler(None)
        journal._file._fd = -1
        os.close(journal._sync_fd)


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


def test_unsynced_journal_writes_the_same_format(tmp_path: Path) -> None:
    journal = DurableJournal(str(tmp_path / "j"), fsync=False)
    try:
        assert isinstance(journal._file, PwriteFile)
        journal.add(b"x", 1, 1)
        assert journal[0] == (b"x", 1, 1)
    finally:
        journal._destroy()
    assert DurableJournal(str(tmp_path / "j"), fsync=False)[0] == (b"x", 1, 1)


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
