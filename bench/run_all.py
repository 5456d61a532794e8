"""``python -m bench.run_all [--scale] [--no-peers]``: the pykraft controller benchmark, next to a bare
PySyncObj quorum (run as a subprocess of /work/shared/bench/peers/run_pysyncobj.py, msync storage,
batching off, in-process client, seq + 32 in flight, --quick), with the issue's targets.

Prints progress on stderr, a markdown table on stdout and, as the LAST stdout line, one JSON line
``{"system": "pykraft", "results": [...]}``. ``--scale`` runs bench/scale_bench.py (1M partitions, 33 simulated brokers; long).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from typing import Any

from bench import audit_bench
from bench import controller_bench as cb

PEERS = "/work/shared/bench/peers/run_pysyncobj.py"
PEERS_ARGS = [
    "--storages",
    "msync",
    "--batch",
    "off",
    "--clients",
    "inproc",
    "--modes",
    "seq,inflight",
    "--quick",
    "--quiet-wait",
    "5",
]


ETCD = "/work/shared/bench/peers/run_etcd.py"
ETCD_ARGS = ["--clients", "grpc", "--modes", "seq,inflight", "--quick", "--quiet-wait", "5"]


def run_peers(
    timeout_s: float,
    runner: str = PEERS,
    runner_args: list[str] = PEERS_ARGS,
    system: str = "pysyncobj",
) -> tuple[list[dict[str, Any]], str | None]:
    """A peer's 3-node rows (bare PySyncObj by default, or etcd), or ([], note) when it could
    not be measured in time."""
    label = "bare PySyncObj" if system == "pysyncobj" else system
    if not os.path.exists(runner):
        return [], f"{label} not measured: {runner} not found"
    cb.log(f"{label}: running {runner} {' '.join(runner_args)} (timeout {timeout_s:.0f}s)")
    try:
        proc = subprocess.run(
            ["python3", runner, *runner_args],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        )
    except subprocess.TimeoutExpired:
        return [], f"{label} not measured: skipped after {timeout_s:.0f}s timeout"
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    try:
        doc = json.loads(lines[-1])
    except (IndexError, ValueError):
        return [], (
            f"{label} not measured: runner exit {proc.returncode}, "
            f"stderr tail: {proc.stderr.strip()[-200:]}"
        )
    rows = []
    for r in doc.get("results", []):
        rows.append(
            {
                "system": system,
                "config": r.get("config"),
                "metric": "small_command",
                "mode": r.get("mode"),
                "clients": r.get("clients"),
                "ops_s": r.get("ops_s"),
                "p50_ms": r.get("p50_ms"),
                "p99_ms": r.get("p99_ms"),
                "errors": r.get("errors"),
                "count": r.get("ops"),
                "seconds": r.get("window_s"),
                "quiet": (r.get("pre_row") or {}).get("quiet"),
            }
        )
    cb.log(f"{label}: {[(r['mode'], r['ops_s']) for r in rows]}")
    return rows, None


def etcd_targets(ours: list[dict[str, Any]], etcd: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Issue 8's commit-path goals against etcd measured in the same run."""
    mine = {r["mode"]: r for r in ours if r["metric"] == "small_command"}
    theirs = {r["mode"]: r for r in etcd if r["mode"] in ("seq", "inflight")}
    out = []
    if "inflight" in mine and "inflight" in theirs and theirs["inflight"].get("ops_s"):
        ratio = mine["inflight"]["ops_s"] / theirs["inflight"]["ops_s"]
        out.append(
            {
                "target": "small commands, 32 in flight >= 1.0x etcd (same run)",
                "value": mine["inflight"]["ops_s"],
                "limit": theirs["inflight"]["ops_s"],
                "ratio": round(ratio, 3),
                "met": ratio >= 1.0,
            }
        )
    if "seq" in mine and mine["seq"].get("p50_ms") is not None:
        p50 = mine["seq"]["p50_ms"]
        out.append(
            {
                "target": "sequential commit p50 <= 1.5 ms",
                "value": p50,
                "limit": 1.5,
                "ratio": round(p50 / 1.5, 3),
                "met": p50 <= 1.5,
                "etcd_seq_p50_ms": theirs.get("seq", {}).get("p50_ms"),
            }
        )
    return out


