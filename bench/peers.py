"""The peer systems the commit path is compared with, run through the shared runners in
/work/shared/bench/peers/ (3 nodes each, on this machine): bare PySyncObj (msync storage,
batching off, in-process client) and etcd (fsync, grpc client to the leader), each in seq and
32-in-flight modes with ``--quick``. Their rows are reshaped into pykraft's bench rows."""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

from bench.common import REPO, logger

log = logger("peers")

RUNNERS: dict[str, tuple[str, list[str]]] = {
    "pysyncobj": (
        "/work/shared/bench/peers/run_pysyncobj.py",
        [
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
        ],
    ),
    "etcd": (
        "/work/shared/bench/peers/run_etcd.py",
        ["--clients", "grpc", "--modes", "seq,inflight", "--quick", "--quiet-wait", "5"],
    ),
}
LABELS = {"pysyncobj": "bare PySyncObj", "etcd": "etcd"}


def run_peer(system: str, timeout_s: float) -> tuple[list[dict[str, Any]], str | None]:
    """``system``'s 3-node commit-path rows, or ([], note) when it could not be measured in
    time (no runner here, a timeout, or output without its JSON line)."""
    runner, args = RUNNERS[system]
    label = LABELS[system]
    if not os.path.exists(runner):
        return [], f"{label} not measured: {runner} not found"
    log(f"{label}: running {runner} {' '.join(args)} (timeout {timeout_s:.0f}s)")
    try:
        proc = subprocess.run(
            ["python3", runner, *args],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            cwd=REPO,
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
    rows = [
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
        for r in doc.get("results", [])
    ]
    log(f"{label}: {[(r['mode'], r['ops_s']) for r in rows]}")
    return rows, None
