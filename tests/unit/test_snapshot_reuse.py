"""Snapshots that copy unchanged topics' frames from the previous one (kraft/snapshot_image.py):
byte-identical to writing from scratch, whatever happened to the previous file."""

from __future__ import annotations

import os

from kraft.log.metadata_log import MetadataLog
from kraft.metadata.delta import MetadataDelta
from kraft.metadata.replay import image_from_records
from kraft.records import (
    LEADER_UNCHANGED,
    RECOVERY_UNCHANGED,
    FeatureLevelRecord,
    PartitionChangeRecord,
    PartitionRecord,
    RegisterBrokerRecord,
    TopicRecord,
)
from kraft.snapshot_image import FrameIndex, write_image_snapshot
from kraft.snapshotter import Snapshotter, image_from_snapshot, write_in_child


def _image(topics=30, partitions=40):
    recs = [FeatureLevelRecord("metadata.version", 1)]
    recs += [RegisterBrokerRecord(b, f"inc-{b}", b, (), (), None, False, False) for b in (1, 2, 3)]
    for t in range(topics):
        tid = f"00000000-0000-0000-0000-{t:012d}"
        recs.append(TopicRecord(f"topic-{t:03d}", tid))
        n = 1500 if t == 3 else 0 if t == 5 else partitions  # a multi-chunk and an empty topic
        recs += [
            PartitionRecord(p, tid, (1, 2, 3), (1, 2, 3), (), (), 1 + p % 3, 0, 0, 0)
            for p in range(n)
        ]
    return image_from_records(recs, offset=len(recs) - 1, term=1)


def _changed(image, topic_numbers, offset_step=1):
    """``image`` after an ISR shrink of partition 0 in each of ``topic_numbers``."""
    delta = MetadataDelta(image)
    for t in topic_numbers:
        tid = f"00000000-0000-0000-0000-{t:012d}"
        delta.replay(
            PartitionChangeRecord(
                0, tid, (1, 2), LEADER_UNCHANGED, None, None, None, RECOVERY_UNCHANGED, None
            )
        )
    delta.set_provenance(
        offset=image.offset + offset_step,
        term=1,
        raft_index=0,
        timestamp_ms=0,
        last_hash=image.last_hash,
    )
    return delta.apply()


def _scratch(tmp_path, image, name):
    """``image`` written from scratch (a copy without cached digests)."""
    fresh = image_from_snapshot(write_image_snapshot(tmp_path / f"{name}-src", image)[0])
    for topic in fresh.topics_by_id.values():
        object.__setattr__(topic, "_digest", None)
    return write_image_snapshot(tmp_path / name, fresh)[0].read_bytes()


def test_copied_frames_give_the_bytes_of_a_write_from_scratch(tmp_path):
    first = _image()
    _, index, copied = write_image_snapshot(tmp_path / "a", first)
    assert copied == 0 and len(index.topics) == 30
    second = _changed(first, [0, 3, 7])
    path, index2, copied = write_image_snapshot(tmp_path / "b", second, (), index)
    assert copied == 27  # every topic but the three changed
    assert path.read_bytes() == _scratch(tmp_path, second, "scratch")
    assert image_from_snapshot(path) == second
    # and on: the new index serves the next snapshot
    third = _changed(second, [1], offset_step=2)
    path3, _, copied = write_image_snapshot(tmp_path / "c", third, (), index2)
    assert copied == 29
    assert path3.read_bytes() == _scratch(tmp_path, third, "scratch3")


def test_a_damaged_or_replaced_previous_file_is_not_copied(tmp_path):
    first = _image()
    path, index, _ = write_image_snapshot(tmp_path / "a", first)
    second = _changed(first, [0])
    expected = _scratch(tmp_path, second, "scratch")
    # a flipped byte inside one topic's frame: that frame is packed anew, the others copied
    position, length = index.topics[first.topics_by_name["topic-009"]][1:]
    data = bytearray(path.read_bytes())
    data[position + length // 2] ^= 0x01
    with open(path, "r+b") as f:  # same file (inode, size), mtime kept: only the CRC can tell
        f.seek(0)
        f.write(data)
    os.utime(path, ns=(index.identity[3], index.identity[3]))
    out, _, copied = write_image_snapshot(tmp_path / "b", second, (), index)
    assert copied == 28 and out.read_bytes() == expected
    # the file replaced by another one (a different inode): nothing is copied
    os.replace(out, path)
    out, _, copied = write_image_snapshot(tmp_path / "c", second, (), index)
    assert copied == 0 and out.read_bytes() == expected
    # gone
    path.unlink()
    out, _, copied = write_image_snapshot(tmp_path / "d", second, (), index)
    assert copied == 0 and out.read_bytes() == expected


def test_a_forked_writer_copies_and_hands_back_its_index(tmp_path):
    first = _image()
    path, _, index = write_in_child(tmp_path / "a", first)
    assert isinstance(index, FrameIndex) and index.path == path
    assert all(t._digest is not None for t in first.topics_by_id.values())  # adopted
    second = _changed(first, [2])
    path2, _, index2 = write_in_child(tmp_path / "b", second, (), index)
    assert index2 is not None and path2.read_bytes() == _scratch(tmp_path, second, "scratch")


def test_the_snapshotter_writes_incrementally(tmp_path):
    log = MetadataLog.open(tmp_path / "log", segment_bytes=1 << 20, fsync="never")
    snapshotter = Snapshotter(tmp_path / "log", log, 1 << 30, 0, fork=True)
    first = _image()
    snapshotter.write(first)
    second = _changed(first, [4])
    path = snapshotter.write(second)
    assert path.read_bytes() == _scratch(tmp_path, second, "scratch")
    log.close()


def test_a_frame_index_round_trips_and_refuses_garbage():
    index = FrameIndex(tmp := __import__("pathlib").Path("/x/y"), (1, 2, 3, 4), {"t": (b"d", 9, 5)})
    assert FrameIndex.from_wire(index.to_wire()) == index and tmp == index.path
    for bad in (None, [b"/x", [1, 2], []], [b"/x", [1, 2, 3, 4], [["t", "d", 9, 5]]]):
        try:
            FrameIndex.from_wire(bad)
        except ValueError:
            continue
        raise AssertionError(f"accepted {bad!r}")


def test_a_loaded_snapshot_serves_the_next_write(tmp_path):
    """A controller starting from a snapshot copies from it at its first write: the load keeps
    where the file holds each topic, and the topics' digests (taken from the frames)."""
    from kraft.snapshotter import _load_snapshot

    first = _image()
    path, _, _ = write_image_snapshot(tmp_path / "log", first)
    loaded, _, index = _load_snapshot(path, freeze=False)
    assert index is not None and len(index.topics) == 30 and index.path == path
    second = _changed(loaded, [1])
    out, _, copied = write_image_snapshot(tmp_path / "b", second, (), index)
    assert copied == 29 and out.read_bytes() == _scratch(tmp_path, second, "scratch")

    log = MetadataLog.open(tmp_path / "log", segment_bytes=1 << 20, fsync="never")
    snapshotter = Snapshotter(tmp_path / "log", log, 1 << 30, 0, fork=True)
    start = snapshotter.load_image()  # an empty log next to the snapshot continues from it
    assert start == first and snapshotter._frames is not None
    assert snapshotter.write(_changed(start, [1])).read_bytes() == out.read_bytes()
    log.close()
