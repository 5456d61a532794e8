"""Election-timeout benchmark: failover time against false elections under CPU load.

One real 3-controller cluster (fsync always, no brokers) per setting under test
(``--election-timeout-ms A,B,...``: ``controller.quorum.election.timeout.ms``, the maximum; the
minimum is 0.4 of it and the leader's heartbeat period min(0.1 s, min/4), as the controller
derives them). All clusters run at the same time so that every setting sees the same machine.

  1. failover (``--failovers N``, default 10): kill -9 the active controller, time from the kill
     to the next committed write (IncrementalAlterConfigs SET of the cluster-wide
     log.retention.ms, retried every 10 ms); restart the
     killed node and wait until every voter has caught up before the next round (of any
     cluster: a starting node's CPU would slow the next failover). Rounds alternate between the clusters
     (A, B, B, A, ...), so both settings see the same load; median / p90 / max. The writer's
     retry back-off is capped at ``--client-backoff-max-ms`` (50; ControllerClient's own cap,
     1 s, would add up to its back-off to the figure). Two survivors are polled (DescribeNode,
     every 20 ms) for the split: kill -> a survivor leads a new Raft term -> it is the active
     controller (ActivateController committed) -> the write committed.
  2. false elections (``--minutes M``, default 10; 0 skips): ``--burners`` CPU burner processes
     (``python -c 'while True: pass'``, niceness ``--burner-nice``, default 0 = not niced) keep
     both cores at 100% while one client per cluster writes ``--rate`` SETs per second. Nothing
     is killed, so every Raft term increase (DescribeQuorum polled every second) is a false
     election; leader changes are counted too. Also: write latency p50/p99/max, the load
     average during the run, and the voters' pre-vote counters over it (rounds started,
     pre-votes refused, vote requests ignored by stickiness: kraft/quorum/prevote.py).

``--baseline-src DIR --baseline-ms A,...`` adds one cluster per value running another source
tree (e.g. ``git archive`` of the commit before a change), measured alongside in both phases.

Progress on stderr; stdout gets a markdown table and, as the last line,
``{"system": "pykraft", "results": [...]}``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from bench.common import cluster_down, cluster_up, controller_addresses, kraft, logger
from kraft.errors import KraftError
from kraft.rpc.client import ControllerClient

log = logger("election_bench")
KEY = "controller.quorum.election.timeout.ms"
#: the controller's derivation of the minimum (controller_server) and the heartbeat (raft.py)
MIN_RATIO = 0.4
MAX_HEARTBEAT_S = 0.1
#: RaftQuorum.stats() keys of kraft.quorum.prevote (summed over the voters, loaded run only)
PRE_VOTE_COUNTERS = (
    "pre_vote_rounds",
    "pre_votes_refused",
    "sticky_refusals",
    "leader_disconnects",
)
#: the loaded run's writes outstanding at most (a start beyond it is counted as skipped)
MAX_INFLIGHT = 64


def pct(sorted_vals: list[float], p: float) -> float | None:
    """Nearest-rank percentile of an ascending list."""
    if not sorted_vals:
        return None
    k = max(1, -(-len(sorted_vals) * p // 100))
    return sorted_vals[int(min(k, len(sorted_vals))) - 1]


def median(vals: list[float]) -> float | None:
    """The true median (mean of the middle two for an even count)."""
    s = sorted(vals)
    if not s:
        return None
    m = len(s)
    return (s[(m - 1) // 2] + s[m // 2]) / 2


def _rounded(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


def set_body(value: int) -> dict[str, Any]:
    return {
        "resources": [
            {
                "resource_type": "broker",
                "resource_name": "",  # the cluster-wide default: needs no topic or broker
                "ops": [{"name": "log.retention.ms", "op": "SET", "value": str(value)}],
            }
        ]
    }


def _errors_in(resp: Any) -> list[int]:
    """Every non-zero error_code anywhere in a response document."""
    out: list[int] = []
    if isinstance(resp, dict):
        if resp.get("error_code"):
            out.append(resp["error_code"])
        for v in resp.values():
            out.extend(_errors_in(v))
    elif isinstance(resp, list):
        for v in resp:
            out.extend(_errors_in(v))
    return out


def settings_of(election_ms: int) -> dict[str, Any]:
    """The quorum timings a controller derives from ``controller.quorum.election.timeout.ms``."""
    max_s = election_ms / 1000
    min_s = max_s * MIN_RATIO
    return {
        "election_timeout_ms": election_ms,
        "raft_min_timeout_s": round(min_s, 3),
        "raft_max_timeout_s": round(max_s, 3),
        "heartbeat_s": round(min(MAX_HEARTBEAT_S, min_s / 4), 3),
    }


def set_property(path: Path, key: str, value: str) -> None:
    """Set ``key=value`` in a properties file (replacing any earlier line for ``key``)."""
    lines = [ln for ln in path.read_text().splitlines() if not ln.startswith(f"{key}=")]
    path.write_text("\n".join([*lines, f"{key}={value}"]) + "\n")


class Cluster:
    """One 3-controller cluster running with one election-timeout setting."""

    def __init__(
        self, directory: Path, election_ms: int, backoff_max: float, src: Path | None = None
    ) -> None:
        self.dir = directory
        self.backoff_max = backoff_max
        self.election_ms = election_ms
        self.src = src  # another source tree to run (--baseline-src), else this one
        self.code = "this tree" if src is None else f"baseline {src}"
        self.label = f"{election_ms} ms" + ("" if src is None else " baseline")
        self.meta: dict[str, Any] = {}
        self.bootstrap: list[tuple[str, int]] = []
        self.counter = 0
        self.failovers: list[float] = []
        self.failover_errors = 0
        self.leader_elected: list[float] = []  # per round: kill -> a survivor leads a new term
        self.activated: list[float] = []  # kill -> that survivor is the active controller

    def up(self) -> None:
        """Bring the cluster up, then restart it with the setting under test."""
        cluster_up(self.dir, 3, 0, "--fsync", "always", src=self.src)
        kraft(
            "cluster", "down", "--dir", str(self.dir), "--timeout", "20", timeout=90, src=self.src
        )
        meta = json.loads((self.dir / "cluster.json").read_text())
        for c in meta["controllers"]:
            set_property(Path(c["config"]), KEY, str(self.election_ms))
        kraft("cluster", "start", "--dir", str(self.dir), "--wait", timeout=120, src=self.src)
        self.load_meta()

    def load_meta(self) -> None:
        self.meta = json.loads((self.dir / "cluster.json").read_text())
        self.bootstrap = controller_addresses(self.meta)

    def next_value(self) -> int:
        self.counter += 1
        return 500000 + self.counter

    async def describe(self, client: ControllerClient) -> dict[str, Any] | None:
        try:
            resp: dict[str, Any] = await client.call("DescribeQuorum", {}, timeout=3)
            return resp
        except (KraftError, trio.TooSlowError, OSError):
            return None

    async def wait_caught_up(self, client: ControllerClient, timeout_s: float) -> bool:
        """A leader exists and all three voters are within 50 entries of the commit index."""
        with trio.move_on_after(timeout_s):
            while True:
                resp = await self.describe(client)
                if resp is not None and (resp.get("leader_id") or -1) >= 0:
                    voters = resp.get("voters", [])
                    ci = resp.get("commit_index") or 0
                    if len(voters) == 3 and all(
                        v.get("raft_match_index") is not None
                        and v["raft_match_index"] >= ci - 50
                        and (v.get("last_contact_ms") or 0) < 2000
                        for v in voters
                    ):
                        return True
                await trio.sleep(0.2)
        return False

    async def failover_round(self, round_no: int) -> None:
        """Kill -9 the leader, time the next committed write, restart the node."""
        admin = ControllerClient(self.bootstrap, client_id=f"eb-admin-{round_no}")
        try:
            if not await self.wait_caught_up(admin, 60):
                raise RuntimeError(f"{self.label}: quorum not caught up within 60 s")
            resp = await self.describe(admin)
            leader = None if resp is None else resp.get("leader_id")
        finally:
            await admin.aclose()
        self.load_meta()
        node = next((c for c in self.meta["controllers"] if c["id"] == leader), None)
        if node is None or not node.get("pid"):
            raise RuntimeError(f"{self.label}: no pid for leader {leader}")
        writer = ControllerClient(
            self.bootstrap,
            client_id=f"eb-writer-{round_no}",
            request_timeout=1.0,
            backoff_max=self.backoff_max,
        )
        committed = None
        marks: dict[str, float] = {}
        survivors = [
            ControllerClient([(c["host"], c["rpc_port"])], client_id=f"eb-watch-{round_no}")
            for c in self.meta["controllers"]
            if c["id"] != leader
        ]
        term0 = None if resp is None else resp.get("term")
        try:
            await writer.call("IncrementalAlterConfigs", set_body(self.next_value()), timeout=5)
            async with trio.open_nursery() as watchers:
                os.kill(node["pid"], signal.SIGKILL)
                t0 = time.perf_counter()
                for sc in survivors:
                    watchers.start_soon(self._watch_survivor, sc, term0, t0, marks)
                with trio.move_on_after(30):
                    while True:
                        try:
                            r = await writer.call(
                                "IncrementalAlterConfigs", set_body(self.next_value()), timeout=1.0
                            )
                            if not _errors_in(r):
                                committed = time.perf_counter() - t0
                                break
                        except (KraftError, trio.TooSlowError, OSError):
                            pass
                        await trio.sleep(0.01)
                watchers.cancel_scope.cancel()
        finally:
            await writer.aclose()
            for sc in survivors:
                await sc.aclose()
        self.leader_elected.append(marks.get("leader", float("nan")))
        self.activated.append(marks.get("active", float("nan")))
        if committed is None:
            self.failover_errors += 1
            log(f"  {self.label} round {round_no}: killed {leader}, no commit within 30 s")
        else:
            self.failovers.append(committed)
            log(
                f"  {self.label} round {round_no}: killed {leader}, committed after {committed:.3f}s"
            )
        await trio.to_thread.run_sync(
            functools.partial(
                kraft,
                "cluster",
                "start",
                "--dir",
                str(self.dir),
                "--node",
                str(leader),
                timeout=60,
                src=self.src,
            )
        )
        self.load_meta()
        # the restarted node's start-up (imports, log replay) must not overlap the next round,
        # of this cluster or of another one
        admin = ControllerClient(self.bootstrap, client_id=f"eb-admin-after-{round_no}")
        try:
            if not await self.wait_caught_up(admin, 60):
                raise RuntimeError(f"{self.label}: node {leader} not caught up within 60 s")
        finally:
            await admin.aclose()

    async def _watch_survivor(
        self, client: ControllerClient, term0: int | None, t0: float, marks: dict[str, float]
    ) -> None:
        """Poll a surviving controller's own view (DescribeNode, answered locally) every 20 ms:
        when it first leads a newer term ("leader") and first is the active controller."""
        while True:
            try:
                d = await client.call("DescribeNode", {"checksum": False}, timeout=0.5)
                at = time.perf_counter() - t0
                raft = d.get("raft") or {}
                if raft.get("state") == "leader" and (raft.get("term") or 0) > (term0 or 0):
                    marks.setdefault("leader", at)
                if d.get("is_active"):
                    marks.setdefault("active", at)
            except (KraftError, trio.TooSlowError, OSError):
                pass
            await trio.sleep(0.02)

    def failover_row(self) -> dict[str, Any]:
        s = sorted(self.failovers)
        med = median(s)
        p90 = pct(s, 90)
        return {
            "system": "pykraft",
            "metric": "failover",
            "code": self.code,
            **settings_of(self.election_ms),
            "count": len(s),
            "errors": self.failover_errors,
            "client_backoff_max_s": self.backoff_max,
            "median_s": None if med is None else round(med, 3),
            "p90_s": None if p90 is None else round(p90, 3),
            "max_s": round(s[-1], 3) if s else None,
            "seconds": [round(t, 3) for t in self.failovers],
            "leader_median_s": _rounded(median([t for t in self.leader_elected if t == t])),
            "active_median_s": _rounded(median([t for t in self.activated if t == t])),
            "leader_s": [round(t, 3) for t in self.leader_elected],
            "active_s": [round(t, 3) for t in self.activated],
        }

    async def pre_vote_counters(self) -> dict[str, int]:
        """The voters' pre-vote counters summed (RaftQuorum.stats via DescribeNode; 0 for
        code without pre-vote, or a voter that did not answer)."""
        total = dict.fromkeys(PRE_VOTE_COUNTERS, 0)
        for host, port in self.bootstrap:
            client = ControllerClient([(host, port)], client_id="eb-prevote-stats")
            try:
                d = await client.call("DescribeNode", {"checksum": False}, timeout=3)
                stats = d.get("raft_stats") or {}
                for k in PRE_VOTE_COUNTERS:
                    total[k] += int(stats.get(k) or 0)
            except (KraftError, trio.TooSlowError, OSError):
                pass
            finally:
                await client.aclose()
        return total

    async def steady(self, seconds: float, rate: float) -> dict[str, Any]:
        """Write ``rate``/s for ``seconds`` with nothing killed; count term/leader changes."""
        latencies: list[float] = []
        errors = 0
        inflight = 0
        skipped = 0
        terms: list[tuple[float, int, int]] = []  # (t, term, leader)
        admin = ControllerClient(self.bootstrap, client_id="eb-steady-admin")
        writer = ControllerClient(self.bootstrap, client_id="eb-steady-writer")
        t_start = time.monotonic()
        end = t_start + seconds

        async def write_one() -> None:
            nonlocal errors, inflight
            inflight += 1
            t0 = time.perf_counter()
            try:
                r = await writer.call(
                    "IncrementalAlterConfigs", set_body(self.next_value()), timeout=10
                )
                if _errors_in(r):
                    errors += 1
                else:
                    latencies.append(time.perf_counter() - t0)
            except (KraftError, trio.TooSlowError, OSError):
                errors += 1
            finally:
                inflight -= 1

        async def write_loop() -> None:
            # open loop: a write is started every 1/rate s whatever the earlier ones' latency
            # (at most MAX_INFLIGHT outstanding), so slow commits do not lower the rate; it
            # stops at the wall-clock end even if a starved client is behind (it once ran on
            # for 10 minutes catching up, burners still on, after the terms' polling ended)
            nonlocal skipped
            period = 1 / rate
            due = time.monotonic()
            async with trio.open_nursery() as writes:
                while due < end and time.monotonic() < end:
                    if inflight < MAX_INFLIGHT:
                        writes.start_soon(write_one)
                    else:
                        skipped += 1
                    due += period
                    await trio.sleep(max(0.0, due - time.monotonic()))
                skipped += max(0, round((end - due) / period))  # not started: client behind

        async def poll_loop() -> None:
            while time.monotonic() < end:
                resp = await self.describe(admin)
                if resp is not None and resp.get("term") is not None:
                    terms.append(
                        (time.monotonic() - t_start, int(resp["term"]), int(resp["leader_id"]))
                    )
                await trio.sleep(1.0)

        counters0 = await self.pre_vote_counters()
        try:
            resp = await self.describe(admin)
            term0 = int(resp["term"]) if resp else None
            leader0 = int(resp["leader_id"]) if resp else None
            async with trio.open_nursery() as n:
                n.start_soon(write_loop)
                n.start_soon(poll_loop)
        finally:
            await writer.aclose()
            await admin.aclose()
        counters1 = await self.pre_vote_counters()
        if term0 is None and terms:
            term0, leader0 = terms[0][1], terms[0][2]
        false_elections, leader_changes, changes = term_changes(term0, leader0, terms)
        lat = sorted(latencies)
        return {
            "system": "pykraft",
            "metric": "false_elections",
            "code": self.code,
            **settings_of(self.election_ms),
            "minutes": round(seconds / 60, 2),
            "term_start": term0,
            "term_end": max((t for _, t, _ in terms), default=term0),
            "false_elections": false_elections,
            "leader_changes": leader_changes,
            "per_hour": round(false_elections * 3600 / seconds, 1),
            "changes": changes,
            "writes": len(lat),
            "write_errors": errors,
            "writes_skipped": skipped,
            "p50_ms": None if not lat else round((pct(lat, 50) or 0) * 1000, 1),
            "p99_ms": None if not lat else round((pct(lat, 99) or 0) * 1000, 1),
            "max_ms": None if not lat else round(lat[-1] * 1000, 1),
            **{k: counters1[k] - counters0[k] for k in PRE_VOTE_COUNTERS},
        }


def term_changes(
    term0: int | None, leader0: int | None, samples: list[tuple[float, int, int]]
) -> tuple[int, int, list[dict[str, Any]]]:
    """From a start (term, leader) and polled ``(t, term, leader)`` samples: the elections
    (term increase over the run: a term can rise by more than one between two polls), the
    samples where the leader differs after a term increase, and those samples."""
    changes: list[dict[str, Any]] = []
    prev_term, prev_leader = term0, leader0
    for at, term, leader in samples:
        if prev_term is not None and term > prev_term:
            changes.append({"at_s": round(at, 1), "term": term, "from": prev_leader, "to": leader})
        if prev_term is None or term >= prev_term:
            prev_term, prev_leader = term, leader
    term_end = max((t for _, t, _ in samples), default=term0)
    elections = (term_end or 0) - (term0 or 0) if term0 is not None else 0
    return elections, sum(1 for c in changes if c["from"] != c["to"]), changes


def cpu_busy_sampler() -> tuple[float, float]:
    """(busy, total) jiffies from /proc/stat, for the machine's CPU use over an interval."""
    parts = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    vals = [float(x) for x in parts]
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
    return sum(vals) - idle, sum(vals)


