"""A torn last Raft journal entry (an append cut short by a crash) is dropped on start with a
warning; damage followed by a whole entry is still refused."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from kraft.quorum import journal_file as jf
from kraft.quorum.durable_journal import DurableJournal


def _journal(tmp_path: Path, n: int = 20) -> tuple[str, list[tuple[bytes, int, int]], list[int]]:
    path = str(tmp_path / "journal.bin")
    entries = [(os.urandom(40 + i * 7), 1 + i, 2) for i in range(n)]
    journal = DurableJournal(path, fsync=True)
    for entry in entries:
        journal.add(*entry)
    journal.setCurrentTerm(2, None)
    journal.setRaftCommitIndex(n)
    journal.onOneSecondTimer()
    offsets = list(journal._offsets)
    journal._destroy()
    return path, entries, offsets


def _write(path: str, position: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(position)
        f.write(data)


def _end_of(path: str) -> int:
    with open(path, "rb") as f:
        return jf.read_entries(path, f.read())[2]


def _reopen_and_check(path: str, kept: list[tuple[bytes, int, int]]) -> DurableJournal:
    journal = DurableJournal(path, fsync=True)
    assert [journal[i] for i in range(len(journal))] == kept
    assert journal.getRaftCommitIndex() <= kept[-1][1]
    return journal


@pytest.mark.parametrize("damage", ["zeroed body", "zeroed entry", "cut header", "flipped crc"])
def test_a_torn_last_entry_is_truncated_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: str
) -> None:
    path, entries, offsets = _journal(tmp_path)
    last = offsets[-1]
    end = _end_of(path)
    if damage == "zeroed body":  # the entry's pages never reached the disk past its header
        _write(path, last + 8 + 16, bytes(end - last - 24))
    elif damage == "zeroed entry":
        _write(path, last, bytes(end - last))
    elif damage == "cut header":  # the length reached the disk, not the checksum or body
        _write(path, last + 4, bytes(end - last - 4))
    else:
        _write(path, last + 4, b"\xff\xff\xff\xff")
    with caplog.at_level(logging.WARNING, logger="kraft.quorum.durable_journal"):
        journal = _reopen_and_check(path, entries[:-1])
    assert journal.truncated_torn_tail is not None
    assert journal.truncated_torn_tail.entry == len(entries) - 1
    assert journal.truncated_torn_tail.position == last
    assert f"last entry (#{len(entries) - 1} at byte {last}) is torn" in caplog.text
    assert "truncated back to the last whole entry (raft index 19)" in caplog.text
    journal.add(b"next", 20, 3)  # appends go on where the torn entry was
    journal.sync()
    journal._destroy()
    again = _reopen_and_check(path, [*entries[:-1], (b"next", 20, 3)])
    assert again.truncated_torn_tail is None  # the header was rewritten: nothing torn now
    again._destroy()


def test_a_file_shorter_than_its_end_offset_is_cut_to_the_last_whole_entry(
    tmp_path: Path,
) -> None:
    path, entries, offsets = _journal(tmp_path)
    os.truncate(path, offsets[-1] + 10)  # the file never grew past the middle of the entry
    journal = _reopen_and_check(path, entries[:-1])
    assert journal.truncated_torn_tail is not None
    journal._destroy()
    os.truncate(path, offsets[-2])  # cut exactly between two entries, the end offset beyond
    journal = _reopen_and_check(path, entries[:-2])
    assert journal.truncated_torn_tail is not None
    assert "past the end of the file" in journal.truncated_torn_tail.reason
    journal._destroy()


def test_damage_followed_by_a_whole_entry_is_still_refused(tmp_path: Path) -> None:
    path, entries, offsets = _journal(tmp_path)
    _write(path, offsets[-2] + 8 + 16, b"\x00\x01")  # the next-to-last entry's command
    with pytest.raises(jf.JournalCorruptError, match=f"entry #{len(entries) - 2}"):
        DurableJournal(path, fsync=True)
    with open(path, "rb") as f:  # and nothing was rewritten
        with pytest.raises(jf.JournalCorruptError):
            jf.read_entries(path, f.read())


def test_a_zeroed_entry_in_the_middle_is_refused(tmp_path: Path) -> None:
    path, entries, offsets = _journal(tmp_path)
    _write(path, offsets[5], bytes(offsets[6] - offsets[5]))
    with pytest.raises(jf.JournalCorruptError, match="entry #5"):
        DurableJournal(path, fsync=True)


def test_a_whole_last_entry_with_the_wrong_index_is_refused(tmp_path: Path) -> None:
    path, entries, offsets = _journal(tmp_path)
    _write(path, offsets[-1], jf.encode_entry(entries[-1][0], 99, 2))  # same size, index 99
    with pytest.raises(jf.JournalCorruptError, match="raft index 99 does not follow 19"):
        DurableJournal(path, fsync=True)


def test_the_commit_index_is_clamped_to_the_truncated_journal(tmp_path: Path) -> None:
    path, entries, offsets = _journal(tmp_path)
    journal = DurableJournal(path, fsync=True)
    assert journal.getRaftCommitIndex() == 20
    journal._destroy()
    _write(path, offsets[-1], bytes(8))
    journal = _reopen_and_check(path, entries[:-1])
    assert journal.getRaftCommitIndex() == 19
    journal._destroy()


def test_without_repair_a_torn_tail_is_refused(tmp_path: Path) -> None:
    """``read_entries`` (the log tools, recover checks) reports the damage as it is."""
    path, entries, offsets = _journal(tmp_path)
    _write(path, offsets[-1], bytes(8))
    with open(path, "rb") as f:
        data = f.read()
    with pytest.raises(jf.JournalCorruptError, match=f"entry #{len(entries) - 1}"):
        jf.read_entries(path, data)
    kept, _, end, torn = jf.read_entries_repairing(path, data)
    assert kept == entries[:-1] and end == offsets[-1] and torn is not None
