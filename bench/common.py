"""What the benchmarks share: progress lines on stderr, the ``kraft`` CLI run as a subprocess, a
local cluster brought up for a measurement, and synthetic broker registrations for images."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
ENV = dict(os.environ, PYTHONPATH=str(REPO))


def logger(name: str = "") -> Callable[[str], None]:
    """A progress printer for stderr: ``[HH:MM:SS] name: msg`` (stdout carries the results)."""
    prefix = f"{name}: " if name else ""

    def log(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {prefix}{msg}", file=sys.stderr, flush=True)

    return log


def kraft(*args: str, timeout: float = 120, src: Path | None = None) -> str:
    """Run ``kraft ARGS`` from the repository (or the source tree ``src``: the processes it
    starts run that code); its stdout, or RuntimeError with stderr's tail."""
    proc = subprocess.run(
        [sys.executable, "-m", "tools.cli", *args],
        cwd=src or REPO,
        env=ENV if src is None else dict(os.environ, PYTHONPATH=str(src)),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"kraft {' '.join(args)}: {proc.stderr.strip()[-500:]}")
    return proc.stdout


def cluster_up(
    directory: Path,
    controllers: int = 3,
    brokers: int = 3,
    *extra: str,
    timeout: float = 300,
    src: Path | None = None,
) -> dict[str, Any]:
    """``kraft cluster up`` (detached, RPC auth off so the bench's own calls need no
    credentials; from the source tree ``src`` if given) and the cluster's ``cluster.json``."""
    kraft(
        "cluster",
        "up",
        "--dir",
        str(directory),
        "--controllers",
        str(controllers),
        "--brokers",
        str(brokers),
        "--detach",
        "--no-auth",
        *extra,
        timeout=timeout,
        src=src,
    )
    meta: dict[str, Any] = json.loads((directory / "cluster.json").read_text())
    return meta


def controller_addresses(meta: dict[str, Any]) -> list[tuple[str, int]]:
    """The controllers' RPC addresses from a ``cluster.json``."""
    return [(c["host"], c["rpc_port"]) for c in meta["controllers"]]


def synthetic_brokers(count: int) -> list[Any]:
    """RegisterBrokerRecords for brokers 1..count (one PLAINTEXT endpoint each, no rack):
    the broker half of a synthetic image."""
    from kraft.records import RegisterBrokerRecord

    return [
        RegisterBrokerRecord(
            b,
            str(uuid.UUID(int=b)),
            b,
            (
                {
                    "name": "PLAINTEXT",
                    "host": "127.0.0.1",
                    "port": 9000 + b,
                    "security_protocol": "PLAINTEXT",
                },
            ),
            (),
            None,
            False,
            False,
        )
        for b in range(1, count + 1)
    ]


def cluster_down(directory: Path, timeout: float = 90) -> None:
    """Best-effort ``kraft cluster down`` for a ``finally:``: a failure is reported, not raised,
    so it never hides the measurement's own error."""
    try:
        kraft("cluster", "down", "--dir", str(directory), "--timeout", "20", timeout=timeout)
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        print(f"cluster down {directory}: {exc}", file=sys.stderr, flush=True)


def process_cpu_s(pid: int) -> tuple[float, float]:
    """User and system CPU seconds a process has used so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def total_cpu_s(pids: Iterable[int]) -> float:
    """User + system CPU seconds the processes ``pids`` have used so far, together."""
    return sum(sum(process_cpu_s(pid)) for pid in pids)
