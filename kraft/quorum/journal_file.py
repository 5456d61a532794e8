"""The Raft journal's on-disk format (v2): every entry and the term/vote file carry a CRC32C.

PySyncObj's own journal (format v1) has no checksums: one changed byte replays a different
command, or a different term, with nobody noticing. :class:`ChecksummedFileJournal` implements
PySyncObj's journal interface (``add``, ``deleteEntriesFrom``, ``setCurrentTerm``, ...) over
this format instead; a damaged entry or header makes the node refuse to start with
:class:`JournalCorruptError` (file, byte position, entry), like a segment CRC error.

``journal.bin`` (big-endian)::

    header  magic "KRAFTJNL" | u32 format version (2) | u32 reserved
            | u64 end offset | u32 crc32c(end offset) | u32 reserved          (32 bytes)
    entry   u32 body length | u32 crc32c(body) | body = u64 raft index | u64 term | command

Entries are written with ``pwrite`` into zero-filled space (:class:`PwriteFile`), then the end
offset in the header; bytes after the end offset are ignored (left over from a truncation).
Raft indexes must follow each other by one.

A torn last entry (:func:`read_entries` with ``repair_torn_tail``): an append writes the entry,
then the header, and syncs both at once, so a crash or power loss in between can leave the new
end offset on disk with the entry behind it partly written (zeros, a cut header, a checksum
that does not match), or the file shorter than the end offset. When the damaged entry is the
last one, i.e. no whole entry with a later Raft index follows it before the end offset, the
journal is read up to the last whole entry (:class:`TornTail` says what was dropped). Such an
entry was never synced, so this node never acknowledged it. Damage with a whole entry after it
is not a torn append: refused like any checksum mismatch.

``journal.bin.meta`` (term, vote, commit index), replaced by write + fsync + rename::

    magic "KRAFTMTA" | u32 version (2) | u32 crc32c(payload) | u32 payload length | msgpack

A v1 journal (PySyncObj's header ``PYSYNCOBJ``) and a v1 meta file (a pickled dict) are read
once and rewritten in v2 (``upgraded`` says so); PySyncObj itself cannot read v2.
"""

from __future__ import annotations

import os
import pickle
import struct
from dataclasses import dataclass
from typing import Any

import msgpack
from crc32c import crc32c

JOURNAL_MAGIC = b"KRAFTJNL"
META_MAGIC = b"KRAFTMTA"
FORMAT_VERSION = 2
_HEADER = struct.Struct(">8sII")
_END = struct.Struct(">QI")  # end offset, its crc32c
_END_AT = _HEADER.size
END_AT = _END_AT
FIRST_ENTRY = 32
_ENTRY = struct.Struct(">II")  # body length, crc32c(body)
_BODY = struct.Struct(">QQ")  # raft index, term
_META = struct.Struct(">8sIII")

# PySyncObj's v1 layout: name (24) | version (8) | u32 format | u32 last record offset (LE)
_V1_NAME = b"PYSYNCOBJ"
_V1_FIRST = 40
_V1_END_AT = 36


class JournalCorruptError(Exception):
    """The Raft journal or its term/vote file fails verification; the node must not start."""

    def __init__(self, path: str, position: int, entry: int | None, reason: str) -> None:
        self.path = path
        self.position = position
        self.entry = entry
        self.reason = reason
        where = f"entry #{entry}" if entry is not None else "header"
        super().__init__(
            f"corrupt raft journal {path} at byte {position} ({where}): {reason}. "
            "Rebuild this controller from the others with "
            "`kraft storage recover --config FILE --from-peers`."
        )

    def __reduce__(self) -> tuple[Any, ...]:  # keep the arguments when pickled
        return (type(self), (self.path, self.position, self.entry, self.reason))


@dataclass(frozen=True)
class TornTail:
    """The journal's torn last entry, dropped on load: where it started, its number, why."""

    position: int
    entry: int
    reason: str


def encode_entry(command: bytes, index: int, term: int) -> bytes:
    body = _BODY.pack(index, term) + command
    return _ENTRY.pack(len(body), crc32c(body)) + body


