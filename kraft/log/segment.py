"""Frames and segment files: encoding, scanning and verification.

A frame is ``u32 length | u32 crc32c(payload) | payload`` (big-endian); in a segment the payload
is one encoded :class:`~kraft.records.Batch`. Segment files are ``%020d.log`` named by the base
offset of their first batch.

The scanners here never raise on bad data: they yield :class:`Problem` values that name the file,
the byte position and the record offset, so ``kraft log dump`` can report every break and
:class:`~kraft.log.metadata_log.MetadataLog` can decide what is a torn tail and what is fatal.
"""

from __future__ import annotations

import os
import re
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import msgpack
from crc32c import crc32c

from kraft.records import ZERO_HASH, Batch, RecordDecodeError, batch_hash, decode_batch

FRAME_HEADER = struct.Struct(">II")
HEADER_SIZE = FRAME_HEADER.size
SEGMENT_SUFFIX = ".log"
_SEGMENT_RE = re.compile(r"^(\d{20})\.log$")

# Problem kinds. TORN and CRC-at-EOF in the last segment are recoverable (truncated); the rest
# are fatal for a node.
TORN = "torn"  # header or payload runs past the end of the file
CRC = "crc"  # checksum mismatch
DECODE = "decode"  # valid CRC but the payload is not a batch
OFFSET = "offset"  # offsets not contiguous (gap, overlap, misnamed segment)
CHAIN = "chain"  # prev_hash does not match the previous batch's hash
TERM = "term"  # term went backwards
IO = "io"  # the file could not be read

_LABELS = {
    TORN: "torn frame",
    CRC: "CRC mismatch",
    DECODE: "undecodable batch",
    OFFSET: "offset gap",
    CHAIN: "broken hash chain",
    TERM: "term went backwards",
    IO: "read error",
}


def segment_name(base_offset: int) -> str:
    """The file name of the segment whose first batch starts at ``base_offset``."""
    return f"{base_offset:020d}{SEGMENT_SUFFIX}"


def parse_segment_name(path: str | Path) -> int | None:
    """The base offset in a segment file name, or None if it is not a segment file."""
    m = _SEGMENT_RE.match(Path(path).name)
    return int(m.group(1)) if m else None


def list_segments(directory: str | Path) -> list[Path]:
    """Segment files in ``directory``, sorted by base offset."""
    d = Path(directory)
    found = [(parse_segment_name(p), p) for p in d.iterdir() if p.is_file()]
    return [p for base, p in sorted((b, p) for b, p in found if b is not None)]


def frame_header(payload: bytes) -> bytes:
    """The 8-byte header that precedes ``payload`` in a frame."""
    return FRAME_HEADER.pack(len(payload), crc32c(payload))


def encode_frame(payload: bytes) -> bytes:
    """A whole frame: header then payload."""
    return frame_header(payload) + payload


def peek_base_offset(prefix: bytes) -> int:
    """The ``base_offset`` of an encoded batch from the first few dozen bytes of its payload.

    Relies on the batch map's fixed key order (``format`` then ``base_offset``)."""
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(prefix)
    unpacker.read_map_header()
    for _ in range(3):  # "format", its value, "base_offset"
        unpacker.skip()
    value = unpacker.unpack()
    if type(value) is not int:
        raise RecordDecodeError("batch base_offset is not an integer")
    return value


@dataclass(frozen=True, slots=True)
class Problem:
    """One break found while scanning a segment."""

    path: Path
    position: int
    offset: int | None
    kind: str
    detail: str = ""
    end: int = -1  # byte after the bad frame (-1: unknown / past EOF)
    file_size: int = -1

    @property
    def at_eof(self) -> bool:
        """The bad frame is the file's last: it runs past EOF or ends exactly at EOF."""
        return self.kind == TORN or (self.end >= 0 and self.end == self.file_size)

    def __str__(self) -> str:
        at = f"offset {self.offset}" if self.offset is not None else "offset unknown"
        text = (
            f"{_LABELS.get(self.kind, self.kind)} at {self.path.name} byte {self.position} ({at})"
        )
        return f"{text}: {self.detail}" if self.detail else text


@dataclass(slots=True)
class ChainState:
    """What the next batch must look like: base offset, prev_hash and minimum term.

    ``None`` means "unknown, accept whatever comes" (the start of a log whose older segments were
    deleted, or the frame after a damaged one)."""

    next_offset: int | None = None
    last_hash: bytes | None = None
    last_term: int = -1

    @classmethod
    def for_first_segment(cls, base_offset: int) -> ChainState:
        """The state before the first segment: offset 0 chains from ZERO_HASH, anything later is
        anchored on whatever prev_hash its first batch carries."""
        return cls(base_offset, ZERO_HASH if base_offset == 0 else None, -1)

    def check(self, batch: Batch) -> tuple[str, str] | None:
        """``(kind, detail)`` if ``batch`` does not follow, else None."""
        if not batch.records:
            return DECODE, "empty batch"
        if self.next_offset is not None and batch.base_offset != self.next_offset:
            return OFFSET, f"expected base offset {self.next_offset}, found {batch.base_offset}"
        if self.last_hash is not None and batch.prev_hash != self.last_hash:
            return CHAIN, (
                f"prev_hash {batch.prev_hash.hex()[:16]}… does not match the previous "
                f"batch's hash {self.last_hash.hex()[:16]}…"
            )
        if batch.term < self.last_term:
            return TERM, f"term {batch.term} after term {self.last_term}"
        return None

    def advance(self, batch: Batch, digest: bytes | None) -> None:
        """Move past ``batch`` (``digest`` None: its bytes are damaged, accept any successor)."""
        self.next_offset = batch.next_offset
        self.last_hash = digest
        self.last_term = max(self.last_term, batch.term)

    def forget(self) -> None:
        """After an undecodable frame nothing is known about what follows."""
        self.next_offset = None
        self.last_hash = None


