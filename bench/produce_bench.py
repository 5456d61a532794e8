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
     acks=all produce; ``--idempotence-rounds N`` runs only this, N interleaved rounds (ABBA) of
     warm plain and idempotent producers (confluent-kafka, plus a plain one capped at 5 in
     flight; kafka-python with ``--kafka-python-messages``), each round's ratio and load, the
     median ratio and its spread;
  5. producer-state rebuild and the whole ``PartitionLog.open`` of a partition log of
     ``--rebuild-batches`` (1M) idempotent batches, after a kill -9 (its writer SIGKILLs itself:
     no snapshot, no recovery point at the log end) and after a clean close, each open in a
     fresh process; ``--rebuild-compare TREE`` opens its own copy with another source tree's
     code in turns (e.g. ``/work/main``, before a change). No cluster.

``run(messages) -> list[dict]`` returns result rows; ``main()`` prints a markdown table and, as the
last stdout line, ``{"system": "pykraft", "results": [...]}``. Target: >= 20 MB/s acks=all RF 3.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import REPO, kraft, logger

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
    bs: str,
    topic: str,
    acks: str,
    messages: int,
    idempotent: bool = False,
    max_in_flight: int | None = None,
    warm: bool = False,
) -> dict[str, Any]:
    """confluent-kafka producing ``messages``; ``warm``: one message per partition delivered
    before the clock starts (connections, metadata and, when idempotent, the producer id: an
    idempotent librdkafka producer asks for its id before any broker is up and retries after
    500 ms, which alone is half a second of a one-second run)."""
    from confluent_kafka import Producer

    conf: dict[str, Any] = {
        "bootstrap.servers": bs,
        "acks": acks,
        "linger.ms": 5,
        "batch.size": 1 << 20,
        "queue.buffering.max.kbytes": 1 << 20,
        "message.timeout.ms": 120000,
        "enable.idempotence": idempotent,
    }
    if max_in_flight is not None:
        conf["max.in.flight.requests.per.connection"] = max_in_flight
    producer = Producer(conf)
    payload = b"x" * MSG_BYTES
    if warm:
        for p in range(3):
            producer.produce(topic, payload, partition=p)
        producer.flush(60)
    done = {"ok": 0, "err": 0}
    delivered: list[float] = []  # times of the first and the latest delivery report

    def on_delivery(err: Any, msg: Any) -> None:
        done["err" if err else "ok"] += 1
        now = time.perf_counter()
        if not delivered:
            delivered.append(now)
        delivered[1:] = [now]

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
    first = delivered[0] - start if delivered else secs
    steady = delivered[-1] - delivered[0] if len(delivered) > 1 else 0.0
    return {
        "first_delivery_s": round(first, 3),  # connections, metadata, InitProducerId
        "steady_msgs_s": round((done["ok"] - 1) / steady) if steady > 0 else None,
        "metric": "produce",
        "mode": f"acks={acks}"
        + (" idempotent" if idempotent else "")
        + (" warm" if warm else "")
        + (f" max.in.flight={max_in_flight}" if max_in_flight else ""),
        "messages": messages,
        "errors": done["err"],
        "seconds": round(secs, 2),
        "msgs_s": round(done["ok"] / secs),
        "mb_s": round(done["ok"] * MSG_BYTES / secs / 1e6, 1),
    }


def produce_kafka_python(
    bs: str, topic: str, messages: int, idempotent: bool = False
) -> dict[str, Any]:
    """acks=all from kafka-python (pure Python client), plain or ``enable_idempotence``; one
    message per partition delivered before the clock starts."""
    from kafka import KafkaProducer

    producer = KafkaProducer(
        bootstrap_servers=bs.split(","),
        acks="all",
        linger_ms=5,
        batch_size=1 << 20,
        enable_idempotence=idempotent,
        request_timeout_ms=60000,
        delivery_timeout_ms=180000,
    )
    payload = b"x" * MSG_BYTES
    for p in range(3):
        producer.send(topic, payload, partition=p)
    producer.flush(60)
    start = time.perf_counter()
    futures = [producer.send(topic, payload, partition=i % 3) for i in range(messages)]
    producer.flush(180)
    secs = time.perf_counter() - start
    errors = sum(1 for f in futures if f.failed() or not f.is_done)
    producer.close(10)
    ok = messages - errors
    return {
        "metric": "produce",
        "mode": "acks=all (kafka-python)" + (" idempotent" if idempotent else ""),
        "messages": messages,
        "errors": errors,
        "seconds": round(secs, 2),
        "msgs_s": round(ok / secs),
        "mb_s": round(ok * MSG_BYTES / secs / 1e6, 1),
    }


