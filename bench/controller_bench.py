"""Controller benchmark: a real 3-controller cluster (fsync always) + 3 SimBrokers.

The simulated brokers (``python -m testsupport.sim_broker``: real registration, heartbeats and
FetchMetadata long-polls replaying the log) run in a process of their own, as brokers do: hosted
in the benchmark's client process, their replay of every commit delayed the client's own
responses on the shared event loop (sequential p50 ~5-7 ms instead of ~3-4 ms, same minutes).

Measures (progress on stderr):
  1. small-command commit throughput: IncrementalAlterConfigs SET on one topic,
     (a) sequential single client, (b) 32 in flight (32 trio tasks over 4 clients);
  2. create-topic throughput (1- and 100-partition topics, RF 3, 32 in flight) and the
     wall time to create 1,000 topics x 10 partitions RF 3;
  3. failover: kill -9 the active controller, time until the next config SET commits; restart it.

``run(args) -> list[dict]`` returns result rows; ``main()`` prints a markdown table and, as the last
stdout line, ``{"system": "pykraft", "results": [...]}``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from kraft.errors import KraftError
from kraft.rpc.client import ControllerClient

REPO = Path(__file__).resolve().parent.parent
CONFIG = "fsync=always"
#: what run() can measure: the small-command commit path, topic creation, failover
PHASES = ("small", "topics", "failover")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def pct(sorted_vals: list[float], p: float) -> float | None:
    """Nearest-rank percentile of an ascending list."""
    if not sorted_vals:
        return None
    k = max(1, -(-len(sorted_vals) * p // 100))
    return sorted_vals[int(min(k, len(sorted_vals))) - 1]


def pct_ms(sorted_vals: list[float], p: float) -> float | None:
    """:func:`pct` in milliseconds, rounded to 0.01 ms."""
    v = pct(sorted_vals, p)
    return None if v is None else round(v * 1000, 2)


def _errors_in(resp: Any) -> list[int]:
    """Every non-zero error_code anywhere in a response document."""
    out: list[int] = []
    if isinstance(resp, dict):
        ec = resp.get("error_code")
        if ec:
            out.append(ec)
        for v in resp.values():
            if isinstance(v, (dict, list)):
                out.extend(_errors_in(v))
    elif isinstance(resp, list):
        for v in resp:
            out.extend(_errors_in(v))
    return out


def cli(*argv: str, timeout: float) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "tools.cli", *argv]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)


def set_body(topic: str, value: int) -> dict[str, Any]:
    return {
        "resources": [
            {
                "resource_type": "topic",
                "resource_name": topic,
                "ops": [{"name": "retention.ms", "op": "SET", "value": str(value)}],
            }
        ]
    }


class Bench:
    def __init__(
        self,
        directory: Path,
        phase_s: float,
        inflight: int,
        failovers: int,
        failover_budget_s: float,
        phases: tuple[str, ...] = ("small", "topics", "failover"),
    ) -> None:
        self.dir = directory
        self.phases = phases
        self.phase_s = phase_s
        self.inflight = inflight
        self.failovers = failovers
        self.failover_budget_s = failover_budget_s
        self.results: list[dict[str, Any]] = []
        self.meta: dict[str, Any] = {}
        self.bootstrap: list[tuple[str, int]] = []
        self._counter = 0

    def _next(self) -> int:
        self._counter += 1
        return self._counter

    def load_meta(self) -> None:
        self.meta = json.loads((self.dir / "cluster.json").read_text())
        self.bootstrap = [(c["host"], c["rpc_port"]) for c in self.meta["controllers"]]

    def row(
        self,
        metric: str,
        mode: str,
        clients: int,
        lat: list[float],
        ok: int,
        errors: int,
        elapsed: float,
        unit: str = "ops",
        per_op: int = 1,
        **extra: Any,
    ) -> dict[str, Any]:
        lat = sorted(lat)
        r = {
            "system": "pykraft",
            "config": CONFIG,
            "metric": metric,
            "mode": mode,
            "clients": clients,
            "ops_s": round(ok / elapsed, 1) if elapsed > 0 else None,
            "p50_ms": pct_ms(lat, 50),
            "p99_ms": pct_ms(lat, 99),
            "errors": errors,
            "count": ok,
            "seconds": round(elapsed, 3),
            "unit": unit,
        }
        if per_op != 1:
            r["partitions_s"] = round(ok * per_op / elapsed, 1) if elapsed > 0 else None
        r.update(extra)
        self.results.append(r)
        log(
            f"  -> {metric} {mode}: {r['ops_s']} {unit}/s p50={r['p50_ms']}ms p99={r['p99_ms']}ms "
            f"n={ok} errors={errors}"
        )
        return r

    # ---- load drivers -------------------------------------------------------------------
    async def drive(
        self,
        clients: list[ControllerClient],
        concurrency: int,
        make_req: Callable[[int], tuple[str, dict[str, Any]]],
        duration_s: float | None,
        total: int | None,
        deadline_s: float,
    ) -> tuple[list[float], int, int, float, bool]:
        """Run ``concurrency`` tasks issuing ``make_req(i) -> (api, body)`` until ``duration_s``
        passes or ``total`` requests have been issued; hard deadline ``deadline_s``."""
        lat: list[float] = []
        ok = 0
        errors = 0
        issued = 0
        start = time.perf_counter()
        stop_at = start + duration_s if duration_s else None

        async def worker(w: int) -> None:
            nonlocal ok, errors, issued
            client = clients[w % len(clients)]
            while True:
                if total is not None and issued >= total:
                    return
                if stop_at is not None and time.perf_counter() >= stop_at:
                    return
                i = issued
                issued += 1
                api, body = make_req(i)
                t0 = time.perf_counter()
                try:
                    resp = await client.call(api, body, timeout=10)
                    bad: list[Any] = _errors_in(resp)
                except (KraftError, trio.TooSlowError, OSError) as e:
                    bad = [repr(e)]
                t1 = time.perf_counter()
                if stop_at is not None and t1 > stop_at:
                    return  # only count requests completing inside the window
                if bad:
                    errors += 1
                    if errors <= 3:
                        log(f"    error: {bad[:3]}")
                else:
                    ok += 1
                    lat.append(t1 - t0)

        with trio.move_on_after(deadline_s) as cs:
            async with trio.open_nursery() as n:
                for w in range(concurrency):
                    n.start_soon(worker, w)
        elapsed = time.perf_counter() - start
        if duration_s:
            elapsed = min(elapsed, duration_s)
        return lat, ok, errors, elapsed, cs.cancelled_caught

    # ---- phases -------------------------------------------------------------------------
    async def phase_small(self, clients: list[ControllerClient]) -> None:
        topic = "bench-configs"
        make = lambda i: ("IncrementalAlterConfigs", set_body(topic, 100000 + self._next()))
        # warmup
        await self.drive(clients[:1], 1, make, 1.0, None, 15)
        log(f"phase 1a: sequential IncrementalAlterConfigs SET for {self.phase_s}s")
        lat, ok, err, el, _ = await self.drive(
            clients[:1], 1, make, self.phase_s, None, self.phase_s + 15
        )
        self.row("small_command", "seq", 1, lat, ok, err, el)
        log(f"phase 1b: {self.inflight} in flight IncrementalAlterConfigs SET for {self.phase_s}s")
        lat, ok, err, el, _ = await self.drive(
            clients, self.inflight, make, self.phase_s, None, self.phase_s + 15
        )
        self.row("small_command", "inflight", self.inflight, lat, ok, err, el)

    async def phase_topics(self, clients: list[ControllerClient]) -> None:
        for parts in (1, 100):
            prefix = f"bt{parts}-"
            make = (
                lambda p, pre: (
                    lambda i: (
                        "CreateTopics",
                        {
                            "topics": [
                                {"name": f"{pre}{i}", "num_partitions": p, "replication_factor": 3}
                            ]
                        },
                    )
                )
            )(parts, prefix)
            log(
                f"phase 2: create {parts}-partition topics, {self.inflight} in flight, {self.phase_s}s"
            )
            lat, ok, err, el, _ = await self.drive(
                clients, self.inflight, make, self.phase_s, None, self.phase_s + 15
            )
            self.row(
                f"create_topics_{parts}p",
                "inflight",
                self.inflight,
                lat,
                ok,
                err,
                el,
                unit="topics",
                per_op=parts,
            )
        n_topics, parts = 1000, 10
        log(
            f"phase 2c: create {n_topics} topics x {parts} partitions RF 3, {self.inflight} in flight "
            f"(deadline 60s)"
        )
        make = lambda i: (
            "CreateTopics",
            {"topics": [{"name": f"bk-{i}", "num_partitions": parts, "replication_factor": 3}]},
        )
        lat, ok, err, el, timed_out = await self.drive(
            clients, self.inflight, make, None, n_topics, 60
        )
        self.row(
            "create_1000x10",
            "inflight",
            self.inflight,
            lat,
            ok,
            err,
            el,
            unit="topics",
            per_op=parts,
            completed=ok == n_topics and not timed_out,
        )

    async def _leader_id(self, client: ControllerClient) -> int | None:
        try:
            resp = await client.call("DescribeQuorum", {}, timeout=3)
            return resp.get("leader_id")
        except (KraftError, trio.TooSlowError, OSError):
            return None

    async def _wait_healthy(self, client: ControllerClient, timeout_s: float) -> bool:
        """A leader exists and every voter's lag is known and small."""
        with trio.move_on_after(timeout_s):
            while True:
                try:
                    resp = await client.call("DescribeQuorum", {}, timeout=3)
                    self._last_quorum = resp
                    voters = resp.get("voters", [])
                    ci = resp.get("commit_index") or 0
                    if (
                        resp.get("leader_id") is not None
                        and len(voters) == 3
                        and all(
                            v.get("raft_match_index") is not None
                            and v["raft_match_index"] >= ci - 50
                            and (v.get("last_contact_ms") or 0) < 2000
                            for v in voters
                        )
                    ):
                        return True
                except (KraftError, trio.TooSlowError, OSError):
                    pass
                await trio.sleep(0.2)
        return False

    async def phase_failover(self) -> None:
        topic = "bench-configs"
        times: list[float] = []
        failures = 0
        phase_start = time.perf_counter()
        admin = ControllerClient(self.bootstrap, client_id="bench-failover-admin")
        try:
            for round_no in range(1, self.failovers + 1):
                if time.perf_counter() - phase_start > self.failover_budget_s:
                    log(
                        f"phase 3: budget {self.failover_budget_s}s used, stopping after "
                        f"{len(times)} failovers"
                    )
                    break
                if not await self._wait_healthy(admin, 30):
                    log(
                        f"phase 3: quorum not healthy within 30s; stopping; last DescribeQuorum: "
                        f"{getattr(self, '_last_quorum', None)}"
                    )
                    break
                leader = await self._leader_id(admin)
                self.load_meta()
                node = next((c for c in self.meta["controllers"] if c["id"] == leader), None)
                if node is None or not node.get("pid"):
                    log(f"phase 3: cannot find pid of leader {leader}; stopping")
                    break
                # A fresh writer client, warmed on the current leader, as a real admin would be.
                writer = ControllerClient(
                    self.bootstrap, client_id=f"bench-failover-{round_no}", request_timeout=1.0
                )
                try:
                    await writer.call(
                        "IncrementalAlterConfigs", set_body(topic, 500000 + self._next()), timeout=5
                    )
                    os.kill(node["pid"], signal.SIGKILL)
                    t0 = time.perf_counter()
                    committed = None
                    with trio.move_on_after(30):
                        while True:
                            try:
                                resp = await writer.call(
                                    "IncrementalAlterConfigs",
                                    set_body(topic, 500000 + self._next()),
                                    timeout=1.0,
                                )
                                if not _errors_in(resp):
                                    committed = time.perf_counter() - t0
                                    break
                            except (KraftError, trio.TooSlowError, OSError):
                                pass
                            await trio.sleep(0.01)
                finally:
                    await writer.aclose()
                if committed is None:
                    failures += 1
                    log(f"  failover {round_no}: killed node {leader}, no commit within 30s")
                else:
                    times.append(committed)
                    log(
                        f"  failover {round_no}: killed node {leader}, next write committed after "
                        f"{committed:.3f}s"
                    )
                restarted = await trio.to_thread.run_sync(
                    functools.partial(
                        cli,
                        "cluster",
                        "start",
                        "--dir",
                        str(self.dir),
                        "--node",
                        str(leader),
                        timeout=60,
                    )
                )
                if restarted.returncode != 0:
                    log(f"  restart of node {leader} failed: {restarted.stderr.strip()[-300:]}")
                    break
                self.load_meta()
        finally:
            await admin.aclose()
        times_sorted = sorted(times)
        median = pct(times_sorted, 50)
        r: dict[str, Any] = {
            "system": "pykraft",
            "config": CONFIG,
            "metric": "failover",
            "mode": "kill -9 leader",
            "clients": 1,
            "count": len(times),
            "requested": self.failovers,
            "errors": failures,
            "median_s": None if median is None else round(median, 3),
            "max_s": round(max(times), 3) if times else None,
            "seconds": [round(t, 3) for t in times],
        }
        # true median (mean of the middle two for an even count)
        if times:
            m = len(times_sorted)
            r["median_s"] = round((times_sorted[(m - 1) // 2] + times_sorted[m // 2]) / 2, 3)
        self.results.append(r)
        log(f"  -> failover: n={len(times)} median={r['median_s']}s max={r['max_s']}s")

    async def main_async(self) -> None:
        clients = [ControllerClient(self.bootstrap, client_id=f"bench-{i}") for i in range(4)]
        try:
            resp = await clients[0].call(
                "CreateTopics",
                {
                    "topics": [
                        {"name": "bench-configs", "num_partitions": 1, "replication_factor": 3}
                    ]
                },
                timeout=20,
            )
            if _errors_in(resp):
                raise RuntimeError(f"cannot create bench topic: {resp}")
            if "small" in self.phases:
                await self.phase_small(clients)
            if "topics" in self.phases:
                await self.phase_topics(clients)
        finally:
            for c in clients:
                await c.aclose()
        if "failover" in self.phases:
            await self.phase_failover()


def start_sim_brokers(
    directory: Path, count: int = 3, timeout_s: float = 60
) -> subprocess.Popen[str]:
    """``count`` simulated brokers in a process of their own; returns once all are unfenced."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "testsupport.sim_broker",
            "--cluster",
            str(directory),
            "--count",
            str(count),
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    deadline = time.monotonic() + timeout_s
    assert proc.stdout is not None
    while time.monotonic() < deadline and proc.poll() is None:
        readable, _, _ = select.select([proc.stdout], [], [], 0.1)
        if readable and proc.stdout.readline().strip() == "ready":
            return proc
    stop_process(proc)
    raise RuntimeError(
        f"simulated brokers not unfenced within {timeout_s}s (exit {proc.returncode})"
    )


def stop_process(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def run(
    phase_s: float = 5.0,
    inflight: int = 32,
    failovers: int = 10,
    failover_budget_s: float = 120.0,
    keep: bool = False,
    phases: tuple[str, ...] = PHASES,
    linger_ms: int | None = None,
    sim_brokers: int = 3,
    linger_per_broker_ms: float | None = None,
) -> list[dict[str, Any]]:
    """``phases`` (of :data:`PHASES`) on a fresh cluster (``linger_ms``, ``linger_per_broker_ms``:
    its controllers' ``metadata.fetch.linger.ms`` and ``metadata.fetch.linger.per.broker.ms``,
    else the defaults): its result rows."""
    directory = Path(tempfile.mkdtemp(prefix="pykraft-bench-"))
    bench = Bench(directory, phase_s, inflight, failovers, failover_budget_s, phases)
    try:
        log(f"starting 3-controller cluster (fsync always) in {directory}")
        r = cli(
            "cluster",
            "up",
            "--no-auth",  # benchmarks run anonymous clients and sim brokers
            "--dir",
            str(directory),
            "--controllers",
            "3",
            "--detach",
            "--fsync",
            "always",
            timeout=120,
        )
        if r.returncode != 0:
            raise RuntimeError(f"cluster up failed: {r.stderr.strip()[-500:]}")
        from bench.broker_bench import set_linger

        meta = json.loads((directory / "cluster.json").read_text())
        set_linger(directory, meta, linger_ms, linger_per_broker_ms)
        bench.load_meta()
        log(f"starting {sim_brokers} SimBrokers (own process), waiting for them to be unfenced")
        sims = start_sim_brokers(directory, sim_brokers, timeout_s=60 + sim_brokers)
        try:
            trio.run(bench.main_async)
        finally:
            stop_process(sims)
    finally:
        log("stopping cluster")
        try:
            r = cli("cluster", "down", "--dir", str(directory), timeout=90)
            if r.returncode != 0:
                log(f"cluster down: {r.stderr.strip()[-300:]}")
        except subprocess.TimeoutExpired:
            log("cluster down timed out; killing controller pids")
        finally:
            try:
                meta = json.loads((directory / "cluster.json").read_text())
                for c in meta.get("controllers", []):
                    if c.get("pid"):
                        try:
                            os.kill(c["pid"], signal.SIGKILL)
                        except ProcessLookupError:
                            pass
            except (OSError, ValueError):
                pass
            if not keep:
                shutil.rmtree(directory, ignore_errors=True)
    return bench.results


def table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| metric | mode | clients | ops/s (topics/s) | partitions/s | p50 ms | p99 ms | "
        "count | seconds | errors |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        if r["metric"] == "failover":
            lines.append(
                f"| failover (median / max s) | {r['mode']} | 1 | | | | | {r['count']} | "
                f"{r['median_s']} / {r['max_s']} | {r['errors']} |"
            )
        else:
            lines.append(
                f"| {r['metric']} | {r['mode']} | {r['clients']} | {r['ops_s']} | "
                f"{r.get('partitions_s', '')} | {r['p50_ms']} | {r['p99_ms']} | "
                f"{r['count']} | {r['seconds']} | {r['errors']} |"
            )
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--phase-s", type=float, default=5.0, help="seconds per measured phase (5)")
    ap.add_argument("--inflight", type=int, default=32)
    ap.add_argument("--failovers", type=int, default=10)
    ap.add_argument("--failover-budget-s", type=float, default=120.0)
    ap.add_argument("--keep", action="store_true", help="keep the cluster directory")
    ap.add_argument(
        "--phases", default=",".join(PHASES), help=f"comma-separated, of {', '.join(PHASES)}"
    )
    ap.add_argument(
        "--linger-ms", type=int, default=None, help="the controllers' metadata.fetch.linger.ms"
    )
    ap.add_argument("--sim-brokers", type=int, default=3, help="simulated brokers long-polling (3)")
    ap.add_argument(
        "--linger-per-broker-ms",
        type=float,
        default=None,
        help="the controllers' metadata.fetch.linger.per.broker.ms (a value >= the linger spaces "
        "every wake-up by the whole linger, as before it existed)",
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    phases = tuple(p for p in args.phases.split(",") if p)
    unknown = set(phases) - set(PHASES)
    if unknown:
        raise SystemExit(f"unknown phases: {', '.join(sorted(unknown))}; choose from {PHASES}")
    results = run(
        args.phase_s,
        args.inflight,
        args.failovers,
        args.failover_budget_s,
        args.keep,
        phases,
        args.linger_ms,
        args.sim_brokers,
        args.linger_per_broker_ms,
    )
    print(table(results))
    print(json.dumps({"system": "pykraft", "results": results}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
