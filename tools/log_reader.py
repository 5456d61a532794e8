"""Read a metadata log for the operator tools: from a directory, a segment file, a snapshot, or a
live controller over RPC.

Two kinds of reader:

* :func:`scan_path` walks every frame of a directory's segments (or one segment) read-only and
  yields :class:`ScanItem` values — good batches *and* problems (bad CRC, undecodable batch,
  broken hash chain, offset gap) with the file, byte position and offset — continuing past a bad
  frame where its length allows. ``kraft log dump`` prints them.
* :class:`History` is the verified history that ``kraft log diff`` and ``kraft shell`` replay: a
  starting image (empty, or a snapshot when older segments were deleted) plus the batches after
  it, in order. It never writes: a live controller's directory can be read while the controller
  appends to it (a torn frame at the end of the last segment is an append in progress and is
  left out). :meth:`History.from_controllers` pulls the same thing with ``FetchMetadata`` (and
  ``FetchSnapshot`` when the log starts after offset 0).
"""

from __future__ import annotations

import tempfile
from bisect import bisect_right
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kraft.log.segment import (
    OFFSET,
    TORN,
    ChainState,
    Problem,
    ScanEntry,
    list_segments,
    parse_segment_name,
    scan_segment,
)
from kraft.log.snapshot import SUFFIX as SNAPSHOT_SUFFIX
from kraft.log.snapshot import parse_snapshot_name
from kraft.metadata.delta import ReplayError
from kraft.metadata.follower import LogFollower, SnapshotFetchError
from kraft.metadata.image import MetadataImage
from kraft.metadata.replay import replay
from kraft.records import Batch, RecordDecodeError, batch_hash, decode_batch

if TYPE_CHECKING:
    from kraft.rpc.client import ControllerClient

FETCH_MAX_BYTES = 4 << 20


class LogReadError(Exception):
    """The log cannot be read into a history: missing, not a log, or damaged (says where)."""


@dataclass(frozen=True, slots=True)
class ScanItem:
    """One frame of a scanned log: ``entry.batch`` when it decoded, ``entry.problem`` when
    something is wrong with it (both can be set, e.g. a chain break), or a problem that is not
    tied to a frame (``entry`` None: a segment named for the wrong offset)."""

    path: Path
    entry: ScanEntry | None
    problem: Problem | None


def is_snapshot_file(path: Path) -> bool:
    return path.is_file() and path.name.endswith(SNAPSHOT_SUFFIX)


def resolve_log_dir(path: str | Path) -> Path:
    """The directory holding segment files: ``path`` itself, or its ``log/`` subdirectory (a
    controller's metadata dir). Raises LogReadError when neither looks like a metadata log."""
    p = Path(path)
    if not p.exists():
        raise LogReadError(f"{p} does not exist")
    if not p.is_dir():
        raise LogReadError(f"{p} is not a directory")
    for candidate in (p, p / "log"):
        if candidate.is_dir() and (list_segments(candidate) or snapshot_files(candidate)):
            return candidate
    raise LogReadError(f"{p} holds no metadata log segments (*.log) or snapshots (*.checkpoint)")


def snapshot_files(directory: Path) -> list[Path]:
    """Complete snapshots in ``directory``, oldest first, without touching leftovers."""
    found = []
    for p in directory.iterdir():
        try:
            found.append((parse_snapshot_name(p), p))
        except ValueError:
            continue
    return [p for _, p in sorted(found)]


def scan_path(path: str | Path) -> Iterator[ScanItem]:
    """Every frame of a segment file, or of all segments of a log directory checked as one log
    (offsets and the hash chain continue across segments). Never raises on bad data."""
    p = Path(path)
    if p.is_file():
        for entry in scan_segment(p):
            yield ScanItem(p, entry, entry.problem)
        return
    segments = list_segments(resolve_log_dir(p))
    if not segments:
        return
    state = ChainState.for_first_segment(parse_segment_name(segments[0]) or 0)
    for seg in segments:
        base = parse_segment_name(seg)
        if seg.stat().st_size == 0:
            continue
        if state.next_offset is not None and base != state.next_offset:
            yield ScanItem(
                seg,
                None,
                Problem(
                    seg,
                    0,
                    state.next_offset,
                    OFFSET,
                    f"segment is named for offset {base} but the log continues at {state.next_offset}",
                ),
            )
            state.next_offset, state.last_hash = base, None  # re-anchor after the gap
        for entry in scan_segment(seg, state):
            yield ScanItem(seg, entry, entry.problem)