def idempotence_rounds(
    bs: str, cdir: Path, rounds: int, messages: int, kafka_python_messages: int
) -> list[dict[str, Any]]:
    """Plain and idempotent acks=all producers in turns against one topic, ``rounds`` rounds
    per client (the order flips every round: ABBA, so a drifting load costs both sides alike);
    one row per round with both rates, their ratio and the load average around the round.
    Every producer is warm when its clock starts (see :func:`produce`).
    confluent-kafka also runs a plain producer capped at 5 requests in flight per connection,
    librdkafka's cap in idempotent mode: if it is as slow, the gap is that cap, not the broker."""
    topic = "bench-idempotence"
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
    produce(bs, topic, "all", min(messages, 3000))  # warm-up: connections, metadata, logs
    clients: list[tuple[str, Any, int]] = [
        (
            "confluent-kafka",
            lambda idem, n: produce(bs, topic, "all", n, idem, warm=True),
            messages,
        )
    ]
    if kafka_python_messages > 0:
        clients.append(
            (
                "kafka-python",
                lambda idem, n: produce_kafka_python(bs, topic, n, idem),
                kafka_python_messages,
            )
        )
    rows = []
    for r in range(rounds):
        for client, fn, n in clients:
            load_before = os.getloadavg()[0]
            got = {}
            for idem in (False, True) if r % 2 == 0 else (True, False):
                got[idem] = fn(idem, n)
            capped = (
                produce(bs, topic, "all", n, max_in_flight=5, warm=True)
                if client == "confluent-kafka"
                else None
            )
            load_after = os.getloadavg()[0]
            plain, idem_row = got[False], got[True]
            rows.append(
                {
                    "metric": "idempotence round",
                    "mode": client,
                    "round": r,
                    "messages": n,
                    "errors": plain["errors"] + idem_row["errors"],
                    "plain_msgs_s": plain["msgs_s"],
                    "idempotent_msgs_s": idem_row["msgs_s"],
                    "ratio": round(idem_row["msgs_s"] / max(1, plain["msgs_s"]), 3),
                    "plain_in_flight_5_msgs_s": capped["msgs_s"] if capped else None,
                    "first_delivery_s": [
                        plain.get("first_delivery_s"),
                        idem_row.get("first_delivery_s"),
                    ],
                    "steady_ratio": round(idem_row["steady_msgs_s"] / plain["steady_msgs_s"], 3)
                    if plain.get("steady_msgs_s") and idem_row.get("steady_msgs_s")
                    else None,
                    "first": "plain" if r % 2 == 0 else "idempotent",
                    "load": [round(load_before, 1), round(load_after, 1)],
                }
            )
            log(f"  {rows[-1]}")
    for client, _, _ in clients:
        ratios = sorted(x["ratio"] for x in rows if x["mode"] == client)
        mid = len(ratios) // 2
        median = ratios[mid] if len(ratios) % 2 else (ratios[mid - 1] + ratios[mid]) / 2
        rows.append(
            {
                "metric": "idempotence ratio",
                "mode": client,
                "messages": sum(x["messages"] for x in rows if x.get("mode") == client),
                "errors": 0,
                "median": round(median, 3),
                "min": ratios[0],
                "max": ratios[-1],
                "rounds": len(ratios),
            }
        )
        log(f"  {rows[-1]}")
    return rows


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


def run(
    messages: int, idempotence_only: int = 0, kafka_python_messages: int = 0
) -> list[dict[str, Any]]:
    """Start a cluster in a temporary directory, measure, tear it down. With
    ``idempotence_only`` > 0: only that many rounds of plain vs idempotent producers."""
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
        if idempotence_only:
            log(f"{idempotence_only} rounds of plain vs idempotent produce, {messages} each")
            return idempotence_rounds(bs, cdir, idempotence_only, messages, kafka_python_messages)
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


_BUILD_LOG = """
import os, signal, struct, sys
import crc32c
from broker.replica.partition_log import PartitionLog
directory, batches, producers, template, segment_bytes = (
    sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), bytes.fromhex(sys.argv[4]), int(sys.argv[5])
)
records = struct.unpack_from(">i", template, 57)[0]
plog = PartitionLog.open(directory, segment_bytes=segment_bytes)
batch = bytearray(template)
chunk = []
for n in range(batches):
    struct.pack_into(">qhi", batch, 43, n % producers, 0, (n // producers) * records)
    struct.pack_into(">I", batch, 17, crc32c.crc32c(batch[21:]))
    chunk.append(bytes(batch))
    if len(chunk) == 1000 or n == batches - 1:
        plog.append(b"".join(chunk), leader_epoch=0)
        chunk = []
sys.stdout.flush()
os.kill(os.getpid(), signal.SIGKILL)  # a kill -9: no snapshot, no checkpoint at the log end
"""

