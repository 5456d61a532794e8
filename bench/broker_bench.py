"""Broker benchmarks (issue 3): metadata propagation latency and broker replay of a 1M-partition
snapshot + log.

1. **Propagation** — a real cluster (3 controllers, 3 brokers). A writer commits config changes
   at ~``rate`` records/s (``batch`` records per request). Each broker records when it
   publishes each metadata image (its admin endpoint's ``DescribePublishes``); for each
   committed batch, latency = the moment the last broker published an image at or past the
   batch's last offset, minus the batch's timestamp (set by the active controller when it
   proposed the command, so the Raft commit is included). No polling: the resolution is the
   clock's.
2. **Replay** — a snapshot of ``topics`` × ``partitions`` partitions (RF 3 over ``brokers``
   brokers) plus ``log_batches`` batches of partition changes, loaded in a fresh process by the
   broker's own code (``broker.metadata.checkpoint.image_from_snapshot`` verifying CRCs and checksums, then
   the loader's ``replay_encoded`` of the log in 8 MiB FetchMetadata-sized groups into the full
   delta, published once): records/s, seconds (wall and CPU) and peak RSS.

``run(...) -> (rows, targets)``; ``python -m bench.broker_bench`` prints a markdown table and a
JSON line. Progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import trio

from bench.common import (
    ENV,
    REPO,
    cluster_down,
    cluster_up,
    controller_addresses,
    kraft,
    logger,
    synthetic_brokers,
)

log = logger("broker bench")


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(1000 * seconds, 2)


def pct(values: list[float], p: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(round(p / 100 * len(s) + 0.5)) - 1))]


# ---- 1. propagation --------------------------------------------------------------------------


def _publishes(broker: dict[str, Any]) -> list[tuple[int, float]]:
    """(image offset, unix s) of the broker's latest metadata publishes (its admin endpoint's
    DescribePublishes: recorded by the broker as it publishes, so no polling error)."""
    from broker.state import describe

    answer = describe(broker["host"], broker["admin_port"], timeout=10.0, api="DescribePublishes")
    return [(int(offset), float(t)) for offset, t in answer["publishes"]]


def _first_reached(publishes: list[tuple[int, float]], offset: int) -> float | None:
    """When a broker first published an image at or past ``offset``."""
    return next((t for applied, t in publishes if applied >= offset), None)


async def _offer(
    boot: list[tuple[str, int]], topics: list[str], requests: int, seconds: float
) -> tuple[int, int]:
    """``requests`` IncrementalAlterConfigs per second for ``seconds``, each sent on schedule
    over one connection whether or not the previous one was answered (at most 64 in flight),
    so the offered rate holds; returns (sent, failed)."""
    from kraft.rpc.client import ControllerClient

    client = ControllerClient(boot, client_id="propagation")
    failed = 0
    slots = trio.Semaphore(64)

    async def one(n: int) -> None:
        nonlocal failed
        body = {
            "resources": [
                {
                    "resource_type": "topic",
                    "resource_name": t,
                    "ops": [{"name": "retention.ms", "op": "SET", "value": str(1000 + n)}],
                }
                for t in topics
            ]
        }
        try:
            await client.call("IncrementalAlterConfigs", body, timeout=10)
        except Exception:
            failed += 1
        finally:
            slots.release()

    sent = 0
    try:
        async with trio.open_nursery() as nursery:
            start = trio.current_time()
            while trio.current_time() - start < seconds:
                await slots.acquire()
                nursery.start_soon(one, sent)
                sent += 1
                await trio.sleep_until(start + sent / requests)
    finally:
        await client.aclose()
    return sent, failed


def _wait_followed(boot: list[tuple[str, int]], brokers: list[dict[str, Any]]) -> None:
    """Wait until every broker has published the log up to the active controller's high
    watermark as of now: the run measures steady propagation, not brokers still finding the
    leader after the controllers' restart (the broker's retry pace bounds that: see
    ``controller.quorum.retry.backoff.max.ms``)."""
    from kraft.rpc.client import call_sync

    hw = int(call_sync(boot, "DescribeQuorum", {}, timeout=10)["high_watermark"])
    deadline = time.monotonic() + 30
    while not all((_publishes(b) or [(-1, 0.0)])[-1][0] >= hw - 1 for b in brokers):
        if time.monotonic() > deadline:
            raise RuntimeError(f"brokers did not reach metadata offset {hw - 1} within 30 s")
        time.sleep(0.05)


def set_linger(
    cdir: Path, meta: dict[str, Any], linger_ms: int | None, per_broker_ms: float | None
) -> None:
    """Restart each controller in turn with ``metadata.fetch.linger.ms`` and
    ``metadata.fetch.linger.per.broker.ms`` set where given (a TERM, then ``kraft cluster
    start`` with its amended properties file); nothing when neither is."""
    settings = {
        k: v
        for k, v in (
            ("metadata.fetch.linger.ms", linger_ms),
            ("metadata.fetch.linger.per.broker.ms", per_broker_ms),
        )
        if v is not None
    }
    if not settings:
        return
    for c in meta["controllers"]:
        with open(c["config"], "a", encoding="utf-8") as f:
            f.write("\n" + "".join(f"{k}={v}\n" for k, v in settings.items()))
        kraft("cluster", "kill", "--dir", str(cdir), "--node", str(c["id"]), "--signal", "TERM")
        kraft("cluster", "start", "--dir", str(cdir), "--node", str(c["id"]))


def propagation(
    seconds: float,
    rate: int,
    batch: int,
    linger_ms: int | None = None,
    per_broker_ms: float | None = None,
) -> dict[str, Any]:
    from kraft.log.metadata_log import MetadataLog
    from kraft.rpc.client import call_sync

    work = Path(tempfile.mkdtemp(prefix="kraft-bench-prop-"))
    cdir = work / "c"
    try:
        log("starting 3 controllers + 3 brokers")
        meta = cluster_up(cdir)
        set_linger(cdir, meta, linger_ms, per_broker_ms)
        boot = controller_addresses(meta)
        topics = [f"prop-{i}" for i in range(batch)]
        r = call_sync(
            boot,
            "CreateTopics",
            {"topics": [{"name": t, "num_partitions": 1, "replication_factor": 3} for t in topics]},
            timeout=30,
        )
        assert not any(t["error_code"] for t in r["topics"]), r
        _wait_followed(boot, meta["brokers"])
        requests = max(1, rate // batch)
        log(f"writing {rate} records/s ({requests} requests/s x {batch}) for {seconds:.0f} s")
        started = time.time()
        sent, errors = trio.run(_offer, boot, topics, requests, seconds)
        ended = time.time()
        time.sleep(1.0)  # let the last batches reach every broker
        publishes = {b["id"]: _publishes(b) for b in meta["brokers"]}
        leader = call_sync(boot, "DescribeQuorum", {}, timeout=10)["leader_id"]
        log_dir = (
            Path(next(c for c in meta["controllers"] if c["id"] == leader)["metadata_dir"]) / "log"
        )
        latencies = []
        missed = 0
        with MetadataLog.open(log_dir, fsync="never") as mlog:
            for b in mlog.read_batches(0):
                if b.provenance.api != "IncrementalAlterConfigs" or b.timestamp_ms / 1000 < started:
                    continue
                reached = [
                    _first_reached(publishes[x["id"]], b.last_offset) for x in meta["brokers"]
                ]
                times = [t for t in reached if t is not None]
                if len(times) < len(reached):
                    missed += 1
                    continue
                latencies.append(max(times) - b.timestamp_ms / 1000)
        row = {
            "metric": "propagation",
            "linger_ms": linger_ms,
            "linger_per_broker_ms": per_broker_ms,
            "offered_records_s": rate,
            "records_s": round(sent * batch / (ended - started), 1),
            "batches": len(latencies),
            "missed": missed,
            "errors": errors,
            "p50_ms": _ms(pct(latencies, 50)),
            "p99_ms": _ms(pct(latencies, 99)),
            "max_ms": round(1000 * max(latencies), 2) if latencies else None,
        }
        log(f"propagation: {row}")
        return row
    finally:
        cluster_down(cdir)
        shutil.rmtree(work, ignore_errors=True)


# ---- 2. replay ------------------------------------------------------------------------------


def build_scale_snapshot(
    directory: Path,
    topics: int,
    partitions: int,
    brokers: int,
    log_batches: int,
    changes_per_batch: int = 100,
) -> tuple[Path, Path, int]:
    """Write a snapshot of ``topics`` x ``partitions`` (RF 3) and a log of partition-change
    batches after it; returns (snapshot path, log dir, records in the log)."""
    from kraft.log.metadata_log import MetadataLog
    from kraft.metadata.replay import image_from_records
    from kraft.records import (
        LEADER_UNCHANGED,
        RECOVERY_UNCHANGED,
        Batch,
        FeatureLevelRecord,
        PartitionChangeRecord,
        PartitionRecord,
        Provenance,
        Record,
        TopicRecord,
        batch_hash,
    )
    from kraft.snapshotter import image_to_snapshot

    records: list[Record] = [FeatureLevelRecord("metadata.version", 1)]
    records += synthetic_brokers(brokers)
    topic_ids = []
    for t in range(topics):
        tid = str(uuid.UUID(int=t + 1))
        topic_ids.append(tid)
        records.append(TopicRecord(f"topic-{t:05d}", tid))
        for p in range(partitions):
            first = (t * partitions + p) % brokers
            reps = tuple(1 + (first + k) % brokers for k in range(3))
            records.append(PartitionRecord(p, tid, reps, reps, (), (), reps[0], 0, 0, 0))
    image = image_from_records(
        records,
        offset=len(records) - 1,
        term=1,
        raft_index=1,
        timestamp_ms=1,
        last_hash=b"\x00" * 32,
    )
    snap = image_to_snapshot(directory, image)
    log_dir = directory / "log"
    mlog = MetadataLog.open(log_dir, fsync="never")
    mlog.reset(
        image.offset + 1, image.last_hash, last_term=1, last_raft_index=1, last_timestamp_ms=1
    )
    offset, prev = image.offset + 1, image.last_hash
    n = 0
    for i in range(log_batches):
        changes = []
        for k in range(changes_per_batch):
            t = (i * changes_per_batch + k) % topics
            p = (i * 7 + k) % partitions
            first = (t * partitions + p) % brokers
            reps = tuple(1 + (first + j) % brokers for j in range(3))
            isr = reps if (i // topics) % 2 else reps[:2]  # shrink, later expand again
            changes.append(
                PartitionChangeRecord(
                    p,
                    topic_ids[t],
                    isr,
                    LEADER_UNCHANGED,
                    None,
                    None,
                    None,
                    RECOVERY_UNCHANGED,
                    None,
                )
            )
        batch = Batch(
            base_offset=offset,
            term=1,
            raft_index=2 + i,
            timestamp_ms=2 + i,
            provenance=Provenance("bench", "bench", "", "AlterPartition", "bench"),
            prev_hash=prev,
            records=tuple(changes),
            raft_position=0,
        )
        enc = batch.encode()
        mlog.append_encoded(enc, batch)
        prev = batch_hash(enc)
        offset += len(changes)
        n += len(changes)
    mlog.close()
    return snap, log_dir, n


_REPLAY_CHILD = r"""
import json, resource, sys, time
from pathlib import Path
from broker.metadata.checkpoint import image_from_snapshot
from broker.metadata.metadata_loader import replay_encoded
from kraft.metadata.delta import MetadataDelta
from kraft.log.metadata_log import MetadataLog
from kraft.records import decode_batch
snap, log_dir = Path(sys.argv[1]), Path(sys.argv[2])
# The log as FetchMetadata responses of up to 8 MiB of encoded batches (the controller's side:
# read before the clock starts).
responses = []
with MetadataLog.open(log_dir, fsync="never") as mlog:
    offset = mlog.start_offset
    while offset < mlog.next_offset:
        responses.append(mlog.read_encoded(offset, 8 << 20))
        offset = decode_batch(responses[-1][-1], check_records=False).next_offset
