"""Replica manager driven by metadata deltas: leaders, followers, deletes, stale epochs, strays."""

from __future__ import annotations

import logging
import uuid

from broker.replica.partition_log import LEADER_EPOCH_FILE
from broker.replica.replica_manager import ReplicaManager
from kraft.metadata.delta import MetadataDelta
from kraft.metadata.image import MetadataImage
from kraft.records import (
    LEADER_UNCHANGED,
    RECOVERY_UNCHANGED,
    PartitionChangeRecord,
    PartitionRecord,
    RemoveTopicRecord,
    TopicRecord,
)
from tests.unit.test_partition_log import make_batch

ME = 1


class Cluster:
    """Feeds records to a replica manager one delta at a time, as the publisher does."""

    def __init__(self, rm: ReplicaManager) -> None:
        self.rm = rm
        self.image = MetadataImage.EMPTY

    def step(self, *records) -> None:
        delta = MetadataDelta(self.image)
        for r in records:
            delta.replay(r)
        self.image = delta.apply()
        self.rm.apply_delta(delta, self.image)


def partition(tid, pid, replicas, leader, leader_epoch=0, partition_epoch=0, isr=None):
    return PartitionRecord(
        pid,
        tid,
        tuple(replicas),
        tuple(isr or replicas),
        (),
        (),
        leader,
        0,
        leader_epoch,
        partition_epoch,
    )


def change(tid, pid, leader=LEADER_UNCHANGED, isr=None, replicas=None):
    return PartitionChangeRecord(
        pid, tid, isr, leader, replicas, None, None, RECOVERY_UNCHANGED, None
    )


def test_create_topic_makes_leaders_and_followers(tmp_path):
    rm = ReplicaManager(ME, [tmp_path / "a", tmp_path / "b"])
    c = Cluster(rm)
    tid = str(uuid.uuid4())
    c.step(
        TopicRecord("orders", tid),
        partition(tid, 0, [1, 2], 1),
        partition(tid, 1, [2, 1], 2),
        partition(tid, 2, [2, 3], 2),
    )
    p0, p1 = rm.get(tid, 0), rm.get(tid, 1)
    assert (p0.role, p0.leader_epoch, p0.isr) == ("leader", 0, (1, 2))
    assert (p1.role, p1.leader) == ("follower", 2)
    assert rm.get(tid, 2) is None  # not a replica here
    dirs = sorted(p.log.dir.parent.name for p in (p0, p1))
    assert dirs == ["a", "b"]  # spread over log dirs
    assert (p0.log.dir / LEADER_EPOCH_FILE).read_text() == "0\n1\n0 0\n"
    assert (p0.log.dir / "partition.metadata").read_text() == f"version: 0\ntopic_id: {tid}\n"
    assert [d["role"] for d in rm.describe()] == ["leader", "follower"]


def test_leader_to_follower_keeps_its_log_for_the_fetcher_to_truncate(tmp_path):
    rm = ReplicaManager(ME, [tmp_path])
    c = Cluster(rm)
    tid = str(uuid.uuid4())
    c.step(TopicRecord("t", tid), partition(tid, 0, [1, 2], 1))
    p = rm.get(tid, 0)
    p.log.append(make_batch([b"a", b"b"]), leader_epoch=0)
    p.log.set_high_watermark(2)
    p.log.append(make_batch([b"c"]), leader_epoch=0)  # not yet replicated
    c.step(change(tid, 0, leader=2))
    assert (p.role, p.leader, p.leader_epoch) == ("follower", 2, 1)
    # no truncation to the (possibly lagging) local high watermark: OffsetForLeaderEpoch decides
    assert p.log.log_end_offset == 3 and p.high_watermark == 2
    p.log.truncate_to(2)
    c.step(change(tid, 0, leader=1))
    assert (p.role, p.leader_epoch) == ("leader", 2)
    assert p.log.epochs == [(0, 0), (2, 2)]
    c.step(change(tid, 0, isr=(1,)))  # ISR shrink: same leader epoch, single-replica ISR
    assert p.isr == (1,) and p.leader_epoch == 2 and p.partition_epoch == 3


def test_delete_topic_and_reassignment_remove_directories(tmp_path):
    rm = ReplicaManager(ME, [tmp_path])
    c = Cluster(rm)
    t1, t2 = str(uuid.uuid4()), str(uuid.uuid4())
    c.step(
        TopicRecord("gone", t1),
        partition(t1, 0, [1], 1),
        TopicRecord("moved", t2),
        partition(t2, 0, [1, 2], 1),
    )
    assert (tmp_path / "gone-0").is_dir() and (tmp_path / "moved-0").is_dir()
    c.step(RemoveTopicRecord(t1))
    assert not (tmp_path / "gone-0").exists() and rm.get(t1, 0) is None
    c.step(change(t2, 0, leader=2, isr=(2,), replicas=(2,)))
    assert not (tmp_path / "moved-0").exists() and rm.get(t2, 0) is None
    # the name can be reused by a new topic in one delta with the deletion of the old
    t3 = str(uuid.uuid4())
    c.step(TopicRecord("gone", t3), partition(t3, 0, [1], 1))
    assert rm.get(t3, 0).log.dir == tmp_path / "gone-0"


