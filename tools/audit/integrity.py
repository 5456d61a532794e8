"""The log's structure checked without Spark: every segment, snapshot and index file of a
metadata log directory scanned once, sequentially, every break a finding that names the check,
the file, the byte position and the offset, never an exception.

What it finds (:data:`RULES`): frames that are torn, fail their CRC or do not decode (never
counted as records); truncation (an error unless it is the torn tail of the newest segment);
offset gaps and overlaps (a deleted or emptied segment, a cut at a batch boundary that a later
segment exposes); hash-chain breaks, blamed on the batch whose content changed; terms going
back; snapshots that are damaged or whose records do not rebuild the image their header
names (a resealed forgery); index files that point at the wrong frame.

After a damaged length field the scan resynchronises on the next valid frame (a frame
header, a matching CRC and a batch that decodes) and says exactly which bytes and offsets
could not be read. Each damaged or missing stretch of offsets is a :class:`Region`: the
audit groups the safety findings after it under it as consequences (:func:`cause_of`).
"""

from __future__ import annotations

import struct
from bisect import bisect_right
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crc32c import crc32c

from kraft.log.errors import CorruptSnapshotError
from kraft.log.segment import (
    FRAME_HEADER,
    HEADER_SIZE,
    Frame,
    iter_frames,
    list_segments,
    parse_segment_name,
)
from kraft.log.snapshot import list_snapshots, parse_snapshot_name, read_snapshot
from kraft.records import ZERO_HASH, Batch, RecordDecodeError, decode_batch_envelope

ERROR, WARNING = "error", "warning"
# A batch payload is a msgpack map of 7 (format 2) or 9 (format 1) keys whose first is "format":
# where a frame may start.
BATCH_MARKS = (b"\x87\xa6format", b"\x89\xa6format")
INDEX_SUFFIX = ".index"
INDEX_ENTRY = struct.Struct(">II")  # relative offset, byte position (Kafka's offset index)

RULES: dict[str, tuple[str, str]] = {
    "segment-intact": (
        ERROR,
        "no segment is truncated, emptied or unreadable (a torn tail of the newest is a warning)",
    ),
    "frames-decodable": (ERROR, "every frame decodes to a batch; unreadable bytes are named"),
    "crc-intact": (ERROR, "every frame's CRC matches its bytes (no edited record)"),
    "offsets-contiguous": (
        ERROR,
        "every batch starts right after the previous one (no gap, no overlap)",
    ),
    "hash-chain": (
        ERROR,
        "every batch's hash is its successor's prev_hash (blamed on the batch that changed)",
    ),
    "terms-monotonic": (ERROR, "Raft terms never decrease"),
    "snapshot-intact": (
        ERROR,
        "each snapshot's frames, footer and records verify and rebuild the header's checksum",
    ),
    "index-consistent": (ERROR, "each offset index entry points at the batch it names"),
    "witness-agrees": (ERROR, "every controller's log holds the same history (--log-dir ...)"),
    "history-unchanged": (
        ERROR,
        "the history up to the head an earlier audit verified is unchanged",
    ),
}


@dataclass
class Finding:
    """One break: the check, where (file, byte position, offset) and what."""

    rule: str
    severity: str
    file: str | None
    position: int | None
    offset: int | None
    detail: str
    root_cause: bool = True

    def as_dict(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "severity": self.severity,
            "file": self.file,
            "position": self.position,
            "offset": self.offset,
            "detail": self.detail,
        }


@dataclass(frozen=True)
class Region:
    """Offsets ``first..last`` (``last`` None: up to the log's end) that could not be read or
    are missing; ``finding``: the finding that reports it."""

    first: int
    last: int | None
    finding: Finding


@dataclass(frozen=True)
class BatchInfo:
    """What the chain checks need of one intact batch."""

    file: str
    position: int
    base: int
    last: int
    term: int
    timestamp_ms: int
    prev_hash: bytes
    hash: bytes
    api: str
    reason: str


