"""Prometheus metrics of a controller, served on ``metrics.host:metrics.port`` (off by default).

Names follow what Prometheus' JMX exporter makes of Kafka's MBeans with the usual Kafka rules
(``kafka.<domain><type=T, name=N>`` → ``kafka_<domain>_<t>_<n>``, lower case; attribute-style
metrics ``kafka.server<type=raft-metrics><>commit-latency`` → ``kafka_server_raft_metrics_...``).
Things Kafka has no metric for start with ``pykraft_``. The full mapping is in docs/design.md
("Metrics").

Gauges are read from the live node on every scrape by :class:`ControllerCollector` (no polling
thread); the two histograms are observed by the node as requests complete. The HTTP server is
prometheus_client's, on a daemon thread; the collector only reads immutable images and copies
of small dicts, so it is safe from that thread.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Histogram,
    disable_created_metrics,
    start_http_server,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from kraft.metadata.image import MetadataImage

KC = "kafka_controller_kafkacontroller_"
RAFT = "kafka_server_raft_metrics_"
# Latency buckets in milliseconds (Kafka's histograms are in ms too).
MS_BUCKETS = (0.5, 1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000)


@dataclass(frozen=True)
class ImageCounts:
    """Partition and broker counts of one metadata image (what the controller gauges show)."""

    topics: int
    partitions: int
    offline_partitions: int
    preferred_replica_imbalance: int
    fenced_brokers: int
    active_brokers: int

    @classmethod
    def of(cls, image: MetadataImage) -> ImageCounts:
        partitions = offline = imbalance = 0
        # a leader that is fenced serves nothing either: after its disks' proof a restarted
        # broker keeps its leaderships while fenced, until it has caught up (cluster_control)
        serving = {b for b, reg in image.brokers.items() if not reg.fenced}
        for topic in image.topics_by_id.values():
            for reg in topic.partitions.values():
                partitions += 1
                if reg.leader not in serving:
                    offline += 1
                elif reg.replicas and reg.leader != reg.replicas[0]:
                    imbalance += 1
        fenced = sum(1 for b in image.brokers.values() if b.fenced)
        return cls(
            len(image.topics_by_id),
            partitions,
            offline,
            imbalance,
            fenced,
            len(image.brokers) - fenced,
        )


class _CountsCache:
    """``ImageCounts`` of the latest image seen (images are immutable: one count per image)."""

    def __init__(self) -> None:
        self._entry: tuple[MetadataImage, ImageCounts] | None = None

    def get(self, image: MetadataImage) -> ImageCounts:
        entry = self._entry
        if entry is None or entry[0] is not image:
            entry = (image, ImageCounts.of(image))
            self._entry = entry
        return entry[1]


def gauge(name: str, doc: str, value: float | None) -> GaugeMetricFamily | None:
    """One unlabelled gauge, or None when the value is unknown."""
    return None if value is None else GaugeMetricFamily(name, doc, value=value)


class ControllerCollector(Collector):
    """Reads a running :class:`kraft.controller_server.ControllerServer` on every scrape."""

    def __init__(self, node: Any) -> None:
        self.node = node
        self._counts = _CountsCache()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        node = self.node
        image: MetadataImage = node.state_machine.image
        counts = self._counts.get(image)
        now_ms = int(time.time() * 1000)
        quorum = node.quorum
        status = quorum.status() if quorum is not None else {}
        stats = quorum.stats() if quorum is not None else {}
        leader = status.get("leader_id")
        metrics = [
            gauge(
                KC + "activecontrollercount",
                "1 on the active controller, else 0",
                1 if node.is_active else 0,
            ),
            gauge(KC + "globaltopiccount", "topics in the metadata image", counts.topics),
            gauge(
                KC + "globalpartitioncount", "partitions in the metadata image", counts.partitions
            ),
            gauge(
                KC + "offlinepartitionscount",
                "partitions without a leader, or whose leader is fenced",
                counts.offline_partitions,
            ),
            gauge(
                KC + "preferredreplicaimbalancecount",
                "partitions led by a replica other than the first (preferred) one",
                counts.preferred_replica_imbalance,
            ),
            gauge(
                KC + "fencedbrokercount",
                "registered brokers that are fenced",
                counts.fenced_brokers,
            ),
            gauge(
                KC + "activebrokercount",
                "registered brokers that are unfenced",
                counts.active_brokers,
            ),
            gauge(
                KC + "lastappliedrecordoffset",
                "offset of the last metadata record applied",
                image.offset,
            ),
            gauge(
                KC + "lastappliedrecordtimestamp",
                "append time (ms since epoch) of the last record applied",
                image.timestamp_ms,
            ),
            gauge(
                KC + "lastappliedrecordlagms",
                "now minus the append time of the last record applied",
                max(now_ms - image.timestamp_ms, 0) if image.offset >= 0 else 0,
            ),
            gauge(
                RAFT + "current_leader",
                "node id of the Raft leader (-1 unknown)",
                -1 if leader is None else leader,
            ),
            gauge(RAFT + "current_epoch", "current Raft term", status.get("term")),
            gauge(
                RAFT + "high_watermark", "next metadata log offset (log end)", node.log.next_offset
            ),
            gauge(
                "pykraft_raft_commit_index", "PySyncObj commit index", status.get("commit_index")
            ),
            gauge(
                "pykraft_raft_last_applied_index",
                "PySyncObj last applied Raft index",
                status.get("last_applied"),
            ),
            gauge(
                "pykraft_raft_has_quorum",
                "1 when this member sees a quorum",
                1 if status.get("has_quorum") else 0,
            ),
            gauge(
                "kafka_controller_controllereventmanager_eventqueuesize",
                "commands waiting in the group-commit queue",
                stats.get("queued"),
            ),
            gauge(
                "pykraft_raft_group_commit_in_flight",
                "groups being replicated",
                stats.get("in_flight"),
            ),
            gauge(
                "kraft_controller_divergent_voters",
                "voters whose metadata log differs from the active controller's (0 elsewhere)",
                len(node.divergence.divergent) if node.is_active else 0,
            ),
            gauge(
                "kraft_controller_divergent_brokers",
                "brokers whose metadata image differs from the controllers' (active only)",
                len(node.lifecycle.images.divergent) if node.is_active else 0,
            ),
        ]
        yield from (m for m in metrics if m is not None)


class MetricsEndpoint:
    """A registry served over HTTP on a daemon thread (controllers and brokers alike)."""

    def __init__(self, collector: Collector) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(collector)
        self._server: Any = None

    def serve(self, host: str, port: int) -> None:
        """Start the HTTP endpoint (``/metrics``; any path works) on a daemon thread."""
        # No *_created series: they only add noise to a scrape.
        disable_created_metrics()  # type: ignore[no-untyped-call]  # unannotated upstream
        try:
            self._server, _thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as e:
            raise OSError(
                e.errno, f"metrics.port: cannot serve metrics on {host}:{port}: {e.strerror}"
            ) from None

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


class ControllerMetrics(MetricsEndpoint):
    """The controller's registry, its histograms and the HTTP server that exposes them."""

    def __init__(self, node: Any) -> None:
        super().__init__(ControllerCollector(node))
        self.commit_latency = Histogram(
            RAFT + "commit_latency_ms",
            "ms from handing a command to the quorum until it is committed and applied",
            registry=self.registry,
            buckets=MS_BUCKETS,
        )
        self.event_processing = Histogram(
            "kafka_controller_controllereventmanager_eventqueueprocessingtimems",
            "ms the active controller spends on one write request (validation, every commit "
            "of a stepped transition, the response)",
            registry=self.registry,
            buckets=MS_BUCKETS,
        )


def serve_controller_metrics(node: Any, host: str, port: int) -> ControllerMetrics:
    """Expose ``node``'s metrics on ``host:port``; returns the metrics (observe + close)."""
    metrics = ControllerMetrics(node)
    metrics.serve(host, port)
    return metrics
