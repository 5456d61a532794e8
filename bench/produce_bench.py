"""Data-plane benchmark: a real cluster (3 controllers, 3 brokers), confluent-kafka as the load
generator, 1 KB messages to a 3-partition RF-3 topic.

Measures (progress on stderr):
  1. produce throughput (MB/s, msgs/s) with acks=1 and with acks=all — batched (linger.ms 5),
     from the first produce() to the last delivery report; the same with kcat (no Python in the
     client, so closer to what the brokers can take);
  2. consume throughput of what was produced (assign mode, from the beginning);
  3. end-to-end latency (produce with acks=all → consumer receives), one message at a time at
     a modest rate, p50/p99;
  4. idempotent produce (``enable.idempotence=true``, acks=all) in the same run as the plain
     acks=all produce, to show what the producer-state checks cost;
  5. producer-state rebuild when a partition log with many idempotent batches is opened: from
     the snapshot written on close, and without one (after a kill -9 before any segment roll:
     every batch replayed). No cluster: a log in a temporary directory.

``run(messages) -> list[dict]`` returns result rows; ``main()`` prints a markdown table and, as the
last stdout line, ``{"system": "pykraft", "results": [...]}``. Target: >= 20 MB/s acks=all RF 3.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import kraft, logger

MSG_BYTES = 1024
TARGET_MB_S = 20.0


log = logger()


def _round2(v: float | None) -> float | None:
    return None if v is None else round(v, 2)


def pct(sorted_vals: list[float], p: float) -> float | None:
    if not sorted_vals:
        return None
    return sorted_vals[
        min(len(sorted_vals) - 1, max(0, int(round(p / 100 * len(sorted_vals))) - 1))
    ]


def produce(
    bs: str, topic: str, acks: str, messages: int, idempotent: bool = False
) -> dict[str, Any]:
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": bs,
            "acks": acks,
            "linger.ms": 5,
            "batch.size": 1 << 20,
            "queue.buffering.max.kbytes": 1 << 20,
            "message.timeout.ms": 120000,
            "enable.idempotence": idempotent,
        }
    )
    payload = b"x" * MSG_BYTES
    done = {"ok": 0, "err": 0}

    def on_delivery(err: Any, msg: Any) -> None:
        done["err" if err else "ok"] += 1

    start = time.perf_counter()
    for i in range(messages):
        while True:
            try:
                producer.produce(topic, payload, partition=i % 3, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.01)
        if i % 1000 == 0:
            producer.poll(0)
    producer.flush(180)
    secs = time.perf_counter() - start
    return {
        "metric": "produce",
        "mode": f"acks={acks}" + (" idempotent" if idempotent else ""),
        "messages": messages,
        "errors": done["err"],
        "seconds": round(secs, 2),
        "msgs_s": round(done["ok"] / secs),
        "mb_s": round(done["ok"] * MSG_BYTES / secs / 1e6, 1),
    }


def produce_kcat(bs: str, topic: str, acks: str, messages: int, workdir: Path) -> dict[str, Any]:
    """The same load from kcat (C, no Python in the client): the broker's side of the cost."""
    data = workdir / "messages.txt"
    data.write_bytes((b"k" * (MSG_BYTES - 1) + b"\n") * messages)
    start = time.perf_counter()
    proc = subprocess.run(
        [
            "kcat",
            "-P",
            "-b",
            bs,
            "-t",
            topic,
            "-X",
            f"acks={acks}",
            "-X",
            "linger.ms=5",
            "-X",
            "batch.size=1000000",
            "-l",
            str(data),
        ],
        capture_output=True,
        timeout=300,
    )
    secs = time.perf_counter() - start
    ok = messages if proc.returncode == 0 else 0
    return {
        "metric": "produce",
        "mode": f"acks={acks} (kcat)",
        "messages": messages,
        "errors": messages - ok,
        "seconds": round(secs, 2),
        "msgs_s": round(ok / secs),
        "mb_s": round(ok * MSG_BYTES / secs / 1e6, 1),
    }


def consume(bs: str, topic: str, messages: int) -> dict[str, Any]:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bs,
            "group.id": "bench",
            "enable.auto.commit": False,
            "fetch.max.bytes": 50 << 20,
            "max.partition.fetch.bytes": 8 << 20,
        }
    )
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(3)])
    got, size = 0, 0
    start = time.perf_counter()
    deadline = start + 180
    while got < messages and time.perf_counter() < deadline:
        for m in consumer.consume(10000, timeout=0.5):
            value = m.value()
            if m.error() is None and value is not None:
                got += 1
                size += len(value)
    secs = time.perf_counter() - start
    consumer.close()
    return {
        "metric": "consume",
        "mode": "from beginning",
        "messages": got,
        "errors": messages - got,
        "seconds": round(secs, 2),
        "msgs_s": round(got / secs),
        "mb_s": round(size / secs / 1e6, 1),
    }