@dataclass
class Integrity:
    """The result of :func:`scan_log`."""

    log_dir: str
    findings: list[Finding] = field(default_factory=list)
    regions: list[Region] = field(default_factory=list)
    batches: list[BatchInfo] = field(default_factory=list)
    snapshots: list[dict[str, Any]] = field(default_factory=list)
    damaged_frames: int = 0

    @property
    def records(self) -> int:
        """Records in intact frames only."""
        return sum(b.last - b.base + 1 for b in self.batches)

    @property
    def head(self) -> dict[str, Any] | None:
        """The newest intact batch: its last offset, hash and term."""
        if not self.batches:
            return None
        b = self.batches[-1]
        return {"offset": b.last, "hash": b.hash.hex(), "term": b.term, "file": b.file}

    def hash_at(self, offset: int) -> str | None:
        """The hash of the batch ending at ``offset``, if one does."""
        lasts = [b.last for b in self.batches]
        i = bisect_right(lasts, offset) - 1
        if i >= 0 and self.batches[i].last == offset:
            return self.batches[i].hash.hex()
        return None

    def add(self, finding: Finding, first: int | None = None, last: int | None = None) -> None:
        self.findings.append(finding)
        if first is not None:
            self.regions.append(Region(first, last, finding))

    def controller_changes(self) -> list[dict[str, Any]]:
        """Every batch whose term is above the previous batch's: the new term's first batch
        (its time, offset, and the reason and API that wrote it)."""
        out, term = [], None
        for b in self.batches:
            if term is None or b.term > term:
                if term is not None:
                    out.append(
                        {
                            "term": b.term,
                            "offset": b.base,
                            "timestamp_ms": b.timestamp_ms,
                            "reason": b.reason or b.api or "new term",
                        }
                    )
                term = b.term
        return out


def _valid_frame(data: bytes, pos: int) -> tuple[int, Batch] | None:
    """``(end, batch)`` if an intact frame holding a decodable batch starts at ``pos``."""
    if pos < 0 or pos + HEADER_SIZE > len(data):
        return None
    length, crc = FRAME_HEADER.unpack_from(data, pos)
    end = pos + HEADER_SIZE + length
    if end > len(data):
        return None
    payload = data[pos + HEADER_SIZE : end]
    if crc32c(payload) != crc:
        return None
    try:
        return end, decode_batch_envelope(payload)
    except RecordDecodeError:
        return None


def resync(data: bytes, start: int) -> int | None:
    """The first position at or after ``start`` where an intact frame begins, or None."""
    pos = start
    while True:
        found = [m for m in (data.find(b, pos + HEADER_SIZE) for b in BATCH_MARKS) if m >= 0]
        if not found:
            return None
        mark = min(found)
        if _valid_frame(data, mark - HEADER_SIZE) is not None:
            return mark - HEADER_SIZE
        pos = mark - HEADER_SIZE + 1


@dataclass
class _Cursor:
    expected: int | None = None  # the offset the next batch must start at (None: unknown)
    term: int = -1
    # a truncated or emptied segment's finding and first lost offset: the next segment's
    # name says where the loss ends
    open_loss: tuple[Finding, int] | None = None


def _scan_segment(out: Integrity, path: Path, newest: bool, cur: _Cursor) -> None:
    name = path.name
    try:
        data = path.read_bytes()
    except OSError as e:
        out.add(
            Finding("segment-intact", ERROR, name, 0, cur.expected, f"unreadable: {e}"),
            cur.expected,
            None,
        )
        cur.expected = None
        return
    size = len(data)
    if size == 0:
        if not newest:
            first = cur.expected if cur.expected is not None else parse_segment_name(name)
            f = Finding(
                "segment-intact",
                ERROR,
                name,
                0,
                first,
                "segment file is empty (its records are gone)",
            )
            out.add(f)
            cur.open_loss = (f, first if first is not None else -1)
            cur.expected = None
        return
    pos = 0
    while pos < size:
        good = _valid_frame(data, pos)
        if good is not None:
            end, batch = good
            _batch(out, name, pos, batch, cur)
            pos = end
            continue
        out.damaged_frames += 1
        _damaged(out, name, data, pos, newest, cur)
        nxt = resync(data, pos + 1)
        if nxt is None:
            return
        pos = nxt


