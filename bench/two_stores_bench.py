"""What the second durable store costs: each controller keeps the Raft journal (PySyncObj's
entries, fsynced on the commit path) and the metadata log (committed batches, verbatim, synced
every ``metadata.log.flush.interval.ms`` off the commit path). A real 3-controller cluster
(fsync always) with 3 SimBrokers takes a stream of writes (alternately a 4-partition
CreateTopics and a config SET, 32 in flight); per controller this reports the bytes each store
grew by per commit, and the process's write syscalls and bytes written to storage per commit
(``/proc/PID/io``).

``python -m bench.two_stores_bench [--writes N]``; prints a markdown table and, as the last
stdout line, ``{"system": "pykraft", "bench": "two-stores", "results": [...]}``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import trio

from bench.common import cluster_down, cluster_up, controller_addresses
from bench.controller_bench import log, start_sim_brokers, stop_process
from bench.follower_cpu_bench import _status, drive
from kraft.quorum import journal_file as jf


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def proc_io(pid: int) -> dict[str, int]:
    """``/proc/PID/io``: syscw (write syscalls), write_bytes (bytes sent to storage)."""
    out = {}
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        key, value = line.split(":")
        out[key] = int(value)
    return out


def journal_bytes(path: Path) -> int:
    """The journal's used bytes (its file is zero-filled ahead: the size says nothing)."""
    _, _, end = jf.read_entries(str(path), path.read_bytes())
    return end


def stores(controller: dict[str, Any]) -> dict[str, int]:
    meta = Path(controller["metadata_dir"])
    return {
        "journal": journal_bytes(meta / "raft" / "journal.bin"),
        "metadata_log": dir_bytes(meta / "log"),
    }


def run(writes: int, inflight: int) -> list[dict[str, Any]]:
    directory = Path(tempfile.mkdtemp(prefix="pykraft-stores-"))
    try:
        meta = cluster_up(directory, 3, 0, "--fsync", "always")
        addrs = controller_addresses(meta)
        sims = start_sim_brokers(directory)
        try:
            trio.run(drive, addrs, 40, 4)  # warm-up: creates the first topics
            commit_before = trio.run(_status, addrs)["commit_index"]
            size_before = {c["id"]: stores(c) for c in meta["controllers"]}
            io_before = {c["id"]: proc_io(c["pid"]) for c in meta["controllers"]}
            log(f"driving {writes} writes, {inflight} in flight")
            trio.run(drive, addrs, writes, inflight)
            status = trio.run(_status, addrs)
            size_after = {c["id"]: stores(c) for c in meta["controllers"]}
            io_after = {c["id"]: proc_io(c["pid"]) for c in meta["controllers"]}
        finally:
            stop_process(sims)
        commits = max(status["commit_index"] - commit_before, 1)
        rows = []
        for cid in sorted(size_before):
            grew = {k: size_after[cid][k] - size_before[cid][k] for k in size_before[cid]}
            rows.append(
                {
                    "controller": cid,
                    "role": "leader" if cid == status["leader_id"] else "follower",
                    "commits": commits,
                    "journal_bytes_per_commit": round(grew["journal"] / commits),
                    "metadata_log_bytes_per_commit": round(grew["metadata_log"] / commits),
                    "write_syscalls_per_commit": round(
                        (io_after[cid]["syscw"] - io_before[cid]["syscw"]) / commits, 2
                    ),
                    "storage_bytes_per_commit": round(
                        (io_after[cid]["write_bytes"] - io_before[cid]["write_bytes"]) / commits
                    ),
                }
            )
        return rows
    finally:
        cluster_down(directory)
        shutil.rmtree(directory, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writes", type=int, default=2000)
    parser.add_argument("--inflight", type=int, default=32)
    args = parser.parse_args(argv)
    rows = run(args.writes, args.inflight)
    print(
        "| controller | role | commits | journal B/commit | metadata log B/commit "
        "| write syscalls/commit | bytes to storage/commit |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['controller']} | {r['role']} | {r['commits']} | "
            f"{r['journal_bytes_per_commit']} | {r['metadata_log_bytes_per_commit']} | "
            f"{r['write_syscalls_per_commit']} | {r['storage_bytes_per_commit']} |"
        )
    print(json.dumps({"system": "pykraft", "bench": "two-stores", "results": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