def test_stale_leader_epoch_is_ignored(tmp_path, caplog):
    rm = ReplicaManager(ME, [tmp_path])
    c = Cluster(rm)
    tid = str(uuid.uuid4())
    c.step(TopicRecord("t", tid), partition(tid, 0, [1, 2], 1, leader_epoch=5, partition_epoch=9))
    stale = MetadataDelta(MetadataImage.EMPTY)
    stale.replay(TopicRecord("t", tid))
    stale.replay(partition(tid, 0, [1, 2], 2, leader_epoch=3, partition_epoch=4))
    with caplog.at_level(logging.INFO, logger="broker.state_change"):
        rm.apply_delta(stale, stale.apply())
    p = rm.get(tid, 0)
    assert (p.role, p.leader_epoch) == ("leader", 5)
    assert "ignoring stale follower registration for t-0" in caplog.text


def test_restart_keeps_data_and_removes_strays(tmp_path):
    rm = ReplicaManager(ME, [tmp_path])
    c = Cluster(rm)
    t1, t2 = str(uuid.uuid4()), str(uuid.uuid4())
    c.step(
        TopicRecord("keep", t1),
        partition(t1, 0, [1], 1),
        TopicRecord("old", t2),
        partition(t2, 0, [1], 1),
    )
    rm.get(t1, 0).log.append(make_batch([b"x"] * 3), leader_epoch=0)
    rm.close()
    # Restart: metadata (replayed from scratch) no longer has "old"; "keep" is unchanged.
    rm2 = ReplicaManager(ME, [tmp_path])
    c2 = Cluster(rm2)
    c2.step(TopicRecord("keep", t1), partition(t1, 0, [1], 1))
    removed = rm2.remove_strays(c2.image)
    assert removed == [tmp_path / "old-0"]
    p = rm2.get(t1, 0)
    assert p.log.log_end_offset == 3 and p.high_watermark == 3  # sole ISR member: HW = log end
    # A same-named directory from an older topic id is replaced, not reused.
    t3 = str(uuid.uuid4())
    rm3 = ReplicaManager(ME, [tmp_path])
    Cluster(rm3).step(TopicRecord("keep", t3), partition(t3, 0, [1], 1))
    assert rm3.get(t3, 0).log.log_end_offset == 0


def test_a_delta_syncs_its_checkpoints_once_not_per_partition(tmp_path, monkeypatch):
    """Hundreds of partitions moving in one delta: each partition's checkpoints are written
    (atomically) but the disk sync happens once, not twice per partition on the event loop."""
    import os

    import broker.replica.partition_log as pl

    fsyncs, syncfs = [], []
    real_fsync = os.fsync
    monkeypatch.setattr(pl.os, "fsync", lambda fd: (fsyncs.append(fd), real_fsync(fd))[1])
    monkeypatch.setattr(pl, "_libc_syncfs", lambda fd: syncfs.append(fd) or 0)
    rm = ReplicaManager(ME, [tmp_path / "a", tmp_path / "b"])
    c = Cluster(rm)
    tid = str(uuid.uuid4())
    fsyncs.clear()
    c.step(TopicRecord("many", tid), *[partition(tid, p, [1, 2], 1) for p in range(200)])
    assert len(rm.partitions) == 200 and len(syncfs) == 1
    assert len(fsyncs) < 20, len(fsyncs)  # not 2 x 200
    assert all(
        (p.log.dir / LEADER_EPOCH_FILE).read_text() == "0\n1\n0 0\n" for p in rm.partitions.values()
    )
    counts = sorted(
        sum(1 for p in rm.partitions.values() if p.log.dir.parent == d) for d in rm.log_dirs
    )
    assert counts == [100, 100]  # still spread evenly over the log dirs


def test_a_start_up_sized_delta_logs_a_summary_and_restarts_from_disk(tmp_path, caplog):
    """Thousands of transitions in one delta: one INFO summary (the per-partition lines go to
    DEBUG); the logs, checkpoints and partition.metadata are on disk, and a new replica
    manager (a restart) reopens every one of them from its directory listing."""
    from broker.replica.replica_manager import DETAIL_LINES_MAX, PARTITION_METADATA

    n = DETAIL_LINES_MAX + 1
    rm = ReplicaManager(ME, [tmp_path])
    c = Cluster(rm)
    tid = str(uuid.uuid4())
    with caplog.at_level(logging.INFO, logger="broker.state_change"):
        c.step(
            TopicRecord("big", tid),
            *[partition(tid, p, [1, 2], 1 if p % 2 else 2) for p in range(n)],
        )
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    led = sum(1 for p in range(n) if p % 2)  # broker 1 (ME) leads the odd ones
    assert infos == [
        f"broker {ME}: metadata offset {c.image.offset}: 0 replicas deleted, "
        f"{led} become leader, {n - led} become follower (one line each at DEBUG)"
    ]
    part = rm.get(tid, 7)
    assert (part.log.dir / PARTITION_METADATA).read_text() == f"version: 0\ntopic_id: {tid}\n"
    rm.close()
    again = ReplicaManager(ME, [tmp_path])
    again.publish(MetadataDelta.full(c.image), c.image, full=True)
    assert len(again.partitions) == n and again.remove_strays(c.image) == []
    assert again.get(tid, 7).log.dir == part.log.dir
    again.close()
