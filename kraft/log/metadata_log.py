"""The append-only metadata log: framed batches in segment files, with recovery on open.

Writes go straight to the OS with one ``writev`` per frame (no user-space buffer), so readers
with their own file handles see every completed append; ``sync()`` makes them durable. Readers
take a point-in-time view of the segment list under the lock and then read without it.

The newest appended batches (up to ``TAIL_CACHE_BYTES``) are also kept in memory: brokers
long-polling the tail (``read_encoded``) are answered from there, with no file opened, sought or
re-checked for every commit.
"""

from __future__ import annotations

import logging
import os
import threading
from bisect import bisect_right
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from crc32c import crc32c

from kraft.log.errors import CorruptLogError, OffsetOutOfRangeError
from kraft.log.segment import (
    CRC,
    FRAME_HEADER,
    HEADER_SIZE,
    TORN,
    ChainState,
    Problem,
    fsync_dir,
    list_segments,
    parse_segment_name,
    peek_base_offset,
    scan_buffer,
    segment_name,
)
from kraft.records import ZERO_HASH, Batch, batch_hash, decode_batch, decode_batch_envelope

log = logging.getLogger(__name__)

DEFAULT_SEGMENT_BYTES = 16 * 1024 * 1024
INDEX_INTERVAL_BYTES = 4096
_PEEK_BYTES = 64
_READ_BUFFER = 64 * 1024
TAIL_CACHE_BYTES = 4 * 1024 * 1024
_MAX_FRAMES_PER_WRITE = 500  # two iovecs a frame; IOV_MAX is 1024


class _Segment:
    """In-memory facts about one segment file plus its sparse offset → position index."""

    __slots__ = ("_last_indexed", "base_offset", "index_offsets", "index_positions", "path", "size")

    def __init__(self, path: Path, base_offset: int, size: int = 0) -> None:
        self.path = path
        self.base_offset = base_offset
        self.size = size
        self.index_offsets: list[int] = []
        self.index_positions: list[int] = []
        self._last_indexed = -INDEX_INTERVAL_BYTES

    def note_frame(self, base_offset: int, position: int) -> None:
        """Index the frame if it is the first or ``INDEX_INTERVAL_BYTES`` past the last entry."""
        if position - self._last_indexed >= INDEX_INTERVAL_BYTES or not self.index_offsets:
            self.index_offsets.append(base_offset)
            self.index_positions.append(position)
            self._last_indexed = position

    def position_for(self, offset: int) -> int:
        """Byte position of an indexed frame at or before the batch holding ``offset``."""
        i = bisect_right(self.index_offsets, offset) - 1
        return self.index_positions[max(i, 0)] if self.index_positions else 0