_OPEN_LOG = """
import json, sys, time
from broker.replica.partition_log import PartitionLog
started = time.perf_counter()
plog = PartitionLog.open(sys.argv[1], segment_bytes=int(sys.argv[2]))
open_s = time.perf_counter() - started
replayed, rebuild_s = plog.producer_rebuild
print(json.dumps({
    "open_s": open_s, "rebuild_s": rebuild_s, "replayed": replayed,
    "producers": len(plog.producers), "log_end": plog.log_end_offset,
    "segments": len(plog.segment_files()), "opened": list(getattr(plog, "opened", ())),
}))
plog.close()
"""


def _batch_template(records: int) -> bytes:
    """An idempotent batch of ``records`` 100-byte records (producer fields patched later)."""
    import datetime
    import io

    from kio.records.schema import NewRecordBatch, Record
    from kio.records.writers import write_new_batch
    from kio.static.primitive import TZAwareMicros, i8, i16, i32, i64

    now = TZAwareMicros.parse(datetime.datetime.now(datetime.UTC).replace(microsecond=0))
    buf = io.BytesIO()
    write_new_batch(
        buf,
        NewRecordBatch(
            producer_id=i64(0),
            producer_epoch=i16(0),
            base_sequence=i32(0),
            records=tuple(
                Record(
                    attributes=i8(0),
                    timestamp=now,
                    offset=i64(i),
                    key=None,
                    value=b"x" * 100,
                    headers=(),
                )
                for i in range(records)
            ),
            attributes=i16(0),
        ),
    )
    return buf.getvalue()


