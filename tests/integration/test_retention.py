"""Opt-in metadata retention: the pure policy, and a snapshotter deleting covered segments."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from broker.state import describe
from kraft.log.snapshot import list_snapshots
from kraft.retention import SegmentInfo, retention_cut
from kraft.rpc.client import call_sync
from kraft.snapshotter import Snapshotter, snapshot_state
from tests.harness import LocalCluster, poll
from tests.unit.test_snapshotter import _build_log

NOW = 1_000_000


def segs(*spec: tuple[int, int, int]) -> list[SegmentInfo]:
    """(base, size, age ms) per segment, oldest first."""
    out = []
    for i, (base, size, age) in enumerate(spec):
        nxt = spec[i + 1][0] if i + 1 < len(spec) else None
        out.append(SegmentInfo(base, nxt, size, NOW - age))
    return out


def test_unlimited_by_default_keeps_everything():
    assert retention_cut(segs((0, 100, 10**9), (10, 100, 0)), 10**6, NOW, -1, -1) is None


def test_only_segments_covered_by_the_snapshot_go():
    s = segs((0, 100, 5000), (10, 100, 5000), (20, 100, 5000), (30, 100, 0))
    assert retention_cut(s, 20, NOW, 1000, -1) == 20  # segment 20.. has offsets >= 20
    assert retention_cut(s, 19, NOW, 1000, -1) == 10
    assert retention_cut(s, 5, NOW, 1000, -1) is None
    assert retention_cut(s, 10**6, NOW, 1000, -1) == 30  # never the active segment


def test_time_and_size_limits():
    s = segs((0, 100, 5000), (10, 100, 500), (20, 100, 0))
    assert retention_cut(s, 100, NOW, 1000, -1) == 10  # only the old one
    assert retention_cut(s, 100, NOW, -1, 250) == 10  # 300 bytes > 250: drop the oldest
    assert retention_cut(s, 100, NOW, -1, 100) == 20
    assert retention_cut(s, 100, NOW, -1, 10_000) is None


def test_snapshotter_deletes_covered_segments_and_stale_snapshots(tmp_path):
    log, sm = _build_log(tmp_path, topics=30, segment_bytes=2048)
    snapshotter = Snapshotter(tmp_path, log, 1 << 30, 0)
    first = snapshotter.write(*sm.snapshot_state())
    n_segments = len(log.segments)
    assert n_segments > 5
    assert snapshotter.enforce_retention(10**13, -1, -1) == []  # no limits: nothing goes
    deleted = snapshotter.enforce_retention(10**13, 0, -1)  # everything older than "now"
    assert deleted and len(log.segments) == n_segments - len(deleted)
    assert all(not p.exists() for p in deleted)
    assert log.start_offset <= sm.image.offset + 1
    assert list_snapshots(tmp_path) == [first]  # the newest snapshot stays
    # the log still continues from the snapshot: reopening finds the same image
    log.close()
    from kraft.log.metadata_log import MetadataLog

    reopened = MetadataLog.open(tmp_path, segment_bytes=2048, fsync="never")
    image = Snapshotter(tmp_path, reopened, 1 << 30, 0).load_image()
    assert image.checksum() == sm.image.checksum()
    assert snapshot_state(first)[0].offset == sm.image.offset
    reopened.close()


def test_nothing_goes_without_a_snapshot(tmp_path):
    log, _ = _build_log(tmp_path, topics=30, segment_bytes=2048)
    before = log.segments
    assert Snapshotter(tmp_path, log, 1 << 30, 0).enforce_retention(10**13, 0, 1) == []
    assert log.segments == before
    log.close()


def _restart_controller_with(c: LocalCluster, *settings: str) -> None:
    """Stop broker 101 and controller 1, add ``settings`` to the controller's properties, start
    the controller again."""
    c.kill(101, "TERM")
    c.kill(1, "TERM")
    props = Path(c.controller(1)["config"])
    props.write_text(props.read_text() + "\n" + "\n".join(settings) + "\n")
    c.start(1)


def _alter_configs(bootstrap: list, topics: list[str], count: int, creds: object = None) -> None:
    """``count`` config changes round-robin over ``topics`` (they need no unfenced broker)."""
    for i in range(count):
        r = call_sync(
            bootstrap,
            "IncrementalAlterConfigs",
            {
                "resources": [
                    {
                        "resource_type": "topic",
                        "resource_name": topics[i % len(topics)],
                        "ops": [{"name": "retention.ms", "op": "SET", "value": str(1000 + i)}],
                    }
                ]
            },
            timeout=30,
            credentials=creds,
        )
        assert not r["resources"][0]["error_code"], r


def _broker_without_metadata_loads_the_snapshot(c: LocalCluster, bootstrap: list) -> None:
    """Restart broker 101 with its metadata dir gone; it must load the controller's snapshot
    and converge on the controller's image."""
    broker = next(b for b in c.meta["brokers"] if b["id"] == 101)
    shutil.rmtree(Path(broker["log_dirs"].split(",")[0]) / "metadata")
    c.start(101)

    def converged():
        view = call_sync(bootstrap, "DescribeNode", {}, timeout=5, credentials=c.credentials())
        s = describe(broker["host"], broker["admin_port"], timeout=5.0)
        return (
            s["state"] == "RUNNING"
            and s["last_applied_offset"] == view["applied_offset"]
            and s["image_checksum"] == view["image_checksum"]
        )

    poll(converged, 60, what="the broker to load the snapshot and catch up")
    assert "loading snapshot" in Path(broker["log_file"]).read_text()