class MetadataLog:
    """The on-disk metadata log of one node. Open with :meth:`MetadataLog.open`."""

    def __init__(self, directory: Path, segment_bytes: int, fsync: str) -> None:
        if fsync not in ("always", "never"):
            raise ValueError(f"fsync must be 'always' or 'never', not {fsync!r}")
        if segment_bytes <= 0:
            raise ValueError("segment_bytes must be positive")
        self.directory = directory
        self.segment_bytes = segment_bytes
        self.fsync = fsync
        self._lock = threading.Lock()
        self._sync_lock = threading.Lock()  # one sync at a time; appends go on meanwhile
        self._dirty = False
        self._segments: list[_Segment] = []
        self._bases: list[int] = []
        self._fd: int | None = None
        self._closed = False
        self._failed: BaseException | None = None
        self._start_offset = 0
        self._next_offset = 0
        self._last_hash = ZERO_HASH
        self._last_term = 0
        self._last_raft_index = 0
        self._last_raft_position = 0
        self._last_timestamp_ms = 0
        # The newest appended batches, oldest first: base offsets and encoded payloads.
        self._tail_bases: list[int] = []
        self._tail_payloads: list[bytes] = []
        self._tail_bytes = 0

    # ------------------------------------------------------------------ opening and recovery

    @classmethod
    def open(
        cls,
        directory: str | Path,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        fsync: str = "always",
    ) -> MetadataLog:
        """Open (creating if needed) the log in ``directory``, validating every segment.

        A torn tail of the last segment is truncated with a WARNING; any other damage raises
        :class:`CorruptLogError`."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        mlog = cls(d, segment_bytes, fsync)
        mlog._recover()
        return mlog

    def _recover(self) -> None:
        paths = self._drop_trailing_empty(list_segments(self.directory))
        state: ChainState | None = None
        for i, path in enumerate(paths):
            base = parse_segment_name(path)
            assert base is not None
            if path.stat().st_size == 0:
                continue  # an empty segment before others holds nothing; offsets are checked
            if state is None:
                state = ChainState.for_first_segment(base)
            elif state.next_offset != base:
                raise CorruptLogError(
                    path,
                    0,
                    state.next_offset,
                    f"segment is named for offset {base} but the log continues "
                    f"at {state.next_offset}",
                )
            self._load_segment(path, base, state, last=(i == len(paths) - 1))
        if self._segments:
            self._start_offset = self._segments[0].base_offset
        self._bases = [s.base_offset for s in self._segments]

    def _drop_trailing_empty(self, paths: list[Path]) -> list[Path]:
        """Remove empty segment files after the last one with data (an interrupted roll)."""
        while paths and paths[-1].stat().st_size == 0:
            log.info("removing empty trailing segment %s", paths[-1])
            paths[-1].unlink()
            paths.pop()
        return paths

    def _load_segment(self, path: Path, base: int, state: ChainState, last: bool) -> None:
        data = path.read_bytes()
        seg = _Segment(path, base)
        # Start-up checks frames, offsets and the hash chain; records are decoded strictly by
        # whoever reads them (replay, FetchMetadata readers), not twice.
        for entry in scan_buffer(path, data, state, decode=decode_batch_envelope):
            if entry.problem is not None:
                self._handle_problem(entry.problem, last, data)
                break  # torn tail truncated: it was the final frame
            batch = entry.batch
            assert batch is not None and entry.digest is not None
            seg.note_frame(batch.base_offset, entry.position)
            seg.size = entry.end
            self._next_offset = batch.next_offset
            self._last_hash = entry.digest
            self._last_term = batch.term
            self._last_raft_index = batch.raft_index
            self._last_raft_position = batch.raft_position
            self._last_timestamp_ms = batch.timestamp_ms
        if seg.size == 0:  # only a torn frame (truncated above): nothing left
            log.warning("removing segment %s: it held only a torn frame", path)
            path.unlink()
            return
        self._segments.append(seg)

    def _handle_problem(self, problem: Problem, last: bool, data: bytes) -> None:
        """Truncate a torn tail of the last segment (a partial final frame, or zeros where the
        file grew but the data never reached the disk); raise for anything else, including a
        frame running past the end with an intact frame after it (a damaged length)."""
        torn = (
            problem.kind == TORN
            or (problem.kind == CRC and problem.at_eof)
            or not data[problem.position :].strip(b"\x00")
        )
        follower = _intact_frame_after(data, problem.position) if last and torn else None
        if follower is not None:
            raise CorruptLogError(
                problem.path,
                problem.position,
                problem.offset,
                f"{problem}; an intact frame follows at byte {follower}, so this "
                "is damage, not a torn write",
            )
        if not (last and torn):
            raise CorruptLogError(problem.path, problem.position, problem.offset, str(problem))
        log.warning(
            "metadata log %s: truncating torn tail at byte %d (offset %s, %d bytes dropped): %s",
            problem.path,
            problem.position,
            problem.offset,
            problem.file_size - problem.position,
            problem,
        )
        with open(problem.path, "r+b") as f:
            f.truncate(problem.position)
            if self.fsync == "always":
                os.fsync(f.fileno())

    # ------------------------------------------------------------------ state

    @property
    def start_offset(self) -> int:
        """Offset of the first record still on disk (moves up with retention)."""
        return self._start_offset

    @property
    def next_offset(self) -> int:
        """Offset after the last record (0 when empty)."""
        return self._next_offset

    @property
    def last_hash(self) -> bytes:
        """Hash of the last batch's encoding (ZERO_HASH when empty)."""
        return self._last_hash

    @property
    def last_term(self) -> int:
        return self._last_term

    @property
    def last_raft_index(self) -> int:
        return self._last_raft_index

    @property
    def last_raft_position(self) -> int:
        """Position of the last batch's command inside its (group-committed) Raft entry."""
        return self._last_raft_position

    @property
    def last_timestamp_ms(self) -> int:
        return self._last_timestamp_ms

    @property
    def size_bytes(self) -> int:
        """Total bytes of all segments."""
        with self._lock:
            return sum(s.size for s in self._segments)

    def segment_sizes(self) -> list[tuple[Path, int, int]]:
        """(path, base offset, size in bytes) of every segment, oldest first."""
        with self._lock:
            return [(s.path, s.base_offset, s.size) for s in self._segments]

    @property
    def segments(self) -> list[Path]:
        """Segment file paths, oldest first."""
        with self._lock:
            return [s.path for s in self._segments]

    # ------------------------------------------------------------------ appending

    def append(self, batch: Batch) -> None:
        """Encode and append ``batch`` (see :meth:`append_encoded`)."""
        self.append_encoded(batch.encode(), batch)

    def append_encoded(self, encoded: bytes, batch: Batch) -> None:
        """Append a batch whose canonical encoding the caller already has.

        Raises ValueError if the batch does not continue the log (offset, prev_hash, term)."""
        self.append_many([(encoded, batch, batch_hash(encoded))])

    def append_many(self, items: list[tuple[bytes, Batch, bytes]]) -> None:
        """Append consecutive batches (``(encoding, batch, batch_hash(encoding))``, e.g. one Raft
        entry's; the caller has the hash from replaying them) with one write per segment they
        land in. The whole chain is checked before anything is written; the files end up
        exactly as with one ``append_encoded`` per batch."""
        frames = [
            (FRAME_HEADER.pack(len(enc), crc32c(enc)), enc, batch, digest)
            for enc, batch, digest in items
        ]
        with self._lock:
            self._check_writable()
            chain = (self._next_offset, self._last_hash, self._last_term)
            for _, _, batch, digest in frames:
                _check_continues(batch, *chain)
                chain = (batch.next_offset, digest, batch.term)
            i = 0
            while i < len(frames):
                seg = self._active_segment()
                position = end = seg.size
                group: list[tuple[bytes, bytes, Batch, bytes]] = []
                while (
                    i < len(frames)
                    and len(group) < _MAX_FRAMES_PER_WRITE
                    and (not group or end < self.segment_bytes)
                ):
                    group.append(frames[i])
                    end += HEADER_SIZE + len(frames[i][1])
                    i += 1
                self._write_parts([part for h, e, _, _ in group for part in (h, e)], position)
                for _, encoded, batch, digest in group:
                    seg.note_frame(batch.base_offset, position)
                    position += HEADER_SIZE + len(encoded)
                    self._note_appended(batch, digest, encoded)
                seg.size = position
                self._dirty = True

    def _note_appended(self, batch: Batch, digest: bytes, encoded: bytes) -> None:
        self._next_offset = batch.next_offset
        self._last_hash = digest
        self._last_term = batch.term
        self._last_raft_index = batch.raft_index
        self._last_raft_position = batch.raft_position
        self._last_timestamp_ms = batch.timestamp_ms
        self._remember_tail(batch.base_offset, encoded)

    def _remember_tail(self, base_offset: int, encoded: bytes) -> None:
        """Keep the batch in the tail cache; past 1.5x the budget, drop the oldest down to it."""
        self._tail_bases.append(base_offset)
        self._tail_payloads.append(encoded)
        self._tail_bytes += len(encoded)
        if self._tail_bytes > TAIL_CACHE_BYTES * 3 // 2 and len(self._tail_payloads) > 1:
            drop = 0
            while self._tail_bytes > TAIL_CACHE_BYTES and drop < len(self._tail_payloads) - 1:
                self._tail_bytes -= len(self._tail_payloads[drop])
                drop += 1
            del self._tail_bases[:drop]
            del self._tail_payloads[:drop]

    def _clear_tail(self) -> None:
        self._tail_bases.clear()
        self._tail_payloads.clear()
        self._tail_bytes = 0

    def _check_writable(self) -> None:
        if self._closed:
            raise ValueError("metadata log is closed")
        if self._failed is not None:
            raise OSError(f"metadata log unusable after a failed write: {self._failed}")

    def _active_segment(self) -> _Segment:
        """The segment to append to, rolling to a new file when the current one is full."""
        if self._segments and self._segments[-1].size < self.segment_bytes:
            if self._fd is None:
                self._fd = os.open(self._segments[-1].path, os.O_WRONLY | os.O_APPEND)
            return self._segments[-1]
        self._close_fd()
        path = self.directory / segment_name(self._next_offset)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        if os.fstat(fd).st_size != 0:
            os.close(fd)
            raise FileExistsError(f"new segment {path} already holds data")
        if self.fsync == "always":
            fsync_dir(self.directory)
        self._fd = fd
        seg = _Segment(path, self._next_offset)
        self._segments.append(seg)
        self._bases.append(seg.base_offset)
        if len(self._segments) == 1:
            self._start_offset = seg.base_offset
        return seg

    def _write_parts(self, parts: list[bytes], position: int) -> None:
        """Write frames (header and payload parts) at the end of the active segment, which is
        at ``position``; on failure truncate back to it, so no partial frame stays."""
        assert self._fd is not None
        try:
            written = os.writev(self._fd, parts)
            total = sum(map(len, parts))
            if written < total:  # short write (rare: disk full, signals): finish it
                rest = b"".join(parts)[written:]
                while rest:
                    rest = rest[os.write(self._fd, rest) :]
        except BaseException as e:
            try:  # leave no partial frame behind
                os.ftruncate(self._fd, position)
            except OSError:
                self._failed = e
            raise

    def sync(self) -> bool:
        """Make every append made before the call durable (fdatasync); a no-op when
        ``fsync="never"`` or nothing was appended since the last sync. Thread-safe: appends
        continue while the disk works (the sync runs on a duplicate of the descriptor).
        Returns True when a sync happened."""
        if self.fsync != "always":
            return False
        with self._sync_lock:
            with self._lock:
                if not self._dirty or self._fd is None:
                    return False
                fd = os.dup(self._fd)
                self._dirty = False
            try:
                os.fdatasync(fd)
            except BaseException:
                with self._lock:
                    self._dirty = True
                raise
            finally:
                os.close(fd)
            return True

    @property
    def unsynced(self) -> bool:
        """True when appends are waiting for :meth:`sync`."""
        return self._dirty and self.fsync == "always"

    def _close_fd(self) -> None:
        if self._fd is not None:
            if self.fsync == "always":
                os.fsync(self._fd)
            os.close(self._fd)
            self._fd = None
            self._dirty = False

    # ------------------------------------------------------------------ reading

    def read_batches(self, from_offset: int) -> Iterator[Batch]:
        """Decoded batches from the one containing ``from_offset`` to the current end.

        Raises OffsetOutOfRangeError (now, not on iteration) below the start offset."""
        plan = self._plan(from_offset)
        return (decode_batch(p) for p in _read_payloads(plan, from_offset))

    def recent_batches_before(
        self, end_offset: int, want: int, keep: Callable[[Batch], bool]
    ) -> list[Batch]:
        """The last ``want`` batches (oldest first) that end at or before ``end_offset`` and
        satisfy ``keep``, reading whole segments backwards from the one holding ``end_offset``
        — so the cost is a few segments, not the whole history."""
        with self._lock:
            bases = [b for b in self._bases if b <= end_offset]
        found: list[Batch] = []
        for i in range(len(bases) - 1, -1, -1):
            upto = bases[i + 1] if i + 1 < len(bases) else end_offset + 1
            chunk = []
            try:
                for batch in self.read_batches(bases[i]):
                    if batch.base_offset >= upto or batch.last_offset > end_offset:
                        break
                    if keep(batch):
                        chunk.append(batch)
            except OffsetOutOfRangeError:  # retention removed it meanwhile
                break
            found[:0] = chunk
            if len(found) >= want:
                return found[-want:]
        return found

    def read_encoded(self, from_offset: int, max_bytes: int) -> list[bytes]:
        """Raw batch payloads from the one containing ``from_offset``, up to ``max_bytes`` in
        total (always at least one batch if any exists)."""
        cached = self._read_tail(from_offset, max_bytes)
        if cached is not None:
            return cached
        out: list[bytes] = []
        total = 0
        for payload in _read_payloads(self._plan(from_offset), from_offset):
            if out and total + len(payload) > max_bytes:
                break
            out.append(payload)
            total += len(payload)
            if total >= max_bytes:
                break
        return out

    def batch_end(self, offset: int) -> tuple[int, bytes] | None:
        """(last offset, hash) of the batch containing ``offset``; None when this log does not
        hold ``offset`` (past its end, or before its start)."""
        if offset == self.next_offset - 1:
            return offset, self.last_hash
        if offset < self.start_offset or offset >= self.next_offset:
            return None
        try:
            payloads = self.read_encoded(offset, 1)
        except OffsetOutOfRangeError:  # retention moved the start meanwhile
            return None
        if not payloads:
            return None
        return decode_batch(payloads[0]).last_offset, batch_hash(payloads[0])

    def hash_at(self, offset: int) -> bytes | None:
        """The hash of the batch that ends at ``offset`` (the chain's head as a node that has
        applied up to ``offset`` sees it); None when this log does not hold ``offset``, and
        ``b""`` when it does but no batch ends there (a head there cannot be ours)."""
        found = self.batch_end(offset)
        if found is None:
            return None
        return found[1] if found[0] == offset else b""

    def _read_tail(self, from_offset: int, max_bytes: int) -> list[bytes] | None:
        """``read_encoded`` from the tail cache, or None when it does not reach back that far."""
        with self._lock:
            if self._closed:
                raise ValueError("metadata log is closed")
            if from_offset < self._start_offset:
                raise OffsetOutOfRangeError(from_offset, self._start_offset)
            if from_offset >= self._next_offset:
                return []
            bases = self._tail_bases
            if not bases or bases[0] > from_offset:
                return None
            i = bisect_right(bases, from_offset) - 1
            payloads = self._tail_payloads
            out = [payloads[i]]
            total = len(payloads[i])
            for payload in payloads[i + 1 :]:
                if total + len(payload) > max_bytes:
                    break
                out.append(payload)
                total += len(payload)
            return out

    def _plan(self, from_offset: int) -> list[tuple[Path, int, int]]:
        """A point-in-time view: (path, start position, end position) of each segment to read."""
        with self._lock:
            if self._closed:
                raise ValueError("metadata log is closed")
            if from_offset < self._start_offset:
                raise OffsetOutOfRangeError(from_offset, self._start_offset)
            if from_offset >= self._next_offset or not self._segments:
                return []
            i = max(bisect_right(self._bases, from_offset) - 1, 0)
            first = self._segments[i]
            plan = [(first.path, first.position_for(from_offset), first.size)]
            plan.extend((s.path, 0, s.size) for s in self._segments[i + 1 :])
            return plan

    # ------------------------------------------------------------------ retention and reset

    def truncate_before(self, offset: int) -> list[Path]:
        """Delete whole segments whose records are all before ``offset`` (never the last one).

        Returns the deleted paths; ``start_offset`` moves up to the first remaining segment."""
        deleted: list[Path] = []
        with self._lock:
            while len(self._segments) > 1 and self._segments[1].base_offset <= offset:
                seg = self._segments.pop(0)
                self._bases.pop(0)
                seg.path.unlink()
                deleted.append(seg.path)
            if self._segments:
                self._start_offset = self._segments[0].base_offset
            if deleted and self.fsync == "always":
                fsync_dir(self.directory)
        for path in deleted:
            log.info("retention: deleted metadata log segment %s", path)
        return deleted

    def reset(
        self,
        next_offset: int,
        last_hash: bytes,
        last_term: int = 0,
        last_raft_index: int = 0,
        last_timestamp_ms: int = 0,
    ) -> None:
        """Drop every segment and continue at ``next_offset`` after ``last_hash`` (e.g. after
        installing a snapshot). Not persisted until the next append creates a segment."""
        with self._lock:
            self._check_writable()
            self._close_fd()
            for seg in self._segments:
                seg.path.unlink()
            self._segments.clear()
            self._bases.clear()
            self._clear_tail()
            if self.fsync == "always":
                fsync_dir(self.directory)
            self._start_offset = self._next_offset = next_offset
            self._last_hash = last_hash
            self._last_term = last_term
            self._last_raft_index = last_raft_index
            self._last_raft_position = 0
            self._last_timestamp_ms = last_timestamp_ms

    # ------------------------------------------------------------------ closing

    def close(self) -> None:
        """Sync (if configured) and close; further appends and reads raise ValueError."""
        with self._lock:
            if not self._closed:
                self._close_fd()
                self._closed = True

    def __enter__(self) -> MetadataLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"MetadataLog({str(self.directory)!r}, start={self._start_offset}, "
            f"next={self._next_offset}, segments={len(self._segments)})"
        )


