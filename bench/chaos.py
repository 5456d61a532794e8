"""``python -m bench.chaos --rounds N``: a chaos soak of a real local cluster (3 controllers,
3 brokers on loopback behind cuttable proxies) under a topic workload.

Each round injects one fault (kinds cycle in a shuffled order: kill -9 + restart of a controller
or broker, a controller crash-restart in the middle of an election, SIGSTOP/SIGCONT longer than
the election and session timeouts, the active controller partitioned away with reset or stalled
links, the active controller SIGSTOPped or silently stalled for two session timeouts, a
controller's disk filled until it exits 3 then freed, a controller's directory wiped, its refused
start checked and ``kraft storage recover --from-peers`` run), heals it and waits until the
cluster is healthy again. The full disk is a real ENOSPC on a tmpfs per controller: it needs
root, and is left out (said on stderr) where mounting is not allowed. Every run has the last two (a run shorter than a
cycle starts with them). Then the history checker runs (tests/chaos/history.py), availability
included (all brokers fenced, or a partition leaderless longer than a session timeout with its
replicas and a controller majority unfaulted): anomalies must be 0.

Prints progress on stderr, a markdown table on stdout and, as the LAST stdout line, one JSON line
``{"system": "pykraft", "bench": "chaos", ...}`` (see ``ChaosReport.summary``). Exit status 1 when
the checker found anomalies.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.chaos.disk import can_mount
from tests.chaos.runner import ChaosRun

ALWAYS = ("pause-leader", "stall-leader")  # in every run, however short


def schedule(rounds: int, seed: int, kinds: tuple[str, ...]) -> list[str]:
    """``rounds`` fault kinds: every kind once per cycle, each cycle shuffled; the kinds in
    :data:`ALWAYS` lead the first cycle when the run is shorter than one."""
    rng = random.Random(seed)
    out: list[str] = []
    while len(out) < rounds:
        cycle = list(kinds)
        rng.shuffle(cycle)
        if not out and rounds < len(cycle):
            cycle = [*ALWAYS, *(k for k in cycle if k not in ALWAYS)]
        out += cycle
    return out[:rounds]


def table(summary: dict[str, Any], wall_s: float) -> str:
    rec = summary["recovery_s"]
    ops = summary["operations"]
    rows = [
        ("rounds", summary["rounds"]),
        ("faults by kind", ", ".join(f"{k} {v}" for k, v in sorted(summary["faults"].items()))),
        (
            "operations acknowledged / failed / indeterminate",
            f"{ops['ok']} / {ops['fail']} / {ops['info']}",
        ),
        ("anomalies (availability rule included)", summary["anomalies"]),
        ("healthy brokers fenced (session timeout)", summary["healthy_broker_fences"]),
        (
            "disk rounds: outcome",
            ", ".join(f"{k} ({v})" for k, v in sorted(summary["disk_outcomes"].items())) or "-",
        ),
        (
            "recovery after a fault p50 / p99 / max (s)",
            f"{rec['p50']} / {rec['p99']} / {rec['max']}",
        ),
        (
            "recovery p50 by kind (s)",
            ", ".join(f"{k} {v}" for k, v in sorted(summary["recovery_s_by_kind"].items())),
        ),
        (
            "writes to an isolated leader",
            ", ".join(f"{k} {v}" for k, v in summary["minority_writes"].items()) or "-",
        ),
        ("majority elects a new leader, p50 (s)", summary["majority_election_s_p50"]),
        ("raft terms seen", summary["raft_terms_seen"]),
        ("final metadata offset", summary["final_metadata_offset"]),
        ("wall time (s)", round(wall_s, 1)),
    ]
    lines = ["| chaos | value |", "|---|---|"] + [f"| {k} | {v} |" for k, v in rows]
    return "\n".join(lines)


def _stop_requested() -> list[bool]:
    """A list that becomes non-empty (truthy) on SIGINT/SIGTERM, so a soak ends with a verdict."""
    flag: list[bool] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: flag.append(True))
    return flag


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=14, help="faults to inject (default 14)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--brokers", type=int, default=3)
    parser.add_argument("--workers", type=int, default=3, help="concurrent workload clients")
    parser.add_argument(
        "--op-pause",
        type=float,
        default=0.2,
        help="seconds each workload client waits between operations",
    )
    parser.add_argument("--dir", help="cluster directory (default: a fresh temporary one)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    directory = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="pykraft-chaos-"))
    start = time.monotonic()

    def log(msg: str) -> None:
        print(f"[{time.monotonic() - start:7.1f}s] {msg}", file=sys.stderr, flush=True)

    log(f"cluster in {directory}")
    disk_faults = can_mount()
    if not disk_faults:
        log("cannot mount a tmpfs here (needs root): no full-disk rounds")
    with ChaosRun(
        directory / "cluster",
        seed=args.seed,
        brokers=args.brokers,
        workers=args.workers,
        log=log,
        op_pause_s=args.op_pause,
        disk_faults=disk_faults,
    ) as run:
        log("cluster ready; workload running (Ctrl-C: stop after this round and check)")
        stop = _stop_requested()
        for kind in schedule(args.rounds, args.seed, run.kinds):
            if stop:
                log("stopping early")
                break
            run.run_round(kind)
        report = run.finish()
    summary = report.summary()
    wall = time.monotonic() - start
    for a in summary["anomaly_details"]:
        log(f"ANOMALY {a}")
    print(table(summary, wall))
    print(
        json.dumps(
            {
                "system": "pykraft",
                "bench": "chaos",
                "seed": args.seed,
                "wall_s": round(wall, 1),
                **summary,
            }
        )
    )
    if summary["anomalies"]:
        log(f"logs and data kept in {directory}")
        return 1
    if not args.dir:
        shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
