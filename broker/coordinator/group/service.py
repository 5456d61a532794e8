"""Wiring of the group coordinator on a broker: the runtime over ``__consumer_offsets`` and the
API handler of each listener, configured from the broker's settings."""

from __future__ import annotations

from collections import Counter
from typing import Any

from kio.schema.errors import ErrorCode

from broker.coordinator.find_coordinator import FindCoordinator
from broker.coordinator.group.api import GroupApis
from broker.coordinator.group.consumer_group import consumer_group_config
from broker.coordinator.group.consumer_records import decode_any, encode_any
from broker.coordinator.group.shard import CoordinatorShard
from broker.coordinator.group.state_machine import GroupConfig
from broker.coordinator.placement import OFFSETS_TOPIC
from broker.coordinator.runtime import CoordinatorError, CoordinatorRuntime
from broker.coordinator.txn.service import txn_setting
from broker.metadata.metadata_cache import MetadataCache
from broker.replica.replica_manager import ReplicaManager


def group_config(values: Any) -> GroupConfig:
    """The :class:`GroupConfig` of a broker config (anything indexable by Kafka's names)."""
    return GroupConfig(
        min_session_timeout_ms=values["group.min.session.timeout.ms"],
        max_session_timeout_ms=values["group.max.session.timeout.ms"],
        initial_rebalance_delay_ms=values["group.initial.rebalance.delay.ms"],
        max_size=values["group.max.size"],
        offset_metadata_max_bytes=values["offset.metadata.max.bytes"],
        offsets_retention_ms=values["offsets.retention.minutes"] * 60_000,
    )


class GroupCoordinator:
    """One runtime per broker; one :class:`GroupApis` per listener (its own metadata cache)."""

    def __init__(
        self,
        config: Any,
        replicas: ReplicaManager,
        caches: dict[str, MetadataCache],
        client: Any,
    ) -> None:
        cfg, consumer_cfg = group_config(config), consumer_group_config(config)
        self.runtime = CoordinatorRuntime(
            replicas,
            OFFSETS_TOPIC,
            lambda: CoordinatorShard(cfg, consumer_cfg),
            encode_any,
            decode_any,
            expiry_interval_ms=config["offsets.retention.check.interval.ms"],
        )

        async def call(api: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
            resp: dict[str, Any] = await client.call(api, body, timeout=timeout)
            return resp

        self.apis = {
            name: GroupApis(
                cache,
                self.runtime,
                FindCoordinator(
                    cache,
                    call,
                    config["offsets.topic.num.partitions"],
                    config["offsets.topic.replication.factor"],
                    txn_setting(config, "transaction.state.log.num.partitions"),
                    txn_setting(config, "transaction.state.log.replication.factor"),
                ),
            )
            for name, cache in caches.items()
        }

    async def end_txn_offsets(self, partition: int, producer_id: int, commit: bool) -> ErrorCode:
        """A transaction marker reached ``__consumer_offsets-<partition>``: commit (or drop)
        the offsets its producer sent with TxnOffsetCommit."""
        try:
            await self.runtime.write(
                partition,
                lambda s, t, now: s.complete_txn(producer_id, commit, now).answer(t, {}),
            )
        except CoordinatorError as e:
            if e.code == ErrorCode.not_coordinator:
                return ErrorCode.none  # a new coordinator has no pending offsets of it
            return e.code
        return ErrorCode.none

    def metrics(self) -> dict[str, Any]:
        """Groups by state (classic; consumer-protocol apart), and coordinator partitions by state, for the metrics."""
        groups: Counter[str] = Counter()
        consumer: Counter[str] = Counter()
        for shard in self.runtime.loaded_shards():
            for g in shard.groups.values():
                if g.group_id not in shard.consumer.groups:  # else only its offsets
                    groups[g.state] += 1
            for cg in shard.consumer.groups.values():
                consumer[cg.state] += 1
        loading = sum(1 for s in self.runtime.slots.values() if s.loading)
        commits = self.runtime.meter("offset-commit")
        return {
            "groups_by_state": dict(groups),
            "consumer_groups_by_state": dict(consumer),
            "partitions": {"loading": loading, "active": len(self.runtime.slots) - loading},
            "offset_commit_count": commits.count,
            "offset_commit_rate": commits.rate(),
            "records_appended": self.runtime.counters["records_appended"],
            "batches_appended": self.runtime.counters["batches_appended"],
            "partition_load_time_last": self.runtime.last_load_seconds * 1000,
            "partition_load_time_max": self.runtime.max_load_seconds * 1000,
        }
