"""Snapshot write and load at scale (issue 24 item 4: write <= 5 s, cold start <= 10 s at 2M).

Builds an image of ``--partitions`` partitions (topics of 100, RF 3 over ``--brokers`` brokers)
in this process, then times, in wall and CPU seconds, what a controller does with it:

* ``write_first``: ``Snapshotter(fork=True).write`` of the image, no digest known (the writer
  is a forked child: its CPU is this process's children's CPU);
* ``write_incremental``: the next write after ``--changed`` (default 1%) of the partitions had
  an ISR change (partitions picked at random, so most topics see one), as while ISR and leader
  changes trickle in between periodic snapshots;
* ``load``: a controller's start from the second snapshot: ``Snapshotter.load_image`` (decode,
  build, verify against the header's image checksum) then ``kraft.heap.freeze_heap`` (what the
  metadata applier does next): the snapshot half of a cold start;
* ``write_after_start``: that controller's first snapshot, after another 1% changed.

Runs against whatever ``kraft`` is on ``PYTHONPATH`` (so the same file measures two branches).
``python -m bench.snapshot_bench`` prints a table and, as the last line, a JSON document.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import resource
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.common import logger, synthetic_brokers

log = logger("snapshot bench")


def build_image(partitions: int, brokers: int) -> Any:
    """The scale image (topics of 100 partitions), built through ``image_from_records``."""
    from kraft.metadata.replay import image_from_records
    from kraft.records import FeatureLevelRecord, PartitionRecord, TopicRecord

    records: list[Any] = [FeatureLevelRecord("metadata.version", 1)]
    records += synthetic_brokers(brokers)
    topics = max(1, partitions // 100)
    for t in range(topics):
        tid = str(uuid.UUID(int=t + 1))
        records.append(TopicRecord(f"topic-{t:05d}", tid))
        for p in range(100):
            first = (t * 100 + p) % brokers
            reps = tuple(1 + (first + k) % brokers for k in range(3))
            records.append(PartitionRecord(p, tid, reps, reps, (), (), reps[0], 0, 0, 0))
    return image_from_records(
        records, offset=len(records) - 1, term=1, raft_index=1, timestamp_ms=1
    )


def change_some(image: Any, count: int, seed: int = 7) -> tuple[Any, int]:
    """``image`` after ``count`` ISR shrinks at random partitions; (image, topics touched)."""
    from kraft.metadata.delta import MetadataDelta
    from kraft.records import LEADER_UNCHANGED, RECOVERY_UNCHANGED, PartitionChangeRecord

    rng = random.Random(seed)
    topic_ids = sorted(image.topics_by_id)
    delta = MetadataDelta(image)
    touched = set()
    for _ in range(count):
        tid = rng.choice(topic_ids)
        parts = image.topics_by_id[tid].partitions
        pid = rng.randrange(len(parts))
        touched.add(tid)
        isr = parts[pid].replicas[:2]
        delta.replay(
            PartitionChangeRecord(
                pid, tid, isr, LEADER_UNCHANGED, None, None, None, RECOVERY_UNCHANGED, None
            )
        )
    delta.set_provenance(
        offset=image.offset + count,
        term=image.term,
        raft_index=image.raft_index + 1,
        timestamp_ms=image.timestamp_ms + 1,
        last_hash=image.last_hash,
    )
    return delta.apply(), len(touched)


def _usage() -> tuple[float, float, float]:
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (
        time.monotonic(),
        me.ru_utime + me.ru_stime,
        kids.ru_utime + kids.ru_stime,
    )


def _timed(fn: Any) -> tuple[Any, dict[str, float]]:
    before = _usage()
    out = fn()
    after = _usage()
    return out, {
        "wall_s": round(after[0] - before[0], 3),
        "cpu_s": round(after[1] - before[1], 3),
        "child_cpu_s": round(after[2] - before[2], 3),
    }


def run(partitions: int, brokers: int, changed: float) -> dict[str, Any]:
    from kraft.heap import freeze_heap
    from kraft.log.metadata_log import MetadataLog
    from kraft.snapshotter import Snapshotter, snapshot_state

    log(f"building an image of {partitions:,} partitions")
    image = build_image(partitions, brokers)
    gc.collect()
    gc.freeze()  # as controllers keep their images (kraft/heap.py)
    work = Path(tempfile.mkdtemp(prefix="snapshot-bench-"))
    try:
        mlog = MetadataLog(work / "log", 1 << 30, "never")
        snapshotter = Snapshotter(work / "log", mlog, 1 << 40, 0, fork=True)
        first, write1 = _timed(lambda: snapshotter.write(image))
        log(f"  first write {write1}")
        count = int(partitions * changed)
        image2, touched = change_some(image, count)
        gc.collect()
        gc.freeze()
        second, write2 = _timed(lambda: snapshotter.write(image2))
        log(f"  incremental write {write2}")
        start_dir = work / "start"
        start_dir.mkdir()
        os.link(second, start_dir / second.name)
        start_log = MetadataLog(start_dir, 1 << 30, "never")
        image = image2 = None  # only the loaded image stays
        gc.unfreeze()
        gc.collect()

        restarted = Snapshotter(start_dir, start_log, 1 << 40, 0, fork=True)

        def cold_start() -> Any:
            loaded = restarted.load_image()
            freeze_heap()
            return loaded

        loaded, load = _timed(cold_start)
        log(f"  load {load}")
        image3, _ = change_some(loaded, count, seed=8)
        _, write3 = _timed(lambda: restarted.write(image3))
        log(f"  write after the start {write3}")
        image3 = None
        image2 = snapshot_state(second)[0]
        if loaded != image2:
            raise RuntimeError("the loaded image differs from the one written")
        return {
            "partitions": partitions,
            "brokers": brokers,
            "changed_partitions": count,
            "changed_topics": touched,
            "first_bytes": first.stat().st_size,
            "second_bytes": second.stat().st_size,
            "write_first": write1,
            "write_incremental": write2,
            "load": load,
            "write_after_start": write3,
            "loadavg": [round(x, 2) for x in os.getloadavg()],
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)


def table(row: dict[str, Any]) -> str:
    lines = [
        f"{row['partitions']:,} partitions, {row['changed_partitions']:,} changed in "
        f"{row['changed_topics']:,} topics; snapshot {row['second_bytes'] / 1e6:.1f} MB; "
        f"load average {row['loadavg']}",
        "| step | wall s | CPU s (this process) | CPU s (writer child) |",
        "| --- | --- | --- | --- |",
    ]
    for step in ("write_first", "write_incremental", "load", "write_after_start"):
        m = row[step]
        lines.append(f"| {step} | {m['wall_s']} | {m['cpu_s']} | {m['child_cpu_s']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--partitions", type=int, default=2_000_000)
    ap.add_argument("--brokers", type=int, default=63)
    ap.add_argument("--changed", type=float, default=0.01, help="fraction of partitions changed")
    a = ap.parse_args(argv)
    row = run(a.partitions, a.brokers, a.changed)
    print(table(row))
    print(json.dumps({"system": "pykraft", "bench": "snapshot", **row}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