def _check_continues(batch: Batch, next_offset: int, last_hash: bytes, last_term: int) -> None:
    """Raise ValueError unless ``batch`` may follow a log at that offset, hash and term."""
    if not batch.records:
        raise ValueError("cannot append an empty batch")
    if batch.base_offset != next_offset:
        raise ValueError(f"batch base offset {batch.base_offset} != log next offset {next_offset}")
    if batch.prev_hash != last_hash:
        raise ValueError(
            f"batch prev_hash {batch.prev_hash.hex()[:16]}… != log last hash "
            f"{last_hash.hex()[:16]}…"
        )
    if batch.term < last_term:
        raise ValueError(f"batch term {batch.term} < log last term {last_term}")


def _read_payloads(plan: list[tuple[Path, int, int]], from_offset: int) -> Iterator[bytes]:
    """Payloads of the planned segment ranges, starting at the batch holding ``from_offset``."""
    for n, (path, start, end) in enumerate(plan):
        try:
            f = open(path, "rb", buffering=_READ_BUFFER)  # noqa: SIM115 -- the with below closes it
        except FileNotFoundError:
            raise OffsetOutOfRangeError(from_offset, -1) from None  # deleted by retention
        with f:
            pos = _seek_containing(f, path, start, end, from_offset) if n == 0 else start
            yield from _read_frames(f, path, pos, end)


