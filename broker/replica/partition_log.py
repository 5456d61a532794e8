"""One partition's on-disk log: segmented files of raw Kafka record batches (magic 2).

Layout of ``<log.dir>/<topic>-<partition>/``:

* ``%020d.log`` — segments named by the base offset of their first batch; the bytes are Kafka
  record batches back to back, exactly as a client sent them (only the base offset and the
  partition leader epoch, both outside the CRC, are rewritten on append);
* ``leader-epoch-checkpoint`` — Kafka's text format: ``0``, the entry count, then
  ``<epoch> <start offset>`` lines;
* ``high-watermark-checkpoint`` — ``0``, ``1``, then the high watermark.

* ``recovery-point-offset-checkpoint`` — ``0``, ``1``, then the recovery point: every segment
  wholly below it was flushed and has its ``%020d.bindex`` (``batch_index.py``).

Recovery on open (Kafka's log recovery) scans the segments not wholly below the recovery point,
and any without a valid index: header sanity + CRC32C per batch; the first bad or torn batch and
everything after it is truncated with a WARNING naming the file and byte position. A segment
opened from its index is verified when read instead (:class:`CorruptRecordError`). Checkpoint
files are written to ``.tmp`` and renamed.
"""

from __future__ import annotations

import bisect
import gc
import logging
import os
import struct
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import crc32c

from broker.replica.batch_index import INDEX_SUFFIX, IndexMismatch, decode_index, encode_index
from broker.replica.control_batch import (
    ATTR_CONTROL,
    ATTR_TRANSACTIONAL,
    encode_marker,
    marker_type,
)
from broker.replica.producer_state import (
    MAX_BATCHES,
    ProducerStateError,
    ProducerStateManager,
    SnapshotError,
    decode_snapshot,
    encode_snapshot,
    last_sequence,
)
from broker.replica.txn_index import AbortedTxn, TxnIndex

log = logging.getLogger(__name__)

HEADER_BYTES = 61  # fixed part of a v2 record batch, up to and including the record count
_LOG_OVERHEAD = 12  # base offset (8) + batch length (4)
_MAGIC = 2
# base offset, length, leader epoch, magic, CRC, attributes, last offset delta, first and max
# timestamps, producer id, producer epoch, base sequence: a batch header up to its record count
_HEADER = struct.Struct(">qiiBIhiqqqhi")
LEADER_EPOCH_FILE = "leader-epoch-checkpoint"
HW_FILE = "high-watermark-checkpoint"
LOG_START_FILE = "log-start-offset-checkpoint"  # DeleteRecords: "0", "1", the log start offset
SNAPSHOT_SUFFIX = ".snapshot"  # %020d.snapshot: producer state of every batch below that offset
SNAPSHOTS_KEPT = 2
CLEANER_FILE = "cleaner-offset-checkpoint"  # "0", "1", the first offset not yet compacted
CLEANED_SUFFIX = ".log.cleaned"  # a compacted segment being written (deleted on open)
SWAP_SUFFIX = ".log.swap"  # a compacted segment written and synced: replaces its sources on open
RECOVERY_POINT_FILE = "recovery-point-offset-checkpoint"  # "0", "1", the recovery point


@dataclass(frozen=True, slots=True)
class CleanedGroup:
    """A compacted ``<base>.log.cleaned`` file replacing the segments at ``bases``, with the
    index of its batches (so the swap reads nothing)."""

    path: Path
    bases: list[int]
    batches: list[BatchInfo]
    size: int


class InvalidBatchError(ValueError):
    """Bytes handed to :meth:`PartitionLog.append` that are not valid magic-2 record batches."""


class CorruptRecordError(ValueError):
    """Bytes read back from a segment that do not match its index or fail their CRC (Kafka's
    CORRUPT_MESSAGE): damage below the recovery point, found when read, not at open."""


class RecordTooLargeError(ValueError):
    """A batch larger than the topic's ``max.message.bytes`` (Kafka's MESSAGE_TOO_LARGE)."""


@dataclass(frozen=True, slots=True)
class LeaderAppend:
    """What a leader append did: the offsets given to the batches, or, for a retried
    idempotent batch, the offsets it got the first time (``duplicate``: nothing appended)."""

    first_offset: int
    last_offset: int
    duplicate: bool = False


class BatchInfo(NamedTuple):
    """Where one batch lives: its offsets and its byte position in a segment. A tuple: a log
    opened from its batch index makes one per batch straight from ``struct.iter_unpack``."""

    base_offset: int
    last_offset: int
    position: int
    size: int
    max_timestamp: int = -1
    leader_epoch: int = -1
    producer_id: int = -1
    producer_epoch: int = -1
    base_sequence: int = -1
    transactional: bool = False
    control_type: int = -1  # a control batch's marker type (0 abort, 1 commit); -1 data

    def moved(self, base_offset: int, position: int, leader_epoch: int) -> BatchInfo:
        """This batch at another base offset, byte position and leader epoch."""
        return BatchInfo(
            base_offset,
            base_offset + (self.last_offset - self.base_offset),
            position,
            self.size,
            self.max_timestamp,
            leader_epoch,
            self.producer_id,
            self.producer_epoch,
            self.base_sequence,
            self.transactional,
            self.control_type,
        )

    @property
    def last_sequence(self) -> int:
        return last_sequence(self.base_sequence, self.last_offset - self.base_offset)


