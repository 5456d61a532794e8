"""Longer fuzzing runs against a live controller RPC port and a live broker Kafka listener.

The same generators as ``tests/test_fuzz_rpc.py`` / ``tests/test_fuzz_kafka_listener.py``
(mutations of valid requests, random field values, random bytes), driven by a seeded
``random.Random`` for ``--seconds`` per target instead of hypothesis' fixed example budget.
Every 25 inputs a fresh client must be answered (its latency is recorded) and the server's RSS
is sampled.

    python bench/fuzz.py --seconds 60 [--target rpc|kafka|raft|kafka-preauth|both|all] [--seed 1]

``raft`` sends a controller's Raft port what a process without the cluster secret could
(``test_fuzz_rpc.raft_input``); ``kafka-preauth`` sends a broker's SASL listener what a client
that has not logged in could (``test_fuzz_kafka_listener.preauth_input``). ``rss_max_mb`` is the
peak RSS sampled every 25 inputs; ``rss_peak_mb`` the kernel's high-water mark of the target
process (``VmHWM``: its peak resident set since it started, spikes between samples included).

Prints a markdown table and, as the last stdout line, ``{"system": "pykraft-fuzz", "results": [...]}``.
A result with ``crashed``, ``internal_errors``, ``unhealthy_checks`` or ``refused_connections``
non-zero is a finding (stderr shows the input, in hex, that preceded a dead server).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import struct
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "tests" / "integration"))  # the fuzz tests whose seeds it reuses

from harness import LocalCluster, kraft, poll  # noqa: E402  (after the sys.path set-up above)
from test_fuzz_kafka_listener import SEEDS as KAFKA_SEEDS  # noqa: E402  (after the sys.path set-up above)
from test_fuzz_kafka_listener import (  # noqa: E402  (after the sys.path set-up above)
    TOPIC,
    Broker,
    SaslBroker,
    preauth_input,
    send_and_drain,
)
from test_fuzz_rpc import (  # noqa: E402  # noqa: E402  (after the sys.path set-up above)
    SEED_REQUESTS,
    Controller,
    exchange,
    mutate,
    raft_input,
    retype,
    seed_frame,
    send_raw,
)

from kraft.errors import ErrorCode  # noqa: E402  (after the sys.path set-up above)
from kraft.rpc.framing import encode_frame  # noqa: E402  (after the sys.path set-up above)

CHECK_EVERY = 25


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(round(p / 100 * len(s))) - 1))] if s else float("nan")


def random_value(rng: random.Random, depth: int = 0) -> Any:
    """A random msgpack-able value (nested lists/maps up to depth 2)."""
    kind = rng.randrange(8 if depth < 2 else 6)
    if kind == 6:
        return [random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    if kind == 7:
        return {
            str(rng.randint(0, 99)): random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))
        }
    return (
        None,
        rng.random() < 0.5,
        rng.randint(-(2**63), 2**63 - 1),
        rng.random() * 1e9,
        rng.randbytes(rng.randint(0, 20)).decode("latin-1"),
        rng.randbytes(rng.randint(0, 20)),
    )[kind]


def rpc_input(rng: random.Random) -> bytes:
    choice = rng.random()
    index = rng.randrange(len(SEED_REQUESTS))
    if choice < 0.5:
        mutated: bytes = mutate(seed_frame(index), rng)
        return mutated
    if choice < 0.85:
        request = dict(SEED_REQUESTS[index], version=0, correlation_id=1)
        return encode_frame(retype(request, rng, random_value(rng)))
    return rng.randbytes(rng.randint(0, 300))


def kafka_input(rng: random.Random) -> bytes:
    if rng.random() < 0.8:
        seed: bytes = mutate(rng.choice(KAFKA_SEEDS), rng, rounds=4)
        return seed
    blob = rng.randbytes(rng.randint(0, 300))
    return struct.pack(">i", len(blob)) + blob if rng.random() < 0.5 else blob


def run_target(
    name: str,
    seconds: float,
    seed: int,
    send: Callable[[bytes], list[dict[str, Any]]],
    make_input: Callable[[random.Random], bytes],
    healthy: Callable[[], None],
    rss: Callable[[], int],
    alive: Callable[[], bool],
    peak: Callable[[], int] = lambda: 0,
) -> dict[str, Any]:
    rng = random.Random(seed)
    healthy()
    base_rss = max_rss = rss()
    latencies: list[float] = []
    sent = internal = unhealthy = refused = 0
    started = time.monotonic()
    while time.monotonic() - started < seconds and alive():
        data = make_input(rng)
        try:
            answers = send(data)
        except OSError as e:  # refused or reset: did the server die?
            refused += 1
            deadline = time.monotonic() + 5
            while alive() and time.monotonic() < deadline:
                time.sleep(0.1)
            print(
                f"[{name}] connection failed after {sent} inputs ({e!r}); alive: {alive()}; "
                f"last input: {data.hex()}",
                file=sys.stderr,
            )
            continue
        internal += sum(1 for a in answers if a.get("error_code") == ErrorCode.UNKNOWN_SERVER_ERROR)
        sent += 1
        if sent % CHECK_EVERY == 0:
            t = time.monotonic()
            try:
                healthy()
                latencies.append((time.monotonic() - t) * 1000)
            except Exception as e:
                unhealthy += 1
                print(f"[{name}] health check failed after {sent} inputs: {e!r}", file=sys.stderr)
            max_rss = max(max_rss, rss())
    return {
        "target": name,
        "seconds": round(time.monotonic() - started, 1),
        "seed": seed,
        "inputs": sent,
        "inputs_per_s": round(sent / max(time.monotonic() - started, 1e-9)),
        "crashed": not alive(),
        "internal_errors": internal,
        "unhealthy_checks": unhealthy,
        "refused_connections": refused,
        "health_p50_ms": round(pct(latencies, 50), 1),
        "health_p99_ms": round(pct(latencies, 99), 1),
        "rss_start_mb": round(base_rss / 2**20, 1),
        "rss_max_mb": round(max_rss / 2**20, 1),
        "rss_peak_mb": round(peak() / 2**20, 1),
    }


def fuzz_rpc(seconds: float, seed: int, workdir: Path) -> dict[str, Any]:
    controller = Controller(workdir)
    try:
        return run_target(
            "controller-rpc",
            seconds,
            seed,
            lambda data: exchange(controller.rpc_port, data, wait=0.5)[0],
            rpc_input,
            controller.assert_healthy,
            controller.rss,
            lambda: controller.proc.poll() is None,
            controller.peak_rss,
        )
    finally:
        controller.stop()


def fuzz_kafka(seconds: float, seed: int, workdir: Path) -> dict[str, Any]:
    cluster = LocalCluster(workdir / "c")
    try:
        cluster.up(1, 1, "--fsync", "never")
        kraft(
            "topics",
            "create",
            TOPIC,
            "--partitions",
            "1",
            "--replication-factor",
            "1",
            "--cluster",
            str(cluster.dir),
        )
        broker = Broker(cluster)

        def send(data: bytes) -> list[dict[str, Any]]:
            send_and_drain(broker.port, data, wait=0.5)
            return []

        poll(lambda: broker.assert_healthy() is None, 60, what="the broker to know the topic")
        return run_target(
            "broker-kafka-listener",
            seconds,
            seed,
            send,
            kafka_input,
            broker.assert_healthy,
            broker.rss,
            broker.ps.is_running,
            broker.peak_rss,
        )
    finally:
        cluster.down()


def _raft_send(port: int, data: bytes) -> list[dict[str, Any]]:
    send_raw(port, data, wait=0.2)
    return []


def fuzz_raft(seconds: float, seed: int, workdir: Path) -> dict[str, Any]:
    controller = Controller(workdir)
    before = controller.quorum()

    def healthy() -> None:
        controller.assert_healthy()
        assert controller.quorum() == before, "the Raft leader or term changed"

    try:
        return run_target(
            "controller-raft-preauth",
            seconds,
            seed,
            lambda data: _raft_send(controller.raft_port, data),
            raft_input,
            healthy,
            controller.rss,
            lambda: controller.proc.poll() is None,
            controller.peak_rss,
        )
    finally:
        controller.stop()


def fuzz_kafka_preauth(seconds: float, seed: int, workdir: Path) -> dict[str, Any]:
    from kraft.rpc.auth import hash_password

    cluster = LocalCluster(workdir / "c")
    try:
        cluster.up(1, 1, "--fsync", "never")
        users = workdir / "kafka-users"
        users.write_text(f"fuzz:{hash_password('fuzz-pw', iterations=1000)}\n")
        cluster.use_sasl_listener(101, users)
        broker = SaslBroker(cluster)

        def send(data: bytes) -> list[dict[str, Any]]:
            send_and_drain(broker.port, data, wait=0.3)
            return []

        return run_target(
            "broker-kafka-preauth",
            seconds,
            seed,
            send,
            preauth_input,
            broker.assert_healthy,
            broker.rss,
            broker.ps.is_running,
            broker.peak_rss,
        )
    finally:
        cluster.down()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--seconds", type=float, default=60.0, help="fuzzing time per target (default 60)"
    )
    p.add_argument(
        "--target",
        choices=("rpc", "kafka", "raft", "kafka-preauth", "both", "all"),
        default="both",
        help="both = rpc + kafka; all = every target",
    )
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="pykraft-fuzz-"))
    results = []
    try:
        if args.target in ("rpc", "both", "all"):
            (workdir / "rpc").mkdir()
            results.append(fuzz_rpc(args.seconds, args.seed, workdir / "rpc"))
        if args.target in ("kafka", "both", "all"):
            results.append(fuzz_kafka(args.seconds, args.seed, workdir))
        if args.target in ("raft", "all"):
            (workdir / "raft").mkdir()
            results.append(fuzz_raft(args.seconds, args.seed, workdir / "raft"))
        if args.target in ("kafka-preauth", "all"):
            (workdir / "preauth").mkdir()
            results.append(fuzz_kafka_preauth(args.seconds, args.seed, workdir / "preauth"))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    keys = list(results[0])
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for r in results:
        print("| " + " | ".join(str(r[k]) for k in keys) + " |")
    print(json.dumps({"system": "pykraft-fuzz", "results": results}))
    bad = any(
        r["crashed"] or r["internal_errors"] or r["unhealthy_checks"] or r["refused_connections"]
        for r in results
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
