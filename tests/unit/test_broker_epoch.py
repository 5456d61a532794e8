"""``broker.broker_epoch``: the epoch a broker's log dirs prove, or -1 whenever they prove
nothing (a missing, unreadable or malformed file, dirs that disagree, no dirs)."""

from __future__ import annotations

from pathlib import Path

from broker.broker_epoch import EPOCH_FILE, read_previous_epoch, write_epoch


def test_written_epochs_read_back_from_every_dir(tmp_path: Path) -> None:
    dirs = [tmp_path / "a", tmp_path / "b"]
    for d in dirs:
        d.mkdir()
    assert read_previous_epoch(dirs) == -1  # never registered
    assert write_epoch(dirs, 42)
    assert read_previous_epoch(dirs) == 42
    assert write_epoch(dirs, 57) and read_previous_epoch(dirs) == 57
    assert not list(tmp_path.glob("*/*.tmp"))


def test_dirs_that_prove_nothing_give_minus_one(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    write_epoch([a, b], 42)
    (b / EPOCH_FILE).unlink()  # b wiped and re-formatted
    assert read_previous_epoch([a, b]) == -1
    write_epoch([b], 41)  # b restored from an older copy
    assert read_previous_epoch([a, b]) == -1
    (b / EPOCH_FILE).write_text("forty-two\n")
    assert read_previous_epoch([a, b]) == -1
    (b / EPOCH_FILE).write_bytes(b"\xff\xfe")
    assert read_previous_epoch([a, b]) == -1
    assert read_previous_epoch([]) == -1
    assert read_previous_epoch([a]) == 42


def test_a_dir_that_cannot_be_written_is_reported(tmp_path: Path) -> None:
    a = tmp_path / "a"
    a.mkdir()
    missing = tmp_path / "gone"  # not a directory: the write fails
    assert not write_epoch([a, missing], 9)
    assert read_previous_epoch([a, missing]) == -1