def start_burners(count: int, nice: int) -> list[subprocess.Popen[bytes]]:
    """``count`` busy-loop processes at niceness ``nice``."""
    return [
        subprocess.Popen(
            [sys.executable, "-c", "while True: pass"],
            preexec_fn=(lambda: os.nice(nice)) if nice else None,
        )
        for _ in range(count)
    ]


def stop_burners(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=10)


async def run_failovers(clusters: list[Cluster], rounds: int, gap_s: float = 0.0) -> None:
    for r in range(1, rounds + 1):
        order = clusters if r % 2 else list(reversed(clusters))
        for c in order:
            await trio.sleep(gap_s)
            await c.failover_round(r)
    for c in clusters:
        admin = ControllerClient(c.bootstrap, client_id="eb-admin-final")
        try:
            await c.wait_caught_up(admin, 60)
        finally:
            await admin.aclose()


async def run_steady(
    clusters: list[Cluster], seconds: float, rate: float, burners: int, nice: int
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    loads: list[float] = []
    results: dict[int, dict[str, Any]] = {}
    procs = start_burners(burners, nice)
    busy0, total0 = cpu_busy_sampler()
    try:

        async def sample() -> None:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                loads.append(os.getloadavg()[0])
                await trio.sleep(10)

        async def one(i: int, c: Cluster) -> None:
            results[i] = await c.steady(seconds, rate)

        async with trio.open_nursery() as n:
            n.start_soon(sample)
            for i, c in enumerate(clusters):
                n.start_soon(one, i, c)
    finally:
        busy1, total1 = cpu_busy_sampler()
        stop_burners(procs)
    load = {
        "burners": burners,
        "burner_nice": nice,
        "cpu_busy_pct": round(100 * (busy1 - busy0) / max(total1 - total0, 1), 1),
        "loadavg1_mean": round(sum(loads) / len(loads), 2) if loads else None,
        "loadavg1_max": round(max(loads), 2) if loads else None,
    }
    rows = [dict(results[i], **load) for i in range(len(clusters))]
    return rows, load


def run(
    election_ms: list[int],
    failovers: int = 10,
    minutes: float = 10.0,
    rate: float = 100.0,
    burners: int = 2,
    nice: int = 0,
    keep: bool = False,
    backoff_max: float = 0.05,
    gap_s: float = 0.0,
    baseline_src: Path | None = None,
    baseline_ms: list[int] | None = None,
) -> list[dict[str, Any]]:
    """Bring up one cluster per setting (and per ``baseline_ms`` setting one running the source
    tree ``baseline_src``), run both phases, tear everything down."""
    baseline_ms = (baseline_ms or []) if baseline_src is not None else []
    base = Path(tempfile.mkdtemp(prefix="pykraft-election-bench-"))
    clusters = [Cluster(base / f"c{ms}", ms, backoff_max) for ms in election_ms]
    clusters += [
        Cluster(base / f"c{ms}-baseline", ms, backoff_max, baseline_src) for ms in baseline_ms
    ]
    results: list[dict[str, Any]] = []
    try:
        for c in clusters:
            log(f"starting 3-controller cluster ({c.code}), {KEY}={c.election_ms}, in {c.dir}")
            c.up()

        if failovers:
            log(f"failover: {failovers} rounds per setting, interleaved; load {os.getloadavg()}")
            trio.run(run_failovers, clusters, failovers, gap_s)
            for c in clusters:
                row = c.failover_row()
                row["loadavg1_end"] = round(os.getloadavg()[0], 2)
                results.append(row)
                log(
                    f"  -> {c.label}: median {row['median_s']} p90 {row['p90_s']} max {row['max_s']}"
                )
        if minutes > 0:
            log(f"false elections: {minutes} min, {burners} burners (nice {nice}), {rate} writes/s")
            rows, load = trio.run(run_steady, clusters, minutes * 60, rate, burners, nice)
            results.extend(rows)
            for r in rows:
                log(
                    f"  -> {r['election_timeout_ms']} ms ({r['code']}): "
                    f"{r['false_elections']} false elections, "
                    f"{r['leader_changes']} leader changes; load {load}"
                )
    finally:
        for c in clusters:
            cluster_down(c.dir)
            kill_leftovers(c.dir)
        if not keep:
            shutil.rmtree(base, ignore_errors=True)
    return results


def kill_leftovers(directory: Path) -> None:
    """SIGKILL any controller pid of this cluster still recorded (after a failed ``down``)."""
    try:
        meta = json.loads((directory / "cluster.json").read_text())
    except (OSError, ValueError):
        return
    for c in meta.get("controllers", []):
        pid = c.get("pid")
        if pid:
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if c["config"].encode() in cmdline:
                os.kill(pid, signal.SIGKILL)


def table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| metric | election timeout (min-max s) | heartbeat s | result | detail |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in results:
        st = f"{r['raft_min_timeout_s']}-{r['raft_max_timeout_s']}"
        if r.get("code", "this tree") != "this tree":
            st += " (baseline)"
        if r["metric"] == "failover":
            res = f"median {r['median_s']} / p90 {r['p90_s']} / max {r['max_s']} s"
            det = (
                f"n={r['count']}, errors {r['errors']}; median kill->new raft leader "
                f"{r['leader_median_s']} s, ->active controller {r['active_median_s']} s; "
                f"load1 {r['loadavg1_end']}"
            )
        else:
            res = (
                f"{r['false_elections']} false elections ({r['leader_changes']} leader changes) "
                f"in {r['minutes']} min = {r['per_hour']}/h"
            )
            det = (
                f"writes p50/p99/max {r['p50_ms']}/{r['p99_ms']}/{r['max_ms']} ms, "
                f"{r['write_errors']} errors; CPU {r['cpu_busy_pct']}%, "
                f"load1 mean {r['loadavg1_mean']} max {r['loadavg1_max']}; pre-vote rounds "
                f"{r.get('pre_vote_rounds')}, refused {r.get('pre_votes_refused')}, sticky "
                f"{r.get('sticky_refusals')}"
            )
        lines.append(f"| {r['metric']} | {st} | {r['heartbeat_s']} | {res} | {det} |")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--election-timeout-ms",
        default="1000",
        help=f"comma-separated {KEY} values to compare, one cluster each (default 1000)",
    )
    ap.add_argument("--failovers", type=int, default=10, help="rounds per setting (10; 0 skips)")
    ap.add_argument("--minutes", type=float, default=10.0, help="loaded run (10; 0 skips)")
    ap.add_argument("--rate", type=float, default=100.0, help="writes/s per cluster (100)")
    ap.add_argument("--burners", type=int, default=2, help="CPU burner processes (2)")
    ap.add_argument("--burner-nice", type=int, default=0, help="their niceness (0)")
    ap.add_argument(
        "--client-backoff-max-ms",
        type=float,
        default=50.0,
        help="the failover writer's longest retry back-off (50; ControllerClient's default 1000)",
    )
    ap.add_argument(
        "--gap-s",
        type=float,
        default=0.0,
        help="idle seconds before each failover round, nothing written (0)",
    )
    ap.add_argument("--keep", action="store_true", help="keep the cluster directories")
    ap.add_argument(
        "--baseline-src",
        type=Path,
        help="another pykraft source tree (e.g. `git archive` of an older commit) to compare",
    )
    ap.add_argument(
        "--baseline-ms",
        default="",
        help="comma-separated election timeouts for extra clusters running --baseline-src",
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        ms = [int(x) for x in args.election_timeout_ms.split(",") if x.strip()]
        base_ms = [int(x) for x in args.baseline_ms.split(",") if x.strip()]
    except ValueError:
        print("--election-timeout-ms: expected integers like 1000,500", file=sys.stderr)
        return 2
    if base_ms and (args.baseline_src is None or not (args.baseline_src / "kraft").is_dir()):
        print("--baseline-ms needs --baseline-src: a pykraft source tree", file=sys.stderr)
        return 2
    if not ms or any(m <= 0 for m in ms + base_ms) or args.rate <= 0:
        print("--election-timeout-ms and --rate must be positive", file=sys.stderr)
        return 2
    results = run(
        ms,
        args.failovers,
        args.minutes,
        args.rate,
        args.burners,
        args.burner_nice,
        args.keep,
        args.client_backoff_max_ms / 1000,
        args.gap_s,
        args.baseline_src,
        base_ms,
    )
    print(table(results))
    print(json.dumps({"system": "pykraft", "results": results}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
