"""``kraft controller --config FILE``: one controller of the quorum, its wiring and its loops.

Wires the pieces together: the metadata log (recovered on start), the committed state machine
(rebuilt from the latest snapshot + the log), the PySyncObj member (:class:`RaftQuorum`), the
controller RPC server with its dispatch (:class:`kraft.controller_apis.ControllerApis`), the
broker-lifecycle supervisor (:class:`kraft.broker_lifecycle.BrokerLifecycle`: heartbeats,
sessions, fencing), periodic snapshots, log flushes, idle no-ops, leadership and joining.

Writes (controller v2): the active controller runs the request's handler against its speculative
state machine (the committed one plus its own batches not yet committed), answers a request that
fails validation at once, and proposes the resulting batch's bytes through Raft; every
controller appends committed batches verbatim (kraft/metadata_applier.py).
"""

from __future__ import annotations

import gc
import logging
import os
import random
import signal
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

import trio

import kraft.quorum.pysyncobj_patches as pysyncobj_patches
from kraft import logsetup, sdnotify
from kraft.broker_lifecycle import BrokerLifecycle
from kraft.config import ConfigError, ControllerConfig, is_loopback
from kraft.controller.cluster_control import also_fenced, offline_replicas_of
from kraft.controller.commands import Command
from kraft.controller.election import Resume, leaving_start, returning_start
from kraft.controller.in_flight import InFlightProposals
from kraft.controller.replication_control import unclean_allowed_in
from kraft.controller.settings import ControllerSettings
from kraft.controller.state_machine import QuorumStateMachine
from kraft.controller_apis import ControllerApis
from kraft.divergence_monitor import DivergenceMonitor
from kraft.errors import ErrorCode, KraftError
from kraft.heap import gc_paused
from kraft.log.errors import CorruptLogError, CorruptSnapshotError
from kraft.log.metadata_log import MetadataLog
from kraft.metadata.delta import MetadataDelta
from kraft.metadata.image import MetadataImage
from kraft.metadata.replay import replay
from kraft.metadata_applier import MetadataApplier
from kraft.quorum.journal_file import JournalCorruptError
from kraft.quorum.raft import RaftQuorum, RaftSettings
from kraft.records import Batch
from kraft.rpc.authorize import parse_principals
from kraft.rpc.client import ControllerClient
from kraft.rpc.server import RpcServer
from kraft.snapshotter import Snapshotter
from kraft.storage import meta_properties
from kraft.storage.failure import node_failed, step_out, storage_failed
from kraft.storage.voter_directories import VoterDirectories
from kraft.wake_pacer import WakePacer

log = logging.getLogger("kraft.controller")

WRITE_TIMEOUT_S = 10.0
_STEPPED_APIS = ("FenceBroker", "UnfenceBroker", "BeginControlledShutdown", "UnregisterBroker")
# Tries at finding where a broker transition starts before its first step scans the image.
TRANSITION_START_ATTEMPTS = 3
# Steps of one broker transition in flight at once (built while the previous one replicates).
STEP_PIPELINE_DEPTH = 2


# A controller process runs without automatic cyclic collection (see main()); every this many
# seconds without a full collection (the heap freezes make one), it collects.
GC_INTERVAL_S = 10.0

# A snapshot that falls due during a stepped broker transition waits for its end, at most this long.
SNAPSHOT_DEFER_MAX_S = 30.0


def now_ms() -> int:
    return int(time.time() * 1000)


def not_controller(leader: tuple[int, str, int] | None) -> KraftError:
    """NOT_CONTROLLER, with where the leader is (its id, host and port) when known."""
    lid, host, port = leader if leader else (-1, "", 0)
    return KraftError(
        ErrorCode.NOT_CONTROLLER,
        "this controller is not active" + ("" if leader else " and no leader is known yet"),
        {"leader_id": lid, "leader_host": host, "leader_port": port},
    )