def _damaged(out: Integrity, name: str, data: bytes, pos: int, newest: bool, cur: _Cursor) -> None:
    """One damaged frame at ``pos``: say what is wrong and which bytes and offsets are lost."""
    size = len(data)
    nxt = resync(data, pos + 1)
    following = _valid_frame(data, nxt) if nxt is not None else None
    lost_to = following[1].base_offset - 1 if following is not None else None
    stop = nxt if nxt is not None else size
    lost = (
        f"offsets {cur.expected}..{lost_to}"
        if cur.expected is not None and lost_to is not None
        else (f"offsets from {cur.expected}" if cur.expected is not None else "offsets unknown")
    )
    length = None
    if pos + HEADER_SIZE <= size:
        length, crc = FRAME_HEADER.unpack_from(data, pos)
    end = pos + HEADER_SIZE + length if length is not None else None
    runs_past = end is None or end > size
    first = cur.expected if cur.expected is not None else -1
    cur.expected = None  # the next intact frame re-anchors the offsets
    if runs_past and nxt is None:  # nothing readable after it: a truncation
        what = (
            "frame header cut short"
            if length is None
            else f"frame of {length} bytes runs past the end of the file ({size} bytes)"
        )
        if newest:
            out.add(
                Finding(
                    "segment-intact",
                    WARNING,
                    name,
                    pos,
                    None if first < 0 else first,
                    f"torn tail of the newest segment: {what}; {size - pos} bytes dropped",
                )
            )
        else:
            f = Finding(
                "segment-intact",
                ERROR,
                name,
                pos,
                None if first < 0 else first,
                f"segment truncated mid-batch: {what}; {size - pos} bytes left",
            )
            out.add(f)
            cur.open_loss = (f, first)
        return
    if runs_past:
        rule, detail = "frames-decodable", f"damaged length field ({length} bytes past EOF)"
    elif crc32c(data[pos + HEADER_SIZE : end]) == crc:
        rule, detail = "frames-decodable", "the CRC matches but the payload is not a batch"
    elif end in (nxt, size):
        rule, detail = "crc-intact", f"CRC mismatch in a frame of {length} bytes"
    else:
        rule, detail = "frames-decodable", f"damaged length field ({length})"
    out.add(
        Finding(
            rule,
            ERROR,
            name,
            pos,
            None if first < 0 else first,
            f"{detail}; bytes {pos}..{stop - 1} unreadable ({stop - pos} bytes), {lost} lost"
            + ("" if nxt is not None else " (nothing readable after it in this segment)"),
        ),
        first,
        lost_to,
    )


def _batch(out: Integrity, name: str, pos: int, batch: Batch, cur: _Cursor) -> None:
    last = batch.last_offset
    if cur.expected is not None and batch.base_offset != cur.expected:
        if batch.base_offset > cur.expected:
            out.add(
                Finding(
                    "offsets-contiguous",
                    ERROR,
                    name,
                    pos,
                    cur.expected,
                    f"offsets {cur.expected}..{batch.base_offset - 1} are missing "
                    f"(the next batch starts at {batch.base_offset})",
                ),
                cur.expected,
                batch.base_offset - 1,
            )
        else:
            out.add(
                Finding(
                    "offsets-contiguous",
                    ERROR,
                    name,
                    pos,
                    batch.base_offset,
                    f"batch at {batch.base_offset} overlaps offsets up to {cur.expected - 1}",
                ),
                batch.base_offset,
                cur.expected - 1,
            )
    if batch.term < cur.term:
        out.add(
            Finding(
                "terms-monotonic",
                ERROR,
                name,
                pos,
                batch.base_offset,
                f"term {batch.term} after term {cur.term}",
            )
        )
    cur.term = max(cur.term, batch.term)
    cur.expected = last + 1
    p = batch.provenance
    out.batches.append(
        BatchInfo(
            name,
            pos,
            batch.base_offset,
            last,
            batch.term,
            batch.timestamp_ms,
            batch.prev_hash,
            batch.digest or b"",
            p.api,
            p.reason,
        )
    )