def latency(bs: str, topic: str, count: int) -> dict[str, Any]:
    from confluent_kafka import OFFSET_END, Consumer, Producer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bs,
            "group.id": "bench-e2e",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 100,
        }
    )
    consumer.assign([TopicPartition(topic, 0, OFFSET_END)])
    lat: list[float] = []
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set() and len(lat) < count:
            m = consumer.poll(0.1)
            value = m.value() if m is not None and m.error() is None else None
            if value is not None:
                lat.append((time.perf_counter() - float(value.decode())) * 1000)

    t = threading.Thread(target=reader)
    t.start()
    time.sleep(1.0)  # let the consumer reach the end before the first message
    producer = Producer({"bootstrap.servers": bs, "acks": "all", "linger.ms": 0})
    for _ in range(count):
        producer.produce(topic, repr(time.perf_counter()).encode(), partition=0)
        producer.flush(10)
        time.sleep(0.01)
    deadline = time.monotonic() + 10
    while len(lat) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    t.join(10)
    consumer.close()
    lat.sort()
    return {
        "metric": "e2e_latency",
        "mode": "acks=all",
        "messages": len(lat),
        "errors": count - len(lat),
        "p50_ms": _round2(pct(lat, 50)),
        "p99_ms": _round2(pct(lat, 99)),
    }


def run(messages: int) -> list[dict[str, Any]]:
    """Start a cluster in a temporary directory, measure, tear it down."""
    workdir = Path(tempfile.mkdtemp(prefix="produce-bench-"))
    cdir = workdir / "cluster"
    rows: list[dict[str, Any]] = []
    try:
        log("starting 3 controllers + 3 brokers")
        kraft(
            "cluster",
            "up",
            "--no-auth",  # benchmarks run anonymous clients and sim brokers
            "--dir",
            str(cdir),
            "--controllers",
            "3",
            "--brokers",
            "3",
            "--detach",
            "--fsync",
            "never",
        )
        meta = json.loads((cdir / "cluster.json").read_text())
        bs = ",".join(f"{b['host']}:{b['port']}" for b in meta["brokers"])
        for acks in ("1", "all"):
            topic = f"bench-acks-{acks}"
            kraft(
                "topics",
                "create",
                topic,
                "--partitions",
                "3",
                "--replication-factor",
                "3",
                "--cluster",
                str(cdir),
            )
            time.sleep(1.0)  # brokers take their roles
            log(f"produce {messages} x {MSG_BYTES} B, acks={acks}")
            rows.append(produce(bs, topic, acks, messages))
            log(f"  {rows[-1]}")
            if acks == "all":
                kraft(
                    "topics",
                    "create",
                    "bench-idempotent",
                    "--partitions",
                    "3",
                    "--replication-factor",
                    "3",
                    "--cluster",
                    str(cdir),
                )
                time.sleep(1.0)
                log(f"produce {messages} x {MSG_BYTES} B, acks=all, idempotent")
                rows.append(produce(bs, "bench-idempotent", acks, messages, idempotent=True))
                log(f"  {rows[-1]}")
                log("consume")
                rows.append(consume(bs, topic, messages))
                log(f"  {rows[-1]}")
            if shutil.which("kcat"):
                kraft(
                    "topics",
                    "create",
                    f"{topic}-kcat",
                    "--partitions",
                    "3",
                    "--replication-factor",
                    "3",
                    "--cluster",
                    str(cdir),
                )
                time.sleep(1.0)
                log(f"produce {messages} x {MSG_BYTES} B with kcat, acks={acks}")
                rows.append(produce_kcat(bs, f"{topic}-kcat", acks, messages, workdir))
                log(f"  {rows[-1]}")
        kraft(
            "topics",
            "create",
            "bench-e2e",
            "--partitions",
            "1",
            "--replication-factor",
            "3",
            "--cluster",
            str(cdir),
        )
        time.sleep(1.0)
        log("end-to-end latency")
        rows.append(latency(bs, "bench-e2e", 300))
        log(f"  {rows[-1]}")
    finally:
        try:
            kraft("cluster", "down", "--dir", str(cdir), "--timeout", "20")
        except Exception as e:
            log(f"cluster down failed: {e}")
        shutil.rmtree(workdir, ignore_errors=True)
    return rows


