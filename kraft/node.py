"""``kraft controller --config FILE``: one controller node of the quorum.

Wires the pieces together: the metadata log (recovered on start), the committed state machine
(rebuilt from the latest snapshot + the log), the PySyncObj member (:class:`RaftQuorum`), the
controller RPC server, broker liveness (:class:`BrokerHeartbeatManager`, active controller only),
the session timer that fences silent brokers one at a time, periodic snapshots, and long-polls
for brokers that follow the log.

Writes (controller v2): the active controller runs the request's handler against its speculative
state machine (the committed one plus its own batches not yet committed), answers a request that
fails validation at once, and proposes the resulting batch's bytes through Raft; every
controller appends committed batches verbatim (kraft/metadata_applier.py).
"""

from __future__ import annotations

import logging
import os
import random
import signal
import sys
import time
import uuid
from typing import Any, cast

import trio

import kraft.quorum.pysyncobj_patches as pysyncobj_patches
from kraft import logsetup, sdnotify
from kraft.config import ConfigError, ControllerConfig, is_loopback
from kraft.controller.commands import Command, error_fields
from kraft.controller.election import Resume
from kraft.controller.heartbeats import BrokerHeartbeatManager
from kraft.controller.settings import ControllerSettings
from kraft.controller.state_machine import QuorumStateMachine
from kraft.divergence_monitor import DivergenceMonitor, hashes_at, head_of
from kraft.errors import ErrorCode, KraftError
from kraft.log.errors import CorruptLogError, CorruptSnapshotError
from kraft.log.metadata_log import MetadataLog
from kraft.metadata_applier import MetadataApplier
from kraft.quorum.journal_file import JournalCorruptError
from kraft.quorum.raft import RaftQuorum, RaftSettings
from kraft.records import Batch
from kraft.rpc.apis import APIS
from kraft.rpc.authorize import parse_principals
from kraft.rpc.server import RpcServer
from kraft.snapshotter import Snapshotter
from kraft.storage import meta_properties
from kraft.storage.failure import node_failed, step_out, storage_failed
from kraft.storage.voter_directories import VoterDirectories

log = logging.getLogger("kraft.controller")

WRITE_TIMEOUT_S = 10.0
_STEPPED_APIS = ("FenceBroker", "UnfenceBroker", "BeginControlledShutdown", "UnregisterBroker")
MAX_FETCH_BYTES = 4 * 1024 * 1024


# A snapshot that falls due during a stepped broker transition waits for its end, at most this long.
SNAPSHOT_DEFER_MAX_S = 30.0


def now_ms() -> int:
    return int(time.time() * 1000)


def _not_controller(leader: tuple[int, str, int] | None) -> KraftError:
    err = KraftError(
        ErrorCode.NOT_CONTROLLER,
        "this controller is not active" + ("" if leader else " and no leader is known yet"),
    )
    lid, host, port = leader if leader else (-1, "", 0)
    err.body = {"leader_id": lid, "leader_host": host, "leader_port": port}
    return err


