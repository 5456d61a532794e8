"""Prometheus metrics of a broker, served on ``metrics.host:metrics.port`` (off by default).

Names are what Prometheus' JMX exporter makes of Kafka's broker MBeans
(``kafka.server<type=broker-metadata-metrics><>last-applied-record-offset`` →
``kafka_server_broker_metadata_metrics_last_applied_record_offset``,
``kafka.server<type=ReplicaManager, name=LeaderCount>`` → ``kafka_server_replicamanager_leadercount``).
Every value is read from the live broker on each scrape (:class:`BrokerCollector`); see
docs/design.md ("Metrics") for the mapping.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric, SummaryMetricFamily
from prometheus_client.registry import Collector

from kraft.metrics import MetricsEndpoint

BMM = "kafka_server_broker_metadata_metrics_"
RM = "kafka_server_replicamanager_"
# Kafka's BrokerState values (kafka.server:type=KafkaServer,name=BrokerState).
BROKER_STATE_VALUES = {
    "NOT_RUNNING": 0,
    "STARTING": 1,
    "RECOVERY": 2,
    "RUNNING": 3,
    "PENDING_CONTROLLED_SHUTDOWN": 6,
    "SHUTTING_DOWN": 7,
}


def replica_counts(broker_id: int, partitions: list[Any]) -> tuple[int, int, int]:
    """(partitions hosted, partitions led, led partitions whose ISR is smaller than the replicas)."""
    led = [p for p in partitions if p.role == "leader" and p.leader == broker_id]
    under = sum(1 for p in led if len(p.isr) < len(p.replicas))
    return len(partitions), len(led), under


class BrokerCollector(Collector):
    """Reads a running :class:`broker.node.BrokerNode` on every scrape."""

    def __init__(self, broker: Any) -> None:
        self.broker = broker

    def collect(self) -> Iterator[Metric]:
        b = self.broker
        image = b.loader.image
        check = b.loader.image_check
        now_ms = int(time.time() * 1000)
        hosted, led, under = replica_counts(
            b.config.node_id, list(b.replica_manager.partitions.values())
        )
        values = [
            (
                BMM + "last_applied_record_offset",
                "offset of the last metadata record applied",
                image.offset,
            ),
            (
                BMM + "last_applied_record_timestamp",
                "append time (ms) of the last record applied",
                image.timestamp_ms,
            ),
            (
                BMM + "last_applied_record_lag_ms",
                "now minus the append time of the last record applied",
                max(now_ms - image.timestamp_ms, 0) if image.offset >= 0 else 0,
            ),
            (
                BMM + "metadata_load_error_count",
                "failed metadata fetches and replays",
                b.loader.errors,
            ),
            (
                "pykraft_broker_metadata_high_watermark",
                "the controllers' metadata log end last seen",
                b.loader.high_watermark,
            ),
            (RM + "partitioncount", "partitions with a replica on this broker", hosted),
            (RM + "leadercount", "partitions this broker leads", led),
            (
                RM + "underreplicatedpartitions",
                "led partitions whose ISR is smaller than the replica set",
                under,
            ),
            (
                "kafka_server_kafkaserver_brokerstate",
                "Kafka's broker state number (3 = RUNNING)",
                BROKER_STATE_VALUES.get(b.lifecycle.state.value, 0),
            ),
            (
                "pykraft_broker_metadata_image_divergent",
                "1 while this broker's image differs from the controllers' (2: it asks to be "
                "fenced)",
                0 if check.mismatch is None else 2 if check.mismatch.fenced else 1,
            ),
            (
                "pykraft_broker_metadata_image_mismatch_count",
                "image checks that found the image differing from the controllers'",
                check.mismatches,
            ),
            (
                "pykraft_broker_metadata_image_check_count",
                "image checksum comparisons with a controller's",
                check.checks,
            ),
            (
                "pykraft_broker_fenced",
                "1 while the controllers keep this broker fenced",
                1 if getattr(image.brokers.get(b.config.node_id), "fenced", True) else 0,
            ),
        ]
        for name, doc, value in values:
            yield GaugeMetricFamily(name, doc, value=value)
        yield from log_dir_metrics(b.replica_manager.dirs)
        yield from group_coordinator_metrics(b.groups.metrics())
        yield from transaction_coordinator_metrics(b.txn.metrics())
        yield from log_cleaner_metrics(b.cleaner)
        yield from fetch_session_metrics(b.fetch_sessions)


FSC = "kafka_server_fetchsessioncache_"


def fetch_session_metrics(cache: Any) -> Iterator[GaugeMetricFamily]:
    """Kafka's FetchSessionCache gauges, and the incremental fetches served (pykraft's)."""
    for name, doc, value in (
        (
            FSC + "numincrementalfetchsessions",
            "incremental fetch sessions cached",
            len(cache.sessions),
        ),
        (
            FSC + "numincrementalfetchpartitionscached",
            "partitions in them",
            cache.partitions_cached(),
        ),
        (
            FSC + "incrementalfetchsessionevictions",
            "sessions evicted for a new one",
            cache.evictions,
        ),
        (
            "pykraft_broker_incremental_fetch_count",
            "fetches answered in a session",
            cache.incremental_fetches,
        ),
    ):
        yield GaugeMetricFamily(name, doc, value=value)


LM = "kafka_log_logmanager_"


def log_dir_metrics(dirs: Any) -> Iterator[GaugeMetricFamily]:
    """Kafka's LogManager gauges: OfflineLogDirectoryCount and LogDirectoryOffline per dir."""
    yield GaugeMetricFamily(
        LM + "offlinelogdirectorycount", "log dirs offline after a failure", value=len(dirs.offline)
    )
    per_dir = GaugeMetricFamily(
        LM + "logdirectoryoffline", "1 while the log dir is offline", labels=["logDirectory"]
    )
    for d in dirs.dirs:
        per_dir.add_metric([str(d)], 1 if dirs.is_offline(d) else 0)
    yield per_dir


LC = "kafka_log_logcleaner_"


def log_cleaner_metrics(cleaner: Any) -> Iterator[GaugeMetricFamily]:
    """Kafka's kafka.log:type=LogCleaner gauges, plus the cleaner's totals since start."""
    c = cleaner.counters
    for name, doc, value in (
        (
            "cleaner_recopy_percent",
            "bytes written / bytes read by the last pass, %",
            cleaner.last_recopy,
        ),
        ("max_clean_time_secs", "duration of the longest pass (s)", cleaner.max_seconds),
        ("max_dirty_percent", "dirty ratio of the last log cleaned, %", cleaner.last_ratio * 100),
        ("passes", "logs cleaned since start", c["passes"]),
        ("bytes_read", "segment bytes the cleaner read since start", c["bytes_read"]),
        ("bytes_written", "segment bytes the cleaner wrote since start", c["bytes_written"]),
        (
            "records_removed",
            "records (and markers) compaction removed since start",
            c["records_removed"],
        ),
        ("batches_removed", "whole batches compaction removed since start", c["batches_removed"]),
    ):
        yield GaugeMetricFamily(LC + name, doc, value=value)


GCM = "kafka_server_group_coordinator_metrics_"


def group_coordinator_metrics(m: dict[str, Any]) -> Iterator[GaugeMetricFamily]:
    """Kafka's group-coordinator-metrics: groups by protocol and state, coordinator partitions."""
    by_state = m["groups_by_state"]
    total = GaugeMetricFamily(GCM + "group_count", "groups coordinated here", labels=["protocol"])
    total.add_metric(["classic"], sum(by_state.values()))
    consumer = m.get("consumer_groups_by_state", {})
    total.add_metric(["consumer"], sum(consumer.values()))
    yield total
    cstates = GaugeMetricFamily(
        GCM + "consumer_group_count",
        "consumer-protocol (KIP-848) groups coordinated here by state",
        labels=["state"],
    )
    for state in ("Empty", "Assigning", "Reconciling", "Stable", "Dead"):
        cstates.add_metric([state], consumer.get(state, 0))
    yield cstates
    states = GaugeMetricFamily(
        GCM + "classic_group_count", "classic groups coordinated here by state", labels=["state"]
    )
    for state in ("Empty", "PreparingRebalance", "CompletingRebalance", "Stable", "Dead"):
        states.add_metric([state], by_state.get(state, 0))
    yield states
    parts = GaugeMetricFamily(
        GCM + "num_partitions", "__consumer_offsets partitions led here", labels=["state"]
    )
    for state, count in m["partitions"].items():
        parts.add_metric([state], count)
    yield parts
    for name, doc in (
        ("offset_commit_count", "partition offsets committed (OffsetCommit) since start"),
        ("offset_commit_rate", "partition offsets committed per second (last 30 s)"),
        ("records_appended", "records the group coordinator appended to __consumer_offsets"),
        ("batches_appended", "batches it appended (records_appended / this: group commit)"),
        ("partition_load_time_last", "ms the last __consumer_offsets partition load took"),
        ("partition_load_time_max", "ms the longest __consumer_offsets partition load took"),
    ):
        if name in m:
            yield GaugeMetricFamily(GCM + name, doc, value=m[name])


TCM = "pykraft_transaction_coordinator_"
TXN_STATES = (
    "Empty",
    "Ongoing",
    "PrepareCommit",
    "PrepareAbort",
    "CompleteCommit",
    "CompleteAbort",
)


def transaction_coordinator_metrics(m: dict[str, Any]) -> Iterator[Metric]:
    """The transaction coordinator: transactional ids by state, ``__transaction_state``
    partitions, transactions begun / committed / aborted here, and the time from EndTxn (the
    Prepare record) to the Complete record, i.e. writing the markers (a summary in ms)."""
    states = GaugeMetricFamily(
        TCM + "transactional_ids", "transactional ids coordinated here by state", labels=["state"]
    )
    for state in TXN_STATES:
        states.add_metric([state], m["txns_by_state"].get(state, 0))
    yield states
    parts = GaugeMetricFamily(
        TCM + "num_partitions", "__transaction_state partitions led here", labels=["state"]
    )
    for state, count in m["partitions"].items():
        parts.add_metric([state], count)
    yield parts
    for name, doc in (
        ("started", "transactions begun here (AddPartitionsToTxn / AddOffsetsToTxn) since start"),
        ("committed", "transactions committed here (CompleteCommit written) since start"),
        ("aborted", "transactions aborted here (CompleteAbort written) since start"),
    ):
        yield GaugeMetricFamily(TCM + name + "_count", doc, value=m[name])
    for name, doc in (
        ("commit", "PrepareCommit to CompleteCommit (the markers), ms"),
        ("abort", "PrepareAbort to CompleteAbort (the markers), ms"),
    ):
        yield SummaryMetricFamily(
            TCM + name + "_completion_time_ms",
            doc,
            count_value=m["committed" if name == "commit" else "aborted"],
            sum_value=m[name + "_ms_sum"],
        )


class BrokerMetrics(MetricsEndpoint):
    """The broker's registry and the HTTP server that exposes it."""

    def __init__(self, broker: Any) -> None:
        super().__init__(BrokerCollector(broker))


def serve_broker_metrics(broker: Any, host: str, port: int) -> BrokerMetrics:
    """Expose ``broker``'s metrics on ``host:port``; returns them (call ``close`` on exit)."""
    metrics = BrokerMetrics(broker)
    metrics.serve(host, port)
    return metrics