class History:
    """A verified stretch of metadata history: ``base`` (the image before the first batch) and
    ``batches`` in offset order, each continuing the previous one's hash chain."""

    def __init__(
        self, base: MetadataImage, batches: list[Batch], digests: list[bytes], source: str
    ) -> None:
        self.base = base
        self.batches = batches
        self.digests = digests
        self.source = source
        self._first_offsets = [b.base_offset for b in batches]

    # ---- loading ------------------------------------------------------------------------------

    @classmethod
    def load(cls, path: str | Path) -> History:
        """From a log directory (or a controller's metadata dir), one segment file starting at
        offset 0, or a snapshot file (its image, no batches)."""
        p = Path(path)
        if is_snapshot_file(p):
            return cls(_image_from_snapshot(p), [], [], str(p))
        if p.is_file():
            base = parse_segment_name(p)
            if base is None:
                raise LogReadError(
                    f"{p} is neither a segment (%020d.log) nor a snapshot (.checkpoint)"
                )
            if base != 0:
                raise LogReadError(
                    f"{p.name} does not start at offset 0; open its directory so "
                    "a snapshot can supply the earlier state"
                )
            return cls._from_items(MetadataImage.EMPTY, scan_path(p), str(p))
        directory = resolve_log_dir(p)
        segments = list_segments(directory)
        start = parse_segment_name(segments[0]) if segments else None
        image = MetadataImage.EMPTY
        if start is None or start > 0:
            image = _snapshot_base(directory, start)
        return cls._from_items(image, scan_path(directory), str(directory))

    @classmethod
    def _from_items(cls, base: MetadataImage, items: Iterator[ScanItem], source: str) -> History:
        batches: list[Batch] = []
        digests: list[bytes] = []
        pending: Problem | None = None
        for item in items:
            if pending is not None:  # a torn frame is only harmless as the very last thing
                raise LogReadError(f"{source}: {pending}")
            if item.problem is not None:
                if item.problem.kind == TORN:
                    pending = item.problem
                    continue
                raise LogReadError(
                    f"{source}: {item.problem} (run 'kraft log dump' for every problem)"
                )
            entry = item.entry
            # without a problem a frame decoded: it has a batch and its digest
            assert entry is not None and entry.batch is not None and entry.digest is not None
            if entry.batch.last_offset <= base.offset:
                continue  # covered by the snapshot
            batches.append(entry.batch)
            digests.append(entry.digest)
        history = cls(base, batches, digests, source)
        history._check_continues()
        return history

    @classmethod
    def from_controllers(
        cls, bootstrap: list[tuple[str, int]], timeout: float, credentials: Any = None
    ) -> History:
        """Pull the whole log from the controllers with FetchMetadata (any controller answers);
        ``credentials`` for controllers that require RPC authentication."""
        import trio

        from kraft.rpc.client import ControllerClient

        async def pull() -> History:
            client = ControllerClient(
                bootstrap, client_id="kraft-shell", request_timeout=timeout, credentials=credentials
            )
            try:
                with trio.fail_after(timeout):
                    return await _pull(client, timeout)
            finally:
                await client.aclose()

        try:
            return trio.run(pull)
        except trio.TooSlowError:
            raise LogReadError(
                f"could not read the whole metadata log within {timeout:g}s"
            ) from None

    def _check_continues(self) -> None:
        """Every batch follows the one before it (the first: the base image) in offset and hash."""
        offset, last_hash = self.base.offset, self.base.last_hash
        for batch, digest in zip(self.batches, self.digests):
            if batch.base_offset != offset + 1:
                raise LogReadError(
                    f"{self.source}: expected a batch at offset {offset + 1}, found "
                    f"one at {batch.base_offset}"
                )
            if batch.prev_hash != last_hash:
                raise LogReadError(
                    f"{self.source}: batch at offset {batch.base_offset} does not "
                    "continue the hash chain"
                )
            offset, last_hash = batch.last_offset, digest

    # ---- queries ------------------------------------------------------------------------------

    @property
    def first_offset(self) -> int:
        """The first offset whose record is in ``batches`` (base.offset + 1)."""
        return self.base.offset + 1

    @property
    def last_offset(self) -> int:
        return self.batches[-1].last_offset if self.batches else self.base.offset

    def batch_index_through(self, offset: int) -> int:
        """How many batches make up the history through ``offset``: every batch whose first
        offset is <= ``offset`` (the batch holding ``offset`` is included whole — batches are
        atomic)."""
        return bisect_right(self._first_offsets, offset)

    def offset_at_time(self, timestamp_ms: int) -> int:
        """The last offset written at or before ``timestamp_ms`` (base.offset if none)."""
        offset = self.base.offset
        for batch in self.batches:
            if batch.timestamp_ms > timestamp_ms:
                break
            offset = batch.last_offset
        return offset

    def image_at(self, offset: int | None = None) -> MetadataImage:
        """The image after the batch holding ``offset`` (None: the latest). Raises LogReadError
        for an offset before the history starts."""
        count = len(self.batches) if offset is None else self.batch_index_through(offset)
        if offset is not None and offset < self.base.offset:
            raise LogReadError(
                f"offset {offset} is before the start of this history (offset {self.base.offset})"
            )
        try:
            return replay(self.base, self.batches[:count])
        except ReplayError as e:
            raise LogReadError(f"replay failed: {e}") from None