def producer_state_rebuild(batches: int, producers: int = 100) -> list[dict[str, Any]]:
    """Open a partition log of ``batches`` idempotent 10-record batches from ``producers``
    producers, with and without the producer-state snapshot; time the rebuild."""
    import datetime
    import io
    import struct

    import crc32c
    from kio.records.schema import NewRecordBatch, Record
    from kio.records.writers import write_new_batch
    from kio.static.primitive import TZAwareMicros, i8, i16, i32, i64

    from broker.replica.partition_log import PartitionLog

    now = TZAwareMicros.parse(datetime.datetime.now(datetime.UTC).replace(microsecond=0))
    records = tuple(
        Record(
            attributes=i8(0), timestamp=now, offset=i64(i), key=None, value=b"x" * 100, headers=()
        )
        for i in range(10)
    )
    buf = io.BytesIO()
    write_new_batch(
        buf,
        NewRecordBatch(
            producer_id=i64(0),
            producer_epoch=i16(0),
            base_sequence=i32(0),
            records=records,
            attributes=i16(0),
        ),
    )
    template = bytearray(buf.getvalue())
    workdir = Path(tempfile.mkdtemp(prefix="producer-state-bench-"))
    rows = []
    try:
        plog = PartitionLog.open(workdir / "t-0")
        for n in range(batches):
            struct.pack_into(">qhi", template, 43, n % producers, 0, (n // producers) * 10)
            struct.pack_into(">I", template, 17, crc32c.crc32c(template[21:]))
            plog.append(bytes(template), leader_epoch=0)
        plog.close()  # writes the snapshot at the log end
        for mode in ("from the close snapshot", "no snapshot (every batch replayed)"):
            if mode.startswith("no"):
                for snap in (workdir / "t-0").glob("*.snapshot"):
                    snap.unlink()
            start = time.perf_counter()
            reopened = PartitionLog.open(workdir / "t-0")
            open_s = time.perf_counter() - start
            replayed, rebuild_s = reopened.producer_rebuild
            assert len(reopened.producers) == producers
            reopened.close()
            rows.append(
                {
                    "metric": "producer-state rebuild",
                    "mode": mode,
                    "messages": batches * 10,
                    "errors": 0,
                    "seconds": round(rebuild_s, 3),
                    "batches_replayed": replayed,
                    "log_open_s": round(open_s, 3),
                }
            )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    out = [
        "| metric | mode | messages | errors | seconds | msgs/s | MB/s | p50 ms | p99 ms |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        out.append(
            f"| {r['metric']} | {r['mode']} | {r['messages']} | {r['errors']} | {r.get('seconds', '')} | "
            f"{r.get('msgs_s', '')} | {r.get('mb_s', '')} | {r.get('p50_ms', '')} | {r.get('p99_ms', '')} |"
        )
    return "\n".join(out)


def target(rows: list[dict[str, Any]]) -> dict[str, Any]:
    row = next(
        (r for r in rows if r["metric"] == "produce" and r["mode"] == "acks=all"), None
    )  # confluent-kafka
    value = row and row["mb_s"]
    return {
        "target": f"produce acks=all RF 3, 1 KB messages >= {TARGET_MB_S} MB/s",
        "value": value,
        "limit": TARGET_MB_S,
        "ratio": round(value / TARGET_MB_S, 3) if value else None,
        "met": bool(value and value >= TARGET_MB_S),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--messages", type=int, default=100_000, help="messages per produce run (default 100000)"
    )
    ap.add_argument(
        "--rebuild-batches",
        type=int,
        default=200_000,
        help="idempotent batches in the producer-state rebuild log (default 200000)",
    )
    ap.add_argument(
        "--rebuild-only", action="store_true", help="only the producer-state rebuild (no cluster)"
    )
    args = ap.parse_args(argv)
    rows = [] if args.rebuild_only else run(args.messages)
    log(f"producer-state rebuild, {args.rebuild_batches} batches")
    rows += producer_state_rebuild(args.rebuild_batches)
    log(f"  {rows[-2:]}")
    t = target(rows)
    print("## pykraft data plane (3 brokers, RF 3, 3 partitions, 1 KB messages, confluent-kafka)\n")
    print(table(rows))
    print(f"\ntarget: {t['target']}: {t['value']} ({'met' if t['met'] else 'NOT met'})\n")
    print(json.dumps({"system": "pykraft", "results": rows, "targets": [t]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