@dataclass(frozen=True, slots=True)
class Frame:
    """One frame found by :func:`iter_frames`: ``payload`` is None when ``problem`` is TORN."""

    position: int
    end: int
    payload: memoryview | None
    crc_ok: bool


def iter_frames(data: bytes | memoryview, start: int = 0) -> Iterator[Frame]:
    """Split a buffer into frames. Stops after a torn frame; continues past a CRC mismatch
    (using its length) so later frames can still be checked."""
    view = memoryview(data)
    size = len(view)
    pos = start
    while pos < size:
        if pos + HEADER_SIZE > size:
            yield Frame(pos, -1, None, False)
            return
        length, crc = FRAME_HEADER.unpack_from(view, pos)
        end = pos + HEADER_SIZE + length
        if end > size:
            yield Frame(pos, -1, None, False)
            return
        payload = view[pos + HEADER_SIZE : end]
        yield Frame(pos, end, payload, crc32c(payload) == crc)
        pos = end


@dataclass(frozen=True, slots=True)
class ScanEntry:
    """One frame of a scanned segment: a good batch, or a problem (sometimes with the batch
    decoded anyway, e.g. a chain break)."""

    position: int
    end: int
    batch: Batch | None
    digest: bytes | None
    problem: Problem | None


def scan_buffer(
    path: Path,
    data: bytes | memoryview,
    state: ChainState,
    decode: Callable[[memoryview], Batch] = decode_batch,
) -> Iterator[ScanEntry]:
    """Scan a segment's bytes, checking every frame against ``state`` (which is advanced).
    ``decode`` turns a payload into a batch or raises RecordDecodeError: the strict
    ``decode_batch`` by default; start-up recovery passes ``decode_batch_envelope``.

    Never raises on bad data."""
    size = len(data)
    for frame in iter_frames(data):
        expected = state.next_offset
        if frame.payload is None:
            detail = f"frame at byte {frame.position} runs past the end of the file ({size} bytes)"
            yield ScanEntry(
                frame.position,
                -1,
                None,
                None,
                Problem(path, frame.position, expected, TORN, detail, -1, size),
            )
            return
        try:
            batch = decode(frame.payload)
        except RecordDecodeError as e:
            batch, err = None, str(e)
        if not frame.crc_ok:
            off = expected if expected is not None else (batch.base_offset if batch else None)
            problem: Problem | None = Problem(
                path,
                frame.position,
                off,
                CRC,
                f"frame of {frame.end - frame.position - HEADER_SIZE} bytes",
                frame.end,
                size,
            )
            if batch is not None:
                state.advance(batch, None)
            else:
                state.forget()
            yield ScanEntry(frame.position, frame.end, batch, None, problem)
            continue
        if batch is None:
            state.forget()
            yield ScanEntry(
                frame.position,
                frame.end,
                None,
                None,
                Problem(path, frame.position, expected, DECODE, err, frame.end, size),
            )
            continue
        digest = batch.digest or batch_hash(frame.payload)
        bad = state.check(batch)
        problem = None
        if bad is not None:
            off = batch.base_offset if bad[0] != OFFSET or expected is None else expected
            problem = Problem(path, frame.position, off, bad[0], bad[1], frame.end, size)
        state.advance(batch, digest)
        yield ScanEntry(frame.position, frame.end, batch, digest, problem)


def scan_segment(
    path: str | Path,
    state: ChainState | None = None,
    decode: Callable[[memoryview], Batch] = decode_batch,
) -> Iterator[ScanEntry]:
    """Scan one segment file. Without ``state`` the segment is checked on its own (its name
    gives the first offset; a non-zero first segment is anchored on its first prev_hash).
    ``decode``: as for :func:`scan_buffer`."""
    path = Path(path)
    if state is None:
        base = parse_segment_name(path)
        state = ChainState.for_first_segment(base) if base is not None else ChainState()
    try:
        data = path.read_bytes()
    except OSError as e:
        yield ScanEntry(0, -1, None, None, Problem(path, 0, state.next_offset, IO, str(e)))
        return
    yield from scan_buffer(path, data, state, decode)


def verify_segment(path: str | Path) -> list[Problem]:
    """Every problem in one segment file, checked on its own."""
    return [e.problem for e in scan_segment(path) if e.problem is not None]


def verify_log(directory: str | Path) -> list[Problem]:
    """Every problem in a log directory, checking offsets and the hash chain across segments."""
    segments = list_segments(directory)
    problems: list[Problem] = []
    if not segments:
        return problems
    state = ChainState.for_first_segment(parse_segment_name(segments[0]) or 0)
    for path in segments:
        base = parse_segment_name(path)
        if path.stat().st_size == 0:
            continue
        if state.next_offset is not None and base != state.next_offset:
            problems.append(
                Problem(
                    path,
                    0,
                    state.next_offset,
                    OFFSET,
                    f"segment is named for offset {base} but the log continues "
                    f"at {state.next_offset}",
                )
            )
            state.next_offset, state.last_hash = base, None  # re-anchor after the gap
        problems.extend(e.problem for e in scan_segment(path, state) if e.problem is not None)
    return problems


def fsync_dir(directory: str | Path) -> None:
    """Make a directory's entries (creations, renames, deletions) durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