def read_entries(path: str, data: bytes) -> tuple[list[tuple[bytes, int, int]], list[int], int]:
    """Parse a v2 journal: (entries, their start offsets, end offset). Raises on any damage."""
    entries, offsets, end, _ = read_entries_repairing(path, data, repair_torn_tail=False)
    return entries, offsets, end


def read_entries_repairing(
    path: str, data: bytes, repair_torn_tail: bool = True
) -> tuple[list[tuple[bytes, int, int]], list[int], int, TornTail | None]:
    """Parse a v2 journal: (entries, their start offsets, end offset, torn tail). With
    ``repair_torn_tail`` a damaged last entry (see the module docstring) is dropped: the end
    offset returned is then where it started, and the caller must write it. Any other damage
    raises :class:`JournalCorruptError`."""
    if len(data) < FIRST_ENTRY:
        raise JournalCorruptError(path, 0, None, f"header cut short ({len(data)} bytes)")
    magic, version, _ = _HEADER.unpack_from(data, 0)
    if version != FORMAT_VERSION:
        raise JournalCorruptError(path, 8, None, f"unknown journal format version {version}")
    end, end_crc = _END.unpack_from(data, _END_AT)
    if crc32c(data[_END_AT : _END_AT + 8]) != end_crc:
        raise JournalCorruptError(path, _END_AT, None, "header checksum mismatch (end offset)")
    if end < FIRST_ENTRY or (end > len(data) and not repair_torn_tail):
        raise JournalCorruptError(
            path, _END_AT, None, f"end offset {end} outside the file ({len(data)} bytes)"
        )
    short = end > len(data)  # the header reached the disk, the entry's bytes did not
    try:
        entries, offsets = _parse(path, data, min(end, len(data)))
    except JournalCorruptError as exc:
        if not repair_torn_tail or exc.entry is None or exc.reason.startswith("raft index"):
            raise
        if _whole_entry_after(data, exc.position, min(end, len(data))):
            raise  # damage in the middle: not a torn append
        entries, offsets = _parse(path, data, exc.position)
        return entries, offsets, exc.position, TornTail(exc.position, exc.entry, exc.reason)
    if short:
        reason = f"end offset {end} past the end of the file ({len(data)} bytes)"
        return entries, offsets, len(data), TornTail(len(data), len(entries), reason)
    return entries, offsets, end, None


def _whole_entry_after(data: bytes, position: int, end: int) -> bool:
    """Whether a whole entry (its checksum matching) starts somewhere in (position, end)."""
    view = memoryview(data)
    for at in range(position + 1, end - _ENTRY.size - _BODY.size + 1):
        length, crc = _ENTRY.unpack_from(data, at)
        start = at + _ENTRY.size
        if (
            length >= _BODY.size
            and start + length <= end
            and crc32c(view[start : start + length]) == crc
        ):
            return True
    return False


def _parse(path: str, data: bytes, end: int) -> tuple[list[tuple[bytes, int, int]], list[int]]:
    """The entries in [FIRST_ENTRY, end); raises on the first damaged one."""
    entries: list[tuple[bytes, int, int]] = []
    offsets: list[int] = []
    pos = FIRST_ENTRY
    view = memoryview(data)
    while pos < end:
        number = len(entries)
        if pos + _ENTRY.size + _BODY.size > end:
            raise JournalCorruptError(path, pos, number, "entry header runs past the end offset")
        length, crc = _ENTRY.unpack_from(data, pos)
        start = pos + _ENTRY.size
        if length < _BODY.size or start + length > end:
            raise JournalCorruptError(
                path, pos, number, f"entry length {length} does not fit before byte {end}"
            )
        if crc32c(view[start : start + length]) != crc:
            raise JournalCorruptError(path, pos, number, "entry checksum mismatch (CRC32C)")
        index, term = _BODY.unpack_from(data, start)
        if entries and index != entries[-1][1] + 1:
            raise JournalCorruptError(
                path, pos, number, f"raft index {index} does not follow {entries[-1][1]}"
            )
        entries.append((bytes(view[start + _BODY.size : start + length]), index, term))
        offsets.append(pos)
        pos = start + length
    return entries, offsets