def _chain(out: Integrity, anchor: bytes | None) -> None:
    """Hash-chain links between offset-adjacent intact batches. One broken link alone (A→B,
    with B→C intact) means A's content changed: B's prev_hash still names A's old bytes. Two
    broken links in a row (A→B, B→C) mean B itself changed (its prev_hash, or its bytes)."""
    bs = out.batches
    broken = []
    for i in range(1, len(bs)):
        a, b = bs[i - 1], bs[i]
        if a.last + 1 == b.base and b.prev_hash != a.hash:
            broken.append(i)
    want = ZERO_HASH if bs and bs[0].base == 0 else anchor
    if bs and want is not None and bs[0].prev_hash != want:
        broken.insert(0, 0)
    seen = set(broken)
    done: set[int] = set()
    for i in broken:
        if i in done:
            continue
        if i + 1 in seen:
            blamed, done = bs[i], done | {i, i + 1}
            why = "its prev_hash or content changed: both its links are broken"
        elif i == 0:
            blamed, why = bs[0], "its prev_hash does not match the log's anchor"
        else:
            blamed = bs[i - 1]
            why = (
                f"its content changed: the next batch (at {bs[i].base}) holds prev_hash "
                f"{bs[i].prev_hash.hex()[:16]}…, its bytes now hash to {blamed.hash.hex()[:16]}…"
            )
            done.add(i)
        out.add(
            Finding(
                "hash-chain",
                ERROR,
                blamed.file,
                blamed.position,
                blamed.base,
                f"batch {blamed.base}..{blamed.last}: {why}",
            ),
            blamed.base,
            blamed.last,
        )


def _check_snapshot(out: Integrity, path: Path) -> dict[str, Any]:
    """Verify one snapshot; the checksum its records rebuild (None if they cannot)."""
    from kraft.metadata.replay import image_from_records

    info: dict[str, Any] = {"file": path.name, "records_checksum": None, "header": None}
    try:
        header, records = read_snapshot(path, strict=True)
        info["header"] = {
            "end_offset": header.end_offset,
            "checksum": header.image_checksum,
            "last_hash": header.last_hash.hex(),
        }
        image = image_from_records(
            records,
            offset=header.end_offset - 1,
            term=header.term,
            raft_index=header.raft_index,
            timestamp_ms=header.timestamp_ms,
            last_hash=header.last_hash,
        )
        rebuilt = image.checksum(header.checksum_version)
        info["records_checksum"] = rebuilt
        if rebuilt != header.image_checksum:
            out.add(
                Finding(
                    "snapshot-intact",
                    ERROR,
                    path.name,
                    0,
                    header.end_offset - 1,
                    f"its records rebuild image checksum {rebuilt[:16]}… but its header says "
                    f"{header.image_checksum[:16]}… (records edited and resealed)",
                )
            )
    except CorruptSnapshotError as e:
        offset = None
        try:
            offset = parse_snapshot_name(path)[0] - 1
        except ValueError:
            pass
        out.add(Finding("snapshot-intact", ERROR, path.name, e.position, offset, e.reason))
    except Exception as e:  # records that do not replay into an image
        out.add(
            Finding("snapshot-intact", ERROR, path.name, 0, None, f"records do not replay: {e}")
        )
    return info


