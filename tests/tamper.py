"""Ways to damage a generated metadata log (testsupport/sample_log.py), one per row of the
audit-hardening issue, for the tamper tests. Each returns where it struck (file, byte
position, offset) so a test can assert the finding names it."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import msgpack

from kraft.log.segment import FRAME_HEADER, HEADER_SIZE, encode_frame, iter_frames, list_segments
from kraft.log.snapshot import read_snapshot, write_snapshot
from kraft.records import ZERO_HASH, PartitionRecord, batch_hash, decode_batch
from kraft.snapshotter import image_to_snapshot
from testsupport.sample_log import write_history
from tools.audit.integrity import INDEX_ENTRY


def sample(directory: Path, snapshots: tuple[str, ...] = ("created",)) -> dict:
    """A sample log in small segments (several batches each) with snapshots at the named
    steps; returns its ``Written`` and the snapshot paths."""
    written = write_history(directory, segment_bytes=1200)
    snaps = [image_to_snapshot(directory, written.images[s]) for s in snapshots]
    return {"written": written, "snapshots": snaps}


def frames(path: Path) -> list[tuple[int, int]]:
    """``(position, end)`` of every frame of a file."""
    return [(f.position, f.end) for f in iter_frames(path.read_bytes())]


def base_of(segment: Path, position: int) -> int:
    data = segment.read_bytes()
    length, _ = FRAME_HEADER.unpack_from(data, position)
    return decode_batch(data[position + HEADER_SIZE : position + HEADER_SIZE + length]).base_offset


def flip(path: Path, position: int) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= 0xFF
    path.write_bytes(bytes(data))


def flip_snapshot_chunk(snapshot: Path) -> int:
    """Flip a byte inside the first record chunk; returns the chunk frame's position."""
    pos, end = frames(snapshot)[1]
    flip(snapshot, (pos + HEADER_SIZE + end) // 2)
    return pos


def flip_snapshot_footer(snapshot: Path) -> int:
    pos, end = frames(snapshot)[-1]
    flip(snapshot, end - 3)
    return pos


def forge_snapshot_leader(snapshot: Path) -> None:
    """Change one partition's leader inside a snapshot and reseal it (frame CRCs and footer
    SHA-256 written anew, header untouched)."""
    header, records = read_snapshot(snapshot)
    recs = list(records)
    i = next(i for i, r in enumerate(recs) if isinstance(r, PartitionRecord))
    p = recs[i]
    other = next(b for b in p.replicas if b != p.leader)
    recs[i] = dataclasses.replace(p, leader=other)
    snapshot.unlink()
    write_snapshot(snapshot.parent, header, recs)


def cut_mid_batch(segment: Path, frame_no: int = 1) -> tuple[int, int]:
    """Truncate ``segment`` inside its ``frame_no``-th frame: ``(position, offset)`` of it."""
    pos, end = frames(segment)[frame_no]
    base = base_of(segment, pos)
    data = segment.read_bytes()
    segment.write_bytes(data[: (pos + end) // 2])
    return pos, base


def cut_at_boundary(segment: Path, frame_no: int) -> int:
    """Truncate ``segment`` where its ``frame_no``-th frame starts; its base offset."""
    pos, _ = frames(segment)[frame_no]
    base = base_of(segment, pos)
    segment.write_bytes(segment.read_bytes()[:pos])
    return base


def damage_length(segment: Path, frame_no: int = 1, grow: int = 1 << 24) -> tuple[int, int]:
    """Add ``grow`` to the length field of a frame: ``(position, offset)`` of it."""
    pos, end = frames(segment)[frame_no]
    base = base_of(segment, pos)
    data = bytearray(segment.read_bytes())
    length, crc = FRAME_HEADER.unpack_from(data, pos)
    FRAME_HEADER.pack_into(data, pos, length + grow, crc)
    segment.write_bytes(bytes(data))
    return pos, base


def edit_value_recrc(segment: Path, frame_no: int = 1) -> tuple[int, int]:
    """Change one value of a batch (its provenance's principal) and write its frame with a
    fresh CRC: ``(position, base offset)`` of the edited batch."""
    pos, end = frames(segment)[frame_no]
    data = segment.read_bytes()
    payload = data[pos + HEADER_SIZE : end]
    d = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    d["provenance"]["principal"] = "User:mallory"
    new = encode_frame(msgpack.packb(d, use_bin_type=True))
    segment.write_bytes(data[:pos] + new + data[end:])
    return pos, d["base_offset"]


def rewrite_after_deleting(log_dir: Path, drop: int) -> int:
    """Delete the ``drop``-th batch of the log and rewrite every later batch with new offsets
    and a new chain (a consistent forgery); one segment. Returns the dropped batch's base."""
    batches = []
    for seg in list_segments(log_dir):
        data = seg.read_bytes()
        batches += [decode_batch(bytes(f.payload)) for f in iter_frames(data)]
        seg.unlink()
    gone = batches.pop(drop)
    out, prev, nxt = [], ZERO_HASH, 0
    for b in batches:
        nb = dataclasses.replace(b, base_offset=nxt, prev_hash=prev)
        enc = nb.encode()
        out.append(encode_frame(enc))
        prev, nxt = batch_hash(enc), nb.next_offset
    (log_dir / f"{0:020d}.log").write_bytes(b"".join(out))
    return gone.base_offset


def write_index(segment: Path) -> Path:
    """A Kafka-layout offset index for ``segment`` (an entry per frame)."""
    base = int(segment.name[:20])
    entries = b"".join(
        INDEX_ENTRY.pack(base_of(segment, pos) - base, pos) for pos, _ in frames(segment)
    )
    index = segment.with_suffix(".index")
    index.write_bytes(entries)
    return index


def copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst
