"""A real local cluster wired through proxies, with the faults the injector needs.

:class:`ChaosCluster` plans a cluster with the launcher (``tools/cluster.py``), then rewrites the
controller and broker configs so that every controller reaches its peers' Raft ports through a
per-pair :class:`~tests.chaos.proxy.RaftMesh`, and everyone (controllers' leader hints, brokers,
the workload) reaches a controller's RPC port through that controller's RPC proxy. cluster.json
keeps the real ports, so ``kraft --cluster DIR`` still works. Nodes are started, killed
(``kill -9``), paused (SIGSTOP/SIGCONT) and restarted from this process.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
from pathlib import Path
from typing import Any

from kraft.config import write_properties
from tests.chaos.disk import TmpfsDisks
from tests.chaos.proxy import Proxy, RaftMesh, bind_low_port
from tools import cluster as launcher


class ChaosCluster:
    """3 controllers (+ ``brokers`` real brokers) on loopback behind cuttable proxies."""

    def __init__(
        self,
        directory: Path,
        brokers: int = 3,
        seed: int = 0,
        *,
        session_timeout_ms: int = 4000,
        heartbeat_interval_ms: int = 500,
        election_timeout_ms: int = 1000,
        fetch_timeout_ms: int = 2500,
        disk_faults: bool = False,
    ) -> None:
        self.dir = Path(directory).resolve()
        self.rng = random.Random(seed)
        self.n_brokers = brokers
        self.session_timeout_ms = session_timeout_ms
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.election_timeout_ms = election_timeout_ms
        self.fetch_timeout_ms = fetch_timeout_ms
        self.layout: launcher.ClusterLayout | None = None
        self.mesh: RaftMesh | None = None
        self.rpc_proxies: dict[int, Proxy] = {}
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.paused: set[int] = set()
        # each controller's metadata directory on a tmpfs of its own (full and wiped disks)
        self.disks: TmpfsDisks | None = TmpfsDisks() if disk_faults else None

    # ---- lifecycle ------------------------------------------------------------------------------

    def up(self, ready_timeout: float = 120.0) -> ChaosCluster:
        layout = self.layout = launcher.plan_cluster(self.dir, 3, self.n_brokers)
        launcher.ensure_raft_secret(layout, self.dir)  # controllers refuse to run Raft without
        if self.disks is not None:  # before formatting: meta.properties lives on the tmpfs
            for c in layout.controllers:
                self.disks.mount(Path(c.metadata_dir))
        launcher.write_node_configs(layout)
        self.mesh = RaftMesh.build(
            {c.id: (c.host, c.raft_port) for c in layout.controllers}, self.rng
        )
        for c in layout.controllers:
            self.rpc_proxies[c.id] = Proxy(
                (c.host, c.rpc_port), bind_low_port(self.rng), name=f"rpc->{c.id}"
            ).start()
        timing = {
            "broker.session.timeout.ms": self.session_timeout_ms,
            "broker.heartbeat.interval.ms": self.heartbeat_interval_ms,
        }
        for c in layout.controllers:
            props: dict[str, Any] = launcher.controller_properties(layout, c)
            props["controller.quorum.raft.voters"] = self.mesh.voters_for(c.id)
            props["controller.quorum.voters"] = ",".join(
                f"{o.id}@{o.host}:{o.rpc_port}"
                if o.id == c.id
                else f"{o.id}@{self.rpc_proxies[o.id].address}"
                for o in layout.controllers
            )
            props["controller.quorum.election.timeout.ms"] = self.election_timeout_ms
            props["controller.quorum.fetch.timeout.ms"] = self.fetch_timeout_ms
            write_properties(c.config, {**props, **timing})
        for b in layout.brokers:
            props = launcher.broker_properties(layout, b)
            props["controller.quorum.bootstrap.servers"] = ",".join(self.bootstrap_strings())
            write_properties(b.config, {**props, **timing})
        launcher.write_cluster_json(self.dir, layout)
        for node in layout.nodes():
            self.procs[node.id] = launcher.start_node(node)
        launcher.write_cluster_json(self.dir, layout)
        launcher.wait_ready(
            layout, ready_timeout, self.procs, required_brokers={b.id for b in layout.brokers}
        )
        return self

    def down(self) -> None:
        """Resume paused nodes, stop every node (SIGTERM, then SIGKILL), close the proxies."""
        if self.layout is None:
            return
        for node_id in list(self.paused):
            self.resume(node_id)
        if self.mesh is not None:
            self.mesh.heal()
        launcher.stop_cluster(self.layout, 20.0, self.procs)
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)
        self.close_proxies()

    def release_disks(self) -> None:
        """Unmount the tmpfs disks, their contents copied onto the real directories."""
        if self.disks is not None:
            self.disks.release()

    def close_proxies(self) -> None:
        if self.mesh is not None:
            self.mesh.close()
            self.mesh = None
        for p in self.rpc_proxies.values():
            p.close()
        self.rpc_proxies = {}

    # ---- addresses ------------------------------------------------------------------------------

    @property
    def controller_ids(self) -> list[int]:
        assert self.layout is not None
        return [c.id for c in self.layout.controllers]

    @property
    def broker_ids(self) -> list[int]:
        assert self.layout is not None
        return [b.id for b in self.layout.brokers]

    def bootstrap(self) -> list[tuple[str, int]]:
        """Controllers' RPC endpoints as clients and brokers see them (through the proxies)."""
        return [("127.0.0.1", p.port) for _, p in sorted(self.rpc_proxies.items())]

    def bootstrap_strings(self) -> list[str]:
        return [f"{h}:{p}" for h, p in self.bootstrap()]

    def real_rpc(self, node_id: int) -> tuple[str, int]:
        c = self.node(node_id)
        return c.host, c.rpc_port

    def node(self, node_id: int) -> Any:
        assert self.layout is not None
        return self.layout.node(node_id)

    def metadata_dir(self, node_id: int) -> Path:
        return Path(self.node(node_id).metadata_dir)

    def log_dir(self, node_id: int) -> Path:
        return Path(self.node(node_id).metadata_dir) / "log"

    # ---- faults ---------------------------------------------------------------------------------

    def kill(self, node_id: int, sig: int = signal.SIGKILL, timeout: float = 10.0) -> None:
        """Signal a node to exit and reap it."""
        node = self.node(node_id)
        self.paused.discard(node_id)
        if launcher.signal_node(node, sig):
            proc = self.procs.get(node_id)
            if proc is not None:
                proc.wait(timeout)
            elif not launcher.wait_until(lambda: not launcher.node_alive(node), timeout):
                raise AssertionError(f"{node.name} still running {timeout}s after signal {sig}")

    def exit_code(self, node_id: int, timeout: float) -> int | None:
        """The exit status of a node this process started, once it exits within ``timeout``
        (None while it still runs)."""
        proc = self.procs[node_id]
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def start(self, node_id: int) -> None:
        node = self.node(node_id)
        if launcher.node_alive(node):
            raise AssertionError(f"{node.name} is already running")
        self.procs[node_id] = launcher.start_node(node)
        launcher.update_pid(self.dir, node_id, node.pid)

    def pause(self, node_id: int) -> None:
        os.kill(self.node(node_id).pid, signal.SIGSTOP)
        self.paused.add(node_id)

    def resume(self, node_id: int) -> None:
        os.kill(self.node(node_id).pid, signal.SIGCONT)
        self.paused.discard(node_id)

    def isolate(self, node_id: int, stall: bool = False) -> None:
        """Cut (or silently stall) every Raft link of a controller and its RPC proxy."""
        assert self.mesh is not None
        self.mesh.isolate(node_id, stall=stall)
        proxy = self.rpc_proxies[node_id]
        proxy.stall() if stall else proxy.cut()

    def heal(self) -> None:
        assert self.mesh is not None
        self.mesh.heal()
        for p in self.rpc_proxies.values():
            p.heal()

    def alive(self, node_id: int) -> bool:
        return launcher.node_alive(self.node(node_id))
