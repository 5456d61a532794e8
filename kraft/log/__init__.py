"""On-disk metadata log: framed segment files, recovery, verification and snapshots."""

from kraft.log.errors import CorruptLogError, CorruptSnapshotError, OffsetOutOfRangeError
from kraft.log.metadata_log import DEFAULT_SEGMENT_BYTES, MetadataLog
from kraft.log.segment import (
    ChainState,
    Problem,
    ScanEntry,
    encode_frame,
    list_segments,
    parse_segment_name,
    scan_segment,
    segment_name,
    verify_log,
    verify_segment,
)
from kraft.log.snapshot import (
    SnapshotHeader,
    delete_snapshots_before,
    latest_snapshot,
    list_snapshots,
    parse_snapshot_name,
    read_snapshot,
    read_snapshot_header,
    snapshot_name,
    write_snapshot,
)

__all__ = [
    "DEFAULT_SEGMENT_BYTES",
    "ChainState",
    "CorruptLogError",
    "CorruptSnapshotError",
    "MetadataLog",
    "OffsetOutOfRangeError",
    "Problem",
    "ScanEntry",
    "SnapshotHeader",
    "delete_snapshots_before",
    "encode_frame",
    "latest_snapshot",
    "list_segments",
    "list_snapshots",
    "parse_segment_name",
    "parse_snapshot_name",
    "read_snapshot",
    "read_snapshot_header",
    "scan_segment",
    "segment_name",
    "snapshot_name",
    "verify_log",
    "verify_segment",
    "write_snapshot",
]