def parse_batches(data: bytes | memoryview, check_crc: bool = True) -> tuple[list[BatchInfo], int]:
    """Split ``data`` into record batches. Returns the batches found and the number of bytes
    they cover; stops (without raising) at the first incomplete or invalid batch."""
    view = memoryview(data)
    out: list[BatchInfo] = []
    append = out.append
    unpack = _HEADER.unpack_from
    pos = 0
    n = len(view)
    while pos + HEADER_BYTES <= n:
        (
            base,
            length,
            epoch,
            magic,
            crc,
            attrs,
            last_delta,
            _first_ts,
            max_ts,
            producer_id,
            producer_epoch,
            base_seq,
        ) = unpack(view, pos)
        size = _LOG_OVERHEAD + length
        if length < HEADER_BYTES - _LOG_OVERHEAD or pos + size > n or magic != _MAGIC:
            break
        if check_crc and crc32c.crc32c(view[pos + 21 : pos + size]) != crc:
            break
        if last_delta < 0:
            break
        control = marker_type(view, pos, pos + size) if attrs & ATTR_CONTROL else -1
        append(
            BatchInfo(
                base,
                base + last_delta,
                pos,
                size,
                max_ts,
                epoch,
                producer_id,
                producer_epoch,
                base_seq,
                bool(attrs & ATTR_TRANSACTIONAL),
                control,
            )
        )
        pos += size
    return out, pos


def _parse_client(data: bytes) -> list[BatchInfo]:
    infos, used = parse_batches(data)
    if not infos or used != len(data):
        raise InvalidBatchError("not a sequence of valid magic-2 record batches")
    return infos


_deferred_dirs: set[Path] | None = None  # inside batched_syncs(): directories to sync on exit


def _write_atomic(path: Path, text: str) -> None:
    tmp = f"{path}.tmp"
    write_small_file(tmp, text.encode(), sync=_deferred_dirs is None)
    os.replace(tmp, path)
    if _deferred_dirs is not None:
        _deferred_dirs.add(path.parent)


def write_small_file(path: str | os.PathLike[str], data: bytes, sync: bool = False) -> None:
    """Create or truncate ``path`` holding ``data`` with bare system calls (no buffered file
    object: a broker writes thousands of these checkpoint files when it takes partitions on)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def _gc_paused() -> Iterator[None]:
    """No cyclic garbage collection while a log's batch index is built: its objects are
    plain tuples, yet every few hundred allocations a collection would walk all of them
    (it more than doubled the time to open a log of a million batches)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@contextmanager
def batched_syncs() -> Iterator[None]:
    """Checkpoint files written inside skip their own fsync; on exit one ``syncfs`` per
    filesystem makes all of them (and their renames) durable. A metadata delta that moves
    thousands of partitions then costs one sync instead of two per partition, which used to
    block the broker's event loop for seconds. Nested uses join the outer one."""
    global _deferred_dirs
    if _deferred_dirs is not None:
        yield
        return
    _deferred_dirs = set()
    try:
        yield
    finally:
        dirs, _deferred_dirs = _deferred_dirs, None
        _sync_filesystems(dirs)


def _sync_filesystems(dirs: set[Path]) -> None:
    seen: set[int] = set()
    for d in sorted(dirs):
        try:
            fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
        except FileNotFoundError:  # deleted meanwhile (a replica removed in the same delta)
            continue
        try:
            dev = os.fstat(fd).st_dev
            if dev not in seen:
                seen.add(dev)
                if _libc_syncfs is None or _libc_syncfs(fd) != 0:
                    os.sync()
        finally:
            os.close(fd)


def _load_syncfs() -> Any:
    try:
        import ctypes
        import ctypes.util

        fn = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).syncfs
        fn.argtypes = [ctypes.c_int]
        return fn
    except (OSError, AttributeError):
        return None


_libc_syncfs = _load_syncfs()


def _read_offset_file(path: Path) -> int:
    """The offset in a ``0``/``1``/offset checkpoint file (0 if unreadable)."""
    try:
        lines = path.read_text().split("\n")
        if lines[0].strip() != "0" or lines[1].strip() != "1":
            raise ValueError(f"header {lines[:2]!r}")
        return max(0, int(lines[2]))
    except (OSError, ValueError, IndexError):
        log.warning("partition log %s: unreadable %s; using 0", path.parent, path.name)
        return 0


def sync_dir(d: Path) -> None:
    """fsync a directory (its entries: renames, creations, deletions)."""
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _finish_swaps(d: Path, files: set[str]) -> set[str]:
    """Crash recovery of the log cleaner (Kafka's ``.cleaned``/``.swap``): a ``.cleaned`` file
    was never complete and goes; a ``.swap`` file was complete and synced, so the segments it
    replaces (those starting from its base offset up to its last offset) go and it takes the
    name of the first. Returns the directory's names afterwards."""
    for name in sorted(files):
        if name.endswith(CLEANED_SUFFIX):
            (d / name).unlink(missing_ok=True)
            log.warning("partition log %s: removed unfinished compacted segment %s", d, name)
    for name in sorted(f for f in files if f.endswith(SWAP_SUFFIX)):
        base_text = name[: -len(SWAP_SUFFIX)]
        if not base_text.isdigit():
            continue
        base = int(base_text)
        infos, _ = parse_batches((d / name).read_bytes())
        last = infos[-1].last_offset if infos else base
        for f in os.listdir(d):
            if f.endswith(".log") and f[:-4].isdigit() and base <= int(f[:-4]) <= last:
                (d / f"{f[:-4]}{INDEX_SUFFIX}").unlink(missing_ok=True)
                if int(f[:-4]) > base:
                    (d / f).unlink()
        os.replace(d / name, d / f"{base:020d}.log")
        log.warning("partition log %s: completed the swap of compacted segment %s", d, name)
    sync_dir(d)
    return set(os.listdir(d))