def read_v1_entries(path: str, data: bytes) -> list[tuple[bytes, int, int]]:
    """Parse PySyncObj's own journal (no checksums: only its structure can be checked)."""
    (last,) = struct.unpack_from("<I", data, _V1_END_AT)
    if not _V1_FIRST <= last <= len(data):
        raise JournalCorruptError(path, _V1_END_AT, None, f"v1 end offset {last} out of range")
    entries: list[tuple[bytes, int, int]] = []
    pos = _V1_FIRST
    while pos < last:
        (size,) = struct.unpack_from("<I", data, pos)
        if size < 16 or pos + 8 + size > last:
            raise JournalCorruptError(path, pos, len(entries), f"v1 record size {size} invalid")
        index, term = struct.unpack_from("<QQ", data, pos + 4)
        entries.append((data[pos + 20 : pos + 4 + size], index, term))
        pos += size + 8
    return entries


def is_v1(data: bytes) -> bool:
    return data[: len(_V1_NAME)] == _V1_NAME


def new_journal_bytes(entries: list[tuple[bytes, int, int]]) -> bytes:
    """A complete v2 journal holding ``entries``."""
    body = b"".join(encode_entry(*e) for e in entries)
    head = _HEADER.pack(JOURNAL_MAGIC, FORMAT_VERSION, 0) + end_offset_bytes(
        FIRST_ENTRY + len(body)
    )
    return head + bytes(FIRST_ENTRY - len(head)) + body


def end_offset_bytes(end: int) -> bytes:
    """What to write at :data:`END_AT` to make ``end`` the journal's end offset."""
    return _END.pack(end, crc32c(end.to_bytes(8, "big")))


# ---- term / vote / commit index ------------------------------------------------------------


class _PlainUnpickler(pickle.Unpickler):
    """v1 meta files are a pickled dict of ints and strings: refuse anything else."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"unexpected object {module}.{name} in a v1 meta file")


def read_meta(path: str) -> tuple[dict[str, Any], bool]:
    """The meta file's contents and whether it was v1 (to rewrite). Missing: ``({}, False)``."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return {}, False
    if raw[:8] == META_MAGIC:
        if len(raw) < _META.size:
            raise JournalCorruptError(path, 0, None, "term/vote file truncated")
        _, version, crc, length = _META.unpack_from(raw, 0)
        payload = raw[_META.size : _META.size + length]
        if version != FORMAT_VERSION:
            raise JournalCorruptError(path, 8, None, f"unknown meta format version {version}")
        if len(payload) != length or crc32c(payload) != crc:
            raise JournalCorruptError(path, _META.size, None, "term/vote checksum mismatch")
        meta = msgpack.unpackb(payload, raw=False)
        return {
            "currentTerm": meta["term"],
            "votedForNodeId": meta["voted_for"],
            "raftCommitIndex": meta["commit_index"],
        }, False
    try:
        import io

        meta = _PlainUnpickler(io.BytesIO(raw)).load()
        if not isinstance(meta, dict):
            raise ValueError(f"a {type(meta).__name__}, not a dict")
    except Exception as exc:
        raise JournalCorruptError(path, 0, None, f"unreadable term/vote file: {exc}") from None
    return meta, True


def meta_bytes(meta: dict[str, Any]) -> bytes:
    payload: bytes = msgpack.packb(
        {
            "term": int(meta.get("currentTerm", 0)),
            "voted_for": meta.get("votedForNodeId"),
            "commit_index": int(meta.get("raftCommitIndex", 1)),
        },
        use_bin_type=True,
    )
    return _META.pack(META_MAGIC, FORMAT_VERSION, crc32c(payload), len(payload)) + payload


def write_file_atomically(path: str, data: bytes, fsync: bool) -> None:
    """``path.tmp`` written (and synced), renamed over ``path``, the directory synced."""
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    if fsync:
        dfd = os.open(os.path.dirname(os.path.abspath(path)) or ".", os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
