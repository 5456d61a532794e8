"""The replica manager: this broker's partitions, driven only by metadata deltas.

``apply_delta(delta, image)`` reads ``delta.local_changes(broker_id)`` (kraft-reference §8.4–8.5)
and, in this order:

1. **deletes** replicas this broker no longer hosts (close the log, remove the directory) —
   first, because a deleted topic's name may be reused in the same delta;
2. **leaders**: open/create ``<log.dir>/<topic>-<partition>/``, start the new leader epoch in
   the leader-epoch cache at the log end, adopt ISR and epochs, keep the high watermark;
3. **followers**: open/create the log and remember the leader to fetch from; the follower's
   fetcher (:mod:`broker.replica.replica_fetcher`) truncates it by OffsetForLeaderEpoch before fetching
   (never to the local high watermark, which may lag the leader's: KIP-101).

A new leader epoch resets the leader's view of its followers. Anything waiting on a partition
(produce purgatory, long-polling fetches) is woken on every transition so it can re-check.
High watermarks move in memory and are checkpointed every few seconds and on close.

A registration whose leader epoch is older than the one this broker already acts on is ignored
with a state-change log line. Each partition directory holds ``partition.metadata`` with its
topic id, so a directory left by a deleted topic of the same name is recognised as stray.

With several log dirs, a write, sync or open error in one takes that directory offline
(:mod:`broker.replica.log_dirs`): its partitions leave :attr:`ReplicaManager.partitions` for
:attr:`ReplicaManager.offline` (answered ``KAFKA_STORAGE_ERROR``, no longer fetched, reported in
every heartbeat), later metadata for them is ignored, and new partitions go to healthy dirs.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import trio

from broker.replica.log_dirs import KafkaStorageError, LogDirs
from broker.replica.partition import Partition
from broker.replica.partition_log import PartitionLog, batched_syncs, write_small_file
from kraft.records import RESOURCE_TOPIC

log = logging.getLogger("broker.state_change")
PARTITION_METADATA = "partition.metadata"
DETAIL_LINES_MAX = 1000  # transitions in one delta logged one line each at INFO


def partition_dir_name(topic: str, partition: int) -> str:
    return f"{topic}-{partition}"


def _parse_dir_name(name: str) -> tuple[str, int] | None:
    topic, sep, pid = name.rpartition("-")
    if not sep or not topic or not pid.isdigit():
        return None
    return topic, int(pid)


def _read_topic_id(directory: Path) -> str | None:
    try:
        for line in (directory / PARTITION_METADATA).read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "topic_id":
                return value.strip()
    except OSError:
        return None
    return None


class ReplicaManager:
    """Owns the partition logs under ``log_dirs`` for broker ``broker_id``."""

    def __init__(
        self,
        broker_id: int,
        log_dirs: list[Path],
        segment_bytes: int = 1 << 30,
        fsync: bool = False,
        *,
        replica_lag_time_max_ms: int = 30000,
        min_insync_replicas: int = 1,
    ) -> None:
        self.broker_id = broker_id
        self.log_dirs = [Path(d) for d in log_dirs]
        self.segment_bytes = segment_bytes
        self.fsync = fsync
        self.replica_lag_time_max_ms = replica_lag_time_max_ms
        self.default_min_insync_replicas = min_insync_replicas
        self.image: Any = None  # the last image applied
        self.partitions: dict[tuple[str, int], Partition] = {}  # (topic id, partition)
        self._dir_counts: Counter[Path] = Counter()  # our partitions per log dir
        self.by_name: dict[tuple[str, int], Partition] = {}  # (topic name, partition)
        self.isr_updater: Any = None  # broker.replica.isr_updater.IsrUpdater, set by the node
        self.dirs = LogDirs(self.log_dirs)
        self.dirs.listeners.append(self._take_offline)
        # replicas in offline log dirs: (topic id, partition) → (topic name, log dir)
        self.offline: dict[tuple[str, int], tuple[str, Path]] = {}
        self._offline_names: set[tuple[str, int]] = set()
        for d in self.log_dirs:
            d.mkdir(parents=True, exist_ok=True)
        # Names of the directories in each log dir, listed once and kept up to date here (the
        # only writer), so opening thousands of partitions costs no stat per partition.
        self._listing: dict[Path, set[str]] | None = None
        self._detail_level = logging.INFO

    # ---- publisher entry point -------------------------------------------------------------
    def publish(self, delta: Any, image: Any, full: bool = False) -> None:
        """Publisher hook (see :mod:`broker.metadata.metadata_loader`). ``full``: the delta starts from
        the empty image (first publish, snapshot load), so anything it does not mention is stray."""
        self.apply_delta(delta, image)
        if full:
            self.remove_strays(image)

    def apply_delta(self, delta: Any, image: Any) -> None:
        """Apply what ``delta`` means for this broker: deletes, then leaders, then followers."""
        self.image = image
        changes = delta.local_changes(self.broker_id)
        count = len(changes.deletes) + len(changes.leaders) + len(changes.followers)
        # One line per transition, at INFO unless the delta moves thousands (a start-up or a
        # topic creation of that size): then a summary at INFO and the lines at DEBUG.
        self._detail_level = logging.INFO if count <= DETAIL_LINES_MAX else logging.DEBUG
        if count > DETAIL_LINES_MAX:
            log.info(
                "broker %d: metadata offset %d: %d replicas deleted, %d become leader, %d become "
                "follower (one line each at DEBUG)",
                self.broker_id,
                image.offset,
                len(changes.deletes),
                len(changes.leaders),
                len(changes.followers),
            )
        with batched_syncs():  # one filesystem sync for every checkpoint this delta writes
            for topic, topic_id, pid in changes.deletes:
                self._delete(
                    topic,
                    topic_id,
                    pid,
                    reason="no longer a replica"
                    if topic_id in image.topics_by_id
                    else "topic deleted",
                )
            for (topic, pid), (topic_id, reg) in sorted(changes.leaders.items()):
                self._become(topic, topic_id, pid, reg, "leader", image.offset)
            for (topic, pid), (topic_id, reg) in sorted(changes.followers.items()):
                self._become(topic, topic_id, pid, reg, "follower", image.offset)

    def remove_strays(self, image: Any) -> list[Path]:
        """Delete partition directories the image does not give this broker (a deleted topic,
        a reassigned replica, or a same-named topic with another id). Call on the first publish,
        after :meth:`apply_delta`."""
        removed = []
        for (tid, pid), part in list(self.partitions.items()):
            topic = image.topics_by_id.get(tid)
            reg = topic.partitions.get(pid) if topic is not None else None
            if reg is None or self.broker_id not in reg.replicas:
                removed.append(part.log.dir)
                self._delete(part.topic, tid, pid, reason="not in the loaded metadata")
        for d in self.dirs.healthy():
            with os.scandir(d) as entries:
                names = sorted(e.name for e in entries if e.is_dir())
            for name in names:
                parsed = _parse_dir_name(name)
                if parsed is None:
                    continue
                sub = d / name
                topic, pid = parsed
                tid = image.topics_by_name.get(topic)
                owned = (
                    tid is not None
                    and (tid, pid) in self.partitions
                    and self.partitions[(tid, pid)].log.dir == sub
                )
                if not owned:
                    log.warning(
                        "broker %d: removing stray partition directory %s (topic id on disk "
                        "%s, in metadata %s)",
                        self.broker_id,
                        sub,
                        _read_topic_id(sub),
                        tid,
                    )
                    self._remove_dir(sub)
                    removed.append(sub)
        return removed

    # ---- transitions -----------------------------------------------------------------------
    def _become(
        self, topic: str, topic_id: str, pid: int, reg: Any, role: str, offset: int
    ) -> None:
        if (topic_id, pid) in self.offline:
            log.log(
                self._detail_level,
                "broker %d: %s-%d (topic id %s) stays offline (its log dir %s failed); not "
                "becoming %s (metadata offset %d)",
                self.broker_id,
                topic,
                pid,
                topic_id,
                self.offline[(topic_id, pid)][1],
                role,
                offset,
            )
            return
        part = self.partitions.get((topic_id, pid))
        if part is not None and reg.leader_epoch < part.leader_epoch:
            log.info(
                "broker %d: ignoring stale %s registration for %s-%d (topic id %s): leader "
                "epoch %d < current %d (metadata offset %d)",
                self.broker_id,
                role,
                topic,
                pid,
                topic_id,
                reg.leader_epoch,
                part.leader_epoch,
                offset,
            )
            return
        if part is None:
            try:
                plog = self._open_log(topic, topic_id, pid)
            except KafkaStorageError:
                return  # its log dir is offline (reported there)
            part = Partition(topic, topic_id, pid, plog, on_storage_error=self._storage_error)
            self.partitions[(topic_id, pid)] = part
            self.by_name[(topic, pid)] = part
        new_epoch = reg.leader_epoch != part.leader_epoch or part.role != role
        if not new_epoch and reg.partition_epoch < part.partition_epoch:
            return  # already adopted a newer ISR from an AlterPartition answer
        part.role, part.leader = role, reg.leader
        part.leader_epoch, part.partition_epoch = reg.leader_epoch, reg.partition_epoch
        part.isr, part.replicas = tuple(reg.isr), tuple(reg.replicas)
        plog = part.log
        if role == "leader":
            try:
                if new_epoch:
                    plog.assign_epoch(reg.leader_epoch, plog.log_end_offset)
                    part.reset_followers(self.broker_id, time.monotonic() * 1000)
                    part.isr_change_pending = False
                else:
                    part.followers = {b: f for b, f in part.followers.items() if b in part.replicas}
                part.maybe_advance_high_watermark()
                plog.checkpoint_high_watermark()
            except OSError as e:
                self._checkpoint_failed(part, "leader epoch or high watermark checkpoint", e)
                return
        else:
            part.followers = {}
        part.wake()
        log.log(
            self._detail_level,
            "broker %d: %s-%d (topic id %s) -> %s, leader %d, leader epoch "
            "%d, partition epoch %d, isr %s, high watermark %d, log end %d (metadata offset %d)",
            self.broker_id,
            topic,
            pid,
            topic_id,
            role,
            reg.leader,
            reg.leader_epoch,
            reg.partition_epoch,
            list(part.isr),
            plog.high_watermark,
            plog.log_end_offset,
            offset,
        )

    def _delete(self, topic: str, topic_id: str, pid: int, reason: str) -> None:
        gone = self.offline.pop((topic_id, pid), None)
        if gone is not None:  # nothing to remove from a failed directory
            self._offline_names.discard((gone[0], pid))
            log.log(
                self._detail_level,
                "broker %d: forgot offline replica %s-%d (topic id %s, log dir %s): %s",
                self.broker_id,
                gone[0],
                pid,
                topic_id,
                gone[1],
                reason,
            )
            return
        part = self.partitions.pop((topic_id, pid), None)
        directory: Path | None
        if part is not None:
            self._dir_counts[part.log.dir.parent] -= 1
            self.by_name.pop((part.topic, pid), None)
            part.role = "none"
            part.wake()
            part.log.close()
            directory = part.log.dir
        else:
            directory = self._existing_dir(topic, pid)
            if directory is None or _read_topic_id(directory) not in (None, topic_id):
                return
        self._remove_dir(directory)
        log.log(
            self._detail_level,
            "broker %d: deleted replica %s-%d (topic id %s): %s; removed %s",
            self.broker_id,
            topic,
            pid,
            topic_id,
            reason,
            directory,
        )

    # ---- logs on disk ----------------------------------------------------------------------
    def _dirs_listing(self) -> dict[Path, set[str]]:
        if self._listing is None:
            self._listing = {}
            for d in self.log_dirs:
                with os.scandir(d) as entries:
                    self._listing[d] = {e.name for e in entries if e.is_dir()}
        return self._listing

    def _existing_dir(self, topic: str, pid: int) -> Path | None:
        name = partition_dir_name(topic, pid)
        return next((d / name for d, names in self._dirs_listing().items() if name in names), None)

    def _remove_dir(self, directory: Path) -> None:
        shutil.rmtree(directory, ignore_errors=True)
        self._dirs_listing().get(directory.parent, set()).discard(directory.name)

    def _open_log(self, topic: str, topic_id: str, pid: int) -> PartitionLog:
        directory = self._existing_dir(topic, pid)
        on_disk = None if directory is None else _read_topic_id(directory)
        if on_disk not in (None, topic_id):
            log.warning(
                "broker %d: %s belongs to an older topic id %s; removing it for %s",
                self.broker_id,
                directory,
                on_disk,
                topic_id,
            )
            self._remove_dir(cast(Path, directory))  # on_disk was read from it
            directory = None
        if directory is None:  # the healthy log dir holding the fewest of our partitions
            counts = self._dir_counts
            healthy = self.dirs.healthy()
            directory = min(healthy, key=lambda d: counts[d]) / partition_dir_name(topic, pid)
        home = directory.parent
        if self.dirs.is_offline(home):
            self._mark_offline(topic, topic_id, pid, home)
            raise KafkaStorageError(f"{topic}-{pid}: log dir {home} is offline")
        try:
            plog = PartitionLog.open(directory, self._segment_bytes(topic), self.fsync)
            if on_disk is None:  # a new directory, or one whose metadata file is missing
                write_small_file(
                    directory / PARTITION_METADATA, f"version: 0\ntopic_id: {topic_id}\n".encode()
                )
        except OSError as e:
            self._mark_offline(topic, topic_id, pid, home)
            self.dirs.fail(home, "partition log open", e, self._dir_counts[home] + 1)
            raise KafkaStorageError(f"{topic}-{pid}: opening its log failed: {e}") from e
        self._dir_counts[home] += 1
        self._dirs_listing().setdefault(home, set()).add(directory.name)
        return plog

    # ---- offline log dirs ------------------------------------------------------------------
    def _storage_error(self, part: Partition, what: str, exc: OSError) -> None:
        """A partition's log failed: take its log dir offline (or stop the broker)."""
        home = part.log.dir.parent
        self.dirs.fail(home, what, exc, self._dir_counts[home])

    def _checkpoint_failed(self, part: Partition, what: str, exc: OSError) -> None:
        """A checkpoint write failed outside any request: report it; nobody to answer."""
        try:
            part.storage_error(what, exc)
        except KafkaStorageError:
            pass  # the partition is offline now

    def _mark_offline(self, topic: str, topic_id: str, pid: int, home: Path) -> None:
        self.offline[(topic_id, pid)] = (topic, home)
        self._offline_names.add((topic, pid))

    def _take_offline(self, directory: Path) -> None:
        """Log dir ``directory`` went offline: its partitions stop here (waiters wake and see
        them gone) and their files are closed without another write."""
        for key, part in list(self.partitions.items()):
            if part.log.dir.parent != directory:
                continue
            del self.partitions[key]
            self.by_name.pop((part.topic, part.partition), None)
            self._mark_offline(part.topic, part.topic_id, part.partition, directory)
            part.role = "offline"
            part.wake()
            part.log.abandon()

    def is_offline(self, topic: str, pid: int) -> bool:
        """Whether ``topic``-``pid`` is hosted here in an offline log dir."""
        return (topic, pid) in self._offline_names

    def offline_report(self) -> dict[str, Any]:
        """What the heartbeats say about offline log dirs (empty when there are none)."""
        if not self.dirs.offline:
            return {}
        dirs = [d for d in self.dirs.dirs if d in self.dirs.offline]
        return {
            "offline_log_dirs": [self.dirs.directory_id(d) or str(d) for d in dirs],
            "offline_log_dir_paths": [str(d) for d in dirs],
            "offline_replicas": [
                {"topic_id": tid, "partition": pid} for tid, pid in sorted(self.offline)
            ],
        }

    # ---- queries ---------------------------------------------------------------------------
    def get(self, topic_id: str, pid: int) -> Partition | None:
        return self.partitions.get((topic_id, pid))

    def get_by_name(self, topic: str, pid: int) -> Partition | None:
        return self.by_name.get((topic, pid))

    def has_partition(self, topic: str, pid: int) -> bool:
        """Whether the metadata knows ``topic``-``pid`` (hosted here or not)."""
        tid = self.image.topics_by_name.get(topic) if self.image is not None else None
        return tid is not None and pid in self.image.topics_by_id[tid].partitions

    def min_insync_replicas(self, topic: str) -> int:
        """The topic's ``min.insync.replicas`` (else the broker default)."""
        value = (
            self.image.config(RESOURCE_TOPIC, topic).get("min.insync.replicas")
            if self.image
            else None
        )
        return int(value) if value is not None else self.default_min_insync_replicas

    def _segment_bytes(self, topic: str) -> int:
        """The topic's ``segment.bytes`` (else the broker's; the log cleaner applies changes)."""
        value = (
            self.image.config(RESOURCE_TOPIC, topic).get("segment.bytes") if self.image else None
        )
        return int(value) if value is not None else self.segment_bytes

    def propose_isr(self, part: Partition, isr: tuple[int, ...], reason: str) -> None:
        """Ask the controller (through the ISR updater, if any) to change a led partition's ISR."""
        if self.isr_updater is not None:
            self.isr_updater.propose(part, isr, reason)

    def checkpoint_high_watermarks(self) -> None:
        for part in list(self.partitions.values()):
            if part.role == "offline":  # its log dir failed during this loop
                continue
            try:
                part.log.checkpoint_high_watermark()
            except OSError as e:
                self._checkpoint_failed(part, "high watermark checkpoint", e)

    async def run_checkpoints(self, interval: float = 5.0) -> None:
        """Checkpoint high watermarks every ``interval`` seconds until cancelled."""
        while True:
            await trio.sleep(interval)
            self.checkpoint_high_watermarks()

    async def run_producer_expiry(
        self, interval_s: float, expiration_ms: int, clock_ms: Callable[[], int]
    ) -> None:
        """Every ``interval_s`` (``producer.id.expiration.check.interval.ms``), forget the
        producers of every partition idle for ``expiration_ms`` (``producer.id.expiration.ms``)."""
        while True:
            await trio.sleep(interval_s)
            now = clock_ms()
            gone = sum(
                part.log.expire_producers(now, expiration_ms)
                for part in list(self.partitions.values())
            )
            if gone:
                log.info("broker %d: %d idle producer id(s) expired", self.broker_id, gone)

    def describe(self) -> list[dict[str, Any]]:
        return [
            self.partitions[k].describe()
            for k in sorted(self.partitions, key=lambda k: (self.partitions[k].topic, k[1]))
        ]

    def close(self) -> None:
        with batched_syncs():  # every log's checkpoints (recovery point, HW) in one sync
            for part in self.partitions.values():
                try:
                    part.log.close()
                except OSError as e:  # a log dir failing at shutdown: what it lost is lost
                    log.error("broker %d: closing %s failed: %s", self.broker_id, part.log.dir, e)
