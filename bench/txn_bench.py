"""Transactional produce benchmark: a real cluster (3 controllers, 3 brokers), confluent-kafka,
1 KB messages to 3-partition RF-3 topics, acks=all.

In the same run: a plain idempotent producer (``enable.idempotence=true``, the baseline) and a
transactional producer committing every ``--txn-size`` messages (begin, produce, commit), each
sending ``--messages`` messages; msgs/s from the first produce to the last delivery / commit.
Then a read_committed consumer reads the transactional topic back and the count is checked.
Target: transactional >= 0.5x the non-transactional rate with 100-message transactions.

``main()`` prints a markdown table and, as the last stdout line, ``{"system": "pykraft", ...}``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import cluster_down, cluster_up, kraft, logger
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


def plain(bs: str, topic: str, messages: int) -> dict[str, Any]:
    p = _producer(bs)
    payload = b"x" * MSG_BYTES
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


def transactional(bs: str, topic: str, messages: int, txn_size: int) -> dict[str, Any]:
    p = _producer(bs, **{"transactional.id": f"bench-{time.time_ns()}"})
    p.init_transactions(60)
    payload = b"x" * MSG_BYTES
    sent = txns = 0
    started = time.perf_counter()
    while sent < messages:
        p.begin_transaction()
        for _ in range(min(txn_size, messages - sent)):
            while True:
                try:
                    p.produce(topic, payload)
                    break
                except BufferError:
                    p.poll(0.01)
            sent += 1
        p.commit_transaction(120)
        txns += 1
    elapsed = time.perf_counter() - started
    return _row(f"transactional, {txn_size} msgs/txn", messages, elapsed, txns)


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


def run(messages: int, txn_size: int) -> list[dict[str, Any]]:
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
        log(f"idempotent produce, {messages} x {MSG_BYTES} B")
        rows.append(plain(bs, "bench-plain", messages))
        log(f"  {rows[-1]}")
        log(f"transactional produce, {messages} x {MSG_BYTES} B, {txn_size} per transaction")
        rows.append(transactional(bs, "bench-txn", messages, txn_size))
        log(f"  {rows[-1]}")
        rows[-1]["read_committed_count"] = count_committed(bs, "bench-txn", 3)
    finally:
        cluster_down(cdir)
        shutil.rmtree(workdir, ignore_errors=True)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    out = [
        "| mode | messages | transactions | seconds | msgs/s | MB/s |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        out.append(
            f"| {r['mode']} | {r['messages']} | {r['transactions']} | {r['seconds']} "
            f"| {r['msgs_s']} | {r['mb_s']} |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--messages", type=int, default=20_000, help="messages per mode (20000)")
    ap.add_argument("--txn-size", type=int, default=100, help="messages per transaction (100)")
    args = ap.parse_args(argv)
    rows = run(args.messages, args.txn_size)
    ratio = round(rows[1]["msgs_s"] / rows[0]["msgs_s"], 3)
    target = {
        "target": f"transactional >= {TARGET_RATIO}x idempotent, {args.txn_size} msgs/txn",
        "value": ratio,
        "limit": TARGET_RATIO,
        "met": ratio >= TARGET_RATIO and rows[1]["read_committed_count"] == args.messages,
    }
    print(f"## pykraft transactions (3 brokers, RF 3, 3 partitions, {MSG_BYTES} B messages)\n")
    print(table(rows))
    print(
        f"\nratio {ratio} ({'met' if target['met'] else 'NOT met'}); read_committed read back "
        f"{rows[1]['read_committed_count']} of {args.messages}\n"
    )
    print(json.dumps({"system": "pykraft", "results": rows, "targets": [target]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
