"""State at a point in the log: rebuild the image at offset N (or time T) by replaying the log
through ``kraft.metadata.replay`` (the replay every reader of the log uses), and compare it with
snapshots.

Read-only: segments are scanned, never opened as a :class:`MetadataLog` (whose recovery would
truncate a torn tail), their batches decoded by :func:`tools.audit.structs.decode_batch_fast`
(the strict decoder's batches, faster). Pure Python on the driver: replay is sequential by
nature.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kraft.log.errors import CorruptSnapshotError
from kraft.log.segment import list_segments, scan_segment
from kraft.log.snapshot import (
    list_snapshots,
    parse_snapshot_name,
    read_snapshot,
    read_snapshot_header,
)
from kraft.metadata.delta import MetadataDelta, ReplayError
from kraft.metadata.image import MetadataImage
from kraft.metadata.replay import image_from_records, replay_into
from kraft.records import Batch
from kraft.snapshotter import image_from_snapshot
from tools.audit.structs import decode_batch_fast


class StateError(Exception):
    """The log cannot be replayed to the requested point (damaged, or starts too late)."""


@dataclass
class Replay:
    """Result of replaying up to a point: the image and snapshot comparisons on the way."""

    image: MetadataImage
    comparisons: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None


def _batches(log_dir: Path, after: int = -1) -> Iterator[tuple[Batch, bytes]]:
    """The log's batches in order, those ending at or before ``after`` skipped (segments
    that end before it are not read)."""
    segs = list_segments(log_dir)
    bases = [int(p.name[:20]) for p in segs]
    for i, path in enumerate(segs):
        if i + 1 < len(segs) and bases[i + 1] <= after + 1:
            continue
        for entry in scan_segment(path, decode=decode_batch_fast):
            if entry.batch is None or entry.digest is None:
                raise StateError(
                    f"cannot replay past {path.name} byte {entry.position}: {entry.problem}"
                )
            if entry.batch.last_offset > after:
                yield entry.batch, entry.digest


def _through(
    batches: Iterator[tuple[Batch, bytes]], upto: int | None, upto_ms: int | None
) -> Iterator[Batch]:
    """Whole batches while their last offset <= ``upto`` and time <= ``upto_ms``."""
    for batch, _ in batches:
        if (upto is not None and batch.last_offset > upto) or (
            upto_ms is not None and batch.timestamp_ms > upto_ms
        ):
            return
        yield batch


def _to_snapshot(
    batches: Iterator[Batch], targets: dict[int, Path], reached: list[Path]
) -> Iterator[Batch]:
    """``batches`` up to and including the next one that ends where a snapshot in ``targets``
    does (that snapshot is appended to ``reached`` once the batch has been replayed)."""
    for batch in batches:
        yield batch
        snap = targets.get(batch.last_offset)
        if snap is not None:
            reached.append(snap)
            return


def _start(log_dir: Path) -> tuple[MetadataImage, Path | None]:
    """The image the log continues from: empty for a log from offset 0, else the snapshot
    that ends where the log starts."""
    segs = list_segments(log_dir)
    first = int(segs[0].name[:20]) if segs else 0
    if first == 0:
        return MetadataImage.EMPTY, None
    for snap in list_snapshots(log_dir):
        if parse_snapshot_name(snap)[0] == first:
            try:
                return image_from_snapshot(snap), snap
            except CorruptSnapshotError as e:
                raise StateError(f"the log starts at offset {first}: {e}") from None
    raise StateError(f"the log starts at offset {first} and no snapshot ends there")


def replay(
    log_dir: str | Path,
    upto: int | None = None,
    upto_ms: int | None = None,
    start: MetadataImage | None = None,
) -> Replay:
    """Replay whole batches while their last offset <= ``upto`` and time <= ``upto_ms``,
    comparing the image with every snapshot whose end offset is passed on the way.
    ``start``: the image of this log at some offset (an earlier replay's); only the batches
    after it are replayed."""
    log_dir = Path(log_dir)
    try:
        image, anchor = (start, None) if start is not None else _start(log_dir)
    except StateError as e:
        return Replay(MetadataImage.EMPTY, error=str(e))
    targets = {
        parse_snapshot_name(p)[0] - 1: p
        for p in list_snapshots(log_dir)
        if p != anchor and parse_snapshot_name(p)[0] - 1 > image.offset
    }
    result = Replay(image)
    delta = MetadataDelta(image)
    batches = _through(_batches(log_dir, image.offset), upto, upto_ms)
    try:
        while True:  # one replay per stretch that ends at a snapshot to compare with
            reached: list[Path] = []
            replay_into(delta, _to_snapshot(batches, targets, reached))
            if not reached:
                break
            image = delta.apply()
            delta = MetadataDelta(image)
            result.comparisons.append(compare(image, reached[0]))
    except (ReplayError, StateError) as e:
        result.error = str(e)
    if delta.offset != image.offset:  # the batches replayed before a damaged one count
        image = delta.apply()
    result.image = image
    return result


def records_checksum(snapshot: Path, version: int) -> tuple[str | None, str | None]:
    """The checksum of the image a snapshot's records rebuild, whatever its header says, or
    ``(None, why)`` when they cannot be read (never raises on a damaged file)."""
    try:
        header, records = read_snapshot(snapshot)
        image = image_from_records(
            records,
            offset=header.end_offset - 1,
            term=header.term,
            raft_index=header.raft_index,
            timestamp_ms=header.timestamp_ms,
            last_hash=header.last_hash,
        )
        return image.checksum(version), None
    except CorruptSnapshotError as e:
        return None, f"byte {e.position}: {e.reason}"
    except Exception as e:  # records that do not replay
        return None, f"records do not replay: {e}"


def compare(image: MetadataImage, snapshot: Path) -> dict[str, Any]:
    """The rebuilt image's checksum against a snapshot's header and against the image its
    records rebuild (a damaged snapshot gives ``match`` False and ``error``, never raises)."""
    offset = parse_snapshot_name(snapshot)[0] - 1
    try:
        header = read_snapshot_header(snapshot)
    except CorruptSnapshotError as e:
        return {
            "snapshot": snapshot.name,
            "offset": offset,
            "rebuilt_checksum": image.checksum(),
            "snapshot_checksum": "",
            "snapshot_records_checksum": None,
            "match": False,
            "error": f"byte {e.position}: {e.reason}",
        }
    rebuilt = image.checksum(header.checksum_version)  # the version the snapshot's format holds
    from_records, error = records_checksum(snapshot, header.checksum_version)
    return {
        "snapshot": snapshot.name,
        "offset": header.end_offset - 1,
        "rebuilt_checksum": rebuilt,
        "snapshot_checksum": header.image_checksum,
        "snapshot_records_checksum": from_records,
        "match": rebuilt == header.image_checksum == from_records,
        "error": error,
    }


def end_state(image: MetadataImage, limit: int = 500) -> dict[str, Any]:
    """What the cluster looked like at the image: offline partitions (no leader),
    under-replicated ones (ISR smaller than the replicas) and fenced brokers; each list
    capped at ``limit`` with its full count."""
    offline, under = [], []
    for t in sorted(image.topics_by_id.values(), key=lambda t: t.name):
        for pid, p in sorted(t.partitions.items()):
            row = {
                "partition": f"{t.name}-{pid}",
                "leader": p.leader,
                "isr": list(p.isr),
                "replicas": list(p.replicas),
            }
            if p.leader < 0:
                offline.append(row)
            elif len(p.isr) < len(p.replicas):
                under.append(row)
    fenced = [
        b.broker_id for b in sorted(image.brokers.values(), key=lambda b: b.broker_id) if b.fenced
    ]
    return {
        "offset": image.offset,
        "timestamp_ms": image.timestamp_ms,
        "offline_count": len(offline),
        "offline": offline[:limit],
        "under_replicated_count": len(under),
        "under_replicated": under[:limit],
        "fenced_brokers": fenced,
        "brokers": len(image.brokers),
    }


def summary(image: MetadataImage) -> dict[str, Any]:
    """A JSON view of an image: position, checksum, brokers, topics with partitions."""
    return {
        "offset": image.offset,
        "term": image.term,
        "timestamp_ms": image.timestamp_ms,
        "checksum": image.checksum(),
        "controller_id": image.controller_id,
        "features": dict(image.features),
        "brokers": [
            {
                "broker_id": b.broker_id,
                "epoch": b.epoch,
                "fenced": b.fenced,
                "in_controlled_shutdown": b.in_controlled_shutdown,
                "rack": b.rack,
            }
            for b in sorted(image.brokers.values(), key=lambda b: b.broker_id)
        ],
        "topics": [
            {
                "name": t.name,
                "topic_id": t.topic_id,
                "partitions": [
                    {
                        "partition": pid,
                        "leader": p.leader,
                        "isr": list(p.isr),
                        "replicas": list(p.replicas),
                        "leader_epoch": p.leader_epoch,
                        "partition_epoch": p.partition_epoch,
                    }
                    for pid, p in sorted(t.partitions.items())
                ],
            }
            for t in sorted(image.topics_by_id.values(), key=lambda t: t.name)
        ],
        "configs": [
            {"resource_type": rt, "resource_name": name, "configs": dict(c)}
            for (rt, name), c in sorted(image.configs.items())
        ],
    }