def _check_index(out: Integrity, index: Path, segment: Path | None) -> None:
    """An offset index (Kafka's layout: 8-byte entries of relative offset and position) must
    name, at each entry, the position of the frame of the batch at that offset."""
    base = parse_segment_name(index.with_suffix(".log"))
    data = index.read_bytes()
    if segment is None or base is None:
        out.add(Finding("index-consistent", ERROR, index.name, 0, base, "no segment for it"))
        return
    seg = segment.read_bytes()
    if len(data) % INDEX_ENTRY.size:
        out.add(
            Finding(
                "index-consistent",
                ERROR,
                index.name,
                len(data) - len(data) % INDEX_ENTRY.size,
                base,
                f"{len(data)} bytes is not a whole number of 8-byte entries",
            )
        )
    for i in range(len(data) // INDEX_ENTRY.size):
        rel, position = INDEX_ENTRY.unpack_from(data, i * INDEX_ENTRY.size)
        if rel == 0 and position == 0 and i > 0:
            break  # preallocated zeros
        frame = _valid_frame(seg, position)
        if frame is None or frame[1].base_offset != base + rel:
            found = "no intact frame" if frame is None else f"batch {frame[1].base_offset}"
            out.add(
                Finding(
                    "index-consistent",
                    ERROR,
                    index.name,
                    i * INDEX_ENTRY.size,
                    base + rel,
                    f"entry {i} says offset {base + rel} is at byte {position} of "
                    f"{segment.name}; {found} there",
                )
            )
            return


def scan_log(log_dir: str | Path, upto: int | None = None) -> Integrity:
    """Scan every segment (up to the one holding ``upto``), snapshot and index file."""
    d = Path(log_dir)
    out = Integrity(str(d))
    segs = list_segments(d)
    if upto is not None:
        segs = [s for s in segs if (parse_segment_name(s) or 0) <= upto]
    snaps = list_snapshots(d)
    anchor: bytes | None = None
    first = parse_segment_name(segs[0]) if segs else None
    cur = _Cursor(expected=first)
    for i, seg in enumerate(segs):
        base = parse_segment_name(seg)
        if (
            cur.expected is not None
            and base is not None
            and base > cur.expected
            and seg.stat().st_size > 0
        ):
            out.add(
                Finding(
                    "offsets-contiguous",
                    ERROR,
                    seg.name,
                    0,
                    cur.expected,
                    f"offsets {cur.expected}..{base - 1} are missing: the previous segment "
                    f"ends at {cur.expected - 1}, {seg.name} starts at {base} "
                    "(a segment deleted, or cut at a batch boundary)",
                ),
                cur.expected,
                base - 1,
            )
            cur.expected = base
        elif cur.expected is None and base is not None:
            cur.expected = base
        if cur.open_loss is not None and base is not None:
            f, lost = cur.open_loss
            f.detail += f"; offsets {lost if lost >= 0 else '?'}..{base - 1} lost"
            out.regions.append(Region(lost, base - 1, f))
            cur.open_loss = None
        _scan_segment(out, seg, i == len(segs) - 1, cur)
    if cur.open_loss is not None:  # (only the newest segment leaves none)
        f, lost = cur.open_loss
        out.regions.append(Region(lost, None, f))
    for snap in snaps:
        info = _check_snapshot(out, snap)
        out.snapshots.append(info)
        h = info["header"]
        if first and h is not None and h["end_offset"] == first:
            anchor = bytes.fromhex(h["last_hash"])
    _chain(out, anchor)
    by_name = {s.name: s for s in segs}
    for index in sorted(d.glob(f"*{INDEX_SUFFIX}")):
        _check_index(out, index, by_name.get(index.with_suffix(".log").name))
    out.findings.sort(key=lambda f: (f.offset if f.offset is not None else -1, f.rule))
    out.regions.sort(key=lambda r: r.first)
    return out


def cause_of(regions: list[Region], offset: int | None) -> Region | None:
    """The damaged or missing stretch a finding at ``offset`` follows from: the latest that
    starts at or before it."""
    if offset is None:
        return None
    best = None
    for r in regions:
        if r.first <= offset:
            best = r
    return best


def frames_resync(data: bytes) -> Iterator[Frame]:
    """:func:`kraft.log.segment.iter_frames`, but after a damaged frame (torn, or a CRC that
    does not match) the split carries on at the next intact frame (:func:`resync`) instead of
    trusting the damaged length or stopping: the records after a damaged length field are
    still read."""
    start = 0
    while True:
        for frame in iter_frames(data, start):
            yield frame
            if frame.payload is None or not frame.crc_ok:
                nxt = resync(data, frame.position + 1)
                if nxt is None:
                    return
                start = nxt
                break
        else:
            return
