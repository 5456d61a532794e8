"""Opt-in retention of the metadata log: which whole segments and snapshots may be deleted.

pykraft keeps the full history by default: the log is the audit trail. With
``metadata.max.retention.ms`` and/or ``metadata.max.retention.bytes`` set (Kafka's names; -1 =
no limit, the default), the oldest segments go once they are entirely covered by the newest
snapshot *and* older than the time limit (by the segment file's last write) or beyond the size
limit. The segment being written always stays, and so does the newest snapshot; snapshots that
end before the new log start can no longer be continued from and go too. A reader (a broker, a
lagging controller's FetchMetadata) that asks for a deleted offset is sent the snapshot.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SegmentInfo:
    """One metadata log segment, oldest first: its base offset, the next segment's base offset
    (None for the active, last one), size in bytes and last modification time."""

    base_offset: int
    next_base_offset: int | None
    size: int
    mtime_ms: int


def retention_cut(
    segments: list[SegmentInfo], snapshot_end_offset: int, now_ms: int, max_ms: int, max_bytes: int
) -> int | None:
    """The offset to delete whole segments before (``MetadataLog.truncate_before``), or None.

    ``snapshot_end_offset`` is the newest snapshot's end offset (last included offset + 1):
    only segments whose records all lie below it may go."""
    if max_ms < 0 and max_bytes < 0:
        return None
    total = sum(s.size for s in segments)
    cut = None
    for seg in segments:
        if seg.next_base_offset is None or seg.next_base_offset > snapshot_end_offset:
            break
        too_old = max_ms >= 0 and now_ms - seg.mtime_ms > max_ms
        too_big = max_bytes >= 0 and total > max_bytes
        if not (too_old or too_big):
            break
        total -= seg.size
        cut = seg.next_base_offset
    return cut