def targets(ours: list[dict[str, Any]], peers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []

    def find(rows: list[dict[str, Any]], metric: str, mode: str) -> dict[str, Any] | None:
        return next((r for r in rows if r["metric"] == metric and r["mode"] == mode), None)

    for mode in ("seq", "inflight"):
        mine, base = find(ours, "small_command", mode), find(peers, "small_command", mode)
        t: dict[str, Any] = {
            "target": f"small-command throughput ({mode}) >= 70% of bare PySyncObj",
            "value": mine and mine["ops_s"],
            "limit": None,
            "ratio": None,
            "met": None,
        }
        if mine and base and base.get("ops_s"):
            t["limit"] = round(0.7 * base["ops_s"], 1)
            t["baseline_ops_s"] = base["ops_s"]
            t["ratio"] = round(mine["ops_s"] / base["ops_s"], 3)
            t["met"] = t["ratio"] >= 0.7
        else:
            t["note"] = "bare PySyncObj not measured"
        out.append(t)
    big = find(ours, "create_1000x10", "inflight")
    if big:
        secs = big["seconds"] if big.get("completed") else None
        out.append(
            {
                "target": "create 1,000 topics x 10 partitions RF 3 <= 5 s",
                "value": secs,
                "limit": 5.0,
                "ratio": round(secs / 5.0, 3) if secs else None,
                "met": (secs is not None and secs <= 5.0),
            }
        )
    fo = next((r for r in ours if r["metric"] == "failover"), None)
    if fo:
        med = fo.get("median_s")
        out.append(
            {
                "target": "failover median <= 3 s",
                "value": med,
                "limit": 3.0,
                "ratio": round(med / 3.0, 3) if med is not None else None,
                "met": (med is not None and med <= 3.0),
                "count": fo.get("count"),
            }
        )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--scale",
        action="store_true",
        help="run the 1M-partition scale benchmark (bench/scale_bench.py) instead",
    )
    ap.add_argument("--no-peers", action="store_true", help="skip the bare PySyncObj comparison")
    ap.add_argument("--peers-timeout", type=float, default=150.0)
    ap.add_argument("--phase-s", type=float, default=5.0)
    ap.add_argument("--failovers", type=int, default=10)
    ap.add_argument("--failover-budget-s", type=float, default=100.0)
    ap.add_argument(
        "--audit-records",
        type=int,
        default=2_000_000,
        help="records in the generated log for the Spark audit benchmark (0 = skip)",
    )
    ap.add_argument(
        "--produce-messages",
        type=int,
        default=100_000,
        help="messages per data-plane produce run (0 = skip bench/produce_bench.py)",
    )
    args = ap.parse_args(argv)
    if args.scale:
        from bench import scale_bench

        return scale_bench.main([])
    started = time.perf_counter()
    notes: list[str] = []
    # Bare PySyncObj first, so the two systems never share the 2 cores.
    peers, note = (
        ([], "bare PySyncObj skipped (--no-peers)")
        if args.no_peers
        else run_peers(args.peers_timeout)
    )
    if note:
        notes.append(note)
        cb.log(note)
    etcd, note = (
        ([], "etcd skipped (--no-peers)")
        if args.no_peers
        else run_peers(args.peers_timeout + 150, ETCD, ETCD_ARGS, "etcd")
    )
    if note:
        notes.append(note)
        cb.log(note)
    ours = cb.run(args.phase_s, 32, args.failovers, args.failover_budget_s)
    fo = next((r for r in ours if r["metric"] == "failover"), None)
    if fo and fo["count"] < args.failovers:
        notes.append(
            f"failover: {fo['count']} of {args.failovers} rounds measured "
            f"(budget {args.failover_budget_s:.0f}s)"
        )
    tg = targets(ours, peers) + etcd_targets(ours, etcd)
    from bench import broker_bench

    broker_rows, broker_targets = broker_bench.run()
    tg += broker_targets
    from bench import produce_bench

    data_rows = produce_bench.run(args.produce_messages) if args.produce_messages > 0 else []
    if data_rows:
        tg.append(produce_bench.target(data_rows))
    audit_rows, audit_targets = (
        audit_bench.run(args.audit_records, audit_bench.default_work())
        if args.audit_records > 0
        else ([], [])
    )
    tg += audit_targets

    print("## pykraft controller (3 controllers, fsync always, 3 SimBrokers)\n")
    print(cb.table(ours))
    if peers:
        print("\n## bare PySyncObj (3 nodes, msync storage, batching off, in-process client)\n")
        print("| mode | clients | ops/s | p50 ms | p99 ms | errors | quiet machine |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for r in peers:
            print(
                f"| {r['mode']} | {r['clients']} | {r['ops_s']} | {r['p50_ms']} | {r['p99_ms']} | "
                f"{r['errors']} | {r['quiet']} |"
            )
    print("\n## brokers: metadata propagation and replay (bench/broker_bench.py)\n")
    print(broker_bench.table(broker_rows, []))
    if data_rows:
        print("\n## data plane: produce/consume, 1 KB messages, RF 3 (bench/produce_bench.py)\n")
        print(produce_bench.table(data_rows))
    if audit_rows:
        print("\n" + audit_bench.markdown(audit_rows, audit_targets))
    if etcd:
        print("\n## etcd 3.4 (3 nodes, fsync, grpc client to the leader), same run\n")
        print("| mode | clients | ops/s | p50 ms | p99 ms | errors | quiet machine |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for r in etcd:
            print(
                f"| {r['mode']} | {r['clients']} | {r['ops_s']} | {r['p50_ms']} | {r['p99_ms']} | "
                f"{r['errors']} | {r['quiet']} |"
            )
    print("\n## targets\n")
    print("| target | value | limit | ratio | met |")
    print("| --- | --- | --- | --- | --- |")
    for t in tg:
        print(f"| {t['target']} | {t['value']} | {t['limit']} | {t['ratio']} | {t['met']} |")
    for n in notes:
        print(f"\nnote: {n}")
    print(f"\ntotal wall time: {time.perf_counter() - started:.0f}s\n")
    print(
        json.dumps(
            {
                "system": "pykraft",
                "results": ours + peers + etcd + broker_rows + data_rows + audit_rows,
                "targets": tg,
                "notes": notes,
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
