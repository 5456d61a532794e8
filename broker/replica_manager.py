"""The replica manager: this broker's partitions, driven only by metadata deltas.

``apply_delta(delta, image)`` reads ``delta.local_changes(broker_id)`` (kraft-reference §8.4–8.5)
and, in this order:

1. **deletes** replicas this broker no longer hosts (close the log, remove the directory) —
   first, because a deleted topic's name may be reused in the same delta;
2. **leaders**: open/create ``<log.dir>/<topic>-<partition>/``, start the new leader epoch in
   the leader-epoch cache at the log end, adopt ISR and epochs, keep the high watermark;
3. **followers**: open/create the log, truncate it to the high watermark, and remember the
   leader to fetch from (fetching is a later issue).

A registration whose leader epoch is older than the one this broker already acts on is ignored
with a state-change log line. Each partition directory holds ``partition.metadata`` with its
topic id, so a directory left by a deleted topic of the same name is recognised as stray.
"""
from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from broker.partition_log import PartitionLog

log = logging.getLogger("broker.state_change")
PARTITION_METADATA = "partition.metadata"


@dataclass
class Partition:
    """One local replica: its log and what the latest metadata says about it."""

    topic: str
    topic_id: str
    partition: int
    log: PartitionLog
    role: str = "none"  # "leader" | "follower"
    leader: int = -1
    leader_epoch: int = -1
    partition_epoch: int = -1
    isr: tuple[int, ...] = ()
    replicas: tuple[int, ...] = field(default_factory=tuple)

    @property
    def high_watermark(self) -> int:
        return self.log.high_watermark

    def describe(self) -> dict[str, Any]:
        return {"topic": self.topic, "topic_id": self.topic_id, "partition": self.partition,
                "role": self.role, "leader": self.leader, "leader_epoch": self.leader_epoch,
                "partition_epoch": self.partition_epoch, "isr": list(self.isr),
                "replicas": list(self.replicas), "high_watermark": self.log.high_watermark,
                "log_start_offset": self.log.log_start_offset,
                "log_end_offset": self.log.log_end_offset, "dir": str(self.log.dir)}


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

    def __init__(self, broker_id: int, log_dirs: list[Path], segment_bytes: int = 1 << 30,
                 fsync: bool = False) -> None:
        self.broker_id = broker_id
        self.log_dirs = [Path(d) for d in log_dirs]
        self.segment_bytes = segment_bytes
        self.fsync = fsync
        self.partitions: dict[tuple[str, int], Partition] = {}  # (topic id, partition)
        for d in self.log_dirs:
            d.mkdir(parents=True, exist_ok=True)

    # ---- publisher entry point -------------------------------------------------------------
    def publish(self, delta: Any, image: Any, full: bool = False) -> None:
        """Publisher hook (see :mod:`broker.metadata_loader`). ``full``: the delta starts from
        the empty image (first publish, snapshot load), so anything it does not mention is stray."""
        self.apply_delta(delta, image)
        if full:
            self.remove_strays(image)

    def apply_delta(self, delta: Any, image: Any) -> None:
        """Apply what ``delta`` means for this broker: deletes, then leaders, then followers."""
        changes = delta.local_changes(self.broker_id)
        for topic, topic_id, pid in changes.deletes:
            self._delete(topic, topic_id, pid, reason="no longer a replica" if topic_id in
                         image.topics_by_id else "topic deleted")
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
        for d in self.log_dirs:
            for sub in sorted(p for p in d.iterdir() if p.is_dir()):
                parsed = _parse_dir_name(sub.name)
                if parsed is None:
                    continue
                topic, pid = parsed
                tid = image.topics_by_name.get(topic)
                owned = (tid is not None and (tid, pid) in self.partitions
                         and self.partitions[(tid, pid)].log.dir == sub)
                if not owned:
                    log.warning("broker %d: removing stray partition directory %s (topic id on disk "
                                "%s, in metadata %s)", self.broker_id, sub, _read_topic_id(sub), tid)
                    shutil.rmtree(sub, ignore_errors=True)
                    removed.append(sub)
        return removed

    # ---- transitions -----------------------------------------------------------------------
    def _become(self, topic: str, topic_id: str, pid: int, reg: Any, role: str, offset: int) -> None:
        part = self.partitions.get((topic_id, pid))
        if part is not None and reg.leader_epoch < part.leader_epoch:
            log.info("broker %d: ignoring stale %s registration for %s-%d (topic id %s): leader "
                     "epoch %d < current %d (metadata offset %d)", self.broker_id, role, topic, pid,
                     topic_id, reg.leader_epoch, part.leader_epoch, offset)
            return
        if part is None:
            part = Partition(topic, topic_id, pid, self._open_log(topic, topic_id, pid))
            self.partitions[(topic_id, pid)] = part
        new_epoch = reg.leader_epoch != part.leader_epoch or part.role != role
        part.role, part.leader = role, reg.leader
        part.leader_epoch, part.partition_epoch = reg.leader_epoch, reg.partition_epoch
        part.isr, part.replicas = tuple(reg.isr), tuple(reg.replicas)
        plog = part.log
        if role == "leader":
            if new_epoch:
                plog.assign_epoch(reg.leader_epoch, plog.log_end_offset)
            hw = plog.log_end_offset if part.isr == (self.broker_id,) else plog.high_watermark
            plog.set_high_watermark(hw)
        elif new_epoch:
            plog.truncate_to(plog.high_watermark)
            plog.set_high_watermark(plog.high_watermark)
        log.info("broker %d: %s-%d (topic id %s) -> %s, leader %d, leader epoch %d, partition epoch "
                 "%d, isr %s, high watermark %d, log end %d (metadata offset %d)", self.broker_id,
                 topic, pid, topic_id, role, reg.leader, reg.leader_epoch, reg.partition_epoch,
                 list(part.isr), plog.high_watermark, plog.log_end_offset, offset)

    def _delete(self, topic: str, topic_id: str, pid: int, reason: str) -> None:
        part = self.partitions.pop((topic_id, pid), None)
        if part is not None:
            part.log.close()
            directory = part.log.dir
        else:
            directory = self._existing_dir(topic, pid)
            if directory is None or _read_topic_id(directory) not in (None, topic_id):
                return
        shutil.rmtree(directory, ignore_errors=True)
        log.info("broker %d: deleted replica %s-%d (topic id %s): %s; removed %s", self.broker_id,
                 topic, pid, topic_id, reason, directory)

    # ---- logs on disk ----------------------------------------------------------------------
    def _existing_dir(self, topic: str, pid: int) -> Path | None:
        name = partition_dir_name(topic, pid)
        return next((d / name for d in self.log_dirs if (d / name).is_dir()), None)

    def _open_log(self, topic: str, topic_id: str, pid: int) -> PartitionLog:
        directory = self._existing_dir(topic, pid)
        if directory is not None and _read_topic_id(directory) not in (None, topic_id):
            log.warning("broker %d: %s belongs to an older topic id %s; removing it for %s",
                        self.broker_id, directory, _read_topic_id(directory), topic_id)
            shutil.rmtree(directory, ignore_errors=True)
            directory = None
        if directory is None:
            counts = {d: sum(1 for p in self.partitions.values() if p.log.dir.parent == d)
                      for d in self.log_dirs}
            directory = min(self.log_dirs, key=lambda d: counts[d]) / partition_dir_name(topic, pid)
        plog = PartitionLog.open(directory, self.segment_bytes, self.fsync)
        meta = directory / PARTITION_METADATA
        if not meta.exists():
            meta.write_text(f"version: 0\ntopic_id: {topic_id}\n")
        return plog

    # ---- queries ---------------------------------------------------------------------------
    def get(self, topic_id: str, pid: int) -> Partition | None:
        return self.partitions.get((topic_id, pid))

    def describe(self) -> list[dict[str, Any]]:
        return [self.partitions[k].describe() for k in sorted(
            self.partitions, key=lambda k: (self.partitions[k].topic, k[1]))]

    def close(self) -> None:
        for part in self.partitions.values():
            part.log.close()
