"""Images to snapshot files and back; the snapshot policy; installing a received snapshot."""

from __future__ import annotations

import uuid

import pytest

from kraft.controller.commands import Command
from kraft.controller.settings import ControllerSettings
from kraft.controller.state_machine import QuorumStateMachine
from kraft.log.metadata_log import MetadataLog
from kraft.log.snapshot import CorruptSnapshotError
from kraft.metadata.checksum import topic_digest
from kraft.snapshotter import (
    Snapshotter,
    image_from_snapshot,
    image_to_snapshot,
    image_to_snapshot_in_child,
)

LISTENER = {
    "name": "PLAINTEXT",
    "host": "127.0.0.1",
    "port": 9092,
    "security_protocol": "PLAINTEXT",
}
FEATURES = [{"name": "metadata.version", "min_version": 1, "max_version": 2}]


def _build_log(
    directory, topics: int, segment_bytes: int = 1 << 24
) -> tuple[MetadataLog, QuorumStateMachine]:
    """A metadata log written by a real state machine: activation, 3 brokers, ``topics`` topics."""
    log = MetadataLog.open(directory, segment_bytes=segment_bytes, fsync="never")
    sm = QuorumStateMachine(ControllerSettings(cluster_id="c"))
    commands = [("ActivateController", {"leader_id": 1, "term": 1})]
    commands += [
        (
            "BrokerRegistration",
            {
                "broker_id": b,
                "cluster_id": "c",
                "incarnation_id": str(uuid.UUID(int=b)),
                "listeners": [LISTENER],
                "rack": None,
                "features": FEATURES,
            },
        )
        for b in (1, 2, 3)
    ]
    commands += [("UnfenceBroker", {"broker_id": b, "broker_epoch": None}) for b in (1, 2, 3)]
    commands += [
        (
            "CreateTopics",
            {"topics": [{"name": f"t{i}", "num_partitions": 3, "replication_factor": 3}]},
        )
        for i in range(topics)
    ]
    for raft_index, (api, body) in enumerate(commands, start=2):
        if api == "UnfenceBroker":
            body = dict(body, broker_epoch=sm.image.brokers[body["broker_id"]].epoch)
        batch, response, _ = sm.propose(
            Command(
                api=api,
                body=body,
                request_id=f"r{raft_index}",
                timestamp_ms=raft_index,
                seed=raft_index,
                leader_id=1,
            ),
            1,
        )
        assert not response.get("error_code"), response
        assert not any(t.get("error_code") for t in response.get("topics", [])), response
        assert batch is not None, (api, response)
        log.append_encoded(sm.last_encoded, batch)
    return log, sm


def test_image_round_trips_through_a_snapshot_file(tmp_path):
    log, sm = _build_log(tmp_path / "log", topics=5)
    path = image_to_snapshot(tmp_path / "snaps", sm.image)
    back = image_from_snapshot(path)
    assert back.checksum() == sm.image.checksum()
    assert (back.offset, back.term, back.raft_index, back.last_hash) == (
        sm.image.offset,
        sm.image.term,
        sm.image.raft_index,
        sm.image.last_hash,
    )
    log.close()


def test_a_forked_writer_writes_the_same_bytes_and_reports_its_errors(tmp_path):
    log, sm = _build_log(tmp_path / "log", topics=5)
    window = (("r1", {"error_code": 0}),)
    topics = list(sm.image.topics_by_id.values())
    assert all(t._digest is None for t in topics)  # never checksummed in this process
    path, cpu_s = image_to_snapshot_in_child(tmp_path / "forked", sm.image, window)
    assert path == tmp_path / "forked" / path.name and cpu_s >= 0
    # the digests the child computed are kept here, and are the right ones
    assert all(t._digest == topic_digest(t.name, t.topic_id, t.partitions) for t in topics)
    assert (
        path.read_bytes() == image_to_snapshot(tmp_path / "inline", sm.image, window).read_bytes()
    )
    (tmp_path / "a-file").write_bytes(b"")
    with pytest.raises(OSError) as failed:  # the child's errno, as a thread's write would raise
        image_to_snapshot_in_child(tmp_path / "a-file" / "snaps", sm.image)
    assert failed.value.errno == 17 or failed.value.errno == 20  # EEXIST / ENOTDIR
    assert not list((tmp_path / "forked").glob("*.part"))
    snapshotter = Snapshotter(tmp_path / "log", log, 1 << 30, 0, fork=True)
    written = snapshotter.write(sm.image)
    assert written.read_bytes() == image_to_snapshot(tmp_path / "again", sm.image).read_bytes()
    assert snapshotter.latest() == written
    log.close()


