"""Metadata loader: long-poll the controllers' metadata log, replay it, publish images.

The loader starts from the local checkpoint (or the empty image) and follows the log with
``kraft.metadata.follower.LogFollower`` (``FetchMetadata(from_offset=offset + 1, max_wait_ms)``
long polls; a failed one is retried after 0.05 s doubling to 2 s). Batches are strictly decoded and replayed
into a :class:`MetadataDelta`; when a response says to load a snapshot, the loader streams it with
``FetchSnapshot`` and restarts from it. Publishers receive ``publish(delta, image, full)`` in
install order:

* the first publish (and the one after a snapshot load) is **full**: a delta from the empty
  image carrying the whole image, sent only once caught up with the high watermark, so the
  replica manager sees every local partition and can remove strays;
* afterwards one delta per fetch response that brought batches.

A batch that does not replay (a broken hash chain or an impossible record, i.e. our local
history diverged from the controllers') is logged at ERROR and the loader restarts from offset 0.
The last published image is checkpointed every ``checkpoint_records`` records (and on stop), in
the background: the next fetch does not wait for the file's write and fsyncs, or a broker would
learn of new metadata only after its disk answered.

Image checks (``kraft.metadata.image_check``): at most every ``image_check_interval_ms`` a fetch
asks for the controller's image checksum, and once the answer is applied the published image's
checksum is compared with it. The first mismatch is logged at ERROR, the local checkpoints are
deleted and the metadata is reloaded from offset 0 (a snapshot when the controllers offer one);
a mismatch again after that marks the broker fenced (its heartbeats ask for it) until a check
agrees. No checkpoint is written while the image is known to differ.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Protocol

import msgspec
import trio

from broker.metadata.checkpoint import image_from_snapshot, load_checkpoint, write_checkpoint
from kraft.errors import KraftError
from kraft.heap import HeapFreezer
from kraft.log.snapshot import list_snapshots
from kraft.metadata.delta import MetadataDelta, ReplayError
from kraft.metadata.follower import LogFollower, SnapshotFetchError, check_snapshot_name
from kraft.metadata.image import MetadataImage
from kraft.metadata.image_check import Action, ImageCheck, Stated
from kraft.metadata.replay import replay_into
from kraft.records import RecordDecodeError, decode_batch
from kraft.rpc.bodies import ImageChecksum
from kraft.snapshot_image import FrameIndex

log = logging.getLogger(__name__)

PUBLISH_TIMES_KEPT = 4096


class Publisher(Protocol):
    def publish(self, delta: MetadataDelta, image: MetadataImage, full: bool = False) -> None: ...


def replay_encoded(delta: MetadataDelta, batches: Iterable[bytes]) -> int:
    """Strictly decode FetchMetadata batches and replay those ``delta`` does not hold yet into
    it (``kraft.metadata.replay.replay_into``); returns how many were replayed. A backlog goes
    into one delta (one publish) however many batches it has, so catching up costs
    O(records), not O(batches x image)."""
    return replay_into(delta, map(decode_batch, batches))  # a decoded batch carries its digest


class MetadataLoader:
    """Fetches, replays and publishes metadata; ``image`` is the last published image."""

    def __init__(
        self,
        client: Any,
        publishers: list[Publisher],
        metadata_dir: Path,
        *,
        max_wait_ms: int = 500,
        max_bytes: int = 8 << 20,
        checkpoint_records: int = 1000,
        request_timeout: float = 10.0,
        image_check_interval_ms: int = 10_000,
        broker_id: int = -1,
        on_image_check: Callable[[], None] | None = None,
    ) -> None:
        self.client = client
        self.publishers = publishers
        self.metadata_dir = Path(metadata_dir)
        self.max_wait_ms = max_wait_ms
        self.max_bytes = max_bytes
        self.checkpoint_records = checkpoint_records
        self.request_timeout = request_timeout
        self.image: MetadataImage = MetadataImage.EMPTY
        self.high_watermark = -1
        self.published = trio.Event()  # set after the first (full) publish
        # (image offset, wall-clock s) of the latest publishes: commit -> applied latency, read
        # through the admin endpoint's DescribePublishes (bench.broker_bench's propagation)
        self.publish_times: deque[tuple[int, float]] = deque(maxlen=PUBLISH_TIMES_KEPT)
        self._checkpointed_offset = -1
        self._checkpoint_lock = trio.Lock()
        self._background: trio.Nursery | None = None  # where run() writes checkpoints
        self._frames: FrameIndex | None = None  # the last checkpoint's topic frames, to copy
        # every 100k records replayed, the image's growth leaves the cyclic GC's reach, as on
        # the controllers (kraft/heap.py): a full collection walking 2M partitions is ~0.7 s
        self._heap = HeapFreezer()
        self.errors = 0
        self.broker_id = broker_id
        self.image_check = ImageCheck(image_check_interval_ms)
        # told when the image check's verdict changes (the node heartbeats at once)
        self.on_image_check = on_image_check or (lambda: None)
        # the delta being replayed into and whether its publish is a full one (set by run)
        self._delta, self._full = MetadataDelta.full(self.image), True
        self._follower = LogFollower(
            client,
            max_wait_ms=max_wait_ms,
            max_bytes=max_bytes,
            timeout=request_timeout + max_wait_ms / 1000,
            # a controller silent 2 s past the long poll is stalled: ask another
            attempt_timeout=max_wait_ms / 1000 + 2.0,
            retry=(0.05, 2.0),
            on_error=self._fetch_failed,
            leader_only=True,  # as Kafka's brokers: the leader knows of a commit first
            extra_fields=self._check_fields,
            on_answer=self._note_answer,
        )

    @property
    def offset(self) -> int:
        """The last applied (published) metadata offset."""
        return self.image.offset

    def load_local(self) -> None:
        """Resume from the local checkpoint, if a valid one exists."""
        self.image = load_checkpoint(self.metadata_dir)
        self._checkpointed_offset = self.image.offset

    async def run(self) -> None:
        """Fetch and publish until cancelled (the follower calls the three methods below)."""
        self._delta, self._full = MetadataDelta.full(self.image), True
        async with trio.open_nursery() as nursery:
            self._background = nursery
            try:
                await self._follower.follow(self)
            finally:
                self._background = None

    def next_offset(self) -> int:
        return self._delta.offset + 1

    def _fetch_failed(self, error: KraftError, from_offset: int, delay: float) -> None:
        self.errors += 1
        log.warning(
            "FetchMetadata from offset %d failed: %s; retrying in %.2fs", from_offset, error, delay
        )

    # ---- image checks ------------------------------------------------------------------------

    def _check_fields(self) -> dict[str, Any]:
        due = self.image_check.due(int(time.monotonic() * 1000))
        return {"image_checksum": True} if due else {}

    def _note_answer(self, resp: dict[str, Any]) -> None:
        raw = resp.get("image_checksum")
        if raw is None:
            return
        try:
            c = msgspec.convert(raw, ImageChecksum)
        except msgspec.ValidationError:
            return
        self.image_check.stated(Stated(c.offset, c.checksum, c.node_id))

    def image_mismatch(self) -> dict[str, Any] | None:
        """The current divergence as a heartbeat reports it (None: none known)."""
        m = self.image_check.mismatch
        return None if m is None else dataclasses.asdict(m)

    async def _check_image(self) -> None:
        """Compare the published image with the checksum the last answer stated, if any."""
        stated = self.image_check.take(self.image.offset)
        if stated is None or self._full:  # a reload is under way: the image is the old one
            return
        image = self.image
        ours = await trio.to_thread.run_sync(image.checksum)  # cached per image and topic
        action = self.image_check.judge(stated, ours, int(time.monotonic() * 1000))
        if action is Action.AGREE:
            return
        who = f"broker {self.broker_id}"
        if action is Action.RECOVERED:
            log.info(
                "%s: metadata image agrees with controller %d's at offset %d again",
                who,
                stated.node_id,
                stated.offset,
            )
        elif action is Action.RELOAD:
            log.error(
                "%s: metadata image differs from controller %d's at offset %d: checksum %s "
                "here, %s there; discarding it and reloading the metadata from the controllers",
                who,
                stated.node_id,
                stated.offset,
                ours,
                stated.checksum,
            )
            await self._discard_checkpoints()
            self._delta, self._full = MetadataDelta.full(MetadataImage.EMPTY), True
        elif action is Action.FENCE:
            log.error(
                "%s: metadata image still differs from controller %d's after a reload, at "
                "offset %d: checksum %s here, %s there; asking to be fenced until it agrees "
                "(restart the broker to reload again)",
                who,
                stated.node_id,
                stated.offset,
                ours,
                stated.checksum,
            )
        if action is not Action.STAY_FENCED:
            self.on_image_check()

    async def _discard_checkpoints(self) -> None:
        """Delete the local checkpoints: they may hold the image that differs."""
        async with self._checkpoint_lock:
            for path in list_snapshots(self.metadata_dir):
                path.unlink(missing_ok=True)
            self._checkpointed_offset = -1

    async def on_snapshot(self, info: dict[str, Any]) -> None:
        image = await self._fetch_snapshot(info)
        if image is None:
            await trio.sleep(0.5)
            return
        self._delta, self._full = MetadataDelta.full(image), True

    async def on_batches(self, batches: list[bytes], high_watermark: int) -> bool:
        try:
            n = replay_encoded(self._delta, batches)
        except (ReplayError, RecordDecodeError) as e:
            log.error(
                "metadata replay failed at offset %d: %s; discarding local metadata and "
                "refetching from offset 0",
                self._delta.offset + 1,
                e,
            )
            self.errors += 1
            self._delta, self._full = MetadataDelta.full(MetadataImage.EMPTY), True
            return False
        self.high_watermark = high_watermark
        caught_up = self._delta.offset + 1 >= self.high_watermark
        if (self._full and caught_up) or (not self._full and n):
            self._publish(self._delta, self._full)
            self._delta, self._full = MetadataDelta(self.image), False
            self._checkpoint_in_background()
        await self._check_image()
        return False

    def _publish(self, delta: MetadataDelta, full: bool) -> None:
        image = delta.apply()
        for publisher in self.publishers:
            publisher.publish(delta, image, full)
        previous, self.image = self.image, image
        self._heap.note(max(image.offset - previous.offset, 0))
        self.publish_times.append((image.offset, time.time()))
        log.info(
            "published metadata offset %d (from %d%s, high watermark %d)",
            image.offset,
            previous.offset,
            ", full" if full else "",
            self.high_watermark,
        )
        self.published.set()

    def _checkpoint_in_background(self) -> None:
        """Start a checkpoint of the published image when one is due and none is being
        written (the one after it picks up whatever was published meanwhile)."""
        due = self.image.offset - self._checkpointed_offset >= self.checkpoint_records
        if due and self._background is not None and not self._checkpoint_lock.locked():
            self._background.start_soon(self._maybe_checkpoint)

    async def _maybe_checkpoint(self, force: bool = False) -> None:
        # One writer at a time: a shutdown's checkpoint_now may come while the loader's own
        # write runs in its thread, and two writers of one offset share the .part file.
        async with self._checkpoint_lock:
            image = self.image
            if image.offset < 0 or image.offset == self._checkpointed_offset:
                return
            if self.image_check.mismatch is not None:
                return  # the image is known to differ from the controllers'
            if not force and image.offset - self._checkpointed_offset < self.checkpoint_records:
                return
            path, self._frames = await trio.to_thread.run_sync(
                write_checkpoint, self.metadata_dir, image, self._frames
            )
            self._checkpointed_offset = image.offset
            log.info("wrote metadata checkpoint %s (offset %d)", path.name, image.offset)

    async def checkpoint_now(self) -> None:
        """Checkpoint the last published image (e.g. on shutdown)."""
        await self._maybe_checkpoint(force=True)

    async def _fetch_snapshot(self, info: dict[str, Any]) -> MetadataImage | None:
        """Stream snapshot ``info['name']`` into the metadata dir and load it."""
        name = str(info.get("name"))
        try:
            check_snapshot_name(name)
        except SnapshotFetchError as e:
            log.error("%s", e)
            return None
        self.metadata_dir.mkdir(parents=True, exist_ok=True)
        part = self.metadata_dir / f"fetched-{name}.part"
        log.info(
            "loading snapshot %s (end offset %s) from the controllers", name, info.get("end_offset")
        )
        try:
            await self._follower.fetch_snapshot(
                name, part, max_bytes=self.max_bytes, timeout=self.request_timeout
            )
            image = await trio.to_thread.run_sync(image_from_snapshot, part)
        except Exception as e:  # a failed call, I/O error or corrupt file all mean "retry"
            log.warning("snapshot %s could not be loaded: %s; will retry", name, e)
            part.unlink(missing_ok=True)
            return None
        part.unlink(missing_ok=True)
        log.info(
            "loaded snapshot %s: offset %d, checksum %s", name, image.offset, image.checksum()[:16]
        )
        return image
