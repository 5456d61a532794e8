"""The log cleaner's task: compacts the logs of ``cleanup.policy=compact`` topics (Kafka's
``LogCleaner`` thread), using :mod:`broker.replica.log_cleaner` for the decisions.

Every ``log.cleaner.backoff.ms`` when idle (at once after a log was cleaned) it applies each
topic's ``segment.bytes`` to its logs, picks the compacted log with the largest dirty ratio
(bytes of cleanable segments at or above the cleaner checkpoint / bytes of all cleanable
segments) at or above its ``min.cleanable.dirty.ratio``, and cleans it:

1. in a worker thread, reads its cleanable segments (closed, below the last stable offset;
   they are never appended to), plans, and writes one ``<base>.log.cleaned`` file per group of
   adjacent segments whose original sizes fit ``segment.bytes`` (small cleaned segments merge),
   each synced;
2. back on the event loop, :meth:`PartitionLog.swap_cleaned` swaps them in unless the log was
   truncated meanwhile. Leader and followers clean their own copies, as in Kafka.

Counters (cleaned bytes before and after, records and batches removed, passes) feed the broker's
``/metrics``.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from broker.replica.log_cleaner import DROP, KEEP, Batch, filter_batch, parse_batch, plan
from broker.replica.log_dirs import KafkaStorageError
from broker.replica.partition_log import (
    CLEANED_SUFFIX,
    CleanedGroup,
    CorruptRecordError,
    PartitionLog,
    parse_batches,
    sync_dir,
)
from kraft.records import RESOURCE_TOPIC

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CleanerConfig:
    """The broker-wide defaults (topic configs override the last three)."""

    enabled: bool = True
    backoff_ms: int = 15_000
    min_cleanable_ratio: float = 0.5
    delete_retention_ms: int = 86_400_000
    segment_bytes: int = 1 << 30


@dataclass(frozen=True, slots=True)
class LogSettings:
    """The compaction settings of one topic."""

    compact: bool
    min_cleanable_ratio: float
    delete_retention_ms: int
    segment_bytes: int


def topic_settings(configs: Any, defaults: CleanerConfig) -> LogSettings:
    """A topic's settings from its dynamic configs (a mapping of strings)."""
    policy = str(configs.get("cleanup.policy", "delete"))
    return LogSettings(
        "compact" in [p.strip() for p in policy.split(",")],
        float(configs.get("min.cleanable.dirty.ratio", defaults.min_cleanable_ratio)),
        int(configs.get("delete.retention.ms", defaults.delete_retention_ms)),
        int(configs.get("segment.bytes", defaults.segment_bytes)),
    )


def dirty_ratio(segments: list[tuple[Path, int, int]], ends: list[int], first_dirty: int) -> float:
    """Dirty bytes / cleanable bytes: a segment is clean when it ends at or below the cleaner
    checkpoint (``ends``: each segment's end offset, the next segment's base)."""
    total = sum(size for _, _, size in segments)
    if total == 0:
        return 0.0
    dirty = sum(size for (_, _, size), end in zip(segments, ends) if end > first_dirty)
    return dirty / total


@dataclass(frozen=True, slots=True)
class CleanResult:
    groups: list[CleanedGroup]
    bytes_before: int
    bytes_after: int
    records_removed: int
    batches_removed: int
    end: int  # the first offset after the cleaned range (the new cleaner checkpoint)


def clean_segments(
    directory: Path,
    segments: list[tuple[Path, int, int]],
    end: int,
    segment_bytes: int,
    now_ms: int,
    delete_retention_ms: int,
    producer_last_offsets: dict[int, int],
    first_of_log: bool,
    fsync: bool = True,
) -> CleanResult:
    """Plan and write the compacted files of ``segments`` (path, base, size), oldest first,
    the whole range ending at ``end``. Runs in a worker thread: reads only those closed files."""
    raw: list[tuple[int, memoryview, int, int]] = []  # (segment index, data, position, size)
    views: list[Batch] = []
    for si, (path, _, size) in enumerate(segments):
        with open(path, "rb") as f:
            data = memoryview(f.read(size))
        infos, used = parse_batches(data)  # CRCs checked: a rewrite would reseal damage
        if used != len(data):
            raise CorruptRecordError(
                f"{path}: bytes {used}..{len(data)} of a closed segment are not valid record "
                "batches (damage below the recovery point); the log is not compacted"
            )
        for b in infos:
            raw.append((si, data, b.position, b.size))
            views.append(parse_batch(data[b.position : b.position + b.size]))
    p = plan(views, now_ms, delete_retention_ms, producer_last_offsets, first_of_log)
    # groups of adjacent segments whose original sizes fit segment.bytes
    groups: list[list[int]] = []
    size = 0
    for si, (_, _, seg_size) in enumerate(segments):
        if groups and size + seg_size <= segment_bytes:
            groups[-1].append(si)
            size += seg_size
        else:
            groups.append([si])
            size = seg_size
    out: dict[int, bytearray] = {g[0]: bytearray() for g in groups}
    owner = {si: g[0] for g in groups for si in g}
    for (si, data, pos, sz), view, decision in zip(raw, views, p.decisions, strict=True):
        if decision.action == DROP:
            continue
        batch = data[pos : pos + sz]
        buf = out[owner[si]]
        if decision.action == KEEP:
            buf += batch
        else:
            buf += filter_batch(batch, view, decision.keep_offsets)
    result: list[CleanedGroup] = []
    for g in groups:
        base = segments[g[0]][1]
        data_out = bytes(out[g[0]])
        path = directory / f"{base:020d}{CLEANED_SUFFIX}"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view_out = memoryview(data_out)
            while view_out:
                view_out = view_out[os.write(fd, view_out) :]
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        infos, _ = parse_batches(data_out, check_crc=False)
        result.append(CleanedGroup(path, [segments[i][1] for i in g], infos, len(data_out)))
    if fsync:
        sync_dir(directory)
    return CleanResult(
        result,
        sum(s for _, _, s in segments),
        sum(g.size for g in result),
        p.records_removed,
        p.batches_removed,
        end,
    )