class _Segment:
    """One ``%020d.log`` file and the in-memory index of its batches."""

    def __init__(self, path: Path, base_offset: int) -> None:
        self.path = path
        self.base_offset = base_offset
        self.batches: list[BatchInfo] = []
        self.lasts: list[int] = []  # last offset of each batch, for bisect
        self.size = 0
        self.file = open(path, "a+b")  # noqa: SIM115 -- open for the segment's life
        self.verified = True  # every batch CRC-checked (scanned at open, or written here)
        self.indexed = False  # its .bindex on disk describes it as it is
        self.dirty = False  # bytes written (or found at open) not known to be fsynced

    @property
    def index_path(self) -> Path:
        return self.path.with_name(f"{self.base_offset:020d}{INDEX_SUFFIX}")

    @property
    def next_offset(self) -> int:
        return self.batches[-1].last_offset + 1 if self.batches else self.base_offset

    def load_index(self, recovery_point: int) -> bool:
        """Take the batches from the segment's ``.bindex`` instead of parsing the file: only if
        the index matches the file (base, size, CRC) and the segment lies wholly below the
        recovery point. Its batches are then verified when read (``verified`` False)."""
        try:
            data = self.index_path.read_bytes()
            entries = decode_index(data, self.base_offset, os.fstat(self.file.fileno()).st_size)
            batches = list(map(BatchInfo._make, entries))
        except (OSError, IndexMismatch) as e:
            log.info(
                "partition log %s: not using %s: %s", self.path.parent, self.index_path.name, e
            )
            return False
        end = batches[-1].last_offset + 1 if batches else self.base_offset
        if end > recovery_point:
            return False
        self.batches = batches
        self.lasts = [b.last_offset for b in batches]
        self.size = batches[-1].position + batches[-1].size if batches else 0
        self.verified = False
        self.indexed = True
        return True

    def write_index(self, sync: bool) -> None:
        """Write the ``.bindex`` of the segment as it is now (to ``.tmp``, renamed)."""
        tmp = f"{self.index_path}.tmp"
        write_small_file(tmp, encode_index(self.base_offset, self.size, self.batches), sync=sync)
        os.replace(tmp, self.index_path)
        self.indexed = True

    def drop_index(self) -> None:
        """The segment is about to change other than by appends: its index must go first."""
        self.index_path.unlink(missing_ok=True)
        self.indexed = False

    def recover(self) -> bool:
        """Index the file; truncate an invalid tail. Returns True if the file was intact."""
        self.file.seek(0)
        data = self.file.read()
        self.batches, valid = parse_batches(data)
        # offsets must increase
        for i in range(1, len(self.batches)):
            if self.batches[i].base_offset <= self.batches[i - 1].last_offset:
                valid = self.batches[i].position
                del self.batches[i:]
                break
        self.size = valid
        self.lasts = [b.last_offset for b in self.batches]
        if valid != len(data):
            log.warning(
                "partition log %s: invalid or torn batch at byte %d (file is %d bytes); "
                "truncating to %d",
                self.path,
                valid,
                len(data),
                valid,
            )
            self.file.truncate(valid)
            self.file.flush()
            os.fsync(self.file.fileno())
            return False
        return True

    def sync(self) -> None:
        self.file.flush()
        os.fsync(self.file.fileno())
        self.dirty = False

    def append(self, data: bytes, infos: list[BatchInfo]) -> None:
        self.indexed = False
        self.dirty = True
        self.file.seek(0, os.SEEK_END)
        self.file.write(data)
        self.file.flush()
        for b in infos:
            self.batches.append(b.moved(b.base_offset, self.size + b.position, b.leader_epoch))
            self.lasts.append(b.last_offset)
        self.size += len(data)

    def find(self, offset: int) -> int:
        """Index of the first batch whose last offset is >= ``offset``."""
        return bisect.bisect_left(self.lasts, offset)

    def read_from(self, index: int, max_bytes: int, max_offset: int) -> bytes:
        """Whole batches from ``index`` on, below ``max_offset`` (exclusive), up to ``max_bytes``
        (but at least one batch)."""
        if index >= len(self.batches):
            return b""
        start = self.batches[index].position
        end = start
        for b in self.batches[index:]:
            if b.last_offset >= max_offset or (end > start and end + b.size - start > max_bytes):
                break
            end = b.position + b.size
        if end == start:
            return b""
        data = os.pread(self.file.fileno(), end - start, start)
        if not self.verified:
            self._verify(data, index, start)
        return data

    def _verify(self, data: bytes, index: int, start: int) -> None:
        """Check bytes read from a segment opened from its index: each batch where the index
        says, whole, with a good CRC; else :class:`CorruptRecordError` (logged as an ERROR)."""
        view = memoryview(data)
        for b in self.batches[index:]:
            pos = b.position - start
            if pos >= len(view):
                return
            problem = ""
            if pos + b.size > len(view):
                problem = f"{len(view) - pos} of its {b.size} bytes on disk"
            else:
                base, length, magic, crc = struct.unpack_from(">qi4xbI", view, pos)
                if (base, length + _LOG_OVERHEAD, magic) != (b.base_offset, b.size, _MAGIC):
                    problem = f"header says offset {base}, {length + _LOG_OVERHEAD} bytes"
                elif crc32c.crc32c(view[pos + 21 : pos + b.size]) != crc:
                    problem = "CRC mismatch"
            if problem:
                what = (
                    f"partition log {self.path}: batch at byte {b.position} (offsets "
                    f"{b.base_offset}-{b.last_offset}) is corrupt: {problem}"
                )
                log.error("%s", what)
                raise CorruptRecordError(what)

    def truncate_at(self, index: int) -> None:
        self.drop_index()
        pos = self.batches[index].position if index < len(self.batches) else self.size
        del self.batches[index:]
        del self.lasts[index:]
        self.file.truncate(pos)
        self.file.flush()
        self.size = pos

    def close(self) -> None:
        self.file.close()


