"""Hot paths of a big metadata image (issue 8), measured in CPU seconds of this process.

Stages, on an image of ``topics`` x ``partitions`` partitions (RF 3 over ``brokers`` brokers):

* ``checksum`` — ``MetadataImage.checksum()`` of a freshly loaded image, then of an image one batch of
  100 partition changes after one whose checksum is known (``checksum_after_100_changes``).
* ``snapshot_write`` — ``kraft.snapshotter.image_to_snapshot`` (checksum of a never-checksummed
  image included).
* ``snapshot_read`` — ``read_snapshot`` (strict) with every record materialised.
* ``snapshot_load`` — ``image_from_records(read_snapshot(...))``: what a controller cold start does.
* ``broker_load`` — ``broker.metadata.checkpoint.image_from_snapshot``: load + checksum verification.
* ``broker_full_publish`` — ``MetadataDelta.full(image).apply()``, what a broker
  does with a loaded snapshot before publishing it.
* ``delta_replay`` — ``decode_batch`` + ``MetadataDelta.replay_batch`` + ``apply`` of
  ``log_batches`` batches of 100 partition changes (hash of the bytes passed, as brokers do);
  ``cold_start_log_replay`` the same batches through ``kraft.metadata.replay.replay`` into one
  delta, no hash passed (as a controller replays its log at start);
  ``broker_log_replay``: the same batches through the broker loader's ``replay_encoded`` into
  one delta, applied once (how a broker replays a backlog).

CPU time (``time.process_time``) rather than wall time, so results hold on a loaded machine.
``--before-json FILE`` adds a before/after comparison (run once on the old code with
``--out FILE``). ``python -m bench.hotpaths_bench`` prints a markdown table and a JSON line.
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import logger, synthetic_brokers

log = logger("hotpaths bench")


def _cpu(fn: Callable[[], Any]) -> tuple[Any, float]:
    gc.collect()
    t = time.process_time()
    out = fn()
    return out, time.process_time() - t


def build_image(topics: int, partitions: int, brokers: int) -> Any:
    """The scale image, built through ``image_from_records`` (not measured)."""
    from kraft.metadata.replay import image_from_records
    from kraft.records import FeatureLevelRecord, PartitionRecord, TopicRecord

    records: list[Any] = [FeatureLevelRecord("metadata.version", 1)]
    records += synthetic_brokers(brokers)
    for t in range(topics):
        tid = str(uuid.UUID(int=t + 1))
        records.append(TopicRecord(f"topic-{t:05d}", tid))
        for p in range(partitions):
            first = (t * partitions + p) % brokers
            reps = tuple(1 + (first + k) % brokers for k in range(3))
            records.append(PartitionRecord(p, tid, reps, reps, (), (), reps[0], 0, 0, 0))
    return image_from_records(
        records,
        offset=len(records) - 1,
        term=1,
        raft_index=1,
        timestamp_ms=1,
        last_hash=b"\x00" * 32,
    )


def change_batches(
    image: Any, count: int, per_batch: int = 100, topic_ids: list[Any] | None = None
) -> list[bytes]:
    """``count`` encoded batches of ISR changes continuing ``image`` (hash chain included), over
    ``topic_ids`` (default: every topic of the image) round-robin."""
    from kraft.records import (
        LEADER_UNCHANGED,
        RECOVERY_UNCHANGED,
        Batch,
        PartitionChangeRecord,
        Provenance,
        batch_hash,
    )

    topics = topic_ids if topic_ids is not None else sorted(image.topics_by_id)
    offset, prev, out = image.offset + 1, image.last_hash, []
    for i in range(count):
        changes = []
        for k in range(per_batch):
            tid = topics[(i * per_batch + k) % len(topics)]
            parts = image.topics_by_id[tid].partitions
            pid = (i * 7 + k) % len(parts)
            reps = parts[pid].replicas
            isr = reps[:2] if i % 2 == 0 else reps
            changes.append(
                PartitionChangeRecord(
                    pid, tid, isr, LEADER_UNCHANGED, None, None, None, RECOVERY_UNCHANGED, None
                )
            )
        batch = Batch(
            offset,
            1,
            2 + i,
            2 + i,
            Provenance("bench", "bench", "", "AlterPartition", "bench"),
            prev,
            tuple(changes),
        )
        enc = batch.encode()
        out.append(enc)
        prev = batch_hash(enc)
        offset += per_batch
    return out


def replay_one_delta_per_batch(image: Any, encoded: list[bytes]) -> Any:
    """A broker following the log: decode, hash check, replay and apply, one delta per batch."""
    from kraft.metadata.delta import MetadataDelta
    from kraft.records import batch_hash, decode_batch

    for enc in encoded:
        delta = MetadataDelta(image)
        delta.replay_batch(decode_batch(enc), batch_hash(enc))
        image = delta.apply()
    return image


def run(topics: int, partitions: int, brokers: int, log_batches: int) -> dict[str, Any]:
    from broker.metadata.checkpoint import image_from_snapshot
    from broker.metadata.metadata_loader import replay_encoded
    from kraft.log.snapshot import read_snapshot
    from kraft.metadata.delta import MetadataDelta
    from kraft.metadata.replay import image_from_records
    from kraft.metadata.replay import replay as replay_log
    from kraft.records import decode_batch
    from kraft.snapshotter import image_to_snapshot

    log(f"building an image of {topics} x {partitions} partitions")
    image = build_image(topics, partitions, brokers)
    n_records = image.record_count()
    rows: dict[str, dict[str, Any]] = {}

    def row(name: str, seconds: float, records: int) -> None:
        rows[name] = {
            "cpu_s": round(seconds, 3),
            "records": records,
            "records_s": round(records / seconds) if seconds > 0 else None,
        }
        log(f"{name}: {rows[name]}")

    work = Path(tempfile.mkdtemp(prefix="kraft-hotpaths-"))
    try:
        # the controller's snapshot write, checksum of a never-checksummed image included
        path, s = _cpu(lambda: image_to_snapshot(work, image))
        row("snapshot_write", s, n_records)
        _, s = _cpu(lambda: sum(1 for _ in read_snapshot(path)[1]))
        row("snapshot_read", s, n_records)

        def load() -> Any:
            h, records = read_snapshot(path)
            return image_from_records(
                records,
                offset=h.end_offset - 1,
                term=h.term,
                raft_index=h.raft_index,
                timestamp_ms=h.timestamp_ms,
                last_hash=h.last_hash,
            )

        loaded, s = _cpu(load)
        row("snapshot_load", s, n_records)
        assert loaded == image, "loaded image differs"
        checksum, s = _cpu(loaded.checksum)  # fresh objects: nothing cached
        row("checksum", s, n_records)
        assert checksum == image.checksum()
        del loaded
        loaded, s = _cpu(lambda: image_from_snapshot(path))
        row("broker_load", s, n_records)
        _, s = _cpu(lambda: MetadataDelta.full(loaded).apply())  # noqa: F821 -- bound just above; del follows
        row("broker_full_publish", s, n_records)
        del loaded
    finally:
        shutil.rmtree(work, ignore_errors=True)

    encoded = change_batches(image, log_batches)

    after, s = _cpu(lambda: replay_one_delta_per_batch(image, encoded))
    row("delta_replay", s, 100 * log_batches)

    def broker_replay() -> Any:  # as the broker's loader: a backlog into one delta, one publish
        delta = MetadataDelta(image)
        replay_encoded(delta, encoded)
        return delta.apply()

    _, s = _cpu(broker_replay)
    row("broker_log_replay", s, 100 * log_batches)

    def cold_start_replay() -> Any:  # as a controller replays its log at start: one delta
        return replay_log(image, (decode_batch(enc) for enc in encoded))

    _, s = _cpu(cold_start_replay)
    row("cold_start_log_replay", s, 100 * log_batches)
    after.checksum()
    delta = MetadataDelta(after)
    delta.replay_batch(decode_batch(change_batches(after, 1)[0]))
    changed = delta.apply()
    _, s = _cpu(changed.checksum)
    row("checksum_after_100_changes", s, n_records)
    return {
        "partitions": image.partition_count(),
        "records": n_records,
        "stages": rows,
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
    }


def table(result: dict[str, Any], before: dict[str, Any] | None) -> str:
    lines = [
        f"{result['partitions']:,} partitions, {result['records']:,} records, peak RSS "
        f"{result['peak_rss_mib']} MiB",
        "",
        "| stage | before CPU s | after CPU s | speed-up | after records/s |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, r in result["stages"].items():
        b = (before or {}).get("stages", {}).get(name)
        speedup = f"{b['cpu_s'] / r['cpu_s']:.1f}x" if b and r["cpu_s"] else "-"
        lines.append(
            f"| {name} | {b['cpu_s'] if b else '-'} | {r['cpu_s']} | {speedup} | "
            f"{r['records_s']:,} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--topics", type=int, default=10_000)
    ap.add_argument("--partitions", type=int, default=100)
    ap.add_argument("--brokers", type=int, default=30)
    ap.add_argument("--log-batches", type=int, default=1000, help="100-record batches replayed")
    ap.add_argument("--out", type=Path, help="also write the JSON result here")
    ap.add_argument("--before-json", type=Path, help="a result of an earlier run to compare with")
    a = ap.parse_args(argv)
    result = run(a.topics, a.partitions, a.brokers, a.log_batches)
    before = json.loads(a.before_json.read_text()) if a.before_json else None
    print(table(result, before))
    doc = {"system": "pykraft", "bench": "hotpaths", **result}
    if before:
        doc["before"] = before["stages"]
    print(json.dumps(doc))
    if a.out:
        a.out.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
