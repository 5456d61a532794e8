"""``broker.broker_epoch``: the epoch a broker's log dirs prove, or -1 whenever they prove
nothing (a missing, unreadable or malformed file, dirs that disagree, no dirs, or a file written
before the machine last booted: its unflushed tail may be gone)."""

from __future__ import annotations

from pathlib import Path

from broker.broker_epoch import EPOCH_FILE, boot_id, read_previous_epoch, write_epoch

BOOT = "00b54c80-6370-43a8-95b5-4f6862bb9a84"


def test_written_epochs_read_back_from_every_dir_on_the_same_boot(tmp_path: Path) -> None:
    dirs = [tmp_path / "a", tmp_path / "b"]
    for d in dirs:
        d.mkdir()
    assert read_previous_epoch(dirs, BOOT) == -1  # never registered
    assert write_epoch(dirs, 42, BOOT)
    assert read_previous_epoch(dirs, BOOT) == 42
    assert write_epoch(dirs, 57, BOOT) and read_previous_epoch(dirs, BOOT) == 57
    assert not list(tmp_path.glob("*/*.tmp"))


def test_a_file_from_an_earlier_boot_proves_nothing(tmp_path: Path) -> None:
    """A reboot (an OS crash, a power loss) may have lost appends the page cache held."""
    d = tmp_path / "a"
    d.mkdir()
    write_epoch([d], 42, BOOT)
    assert read_previous_epoch([d], "another-boot") == -1
    assert read_previous_epoch([d], "") == -1  # this system does not say which boot it is
    write_epoch([d], 43, "")  # written where the boot was unknown
    assert read_previous_epoch([d], BOOT) == -1


def test_dirs_that_prove_nothing_give_minus_one(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    write_epoch([a, b], 42, BOOT)
    (b / EPOCH_FILE).unlink()  # b wiped and re-formatted
    assert read_previous_epoch([a, b], BOOT) == -1
    write_epoch([b], 41, BOOT)  # b restored from an older copy
    assert read_previous_epoch([a, b], BOOT) == -1
    (b / EPOCH_FILE).write_text("forty-two " + BOOT + "\n")
    assert read_previous_epoch([a, b], BOOT) == -1
    (b / EPOCH_FILE).write_text("42\n")  # no boot id
    assert read_previous_epoch([a, b], BOOT) == -1
    (b / EPOCH_FILE).write_bytes(b"\xff\xfe")
    assert read_previous_epoch([a, b], BOOT) == -1
    assert read_previous_epoch([], BOOT) == -1
    assert read_previous_epoch([a], BOOT) == 42


def test_a_dir_that_cannot_be_written_is_reported(tmp_path: Path) -> None:
    a = tmp_path / "a"
    a.mkdir()
    missing = tmp_path / "gone"  # not a directory: the write fails
    assert not write_epoch([a, missing], 9, BOOT)
    assert read_previous_epoch([a, missing], BOOT) == -1


def test_this_machines_boot_id(tmp_path: Path) -> None:
    source = tmp_path / "boot_id"
    source.write_text(BOOT + "\n")
    assert boot_id(source) == BOOT
    assert boot_id(tmp_path / "absent") == ""
