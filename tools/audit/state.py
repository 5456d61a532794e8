"""State at a point in the log: rebuild the image at offset N (or time T) by replaying the log
through ``kraft.metadata.delta`` (the replay every reader of the log uses), and compare it with
snapshots.

Read-only: segments are read, never opened as a :class:`MetadataLog` (whose recovery would
truncate a torn tail), split into frames the way the structure scan does
(:func:`tools.audit.integrity.frames_resync`: after a damaged frame it resynchronises on the
next intact one) and decoded by :func:`tools.audit.structs.decode_batch_fast` (the strict
decoder's batches, faster). Pure Python on the driver: replay is sequential by nature.

Past a break (offsets lost to a damaged frame, a cut or a missing segment, or a hash chain
that does not link) the replay carries on: exactly from a snapshot that ends inside the lost
stretch, if an intact one does, else approximately, onto the image without the lost batches.
A batch that does not fit that image is skipped whole (a batch is one controller command;
half of one is a state that never was) and counted under the break (:class:`Gap`). The first
intact snapshot passed after a break makes the replay exact again.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kraft.log.errors import CorruptSnapshotError
from kraft.log.segment import list_segments
from kraft.log.snapshot import (
    list_snapshots,
    parse_snapshot_name,
    read_snapshot,
    read_snapshot_header,
)
from kraft.metadata.delta import MetadataDelta, ReplayError
from kraft.metadata.image import MetadataImage
from kraft.metadata.replay import image_from_records
from kraft.records import Batch, RecordDecodeError
from kraft.snapshotter import image_from_snapshot
from tools.audit.integrity import frames_resync
from tools.audit.structs import decode_batch_fast

SAMPLES = 5  # unfit batches named per gap
# Batches per image at most (the delta applied, the batches kept for it dropped). Each image
# costs O(topics changed since the last); a batch that does not fit re-replays the batches
# since the last image, and is itself followed by a new image, so every batch is replayed at
# most twice whatever the interval.
FLUSH_EXACT, FLUSH_APPROXIMATE = 16384, 4096


class StateError(Exception):
    """The log cannot be replayed from its start (it starts too late, or at a bad snapshot)."""


@dataclass(frozen=True)
class Damage:
    """A frame that could not be read: where, and why."""

    file: str
    position: int
    why: str


@dataclass
class Gap:
    """A break in the replay: offsets ``first..last`` lost (``last`` = ``first - 1`` when none
    are: the hash chain alone breaks, or a batch did not fit an intact log), ``why`` and how
    the replay went on (``resumed``). ``unfit``: the batches after it, up to the next exact
    point, that did not fit the image and were skipped (``unfit_records`` records; ``samples``:
    the first few, offset and error)."""

    first: int
    last: int
    why: str
    resumed: str = "approximately, onto the image without the lost batches"
    exact: bool = False
    unfit: int = 0
    unfit_records: int = 0
    samples: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "offsets": [self.first, self.last],
            "why": self.why,
            "resumed": self.resumed,
            "exact": self.exact,
            "unfit_batches": self.unfit,
            "unfit_records": self.unfit_records,
            "samples": self.samples,
        }


@dataclass
class Replay:
    """Result of replaying up to a point: the image, snapshot comparisons on the way, the
    breaks passed (``gaps``) and, when the image is not exact, the break it follows."""

    image: MetadataImage
    comparisons: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    gaps: list[Gap] = field(default_factory=list)
    approximate_after: Gap | None = None

    @property
    def approximate(self) -> str | None:
        """Why the image is not exact, or None when it is."""
        g = self.approximate_after
        if g is None:
            return None
        where = (
            f"a gap at offsets {g.first}..{g.last}" if g.last >= g.first else f"offset {g.first}"
        )
        skipped = (
            f"; {g.unfit} batch(es), {g.unfit_records} record(s) after it did not fit and were "
            "skipped"
            if g.unfit
            else ""
        )
        return (
            f"approximate after {where} ({g.why}): the batches after it were replayed onto the "
            f"image without what it lost{skipped}"
        )


def _entries(log_dir: Path, after: int = -1) -> Iterator[Batch | Damage]:
    """The log's batches in order and its unreadable frames where they are, those batches
    ending at or before ``after`` skipped (segments that end before it are not read)."""
    segs = list_segments(log_dir)
    bases = [int(p.name[:20]) for p in segs]
    for i, path in enumerate(segs):
        if i + 1 < len(segs) and bases[i + 1] <= after + 1:
            continue
        try:
            data = path.read_bytes()
        except OSError as e:
            yield Damage(path.name, 0, f"unreadable: {e}")
            continue
        for frame in frames_resync(data):
            if frame.payload is None or not frame.crc_ok:
                why = "torn frame" if frame.payload is None else "CRC mismatch"
                yield Damage(path.name, frame.position, why)
                continue
            try:
                batch = decode_batch_fast(frame.payload)
            except RecordDecodeError as e:
                yield Damage(path.name, frame.position, f"undecodable frame: {e}")
                continue
            if batch.last_offset > after:
                yield batch


def _through(
    entries: Iterator[Batch | Damage], upto: int | None, upto_ms: int | None
) -> Iterator[Batch | Damage]:
    """Whole batches while their last offset <= ``upto`` and time <= ``upto_ms``."""
    for entry in entries:
        if isinstance(entry, Batch) and (
            (upto is not None and entry.last_offset > upto)
            or (upto_ms is not None and entry.timestamp_ms > upto_ms)
        ):
            return
        yield entry


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


def _moved(image: MetadataImage, batch: Batch, last: bool) -> MetadataImage:
    """``image`` positioned just before ``batch`` (``last`` False: as if the lost batches had
    led to it) or just after it (``last`` True: a batch skipped), its contents unchanged."""
    delta = MetadataDelta(image)
    if last:
        delta.set_provenance(
            offset=batch.last_offset,
            term=batch.term,
            raft_index=batch.raft_index,
            timestamp_ms=batch.timestamp_ms,
            last_hash=batch.digest or b"",
        )
    else:
        delta.set_provenance(
            offset=batch.base_offset - 1,
            term=image.term,
            raft_index=image.raft_index,
            timestamp_ms=image.timestamp_ms,
            last_hash=batch.prev_hash,
        )
    return delta.apply()


class _Replayer:
    """Replays batches one by one, through breaks (see the module's docstring). The image is
    ``base`` plus ``delta`` (``count`` batches). A batch that does not fit leaves the delta
    unusable, so it is rebuilt from ``base`` and those batches: kept in ``pending`` after a
    break (where such batches are common), else read again from the log (keeping every batch
    alive costs the collector more than the rare second read)."""

    def __init__(self, log_dir: Path, image: MetadataImage, snapshots: dict[int, Path]) -> None:
        self.log_dir = log_dir
        self.base = image
        self.delta = MetadataDelta(image)
        self.count = 0
        self.pending: list[Batch] = []
        self.last_hash = image.last_hash
        self.snapshots = snapshots  # last offset -> snapshot
        self.result = Replay(image)
        self.damage: Damage | None = None

    @property
    def offset(self) -> int:
        return self.delta.offset

    def flush(self) -> MetadataImage:
        """The image so far, made the new base."""
        if self.count:
            self.base = self.delta.apply()
            self.delta, self.count, self.pending = MetadataDelta(self.base), 0, []
        return self.base

    def rebase(self, image: MetadataImage) -> None:
        self.base, self.delta, self.count, self.pending = image, MetadataDelta(image), 0, []
        self.last_hash = image.last_hash

    def restore(self, upto: int) -> None:
        """Rebuild the delta from ``base`` and the batches since it, up to offset ``upto``."""
        self.delta = MetadataDelta(self.base)
        if self.count and not self.pending:
            batches: Iterator[Batch | Damage] = _entries(self.log_dir, self.base.offset)
        else:
            batches = iter(self.pending)
        for b in batches:  # they fitted before: they fit again
            if isinstance(b, Batch) and b.last_offset > self.delta.offset:
                if b.last_offset > upto:
                    break
                self.delta.replay_batch(b)

    def feed(self, entry: Batch | Damage) -> None:
        if isinstance(entry, Damage):
            self.damage = self.damage or entry
            return
        batch = entry
        if batch.last_offset <= self.offset:
            return  # offsets replayed already (an overlap: the structure scan reports it)
        if batch.base_offset <= self.offset:
            self.damage = None
            self.unfit(batch, f"overlaps offsets up to {self.offset}")
            return
        if batch.base_offset != self.offset + 1 or batch.prev_hash != self.last_hash:
            self.gap(batch)
        self.damage = None
        try:
            self.delta.replay_batch(batch)
        except ReplayError as e:
            self.restore(batch.base_offset - 1)
            self.unfit(batch, str(e))
            return
        self.count += 1
        approximate = self.result.approximate_after is not None
        if approximate:
            self.pending.append(batch)
        self.last_hash = batch.digest or b""
        snap = self.snapshots.get(batch.last_offset)
        if snap is not None:
            self.at_snapshot(snap)
        elif self.count >= (FLUSH_APPROXIMATE if approximate else FLUSH_EXACT):
            self.flush()

    def gap(self, batch: Batch) -> None:
        """``batch`` does not continue the replay: note the break and go on from the best
        image there is (an intact snapshot ending inside the lost offsets, else this one)."""
        first, last = self.offset + 1, batch.base_offset - 1
        if self.damage is not None:
            why = f"damaged frame in {self.damage.file} at byte {self.damage.position}"
        elif last >= first:
            why = "offsets missing"
        else:
            why = f"the hash chain breaks at offset {batch.base_offset}"
        gap = Gap(first, last, why)
        self.result.gaps.append(gap)
        image = self.flush()
        for s in sorted((s for s in self.snapshots if first - 1 <= s <= last), reverse=True):
            loaded = _load(self.snapshots[s])
            if loaded is not None:
                image = loaded
                gap.resumed = f"from snapshot {self.snapshots[s].name}"
                break
        if image.offset == last and image.last_hash == batch.prev_hash:
            gap.exact = True
            gap.resumed += ": exact again"
            self.result.approximate_after = None
        else:
            if image is not self.base:
                gap.resumed += ", then approximately (it does not end where the log goes on)"
            image = _moved(image, batch, last=False)
            self.result.approximate_after = gap
        self.rebase(image)

    def unfit(self, batch: Batch, error: str) -> None:
        """Skip ``batch``: count it under the break the image follows, or, on an exact
        image, make it a break of its own (the log itself holds a batch that does not fit)."""
        gap = self.result.approximate_after
        if gap is None:
            if self.result.error is None:
                self.result.error = error
            gap = Gap(batch.base_offset, batch.base_offset - 1, f"a batch does not fit: {error}")
            self.result.gaps.append(gap)
            self.result.approximate_after = gap
        gap.unfit += 1
        gap.unfit_records += len(batch.records)
        if len(gap.samples) < SAMPLES:
            gap.samples.append({"offset": batch.base_offset, "error": error})
        self.rebase(_moved(self.flush(), batch, last=True))
        snap = self.snapshots.get(batch.last_offset)
        if snap is not None:
            self.at_snapshot(snap)

    def at_snapshot(self, snap: Path) -> None:
        """Compare the exact image with ``snap``; an approximate one is replaced by it (if
        it is intact): exact from there on."""
        image = self.flush()
        gap = self.result.approximate_after
        if gap is None:
            self.result.comparisons.append(compare(image, snap))
            return
        loaded = _load(snap)
        self.result.comparisons.append(
            {
                "snapshot": snap.name,
                "offset": parse_snapshot_name(snap)[0] - 1,
                "rebuilt_checksum": "",
                "snapshot_checksum": "",
                "snapshot_records_checksum": None,
                "match": None,
                "error": "not compared: the replay before it is approximate"
                + ("; exact again from it" if loaded is not None else "; it is damaged"),
            }
        )
        if loaded is not None:
            gap.resumed += f"; exact again from snapshot {snap.name}"
            self.result.approximate_after = None
            self.rebase(loaded)


def _load(snapshot: Path) -> MetadataImage | None:
    """The image of an intact snapshot (its records rebuild its header's checksum), else None."""
    try:
        return image_from_snapshot(snapshot)
    except (CorruptSnapshotError, OSError):
        return None


def replay(
    log_dir: str | Path,
    upto: int | None = None,
    upto_ms: int | None = None,
    start: MetadataImage | None = None,
) -> Replay:
    """Replay whole batches while their last offset <= ``upto`` and time <= ``upto_ms``,
    comparing the image with every snapshot whose end offset is passed on the way; through
    breaks, as the module's docstring says. ``start``: the image of this log at some offset
    (an earlier replay's); only the batches after it are replayed."""
    log_dir = Path(log_dir)
    try:
        image, anchor = (start, None) if start is not None else _start(log_dir)
    except StateError as e:
        return Replay(MetadataImage.EMPTY, error=str(e))
    snapshots = {
        parse_snapshot_name(p)[0] - 1: p
        for p in list_snapshots(log_dir)
        if p != anchor and parse_snapshot_name(p)[0] - 1 > image.offset
    }
    r = _Replayer(log_dir, image, snapshots)
    with _gc_paused():
        for entry in _through(_entries(log_dir, image.offset), upto, upto_ms):
            r.feed(entry)
        r.result.image = r.flush()
    return r.result


@contextmanager
def _gc_paused() -> Iterator[None]:
    """The cyclic collector paused: replay builds millions of acyclic objects (and keeps the
    batches since the last image after a break), each collection would scan them again."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


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


def end_state(
    image: MetadataImage, limit: int = 500, approximate: str | None = None
) -> dict[str, Any]:
    """What the cluster looked like at the image: offline partitions (no leader),
    under-replicated ones (ISR smaller than the replicas) and fenced brokers; each list
    capped at ``limit`` with its full count. ``approximate``: why the image is not exact
    (:attr:`Replay.approximate`), or None."""
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
        "approximate": approximate,
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