def _in_tree(src: Path, script: str, *args: str, timeout: float = 1800) -> str:
    """Run ``script`` with the partition log of the source tree ``src``; its stdout."""
    proc = subprocess.run(
        [sys.executable, "-c", script, *args],
        cwd=src,
        env=dict(os.environ, PYTHONPATH=str(src)),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if proc.returncode not in (0, -signal.SIGKILL):
        raise RuntimeError(f"{src}: exit {proc.returncode}: {proc.stderr.strip()[-800:]}")
    return proc.stdout


def producer_state_rebuild(
    batches: int,
    producers: int = 100,
    records: int = 1,
    segment_bytes: int = 64 << 20,
    trees: list[Path] | None = None,
    rounds: int = 1,
) -> list[dict[str, Any]]:
    """A partition log of ``batches`` idempotent batches from ``producers`` producers, written
    by a process killed with SIGKILL at the end (no snapshot or checkpoint at the log end); then
    for each source tree in ``trees`` (this one by default; e.g. ``/work/main`` to compare), on
    its own copy, in turns: open after the kill -9, close, open after the clean close. Each open
    runs in a fresh process and reports the whole ``PartitionLog.open`` and the producer-state
    rebuild within it."""
    trees = trees or [REPO]
    workdir = Path(tempfile.mkdtemp(prefix="producer-state-bench-"))
    rows = []
    try:
        pristine = workdir / "pristine" / "t-0"
        pristine.parent.mkdir()
        started = time.perf_counter()
        _in_tree(
            REPO,
            _BUILD_LOG,
            str(pristine),
            str(batches),
            str(producers),
            _batch_template(records).hex(),
            str(segment_bytes),
        )
        size = sum(f.stat().st_size for f in pristine.glob("*.log"))
        log(
            f"  wrote {batches} batches ({size / 1e6:.0f} MB, "
            f"{len(list(pristine.glob('*.log')))} segments) in {time.perf_counter() - started:.0f} s"
        )
        for r in range(rounds):
            for tree in trees if r % 2 == 0 else list(reversed(trees)):
                copy = workdir / f"{tree.name}-{r}" / "t-0"
                shutil.copytree(pristine, copy)
                for case in ("after kill -9 (no snapshot at the end)", "after a clean close"):
                    load = os.getloadavg()[0]
                    got = json.loads(
                        _in_tree(tree, _OPEN_LOG, str(copy), str(segment_bytes)).splitlines()[-1]
                    )
                    assert got["producers"] == producers, got
                    rows.append(
                        {
                            "metric": "producer-state rebuild",
                            "mode": f"{case}, {tree}",
                            "messages": batches * records,
                            "batches": batches,
                            "errors": 0,
                            "seconds": round(got["rebuild_s"], 3),
                            "batches_replayed": got["replayed"],
                            "log_open_s": round(got["open_s"], 3),
                            "segments_indexed_scanned": got["opened"],
                            "load": round(load, 1),
                        }
                    )
                    log(f"  round {r}: {rows[-1]}")
                shutil.rmtree(copy.parent)
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


def idempotence_table(rows: list[dict[str, Any]]) -> str:
    out = [
        "| client | round | first | plain msgs/s | idempotent msgs/s | ratio | "
        "plain, 5 in flight | first delivery s plain/idem | ratio after first delivery | "
        "load before/after |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        if r["metric"] == "idempotence round":
            out.append(
                f"| {r['mode']} | {r['round']} | {r['first']} | {r['plain_msgs_s']} | "
                f"{r['idempotent_msgs_s']} | {r['ratio']} | "
                f"{r['plain_in_flight_5_msgs_s'] or '-'} | "
                f"{r['first_delivery_s'][0] or '-'} / {r['first_delivery_s'][1] or '-'} | "
                f"{r['steady_ratio'] or '-'} | {r['load'][0]} / {r['load'][1]} |"
            )
    for r in rows:
        if r["metric"] == "idempotence ratio":
            out.append(
                f"| {r['mode']} | median of {r['rounds']} | | | | {r['median']} "
                f"(min {r['min']}, max {r['max']}) | | | | |"
            )
    return "\n".join(out)


def rebuild_table(rows: list[dict[str, Any]]) -> str:
    out = [
        "| case, source tree | batches | replayed | rebuild s | whole open s | "
        "segments indexed/scanned | load |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        if r["metric"] == "producer-state rebuild":
            out.append(
                f"| {r['mode']} | {r['batches']} | {r['batches_replayed']} | {r['seconds']} | "
                f"{r['log_open_s']} | {r['segments_indexed_scanned'] or '-'} | {r['load']} |"
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
        default=1_000_000,
        help="idempotent batches in the producer-state rebuild log (default 1000000)",
    )
    ap.add_argument(
        "--rebuild-records",
        type=int,
        default=1,
        help="100-byte records per batch in that log (default 1)",
    )
    ap.add_argument(
        "--rebuild-segment-bytes",
        type=int,
        default=64 << 20,
        help="segment.bytes of that log (default 64 MiB)",
    )
    ap.add_argument(
        "--rebuild-compare",
        type=Path,
        action="append",
        default=[],
        help="another source tree whose PartitionLog opens its own copy in turns (repeatable)",
    )
    ap.add_argument("--rebuild-rounds", type=int, default=1, help="rounds of opens per tree")
    ap.add_argument(
        "--rebuild-only", action="store_true", help="only the producer-state rebuild (no cluster)"
    )
    ap.add_argument(
        "--idempotence-rounds",
        type=int,
        default=0,
        help="only N rounds of plain vs idempotent acks=all producers, in turns (no rebuild)",
    )
    ap.add_argument(
        "--kafka-python-messages",
        type=int,
        default=0,
        help="with --idempotence-rounds: kafka-python rounds of this many messages too",
    )
    args = ap.parse_args(argv)
    if args.idempotence_rounds:
        rows = run(args.messages, args.idempotence_rounds, args.kafka_python_messages)
        print(idempotence_table(rows))
        print(json.dumps({"system": "pykraft", "results": rows}))
        return 0
    rows = [] if args.rebuild_only else run(args.messages)
    log(f"producer-state rebuild, {args.rebuild_batches} batches")
    rows += producer_state_rebuild(
        args.rebuild_batches,
        records=args.rebuild_records,
        segment_bytes=args.rebuild_segment_bytes,
        trees=[REPO, *(p.resolve() for p in args.rebuild_compare)],
        rounds=args.rebuild_rounds,
    )
    t = target(rows)
    print("## pykraft data plane (3 brokers, RF 3, 3 partitions, 1 KB messages, confluent-kafka)\n")
    print(table(rows))
    print()
    print(rebuild_table(rows))
    print(f"\ntarget: {t['target']}: {t['value']} ({'met' if t['met'] else 'NOT met'})\n")
    print(json.dumps({"system": "pykraft", "results": rows, "targets": [t]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