def test_snapshot_is_due_after_enough_new_log(tmp_path):
    log, sm = _build_log(tmp_path / "log", topics=2)
    snapshotter = Snapshotter(tmp_path / "log", log, max_bytes_between=1, max_interval_ms=0)
    assert snapshotter.due(sm.image, now_ms=0) is False  # nothing written since it was opened
    batch, _, _ = sm.propose(
        Command(
            api="CreateTopics",
            body={"topics": [{"name": "late", "num_partitions": 1, "replication_factor": 1}]},
            request_id="late",
            timestamp_ms=99,
            seed=99,
            leader_id=1,
        ),
        1,
    )
    log.append_encoded(sm.last_encoded, batch)
    assert snapshotter.due(sm.image, now_ms=0) is True
    path = snapshotter.write(sm.image)
    assert snapshotter.latest() == path and snapshotter.due(sm.image, now_ms=0) is False
    log.close()


def test_asking_for_the_latest_snapshot_during_a_write_leaves_the_write_alone(tmp_path):
    """FetchMetadata asks for the latest snapshot while the snapshot thread may be writing one:
    the answer must not come from a directory listing that removes the write's ``.part`` file
    (two controllers of the scale bench stopped on exactly that)."""
    log, sm = _build_log(tmp_path / "log", topics=2)
    snapshotter = Snapshotter(tmp_path / "log", log, max_bytes_between=1, max_interval_ms=0)
    first = snapshotter.write(sm.image)
    in_progress = tmp_path / "log" / (first.name + ".part")  # as write_snapshot_runs names it
    in_progress.write_bytes(b"half a snapshot")
    assert snapshotter.latest() == first
    assert in_progress.exists()
    in_progress.unlink()
    log.close()


def test_phase_brings_the_first_byte_triggered_snapshot_forward(tmp_path):
    """Controllers with different phases do not all snapshot at the same offset."""
    log, sm = _build_log(tmp_path / "log", topics=2)
    batch, _, _ = sm.propose(
        Command(
            api="CreateTopics",
            body={"topics": [{"name": "late", "num_partitions": 1, "replication_factor": 1}]},
            request_id="late",
            timestamp_ms=99,
            seed=99,
            leader_id=1,
        ),
        1,
    )
    grown = len(sm.last_encoded) + 64  # the batch and its frame; over-estimated a little
    threshold = grown * 2  # the new batch is about half of it
    snapshotters = {
        phase: Snapshotter(tmp_path / "log", log, threshold, 0, phase=phase)
        for phase in (0.0, 0.3, 0.7)
    }
    log.append_encoded(sm.last_encoded, batch)
    assert {phase: s.due(sm.image, now_ms=0) for phase, s in snapshotters.items()} == {
        0.0: False,
        0.3: False,
        0.7: True,
    }
    with pytest.raises(ValueError):
        Snapshotter(tmp_path / "log", log, threshold, 0, phase=1.0)
    log.close()


def test_installing_a_received_snapshot_restarts_the_log_after_it(tmp_path):
    leader_log, leader = _build_log(tmp_path / "leader", topics=6)
    data = image_to_snapshot(tmp_path / "out", leader.image).read_bytes()

    follower_log, follower = _build_log(tmp_path / "follower", topics=1)
    snapshotter = Snapshotter(tmp_path / "follower", follower_log, 1 << 30, 0)
    assert snapshotter.install(data, leader.image) is None  # not ahead: nothing happens
    assert follower_log.start_offset == 0

    installed = snapshotter.install(data, follower.image)
    assert installed is not None and installed.checksum() == leader.image.checksum()
    assert (follower_log.start_offset, follower_log.next_offset) == (leader.image.offset + 1,) * 2
    assert follower_log.last_hash == leader.image.last_hash
    follower_log.close()

    # Restart: the empty log continues from the installed snapshot.
    reopened = MetadataLog.open(tmp_path / "follower", fsync="never")
    image = Snapshotter(tmp_path / "follower", reopened, 1 << 30, 0).load_image()
    assert image.checksum() == leader.image.checksum()
    assert reopened.next_offset == leader.image.offset + 1
    reopened.close()
    leader_log.close()