t0, c0 = time.perf_counter(), time.process_time()
image = image_from_snapshot(snap)
t1, c1 = time.perf_counter(), time.process_time()
# What the broker's MetadataLoader does after loading a snapshot: replay the responses into the
# full delta until caught up, then one publish.
delta = MetadataDelta.full(image)
for batches in responses:
    replay_encoded(delta, batches)
n = delta.offset - image.offset
image = delta.apply()
t2, c2 = time.perf_counter(), time.process_time()
print(json.dumps({"snapshot_s": t1 - t0, "log_s": t2 - t1, "snapshot_cpu_s": c1 - c0,
                  "log_cpu_s": c2 - c1, "log_records": n, "partitions": image.partition_count(),
                  "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def replay(topics: int, partitions: int, brokers: int, log_batches: int) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="kraft-bench-replay-"))
    try:
        log(
            f"building a snapshot of {topics} x {partitions} partitions + {log_batches} log batches"
        )
        t = time.perf_counter()
        snap, log_dir, log_records = build_scale_snapshot(
            work, topics, partitions, brokers, log_batches
        )
        log(
            f"built in {time.perf_counter() - t:.1f}s ({snap.stat().st_size / 1e6:.0f} MB snapshot)"
        )
        proc = subprocess.run(
            [sys.executable, "-c", _REPLAY_CHILD, str(snap), str(log_dir)],
            cwd=REPO,
            env=ENV,
            capture_output=True,
            text=True,
            timeout=900,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"replay child failed: {proc.stderr[-2000:]}")
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        snapshot_records = 1 + brokers + topics * (1 + partitions)
        total_s = out["snapshot_s"] + out["log_s"]
        row = {
            "metric": "broker_replay",
            "partitions": out["partitions"],
            "snapshot_records": snapshot_records,
            "log_records": out["log_records"],
            "snapshot_s": round(out["snapshot_s"], 2),
            "log_s": round(out["log_s"], 2),
            "seconds": round(total_s, 2),
            "cpu_s": round(out["snapshot_cpu_s"] + out["log_cpu_s"], 2),
            "snapshot_cpu_s": round(out["snapshot_cpu_s"], 2),
            "log_cpu_s": round(out["log_cpu_s"], 2),
            "records_s": round((snapshot_records + out["log_records"]) / total_s),
            "records_per_cpu_s": round(
                (snapshot_records + out["log_records"]) / (out["snapshot_cpu_s"] + out["log_cpu_s"])
            ),
            "snapshot_records_s": round(snapshot_records / out["snapshot_s"]),
            "log_records_s": round(out["log_records"] / out["log_s"]) if out["log_s"] else None,
            "peak_rss_mib": round(out["peak_rss_mib"]),
        }
        log(f"replay: {row}")
        return row
    finally:
        shutil.rmtree(work, ignore_errors=True)


# issue 24 item 3: commit -> applied on every broker, p99 (ms) by offered records/s
PROPAGATION_P99_MS = {1000: 20, 10_000: 50}


def targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for prop in (r for r in rows if r["metric"] == "propagation"):
        limit = PROPAGATION_P99_MS.get(prop.get("offered_records_s", 1000))
        if limit is None or prop["p99_ms"] is None:
            continue
        out.append(
            {
                "target": f"propagation p99 <= {limit} ms at {prop['offered_records_s']:,} "
                "records/s",
                "value": prop["p99_ms"],
                "limit": limit,
                "ratio": round(prop["p99_ms"] / limit, 3),
                "met": prop["p99_ms"] <= limit,
            }
        )
    rep = next((r for r in rows if r["metric"] == "broker_replay"), None)
    if rep:
        out.append(
            {
                "target": "broker replay >= 200,000 records/s",
                "value": rep["records_s"],
                "limit": 200_000,
                "ratio": round(rep["records_s"] / 200_000, 3),
                "met": rep["records_s"] >= 200_000,
            }
        )
        out.append(
            {
                "target": "1M-partition image <= 2 GiB RSS on a broker",
                "value": rep["peak_rss_mib"],
                "limit": 2048,
                "ratio": round(rep["peak_rss_mib"] / 2048, 3),
                "met": rep["peak_rss_mib"] <= 2048,
            }
        )
    return out


def run(
    seconds: float = 10.0,
    rate: int = 1000,
    batch: int = 10,
    topics: int = 10_000,
    partitions: int = 100,
    brokers: int = 30,
    log_batches: int = 1000,
    high_rate: int = 10_000,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Propagation at ``rate`` and at ``high_rate`` records/s (requests of ``batch`` and of
    ``batch * high_rate / rate`` records, the same requests/s), then the broker replay."""
    rows = [
        propagation(seconds, rate, batch),
        propagation(seconds, high_rate, max(1, batch * high_rate // rate)),
        replay(topics, partitions, brokers, log_batches),
    ]
    return rows, targets(rows)


def table(rows: list[dict[str, Any]], tg: list[dict[str, Any]]) -> str:
    lines = ["| metric | figures |", "| --- | --- |"]
    for r in rows:
        lines.append(
            f"| {r['metric']} | "
            + ", ".join(f"{k}={v}" for k, v in r.items() if k != "metric")
            + " |"
        )
    lines += ["", "| target | value | limit | ratio | met |", "| --- | --- | --- | --- | --- |"]
    lines += [
        f"| {t['target']} | {t['value']} | {t['limit']} | {t['ratio']} | {t['met']} |" for t in tg
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seconds", type=float, default=10.0, help="propagation run length")
    ap.add_argument("--rate", type=int, default=1000, help="records/s written")
    ap.add_argument("--batch", type=int, default=10, help="records per request")
    ap.add_argument(
        "--high-rate",
        type=int,
        default=10_000,
        help="records/s of the second propagation run (same requests/s, bigger requests)",
    )
    ap.add_argument("--topics", type=int, default=10_000)
    ap.add_argument("--partitions", type=int, default=100)
    ap.add_argument("--brokers", type=int, default=30)
    ap.add_argument(
        "--log-batches", type=int, default=1000, help="100-record batches after the snapshot"
    )
    ap.add_argument(
        "--propagation-only",
        metavar="LINGER_MS,...",
        help="only the propagation run, once per metadata.fetch.linger.ms value given (each "
        "in a fresh cluster, in this order); prints one JSON row per value",
    )
    ap.add_argument(
        "--linger-per-broker-ms",
        type=float,
        default=None,
        help="with --propagation-only: the controllers' metadata.fetch.linger.per.broker.ms",
    )
    a = ap.parse_args(argv)
    if a.propagation_only:
        for linger in (int(v) for v in a.propagation_only.split(",")):
            row = propagation(a.seconds, a.rate, a.batch, linger, a.linger_per_broker_ms)
            print(json.dumps(row), flush=True)
        return 0
    rows, tg = run(
        a.seconds, a.rate, a.batch, a.topics, a.partitions, a.brokers, a.log_batches, a.high_rate
    )
    print(table(rows, tg))
    print(json.dumps({"system": "pykraft", "bench": "broker", "results": rows, "targets": tg}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
