"""``python -m bench.run_all [--scale] [--no-peers] [--rounds N]``: the pykraft benchmarks.

The commit path (small commands, sequential and 32 in flight) runs in interleaved rounds with
etcd and a bare PySyncObj quorum (bench/interleave.py: each round runs every system, the
cross-system figures are medians of per-round ratios with their spread and the machine's load
per round); then topic creation and failover, broker propagation and replay, the data plane,
the group coordinator and the Spark audit, once each, with the issues' targets.

Prints progress on stderr, markdown tables on stdout and, as the LAST stdout line, one JSON line
``{"system": "pykraft", "results": [...], "interleaved": {...}, "targets": [...]}``.
``--scale`` runs bench/scale_bench.py (2M partitions, 60 simulated brokers; long), then
bench/cost_curves_bench.py (per-commit and per-record CPU at 10k-2M partitions).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from bench import audit_bench, group_bench, interleave
from bench import controller_bench as cb
from bench.interleave import SYSTEMS


def targets(ours: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The controller's own targets (the commit path's are the interleaved ones)."""
    out: list[dict[str, Any]] = []

    def find(rows: list[dict[str, Any]], metric: str, mode: str) -> dict[str, Any] | None:
        return next((r for r in rows if r["metric"] == metric and r["mode"] == mode), None)

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
        help="run the 2M-partition scale benchmark (bench/scale_bench.py) and the cost curves "
        "(bench/cost_curves_bench.py) instead",
    )
    ap.add_argument(
        "--no-peers", action="store_true", help="measure pykraft only (no etcd, no PySyncObj)"
    )
    ap.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="interleaved rounds of the commit path (etcd, pykraft, PySyncObj each round; 3)",
    )
    ap.add_argument(
        "--settle-s",
        type=float,
        default=interleave.DEFAULT_SETTLE_S,
        help="before each interleaved run, wait at most this long for other processes to use "
        f"<= {interleave.QUIET_OTHER_CORES} cores (0 = one 1 s sample, no waiting)",
    )
    ap.add_argument("--peers-timeout", type=float, default=150.0)
    ap.add_argument("--phase-s", type=float, default=5.0)
    ap.add_argument("--failovers", type=int, default=10)
    ap.add_argument("--failover-budget-s", type=float, default=100.0)
    ap.add_argument(
        "--group-seconds",
        type=float,
        default=10.0,
        help="seconds per offset-commit measurement (0 = skip bench/group_bench.py)",
    )
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
        from bench import cost_curves_bench, scale_bench

        scale_rc = scale_bench.main([])
        return cost_curves_bench.main([]) or scale_rc
    started = time.perf_counter()
    notes: list[str] = []
    # the commit path: every system in each round, one after another (bench/interleave.py)
    mixed = interleave.run(
        args.rounds,
        args.phase_s,
        args.peers_timeout,
        ("pykraft",) if args.no_peers else SYSTEMS,
        args.settle_s,
    )
    notes += mixed["notes"]
    ours = cb.run(
        args.phase_s, 32, args.failovers, args.failover_budget_s, phases=("topics", "failover")
    )
    fo = next((r for r in ours if r["metric"] == "failover"), None)
    if fo and fo["count"] < args.failovers:
        notes.append(
            f"failover: {fo['count']} of {args.failovers} rounds measured "
            f"(budget {args.failover_budget_s:.0f}s)"
        )
    tg = mixed["targets"] + targets(ours)
    from bench import broker_bench

    broker_rows, broker_targets = broker_bench.run()
    tg += broker_targets
    from bench import produce_bench

    data_rows = produce_bench.run(args.produce_messages) if args.produce_messages > 0 else []
    if data_rows:
        tg.append(produce_bench.target(data_rows))
    group_rows, group_targets = (
        group_bench.run(args.group_seconds) if args.group_seconds > 0 else ([], [])
    )
    tg += group_targets
    audit_rows, audit_targets = (
        audit_bench.run(args.audit_records, audit_bench.default_work())
        if args.audit_records > 0
        else ([], [])
    )
    tg += audit_targets

    print("## commit path, interleaved rounds (bench/interleave.py)\n")
    print(interleave.table(mixed))
    print("\n## pykraft controller (3 controllers, fsync always, 3 SimBrokers)\n")
    print(cb.table(ours))
    print("\n## brokers: metadata propagation and replay (bench/broker_bench.py)\n")
    print(broker_bench.table(broker_rows, []))
    if data_rows:
        print("\n## data plane: produce/consume, 1 KB messages, RF 3 (bench/produce_bench.py)\n")
        print(produce_bench.table(data_rows))
    if group_rows:
        print("\n## group coordinator: offset commits and rebalances (bench/group_bench.py)\n")
        print(group_bench.table(group_rows))
    if audit_rows:
        print("\n" + audit_bench.markdown(audit_rows, audit_targets))
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
                "results": ours + broker_rows + data_rows + group_rows + audit_rows,
                "interleaved": mixed,
                "targets": tg,
                "notes": notes,
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
