"""When to write a metadata snapshot, how to turn an image into one, and how to load one back.

Snapshots hold the image at a batch boundary (``kraft.log.snapshot`` defines the file format). A
controller writes one after ``metadata.log.max.record.bytes.between.snapshots`` bytes of new log
or ``metadata.log.max.snapshot.interval.ms`` with new records; PySyncObj's compaction dump is also
a snapshot, so a lagging controller can be installed from it. Brokers fetch them with
``FetchSnapshot`` when their offset is before the log start.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import os
import signal
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import msgpack

from kraft.errors import ErrorCode, KraftError
from kraft.log.errors import CorruptSnapshotError
from kraft.log.metadata_log import MetadataLog
from kraft.log.snapshot import (
    delete_snapshots_before,
    latest_snapshot,
    list_snapshots,
    parse_snapshot_name,
    read_snapshot,
)
from kraft.metadata.image import MetadataImage
from kraft.metadata.replay import image_from_records
from kraft.retention import SegmentInfo, retention_cut
from kraft.snapshot_image import FrameIndex, file_identity, write_image_snapshot

log = logging.getLogger(__name__)


RequestIds = tuple[tuple[str, dict[str, Any]], ...]
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def image_to_snapshot(directory: Path, image: MetadataImage, request_ids: RequestIds = ()) -> Path:
    """Write ``image`` (and the dedup window at its offset) as a snapshot file in
    ``directory``; returns its path."""
    return write_image_snapshot(directory, image, request_ids)[0]


def snapshot_state(path: Path, freeze: bool = False) -> tuple[MetadataImage, RequestIds]:
    """Read a snapshot file back into an image and its dedup window, verified: frame CRCs, the
    footer's SHA-256 and count, and the rebuilt image's checksum against the header's. Partition
    values are not type-checked one by one (most of a big snapshot, ~20% of a load): the image
    checksum covers their exact encoding (in format 3 each topic frame's hash is the topic's
    digest the checksum holds: nothing is packed again). When it does not match (or the records
    do not replay), the file is read again strictly, which names a badly typed value; either way
    it raises CorruptSnapshotError. ``freeze``: the built image leaves the cyclic GC's reach
    (kept long)."""
    image, request_ids, _ = _load_snapshot(path, freeze)
    return image, request_ids


def _load_snapshot(path: Path, freeze: bool) -> tuple[MetadataImage, RequestIds, FrameIndex | None]:
    """:func:`snapshot_state`, and where the file holds each topic's frame (format 3), for the
    next snapshot to copy from."""
    identity = file_identity(path)
    header, records = read_snapshot(path, unchecked_partitions=True)
    try:
        image = image_from_records(
            records,
            offset=header.end_offset - 1,
            term=header.term,
            raft_index=header.raft_index,
            timestamp_ms=header.timestamp_ms,
            last_hash=header.last_hash,
            freeze=freeze,
            adopt_digests=True,
        )
        problem = (
            None
            if image.checksum(header.checksum_version) == header.image_checksum
            else "image checksum does not match the header"
        )
    except CorruptSnapshotError:
        raise
    except Exception as e:  # a ReplayError, or an unchecked value of the wrong type
        problem = f"records do not replay: {e}"
    if problem is None:
        frames = records.topic_frames
        index = FrameIndex(path, identity, frames) if frames else None
        return image, header.request_ids, index
    for _ in read_snapshot(path)[1].iter_chunks():  # strictly: raises naming a bad value
        pass
    raise CorruptSnapshotError(path, 0, problem)


def image_to_snapshot_in_child(
    directory: Path, image: MetadataImage, request_ids: RequestIds = ()
) -> tuple[Path, float]:
    """:func:`write_in_child` without a previous snapshot: (its path, the child's CPU seconds)."""
    path, cpu_s, _ = write_in_child(directory, image, request_ids)
    return path, cpu_s


def write_in_child(
    directory: Path,
    image: MetadataImage,
    request_ids: RequestIds = (),
    previous: FrameIndex | None = None,
) -> tuple[Path, float, FrameIndex | None]:
    """``write_image_snapshot`` in a forked child process: (its path, the child's CPU seconds,
    the new file's frame index, None if the child's was unreadable).

    Written on a thread of the controller, the CPU a big image costs holds the GIL against the
    trio thread, whose Raft ticks and RPC then wait for it at every system call: followers
    missed heartbeats and elected new leaders during the snapshots of big images
    (docs/performance.md). The child has a copy-on-write view of the immutable image and its
    own interpreter lock; the calling thread waits for it without holding the GIL. The child
    writes no log line and takes no lock another thread could have held at the fork; it dies
    with the calling thread (``PR_SET_PDEATHSIG``). It hands back the new file's frame index,
    whose topic digests the parent keeps on its topics (``_adopt_digests``): the next snapshot
    then neither hashes nor packs the topics unchanged since. An OSError in the child (a full
    disk) is raised here with its errno; anything else as RuntimeError."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: only this thread exists here
        code = 0
        try:
            os.close(read_end)
            _die_with_parent()
            gc.disable()  # no collection walking (and copying) the parent's whole heap
            path, written_index, _ = write_image_snapshot(directory, image, request_ids, previous)
            wire = msgpack.packb(written_index.to_wire(), use_bin_type=True)
            _write_all(write_end, b"ok " + os.fsencode(path) + b"\n" + wire)
        except BaseException as e:  # reported to the parent, never raised past here
            code = 1
            errno = getattr(e, "errno", None) or 0
            message = f"{type(e).__name__}: {e}"[:2000]
            try:
                os.write(write_end, f"err {errno} {message}".encode(errors="replace"))
            except BaseException:
                pass
        finally:
            os._exit(code)
    os.close(write_end)
    chunks = []
    try:
        while chunk := os.read(read_end, 65536):
            chunks.append(chunk)
    finally:
        os.close(read_end)
        _, status, usage = os.wait4(pid, 0)
    answer = b"".join(chunks)
    if os.waitstatus_to_exitcode(status) == 0 and answer.startswith(b"ok "):
        written, _, wire = answer[3:].partition(b"\n")
        index = _adopt_digests(image, wire)
        return Path(os.fsdecode(written)), usage.ru_utime + usage.ru_stime, index
    if answer.startswith(b"err "):
        _, errno, message = answer.decode(errors="replace").split(" ", 2)
        if int(errno):
            raise OSError(int(errno), f"snapshot writer: {message}")
        raise RuntimeError(f"snapshot writer: {message}")
    raise RuntimeError(f"snapshot writer exited with status {os.waitstatus_to_exitcode(status)}")


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _adopt_digests(image: MetadataImage, wire: bytes) -> FrameIndex | None:
    """Keep the topic digests the child computed for the image's checksum on the parent's
    (shared, immutable) TopicImages, so the next snapshot hashes only the topics changed since
    instead of every topic again; returns the child's frame index. Anything unreadable is
    ignored (None): digests and the index are only caches."""
    try:
        index = FrameIndex.from_wire(msgpack.unpackb(wire, use_list=False))
    except Exception:  # a cache: never worth failing a snapshot over
        return None
    topics = image.topics_by_id
    kept: dict[str, tuple[bytes, int, int]] = {}
    for topic_id, entry in index.topics.items():
        topic = topics.get(topic_id)
        if topic is None:
            continue
        if topic._digest is None:
            object.__setattr__(topic, "_digest", entry[0])
        kept[topic.topic_id] = entry  # the image's own id string, not a decoded copy
    return FrameIndex(index.path, index.identity, kept)


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when the thread that forked it ends (a killed controller
    leaves no writer behind in its data directory)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def image_from_snapshot(path: Path) -> MetadataImage:
    """Read a snapshot file back into an image (verifying its checksums)."""
    return snapshot_state(path)[0]


class Snapshotter:
    """Snapshot policy and I/O for one node's metadata log directory."""

    def __init__(
        self,
        directory: Path,
        metadata_log: MetadataLog,
        max_bytes_between: int,
        max_interval_ms: int,
        phase: float = 0.0,
        fork: bool = False,
    ) -> None:
        """``phase`` (0 <= phase < 1) brings this node's first byte-triggered snapshot forward by
        that fraction of ``max_bytes_between``: every controller's log is identical, so without
        it all of them write a full-image snapshot at the same offset, competing for the same
        cores (at 1M partitions ~3.7 s CPU each, during which the quorum saw elections)."""
        if not 0.0 <= phase < 1.0:
            raise ValueError(f"phase must be in [0, 1), got {phase}")
        self.fork = fork  # write in a forked child (:func:`image_to_snapshot_in_child`)
        self.directory = Path(directory)
        self.log = metadata_log
        self.max_bytes_between = max_bytes_between
        self.max_interval_ms = max_interval_ms
        self._lock = threading.Lock()
        # The dedup window stored in the snapshot that load_image or install last adopted.
        self.request_ids: RequestIds = ()
        # The newest snapshot, listed once here (which also removes an interrupted write's
        # leftovers) and kept up to date by write and install: listing the directory again
        # while a write is under way on another thread would remove its ``.part`` file.
        self._latest = latest_snapshot(self.directory)
        latest = self._latest
        self._last_end_offset = parse_snapshot_name(latest)[0] if latest else 0
        self._last_log_bytes = metadata_log.size_bytes - int(phase * max_bytes_between)
        self._last_time_ms = int(time.time() * 1000)
        # Where the last snapshot this node wrote holds each topic (the next write copies the
        # frames of topics unchanged since: ``kraft.snapshot_image``).
        self._frames: FrameIndex | None = None

    def latest(self) -> Path | None:
        """The newest snapshot of this node (no directory listing: safe during a write)."""
        return self._latest

    def _adopt_latest(self, path: Path) -> None:
        if self._latest is None or parse_snapshot_name(path) > parse_snapshot_name(self._latest):
            self._latest = path

    @staticmethod
    def end_offset(path: Path) -> int:
        return parse_snapshot_name(path)[0]

    def load_image(self) -> MetadataImage:
        """The image to start from: the newest snapshot the log continues from, else empty.

        An empty log next to a snapshot is a node that installed a snapshot and wrote nothing
        after it: the log continues from that snapshot. The image leaves the cyclic GC's reach
        as it is built (``freeze``): the controller keeps it, and freezes its heap once started
        anyway (``kraft/heap.py``), but the collections before that would each walk every
        object of it (~1.5 s at 2M partitions)."""
        snapshots = list_snapshots(self.directory)
        if snapshots and self.log.next_offset == self.log.start_offset:
            image, request_ids, index = _load_snapshot(snapshots[-1], freeze=True)
            if image.offset + 1 > self.log.next_offset:
                self.request_ids = request_ids
                self._frames = index
                self._continue_log_from(image)
                log.info(
                    "log continues from snapshot %s (offset %d)", snapshots[-1].name, image.offset
                )
                return image
        for path in reversed(snapshots):
            end = parse_snapshot_name(path)[0]
            if self.log.start_offset <= end <= self.log.next_offset:
                image, self.request_ids, self._frames = _load_snapshot(path, freeze=True)
                log.info("loaded snapshot %s (offset %d)", path.name, image.offset)
                return image
        if self.log.start_offset > 0:
            raise RuntimeError(
                f"metadata log in {self.directory} starts at offset {self.log.start_offset} "
                "but no snapshot covers the offsets before it"
            )
        return MetadataImage.EMPTY

    def due(self, image: MetadataImage, now_ms: int) -> bool:
        if image.offset + 1 <= self._last_end_offset:
            return False
        if self.log.size_bytes - self._last_log_bytes >= self.max_bytes_between:
            return True
        return self.max_interval_ms > 0 and now_ms - self._last_time_ms >= self.max_interval_ms

    def write(self, image: MetadataImage, request_ids: RequestIds = ()) -> Path:
        """Write a snapshot of ``image`` with the dedup window at its offset (thread-safe;
        one at a time)."""
        with self._lock:
            existing = self.directory / _name_for(image)
            if existing.exists():
                return existing
            started, cpu = time.monotonic(), time.thread_time()
            # The log through the image's offset reaches the disk before a snapshot that says
            # it does: after a power loss a snapshot must never stand beyond the log's end.
            self.log.sync()
            index: FrameIndex | None
            if self.fork:
                path, cpu_s, index = write_in_child(
                    self.directory, image, request_ids, self._frames
                )
            else:
                path, index, _ = write_image_snapshot(
                    self.directory, image, request_ids, self._frames
                )
                cpu_s = time.thread_time() - cpu
            self._frames = index
            self._adopt_latest(path)
            self._last_end_offset = image.offset + 1
            self._last_log_bytes = self.log.size_bytes
            self._last_time_ms = int(time.time() * 1000)
            log.info(
                "wrote snapshot %s (%d partitions) in %.2fs (%.2fs CPU)",
                path.name,
                image.partition_count(),
                time.monotonic() - started,
                cpu_s,
            )
            return path

    def enforce_retention(self, now_ms: int, max_ms: int, max_bytes: int) -> list[Path]:
        """Delete the log segments the retention limits let go (see ``kraft/retention.py``)
        and the snapshots that end before the new log start; returns the deleted segments."""
        with self._lock:
            latest = self.latest()
            if latest is None:
                return []
            sizes = self.log.segment_sizes()
            infos = []
            for i, (path, base, size) in enumerate(sizes):
                try:
                    mtime_ms = int(path.stat().st_mtime * 1000)
                except FileNotFoundError:
                    return []
                infos.append(
                    SegmentInfo(
                        base, sizes[i + 1][1] if i + 1 < len(sizes) else None, size, mtime_ms
                    )
                )
            cut = retention_cut(infos, parse_snapshot_name(latest)[0], now_ms, max_ms, max_bytes)
            if cut is None:
                return []
            deleted = self.log.truncate_before(cut)
            if deleted:
                delete_snapshots_before(self.directory, self.log.start_offset)
            return deleted

    def install(self, data: bytes, current: MetadataImage) -> MetadataImage | None:
        """Adopt snapshot bytes (a PySyncObj dump) that are ahead of ``current``: verify them,
        keep them as this node's snapshot file, and restart the metadata log right after it —
        the history before the snapshot is then not on this node. Returns the installed image,
        or None when ``current`` already covers the snapshot (the ordinary restart case)."""
        with self._lock:
            fd, tmp = tempfile.mkstemp(prefix="install-", suffix=".tmp", dir=self.directory)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                image, request_ids, index = _load_snapshot(Path(tmp), freeze=True)  # verifies
                if image.offset <= current.offset:
                    os.unlink(tmp)
                    return None
                os.replace(tmp, self.directory / _name_for(image))
                if index is not None:  # a rename keeps what the index knows the file by
                    index = FrameIndex(
                        self.directory / _name_for(image), index.identity, index.topics
                    )
                self._frames = index
                self._adopt_latest(self.directory / _name_for(image))
            except BaseException:
                if os.path.exists(tmp):
                    os.unlink(tmp)
                raise
            self._continue_log_from(image)
            self.request_ids = request_ids
            self._last_end_offset = image.offset + 1
            self._last_log_bytes = self.log.size_bytes
            log.warning(
                "installed the leader's snapshot at offset %d; this node's history now starts there",
                image.offset,
            )
            return image

    def _continue_log_from(self, image: MetadataImage) -> None:
        self.log.reset(
            image.offset + 1,
            image.last_hash,
            last_term=image.term,
            last_raft_index=image.raft_index,
            last_timestamp_ms=image.timestamp_ms,
        )

    def read_chunk(self, name: str, position: int, max_bytes: int) -> dict[str, Any]:
        """One chunk of a snapshot file for ``FetchSnapshot``."""
        path = self.directory / name
        if os.sep in name or not name.endswith(".checkpoint") or not path.is_file():
            raise KraftError(ErrorCode.RESOURCE_NOT_FOUND, f"no snapshot named {name!r}")
        size = path.stat().st_size
        if position < 0 or position > size:
            raise KraftError(
                ErrorCode.OFFSET_OUT_OF_RANGE,
                f"position {position} outside snapshot of {size} bytes",
            )
        with open(path, "rb") as f:
            f.seek(position)
            data = f.read(max_bytes)
        return {"data": data, "size": size, "done": position + len(data) >= size}


def _name_for(image: MetadataImage) -> str:
    from kraft.log.snapshot import snapshot_name

    return snapshot_name(image.offset + 1, image.term)