@pytest.mark.integration
def test_a_broker_starting_after_retention_loads_the_controllers_snapshot(tmp_path):
    """A real controller with retention on deletes covered segments; a broker whose metadata
    is gone is sent the snapshot (FetchSnapshot), loads it and converges on the same image."""
    c = LocalCluster(tmp_path / "cluster")
    try:
        c.up(1, 1)
        bootstrap = [(c.controller(1)["host"], c.controller(1)["rpc_port"])]
        for i in range(3):
            r = call_sync(
                bootstrap,
                "CreateTopics",
                {"topics": [{"name": f"kept-{i}", "num_partitions": 2, "replication_factor": 1}]},
                timeout=30,
                credentials=c.credentials(),
            )
            assert not r["topics"][0]["error_code"], r
        _restart_controller_with(
            c,
            "metadata.log.segment.bytes=4096",
            "metadata.log.max.record.bytes.between.snapshots=8192",
            "metadata.max.retention.bytes=1",
        )
        _alter_configs(
            bootstrap, [f"kept-{i}" for i in range(3)], 80, c.credentials()
        )  # enough to roll segments
        log_dir = c.log_dir(1)
        poll(
            lambda: min(int(p.name.split(".")[0]) for p in log_dir.glob("*.log")) > 0,
            60,
            what="retention to delete the first segments",
        )
        _broker_without_metadata_loads_the_snapshot(c, bootstrap)
    finally:
        c.down()


@pytest.mark.integration
def test_a_broker_far_behind_the_newest_snapshot_loads_it_instead_of_the_log(tmp_path):
    """Full history is kept (no retention), but a broker whose metadata is gone starts more
    than metadata.fetch.snapshot.min.lag.records before the newest snapshot's end: it is told
    to load that snapshot, and converges on the controller's image."""
    c = LocalCluster(tmp_path / "cluster")
    try:
        c.up(1, 1)
        bootstrap = [(c.controller(1)["host"], c.controller(1)["rpc_port"])]
        r = call_sync(
            bootstrap,
            "CreateTopics",
            {"topics": [{"name": "kept", "num_partitions": 2, "replication_factor": 1}]},
            timeout=30,
            credentials=c.credentials(),
        )
        assert not r["topics"][0]["error_code"], r
        _restart_controller_with(
            c,
            "metadata.log.max.record.bytes.between.snapshots=4096",
            "metadata.fetch.snapshot.min.lag.records=20",
        )
        _alter_configs(bootstrap, ["kept"], 60, c.credentials())
        poll(lambda: list_snapshots(c.log_dir(1)), 60, what="a snapshot")
        assert min(int(p.name.split(".")[0]) for p in c.log_dir(1).glob("*.log")) == 0  # all kept
        _broker_without_metadata_loads_the_snapshot(c, bootstrap)
    finally:
        c.down()
