"""Errors raised by the metadata log and snapshot code."""

from __future__ import annotations

from pathlib import Path
from typing import Self


class CorruptLogError(Exception):
    """The on-disk metadata log is damaged somewhere other than a torn tail.

    The node must refuse to start: ``path`` and ``position`` say where, ``offset`` is the record
    offset expected (or found) at that position (None if unknown), ``reason`` says what is wrong.
    """

    def __init__(self, path: str | Path, position: int, offset: int | None, reason: str) -> None:
        self.path = Path(path)
        self.position = position
        self.offset = offset
        self.reason = reason
        at = f"offset {offset}" if offset is not None else "offset unknown"
        super().__init__(f"corrupt metadata log {self.path} at byte {position} ({at}): {reason}")

    def __reduce__(self) -> tuple[type[Self], tuple[Path, int, int | None, str]]:
        # keep the four arguments when pickled (e.g. across processes)
        return (type(self), (self.path, self.position, self.offset, self.reason))


class CorruptSnapshotError(Exception):
    """A snapshot file fails verification (CRC, checksum, record count, structure)."""

    def __init__(self, path: str | Path, position: int, reason: str) -> None:
        self.path = Path(path)
        self.position = position
        self.reason = reason
        super().__init__(f"corrupt snapshot {self.path} at byte {position}: {reason}")

    def __reduce__(self) -> tuple[type[Self], tuple[Path, int, str]]:
        return (type(self), (self.path, self.position, self.reason))


class OffsetOutOfRangeError(LookupError):
    """A read asked for an offset below the log start (deleted by retention)."""

    def __init__(self, offset: int, start_offset: int) -> None:
        self.offset = offset
        self.start_offset = start_offset
        super().__init__(f"offset {offset} is before the log start offset {start_offset}")
