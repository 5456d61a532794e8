"""Transactional produce benchmark: a real cluster (3 controllers, 3 brokers), confluent-kafka,
1 KB messages to 3-partition RF-3 topics, acks=all.

In the same run: a plain idempotent producer (``enable.idempotence=true``, the baseline) and a
transactional producer committing every ``--txn-size`` messages (begin, produce, commit), each
sending ``--messages`` messages; msgs/s from the first produce to the last delivery / commit.
Then a read_committed consumer reads the transactional topic back and the count is checked.
Each row also gives the brokers' CPU (user + system of the three broker processes, idle
background included) per 100 idempotent messages / per transaction.
Target: transactional >= 0.5x the non-transactional rate with 100-message transactions.

``main()`` prints a markdown table and, as the last stdout line, ``{"system": "pykraft", ...}``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import cluster_down, cluster_up, kraft, logger, total_cpu_s
from bench.produce_bench import MSG_BYTES

log = logger("txn_bench")

TARGET_RATIO = 0.5


def _producer(bs: str, **conf: Any) -> Any:
    from confluent_kafka import Producer

    return Producer(
        {
            "bootstrap.servers": bs,
            "acks": "all",
            "linger.ms": 5,
            "enable.idempotence": True,
            "message.timeout.ms": 60000,
            **conf,
        }
    )


def _warm_up(p: Any, topic: str, payload: bytes, partitions: int, txn: bool) -> None:
    """One message per partition delivered before a clock starts (in one transaction for a
    transactional producer): connections, metadata and the producer id are then behind it.
    Without this, the idempotent baseline's clock included librdkafka's InitProducerId (asked
    before any broker connection is up, retried after 500 ms) while the transactional one's did
    not (``init_transactions`` ran before its clock), which favoured transactions."""
    if txn:
        p.begin_transaction()
    for part in range(partitions):
        p.produce(topic, payload, partition=part)
    if txn:
        p.commit_transaction(60)
    assert p.flush(60) == 0, "warm-up messages not delivered"


def plain(bs: str, topic: str, messages: int, partitions: int = 3) -> dict[str, Any]:
    p = _producer(bs)
    payload = b"x" * MSG_BYTES
    _warm_up(p, topic, payload, partitions, txn=False)
    errors: list[Any] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(err)

    started = time.perf_counter()
    for _ in range(messages):
        while True:
            try:
                p.produce(topic, payload, on_delivery=on_delivery)
                break
            except BufferError:
                p.poll(0.01)
        p.poll(0)
    left = p.flush(120)
    elapsed = time.perf_counter() - started
    assert left == 0 and not errors, errors[:3]
    return _row("idempotent, no transactions", messages, elapsed, 0)


def transactional(
    bs: str, topic: str, messages: int, txn_size: int, split: bool = False
) -> dict[str, Any]:
    """Transactions of ``txn_size`` messages; with ``split``, each one is flushed before its
    commit and the time of each phase is kept (what commit_transaction does anyway: it
    flushes first, then sends EndTxn)."""
    p = _producer(bs, **{"transactional.id": f"bench-{time.time_ns()}"})
    p.init_transactions(60)
    payload = b"x" * MSG_BYTES
    _warm_up(p, topic, payload, 3, txn=True)
    sent = txns = 0
    phases: dict[str, list[float]] = {"produce": [], "flush": [], "commit": []}
    started = time.perf_counter()
    while sent < messages:
        t0 = time.perf_counter()
        p.begin_transaction()
        for _ in range(min(txn_size, messages - sent)):
            while True:
                try:
                    p.produce(topic, payload)
                    break
                except BufferError:
                    p.poll(0.01)
            sent += 1
        t1 = time.perf_counter()
        if split:
            left = p.flush(120)
            assert left == 0, f"{left} messages not delivered"
        t2 = time.perf_counter()
        p.commit_transaction(120)
        t3 = time.perf_counter()
        for name, ms in (("produce", t1 - t0), ("flush", t2 - t1), ("commit", t3 - t2)):
            phases[name].append(ms * 1000)
        txns += 1
    elapsed = time.perf_counter() - started
    row = _row(f"transactional, {txn_size} msgs/txn", messages, elapsed, txns)
    if split:
        row["phases_ms"] = {name: _summary(v) for name, v in phases.items()}
    return row


def _summary(values: list[float]) -> dict[str, float]:
    """Mean, p50, p90 and max of ``values`` (ms), rounded to 0.1."""
    s = sorted(values)
    return {
        "mean": round(sum(s) / len(s), 1),
        "p50": round(s[len(s) // 2], 1),
        "p90": round(s[min(len(s) - 1, int(len(s) * 0.9))], 1),
        "max": round(s[-1], 1),
    }


def _row(mode: str, messages: int, elapsed: float, txns: int) -> dict[str, Any]:
    return {
        "mode": mode,
        "messages": messages,
        "transactions": txns,
        "seconds": round(elapsed, 2),
        "msgs_s": round(messages / elapsed, 1),
        "mb_s": round(messages * MSG_BYTES / elapsed / 1e6, 2),
    }


def count_committed(bs: str, topic: str, partitions: int) -> int:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    c = Consumer(
        {
            "bootstrap.servers": bs,
            "group.id": "txn-bench-reader",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "enable.auto.commit": False,
        }
    )
    c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    n, eof, deadline = 0, set[int](), time.monotonic() + 120
    while len(eof) < partitions and time.monotonic() < deadline:
        for m in c.consume(1000, timeout=0.5):
            err = m.error()
            if err is None:
                n += 1
            elif err.code() == KafkaError._PARTITION_EOF:
                eof.add(int(m.partition() or 0))
    c.close()
    return n


def run(messages: int, txn_size: int, split: bool = False) -> list[dict[str, Any]]:
    workdir = Path(tempfile.mkdtemp(prefix="txn-bench-"))
    cdir = workdir / "cluster"
    rows: list[dict[str, Any]] = []
    try:
        meta = cluster_up(cdir, 3, 3, "--fsync", "never")
        bs = ",".join(f"{b['host']}:{b['port']}" for b in meta["brokers"])
        for topic in ("bench-plain", "bench-txn"):
            kraft("topics", "create", topic, "--partitions", "3", "--replication-factor", "3",
                  "--cluster", str(cdir))  # fmt: skip
        time.sleep(1.0)  # brokers take their roles
        log(f"warm-up: the transaction coordinator topic and one {txn_size}-message transaction")
        transactional(bs, "bench-plain", txn_size, txn_size)
        pids = [b["pid"] for b in meta["brokers"]]
        log(f"idempotent produce, {messages} x {MSG_BYTES} B")
        cpu0 = total_cpu_s(pids)
        rows.append(plain(bs, "bench-plain", messages))
        rows[-1]["broker_cpu_ms_per_100_msgs"] = round(
            (total_cpu_s(pids) - cpu0) * 1000 * 100 / messages, 2
        )
        log(f"  {rows[-1]}")
        log(f"transactional produce, {messages} x {MSG_BYTES} B, {txn_size} per transaction")
        cpu0 = total_cpu_s(pids)
        rows.append(transactional(bs, "bench-txn", messages, txn_size, split))
        rows[-1]["broker_cpu_ms_per_txn"] = round(
            (total_cpu_s(pids) - cpu0) * 1000 / rows[-1]["transactions"], 2
        )
        log(f"  {rows[-1]}")
        rows[-1]["read_committed_count"] = count_committed(bs, "bench-txn", 3)
        rows[-1]["read_committed_expected"] = messages + 3  # and the warm-up transaction's
    finally:
        cluster_down(cdir)
        shutil.rmtree(workdir, ignore_errors=True)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    out = [
        "| mode | messages | transactions | seconds | msgs/s | MB/s | broker CPU |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        cpu = (
            f"{r['broker_cpu_ms_per_txn']} ms/txn"
            if "broker_cpu_ms_per_txn" in r
            else f"{r.get('broker_cpu_ms_per_100_msgs', '?')} ms/100 msgs"
        )
        out.append(
            f"| {r['mode']} | {r['messages']} | {r['transactions']} | {r['seconds']} "
            f"| {r['msgs_s']} | {r['mb_s']} | {cpu} |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--messages", type=int, default=20_000, help="messages per mode (20000)")
    ap.add_argument("--txn-size", type=int, default=100, help="messages per transaction (100)")
    ap.add_argument(
        "--split",
        action="store_true",
        help="flush each transaction before its commit and report the time of each phase",
    )
    args = ap.parse_args(argv)
    load_before = os.getloadavg()[0]
    rows = run(args.messages, args.txn_size, args.split)
    load_after = os.getloadavg()[0]
    ratio = round(rows[1]["msgs_s"] / rows[0]["msgs_s"], 3)
    target = {
        "target": f"transactional >= {TARGET_RATIO}x idempotent, {args.txn_size} msgs/txn",
        "value": ratio,
        "limit": TARGET_RATIO,
        "met": ratio >= TARGET_RATIO
        and rows[1]["read_committed_count"] == rows[1]["read_committed_expected"],
    }
    print(f"## pykraft transactions (3 brokers, RF 3, 3 partitions, {MSG_BYTES} B messages)\n")
    print(table(rows))
    if "phases_ms" in rows[1]:
        print("\nper transaction (ms): " + json.dumps(rows[1]["phases_ms"]))
    print(
        f"\nratio {ratio} ({'met' if target['met'] else 'NOT met'}); read_committed read back "
        f"{rows[1]['read_committed_count']} of {rows[1]['read_committed_expected']}; load average (1 min) "
        f"{load_before:.1f} before, {load_after:.1f} after\n"
    )
    load = [round(load_before, 1), round(load_after, 1)]
    print(json.dumps({"system": "pykraft", "results": rows, "targets": [target], "load_1m": load}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