class ControllerNode:
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
            phase=(self.node_id % 3) / 3,
        )  # controllers snapshot in turn
        image = self.snapshotter.load_image()
        self.state_machine = QuorumStateMachine(self.settings, image)
        self._seed_dedup_window(image.offset)
        replayed = 0
        for batch in self.log.read_batches(image.offset + 1):
            if batch.last_offset <= image.offset:
                continue
            self.state_machine.replay_batch(batch)
            replayed += 1
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
        self._in_flight: dict[bytes, Batch] = {}
        self._transitions = 0  # stepped broker transitions in progress (the snapshot loop waits)
        self.heartbeats = BrokerHeartbeatManager(config["broker.session.timeout.ms"])
        self._new_data = trio.Event()
        self._applied = trio.Event()  # set on the trio thread after each applied Raft entry
        self._active_term = -1
        # broker id → (metadata offset, last contact ms, last time it was caught up ms or -1)
        self._observers: dict[int, tuple[int, int, int]] = {}
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
        """Wake the long-polling brokers after applied entries: ``metadata.fetch.linger.ms``
        later, so one answer carries every entry applied meanwhile, and at least one scheduler
        round after the writers whose commands they committed (their answers go out first).
        A broker whose FetchMetadata finds new entries is answered at once; the linger only
        gathers the answers to brokers already waiting: with the Raft ticks on the same trio
        thread, each answer going out delays the next commit (``docs/performance.md``)."""
        linger = self.config["metadata.fetch.linger.ms"] / 1000
        while True:
            await self._applied.wait()
            if linger:
                await trio.sleep(linger)
            self._applied = trio.Event()  # entries applied from here on: another round
            await trio.lowlevel.checkpoint()
            self._wake_fetchers()

    def _wake_fetchers(self) -> None:
        self._new_data.set()
        self._new_data = trio.Event()

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
            self.handle,
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
                nursery.start_soon(self._session_timer_loop)
                nursery.start_soon(self._snapshot_loop)
                nursery.start_soon(self._log_flush_loop)
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
        from kraft.rpc.client import ControllerClient

        assert self.quorum is not None
        while True:
            await trio.sleep(0.2)
            hint = self._leader_hint()
            if not self.quorum.join_caught_up or hint is None:
                continue
            client = ControllerClient(
                [(hint[1], hint[2])],
                client_id=f"controller-{self.node_id}",
                credentials=self.config.rpc_client_credentials,
            )
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
        from kraft.rpc.client import ControllerClient

        vd = self.voter_directories
        assert vd is not None and self.quorum is not None
        clients = {
            vid: ControllerClient(
                [(host, port)],
                client_id=f"controller-{self.node_id}",
                credentials=self.config.rpc_client_credentials,
            )
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
        """One of this controller's proposals committed: appended (drop it from the in-flight
        list) or skipped by the chain check (every later proposal chains on it and will be
        skipped too: start again from the committed state)."""
        if raw not in self._in_flight:  # dropped by an earlier restart
            if applied:  # it made it after all: what we proposed since will not fit
                self._restart_speculative(b"")
            return
        if applied and next(iter(self._in_flight)) == raw:
            del self._in_flight[raw]
        else:
            self._restart_speculative(raw)

    def _restart_speculative(self, failed: bytes) -> None:
        """Rebuild the speculative state machine from the committed one and the in-flight
        proposals made before ``failed`` (those after it chain on it: they will be skipped);
        ``failed`` empty: from the committed one alone."""
        if self.speculative is None:
            return
        keep: dict[bytes, Batch] = {}
        for raw, batch in self._in_flight.items():
            if raw == failed or not failed:
                break
            keep[raw] = batch
        spec = self.state_machine.fork()
        for raw, batch in keep.items():
            spec.replay_batch(batch, raw)
        self.speculative, self._in_flight = spec, keep
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
                await self._submit(
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
                self.heartbeats.reset_all(now_ms(), self.state_machine.image)
                log.info("node %d: active controller in term %d", self.node_id, term)

    @property
    def is_active(self) -> bool:
        return (
            self.quorum is not None
            and self.quorum.is_leader
            and self._active_term == self.quorum.term
        )

    def _leader_hint(self) -> tuple[int, str, int] | None:
        lid = self.quorum.leader_id if self.quorum else None
        if lid is None or lid not in self.config.rpc_voters:
            return None
        host, port = self.config.rpc_voters[lid]
        return lid, host, port

    async def _session_timer_loop(self) -> None:
        """Fence one broker whose session expired at a time, so each fence is visible first."""
        while True:
            await trio.sleep(0.1)
            if not self.is_active:
                continue
            broker_id = self.heartbeats.next_expired(now_ms())
            if broker_id is None:
                continue
            reg = self.state_machine.image.brokers.get(broker_id)
            if reg is None:
                self.heartbeats.forget(broker_id)
                continue
            log.info("node %d: broker %d session expired; fencing it", self.node_id, broker_id)
            try:
                await self._submit(
                    "FenceBroker",
                    {
                        "broker_id": broker_id,
                        "broker_epoch": reg.epoch,
                        "reason": "session-timeout",
                    },
                )
            except KraftError as e:
                log.warning("node %d: fencing broker %d failed: %s", self.node_id, broker_id, e)

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
                    await self._submit("NoOp", {})
                except KraftError:
                    pass

    # ---- writes -------------------------------------------------------------------------------

    async def _submit(
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
            resume: tuple[Resume, tuple[int, bytes]] | None = None
            while True:
                result, resume = await self._write_once(
                    api, body, request_id, principal, client_id, resume
                )
                if not (result.get("incomplete") and stepped):
                    return result
                request_id = None
                if api == "UnfenceBroker":
                    body = dict(body, **{"continue": True})
        finally:
            self._transitions -= stepped

    async def _write_once(
        self,
        api: str,
        body: dict[str, Any],
        request_id: str | None,
        principal: str,
        client_id: str,
        resume: tuple[Resume, tuple[int, bytes]] | None,
    ) -> tuple[dict[str, Any], tuple[Resume, tuple[int, bytes]] | None]:
        """One proposal: handler on the speculative image, then its batch through Raft.
        ``resume``: where the previous step of a stepped transition stopped, and the image
        position it is valid at (nothing written since)."""
        assert self.quorum is not None
        spec = self.speculative
        if spec is None or not self.quorum.is_leader:
            raise _not_controller(self._leader_hint())
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
        batch, response, rest = spec.propose(command, self.quorum.term, at)
        if response.get("error_code"):
            err = KraftError(ErrorCode(response["error_code"]), response.get("error_message", ""))
            err.body = response
            raise err
        if batch is None:
            return response, None
        raw = spec.last_encoded
        assert raw is not None  # propose() sets it with every batch it returns
        self._in_flight[raw] = batch
        self.applier.own_batches[raw] = (batch, image, spec.image)
        after = (spec.image.offset, spec.image.last_hash)
        started = time.monotonic()
        try:
            result = await self.quorum.submit(raw, timeout=WRITE_TIMEOUT_S)
        except KraftError as e:
            self.applier.own_batches.pop(raw, None)
            if e.code != ErrorCode.REQUEST_TIMED_OUT and raw in self._in_flight:
                self._restart_speculative(raw)  # never appended to Raft
            raise
        if self.metrics is not None:
            self.metrics.commit_latency.observe((time.monotonic() - started) * 1000)
        if not isinstance(result, dict):
            raise KraftError(
                ErrorCode.UNKNOWN_SERVER_ERROR, "the batch was applied without a result"
            )
        if result.get("error_code"):
            err = KraftError(ErrorCode(result["error_code"]), result.get("error_message", ""))
            err.body = result
            raise err
        return response, ((rest, after) if rest is not None else None)

    # ---- RPC handling -------------------------------------------------------------------------

    async def handle(self, api: str, body: dict[str, Any], ctx: Any) -> dict[str, Any]:
        spec = APIS[api]
        if spec.kind == "read":
            return self.state_machine.read(api, body)
        if spec.kind == "write":
            if api in (
                "FenceBroker",
                "UnfenceBroker",
                "BeginControlledShutdown",
                "ActivateController",
            ):
                raise KraftError(
                    ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                    f"{api} is issued by the controller itself",
                )
            if not self.is_active:
                raise _not_controller(self._leader_hint())
            started = time.monotonic()
            try:
                if api == "BrokerRegistration":
                    return await self._register_broker(body, ctx)
                return await self._submit(
                    api,
                    body,
                    request_id=getattr(ctx, "request_id", None),
                    principal=getattr(ctx, "principal", "ANONYMOUS") or "ANONYMOUS",
                    client_id=getattr(ctx, "client_id", "") or "",
                )
            finally:
                if self.metrics is not None:
                    self.metrics.event_processing.observe((time.monotonic() - started) * 1000)
        return cast(dict[str, Any], await getattr(self, f"_api_{api}")(body, ctx))

    async def _register_broker(self, body: dict[str, Any], ctx: Any) -> dict[str, Any]:
        broker_id = body["broker_id"]
        spec = self.speculative
        existing = spec.image.brokers.get(broker_id) if spec is not None else None
        if (
            existing is not None
            and existing.incarnation_id != body["incarnation_id"]
            and self.heartbeats.has_live_session(broker_id, now_ms())
        ):  # liveness is known only here, so the active controller checks it itself
            err = KraftError(
                ErrorCode.DUPLICATE_BROKER_REGISTRATION,
                f"Another broker {broker_id} (incarnation {existing.incarnation_id}) is "
                "registered and alive; retry once its session has expired.",
            )
            err.body = {**error_fields(err), "broker_epoch": -1}
            raise err
        result = await self._submit(
            "BrokerRegistration",
            body,
            request_id=getattr(ctx, "request_id", None),
            principal=getattr(ctx, "principal", "ANONYMOUS") or "ANONYMOUS",
            client_id=getattr(ctx, "client_id", "") or "",
        )
        self.heartbeats.register(broker_id, result["broker_epoch"], now_ms())
        log.info(
            "node %d: broker %d registered with epoch %d",
            self.node_id,
            broker_id,
            result["broker_epoch"],
        )
        return result

    async def _api_BrokerHeartbeat(self, body: dict[str, Any], ctx: Any) -> dict[str, Any]:
        if not self.is_active:
            raise _not_controller(self._leader_hint())
        broker_id = body["broker_id"]
        now = now_ms()
        caught_up = body["metadata_offset"] >= self.log.next_offset - 1
        previous = self._observers.get(broker_id)
        self._observers[broker_id] = (
            body["metadata_offset"],
            now,
            now if caught_up else previous[2] if previous else -1,
        )
        decision = self.heartbeats.heartbeat(
            broker_id,
            body["broker_epoch"],
            body["metadata_offset"],
            body["want_fence"],
            body["want_shutdown"],
            now,
            self.state_machine.image,
        )
        if decision.command is not None:
            api, cmd_body = decision.command
            try:
                await self._submit_keeping_session(broker_id, api, cmd_body)
            except KraftError as e:
                log.warning("node %d: %s for broker %d failed: %s", self.node_id, api, broker_id, e)
            else:
                if api == "BeginControlledShutdown":
                    self.heartbeats.note_controlled_shutdown_offset(
                        broker_id, self.state_machine.image.offset
                    )
                decision = self.heartbeats.heartbeat(
                    broker_id,
                    body["broker_epoch"],
                    body["metadata_offset"],
                    body["want_fence"],
                    body["want_shutdown"],
                    now,
                    self.state_machine.image,
                )
        return {
            "is_caught_up": decision.is_caught_up,
            "is_fenced": decision.is_fenced,
            "should_shut_down": decision.should_shut_down,
        }

    async def _submit_keeping_session(self, broker_id: int, api: str, body: dict[str, Any]) -> None:
        """``_submit`` a command a broker's heartbeat asked for, refreshing that broker's session
        meanwhile: it is alive while its transition is written, which for a stepped one over
        tens of thousands of partitions can outlast the session timeout."""

        async def keep() -> None:
            while True:
                self.heartbeats.touch(broker_id, now_ms())
                await trio.sleep(1.0)

        error: KraftError | None = None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(keep)
            try:
                await self._submit(api, body)
            except KraftError as e:
                error = e
            nursery.cancel_scope.cancel()
        if error is not None:
            raise error

    async def _api_FetchMetadata(self, body: dict[str, Any], ctx: Any) -> dict[str, Any]:
        from_offset = body["from_offset"]
        max_wait = min(max(body.get("max_wait_ms") or 0, 0), 30_000) / 1000
        max_bytes = min(body.get("max_bytes") or MAX_FETCH_BYTES, MAX_FETCH_BYTES)
        snap = self._snapshot_for_fetch(from_offset)
        if snap is not None:
            return {
                "batches": [],
                "high_watermark": self.log.next_offset,
                "snapshot": {
                    "name": snap.name,
                    "end_offset": self.snapshotter.end_offset(snap),
                    "size": snap.stat().st_size,
                },
            }
        if from_offset >= self.log.next_offset and max_wait > 0:
            with trio.move_on_after(max_wait):
                while from_offset >= self.log.next_offset:
                    await self._new_data.wait()
        batches = (
            self.log.read_encoded(from_offset, max_bytes)
            if from_offset < self.log.next_offset
            else []
        )
        return {"batches": batches, "high_watermark": self.log.next_offset, "snapshot": None}

    def _snapshot_for_fetch(self, from_offset: int) -> Any:
        """The snapshot a fetcher at ``from_offset`` should load instead of reading the log: when
        the log no longer holds that offset, or when the fetcher is at least
        ``metadata.fetch.snapshot.min.lag.records`` before the newest snapshot's end (a new
        broker on a big image loads the snapshot rather than replaying the whole history)."""
        if from_offset < self.log.start_offset:
            snap = self.snapshotter.latest()
            if snap is None:
                raise KraftError(
                    ErrorCode.OFFSET_OUT_OF_RANGE, f"offset {from_offset} is before the log start"
                )
            return snap
        min_lag = self.config["metadata.fetch.snapshot.min.lag.records"]
        if min_lag < 0:
            return None
        min_lag = max(min_lag, 1)
        if self.log.next_offset - from_offset < min_lag:
            return None  # the common case (a fetcher near the end) costs no directory listing
        snap = self.snapshotter.latest()
        if snap is not None and self.snapshotter.end_offset(snap) - from_offset >= min_lag:
            return snap
        return None

    async def _api_FetchSnapshot(self, body: dict[str, Any], ctx: Any) -> dict[str, Any]:
        return self.snapshotter.read_chunk(
            body["name"],
            body["position"],
            min(body.get("max_bytes") or MAX_FETCH_BYTES, MAX_FETCH_BYTES),
        )

    async def _api_DescribeQuorum(self, body: dict[str, Any], ctx: Any) -> dict[str, Any]:
        assert self.quorum is not None
        status = self.quorum.status()
        leader_id = status.get("leader_id")
        hint = self._leader_hint()
        if not self.quorum.is_leader and hint is not None:
            # Only the leader knows its followers' progress; ask it (one hop).
            from kraft.rpc.client import ControllerClient

            client = ControllerClient(
                [(hint[1], hint[2])],
                client_id=f"controller-{self.node_id}",
                credentials=self.config.rpc_client_credentials,
            )
            try:
                with trio.fail_after(3):
                    return await client.call("DescribeQuorum", {"forwarded": True})
            except (KraftError, trio.TooSlowError, OSError):
                pass
            finally:
                await client.aclose()
        commit_index = status.get("commit_index", 0)
        hw = self.log.next_offset
        described = await self._voter_nodes()
        applied = {v: r.get("applied_offset") for v, r in described.items()}
        heads = {v: r.get("log_head") for v, r in described.items()}
        heads[self.node_id] = head_of(self.log)
        divergent = self.divergence.divergent
        voters = []
        for vid, (host, port) in sorted(self.config.rpc_voters.items()):
            v = status.get("voters", {}).get(vid, {})
            voters.append(
                {
                    "node_id": vid,
                    "host": host,
                    "port": port,
                    "raft_match_index": v.get("match_index"),
                    "applied_offset": hw - 1 if vid == self.node_id else applied.get(vid),
                    "lag": v.get("lag"),
                    "last_contact_ms": v.get("last_contact_ms"),
                    # a follower whose last answer acknowledged the whole log was caught up then
                    "last_caught_up_ms": v.get("last_contact_ms") if v.get("lag") == 0 else None,
                    "is_leader": vid == leader_id,
                    "log_head": heads.get(vid),
                    "divergent_from_offset": divergent.get(vid),
                }
            )
        now = now_ms()
        observers = [
            {
                "broker_id": b,
                "metadata_offset": off,
                "lag": max(hw - 1 - off, 0),
                "last_contact_ms": now - seen,
                "last_caught_up_ms": now - caught if caught >= 0 else None,
            }
            for b, (off, seen, caught) in sorted(dict(self._observers).items())
        ]
        return {
            "cluster_id": self.config.cluster_id,
            "leader_id": leader_id if leader_id is not None else -1,
            "term": status.get("term", 0),
            "commit_index": commit_index,
            "high_watermark": hw,
            "voters": voters,
            "observers": observers,
            "divergent_voters": sorted(divergent),
        }

    async def _voter_nodes(self) -> dict[int, dict[str, Any]]:
        """Ask every other voter to describe itself (1 s budget; silent ones are left out)."""
        from kraft.rpc.client import ControllerClient

        replies: dict[int, dict[str, Any]] = {}

        async def ask(vid: int, host: str, port: int) -> None:
            client = ControllerClient(
                [(host, port)],
                client_id=f"controller-{self.node_id}",
                credentials=self.config.rpc_client_credentials,
            )
            try:
                with trio.move_on_after(1.0):
                    replies[vid] = await client.call(
                        "DescribeNode", {"checksum": False}, timeout=1.0
                    )
            except (KraftError, OSError):
                pass
            finally:
                await client.aclose()

        async with trio.open_nursery() as nursery:
            for vid, (host, port) in self.config.rpc_voters.items():
                if vid != self.node_id:
                    nursery.start_soon(ask, vid, host, port)
        return replies

    async def _api_DescribeNode(self, body: dict[str, Any], ctx: Any) -> dict[str, Any]:
        image = self.state_machine.image
        checksum = (
            await trio.to_thread.run_sync(image.checksum) if body.get("checksum", True) else None
        )
        return {
            "node_id": self.node_id,
            "is_active": self.is_active,
            "applied_offset": image.offset,
            "image_checksum": checksum,
            "log_start_offset": self.log.start_offset,
            "log_end_offset": self.log.next_offset,
            "log_head": head_of(self.log),
            "hashes": hashes_at(self.log, body.get("hash_at", [])),
            "raft": self.quorum.status() if self.quorum else {},
            "raft_stats": self.quorum.stats() if self.quorum else {},
            "joining": bool(self.quorum and self.quorum.joining),
            "directory_id": self.directory_id,
            "unverified_voters": sorted(self.voter_directories.unverified)
            if self.voter_directories
            else [],
        }


def main(config_path: str) -> int:
    """Run a controller until SIGTERM/SIGINT. Returns the process exit code."""
    pysyncobj_patches.apply()  # before anything uses PySyncObj or socket.inet_ntop
    try:
        logsetup.configure(logsetup.level_from(os.environ))
        config = ControllerConfig.load(config_path)
        logsetup.configure(
            logsetup.level_from(os.environ, config["log.level"]),
            config["log.file"] or None,
            config["log.file.max.bytes"],
            config["log.file.backup.count"],
        )
    except (ConfigError, logsetup.LogLevelError, OSError) as e:
        print(f"Error: invalid configuration: {e}", file=sys.stderr)
        return 2
    try:
        meta_properties.check_directory(
            config.metadata_dir, config.cluster_id, config.node_id, config_path
        )
        node = ControllerNode(config)
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


async def _stop_on_signal(node: ControllerNode) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for _ in signals:
            log.info("node %d: signal received, stopping", node.node_id)
            sdnotify.notify("STOPPING=1")
            node.stop()
            return


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1]))
