"""Scale benchmark (issues 8 and 24, ``make bench-scale``): a metadata image of ``topics`` x
``partitions`` partitions (default 20,000 x 100 = 2M, RF 3, the scale Kafka's KRaft was publicly
shown at) on a real 3-controller quorum with ``brokers`` (default 60) simulated brokers
(``testsupport/sim_broker.py``: real registration, heartbeats and FetchMetadata, no partition
logs), then:

* bulk: the first 1,000 topics x 100 partitions created and applied on every controller and every
  (simulated) broker — seconds;
* the full image: creation rate, every controller's RSS;
* snapshot write: the controller's own "wrote snapshot" timing for the largest snapshot;
* failover: kill -9 the active controller → next write committed (seconds), ``failovers`` times
  (median and max), the killed controller restarted each time;
* cold start: the killed controller restarted → applied offset equal to the leader's (seconds),
  from the ``kraft cluster start`` that launches it (``cold_start_s``) and from the node process's
  own start (``cold_start_from_exec_s``, the target: the CLI's start is not the controller's);
* broker kill: a simulated broker stops heartbeating → from its session expiry to the last
  partition change for it and its fence record (timestamps in the leader's log) — seconds;
* controlled shutdown of a simulated broker: request → told to shut down (seconds);
* whole-cluster restart: every controller and simulated broker killed (-9), then all started
  again → every broker unfenced and every partition with a leader in the brokers' image
  (seconds);
* catch-up: a new **real** broker process replays the full image and reports RUNNING (seconds);
* real brokers: 3 real brokers with ``real_topics`` x ``partitions`` partitions each (10,000 by
  default) are restarted together → all RUNNING again (seconds).

Progress on stderr; ``run(...) -> (rows, targets)``; ``python -m bench.scale_bench`` prints a
markdown table and a JSON line. Smaller shapes (``--topics 300``) make a quick smoke run.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psutil
import trio

from bench.broker_bench import table
from bench.common import ENV, REPO, cluster_up, controller_addresses, logger
from kraft.errors import KraftError
from kraft.metrics import ImageCounts
from kraft.rpc.client import ControllerClient, call_sync
from testsupport.sim_broker import SharedReplay, SimBroker, wait_unfenced

SNAPSHOT_LINE = re.compile(
    r"wrote snapshot \S+ \((\d+) partitions\) in ([\d.]+)s(?: \(([\d.]+)s CPU\))?"
)
# Phases after the full image that ``--phases`` may pick (the bulk and full-image phases always run).
OPTIONAL_PHASES = (
    "controller_memory_snapshot",
    "failover_cold_start",
    "broker_kill",
    "controlled_shutdown",
    "whole_restart",
)
# The whole-cluster restart is measured up to this long; past it the row says so (target missed).
WHOLE_RESTART_GIVE_UP_S = 600.0

log = logger("scale bench")


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tools.cli", *args],
        cwd=REPO,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=True,
    )


class Scale:
    def __init__(
        self,
        directory: Path,
        topics: int,
        partitions: int,
        brokers: int,
        per_request: int,
        inflight: int,
        failovers: int = 5,
        phases: frozenset[str] = frozenset(),
    ) -> None:
        self.dir = directory
        self.failovers = failovers
        self.phases = phases  # the optional phases to run (empty: all of them)
        self.topics = topics
        self.partitions = partitions
        self.n_brokers = brokers
        self.per_request = per_request
        self.inflight = inflight
        self.rows: list[dict[str, Any]] = []
        self.meta: dict[str, Any] = {}
        self.boot: list[tuple[str, int]] = []
        self.sims: list[SimBroker] = []
        self.sim_scopes: dict[int, trio.CancelScope] = {}
        self.failed = False

    # ---- helpers ----------------------------------------------------------------------------
    def load_meta(self) -> None:
        self.meta = json.loads((self.dir / "cluster.json").read_text())
        self.boot = [(c["host"], c["rpc_port"]) for c in self.meta["controllers"]]

    def controller(self, cid: int) -> dict[str, Any]:
        return next(c for c in self.meta["controllers"] if c["id"] == cid)

    async def describe_node(self, cid: int) -> dict[str, Any] | None:
        c = self.controller(cid)
        client = ControllerClient(
            [(c["host"], c["rpc_port"])]
        )  # DescribeNode: answered by this node
        try:
            return await client.call("DescribeNode", {"checksum": False}, timeout=5)
        except (KraftError, trio.TooSlowError, OSError):
            return None
        finally:
            await client.aclose()

    async def leader(self, client: ControllerClient) -> int | None:
        try:
            return (await client.call("DescribeQuorum", {}, timeout=5)).get("leader_id")
        except (KraftError, trio.TooSlowError, OSError):
            return None

    async def known_leader(self, client: ControllerClient) -> int:
        """The active controller's id, asking again while there is no answer (an election, or
        DescribeQuorum timing out on a loaded machine)."""
        with trio.fail_after(60):
            while True:
                leader = await self.leader(client)
                if leader is not None and leader >= 0:
                    return leader
                await trio.sleep(0.1)

    async def applied_everywhere(self, offset: int, timeout: float) -> float:
        """Seconds until every controller and every running sim broker has ``offset``."""
        start = time.perf_counter()
        with trio.fail_after(timeout):
            while True:
                views = [await self.describe_node(c["id"]) for c in self.meta["controllers"]]
                if all(v and v["applied_offset"] >= offset for v in views) and all(
                    b.metadata_offset >= offset
                    for b in self.sims
                    if not b.shut_down and b.broker_id in self.sim_scopes
                ):
                    return time.perf_counter() - start
                await trio.sleep(0.05)

    def row(self, metric: str, **figures: Any) -> None:
        r = {"metric": metric, **figures}
        self.rows.append(r)
        log(f"  -> {r}")
        for t in targets([r]):
            if t["value"] is not None:
                log(
                    f"     target {t['target']}: {t['value']} (ratio {t['ratio']}, "
                    f"{'met' if t['met'] else 'MISSED'})"
                )

    def cpu(self) -> dict[str, tuple[int, float]]:
        """(pid, CPU seconds so far: user + system) of each controller process and of this one."""
        out = {"bench": (os.getpid(), time.process_time())}
        for c in self.meta["controllers"]:
            try:
                t = psutil.Process(c["pid"]).cpu_times()
                out[f"c{c['id']}"] = (c["pid"], t.user + t.system)
            except psutil.Error:
                pass
        return out

    async def phase(self, metric: str, fn: Callable[..., Awaitable[None]], *args: Any) -> None:
        """Run one phase; a failure is recorded as that metric's error and the run goes on. The
        rows it adds get ``cpu_s``: CPU seconds each controller and this process spent in it
        (the machine is shared: wall times are noisy, CPU seconds much less so)."""
        first_row, before = len(self.rows), self.cpu()
        try:
            await fn(*args)
        except (Exception, trio.TooSlowError) as e:
            self.failed = True
            self.row(metric, error=f"{type(e).__name__}: {e}"[:300])
        if not gc.isenabled():
            gc.collect()  # this process's cyclic garbage of the phase (see run())
        after = self.cpu()  # a restarted controller (new pid) counts from its start
        spent = {
            k: round(v - (before[k][1] if before.get(k, (None,))[0] == pid else 0), 1)
            for k, (pid, v) in after.items()
        }
        log(f"  {metric}: CPU s {spent}")
        for r in self.rows[first_row:]:
            r["cpu_s"] = spent

    # ---- phases -----------------------------------------------------------------------------
    async def create(
        self, client_pool: list[ControllerClient], first: int, count: int
    ) -> tuple[int, float, int]:
        """Create topics ``first .. first+count`` (``per_request`` per CreateTopics); returns
        (the leader's applied offset once all are acknowledged, seconds, errors)."""
        next_topic = first
        end = first + count
        errors = 0
        start = time.perf_counter()

        async def worker(w: int) -> None:
            nonlocal next_topic, errors
            client = client_pool[w % len(client_pool)]
            while next_topic < end:
                lo = next_topic
                hi = min(end, lo + self.per_request)
                next_topic = hi
                body = {
                    "topics": [
                        {
                            "name": f"s-{i:06d}",
                            "num_partitions": self.partitions,
                            "replication_factor": 3,
                        }
                        for i in range(lo, hi)
                    ]
                }
                for _ in range(5):
                    try:
                        r = await client.call("CreateTopics", body, timeout=60)
                        bad = [t for t in r["topics"] if t["error_code"] and t["error_code"] != 36]
                        if bad:
                            errors += 1
                            log(f"    create error: {bad[0]}")
                        break
                    except (KraftError, trio.TooSlowError, OSError) as e:
                        log(f"    create retry: {e!r}")
                        await trio.sleep(0.5)
                else:
                    errors += 1

        async with trio.open_nursery() as n:
            for w in range(self.inflight):
                n.start_soon(worker, w)
        secs = time.perf_counter() - start
        leader = await self.leader(client_pool[0])
        view = await self.describe_node(leader) if leader else None
        return (view or {}).get("applied_offset", -1), secs, errors

    async def run_sim(
        self, b: SimBroker, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        with trio.CancelScope() as scope:
            self.sim_scopes[b.broker_id] = scope
            task_status.started()
            try:
                await b.run()
            except trio.TooSlowError:  # its registration never got through: the row says so
                log(f"  simulated broker {b.broker_id} could not register")
        self.sim_scopes.pop(b.broker_id, None)

    async def main(self) -> None:
        self.load_meta()
        cluster_id = self.meta["cluster_id"]
        replay = SharedReplay()
        self.sims = [
            SimBroker(
                101 + i,
                self.boot,
                cluster_id,
                rack=f"r{i % 3}",
                heartbeat_interval_s=1.0,
                replay=replay,
            )
            for i in range(self.n_brokers)
        ]
        async with trio.open_nursery() as nursery:
            for b in self.sims:
                await nursery.start(self.run_sim, b)
            await wait_unfenced(self.sims, 120)
            log(f"{self.n_brokers} simulated brokers unfenced")
            pool = [ControllerClient(self.boot) for _ in range(4)]
            try:
                await self.phase("bulk_create", self.phase_bulk, pool)
                await self.phase("full_image", self.phase_full, pool)
                optional: list[tuple[str, Callable[..., Awaitable[None]], tuple[Any, ...]]] = [
                    ("controller_memory_snapshot", self.phase_rss_snapshot, ()),
                    ("failover_cold_start", self.phase_failover, (pool[0],)),
                    ("broker_kill", self.phase_broker_kill, (pool[0],)),
                    ("controlled_shutdown", self.phase_controlled_shutdown, (pool[0],)),
                    ("whole_restart", self.phase_whole_restart, (nursery, pool[0])),
                ]
                for metric, fn, args in optional:
                    if not self.phases or metric in self.phases:
                        await self.phase(metric, fn, *args)
            finally:
                for c in pool:
                    await c.aclose()
                nursery.cancel_scope.cancel()

    async def phase_bulk(self, pool: list[ControllerClient]) -> None:
        bulk = min(1000, self.topics)
        log(f"creating {bulk} topics x {self.partitions} partitions (bulk phase)")
        t0 = time.perf_counter()
        highest, secs, errors = await self.create(pool, 0, bulk)
        applied = await self.applied_everywhere(highest, 120)
        self.row(
            "bulk_create",
            topics=bulk,
            partitions=bulk * self.partitions,
            commit_s=round(secs, 2),
            applied_everywhere_s=round(time.perf_counter() - t0, 2),
            lag_after_commit_s=round(applied, 2),
            errors=errors,
        )

    async def phase_full(self, pool: list[ControllerClient]) -> None:
        bulk = min(1000, self.topics)
        log(f"creating the remaining {self.topics - bulk} topics")
        highest, secs, errors = await self.create(pool, bulk, self.topics - bulk)
        await self.applied_everywhere(highest, 600)
        total = self.topics * self.partitions
        self.row(
            "full_image",
            topics=self.topics,
            partitions=total,
            seconds=round(secs, 1),
            partitions_s=round((self.topics - bulk) * self.partitions / secs) if secs else None,
            errors=errors,
            final_offset=highest,
        )

    async def phase_rss_snapshot(self) -> None:
        rss = {}
        for c in self.meta["controllers"]:
            try:
                rss[c["id"]] = round(psutil.Process(c["pid"]).memory_info().rss / 2**20)
            except psutil.Error:
                rss[c["id"]] = None
        timings = []  # (partitions, wall s, CPU s of the writing thread) from kraft.snapshotter's log line
        for c in self.meta["controllers"]:
            text = Path(c["log_file"]).read_text(errors="replace")
            for m in SNAPSHOT_LINE.finditer(text):
                timings.append((int(m[1]), float(m[2]), float(m[3]) if m[3] else None))
        biggest = max(timings) if timings else (None, None, None)
        self.row(
            "controller_memory_snapshot",
            rss_mib=rss,
            max_rss_mib=max(v for v in rss.values() if v),
            snapshot_partitions=biggest[0],
            snapshot_write_s=biggest[1],
            snapshot_write_cpu_s=biggest[2],
        )

    async def phase_failover(self, client: ControllerClient) -> None:
        """``failovers`` rounds: kill -9 the active controller, time the next committed write,
        restart the killed controller and time until it has applied what the leader has."""
        failovers: list[float] = []
        colds: list[float] = []
        self.cold_from_exec: list[float] = []
        cold_cpu = None
        for i in range(self.failovers):
            failover, cold, cpu = await self.one_failover(client, i)
            failovers.append(failover)
            colds.append(cold)
            cold_cpu = cold_cpu if cold_cpu is not None else cpu
        ordered = sorted(failovers)
        self.row(
            "failover_cold_start",
            failover_s=round(ordered[len(ordered) // 2], 2),  # the median
            failover_max_s=round(ordered[-1], 2),
            failovers_s=[round(f, 2) for f in failovers],
            cold_start_s=round(sorted(colds)[len(colds) // 2], 2),
            cold_start_max_s=round(max(colds), 2),
            cold_start_cpu_s=cold_cpu,
            cold_start_from_exec_s=self.cold_from_exec,
            cold_start_from_exec_median_s=(
                sorted(self.cold_from_exec)[len(self.cold_from_exec) // 2]
                if self.cold_from_exec
                else None
            ),
        )

    async def one_failover(
        self, client: ControllerClient, round_no: int
    ) -> tuple[float, float, Any]:
        leader = await self.known_leader(client)
        # The writer retries every 50 ms at most, as bench.election_bench's does: with the
        # client's default backoff (doubling to 1 s) the next attempt after a kill came up to
        # ~0.4 s after the new leader was ready, and that was in the figure.
        writer = ControllerClient(self.boot, client_id=f"failover-{round_no}", backoff_max=0.05)
        await writer.call("DescribeQuorum", {}, timeout=30)  # connected before the kill
        log(f"failover {round_no + 1}/{self.failovers}: kill -9 active controller {leader}")
        os.kill(self.controller(leader)["pid"], signal.SIGKILL)
        t0 = time.perf_counter()
        body = {
            "resources": [
                {
                    "resource_type": "topic",
                    "resource_name": "s-000000",
                    "ops": [{"name": "retention.ms", "op": "SET", "value": str(123456 + round_no)}],
                }
            ]
        }
        try:
            while True:
                try:
                    await writer.call("IncrementalAlterConfigs", body, timeout=2)
                    break
                except (KraftError, trio.TooSlowError, OSError):
                    await trio.sleep(0.02)
        finally:
            await writer.aclose()
        failover = time.perf_counter() - t0
        log(f"restarting controller {leader} (cold start from snapshot + log)")
        t1 = time.perf_counter()
        await trio.to_thread.run_sync(
            lambda: cli("cluster", "start", "--dir", str(self.dir), "--node", str(leader))
        )
        self.load_meta()
        target = max(
            (v or {}).get("applied_offset", -1)
            for v in [await self.describe_node(c["id"]) for c in self.meta["controllers"]]
        )
        with trio.fail_after(300):
            while True:
                v = await self.describe_node(leader)
                if v and v["applied_offset"] >= target:
                    break
                await trio.sleep(0.1)
        cold = time.perf_counter() - t1
        caught_up = time.time()
        try:
            proc = psutil.Process(self.controller(leader)["pid"])
            t = proc.cpu_times()
            cold_cpu: Any = round(t.user + t.system, 1)
            # from the node process's own start, without the CLI that launched it
            self.cold_from_exec.append(round(caught_up - proc.create_time(), 2))
        except psutil.Error:
            cold_cpu = None
        log(f"  failover {failover:.2f} s, cold start {cold:.2f} s")
        return failover, cold, cold_cpu

    def session_timeout_s(self) -> float:
        """``broker.session.timeout.ms`` of the controllers (their properties, else the default)."""
        from kraft.config import ControllerConfig

        config = ControllerConfig.load(self.meta["controllers"][0]["config"])
        return float(config["broker.session.timeout.ms"]) / 1000

    async def phase_broker_kill(self, client: ControllerClient) -> None:
        """A simulated broker stops heartbeating: from its session expiry (its last answered
        heartbeat + the session timeout) until the last of its leaderships moved (committed:
        ``leaders_moved_s``, the target; moved first, see ``election.leaving_changes``) and until
        a controller shows it fenced — the fence record is written after all its partition
        changes, so that is "left every ISR and committed" (``reelect_s``)."""
        victim = self.sims[0]
        leader = await self.leader(client)
        before = (
            (await self.describe_node(leader) or {}).get("applied_offset", -1) if leader else -1
        )
        log(f"broker kill: simulated broker {victim.broker_id} stops heartbeating")
        self.sim_scopes[victim.broker_id].cancel()
        expiry = (victim.last_heartbeat or time.monotonic()) + self.session_timeout_s()
        fenced_at = None
        with trio.fail_after(120):
            while fenced_at is None:
                try:
                    r = await client.call("DescribeCluster", {}, timeout=5)
                    entry = next(
                        (b for b in r.get("brokers", []) if b.get("broker_id") == victim.broker_id),
                        None,
                    )
                    if entry is not None and entry.get("fenced"):
                        fenced_at = time.monotonic()
                except (KraftError, trio.TooSlowError, OSError):
                    pass
                await trio.sleep(0.05)
        expiry_wall_ms = (time.time() - (time.monotonic() - expiry)) * 1000
        first, last, _, changes, fence, batches, terms, moved = await self.scan_log(
            client, before, "session-timeout"
        )
        self.row(
            "broker_kill",
            broker=victim.broker_id,
            partition_changes=changes,
            fence_records=fence,
            steps=batches,
            terms=terms,
            leaders_moved_s=(
                round((moved - expiry_wall_ms) / 1000, 2)
                if moved is not None
                else round(fenced_at - expiry, 2)
            ),
            reelect_s=round(fenced_at - expiry, 2),
            log_span_s=(
                round((last - first) / 1000, 2) if first is not None and last is not None else None
            ),
        )

    async def scan_log(
        self, client: ControllerClient, after: int, reason: str
    ) -> tuple[int | None, int | None, int | None, int, int, int, int, int | None]:
        """The leader's batches after offset ``after`` written for ``reason``: (timestamps ms of
        the first, the last, the last with partition changes; partition changes, broker
        registration changes, batches, Raft terms they span — more than one: an election
        happened meanwhile; the timestamp ms of the batch after the last one that moved a
        leadership, i.e. about when that one had committed — None when that one is the last)."""
        from kraft.log.metadata_log import MetadataLog
        from kraft.records import LEADER_UNCHANGED, PartitionChangeRecord

        leader = await self.known_leader(client)
        log_dir = Path(self.controller(leader)["metadata_dir"]) / "log"
        Scan = tuple[int | None, int | None, int | None, int, int, int, int, int | None]

        def scan() -> Scan:
            first = last = last_change = moved = None
            moved_pending = False
            terms = set()
            changes = registrations = batches = 0
            with MetadataLog.open(log_dir, fsync="never") as mlog:
                for b in mlog.read_batches(max(after + 1, mlog.start_offset)):
                    if b.provenance.reason != reason:
                        continue
                    if moved_pending:  # a step is proposed once the previous one committed
                        moved, moved_pending = b.timestamp_ms, False
                    first = b.timestamp_ms if first is None else first
                    last = b.timestamp_ms
                    batches += 1
                    terms.add(b.term)
                    for rec in b.records:
                        name = type(rec).__name__
                        changes += name == "PartitionChangeRecord"
                        registrations += name == "BrokerRegistrationChangeRecord"
                    if any(
                        type(r) is PartitionChangeRecord and r.leader != LEADER_UNCHANGED
                        for r in b.records
                    ):
                        moved, moved_pending = b.timestamp_ms, True
                    if len(b.records) > 1:  # not the lone final fence record
                        last_change = b.timestamp_ms
            if moved_pending:  # the transition's last batch: its commit is the fence seen
                moved = None
            return first, last, last_change, changes, registrations, batches, len(terms), moved

        return await trio.to_thread.run_sync(scan)

    async def phase_controlled_shutdown(self, client: ControllerClient) -> None:
        """A simulated broker asks to shut down: request → told to shut down (seconds), and where
        the time went, from the leader's log: to the first step, the steps moving its
        partitions, from the last step to the final fence record (the brokers replay the steps;
        the broker heartbeats again), from the fence to the answer. It starts once every
        controller and broker has applied the log so far (not while they still replay the
        broker kill's)."""
        b = self.sims[1]
        before = (await self.describe_node(await self.known_leader(client)) or {}).get(
            "applied_offset", -1
        )
        await self.applied_everywhere(before, 120)
        log(f"controlled shutdown of simulated broker {b.broker_id}")
        t0, wall0 = time.perf_counter(), time.time()
        b.begin_shutdown()
        with trio.fail_after(120):
            while not b.shut_down:
                await trio.sleep(0.02)
        seconds, done = time.perf_counter() - t0, time.time()
        first, last, last_change, changes, _, batches, terms, _ = await self.scan_log(
            client, before, "controlled-shutdown"
        )
        where = {}
        if first is not None and last is not None and last_change is not None:
            # command timestamps, on the leader's clock
            where = {
                "to_first_step_s": round(first / 1000 - wall0, 2),
                "steps_s": round((last_change - first) / 1000, 2),
                "to_fence_s": round((last - last_change) / 1000, 2),
                "fence_to_answer_s": round(done - last / 1000, 2),
            }
        self.row(
            "controlled_shutdown",
            broker=b.broker_id,
            seconds=round(seconds, 2),
            partition_changes=changes,
            batches=batches,
            terms=terms,
            **where,
        )

    async def phase_whole_restart(self, nursery: trio.Nursery, client: ControllerClient) -> None:
        """Every controller and simulated broker killed at once (-9 / cancelled), then all
        started again: seconds until every broker is unfenced and every partition has a leader
        in the image the brokers replayed (``offline`` partitions counted there)."""
        log("whole-cluster restart: cancel every simulated broker, kill -9 every controller")
        for scope in list(self.sim_scopes.values()):
            scope.cancel()
        with trio.fail_after(30):
            while self.sim_scopes:
                await trio.sleep(0.02)
        pids = [c["pid"] for c in self.meta["controllers"]]
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        with trio.fail_after(30):
            while any(
                psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in pids
            ):
                await trio.sleep(0.02)
        t0 = time.perf_counter()
        await trio.to_thread.run_sync(lambda: cli("cluster", "start", "--dir", str(self.dir)))
        self.load_meta()
        leader = await self.known_leader(client)
        elected = time.perf_counter() - t0
        replay = SharedReplay()
        self.sims = [
            SimBroker(
                b.broker_id, self.boot, b.cluster_id, rack=b.rack, heartbeat_interval_s=1.0,
                replay=replay, register_timeout_s=WHOLE_RESTART_GIVE_UP_S,
                previous_epoch=b.epoch,  # their disks are intact: as a real broker's epoch file
            )
            for b in self.sims
        ]  # fmt: skip
        for b in self.sims:
            await nursery.start(self.run_sim, b)
        registered = unfenced = online = None
        counts = None
        with trio.move_on_after(WHOLE_RESTART_GIVE_UP_S):
            while any(b.fenced for b in self.sims):
                if registered is None and all(b.epoch >= 0 for b in self.sims):
                    registered = time.perf_counter() - t0
                log(
                    f"  {sum(b.epoch >= 0 for b in self.sims)} registered, "
                    f"{sum(not b.fenced for b in self.sims)} unfenced, image offset "
                    f"{replay.image.offset}"
                )
                await trio.sleep(1)
            unfenced = time.perf_counter() - t0
            while (counts := ImageCounts.of(replay.image)).offline_partitions > 0:
                log(f"  {counts.offline_partitions} partitions without a leader")
                await trio.sleep(0.5)
            online = time.perf_counter() - t0
        if online is None:
            log(f"  whole restart: gave up after {WHOLE_RESTART_GIVE_UP_S:.0f} s")
        self.row(
            "whole_restart",
            leader=leader,
            leader_s=round(elected, 2),
            brokers_registered_s=registered and round(registered, 2),
            brokers_registered=sum(b.epoch >= 0 for b in self.sims),
            brokers_unfenced_s=unfenced and round(unfenced, 2),
            all_online_s=online and round(online, 2),
            gave_up_after_s=None if online is not None else WHOLE_RESTART_GIVE_UP_S,
            partitions=counts.partitions if counts is not None else None,
        )

    def catch_up(self) -> None:
        """A new real broker process replays the whole image and reports RUNNING."""
        from broker.state import describe

        bdir = self.dir / "broker-900"
        bdir.mkdir(parents=True, exist_ok=True)
        ports = []
        for _ in range(2):
            import socket

            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                ports.append(s.getsockname()[1])
        props = {
            "node.id": "900",
            "process.roles": "broker",
            "cluster.id": self.meta["cluster_id"],
            "log.dirs": str(bdir / "data"),
            "listeners": f"PLAINTEXT://127.0.0.1:{ports[0]}",
            "broker.admin.port": str(ports[1]),
            "controller.quorum.bootstrap.servers": ",".join(f"{h}:{p}" for h, p in self.boot),
        }
        cfg = bdir / "broker.properties"
        cfg.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        from kraft.storage.format import format_storage
        from tools.node_storage import node_storage

        format_storage(node_storage(str(cfg)))  # a node never starts on an unformatted dir
        log("catch-up: starting a new real broker (id 900)")
        t0 = time.perf_counter()
        with open(bdir / "node.log", "w") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "tools.cli", "broker", "--config", str(cfg)],
                cwd=REPO,
                env=ENV,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:
            deadline = time.monotonic() + 300
            state = None
            while time.monotonic() < deadline:
                try:
                    state = describe("127.0.0.1", ports[1], timeout=5)
                    if state.get("state") == "RUNNING":
                        break
                except (OSError, ValueError):
                    pass
                time.sleep(0.2)
            secs = time.perf_counter() - t0
            rss = round(psutil.Process(proc.pid).memory_info().rss / 2**20)
            self.row(
                "new_broker_catch_up",
                seconds=round(secs, 2),
                running=bool(state and state.get("state") == "RUNNING"),
                offset=state and state.get("last_applied_offset"),
                rss_mib=rss,
            )
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)


def real_brokers(topics: int = 100, partitions: int = 100) -> dict[str, Any]:
    """3 real brokers, each a replica of ``topics`` x ``partitions`` partitions (RF 3): create
    them, then restart every broker and time until all three report RUNNING again."""
    from broker.state import describe

    work = Path(tempfile.mkdtemp(prefix="kraft-bench-real-"))
    cdir = work / "c"
    try:
        log(f"real brokers: 3 controllers + 3 brokers, {topics} x {partitions} partitions RF 3")
        meta = cluster_up(cdir)
        boot = controller_addresses(meta)
        t0 = time.perf_counter()
        for lo in range(0, topics, 10):
            r = call_sync(
                boot,
                "CreateTopics",
                {
                    "topics": [
                        {
                            "name": f"r-{i:04d}",
                            "num_partitions": partitions,
                            "replication_factor": 3,
                        }
                        for i in range(lo, min(topics, lo + 10))
                    ]
                },
                timeout=120,
            )
            assert not any(t["error_code"] for t in r["topics"]), r
        target = call_sync(boot, "DescribeNode", {"checksum": False}, timeout=30)["applied_offset"]

        def all_running(offset: int) -> bool:
            states = []
            for b in meta["brokers"]:
                try:
                    states.append(describe(b["host"], b["admin_port"], timeout=10))
                except (OSError, ValueError):
                    return False
            return all(
                s["state"] == "RUNNING"
                and s["last_applied_offset"] >= offset
                and len(s.get("partitions") or ()) >= topics * partitions
                for s in states
            )

        deadline = time.monotonic() + 600
        while not all_running(target) and time.monotonic() < deadline:
            time.sleep(0.5)
        created = time.perf_counter() - t0
        log(f"real brokers: created and replicas made in {created:.1f}s; restarting all brokers")
        for b in meta["brokers"]:
            try:
                cli(
                    "cluster",
                    "kill",
                    "--dir",
                    str(cdir),
                    "--node",
                    str(b["id"]),
                    "--signal",
                    "TERM",
                    "--timeout",
                    "120",
                )
            except subprocess.CalledProcessError as e:  # e.g. it is not running: say so, go on
                log(f"  kill broker {b['id']}: {(e.stderr or e.stdout or '').strip()}")
        for b in meta["brokers"]:
            pid = b.get("pid")
            while pid and psutil.pid_exists(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
        t1 = time.perf_counter()
        for b in meta["brokers"]:
            cli("cluster", "start", "--dir", str(cdir), "--node", str(b["id"]))
        meta = json.loads((cdir / "cluster.json").read_text())
        while not all_running(target) and time.monotonic() < deadline:
            time.sleep(0.2)
        up = time.perf_counter() - t1
        rss = [round(psutil.Process(b["pid"]).memory_info().rss / 2**20) for b in meta["brokers"]]
        return {
            "metric": "real_brokers_restart",
            "partitions_per_broker": topics * partitions,
            "create_and_replicas_s": round(created, 1),
            "restart_to_running_s": round(up, 2),
            "broker_rss_mib": rss,
        }
    finally:
        stop_cluster(cdir)
        shutil.rmtree(work, ignore_errors=True)


def stop_cluster(cdir: Path) -> None:
    """``kraft cluster down``, then SIGKILL whatever node of cluster.json is still alive."""
    try:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "tools.cli",
                "cluster",
                "down",
                "--dir",
                str(cdir),
                "--timeout",
                "30",
            ],
            cwd=REPO,
            env=ENV,
            capture_output=True,
            timeout=120,
        )
    except subprocess.TimeoutExpired:
        log("cluster down timed out; killing the nodes")
    try:
        meta = json.loads((cdir / "cluster.json").read_text())
    except (OSError, ValueError):
        return
    for node in meta.get("controllers", []) + meta.get("brokers", []):
        pid = node.get("pid")
        try:
            if pid and str(cdir) in " ".join(psutil.Process(pid).cmdline()):
                psutil.Process(pid).kill()
        except psutil.Error:
            pass


def targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    def get(metric: str, key: str) -> Any:
        r = next((r for r in rows if r["metric"] == metric), None)
        return None if r is None else r.get(key)

    spec = [  # issue 8's targets, and issue 24's at 2M partitions where it set tighter ones
        (
            "1,000 topics x 100 partitions applied everywhere <= 10 s",
            get("bulk_create", "applied_everywhere_s"),
            10,
        ),
        ("controller RSS <= 2 GiB (MiB)", get("controller_memory_snapshot", "max_rss_mib"), 2048),
        ("snapshot write <= 5 s", get("controller_memory_snapshot", "snapshot_write_s"), 5),
        (
            "cold start from snapshot + log (node process start -> caught up) <= 10 s",
            get("failover_cold_start", "cold_start_from_exec_median_s"),
            10,
        ),
        ("failover -> next write, median <= 0.5 s", get("failover_cold_start", "failover_s"), 0.5),
        ("failover -> next write, max <= 1 s", get("failover_cold_start", "failover_max_s"), 1),
        (
            "killed broker's partitions re-elected <= 3 s after fence",
            get("broker_kill", "leaders_moved_s"),
            3,
        ),
        ("controlled shutdown <= 5 s", get("controlled_shutdown", "seconds"), 5),
        (
            "whole-cluster restart -> every partition online <= 60 s",
            get("whole_restart", "all_online_s"),
            60,
        ),
        (
            "new broker catches up on the full image <= 15 s",
            get("new_broker_catch_up", "seconds"),
            15,
        ),
        (
            "3 real brokers x 10,000 partitions restarted -> RUNNING <= 30 s",
            get("real_brokers_restart", "restart_to_running_s"),
            30,
        ),
    ]
    return [
        {
            "target": name,
            "value": v,
            "limit": limit,
            "ratio": round(v / limit, 3) if isinstance(v, (int, float)) else None,
            "met": (v <= limit) if isinstance(v, (int, float)) else None,
        }
        for name, v, limit in spec
    ]


def run(
    topics: int = 10_000,
    partitions: int = 100,
    brokers: int = 33,
    per_request: int = 10,
    inflight: int = 8,
    real_topics: int = 100,
    keep: bool = False,
    catch_up: bool = True,
    failovers: int = 5,
    phases: frozenset[str] = frozenset(),
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """All phases (``phases``: only these of the optional ones, see ``OPTIONAL_PHASES``); the
    cluster is always stopped. Its directory (node logs) is kept when a phase failed or ``keep``
    is set."""
    work = Path(tempfile.mkdtemp(prefix="kraft-bench-scale-"))
    cdir = work / "c"
    bench = Scale(cdir, topics, partitions, brokers, per_request, inflight, failovers, phases)
    try:
        log("starting 3 controllers")
        cli("cluster", "up", "--dir", str(cdir), "--controllers", "3", "--detach", "--no-auth")
        # the 60 simulated brokers' shared replay runs as a controller does (kraft/heap.py,
        # kraft.controller_server.main): no automatic cyclic collection; the replay's heap
        # freezes collect, and so does every phase's end (Scale.phase)
        gc.disable()
        try:
            trio.run(bench.main)
        finally:
            gc.enable()
        if catch_up:
            bench.catch_up()
    except BaseException:
        bench.failed = True
        raise
    finally:
        stop_cluster(cdir)
        if keep or bench.failed:
            log(f"cluster directory kept for inspection: {cdir}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    if real_topics:
        bench.rows.append(real_brokers(real_topics, partitions))
    return bench.rows, targets(bench.rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--topics", type=int, default=20_000)
    ap.add_argument("--partitions", type=int, default=100)
    ap.add_argument("--brokers", type=int, default=60)
    ap.add_argument("--failovers", type=int, default=5, help="kill -9 rounds of the leader")
    ap.add_argument("--per-request", type=int, default=10, help="topics per CreateTopics request")
    ap.add_argument("--inflight", type=int, default=8)
    ap.add_argument(
        "--real-topics",
        type=int,
        default=100,
        help="topics (x --partitions, RF 3) for the 3-real-broker restart (0 = skip)",
    )
    ap.add_argument("--keep", action="store_true", help="keep the cluster directory (node logs)")
    ap.add_argument(
        "--no-catch-up",
        dest="catch_up",
        action="store_false",
        help="skip the new real broker's catch-up on the full image",
    )
    ap.add_argument(
        "--phases",
        default="",
        help="comma-separated optional phases to run (default: all): " + ", ".join(OPTIONAL_PHASES),
    )
    a = ap.parse_args(argv)
    phases = frozenset(p for p in a.phases.split(",") if p)
    if phases - set(OPTIONAL_PHASES):
        ap.error(f"unknown phase(s): {', '.join(sorted(phases - set(OPTIONAL_PHASES)))}")
    # stop cleanly (cluster down, sim brokers, the catch-up broker) on SIGTERM, and on SIGINT even
    # when started in the background (where the shell ignores SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    rows, tg = run(
        a.topics,
        a.partitions,
        a.brokers,
        a.per_request,
        a.inflight,
        a.real_topics,
        a.keep,
        a.catch_up,
        a.failovers,
        phases,
    )
    print(table(rows, tg))
    print(json.dumps({"system": "pykraft", "bench": "scale", "results": rows, "targets": tg}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