def _image_from_snapshot(path: Path) -> MetadataImage:
    from kraft.log.errors import CorruptSnapshotError
    from kraft.snapshotter import image_from_snapshot

    try:
        return image_from_snapshot(path)
    except (CorruptSnapshotError, ReplayError, OSError) as e:
        raise LogReadError(f"cannot load snapshot {path}: {e}") from None


def _snapshot_base(directory: Path, start: int | None) -> MetadataImage:
    """The oldest snapshot the log continues from (the log starts at ``start`` > 0, or has no
    segments at all: then the newest snapshot)."""
    snaps = snapshot_files(directory)
    if start is None:
        if not snaps:
            raise LogReadError(f"{directory} holds no segments and no snapshot")
        return _image_from_snapshot(snaps[-1])
    for snap in snaps:
        end, _ = parse_snapshot_name(snap)
        if end >= start:
            return _image_from_snapshot(snap)
    raise LogReadError(
        f"the log in {directory} starts at offset {start} but no snapshot covers the "
        "offsets before it"
    )


class _Pull:
    """The whole log as the controllers hold it now, gathered by a LogFollower (one pass: the
    follow stops once caught up with the high watermark)."""

    def __init__(self, follower: LogFollower, timeout: float) -> None:
        self.follower = follower
        self.timeout = timeout
        self.base = MetadataImage.EMPTY
        self.batches: list[Batch] = []
        self.digests: list[bytes] = []
        self._next = 0

    def next_offset(self) -> int:
        return self._next

    async def on_snapshot(self, info: dict[str, Any]) -> None:
        self.base = await _fetch_snapshot(self.follower, str(info.get("name")), self.timeout)
        self.batches, self.digests, self._next = [], [], self.base.offset + 1

    async def on_batches(self, batches: list[bytes], high_watermark: int) -> bool:
        for encoded in batches:
            try:
                batch = decode_batch(encoded)
            except RecordDecodeError as e:
                raise LogReadError(
                    f"controller sent an undecodable batch at offset {self._next}: {e}"
                ) from None
            if batch.last_offset < self._next:
                continue
            self.batches.append(batch)
            self.digests.append(batch_hash(encoded))
            self._next = batch.next_offset
        return self._next >= high_watermark or not batches  # caught up


async def _pull(client: ControllerClient, timeout: float) -> History:
    follower = LogFollower(
        client, max_wait_ms=0, max_bytes=FETCH_MAX_BYTES, timeout=timeout, retry=None
    )
    pull = _Pull(follower, timeout)
    await follower.follow(pull)
    history = History(
        pull.base,
        pull.batches,
        pull.digests,
        "controllers " + ",".join(f"{h}:{p}" for h, p in client.bootstrap),
    )
    history._check_continues()
    return history


async def _fetch_snapshot(follower: LogFollower, name: str, timeout: float) -> MetadataImage:
    with tempfile.TemporaryDirectory(prefix="kraft-shell-") as tmp:
        path = Path(tmp) / Path(name).name
        try:
            await follower.fetch_snapshot(name, path, max_bytes=FETCH_MAX_BYTES, timeout=timeout)
        except SnapshotFetchError as e:
            raise LogReadError(str(e)) from None
        return _image_from_snapshot(path)
