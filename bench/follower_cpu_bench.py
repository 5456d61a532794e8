"""Follower CPU per commit: a real 3-controller cluster (fsync always) + 3 SimBrokers, a stream
of writes with 32 in flight (alternately a 4-partition CreateTopics and a config SET), and the
CPU time (utime + stime from /proc) each controller process spends, divided by the commits
(Raft commit index delta). Compares the active controller with the followers: with controller
v2 the followers only decode and replay batches, they run no handler.

``python -m bench.follower_cpu_bench [--writes N]``; prints a markdown table and, as the last
stdout line, ``{"system": "pykraft", "results": [...]}``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from bench.common import cluster_down, cluster_up, controller_addresses, total_cpu_s
from bench.controller_bench import log, set_body, start_sim_brokers, stop_process
from kraft.rpc.client import ControllerClient


def body(i: int) -> tuple[str, dict[str, Any]]:
    if i % 2:
        return "IncrementalAlterConfigs", set_body(f"cpu-{(i // 2) % 50}", i)
    topic = {"name": f"cpu-{i // 2}", "num_partitions": 4, "replication_factor": 3}
    return "CreateTopics", {"topics": [topic]}


async def drive(addrs: list[tuple[str, int]], writes: int, inflight: int) -> float:
    clients = [ControllerClient(addrs, client_id=f"cpu-{k}") for k in range(4)]
    next_i = 0

    async def worker(k: int) -> None:
        nonlocal next_i
        while next_i < writes:
            i, next_i = next_i, next_i + 1
            api, b = body(i)
            await clients[k % 4].call(api, b, timeout=30)

    started = time.monotonic()
    try:
        async with trio.open_nursery() as nursery:
            for k in range(inflight):
                nursery.start_soon(worker, k)
    finally:
        for c in clients:
            await c.aclose()
    return time.monotonic() - started


def run(writes: int, inflight: int) -> list[dict[str, Any]]:
    directory = Path(tempfile.mkdtemp(prefix="pykraft-cpu-"))
    try:
        meta = cluster_up(directory, 3, 0, "--fsync", "always")
        addrs = controller_addresses(meta)
        sims = start_sim_brokers(directory)
        try:
            trio.run(drive, addrs, 40, 4)  # warm-up: creates the first topics
            status = trio.run(_status, addrs)
            before = {c["id"]: total_cpu_s([c["pid"]]) for c in meta["controllers"]}
            commit_before = status["commit_index"]
            log(f"driving {writes} writes, {inflight} in flight")
            wall = trio.run(drive, addrs, writes, inflight)
            status = trio.run(_status, addrs)
            after = {c["id"]: total_cpu_s([c["pid"]]) for c in meta["controllers"]}
        finally:
            stop_process(sims)
        commits = status["commit_index"] - commit_before
        leader = status["leader_id"]
        rows = []
        for cid in sorted(before):
            spent = after[cid] - before[cid]
            rows.append(
                {
                    "controller": cid,
                    "role": "leader" if cid == leader else "follower",
                    "cpu_s": round(spent, 2),
                    "commits": commits,
                    "writes": writes,
                    "cpu_us_per_commit": round(spent / max(commits, 1) * 1e6),
                    "cpu_us_per_write": round(spent / writes * 1e6),
                    "writes_per_s": round(writes / wall),
                }
            )
        return rows
    finally:
        cluster_down(directory)
        shutil.rmtree(directory, ignore_errors=True)


async def _status(addrs: list[tuple[str, int]]) -> dict[str, Any]:
    client = ControllerClient(addrs, client_id="cpu-status")
    try:
        reply: dict[str, Any] = await client.call("DescribeQuorum", {}, timeout=10)
        return reply
    finally:
        await client.aclose()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writes", type=int, default=2000)
    parser.add_argument("--inflight", type=int, default=32)
    args = parser.parse_args(argv)
    rows = run(args.writes, args.inflight)
    print("| controller | role | CPU s | commits | CPU µs/commit | CPU µs/write | writes/s |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['controller']} | {r['role']} | {r['cpu_s']} | {r['commits']} | "
            f"{r['cpu_us_per_commit']} | {r['cpu_us_per_write']} | {r['writes_per_s']} |"
        )
    print(json.dumps({"system": "pykraft", "results": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