class LogCleaner:
    """Compacts the compacted topics' logs of a replica manager, one log per pass."""

    def __init__(
        self,
        replicas: Any,
        config: CleanerConfig,
        clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
        topic_segment_bytes: dict[str, int] | None = None,
    ) -> None:
        self.replicas = replicas
        self.config = config
        self.clock_ms = clock_ms
        # segment.bytes of topics that set none, where it is not the broker's default
        # (__consumer_offsets: offsets.topic.segment.bytes, which Kafka writes at creation)
        self.topic_segment_bytes = topic_segment_bytes or {}
        self.counters: Counter[str] = Counter()
        self.last_ratio = 0.0  # dirty ratio of the last log cleaned
        self.last_recopy = 0.0  # bytes written / read by the last pass, %
        self.max_seconds = 0.0  # the longest pass
        # logs whose closed segments failed their CRCs: never compacted again by this process,
        # so the damage stays visible to readers (CORRUPT_MESSAGE) instead of being resealed
        self.damaged: set[Path] = set()

    def settings(self, topic: str) -> LogSettings:
        image = self.replicas.image
        configs: Any = image.config(RESOURCE_TOPIC, topic) if image is not None else {}
        if topic in self.topic_segment_bytes and "segment.bytes" not in configs:
            configs = {**configs, "segment.bytes": str(self.topic_segment_bytes[topic])}
        return topic_settings(configs, self.config)

    def candidate(self) -> tuple[Any, LogSettings, float] | None:
        """The compacted log to clean next (largest dirty ratio over its threshold), if any;
        applies each topic's ``segment.bytes`` on the way."""
        best: tuple[Any, LogSettings, float] | None = None
        for part in list(self.replicas.partitions.values()):
            s = self.settings(part.topic)
            plog: PartitionLog = part.log
            plog.segment_bytes = s.segment_bytes
            if not s.compact or plog.dir in self.damaged:
                continue
            segs = plog.cleanable_segments()
            if not segs:
                continue
            ends = [plog.segment_end(base) for _, base, _ in segs]
            ratio = dirty_ratio(segs, ends, plog.first_dirty_offset)
            if ratio > 0 and ratio >= s.min_cleanable_ratio and (best is None or ratio > best[2]):
                best = (part, s, ratio)
        return best

    async def clean_once(self) -> bool:
        """Clean the dirtiest log, if one is due; whether one was cleaned."""
        found = self.candidate()
        if found is None:
            return False
        part, s, ratio = found
        plog: PartitionLog = part.log
        segs = plog.cleanable_segments()
        end = plog.segment_end(segs[-1][1])
        version = plog.layout_version
        last_offsets = {
            pid: e.last_offset for pid, e in plog.producers.producers.items() if e.batches
        }
        first_of_log = segs[0][0] == plog.segment_files()[0]
        started = time.monotonic()
        try:
            result = await trio.to_thread.run_sync(
                clean_segments,
                plog.dir,
                segs,
                end,
                s.segment_bytes,
                self.clock_ms(),
                s.delete_retention_ms,
                last_offsets,
                first_of_log,
                abandon_on_cancel=True,  # a shutdown does not wait; open() drops .cleaned files
            )
        except CorruptRecordError as e:
            self.damaged.add(plog.dir)
            self.counters["damaged_logs"] += 1
            log.error("log cleaner: %s", e)
            return False
        except OSError as e:  # a segment deleted meanwhile (truncation, topic deletion), or disk
            for name in os.listdir(plog.dir) if plog.dir.is_dir() else []:
                if name.endswith(CLEANED_SUFFIX):
                    (plog.dir / name).unlink(missing_ok=True)
            log.warning("log cleaner: %s: %s; will retry", plog.dir.name, e)
            return False
        current = self.replicas.partitions.get((part.topic_id, part.partition))
        try:
            swapped = current is part and plog.swap_cleaned(result.groups, version, end)
        except OSError as e:  # the log dir goes offline (JBOD) or the broker stops
            try:
                part.storage_error("compacted segment swap", e)
            except KafkaStorageError:
                return False
        if not swapped:
            for g in result.groups:
                g.path.unlink(missing_ok=True)
            log.info("log cleaner: %s changed while cleaning; will retry", plog.dir.name)
            return False
        seconds = time.monotonic() - started
        self.max_seconds = max(self.max_seconds, seconds)
        self.last_ratio = ratio
        self.last_recopy = 100 * result.bytes_after / max(1, result.bytes_before)
        c = self.counters
        c["passes"] += 1
        c["bytes_read"] += result.bytes_before
        c["bytes_written"] += result.bytes_after
        c["records_removed"] += result.records_removed
        c["batches_removed"] += result.batches_removed
        log.info(
            "log cleaner: %s: %d segments (dirty ratio %.2f) %d -> %d bytes, %d records and "
            "%d batches removed, in %.2f s; clean up to offset %d",
            plog.dir.name,
            len(segs),
            ratio,
            result.bytes_before,
            result.bytes_after,
            result.records_removed,
            result.batches_removed,
            seconds,
            end,
        )
        return True

    async def run(self) -> None:
        """Clean until cancelled: at once again after a clean, else after the backoff."""
        if not self.config.enabled:
            return
        while True:
            cleaned = await self.clean_once()
            if not cleaned:
                await trio.sleep(self.config.backoff_ms / 1000)
            else:
                await trio.sleep(0)