class PartitionLog:
    """A partition's segmented log plus its leader-epoch and high-watermark checkpoints."""

    def __init__(self, directory: Path, segment_bytes: int, fsync: bool) -> None:
        self.dir = directory
        self.segment_bytes = segment_bytes
        self.fsync = fsync
        self._segments: list[_Segment] = []
        self.epochs: list[tuple[int, int]] = []  # (leader epoch, start offset), ascending
        self.high_watermark = 0
        self._checkpointed_hw = -1
        self.producers = ProducerStateManager()
        self.txns = TxnIndex()  # open transactions, LSO, aborted index (rebuilt on open)
        self._deleted_below = 0  # DeleteRecords' log start offset (may fall inside a segment)
        self.producer_rebuild = (0, 0.0)  # (batches replayed, seconds) of the last rebuild
        self.first_dirty_offset = 0  # the log cleaner's checkpoint: offsets below are compacted
        self.layout_version = 0  # bumped whenever closed segments change (truncation, deletion)
        self.recovery_point = 0  # segments wholly below it are flushed and indexed
        self.opened = (0, 0)  # (segments opened from their index, segments scanned) at open

    # ---- opening ------------------------------------------------------------------------
    @classmethod
    def open(
        cls, directory: str | os.PathLike[str], segment_bytes: int = 1 << 30, fsync: bool = False
    ) -> PartitionLog:
        """Open (creating if needed) the log in ``directory`` and recover a torn tail."""
        with _gc_paused():
            return cls._open(Path(directory), segment_bytes, fsync)

    @classmethod
    def _open(cls, d: Path, segment_bytes: int, fsync: bool) -> PartitionLog:
        try:  # one listing instead of a glob and a stat per checkpoint file (brokers open
            d.mkdir(parents=True)  # thousands of logs at start-up)
            files: set[str] = set()
        except FileExistsError:
            files = set(os.listdir(d))
        plog = cls(d, segment_bytes, fsync)
        if any(f.endswith((CLEANED_SUFFIX, SWAP_SUFFIX)) for f in files):
            files = _finish_swaps(d, files)
        rp = _read_offset_file(d / RECOVERY_POINT_FILE) if RECOVERY_POINT_FILE in files else 0
        names = sorted(d / f for f in files if f.endswith(".log") and f[:-4].isdigit())
        from_index = scanned = 0
        for i, p in enumerate(names):
            seg = _Segment(p, int(p.stem))
            plog._segments.append(seg)
            if seg.index_path.name in files and seg.load_index(rp):
                from_index += 1
                continue
            scanned += 1
            intact = seg.recover()
            seg.dirty = True  # maybe only in the page cache (a kill -9): fsynced before indexed
            if not intact:
                for rest in names[i + 1 :]:
                    log.warning(
                        "partition log %s: removing segment %s after a corrupt one", d, rest.name
                    )
                    rest.unlink()
                break
        if not plog._segments:
            plog._segments.append(_Segment(d / f"{0:020d}.log", 0))
        plog.opened = (from_index, scanned)
        kept = {seg.index_path.name for seg in plog._segments if seg.indexed}
        for f in files:  # an index of a segment gone or not trusted (it is rewritten when flushed)
            if f.endswith(INDEX_SUFFIX) and f not in kept:
                (d / f).unlink(missing_ok=True)
        plog.recovery_point = rp
        if rp > plog.log_end_offset:
            plog._checkpoint_recovery_point(plog.log_end_offset)
        plog._load_checkpoints(files)
        if CLEANER_FILE in files:
            plog.first_dirty_offset = _read_offset_file(d / CLEANER_FILE)
        plog.rebuild_producer_state(files)
        plog.rebuild_txn_index()
        return plog

    def _load_checkpoints(self, files: set[str]) -> None:
        """Read the checkpoint files among ``files`` (the directory's names)."""
        end = self.log_end_offset
        self.epochs = []
        p = self.dir / LEADER_EPOCH_FILE
        if LEADER_EPOCH_FILE in files:
            try:
                lines = p.read_text().split("\n")
                if lines[0].strip() != "0":
                    raise ValueError(f"version {lines[0]!r}")
                count = int(lines[1])
                entries = lines[2 : 2 + count]
                if len(entries) != count:
                    raise ValueError(f"{len(entries)} entries, header says {count}")
                for line in entries:
                    e, o = line.split()
                    self.epochs.append((int(e), int(o)))
            except (ValueError, IndexError):
                log.warning(
                    "partition log %s: unreadable %s; discarding it", self.dir, LEADER_EPOCH_FILE
                )
                self.epochs = []
        kept = [(e, o) for e, o in self.epochs if o <= end]
        if kept != self.epochs:
            self.epochs = kept
            self._write_epochs()
        p = self.dir / HW_FILE
        hw = 0
        if HW_FILE in files:
            try:
                lines = p.read_text().split("\n")
                if lines[0].strip() != "0" or lines[1].strip() != "1":
                    raise ValueError(f"header {lines[:2]!r}")
                hw = int(lines[2])
            except (ValueError, IndexError):
                log.warning("partition log %s: unreadable %s; using 0", self.dir, HW_FILE)
        self.high_watermark = max(0, min(hw, end))
        self._checkpointed_hw = hw  # a missing file reads as 0: nothing to write for 0
        if LOG_START_FILE in files:
            try:
                lines = (self.dir / LOG_START_FILE).read_text().split("\n")
                if lines[0].strip() != "0" or lines[1].strip() != "1":
                    raise ValueError(f"header {lines[:2]!r}")
                self._deleted_below = max(0, min(int(lines[2]), end))
            except (ValueError, IndexError):
                log.warning(
                    "partition log %s: unreadable %s; ignoring it", self.dir, LOG_START_FILE
                )

    # ---- properties ---------------------------------------------------------------------
    @property
    def log_start_offset(self) -> int:
        first = (
            self._segments[0].base_offset
            if not self._segments[0].batches
            else self._segments[0].batches[0].base_offset
        )
        return max(first, self._deleted_below)

    def delete_records_before(self, offset: int) -> int:
        """DeleteRecords: move the log start offset up to ``offset`` (at most the log end),
        checkpoint it and delete the segments wholly below it. Returns the new log start."""
        offset = min(offset, self.log_end_offset)
        if offset <= self.log_start_offset:
            return self.log_start_offset
        self._deleted_below = offset
        self.layout_version += 1
        _write_atomic(self.dir / LOG_START_FILE, f"0\n1\n{offset}\n")
        self.producers.remove_before(offset)
        self.txns.remove_before(offset)
        while len(self._segments) > 1 and self._segments[1].base_offset <= offset:
            seg = self._segments.pop(0)
            seg.close()
            seg.drop_index()
            seg.path.unlink()
            log.info(
                "partition log %s: deleted segment %s (log start %d)",
                self.dir,
                seg.path.name,
                offset,
            )
        return self.log_start_offset

    @property
    def log_end_offset(self) -> int:
        return self._segments[-1].next_offset

    @property
    def latest_epoch(self) -> int:
        return self.epochs[-1][0] if self.epochs else -1

    def segment_files(self) -> list[Path]:
        return [s.path for s in self._segments]

    # ---- writes -------------------------------------------------------------------------
    def append(self, data: bytes, leader_epoch: int | None = None) -> tuple[int, int]:
        """Append one or more client record batches, assigning offsets from the log end.
        Returns (first offset, last offset). Raises :class:`InvalidBatchError` on bad input."""
        return self._append_client(data, _parse_client(data), leader_epoch)

    def append_as_leader(
        self, data: bytes, leader_epoch: int, max_batch_bytes: int | None = None
    ) -> LeaderAppend:
        """A leader's append of a client's batches: size and producer-state checks first
        (:class:`RecordTooLargeError`, :class:`InvalidBatchError`,
        :class:`~broker.replica.producer_state.ProducerStateError`; nothing appended then); a
        retried idempotent batch is not appended again but answered with its first offsets."""
        infos = _parse_client(data)
        if max_batch_bytes is not None:
            big = next((b for b in infos if b.size > max_batch_bytes), None)
            if big is not None:
                raise RecordTooLargeError(
                    f"A batch of {big.size} bytes exceeds max.message.bytes={max_batch_bytes}."
                )
        if any(b.producer_id >= 0 for b in infos):
            if len(infos) != 1:
                raise InvalidBatchError(
                    "an idempotent produce carries exactly one batch per partition"
                )
            b = infos[0]
            if b.base_sequence < 0 or b.producer_epoch < 0:
                raise InvalidBatchError(
                    f"producer id {b.producer_id} with epoch {b.producer_epoch} and "
                    f"sequence {b.base_sequence}"
                )
            dup = self.producers.check(
                b.producer_id, b.producer_epoch, b.base_sequence, b.last_sequence
            )
            if dup is not None:
                return LeaderAppend(dup.first_offset, dup.last_offset, duplicate=True)
        first, last = self._append_client(data, infos, leader_epoch)
        return LeaderAppend(first, last)

    def _append_client(
        self, data: bytes, infos: list[BatchInfo], leader_epoch: int | None
    ) -> tuple[int, int]:
        buf = bytearray(data)
        next_offset = self.log_end_offset
        first = next_offset
        rebased: list[BatchInfo] = []
        for b in infos:
            struct.pack_into(">q", buf, b.position, next_offset)
            if leader_epoch is not None:
                struct.pack_into(">i", buf, b.position + 12, leader_epoch)
            moved = b.moved(
                next_offset, b.position, b.leader_epoch if leader_epoch is None else leader_epoch
            )
            rebased.append(moved)
            next_offset = moved.last_offset + 1
        if leader_epoch is not None and leader_epoch > self.latest_epoch:
            self.assign_epoch(leader_epoch, first)
        self._write(bytes(buf), rebased)
        return first, next_offset - 1

    def append_as_follower(self, data: bytes) -> int:
        """Append batches fetched from the leader, keeping their offsets and leader epochs
        (batches wholly below the log end are skipped). Returns the new log end offset. Raises
        :class:`InvalidBatchError` on a bad batch or an offset gap; nothing is appended then."""
        infos, used = parse_batches(data)
        if used != len(data):
            raise InvalidBatchError(f"invalid or partial batch at byte {used} of {len(data)}")
        end = self.log_end_offset
        keep = [b for b in infos if b.last_offset >= end]
        if not keep:
            return end
        # A compacted leader log has gaps (the cleaner keeps offsets): past the first batch, or
        # above a log end that is not empty, batches need only go up.
        empty = not any(seg.batches for seg in self._segments)
        if keep[0].base_offset < end or (empty and keep[0].base_offset != end):
            raise InvalidBatchError(
                f"fetched batch starts at {keep[0].base_offset}, log ends at {end}"
            )
        for prev, b in zip(keep, keep[1:]):
            if b.base_offset <= prev.last_offset:
                raise InvalidBatchError(
                    f"offsets go back between {prev.last_offset} and {b.base_offset}"
                )
        for b in keep:
            if b.leader_epoch > self.latest_epoch:
                self.assign_epoch(b.leader_epoch, b.base_offset)
        start = keep[0].position
        self._write(
            bytes(data[start:]),
            [b.moved(b.base_offset, b.position - start, b.leader_epoch) for b in keep],
        )
        return self.log_end_offset

    def _write(self, data: bytes, infos: list[BatchInfo]) -> None:
        seg = self._segments[-1]
        if seg.size > 0 and seg.size + len(data) > self.segment_bytes:
            seg = self._roll(infos[0].base_offset)
        seg.append(data, infos)
        if self.fsync:
            seg.sync()
        for b in infos:
            if b.producer_id >= 0:
                self._track(b)
                self.txns.on_batch(
                    b.producer_id, b.base_offset, b.last_offset, b.transactional, b.control_type
                )

    def _track(self, b: BatchInfo) -> None:
        if b.control_type >= 0 or b.base_sequence < 0:
            self.producers.update_epoch(b.producer_id, b.producer_epoch)
            return
        self.producers.update(
            b.producer_id,
            b.producer_epoch,
            b.base_sequence,
            b.last_sequence,
            b.base_offset,
            b.last_offset,
            b.max_timestamp,
        )

    def _roll(self, base_offset: int) -> _Segment:
        self.snapshot_producer_state()
        new = _Segment(self.dir / f"{base_offset:020d}.log", base_offset)
        new.drop_index()  # one left by an earlier segment of that name (truncated away)
        self._segments.append(new)
        self._flush_to_recovery_point(self._segments[:-1], base_offset)
        log.info("partition log %s: rolled segment at offset %d", self.dir, base_offset)
        return new

    def _flush_to_recovery_point(self, segments: list[_Segment], point: int) -> None:
        """Kafka's flush: fsync ``segments`` (those with unsynced bytes), write the index of
        each that lacks one, then checkpoint the recovery point ``point`` (their end)."""
        for seg in segments:
            if seg.dirty:
                seg.sync()
            if not seg.indexed:
                seg.write_index(sync=False)  # a lost or torn index only costs a scan
        if point != self.recovery_point:
            self._checkpoint_recovery_point(point)

    def _checkpoint_recovery_point(self, point: int) -> None:
        _write_atomic(self.dir / RECOVERY_POINT_FILE, f"0\n1\n{point}\n")
        self.recovery_point = point

    def assign_epoch(self, epoch: int, start_offset: int) -> None:
        """Record that ``epoch`` starts at ``start_offset`` (leader-epoch cache)."""
        if self.epochs and epoch <= self.epochs[-1][0]:
            return
        self.epochs = [(e, o) for e, o in self.epochs if o < start_offset]
        self.epochs.append((epoch, start_offset))
        self._write_epochs()

    def _write_epochs(self) -> None:
        lines = ["0", str(len(self.epochs))] + [f"{e} {o}" for e, o in self.epochs]
        _write_atomic(self.dir / LEADER_EPOCH_FILE, "\n".join(lines) + "\n")

    def set_high_watermark(self, hw: int) -> None:
        """Set and checkpoint the high watermark (clamped to the log end)."""
        self.high_watermark = max(0, min(hw, self.log_end_offset))
        self.checkpoint_high_watermark()

    def advance_high_watermark(self, hw: int) -> None:
        """Set the high watermark in memory only (the hot path); :meth:`checkpoint_high_watermark`
        writes it later, as Kafka checkpoints periodically. A restart may resume lower, never higher."""
        self.high_watermark = max(0, min(hw, self.log_end_offset))

    def checkpoint_high_watermark(self) -> None:
        """Write the high watermark file if it differs from what is on disk."""
        if self.high_watermark != self._checkpointed_hw:
            _write_atomic(self.dir / HW_FILE, f"0\n1\n{self.high_watermark}\n")
            self._checkpointed_hw = self.high_watermark

    def epoch_for_offset(self, offset: int) -> int:
        """The leader epoch the record at ``offset`` was written in (-1 if unknown)."""
        i = bisect.bisect_right([o for _, o in self.epochs], offset) - 1
        return self.epochs[i][0] if i >= 0 else -1

    def truncate_to(self, offset: int) -> None:
        """Remove every batch containing an offset >= ``offset`` (whole batches, as Kafka)."""
        if offset >= self.log_end_offset:
            return
        self.layout_version += 1
        if self.recovery_point > offset:  # first: what it covers is about to change
            self._checkpoint_recovery_point(offset)
        while len(self._segments) > 1 and self._segments[-1].base_offset >= offset:
            seg = self._segments.pop()
            seg.close()
            seg.drop_index()
            seg.path.unlink()
        seg = self._segments[-1]
        seg.truncate_at(seg.find(offset))
        if self.fsync:
            os.fsync(seg.file.fileno())
        end = self.log_end_offset
        if self.recovery_point > end:
            self._checkpoint_recovery_point(end)
        kept = [(e, o) for e, o in self.epochs if o < end] if end > 0 else []
        if kept != self.epochs:
            self.epochs = kept
            self._write_epochs()
        if self.high_watermark > end:
            self.set_high_watermark(end)
        self.rebuild_producer_state()
        self.rebuild_txn_index()
        log.info("partition log %s: truncated to offset %d (log end %d)", self.dir, offset, end)

    # ---- compaction (broker/replica/cleaner.py drives it) ----------------------------------
    def cleanable_segments(self) -> list[tuple[Path, int, int]]:
        """(path, base offset, size) of the closed segments wholly below the last stable offset:
        what the log cleaner may rewrite (never the active segment)."""
        lso = self.last_stable_offset
        out = []
        for seg, nxt in zip(self._segments, self._segments[1:]):
            if nxt.base_offset > lso:
                break
            out.append((seg.path, seg.base_offset, seg.size))
        return out

    def segment_end(self, base_offset: int) -> int:
        """The base offset of the segment after the one at ``base_offset`` (the log end if last)."""
        bases = [s.base_offset for s in self._segments]
        i = bases.index(base_offset)
        return bases[i + 1] if i + 1 < len(bases) else self.log_end_offset

    def swap_cleaned(
        self, groups: list[CleanedGroup], layout_version: int, first_dirty: int
    ) -> bool:
        """Replace each group of segments by its compacted file, written and synced as
        ``<base>.log.cleaned`` by the cleaner: renamed to ``.swap`` (from then on a crash
        completes the swap on open), the other sources deleted, then renamed over the first
        source. Refused (False, the files removed) when truncation or DeleteRecords changed the
        segments meanwhile. Reads in flight hold whole ``bytes``, never a segment's file."""
        if layout_version != self.layout_version:
            for g in groups:
                g.path.unlink(missing_ok=True)
            return False
        position = {seg.base_offset: i for i, seg in enumerate(self._segments)}
        gone: set[int] = set()
        for g in groups:
            swap = g.path.with_name(g.path.name[: -len(CLEANED_SUFFIX)] + SWAP_SUFFIX)
            os.replace(g.path, swap)
            sync_dir(self.dir)
            olds = [self._segments[position[b]] for b in g.bases]
            for seg in olds:
                seg.close()
                seg.drop_index()
            for seg in olds[1:]:
                seg.path.unlink()
            os.replace(swap, olds[0].path)
            new = _Segment(olds[0].path, olds[0].base_offset)
            new.batches, new.size = g.batches, g.size
            new.lasts = [b.last_offset for b in g.batches]
            new.verified = all(seg.verified for seg in olds)
            new.write_index(sync=False)  # the cleaner synced the file
            self._segments[position[g.bases[0]]] = new
            gone.update(id(seg) for seg in olds[1:])
        sync_dir(self.dir)
        self._segments = [seg for seg in self._segments if id(seg) not in gone]
        self.layout_version += 1
        self.first_dirty_offset = first_dirty
        _write_atomic(self.dir / CLEANER_FILE, f"0\n1\n{first_dirty}\n")
        self.rebuild_txn_index()
        return True

    # ---- transactions ---------------------------------------------------------------------
    def rebuild_txn_index(self) -> None:
        """Open transactions and aborted ones from every batch of the log (the in-memory batch
        index only: no reads)."""
        self.txns = index = TxnIndex()
        for seg in self._segments:
            for b in seg.batches:
                if b.transactional:
                    index.on_batch(
                        b.producer_id, b.base_offset, b.last_offset, True, b.control_type
                    )
        index.remove_before(self.log_start_offset)

    @property
    def last_stable_offset(self) -> int:
        """The LSO: the high watermark, or the first offset of an unfinished transaction."""
        return self.txns.last_stable_offset(self.high_watermark)

    def aborted_transactions(self, start: int, end: int) -> list[AbortedTxn]:
        """Aborted transactions overlapping offsets [start, end)."""
        return self.txns.aborted_in(start, end)

    def append_marker(
        self,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        coordinator_epoch: int,
        leader_epoch: int,
        timestamp_ms: int,
    ) -> int:
        """A leader's append of a transaction marker; its offset. A marker older than the
        producer's current epoch is refused (INVALID_PRODUCER_EPOCH), as in Kafka."""
        entry = self.producers.producers.get(producer_id)
        if entry is not None and producer_epoch < entry.epoch:
            raise ProducerStateError(
                "invalid_producer_epoch",
                f"marker epoch {producer_epoch} of producer {producer_id} is older than "
                f"{entry.epoch}",
            )
        data = encode_marker(producer_id, producer_epoch, commit, coordinator_epoch, timestamp_ms)
        first, _ = self._append_client(data, _parse_client(data), leader_epoch)
        return first

    # ---- producer state -------------------------------------------------------------------
    def _snapshot_offsets(self, files: set[str] | None = None) -> list[int]:
        names = files if files is not None else os.listdir(self.dir)
        return sorted(
            int(n[: -len(SNAPSHOT_SUFFIX)])
            for n in names
            if n.endswith(SNAPSHOT_SUFFIX) and n[: -len(SNAPSHOT_SUFFIX)].isdigit()
        )

    def _snapshot_path(self, offset: int) -> Path:
        return self.dir / f"{offset:020d}{SNAPSHOT_SUFFIX}"

    def expire_producers(self, now_ms: int, expiration_ms: int) -> int:
        """Forget idempotent producers idle for ``producer.id.expiration.ms`` (never one with a
        transaction open in this partition); how many went."""
        return self.producers.remove_expired(now_ms, expiration_ms, keep=self.txns.ongoing)

    def snapshot_producer_state(self) -> None:
        """Write the producer state as of the log end to ``<log end>.snapshot`` (nothing when no
        producer is known), keeping the newest :data:`SNAPSHOTS_KEPT` snapshots."""
        if not self.producers:
            return
        end = self.log_end_offset
        offsets = self._snapshot_offsets()
        if end not in offsets:
            path = self._snapshot_path(end)
            write_small_file(f"{path}.tmp", encode_snapshot(self.producers), sync=self.fsync)
            os.replace(f"{path}.tmp", path)
            offsets.append(end)
        for old in sorted(offsets)[:-SNAPSHOTS_KEPT]:
            self._snapshot_path(old).unlink(missing_ok=True)

    def rebuild_producer_state(self, files: set[str] | None = None) -> None:
        """Producer state from the newest readable snapshot at or below the log end, then every
        batch after it (snapshots above the log end, left by a truncation, are deleted)."""
        started = time.perf_counter()
        end = self.log_end_offset
        state, start = ProducerStateManager(), self.log_start_offset
        for offset in reversed(self._snapshot_offsets(files)):
            path = self._snapshot_path(offset)
            if offset > end:
                path.unlink(missing_ok=True)
                continue
            try:
                state, start = decode_snapshot(path.read_bytes()), offset
                break
            except (OSError, SnapshotError) as e:
                log.warning(
                    "partition log %s: ignoring producer snapshot %s: %s", self.dir, path.name, e
                )
                path.unlink(missing_ok=True)
        self.producers = state
        # Newest first, keeping per producer only what the state can still hold: batches of its
        # newest epoch, at most MAX_BATCHES; then replay those oldest first.
        picked: list[BatchInfo] = []
        kept: dict[int, tuple[int, int]] = {}  # producer id -> (newest epoch, batches kept)
        replayed = 0
        marker_epochs: dict[int, int] = {}  # producer id -> newest epoch of its markers
        for seg in reversed(self._segments):
            if seg.next_offset <= start:
                break
            first = seg.find(start)
            for i in range(len(seg.batches) - 1, first - 1, -1):
                b = seg.batches[i]
                if b.producer_id < 0:
                    continue
                if b.control_type >= 0:
                    marker_epochs.setdefault(b.producer_id, b.producer_epoch)
                    continue
                replayed += 1
                epoch, count = kept.get(b.producer_id, (b.producer_epoch, 0))
                if count < MAX_BATCHES and b.producer_epoch == epoch:
                    kept[b.producer_id] = (epoch, count + 1)
                    picked.append(b)
        for b in reversed(picked):
            self._track(b)
        self.producers.remove_before(self.log_start_offset)
        for pid, epoch in marker_epochs.items():  # a marker's newer epoch fences older batches
            self.producers.update_epoch(pid, epoch)
        self.producer_rebuild = (replayed, time.perf_counter() - started)
        if replayed or state:
            log.info(
                "partition log %s: producer state of %d producers rebuilt from offset %d "
                "(%d batches replayed, %.3f s)",
                self.dir,
                len(self.producers),
                start,
                replayed,
                self.producer_rebuild[1],
            )

    # ---- reads --------------------------------------------------------------------------
    def read(
        self, from_offset: int, max_bytes: int = 1 << 20, max_offset: int | None = None
    ) -> bytes:
        """Raw batches starting with the one that contains ``from_offset`` (at least one batch
        even if larger than ``max_bytes``), only batches wholly below ``max_offset`` (e.g. the
        high watermark; default the log end). Empty at the end; ValueError if out of range."""
        if from_offset < self.log_start_offset or from_offset > self.log_end_offset:
            raise ValueError(
                f"offset {from_offset} out of range "
                f"[{self.log_start_offset}, {self.log_end_offset}]"
            )
        limit = self.log_end_offset if max_offset is None else max_offset
        i = max(0, bisect.bisect_right([s.base_offset for s in self._segments], from_offset) - 1)
        for seg in self._segments[i:]:
            idx = seg.find(from_offset)
            if idx < len(seg.batches):
                return seg.read_from(idx, max_bytes, limit)
        return b""

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """Kafka's leader-epoch lookup: (largest known epoch <= ``epoch``, the start offset of the
        next epoch or the log end). (-1, -1) when ``epoch`` is newer than every known one."""
        if not self.epochs or epoch < 0 or epoch > self.latest_epoch:
            return -1, -1
        if epoch == self.latest_epoch:
            return epoch, self.log_end_offset
        higher = next(i for i, (e, _) in enumerate(self.epochs) if e > epoch)
        if higher == 0:
            return epoch, self.epochs[0][1]
        return self.epochs[higher - 1][0], self.epochs[higher][1]

    def batch_times(self, max_offset: int) -> Iterator[tuple[int, int]]:
        """(max timestamp, base offset) of each batch wholly below ``max_offset``."""
        for seg in self._segments:
            for b in seg.batches:
                if b.last_offset >= max_offset:
                    return
                yield b.max_timestamp, b.base_offset

    def offset_for_timestamp(self, timestamp: int, max_offset: int) -> tuple[int, int] | None:
        """(max timestamp, base offset) of the first batch below ``max_offset`` whose max
        timestamp is >= ``timestamp``; None if there is none. Batch granularity: the offset is
        the batch's first, which may precede the first record at or after ``timestamp``."""
        return next(((t, o) for t, o in self.batch_times(max_offset) if t >= timestamp), None)

    def max_timestamp_offset(self, max_offset: int) -> tuple[int, int] | None:
        """(timestamp, base offset) of the batch with the largest timestamp below ``max_offset``."""
        return max(self.batch_times(max_offset), key=lambda t: t[0], default=None)

    def flush(self) -> None:
        """fsync every segment and move the recovery point to the log end."""
        for seg in self._segments:
            seg.sync()
        self._flush_to_recovery_point(self._segments, self.log_end_offset)

    def close(self) -> None:
        """Checkpoint the high watermark and producer state, flush to the recovery point (a
        clean shutdown: the next open scans nothing) and close the segment files."""
        self.checkpoint_high_watermark()
        self.snapshot_producer_state()
        self._flush_to_recovery_point(self._segments, self.log_end_offset)
        for seg in self._segments:
            seg.close()

    def abandon(self) -> None:
        """Close the segment files without writing anything (its log dir went offline)."""
        for seg in self._segments:
            try:
                seg.close()
            except OSError:  # buffered bytes the failed disk refuses: they are lost anyway
                pass
