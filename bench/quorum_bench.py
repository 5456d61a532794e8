"""``python -m bench.quorum_bench``: the bare Raft layer (``kraft.quorum.RaftQuorum``, three
in-process members on loopback, no controller on top) with fsync always and never: sequential
commit latency of 300 small commands, then 32 concurrent submitters of 200-byte commands for 3 s
(commands/s, Raft entries/s and the mean group-commit size). Prints a markdown table and, as the
last line, one JSON line. docs/performance.md cites its figures."""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from bench.common import REPO

sys.path.insert(0, str(REPO / "tests" / "integration"))  # the quorum tests' cluster helper
from test_quorum import Cluster


async def measure(directory: Path, fsync: str) -> dict[str, Any]:
    cluster = Cluster(directory, fsync=fsync)
    try:
        for nid in cluster.addrs:
            cluster.start(nid)
        leader = await cluster.leader()
        await leader.submit(b"warm", timeout=10)
        lat = []
        for i in range(300):
            t = time.perf_counter()
            await leader.submit(b"s%d" % i, timeout=10)
            lat.append(time.perf_counter() - t)
        n = 0
        stop = trio.current_time() + 3.0

        async def worker() -> None:
            nonlocal n
            while trio.current_time() < stop:
                await leader.submit(b"c" * 200, timeout=10)
                n += 1

        groups0 = leader.stats()["groups_sent"]
        t = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for _ in range(32):
                nursery.start_soon(worker)
        elapsed = time.perf_counter() - t
        groups = leader.stats()["groups_sent"] - groups0
        return {
            "fsync": fsync,
            "seq_p50_ms": round(statistics.median(lat) * 1000, 3),
            "seq_p99_ms": round(sorted(lat)[int(len(lat) * 0.99)] * 1000, 3),
            "seq_ops_s": round(1 / statistics.mean(lat), 1),
            "concurrent_ops_s": round(n / elapsed, 1),
            "entries_s": round(groups / elapsed, 1),
            "mean_group": round(n / max(groups, 1), 1),
            "journal_syncs": leader.stats()["journal_syncs"],
        }
    finally:
        cluster.close()


def main() -> int:
    rows = []
    for fsync in ("always", "never"):
        with tempfile.TemporaryDirectory(prefix="kraft-quorum-bench-") as d:
            rows.append(trio.run(measure, Path(d), fsync))
    print(
        "| fsync | seq p50 ms | seq p99 ms | seq ops/s | 32 concurrent ops/s | entries/s | mean group |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(
            f"| {r['fsync']} | {r['seq_p50_ms']} | {r['seq_p99_ms']} | {r['seq_ops_s']} "
            f"| {r['concurrent_ops_s']} | {r['entries_s']} | {r['mean_group']} |"
        )
    print(json.dumps({"system": "pykraft-quorum", "results": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
