"""The fault injector: run a workload against a :class:`ChaosCluster`, inject faults one round at a
time, measure recovery, then collect the facts and run every history check.

Fault kinds (a round injects one, holds it, heals it, and waits until the cluster is healthy):

* ``kill-controller`` / ``kill-broker``: ``kill -9``, down 0.5-2 s, restart.
* ``kill-in-election``: ``kill -9`` the leader, and while the others elect a new one ``kill -9``
  one of them too; restart both at staggered moments (a voter crash-restarted mid-election).
* ``pause-controller`` / ``pause-broker``: SIGSTOP for longer than the election, fetch and broker
  session timeouts, then SIGCONT.
* ``partition-cut`` / ``partition-stall``: isolate the active controller (every Raft link and its
  RPC proxy; connections reset, or silently stalled). A client on its side writes directly to it
  (must not be acknowledged) while the majority must elect a new leader; then heal.
* ``pause-leader`` / ``stall-leader``: the active controller SIGSTOPped, or silently stalled
  (process alive, sockets open, no bytes), for twice the broker session timeout. Brokers must
  follow the new leader: no healthy broker may lose its session (see the availability check).
* ``full-disk``: a controller's disk (its metadata directory's own tmpfs, see
  :mod:`tests.chaos.disk`) becomes full while the workload writes. It must exit with status 3
  within :data:`FULL_DISK_EXIT_S` (still running, or another status, is an anomaly); the disk
  stays full a moment, is freed, and the controller is restarted on its own data.
* ``wiped-disk``: a controller is killed and its directory emptied. Started as it is, it must
  refuse (exit 1, "no meta.properties"; starting is an anomaly); the harness then runs
  ``kraft storage recover --config FILE --from-peers`` (retried until the others have a
  leader) and starts it: it must copy the history from its peers (the log, image and
  acknowledged-write checks cover it).

Availability (``check_availability``): with the fault windows recorded here, every broker fenced
at once, or a partition leaderless for longer than one session timeout while its replicas and a
controller majority were unfaulted, is an anomaly. Session-timeout fences of brokers no fault
was aimed at are counted (``healthy_broker_fences``). Both stop where ``finish`` stops the
cluster: the brokers' controlled shutdowns fence them on purpose.

Recovery time is from the heal (restart, SIGCONT, partition healed) until: every controller
answers and agrees on one active leader and has caught up to it, every broker runs with its
current incarnation registered and unfenced and has heartbeated the active controller within
three heartbeat intervals, and the workload had an operation acknowledged.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from broker.state import describe as describe_broker
from kraft.log.metadata_log import MetadataLog
from kraft.rpc.client import call_sync
from kraft.storage.failure import EXIT_STORAGE_FAILURE
from tests.chaos.cluster import ChaosCluster
from tests.chaos.disk import can_mount
from tests.chaos.history import (
    OK,
    Anomaly,
    FaultWindow,
    History,
    check_availability,
    check_images,
    check_leader_epochs,
    check_logs_identical,
    check_operations,
    check_raft_terms,
    leader_reports,
    scan_log,
    unexplained_fences,
)
from tests.chaos.workload import Workload, call_one_node, perform
from tests.harness import REPO, log_stream_digest

FAULT_KINDS = (
    "kill-controller",
    "kill-broker",
    "kill-in-election",
    "pause-controller",
    "pause-broker",
    "partition-cut",
    "partition-stall",
    "pause-leader",
    "stall-leader",
    "full-disk",
    "wiped-disk",
)
NEEDS_MOUNT = ("full-disk",)  # a real ENOSPC: a tmpfs per controller (root)
RECOVERY_TIMEOUT_S = 60.0
BROKER_DESCRIBE_S = 5.0  # one broker state answer while judging health
FULL_DISK_EXIT_S = 30.0  # the workload writes several times a second: plenty to hit ENOSPC
RECOVER_TIMEOUT_S = 30.0
# a rebuilt controller copies the whole history (tens of thousands of records late in a soak)
WIPED_RECOVERY_TIMEOUT_S = 180.0
REFUSED_START_TIMEOUT_S = 120.0  # a CLI start on 2 loaded cores can take tens of seconds
# one `storage recover --from-peers`: it copies the whole history, minutes on 2 loaded cores
RECOVER_CALL_TIMEOUT_S = 300.0


def fault_kinds(disk_faults: bool) -> tuple[str, ...]:
    """The kinds this machine can inject (no ``full-disk`` where a tmpfs cannot be mounted)."""
    return tuple(k for k in FAULT_KINDS if disk_faults or k not in NEEDS_MOUNT)


@dataclass
class FaultResult:
    kind: str
    target: int
    held_s: float
    recovery_s: float | None
    note: str = ""
    window: FaultWindow | None = None


@dataclass
class ChaosReport:
    faults: list[FaultResult] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    anomalies: list[Anomaly] = field(default_factory=list)
    minority_outcomes: list[str] = field(default_factory=list)
    election_s: list[float] = field(default_factory=list)
    terms_seen: int = 0
    leader_reports: list[tuple[int, int]] = field(default_factory=list)  # (term, node id)
    final_offset: int = -1
    healthy_fences: list[tuple[int, int, str]] = field(default_factory=list)
    disk_outcomes: list[str] = field(default_factory=list)  # one per full/wiped-disk round

    def summary(self) -> dict[str, Any]:
        by_kind: dict[str, int] = {}
        for f in self.faults:
            by_kind[f.kind] = by_kind.get(f.kind, 0) + 1
        rec = [f.recovery_s for f in self.faults if f.recovery_s is not None]
        return {
            "rounds": len(self.faults),
            "faults": by_kind,
            "operations": self.counts,
            "anomalies": len(self.anomalies),
            "anomaly_details": [f"{a.kind}: {a.detail}" for a in self.anomalies[:20]],
            "recovery_s": {
                "p50": percentile(rec, 50),
                "p99": percentile(rec, 99),
                "max": round(max(rec), 3) if rec else None,
            },
            "recovery_s_by_kind": {
                k: percentile(
                    [f.recovery_s for f in self.faults if f.kind == k and f.recovery_s is not None],
                    50,
                )
                for k in by_kind
            },
            "minority_writes": {
                o: self.minority_outcomes.count(o) for o in sorted(set(self.minority_outcomes))
            },
            "majority_election_s_p50": percentile(self.election_s, 50),
            "healthy_broker_fences": len(self.healthy_fences),
            "disk_outcomes": {
                o: self.disk_outcomes.count(o) for o in sorted(set(self.disk_outcomes))
            },
            "raft_terms_seen": self.terms_seen,
            "terms_with_a_leader": len({t for t, _ in self.leader_reports}),
            "final_metadata_offset": self.final_offset,
        }


def kraft_cli(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """``kraft ARGS`` in a child process; a run past ``timeout`` is killed (returncode -9)."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    try:
        return subprocess.run(
            [sys.executable, "-m", "tools.cli", *args],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as e:
        out = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else ""
        return subprocess.CompletedProcess(e.cmd, -9, "", out or "")


def wall_ms() -> int:
    """Wall-clock ms, the clock of the log's batch timestamps."""
    return int(time.time() * 1000)


def percentile(values: list[float], p: float) -> float | None:
    """Nearest-rank percentile, rounded to ms (None for no values)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(p / 100 * len(ordered) + 0.5)))
    return round(ordered[rank - 1], 3)


def describe_node(
    cluster: ChaosCluster, node_id: int, checksum: bool = False, timeout: float = 1.0
) -> dict[str, Any]:
    """A controller's DescribeNode, asked on its real port (not through its proxy)."""
    return call_sync([cluster.real_rpc(node_id)], "DescribeNode", {"checksum": checksum}, timeout)


class Sampler:
    """Background observations: the Raft terms controllers report and the brokers'
    per-partition (leader epoch, leader)."""

    def __init__(self, cluster: ChaosCluster, interval: float = 0.2) -> None:
        self.cluster = cluster
        self.interval = interval
        self.terms: set[int] = set()
        self.partitions: set[tuple[str, int, int, int]] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-sampler", daemon=True)

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def sample_once(self) -> None:
        for cid in self.cluster.controller_ids:
            if cid in self.cluster.paused:
                continue
            try:
                raft = describe_node(self.cluster, cid, timeout=0.5)["raft"]
            except Exception:  # down, paused or busy: nothing observed
                continue
            self.terms.add(raft.get("term", 0))
        for bid in self.cluster.broker_ids:
            if bid in self.cluster.paused:
                continue
            b = self.cluster.node(bid)
            try:
                state = describe_broker(b.host, b.admin_port, timeout=0.5)
            except (OSError, ValueError):
                continue
            for p in state.get("partitions", []):
                if p.get("topic_id") and p.get("leader_epoch", -1) >= 0:
                    self.partitions.add(
                        (p["topic_id"], p["partition"], p["leader_epoch"], p["leader"])
                    )

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample_once()


class ChaosRun:
    """One cluster, one workload, a sequence of fault rounds, then the verdict."""

    def __init__(
        self,
        directory: Path,
        seed: int = 0,
        brokers: int = 3,
        workers: int = 3,
        log: Callable[[str], None] = lambda s: None,
        sample_interval: float = 0.2,
        op_pause_s: float = 0.05,
        disk_faults: bool | None = None,
    ) -> None:
        # full disks need a tmpfs per controller: on where this machine can mount one
        self.disk_faults = can_mount() if disk_faults is None else disk_faults
        self.kinds = fault_kinds(self.disk_faults)
        self.cluster = ChaosCluster(
            directory, brokers=brokers, seed=seed, disk_faults=self.disk_faults
        )
        self.rng = random.Random(seed)
        self.history = History()
        self.workload: Workload | None = None
        self.workers = workers
        self.brokers = brokers
        self.seed = seed
        self.sampler: Sampler | None = None
        self.report = ChaosReport()
        self.log = log
        self.sample_interval = sample_interval
        self.op_pause_s = op_pause_s
        self._minority_n = 0
        self._round_nodes: set[int] = set()  # nodes the current round's fault hit
        self._quorum_lost = False  # the current round took a controller majority away

    # ---- driving --------------------------------------------------------------------------------

    def __enter__(self) -> ChaosRun:
        try:
            self.cluster.up()
            self.workload = Workload(
                self.cluster.bootstrap(),
                self.history,
                seed=self.seed,
                workers=self.workers,
                max_rf=max(1, self.brokers),
                pause_s=self.op_pause_s,
            ).start()
            self.sampler = Sampler(self.cluster, self.sample_interval).start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            if self.sampler is not None:
                self.sampler.stop()
            if self.workload is not None:
                self.workload.stop()
        finally:
            try:
                self.cluster.down()
            finally:
                self.cluster.release_disks()

    def run_round(self, kind: str) -> FaultResult:
        """Inject one fault of ``kind``, heal it, wait for recovery."""
        if kind not in self.kinds:
            raise ValueError(f"fault kind {kind!r} is not available here (kinds: {self.kinds})")
        handler = getattr(self, "_" + kind.replace("-", "_"))
        self._round_nodes, self._quorum_lost = set(), False
        start_ms = wall_ms()
        target, held, note = handler()
        healed_at = time.monotonic()
        limit = WIPED_RECOVERY_TIMEOUT_S if kind == "wiped-disk" else RECOVERY_TIMEOUT_S
        recovery = self._wait_healthy(healed_at, limit)
        window = FaultWindow(
            kind,
            frozenset(self._round_nodes | {target}),
            start_ms,
            wall_ms() + 1000,  # the log's clock is the leader's: a second's slack
            self._quorum_lost,
        )
        if recovery is None:
            self.report.anomalies.append(
                Anomaly(
                    "no-recovery",
                    f"{kind} on node {target}: cluster not healthy {limit}s after healing",
                )
            )
        result = FaultResult(kind, target, round(held, 3), recovery, note, window)
        self.report.faults.append(result)
        self.log(
            f"round {len(self.report.faults)}: {kind} node {target} held {held:.1f}s, "
            f"recovered in {recovery if recovery is None else round(recovery, 2)}s {note}"
        )
        return result

    def random_kind(self) -> str:
        return self.rng.choice([k for k in self.kinds if self.brokers or "broker" not in k])

    # ---- faults ---------------------------------------------------------------------------------

    def _leader(self) -> int:
        for cid in self.cluster.controller_ids:
            try:
                if describe_node(self.cluster, cid)["is_active"]:
                    return cid
            except Exception:
                continue
        return self.rng.choice(self.cluster.controller_ids)

    def _controller_target(self) -> tuple[int, str]:
        """The leader (60%) or a random controller, and a note saying which it was."""
        leader = self._leader()
        target = leader if self.rng.random() < 0.6 else self.rng.choice(self.cluster.controller_ids)
        return target, "the leader" if target == leader else "a follower"

    def _kill_controller(self) -> tuple[int, float, str]:
        target, role = self._controller_target()
        node_id, held, _ = self._kill(target)
        return node_id, held, role

    def _kill_broker(self) -> tuple[int, float, str]:
        return self._kill(self.rng.choice(self.cluster.broker_ids))

    def _kill(self, node_id: int) -> tuple[int, float, str]:
        t0 = time.monotonic()
        self.cluster.kill(node_id, signal.SIGKILL)
        time.sleep(self.rng.uniform(0.5, 2.0))  # the fault's duration, not a synchronisation
        self.cluster.start(node_id)
        return node_id, time.monotonic() - t0, ""

    def _kill_in_election(self) -> tuple[int, float, str]:
        leader = self._leader()
        second = self.rng.choice([c for c in self.cluster.controller_ids if c != leader])
        t0 = time.monotonic()
        self.cluster.kill(leader, signal.SIGKILL)
        # fault timing, not synchronisation: land inside the election (timeout 0.4-1.0 x max)
        time.sleep(self.rng.uniform(0.1, self.cluster.election_timeout_ms / 1000))
        self.cluster.kill(second, signal.SIGKILL)
        self._round_nodes.add(second)
        self._quorum_lost = True
        self.cluster.start(leader)
        time.sleep(self.rng.uniform(0.2, 1.0))
        self.cluster.start(second)
        return leader, time.monotonic() - t0, f"then killed {second} mid-election"

    def _pause_hold_s(self, broker: bool) -> float:
        """Longer than every timeout; a broker's pause leaves time for its fence to commit."""
        c = self.cluster
        longest = max(c.election_timeout_ms, c.fetch_timeout_ms, c.session_timeout_ms) / 1000
        return longest + (3.0 if broker else 1.0)

    def _pause_controller(self) -> tuple[int, float, str]:
        target, role = self._controller_target()
        node_id, held, _ = self._pause(target)
        return node_id, held, role

    def _leader_hold_s(self) -> float:
        """Twice the session timeout: a broker left on the old leader would surely be fenced."""
        return 2 * self.cluster.session_timeout_ms / 1000

    def _pause_leader(self) -> tuple[int, float, str]:
        leader = self._leader()
        t0 = time.monotonic()
        self.cluster.pause(leader)
        elected = self._wait_new_leader(
            [c for c in self.cluster.controller_ids if c != leader], self._leader_hold_s()
        )
        time.sleep(max(0.0, t0 + self._leader_hold_s() - time.monotonic()))  # the fault's length
        self.cluster.resume(leader)
        return leader, time.monotonic() - t0, self._elected_note(elected, t0)

    def _stall_leader(self) -> tuple[int, float, str]:
        leader = self._leader()
        t0 = time.monotonic()
        self.cluster.isolate(leader, stall=True)
        elected = self._wait_new_leader(
            [c for c in self.cluster.controller_ids if c != leader], self._leader_hold_s()
        )
        time.sleep(max(0.0, t0 + self._leader_hold_s() - time.monotonic()))  # the fault's length
        self.cluster.heal()
        return leader, time.monotonic() - t0, self._elected_note(elected, t0)

    def _elected_note(self, elected: float | None, t0: float) -> str:
        if elected is None:
            self.report.anomalies.append(
                Anomaly("no-majority-leader", "no new leader while the old one was stopped")
            )
            return "no new leader"
        self.report.election_s.append(elected - t0)
        return f"new leader after {elected - t0:.2f}s"

    def _pause_broker(self) -> tuple[int, float, str]:
        return self._pause(self.rng.choice(self.cluster.broker_ids))

    def _pause(self, node_id: int) -> tuple[int, float, str]:
        """SIGSTOP, hold, SIGCONT. A paused broker must be fenced before its pause ends."""
        t0 = time.monotonic()
        self.cluster.pause(node_id)
        end = t0 + self._pause_hold_s(broker=node_id in self.cluster.broker_ids)
        fenced_after: float | None = None
        while time.monotonic() < end:  # the fault's duration; meanwhile watch for the fence
            if node_id in self.cluster.broker_ids and fenced_after is None:
                if node_id not in self._unfenced_brokers(timeout=0.5):
                    fenced_after = time.monotonic() - t0
            time.sleep(0.1)
        self.cluster.resume(node_id)
        note = ""
        if node_id in self.cluster.broker_ids:
            if fenced_after is None:
                self.report.anomalies.append(
                    Anomaly(
                        "not-fenced", f"broker {node_id} paused {end - t0:.1f}s was never fenced"
                    )
                )
            note = (
                f"fenced after {fenced_after:.2f}s" if fenced_after is not None else "never fenced"
            )
        return node_id, time.monotonic() - t0, note

    def _full_disk(self) -> tuple[int, float, str]:
        """Fill a controller's disk; it must exit 3. Then free the disk and restart it."""
        target, role = self._controller_target()
        disks = self.cluster.disks
        assert disks is not None
        directory = self.cluster.metadata_dir(target)
        t0 = time.monotonic()
        disks.fill(directory)
        code = self.cluster.exit_code(target, FULL_DISK_EXIT_S)
        stopped = time.monotonic() - t0
        if code is None:
            self.report.anomalies.append(
                Anomaly(
                    "full-disk-kept-running",
                    f"controller {target} still ran {FULL_DISK_EXIT_S}s after its disk filled",
                )
            )
            self.cluster.kill(target)
            outcome = "full-disk: kept running"
        elif code != EXIT_STORAGE_FAILURE:
            self.report.anomalies.append(
                Anomaly("full-disk-exit", f"controller {target} exited {code} on a full disk")
            )
            outcome = f"full-disk: exit {code}"
        else:
            outcome = f"full-disk: exit {EXIT_STORAGE_FAILURE}"
        self.report.disk_outcomes.append(outcome)
        time.sleep(self.rng.uniform(0.5, 2.0))  # the fault's duration: the disk stays full
        disks.free(directory)
        self.cluster.start(target)
        return target, time.monotonic() - t0, f"{role}, {outcome} after {stopped:.1f}s"

    def _wiped_disk(self) -> tuple[int, float, str]:
        """Kill a controller and empty its directory; it must refuse to start as it is, and
        ``kraft storage recover --from-peers`` brings it back."""
        target, role = self._controller_target()
        t0 = time.monotonic()
        self.cluster.kill(target, signal.SIGKILL)
        directory = self.cluster.metadata_dir(target)
        if self.cluster.disks is not None:
            self.cluster.disks.wipe(directory)
        else:
            shutil.rmtree(directory)
            directory.mkdir()
        config = self.cluster.node(target).config
        started = time.monotonic()
        refused = kraft_cli("controller", "--config", config, timeout=REFUSED_START_TIMEOUT_S)
        took = time.monotonic() - started
        if refused.returncode != 1 or "no meta.properties" not in refused.stderr:
            self.report.anomalies.append(
                Anomaly(
                    "wiped-started",
                    f"controller {target} with a wiped directory exited "
                    f"{refused.returncode} after {took:.1f}s: {refused.stderr[-300:]!r}",
                )
            )
        deadline = time.monotonic() + RECOVER_TIMEOUT_S
        while True:  # recover needs a leader among the others (the target may have been it)
            recovered = kraft_cli(
                "storage",
                "recover",
                "--config",
                config,
                "--from-peers",
                timeout=RECOVER_CALL_TIMEOUT_S,
            )
            if recovered.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        if recovered.returncode != 0:
            self.report.anomalies.append(
                Anomaly(
                    "recover-failed",
                    f"controller {target}: recover --from-peers exited "
                    f"{recovered.returncode}: {recovered.stderr[-300:]!r}",
                )
            )
            outcome = "wiped-disk: recover failed"
        else:
            outcome = "wiped-disk: refused, recovered from peers"
        if refused.returncode != 1:
            outcome = f"wiped-disk: started (exit {refused.returncode})"
        self.report.disk_outcomes.append(outcome)
        self.cluster.start(target)
        return target, time.monotonic() - t0, f"{role}, {outcome}"

    def _unfenced_brokers(self, timeout: float) -> set[int]:
        try:
            d = call_sync(self.cluster.bootstrap(), "DescribeCluster", {}, timeout)
        except Exception:  # no answer: count nobody as fenced yet
            return set(self.cluster.broker_ids)
        return {b["broker_id"] for b in d.get("brokers", []) if not b.get("fenced")}

    def _partition_cut(self) -> tuple[int, float, str]:
        return self._partition(stall=False)

    def _partition_stall(self) -> tuple[int, float, str]:
        return self._partition(stall=True)

    def _partition(self, stall: bool) -> tuple[int, float, str]:
        leader = self._leader()
        t0 = time.monotonic()
        self.cluster.isolate(leader, stall=stall)
        self._minority_n += 1
        probe_op: list[Any] = []
        probe = threading.Thread(
            target=lambda: probe_op.append(self._minority_write(leader)), daemon=True
        )
        probe.start()
        others = [c for c in self.cluster.controller_ids if c != leader]
        elected = self._wait_new_leader(others, timeout=30.0)
        if elected is None:
            self.report.anomalies.append(
                Anomaly(
                    "no-majority-leader",
                    f"controllers {others} elected no leader while {leader} was isolated",
                )
            )
        else:
            self.report.election_s.append(elected - t0)
        probe.join(20.0)
        outcome = probe_op[0].outcome if probe_op else "unfinished"
        self.report.minority_outcomes.append(outcome)
        if outcome == OK:
            self.report.anomalies.append(
                Anomaly(
                    "minority-ack",
                    f"isolated controller {leader} acknowledged a write: {probe_op[0]}",
                )
            )
        self.cluster.heal()
        note = f"minority write {outcome}" + (
            "" if elected is None else f", new leader after {elected - t0:.2f}s"
        )
        return leader, time.monotonic() - t0, note

    def _minority_write(self, leader: int) -> Any:
        address = self.cluster.real_rpc(leader)
        topic = f"minority-{self.seed}-{self._minority_n}"

        async def call(
            api: str, body: dict[str, Any], timeout: float, request_id: str
        ) -> dict[str, Any]:
            return await call_one_node(address, api, body, timeout, request_id)

        return trio.run(
            perform,
            call,
            self.history,
            "create",
            topic,
            {"partitions": 1, "replication_factor": 1},
            12.0,
        )

    def _wait_new_leader(self, candidates: list[int], timeout: float) -> float | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for cid in candidates:
                try:
                    if describe_node(self.cluster, cid, timeout=0.5)["is_active"]:
                        return time.monotonic()
                except Exception:
                    pass
            time.sleep(0.05)
        return None

    # ---- health ---------------------------------------------------------------------------------

    def _healthy(self, since: float, target: list[int]) -> bool:
        views = {
            cid: describe_node(self.cluster, cid, timeout=1.0)
            for cid in self.cluster.controller_ids
        }
        active = [cid for cid, v in views.items() if v["is_active"]]
        leaders = {v["raft"].get("leader_id") for v in views.values()}
        if len(active) != 1 or leaders != {active[0]}:
            return False
        if not target:
            target.append(views[active[0]]["log_end_offset"])
        if any(v["log_end_offset"] < target[0] for v in views.values()):
            return False
        if self.cluster.broker_ids:
            d = call_sync(self.cluster.bootstrap(), "DescribeCluster", {}, 1.0)
            registered = {b["broker_id"]: b for b in d.get("brokers", []) if not b.get("fenced")}
            for bid in self.cluster.broker_ids:
                node = self.cluster.node(bid)
                # a broker listing a few thousand partitions on a machine loaded 6x over its
                # cores took over 1 s per answer for a minute on end: a longer wait per answer
                state = describe_broker(node.host, node.admin_port, timeout=BROKER_DESCRIBE_S)
                reg = registered.get(bid)
                if (
                    reg is None
                    or state.get("state") != "RUNNING"
                    or state.get("incarnation_id") != reg.get("incarnation_id")
                ):
                    return False
            # ... and every broker heartbeats the active controller again
            q = call_sync([self.cluster.real_rpc(active[0])], "DescribeQuorum", {}, 1.0)
            contact = {o["broker_id"]: o["last_contact_ms"] for o in q.get("observers", [])}
            fresh_ms = 3 * self.cluster.heartbeat_interval_ms
            if any(contact.get(bid, fresh_ms + 1) > fresh_ms for bid in self.cluster.broker_ids):
                return False
        return self.workload is not None and self.workload.ok_since(since)

    def _wait_healthy(self, since: float, limit: float = RECOVERY_TIMEOUT_S) -> float | None:
        deadline = since + limit
        target: list[int] = []
        while time.monotonic() < deadline:
            try:
                if self._healthy(since, target):
                    return time.monotonic() - since
            except Exception:  # a node still starting: not healthy yet
                pass
            time.sleep(0.1)
        return None

    # ---- verdict --------------------------------------------------------------------------------

    def finish(self, settle_timeout: float = 90.0) -> ChaosReport:
        """Stop the workload, let every node converge, stop the cluster, run every check."""
        assert self.workload is not None and self.sampler is not None
        self.workload.stop()
        self.workload = None
        self.cluster.heal()
        images = self._settled_images(settle_timeout)
        self.sampler.sample_once()
        self.sampler.stop()
        down_ms = wall_ms()  # from here the brokers shut down (and are fenced) on purpose
        self.cluster.down()
        digests = {
            cid: log_stream_digest(self.cluster.log_dir(cid)) for cid in self.cluster.controller_ids
        }
        with MetadataLog.open(self.cluster.log_dir(self._whole_log()), fsync="never") as mlog:
            facts = scan_log(mlog.read_batches(0), checksum_at={off for off, _ in images.values()})
        r = self.report
        r.counts = self.history.counts()
        r.final_offset = facts.final.offset
        r.leader_reports = sorted(
            {
                rep
                for cid in self.cluster.controller_ids
                for rep in leader_reports(
                    Path(self.cluster.node(cid).log_file).read_text(errors="replace")
                )
            }
        )
        r.terms_seen = len(self.sampler.terms | {t for t, _ in facts.leader_changes})
        r.anomalies += check_operations(self.history.ops, facts)
        r.anomalies += check_logs_identical(digests)
        r.anomalies += check_images(images, facts)
        r.anomalies += check_leader_epochs(facts.leader_epochs, sorted(self.sampler.partitions))
        r.anomalies += check_raft_terms(facts.leader_changes, r.leader_reports)
        windows = [f.window for f in r.faults if f.window is not None]
        if windows:
            span = (windows[0].start_ms, min(windows[-1].end_ms, down_ms))
            r.anomalies += check_availability(
                facts.outages, windows, span, self.cluster.session_timeout_ms
            )
            r.healthy_fences = unexplained_fences(facts.fences, windows, span)
        return r

    def _whole_log(self) -> int:
        """A controller whose metadata log starts at offset 0 (the checker replays it all); a
        controller rebuilt from its peers may hold a snapshot instead."""
        starts = {}
        for cid in self.cluster.controller_ids:
            with MetadataLog.open(self.cluster.log_dir(cid), fsync="never") as mlog:
                starts[cid] = mlog.start_offset
        whole = [cid for cid, start in starts.items() if start == 0]
        if not whole:
            raise AssertionError(
                f"no controller's log starts at offset 0 ({starts}); the checker replays from "
                "offset 0 (raise the snapshot threshold)"
            )
        return whole[0]

    def _settled_images(self, timeout: float) -> dict[int, tuple[int, str]]:
        """Once every node has applied the same offset: node id -> (offset, image checksum)."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            try:
                images = {
                    cid: describe_node(self.cluster, cid, checksum=True, timeout=5.0)
                    for cid in self.cluster.controller_ids
                }
                seen = {
                    cid: (v["applied_offset"], v["image_checksum"]) for cid, v in images.items()
                }
                for bid in self.cluster.broker_ids:
                    b = self.cluster.node(bid)
                    s = describe_broker(b.host, b.admin_port, timeout=5.0)
                    seen[bid] = (s["last_applied_offset"], s["image_checksum"])
                last = seen
                if len({off for off, _ in seen.values()}) == 1:
                    return seen
            except Exception as e:
                last = e
            time.sleep(0.2)
        raise AssertionError(f"nodes did not converge within {timeout}s: {last!r}")