class ControllerServer:
    """One controller process: quorum member, RPC server, and (when active) broker supervisor."""

    def __init__(self, config: ControllerConfig) -> None:
        self.config = config
        self.node_id = config.node_id
        self.settings = ControllerSettings(
            cluster_id=config.cluster_id,
            num_partitions=config["num.partitions"],
            default_replication_factor=config["default.replication.factor"],
        )
        meta = config.metadata_dir
        (meta / "raft").mkdir(parents=True, exist_ok=True)
        self.log = MetadataLog.open(
            meta / "log",
            segment_bytes=config["metadata.log.segment.bytes"],
            fsync=config["metadata.log.fsync"],
        )
        self.snapshotter = Snapshotter(
            meta / "log",
            self.log,
            config["metadata.log.max.record.bytes.between.snapshots"],
            config["metadata.log.max.snapshot.interval.ms"],
            phase=(self.node_id % 3) / 3,  # controllers snapshot in turn
            fork=hasattr(os, "fork"),  # off the GIL of the Raft ticks (docs/performance.md)
        )
        image = self.snapshotter.load_image()
        self.state_machine = QuorumStateMachine(self.settings, image)
        self._seed_dedup_window(image.offset)
        replayed = 0

        def before_batch(batch: Batch, delta: MetadataDelta) -> None:
            nonlocal replayed
            replayed += 1
            self.state_machine.note_before(batch, delta)

        image = replay(image, self.log.read_batches(image.offset + 1), before_batch)
        self.state_machine.start_at(image)
        log.info(
            "node %d: metadata log %s..%s recovered; image at offset %d (%d batches replayed)",
            self.node_id,
            self.log.start_offset,
            self.log.next_offset,
            self.state_machine.image.offset,
            replayed,
        )
        self.applier = MetadataApplier(
            self.state_machine, self.log, self.snapshotter, on_applied=self._on_applied
        )
        self.applier.on_own_batch = self._on_own_batch
        # Active controller only: the committed state machine plus the batches proposed and not
        # yet committed (in proposal order, by their bytes); None when not active.
        self.speculative: QuorumStateMachine | None = None
        self._in_flight = InFlightProposals()
        self._transitions = 0  # stepped broker transitions in progress (the snapshot loop waits)
        self.lifecycle = BrokerLifecycle(self, config["broker.session.timeout.ms"])
        self.apis = ControllerApis(self)
        self._new_data = trio.Event()
        self._applied = trio.Event()  # set on the trio thread after each applied Raft entry
        self._active_term = -1
        self.metrics: Any = None  # kraft.metrics.ControllerMetrics when metrics.port is set
        self.divergence = DivergenceMonitor(
            self.node_id,
            self.log,
            config.rpc_voters,
            config.rpc_client_credentials,
            lambda: self.is_active,
            step_out=lambda reason: step_out(config.metadata_dir, reason),
        )
        self._stopping = trio.Event()
        self.quorum: RaftQuorum | None = None
        self.rpc_port = config.rpc_voters[self.node_id][1]
        # formatted to join a running quorum (kraft storage recover / --no-initial-controllers)
        self.joining = meta_properties.joining(meta)
        identity = meta_properties.read(meta)  # None for in-process nodes (tests)
        self.directory_id = identity.directory_id if identity else ""
        self.voter_directories = VoterDirectories(meta) if identity else None

    def _seed_dedup_window(self, snapshot_offset: int) -> None:
        """Start with the dedup window of the snapshot we start from, so a client retrying
        across a restart gets its earlier answer instead of a second write. A snapshot written
        before snapshots carried the window is backed by the log batches just before it."""
        window = self.settings.dedup_window
        if self.snapshotter.request_ids:
            self.state_machine.seed(self.snapshotter.request_ids)
            return
        if snapshot_offset < 0 or window == 0 or self.log.start_offset > snapshot_offset:
            return
        batches = self.log.recent_batches_before(
            snapshot_offset, window, lambda b: bool(b.provenance.request_id)
        )
        for batch in batches:
            self.state_machine.note_replayed_batch(batch)
        log.info(
            "node %d: dedup window seeded with %d request ids from before the snapshot",
            self.node_id,
            len(batches),
        )

    # ---- applied entries → waiting brokers ----------------------------------------------------

    def _on_applied(self) -> None:  # inside a raft tick, on the trio thread
        self._applied.set()

    async def _fetcher_wake_loop(self) -> None:
        """Wake the long-polling brokers after applied entries, paced by
        ``metadata.fetch.linger.ms`` and ``metadata.fetch.linger.per.broker.ms``
        (:mod:`kraft.wake_pacer`: at once after a quiet spell, then spaced by a cost per broker
        answered, at most the linger, so that one answer carries every entry applied meanwhile), and
        at least one scheduler round after the writers whose commands they committed (their
        answers go out first). A broker whose FetchMetadata finds new entries is answered at
        once; the pacing only gathers the answers to brokers already waiting: with the Raft
        ticks on the same trio thread, each answer going out delays the next commit
        (``docs/performance.md``)."""
        pacer = WakePacer(
            self.config["metadata.fetch.linger.ms"] / 1000,
            self.config["metadata.fetch.linger.per.broker.ms"] / 1000,
        )
        while True:
            await self._applied.wait()
            wait = pacer.delay(trio.current_time())
            if wait:
                await trio.sleep(wait)
            self._applied = trio.Event()  # entries applied from here on: another round
            await trio.lowlevel.checkpoint()
            waiters = self._wake_fetchers()
            pacer.woke(trio.current_time(), waiters)

    def _wake_fetchers(self) -> int:
        """Answer the waiting long-polls; how many were waiting."""
        waiting = self._new_data.statistics().tasks_waiting
        self._new_data.set()
        self._new_data = trio.Event()
        return waiting

    def new_data_event(self) -> trio.Event:
        """Set when the next round of applied entries is there for long-polling fetchers."""
        return self._new_data

    # ---- running ------------------------------------------------------------------------------

    async def run(self, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        cfg = self.config
        raft_host, raft_port = cfg.raft_voters[self.node_id]
        election_max = cfg["controller.quorum.election.timeout.ms"] / 1000
        self.quorum = RaftQuorum(
            node_id=self.node_id,
            self_addr=f"{raft_host}:{raft_port}",
            partners={i: f"{h}:{p}" for i, (h, p) in cfg.raft_voters.items() if i != self.node_id},
            raft_dir=cfg.metadata_dir / "raft",
            target=self.applier,
            settings=RaftSettings(
                password=cfg.raft_secret,
                fsync=cfg["metadata.log.fsync"],
                raft_min_timeout=election_max * 0.4,
                raft_max_timeout=election_max,
                leader_fallback_timeout=cfg["controller.quorum.fetch.timeout.ms"] / 1000,
                compaction_min_entries=cfg["raft.compaction.min.entries"],
                group_fill_wait=cfg["controller.group.commit.fill.ms"] / 1000,
            ),
            joining=self.joining,
        )
        rpc_host, rpc_port = cfg.rpc_voters[self.node_id]
        if cfg.rpc_credentials is None and not is_loopback(rpc_host):
            log.warning(
                "node %d: controller RPC on %s:%d accepts unauthenticated clients from other "
                "hosts (allow.insecure.listeners=true)",
                self.node_id,
                rpc_host,
                rpc_port,
            )
        server = RpcServer(
            rpc_host,
            rpc_port,
            self.apis.handle,
            max_frame_bytes=cfg["controller.rpc.max.frame.bytes"],
            credentials=cfg.rpc_credentials,
            max_connections=cfg["controller.rpc.max.connections"],
            io_timeout=cfg["controller.rpc.io.timeout.ms"] / 1000,
            idle_timeout=cfg["controller.rpc.idle.timeout.ms"] / 1000,
            max_buffered_bytes=cfg["controller.rpc.max.buffered.bytes"],
            max_connections_per_ip=cfg["max.connections.per.ip"],
            broker_principals=parse_principals(cfg["controller.rpc.broker.principals"]),
        )
        try:
            async with trio.open_nursery() as nursery:
                self.quorum.start()
                await nursery.start(server.serve)
                nursery.start_soon(self._leadership_loop)
                nursery.start_soon(self._fetcher_wake_loop)
                await nursery.start(self.lifecycle.run)
                nursery.start_soon(self._snapshot_loop)
                nursery.start_soon(self._log_flush_loop)
                nursery.start_soon(self._gc_loop)
                if len(cfg.rpc_voters) > 1:
                    nursery.start_soon(self.divergence.run)
                if self.joining:
                    nursery.start_soon(self._join_loop)
                if self.voter_directories is not None and len(cfg.rpc_voters) > 1:
                    nursery.start_soon(self._voter_directory_loop)
                if cfg["metadata.max.idle.interval.ms"] > 0:
                    nursery.start_soon(self._idle_noop_loop)
                if cfg["metrics.port"]:
                    from kraft.metrics import serve_controller_metrics

                    self.metrics = serve_controller_metrics(
                        self, cfg["metrics.host"], cfg["metrics.port"]
                    )
                log.info(
                    "node %d: controller RPC on %s:%d, raft on %s:%d",
                    self.node_id,
                    rpc_host,
                    rpc_port,
                    raft_host,
                    raft_port,
                )
                task_status.started(self)
                sdnotify.notify("READY=1")  # systemd Type=notify: RPC and Raft ports are bound
                await self._stopping.wait()
                nursery.cancel_scope.cancel()
        finally:
            if self.metrics is not None:
                self.metrics.close()
            self.quorum.close()
            self.log.close()
            log.info("node %d: stopped", self.node_id)

    def stop(self) -> None:
        self._stopping.set()

    # ---- joining a running quorum ---------------------------------------------------------------

    async def _join_loop(self) -> None:
        """A controller formatted to join (empty or rebuilt directory) votes only once it has
        caught up from a leader of *this* cluster: wait for the quorum to have applied what the
        first leader it heard from had committed, check that leader's cluster id, then let the
        quorum vote and remove the join marker."""
        assert self.quorum is not None
        while True:
            await trio.sleep(0.2)
            hint = self.leader_hint()
            if not self.quorum.join_caught_up or hint is None:
                continue
            client = self.peer_client(hint[1], hint[2])
            try:
                with trio.fail_after(3):
                    reply = await client.call("DescribeQuorum", {"forwarded": True})
            except (KraftError, trio.TooSlowError, OSError) as e:
                log.info(
                    "node %d: joining: leader %d not reachable yet: %s", self.node_id, hint[0], e
                )
                continue
            finally:
                await client.aclose()
            if reply.get("cluster_id") != self.config.cluster_id:
                node_failed(
                    f"joining: leader {hint[0]} belongs to cluster {reply.get('cluster_id')!r}, "
                    f"not {self.config.cluster_id!r}"
                )
            self.quorum.finish_join()
            try:
                meta_properties.clear_join_marker(self.config.metadata_dir)
            except OSError as e:
                storage_failed("join marker removal", self.config.metadata_dir, e)
            log.info(
                "node %d: caught up from leader %d of cluster %s; a full voter from now on",
                self.node_id,
                hint[0],
                self.config.cluster_id,
            )
            return

    async def _voter_directory_loop(self) -> None:
        """Every second, ask the other voters for their directory id (see
        kraft/storage/voter_directories.py) and tell the quorum whose votes not to count."""
        vd = self.voter_directories
        assert vd is not None and self.quorum is not None
        clients = {
            vid: self.peer_client(host, port)
            for vid, (host, port) in self.config.rpc_voters.items()
            if vid != self.node_id
        }
        joining: dict[int, bool] = {}
        try:
            while True:
                for vid, client in clients.items():
                    try:
                        with trio.fail_after(1.0):
                            reply = await client.call("DescribeNode", {"checksum": False})
                    except (KraftError, trio.TooSlowError, OSError):
                        continue
                    if reply.get("node_id") != vid:  # a wrong address in the config: no id
                        continue
                    joining[vid] = bool(reply.get("joining"))
                    try:
                        event = vd.observe(
                            vid,
                            str(reply.get("directory_id") or ""),
                            int(reply.get("applied_offset", -1)),
                            bool(reply.get("joining")),
                            self.state_machine.image.offset,
                        )
                    except OSError as e:
                        storage_failed("quorum-state write", vd.path, e)
                    if event == "changed":
                        log.warning(
                            "node %d: controller %d presents directory id %s, not %s (its disk "
                            "was wiped or replaced): its votes are not counted until it has "
                            "caught up to offset %d",
                            self.node_id,
                            vid,
                            reply.get("directory_id"),
                            vd.recorded.get(vid),
                            vd.unverified[vid][1],
                        )
                    elif event == "verified":
                        log.info(
                            "node %d: controller %d caught up with its new directory %s; its "
                            "votes count again",
                            self.node_id,
                            vid,
                            reply.get("directory_id"),
                        )
                # a joining voter follows the join rule (votes only for a candidate with
                # history): counting it lets an intact controller lead the rebuilt ones
                self.quorum.unverified_voters = {v for v in vd.unverified if not joining.get(v)}
                await trio.sleep(1.0)
        finally:
            with trio.CancelScope(shield=True):
                for client in clients.values():
                    await client.aclose()

    # ---- leadership ---------------------------------------------------------------------------

    async def _leadership_loop(self) -> None:
        """Follow the quorum's leadership changes: activate on becoming leader, step down when not."""
        assert self.quorum is not None
        async for is_leader, term in self.quorum.leadership_events():
            if is_leader:
                await self._activate(term)
            else:
                self._drop_speculative()
                if self._active_term != -1:
                    log.info("node %d: no longer the active controller", self.node_id)
                    self._active_term = -1

    def _drop_speculative(self) -> None:
        """Leadership lost: forget the proposals' image (requests waiting for their commit fail
        with NOT_CONTROLLER through the quorum)."""
        self.speculative = None
        self._in_flight.clear()
        self.applier.own_batches.clear()

    def _on_own_batch(self, raw: bytes, applied: bool) -> None:  # in a raft tick, trio thread
        """One of this controller's proposals committed: appended (it and every proposal before
        it leave the in-flight chain) or skipped by the chain check (every later proposal
        chains on it and will be skipped too: start again from the committed state)."""
        if raw not in self._in_flight:  # dropped by an earlier restart
            if applied:  # it made it after all: what we proposed since will not fit
                self._restart_speculative(b"")
            return
        if applied:
            self._in_flight.committed(raw)
        else:
            self._restart_speculative(raw)

    def _restart_speculative(self, failed: bytes) -> None:
        """Rebuild the speculative state machine from the committed one and the in-flight
        proposals made before ``failed`` that continue it (those after it chain on it: they
        will be skipped); ``failed`` empty: from the committed one alone."""
        if self.speculative is None:
            return
        spec = self._in_flight.rebuild(self.state_machine, failed)
        self.speculative = spec
        log.warning(
            "node %d: a proposal was not appended; proposing again from offset %d",
            self.node_id,
            spec.image.offset,
        )

    async def _activate(self, term: int) -> None:
        """Once every entry before this leader's first one of ``term`` is applied (so the
        committed image is final), start the speculative state machine from it, write
        ActivateController (committing it also proves leadership), then give every registered
        broker a fresh session. Retried while this node still leads in ``term``."""
        assert self.quorum is not None
        while not self.quorum.leader_ready(term):
            if not (self.quorum.is_leader and self.quorum.term == term):
                return
            await trio.sleep(0.005)
        self._drop_speculative()
        self.speculative = self.state_machine.fork()
        while self.quorum.is_leader and self.quorum.term == term and self._active_term != term:
            try:
                await self.submit(
                    "ActivateController",
                    {"leader_id": self.node_id, "term": term},
                    request_id=f"activate-{self.node_id}-{term}",
                )
            except KraftError as e:
                log.info(
                    "node %d: activation in term %d failed (%s); retrying", self.node_id, term, e
                )
                await trio.sleep(0.1)
            else:
                self._active_term = term
                self.lifecycle.reset()
                log.info("node %d: active controller in term %d", self.node_id, term)

    @property
    def is_active(self) -> bool:
        return (
            self.quorum is not None
            and self.quorum.is_leader
            and self._active_term == self.quorum.term
        )

    def leader_hint(self) -> tuple[int, str, int] | None:
        """(id, RPC host, RPC port) of the leader this member knows of, or None."""
        lid = self.quorum.leader_id if self.quorum else None
        if lid is None or lid not in self.config.rpc_voters:
            return None
        host, port = self.config.rpc_voters[lid]
        return lid, host, port

    def not_controller(self) -> KraftError:
        """NOT_CONTROLLER pointing at the leader this member knows of."""
        return not_controller(self.leader_hint())

    def peer_client(self, host: str, port: int) -> ControllerClient:
        """A client to another controller's RPC, as this controller (the caller closes it)."""
        return ControllerClient(
            [(host, port)],
            client_id=f"controller-{self.node_id}",
            credentials=self.config.rpc_client_credentials,
        )

    async def _snapshot_loop(self) -> None:
        deferred_since: float | None = None
        while True:
            await trio.sleep(1.0)
            due = self.snapshotter.due(self.state_machine.image, now_ms())
            # Not in the middle of a stepped broker transition (a 33k-partition fence writes
            # ~16 MB of log: a snapshot of a 1M-partition image, 1-2 CPU s on each controller,
            # would compete with its steps), unless the transition has lasted too long.
            if not self._transitions:
                deferred_since = None
            elif due:
                deferred_since = deferred_since or time.monotonic()
                due = time.monotonic() - deferred_since >= SNAPSHOT_DEFER_MAX_S
            if due:
                # the dedup window is copied only for a snapshot that will be written
                image, request_ids = self.state_machine.snapshot_state()
                try:
                    await trio.to_thread.run_sync(self.snapshotter.write, image, request_ids)
                except OSError as e:
                    storage_failed("snapshot write", self.snapshotter.directory, e)
            max_ms, max_bytes = (
                self.config["metadata.max.retention.ms"],
                self.config["metadata.max.retention.bytes"],
            )
            if max_ms >= 0 or max_bytes >= 0:
                await trio.to_thread.run_sync(
                    self.snapshotter.enforce_retention, now_ms(), max_ms, max_bytes
                )

    async def _gc_loop(self) -> None:
        """Collect cyclic garbage every ``GC_INTERVAL_S`` in a process whose automatic
        collection is off (main()), unless a full collection ran meanwhile (the applier's heap
        freezes make one every ``FREEZE_EVERY_RECORDS`` records). Each walks only what was
        allocated since the last freeze. Nothing to do where the collector is on (in-process
        controllers of tests)."""
        seen = -1
        while True:
            await trio.sleep(GC_INTERVAL_S)
            full = gc.get_stats()[2]["collections"]
            if not gc.isenabled() and full == seen:
                gc.collect()
                full += 1
            seen = full

    async def _log_flush_loop(self) -> None:
        """Sync the metadata log's appends every ``metadata.log.flush.interval.ms`` (off the
        commit path: the Raft journal already made them durable; see metadata_applier)."""
        interval = self.config["metadata.log.flush.interval.ms"] / 1000
        while True:
            await trio.sleep(interval)
            if self.log.unsynced:
                try:
                    await trio.to_thread.run_sync(self.log.sync)
                except OSError as e:  # never retried: the kernel may have dropped the pages
                    storage_failed("metadata log sync", self.log.directory, e)

    async def _idle_noop_loop(self) -> None:
        interval = self.config["metadata.max.idle.interval.ms"]
        while True:
            await trio.sleep(interval / 1000)
            if self.is_active and now_ms() - self.state_machine.image.timestamp_ms >= interval:
                try:
                    await self.submit("NoOp", {})
                except KraftError:
                    pass

    # ---- writes -------------------------------------------------------------------------------

    async def submit(
        self,
        api: str,
        body: dict[str, Any],
        *,
        request_id: str | None = None,
        principal: str = "controller",
        client_id: str = "",
    ) -> dict[str, Any]:
        """Run one write on the active controller and return its response once its batch has
        committed; a response error raises KraftError (at once: a request that fails validation
        never reaches Raft). Broker transitions move at most one batch of partitions per step,
        so a stepped API answered ``incomplete`` is repeated until it is done."""
        stepped = api in _STEPPED_APIS
        self._transitions += stepped
        try:
            if stepped:
                return await self._submit_steps(api, body, request_id, principal, client_id)
            response, queued, _ = self._propose_once(api, body, request_id, principal, client_id)
            if queued is not None:
                await self._await_commit(*queued)
            return response
        finally:
            self._transitions -= stepped

    async def _submit_steps(
        self,
        api: str,
        body: dict[str, Any],
        request_id: str | None,
        principal: str,
        client_id: str,
    ) -> dict[str, Any]:
        """A stepped broker transition: the command repeated while it answers ``incomplete``,
        with up to ``STEP_PIPELINE_DEPTH`` steps in flight. Each step is built on the speculative
        image, which already holds the steps before it, so the next one is built while the last
        one replicates; the answer is the last step's, once every step has committed, and the
        first failure is raised (a step chained on a failed one fails too)."""
        resume = await self._transition_start(api, body)
        failures: list[KraftError] = []
        slots = trio.Semaphore(STEP_PIPELINE_DEPTH)

        async def commit(queued: tuple[bytes, Any, float]) -> None:
            try:
                await self._await_commit(*queued)
            except KraftError as e:
                failures.append(e)
            finally:
                slots.release()

        response: dict[str, Any] = {}
        async with trio.open_nursery() as nursery:
            while not failures:
                await slots.acquire()
                if failures:
                    slots.release()
                    break
                try:
                    response, queued, resume = self._propose_once(
                        api, body, request_id, principal, client_id, resume
                    )
                except KraftError as e:
                    slots.release()
                    failures.append(e)
                    break
                if queued is None:
                    slots.release()
                else:  # already queued for Raft, in proposal order: only the wait is a task
                    nursery.start_soon(commit, queued)
                if not response.get("incomplete"):
                    break
                request_id = None
                if api == "UnfenceBroker":
                    body = dict(body, **{"continue": True})
        if failures:
            raise failures[0]
        return response

    async def _transition_start(
        self, api: str, body: dict[str, Any]
    ) -> tuple[Resume, tuple[int, bytes]] | None:
        """Where a broker transition's first change is (a fence, a controlled shutdown, an
        unregistration, an unfence), searched in slices of topics with the event loop running
        between them, so that its first step costs O(its records): a new active controller has
        no resume point from its predecessor, and scanning a 2M-partition image in one step held
        the trio thread past the election timeout (each new leader lost the leadership inside
        that step, again and again). None (the step scans from the start) when the image keeps
        changing under the search or the body names no registered broker."""
        broker_id = body.get("broker_id")
        if type(broker_id) is not int:
            return None
        for _ in range(TRANSITION_START_ATTEMPTS):
            spec = self.speculative
            if spec is None:
                return None
            image = spec.image
            search = self._start_search(api, body, image, broker_id)
            if search is None:
                return None
            point: Resume | None = None
            while True:
                point, over = search(point)
                if over:
                    return point, (image.offset, image.last_hash)
                await trio.sleep(0)
                if self.speculative is not spec or spec.image is not image:
                    break  # written meanwhile: the points found may no longer hold
        return None

    def _start_search(
        self, api: str, body: dict[str, Any], image: MetadataImage, broker_id: int
    ) -> Callable[[Resume | None], tuple[Resume, bool]] | None:
        """One slice of the search for ``api``'s first change in ``image`` (see
        :meth:`_transition_start`), or None when the broker is not registered as ``body`` says."""
        reg = image.broker(broker_id)
        if reg is None:
            return None
        unclean = unclean_allowed_in(image, self.settings)
        if api == "UnregisterBroker":
            return lambda point: leaving_start(image, broker_id, unclean, point)
        if reg.epoch != body.get("broker_epoch"):
            return None
        if api == "UnfenceBroker":
            offline = frozenset(offline_replicas_of(body))
            return lambda point: returning_start(image, broker_id, unclean, point, offline)
        if reg.fenced:
            return None
        if api == "FenceBroker":
            also = frozenset(r.broker_id for r in also_fenced(image, body.get("also"), broker_id))
            return lambda point: leaving_start(image, broker_id, unclean, point, also)
        return lambda point: leaving_start(image, broker_id, unclean, point)

    def _propose_once(
        self,
        api: str,
        body: dict[str, Any],
        request_id: str | None,
        principal: str,
        client_id: str,
        resume: tuple[Resume, tuple[int, bytes]] | None = None,
    ) -> tuple[
        dict[str, Any],
        tuple[bytes, Any, float] | None,
        tuple[Resume, tuple[int, bytes]] | None,
    ]:
        """One proposal: the handler on the speculative image, its batch handed to the applier
        and queued for Raft at once, without yielding: batches must reach Raft in the order
        they were built on the speculative image (each chains on the one before), and another
        writer may propose as soon as this task yields. Returns the response, what
        :meth:`_await_commit` waits on (None: nothing to write) and where a stepped
        transition's next step resumes with the image position that point is valid at.
        ``resume``: the previous step's such point. A response error raises KraftError."""
        assert self.quorum is not None
        spec = self.speculative
        if spec is None or not self.quorum.is_leader:
            raise self.not_controller()
        command = Command(
            api=api,
            body=body,
            request_id=request_id or str(uuid.uuid4()),
            principal=principal,
            client_id=client_id,
            timestamp_ms=now_ms(),
            seed=random.getrandbits(63),
            leader_id=self.node_id,
        )
        image = spec.image  # the image the batch is built on (kept for the applier)
        at = resume[0] if resume and resume[1] == (image.offset, image.last_hash) else None
        with gc_paused():  # a transition's step: one young collection after it
            batch, response, rest = spec.propose(command, self.quorum.term, at)
        if response.get("error_code"):
            code = ErrorCode(response["error_code"])
            raise KraftError(code, response.get("error_message", ""), response)
        if batch is None:
            return response, None, None
        raw = spec.last_encoded
        assert raw is not None  # propose() sets it with every batch it returns
        self._in_flight.add(raw, batch)
        self.applier.own_batches[raw] = (batch, image, spec.image)
        after = (spec.image.offset, spec.image.last_hash)
        try:
            waiter = self.quorum.enqueue(raw, WRITE_TIMEOUT_S)
        except KraftError as e:
            self._not_appended(raw, e)
            raise
        queued = (raw, waiter, time.monotonic())
        return response, queued, ((rest, after) if rest is not None else None)

    def _not_appended(self, raw: bytes, error: KraftError) -> None:
        """A proposal's Raft submission failed: forget it, and unless it may still commit (a
        timeout) propose again from the committed state."""
        self.applier.own_batches.pop(raw, None)
        if error.code != ErrorCode.REQUEST_TIMED_OUT and raw in self._in_flight:
            self._restart_speculative(raw)  # never appended to Raft

    async def _await_commit(self, raw: bytes, waiter: Any, started: float) -> None:
        """Wait until a queued batch has committed and applied; its failure raises KraftError."""
        assert self.quorum is not None
        try:
            result = await self.quorum.wait(waiter, WRITE_TIMEOUT_S)
        except KraftError as e:
            self._not_appended(raw, e)
            raise
        if self.metrics is not None:
            self.metrics.commit_latency.observe((time.monotonic() - started) * 1000)
        if not isinstance(result, dict):
            raise KraftError(
                ErrorCode.UNKNOWN_SERVER_ERROR, "the batch was applied without a result"
            )
        if result.get("error_code"):
            code = ErrorCode(result["error_code"])
            raise KraftError(code, result.get("error_message", ""), result)


def main(config_path: str) -> int:
    """Run a controller until SIGTERM/SIGINT. Returns the process exit code."""
    pysyncobj_patches.apply()  # before anything uses PySyncObj or socket.inet_ntop
    # No automatic cyclic collection in a controller: its young collections walked every
    # partition chunk a broker transition's step copied, again and again within the step, and
    # the image itself is frozen out of reach (kraft/heap.py). Cyclic garbage is collected with
    # each heap freeze and by _gc_loop.
    gc.disable()
    try:
        logsetup.configure(logsetup.level_from(os.environ))
        config = ControllerConfig.load(config_path)
        logsetup.configure_from(config)
    except (ConfigError, logsetup.LogLevelError, OSError) as e:
        print(f"Error: invalid configuration: {e}", file=sys.stderr)
        return 2
    try:
        meta_properties.check_directory(
            config.metadata_dir, config.cluster_id, config.node_id, config_path
        )
        node = ControllerServer(config)
    except Exception as e:  # corrupt log, unreadable snapshot, ...: refuse to start, say why
        return _refuse(e, config_path)

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_stop_on_signal, node)
            await node.run()
            nursery.cancel_scope.cancel()

    try:
        trio.run(run)
    except JournalCorruptError as e:
        return _refuse(e, config_path)
    except BaseExceptionGroup as group:  # a port in use (RPC, Raft, metrics.port): say which
        corrupt, _ = group.split(JournalCorruptError)
        if corrupt is not None:
            first: BaseException = corrupt
            while isinstance(first, BaseExceptionGroup):
                first = first.exceptions[0]
            return _refuse(first, config_path)
        ports, rest = group.split(OSError)
        if ports is None or rest is not None:
            raise
        error: BaseException = ports
        while isinstance(error, BaseExceptionGroup):
            error = error.exceptions[0]
        log.critical("stopped: %s", error)
        print(f"Error: {error}", file=sys.stderr)
        return 1
    return 0


def _refuse(error: BaseException, config_path: str) -> int:
    """Refuse to start with one clear message (and the recovery command for damaged data)."""
    message = f"refusing to start: {error}"
    if isinstance(error, (CorruptLogError, CorruptSnapshotError)):
        message += (
            ". Rebuild this controller from the others: "
            f"`kraft storage recover --config {config_path} --from-peers`"
        )
    log.critical(message)
    print(f"Error: {message}", file=sys.stderr)
    return 1


async def _stop_on_signal(node: ControllerServer) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for _ in signals:
            log.info("node %d: signal received, stopping", node.node_id)
            sdnotify.notify("STOPPING=1")
            node.stop()
            return


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1]))
