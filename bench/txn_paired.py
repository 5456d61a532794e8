"""Paired A/B of transaction latency between two source trees: one cluster per tree (3
controllers + 3 brokers each, ``--fsync never``, a 3-partition RF-3 topic), both up at once, and
blocks of ``--block`` 100-message transactions (1 KB, acks=all, confluent-kafka) run on each in
turn, in random order per round. Both codes see the same machine load at the same moment, which
sequential runs on a shared machine do not; ``--ids`` transactional ids per cluster are rotated
per block so the coordinator's placement averages out. Run with the same tree twice (A/A) to see
the harness's own bias. Prints one JSON line: ms per transaction (mean, p10, p50, p90) per tree
and in how many rounds the second tree was faster.

    python -m bench.txn_paired --a /tmp/base-tree --b . --rounds 40
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.produce_bench import MSG_BYTES


def _kraft(tree: str, *args: str, timeout: float = 300) -> str:
    env = dict(os.environ, PYTHONPATH=tree)
    cmd = [sys.executable, "-m", "tools.cli", *args]
    proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"kraft {' '.join(args)} in {tree}: {proc.stderr.strip()[-500:]}")
    return proc.stdout


def _txn(p: Any, topic: str, payload: bytes, size: int) -> float:
    t0 = time.perf_counter()
    p.begin_transaction()
    for _ in range(size):
        p.produce(topic, payload)
    p.commit_transaction(60)
    return (time.perf_counter() - t0) * 1000


def _summary(values: list[float]) -> dict[str, float]:
    s = sorted(values)
    return {
        "mean": round(statistics.mean(s), 1),
        "p10": round(s[len(s) // 10], 1),
        "p50": round(statistics.median(s), 1),
        "p90": round(s[len(s) * 9 // 10], 1),
    }


def run(trees: dict[str, str], rounds: int, block: int, ids: int, size: int) -> dict[str, Any]:
    from confluent_kafka import Producer

    work = Path(tempfile.mkdtemp(prefix="txn-paired-"))
    up: list[tuple[str, Path]] = []
    try:
        producers: dict[str, list[Any]] = {}
        for name, tree in trees.items():
            d = work / name
            _kraft(tree, "cluster", "up", "--dir", str(d), "--controllers", "3", "--brokers", "3",
                   "--detach", "--no-auth", "--fsync", "never")  # fmt: skip
            up.append((tree, d))
            meta = json.loads((d / "cluster.json").read_text())
            bs = ",".join(f"{b['host']}:{b['port']}" for b in meta["brokers"])
            _kraft(tree, "topics", "create", "t", "--partitions", "3", "--replication-factor",
                   "3", "--cluster", str(d))  # fmt: skip
            conf = {"bootstrap.servers": bs, "acks": "all", "linger.ms": 5}
            producers[name] = [
                Producer(dict(conf, **{"transactional.id": f"paired-{i}"})) for i in range(ids)
            ]
        time.sleep(1.0)  # brokers take their roles
        payload = b"x" * MSG_BYTES
        for ps in producers.values():
            for p in ps:
                p.init_transactions(60)
                _txn(p, "t", payload, size)  # warm-up
        ms: dict[str, list[float]] = {name: [] for name in trees}
        load0 = os.getloadavg()[0]
        for r in range(rounds):
            order = list(trees)
            random.shuffle(order)
            for name in order:
                p = producers[name][r % ids]
                ms[name].append(sum(_txn(p, "t", payload, size) for _ in range(block)) / block)
        load1 = os.getloadavg()[0]
        a, b = list(trees)
        out: dict[str, Any] = {
            "utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
            "rounds": rounds,
            "block": block,
            "load_1m": [round(load0, 1), round(load1, 1)],
            "b_faster_rounds": sum(1 for x, y in zip(ms[a], ms[b]) if y < x),
        }
        out.update({name: _summary(v) for name, v in ms.items()})
        return out
    finally:
        for tree, d in up:
            try:
                _kraft(tree, "cluster", "down", "--dir", str(d), timeout=120)
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                print(f"cluster down {d}: {e}", file=sys.stderr)
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--a", required=True, help="source tree A (e.g. a `git archive` of main)")
    ap.add_argument("--b", required=True, help="source tree B")
    ap.add_argument("--rounds", type=int, default=40, help="rounds (40)")
    ap.add_argument("--block", type=int, default=10, help="transactions per block (10)")
    ap.add_argument("--ids", type=int, default=5, help="transactional ids per cluster (5)")
    ap.add_argument("--txn-size", type=int, default=100, help="messages per transaction (100)")
    args = ap.parse_args(argv)
    trees = {"a": str(Path(args.a).resolve()), "b": str(Path(args.b).resolve())}
    print(json.dumps(run(trees, args.rounds, args.block, args.ids, args.txn_size)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