def test_a_corrupt_received_snapshot_is_refused_and_changes_nothing(tmp_path):
    leader_log, leader = _build_log(tmp_path / "leader", topics=3)
    data = bytearray(image_to_snapshot(tmp_path / "out", leader.image).read_bytes())
    data[len(data) // 2] ^= 0xFF
    follower_log, follower = _build_log(tmp_path / "follower", topics=1)
    before = (follower_log.start_offset, follower_log.next_offset, follower_log.last_hash)
    with pytest.raises(CorruptSnapshotError):
        Snapshotter(tmp_path / "follower", follower_log, 1 << 30, 0).install(
            bytes(data), follower.image
        )
    assert (follower_log.start_offset, follower_log.next_offset, follower_log.last_hash) == before
    assert not list((tmp_path / "follower").glob("*.tmp")) and not list(
        (tmp_path / "follower").glob("*.checkpoint")
    )
    follower_log.close()
    leader_log.close()


def test_recent_batches_before_reads_backwards_across_segments(tmp_path):
    log, sm = _build_log(tmp_path, topics=40, segment_bytes=2048)
    assert len(log.segments) > 5
    every = list(log.read_batches(0))
    cut = every[30].last_offset
    got = log.recent_batches_before(cut, 12, lambda b: b.provenance.request_id.endswith(("0", "5")))
    expected = [b for b in every[:31] if b.provenance.request_id.endswith(("0", "5"))][-12:]
    assert [b.base_offset for b in got] == [b.base_offset for b in expected]
    assert log.recent_batches_before(cut, 10_000, lambda b: True) == every[:31]
    assert log.recent_batches_before(-1, 5, lambda b: True) == []


def test_a_controller_restarted_from_a_snapshot_still_knows_recent_request_ids(tmp_path):
    from kraft.config import ControllerConfig
    from kraft.controller_server import ControllerServer

    log, sm = _build_log(tmp_path / "log", topics=20, segment_bytes=4096)
    snapshotter = Snapshotter(tmp_path / "log", log, 1 << 30, 0)
    snapshotter.write(sm.image)
    log.close()
    node = ControllerServer(
        ControllerConfig.from_properties(
            {
                "node.id": "1",
                "process.roles": "controller",
                "cluster.id": "c",
                "controller.quorum.voters": "1@127.0.0.1:9000",
                "controller.quorum.raft.voters": "1@127.0.0.1:9001",
                "metadata.log.dir": str(tmp_path),
            },
            env={"KRAFT_RAFT_SECRET": "a-test-raft-secret-of-at-least-32-bytes"},
        )
    )
    try:
        assert node.state_machine.image.offset == sm.image.offset
        assert node.state_machine.recent_request_ids == sm.recent_request_ids
        # a retry of the last create is answered from the window, not written twice
        retry = Command(
            api="CreateTopics",
            body={"topics": [{"name": "t19", "num_partitions": 3, "replication_factor": 3}]},
            request_id=sm.recent_request_ids[-1],
            timestamp_ms=10_000,
            seed=1,
            leader_id=1,
        )
        batch, response, _ = node.state_machine.propose(retry, 1)
        assert batch is None and response.get("duplicate"), response
    finally:
        node.log.close()


def test_the_dedup_window_travels_with_a_snapshot_to_a_follower_that_installs_it(tmp_path):
    leader_log, leader = _build_log(tmp_path / "leader", topics=6)
    image, window = leader.snapshot_state()
    assert [rid for rid, _ in window] == leader.recent_request_ids and window
    data = image_to_snapshot(tmp_path / "out", image, window).read_bytes()
    follower_log = MetadataLog.open(tmp_path / "follower", fsync="never")
    follower = QuorumStateMachine(ControllerSettings(cluster_id="c"))
    snapshotter = Snapshotter(tmp_path / "follower", follower_log, 1 << 30, 0)
    installed = snapshotter.install(data, follower.image)
    assert installed is not None
    follower.reset(installed, snapshotter.request_ids)
    assert follower.recent_request_ids == leader.recent_request_ids
    # the same retry is a duplicate on both: neither writes a batch, the logs stay identical
    rid = leader.recent_request_ids[-1]
    retry = Command(
        api="CreateTopics",
        body={"topics": [{"name": "t5", "num_partitions": 3, "replication_factor": 3}]},
        request_id=rid,
        timestamp_ms=99,
        seed=1,
        leader_id=1,
    )
    assert leader.propose(retry, 1) == follower.propose(retry, 1)
    assert leader.propose(retry, 1)[0] is None
    # and a restart of the follower (history starts at the snapshot) keeps the window too
    follower_log.close()
    reopened = MetadataLog.open(tmp_path / "follower", fsync="never")
    again = Snapshotter(tmp_path / "follower", reopened, 1 << 30, 0)
    assert again.load_image().offset == image.offset
    assert [rid for rid, _ in again.request_ids] == leader.recent_request_ids
    reopened.close()
    leader_log.close()


def test_snapshot_load_checks_partition_values_by_the_image_checksum(tmp_path):
    """Partition values load unchecked, so the image checksum must catch a typed-wrong value and
    a mismatching header; the strict re-read then names the bad value."""
    import dataclasses

    from kraft.log.snapshot import SNAPSHOT_FORMAT, write_snapshot_runs
    from kraft.records import PartitionRecord
    from kraft.snapshot_image import image_header

    log, sm = _build_log(tmp_path / "log", topics=3)
    image = sm.image
    header = image_header(image, fmt=SNAPSHOT_FORMAT)

    def bad_leader(runs):  # the first partition's leader as a float: same value, other encoding
        for cls, rows in runs:
            if cls is PartitionRecord and rows and not isinstance(rows[0][6], float):
                rows = [rows[0][:6] + (float(rows[0][6]),) + rows[0][7:], *rows[1:]]
            yield cls, rows

    path = write_snapshot_runs(tmp_path / "bad", header, bad_leader(image.record_runs()))
    with pytest.raises(CorruptSnapshotError, match="leader"):
        image_from_snapshot(path)
    wrong = dataclasses.replace(header, image_checksum="0" * 64)
    path = write_snapshot_runs(tmp_path / "wrong", wrong, image.record_runs())
    with pytest.raises(CorruptSnapshotError, match="checksum"):
        image_from_snapshot(path)
    log.close()
