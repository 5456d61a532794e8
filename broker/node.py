"""``kraft broker``: wires config, replica manager, metadata loader, lifecycle and listeners.

``main(config_path) -> int`` runs a broker until SIGTERM/SIGINT, then does a controlled
shutdown (heartbeat ``want_shutdown`` until the controller agrees, bounded by
``broker.session.timeout.ms``), checkpoints its metadata and exits 0. Exit 1 on a fatal error
(another cluster's log dir, registration refused or timed out, a port in use), 2 on a bad config.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from broker.broker_epoch import boot_id, read_previous_epoch, write_epoch
from broker.config import BrokerConfig
from broker.coordinator.group.service import GroupCoordinator
from broker.coordinator.producer_id_manager import ProducerIdManager
from broker.coordinator.txn.api import TxnApis
from broker.coordinator.txn.service import TxnCoordinator
from broker.lifecycle import BrokerLifecycle, BrokerState, FatalBrokerError
from broker.metadata.metadata_cache import MetadataCache
from broker.metadata.metadata_loader import MetadataLoader
from broker.protocol.fetch_session import FetchSessionCache
from broker.protocol.kafka_admin import KafkaAdmin
from broker.protocol.kafka_client_security import client_security
from broker.protocol.kafka_listener import KafkaListener
from broker.protocol.kafka_security import (
    SecurityConfigError,
    check_listeners_authenticate,
    listener_security,
    protocol_of,
)
from broker.protocol.write_txn_markers import MarkerWriter
from broker.replica.cleaner import CleanerConfig, LogCleaner
from broker.replica.isr_updater import IsrUpdater
from broker.replica.replica_fetcher import ReplicaFetcherManager
from broker.replica.replica_manager import ReplicaManager
from broker.state import admin_host, serve_state, snapshot_state
from kraft import logsetup, sdnotify
from kraft.config import ConfigError
from kraft.rpc.client import ControllerClient, call_sync
from kraft.storage import failure, meta_properties

log = logging.getLogger("broker.node")


def check_log_dirs(config: BrokerConfig, config_path: str = "the broker config") -> None:
    """Each log dir's ``meta.properties`` must exist (``kraft storage format``) and name this
    cluster and node: a broker never starts on an unformatted or foreign directory."""
    for d in config.log_dirs:
        try:
            meta_properties.check_directory(d, config.cluster_id, config.node_id, config_path)
        except meta_properties.StorageIdentityError as e:
            raise FatalBrokerError(str(e)) from None


class BrokerNode:
    """One broker process's components."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        name, host, port = config.listener
        self.listener_name = name
        _, adv_host, _ = config.advertised
        self.advertised_host = adv_host if adv_host not in ("", "0.0.0.0", "::") else "127.0.0.1"
        self.kafka_port = port
        self.metadata_dir = config.log_dirs[0] / "metadata"
        # one metadata cache per listener: Metadata answers name that listener's endpoints
        self.caches = {n: MetadataCache(config.cluster_id, n) for n, _, _ in config.listeners}
        self.cache = self.caches[name]
        self.replica_manager = ReplicaManager(
            config.node_id,
            config.log_dirs,
            config["log.segment.bytes"],
            replica_lag_time_max_ms=config["replica.lag.time.max.ms"],
            min_insync_replicas=config["min.insync.replicas"],
        )
        self.fetch_sessions = FetchSessionCache(config["max.incremental.fetch.session.cache.slots"])
        self.cleaner = LogCleaner(
            self.replica_manager,
            CleanerConfig(
                config["log.cleaner.enable"],
                config["log.cleaner.backoff.ms"],
                config["log.cleaner.min.cleanable.ratio"],
                config["log.cleaner.delete.retention.ms"],
                config["log.segment.bytes"],
            ),
            topic_segment_bytes={"__consumer_offsets": config["offsets.topic.segment.bytes"]},
        )
        client_id = f"broker-{config.node_id}"
        creds = config.rpc_client_credentials
        # metadata fetches and heartbeats retry at Kafka's pace, so that a broker reaches a new
        # leader soon after an election (its default 1 s cap kept brokers ~1 s behind)
        backoff = {
            "backoff_initial": config["controller.quorum.retry.backoff.ms"] / 1000,
            "backoff_max": max(
                config["controller.quorum.retry.backoff.ms"],
                config["controller.quorum.retry.backoff.max.ms"],
            )
            / 1000,
        }
        self.fetch_client = ControllerClient(
            config.bootstrap, client_id=client_id, credentials=creds, **backoff
        )
        self.control_client = ControllerClient(
            config.bootstrap, client_id=client_id, credentials=creds, **backoff
        )
        admin_client = ControllerClient(  # Kafka admin APIs, forwarded
            config.bootstrap, client_id=client_id, credentials=self.control_client.credentials
        )
        self.admins = {
            n: KafkaAdmin(cache, admin_client, config.node_id) for n, cache in self.caches.items()
        }
        self.admin = self.admins[name]
        self.groups = GroupCoordinator(config, self.replica_manager, self.caches, admin_client)
        inter = config["inter.broker.listener.name"] or name
        protocol_map = config["listener.security.protocol.map"]
        self.protocols = {n: protocol_of(n, protocol_map) for n, _, _ in config.listeners}
        self.security = {
            n: listener_security(self.protocols[n], config.values) for n in self.protocols
        }
        check_listeners_authenticate(config, self.security)
        inter = config["inter.broker.listener.name"] or name
        self.fetchers = ReplicaFetcherManager(
            self.replica_manager,
            inter,
            max_wait_ms=config["replica.fetch.wait.max.ms"],
            security=client_security(
                self.protocols[inter], config.values, config.rpc_client_credentials
            ),
        )
        self.txn = TxnCoordinator(
            config,
            config.node_id,
            self.replica_manager,
            self.caches.get(inter, self.cache),
            MarkerWriter(self.replica_manager, self.groups.end_txn_offsets),
            security=self.fetchers.security,
        )
        self.replication_only = {
            n.strip() for n in config["replication.only.listeners"].split(",") if n.strip()
        }
        self.replication_principals = frozenset(
            p.strip() for p in config["replication.principals"].split(",") if p.strip()
        )
        self.loader = MetadataLoader(
            self.fetch_client,
            [
                *self.caches.values(),
                self.replica_manager,
                self.groups.runtime,
                self.txn.runtime,
                self.fetchers,
                self,
            ],
            self.metadata_dir,
            image_check_interval_ms=config["metadata.image.check.interval.ms"],
            broker_id=config.node_id,
            on_image_check=lambda: self.lifecycle.poke(),
        )
        self.listeners = [
            {
                "name": n,
                "host": h if h not in ("", "0.0.0.0", "::") else "127.0.0.1",
                "port": p,
                "security_protocol": self.protocols[n],
            }
            for n, h, p in config.advertised_listeners
        ]
        self.lifecycle = BrokerLifecycle(
            self.control_client,
            config.node_id,
            config.cluster_id,
            self.listeners,
            config.rack,
            lambda: self.loader.offset,
            heartbeat_interval=config["broker.heartbeat.interval.ms"] / 1000,
            session_timeout=config["broker.session.timeout.ms"] / 1000,
            registration_timeout=config["initial.broker.registration.timeout.ms"] / 1000,
            offline_report=self.replica_manager.offline_report,
            image_mismatch=self.loader.image_mismatch,
            previous_epoch=self._previous_epoch,
            record_epoch=lambda epoch: write_epoch(
                self.replica_manager.dirs.healthy(), epoch, boot_id()
            ),
        )
        # a log dir went offline: stop fetching its partitions, tell the controller now
        self.replica_manager.dirs.listeners.append(self._log_dir_offline)
        self.isr_updater = IsrUpdater(
            self.control_client,
            self.replica_manager,
            lambda: self.lifecycle.broker_epoch,
            config["replica.lag.time.max.ms"],
        )
        self.replica_manager.isr_updater = self.isr_updater
        self.producer_ids = ProducerIdManager(
            self.control_client, config.node_id, lambda: self.lifecycle.broker_epoch
        )
        self._checksum: tuple[Any, str] = (None, "")
        self.admin_port = config["broker.admin.port"] or port + 1000
        # the admin endpoint authenticates when any Kafka listener does (SASL users)
        self.admin_users = next((s.users for s in self.security.values() if s.users), None)
        self.metrics: Any = None  # broker.metrics.BrokerMetrics when metrics.port is set

    # publisher: the first publish means the replica manager has opened its logs
    def publish(self, delta: Any, image: Any, full: bool = False) -> None:
        if not self.lifecycle.ready.is_set():
            log.info(
                "broker %d: first metadata image published (offset %d); ready to be unfenced",
                self.config.node_id,
                image.offset,
            )
            self.lifecycle.ready.set()
            self.lifecycle.poke()

    def _previous_epoch(self) -> int:
        """The epoch all of this broker's log dirs were last registered with, or -1 (one of them
        is offline, or they prove nothing: see broker.broker_epoch)."""
        if self.replica_manager.dirs.offline:
            return -1
        return read_previous_epoch(self.config.log_dirs, boot_id())

    def _log_dir_offline(self, directory: object) -> None:
        self.fetchers.reconcile_soon()
        self.lifecycle.poke()

    def image_checksum(self) -> str:
        image = self.loader.image
        if self._checksum[0] is not image:
            self._checksum = (image, image.checksum())
        return self._checksum[1]

    def state(self) -> dict[str, Any]:
        return snapshot_state(self)

    def _close_metrics(self) -> None:
        if self.metrics is not None:
            self.metrics.close()
            self.metrics = None

    def fence_before_exit(self, message: str) -> None:
        """Last words before a storage failure stops this broker (``kraft.storage.failure``):
        a heartbeat with ``want_fence`` asks the active controller to fence it now, so its
        partitions get new leaders at once rather than after the session timeout. Sent from a
        thread of its own (the trio loop is the one failing), 3 s at most."""
        epoch = self.lifecycle.broker_epoch
        if epoch < 0:
            return
        body = {
            "broker_id": self.config.node_id,
            "broker_epoch": epoch,
            "metadata_offset": self.lifecycle.metadata_offset(),
            "want_fence": True,
            "want_shutdown": False,
        }

        def send() -> None:
            try:
                call_sync(
                    self.config.bootstrap,
                    "BrokerHeartbeat",
                    body,
                    timeout=2.0,
                    client_id=f"broker-{self.config.node_id}",
                    credentials=self.control_client.credentials,
                )
                log.error("broker %d: asked the controller to fence it", self.config.node_id)
            except Exception as e:  # the controller is unreachable: the session timeout fences
                log.error("broker %d: could not ask to be fenced: %s", self.config.node_id, e)

        sender = threading.Thread(target=send, name="fence-before-exit", daemon=True)
        sender.start()
        sender.join(3.0)

    async def run(self) -> int:
        failure.set_last_words(self.fence_before_exit)
        self.loader.load_local()
        if self.config["metrics.port"]:
            from broker.metrics import serve_broker_metrics

            self.metrics = serve_broker_metrics(
                self, self.config["metrics.host"], self.config["metrics.port"]
            )
        _, host, port = self.config.listener
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with trio.open_nursery() as nursery:
                for n, lhost, lport in self.config.listeners:
                    listener = KafkaListener(
                        self.caches[n],
                        lhost,
                        lport,
                        admin=self.admins[n],
                        security=self.security[n],
                        idle_timeout_s=self.config["connections.max.idle.ms"] / 1000,
                        read_timeout_s=self.config["request.read.timeout.ms"] / 1000,
                        max_connections=self.config["max.connections"],
                        max_request_bytes=self.config["socket.request.max.bytes"],
                        auto_create=self.admins[n].auto_create_topics
                        if self.config["auto.create.topics.enable"]
                        else None,
                        max_connections_per_ip=self.config["max.connections.per.ip"],
                        max_preauth_bytes=self.config["sasl.server.max.receive.size"],
                        preauth_timeout_s=self.config["connections.max.preauth.ms"] / 1000,
                        replication_only=self.replication_principals
                        if n in self.replication_only
                        else None,
                    )
                    listener.serve_data(
                        self.replica_manager,
                        message_max_bytes=self.config["message.max.bytes"],
                        producer_ids=self.producer_ids,
                        fetch_sessions=self.fetch_sessions,
                    )
                    listener.serve_groups(self.groups.apis[n])
                    listener.serve_txn(
                        TxnApis(
                            self.caches[n],
                            self.txn,
                            self.groups.runtime,
                            self.producer_ids,
                        )
                    )
                    bound = await nursery.start(listener.serve)
                    if n == self.listener_name:
                        self.kafka_port = bound
                nursery.start_soon(self.fetchers.run)
                nursery.start_soon(self.groups.runtime.run)
                nursery.start_soon(self.txn.runtime.run)
                nursery.start_soon(self.txn.run_markers)
                nursery.start_soon(self.isr_updater.run)
                nursery.start_soon(self.replica_manager.run_checkpoints)
                nursery.start_soon(self.cleaner.run)
                nursery.start_soon(
                    self.replica_manager.run_producer_expiry,
                    self.config["producer.id.expiration.check.interval.ms"] / 1000,
                    self.config["producer.id.expiration.ms"],
                    lambda: int(time.time() * 1000),
                )
                await nursery.start(
                    functools.partial(
                        serve_state,
                        users=self.admin_users,
                        publishes=lambda: [list(p) for p in self.loader.publish_times],
                    ),
                    admin_host(self.config["broker.admin.host"], host),
                    self.admin_port,
                    self.state,
                )
                nursery.start_soon(self.loader.run)
                lifecycle_done = trio.Event()
                result: dict[str, Any] = {}

                async def lifecycle_task() -> None:
                    try:
                        await self.lifecycle.run()
                    except FatalBrokerError as e:
                        result["fatal"] = e
                    finally:
                        lifecycle_done.set()

                nursery.start_soon(lifecycle_task)

                async def notify_ready() -> None:  # systemd Type=notify: READY once unfenced
                    await self.lifecycle.running.wait()
                    sdnotify.notify("READY=1")

                nursery.start_soon(notify_ready)

                async def watch_signals() -> None:
                    async for signum in signals:
                        log.info(
                            "broker %d: received %s; starting controlled shutdown",
                            self.config.node_id,
                            signal.Signals(signum).name,
                        )
                        return

                async with trio.open_nursery() as waiters:

                    async def first(fn: Callable[[], Awaitable[object]]) -> None:
                        await fn()
                        waiters.cancel_scope.cancel()

                    waiters.start_soon(first, watch_signals)
                    waiters.start_soon(first, lifecycle_done.wait)
                if "fatal" in result:
                    log.error("broker %d: fatal: %s", self.config.node_id, result["fatal"])
                    nursery.cancel_scope.cancel()
                    self._close_metrics()
                    return 1
                sdnotify.notify("STOPPING=1")
                timeout = self.config["broker.session.timeout.ms"] / 1000
                await self.lifecycle.controlled_shutdown(timeout)
                with trio.CancelScope(shield=True):
                    await self.loader.checkpoint_now()
                nursery.cancel_scope.cancel()
        self._close_metrics()
        self.replica_manager.close()
        await self.fetch_client.aclose()
        await self.control_client.aclose()
        await self.admin.client.aclose()
        log.info(
            "broker %d: shut down (state %s, metadata offset %d)",
            self.config.node_id,
            BrokerState.SHUTTING_DOWN.value,
            self.loader.offset,
        )
        return 0


def main(config_path: str) -> int:
    """Run a broker from a properties file; the exit code (0 clean, 1 fatal, 2 bad config)."""
    try:
        logsetup.configure(logsetup.level_from(os.environ))
        config = BrokerConfig.load(config_path)
        logsetup.configure_from(config)
    except (ConfigError, logsetup.LogLevelError, OSError) as e:
        print(f"Error: invalid configuration: {e}", file=sys.stderr)
        return 2
    try:
        check_log_dirs(config, config_path)
    except FatalBrokerError as e:
        log.error("broker %d: refusing to start: %s", config.node_id, e)
        return 1
    try:
        node = BrokerNode(config)
    except (SecurityConfigError, ConfigError) as e:  # e.g. an unknown group.consumer.assignors
        log.error("bad broker config: %s", e)
        return 2
    try:
        return trio.run(node.run)
    except FatalBrokerError as e:
        log.error("broker %d: fatal: %s", config.node_id, e)
        return 1
    except OSError as e:
        log.error("broker %d: fatal I/O error: %s", config.node_id, e)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