def _intact_frame_after(data: bytes, start: int) -> int | None:
    """Position of the first non-empty frame with a matching CRC after ``start``, if any."""
    view = memoryview(data)
    for pos in range(start + 1, len(data) - HEADER_SIZE):
        length, crc = FRAME_HEADER.unpack_from(view, pos)
        end = pos + HEADER_SIZE + length
        if length > 0 and end <= len(data) and crc32c(view[pos + HEADER_SIZE : end]) == crc:
            return pos
    return None


def _read_header(f: BinaryIO, path: Path, pos: int) -> tuple[int, int]:
    f.seek(pos)
    header = f.read(HEADER_SIZE)
    if len(header) != HEADER_SIZE:
        raise CorruptLogError(path, pos, None, "segment shorter than its recorded size")
    return FRAME_HEADER.unpack(header)


def _seek_containing(f: BinaryIO, path: Path, pos: int, end: int, offset: int) -> int:
    """Position of the last frame at or after ``pos`` whose base offset is <= ``offset``."""
    while True:
        length, _ = _read_header(f, path, pos)
        nxt = pos + HEADER_SIZE + length
        if nxt >= end:
            return pos
        next_length, _ = _read_header(f, path, nxt)
        try:
            next_base = peek_base_offset(f.read(min(next_length, _PEEK_BYTES)))
        except Exception as e:  # msgpack raises several unrelated types
            raise CorruptLogError(path, nxt, None, f"cannot read batch base offset: {e}") from None
        if next_base > offset:
            return pos
        pos = nxt


def _read_frames(f: BinaryIO, path: Path, pos: int, end: int) -> Iterator[bytes]:
    f.seek(pos)
    while pos < end:
        header = f.read(HEADER_SIZE)
        if len(header) != HEADER_SIZE:
            raise CorruptLogError(path, pos, None, "segment shorter than its recorded size")
        length, crc = FRAME_HEADER.unpack(header)
        payload = f.read(length)
        if len(payload) != length or crc32c(payload) != crc:
            raise CorruptLogError(path, pos, None, "CRC mismatch on read")
        yield payload
        pos += HEADER_SIZE + length
