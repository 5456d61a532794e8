"""Derived tables over the record table (DataFrame code; nothing is collected to the driver).

Every function takes ``records``: the log rows of the record table with a ``ts`` timestamp
column (see :func:`prepare`). Partition epochs follow ``PartitionRegistration.merge``: a
PartitionRecord sets them, every PartitionChangeRecord adds 1 to the partition epoch and, when it
names a leader (not ``LEADER_UNCHANGED``), 1 to the leader epoch.

A re-audit derives only the rows of the records after the previous run's watermark: the
``seed`` / ``prior`` arguments carry in what the earlier records left behind (each partition's
and broker's last state, the open intervals, every TopicRecord and topic config), so the new
rows equal those a whole-log run gives.
"""

from __future__ import annotations

from typing import cast

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from kraft.records import LEADER_NONE, LEADER_UNCHANGED, RESOURCE_TOPIC

PARTITION_TYPES = ("PartitionRecord", "PartitionChangeRecord")
BROKER_TYPES = ("RegisterBrokerRecord", "UnregisterBrokerRecord", "BrokerRegistrationChangeRecord")
_UNBOUNDED = Window.unboundedPreceding


def prepare(df: DataFrame) -> DataFrame:
    """The log rows (no snapshot rows) with ``ts`` = the batch time as a timestamp."""
    return df.filter(F.col("source_kind") == "log").withColumn(
        "ts", F.timestamp_millis(F.col("timestamp_ms"))
    )


def batches(records: DataFrame) -> DataFrame:
    """One row per decoded batch (its first record's row): offsets, term, hashes, provenance."""
    return records.filter(
        (F.col("index_in_batch") == 0) & F.col("batch_base_offset").isNotNull()
    ).select(
        "batch_base_offset",
        "batch_last_offset",
        "term",
        "timestamp_ms",
        "ts",
        "batch_hash",
        "prev_hash",
        "crc_ok",
        "principal",
        "client_id",
        "request_id",
        "api",
        "reason",
        "source",
        "position",
    )


def topic_created(records: DataFrame) -> DataFrame:
    """Every TopicRecord: topic id and name, offset, batch, time and who created it."""
    return records.filter(F.col("record_type") == "TopicRecord").select(
        "topic_id",
        "topic_name",
        F.col("offset").alias("created_offset"),
        F.col("ts").alias("created_ts"),
        F.col("principal").alias("created_by"),
        "batch_base_offset",
    )


def topic_removed(records: DataFrame) -> DataFrame:
    """Every RemoveTopicRecord's topic id, offset and time."""
    return records.filter(F.col("record_type") == "RemoveTopicRecord").select(
        "topic_id", F.col("offset").alias("removed_offset"), F.col("ts").alias("removed_ts")
    )


def topics(
    records: DataFrame | None, created: DataFrame | None = None, removed: DataFrame | None = None
) -> DataFrame:
    """One row per topic id: name, created/removed offset and time, who created it.
    ``created`` / ``removed`` (:func:`topic_created`, :func:`topic_removed` rows): given
    instead of deriving them from ``records``."""
    # records is given whenever created or removed is not
    created = created if created is not None else topic_created(cast(DataFrame, records))
    removed = removed if removed is not None else topic_removed(cast(DataFrame, records))
    first_removal = removed.groupBy("topic_id").agg(
        F.min("removed_offset").alias("removed_offset"), F.min("removed_ts").alias("removed_ts")
    )
    return created.drop("batch_base_offset").join(first_removal, "topic_id", "left")


def _names(topics_df: DataFrame) -> DataFrame:
    return F.broadcast(topics_df.select("topic_id", "topic_name").dropDuplicates(["topic_id"]))


def provenance(records: DataFrame) -> DataFrame:
    """One row per batch: its base offset, time and provenance (who, how, why)."""
    return records.filter(F.col("index_in_batch") == 0).select(
        "batch_base_offset", "ts", "principal", "client_id", "api", "reason"
    )


SEED_COLUMNS = (
    "topic_id",
    "partition_id",
    "leader",
    "isr",
    "replicas",
    "leader_epoch",
    "partition_epoch",
)


def partition_history(
    records: DataFrame, topics_df: DataFrame, seed: DataFrame | None = None
) -> DataFrame:
    """Every partition creation and change with the resulting leader, ISR, replicas, epochs,
    election type and why; ``state`` is online, under-replicated or offline after the change.

    One sort of the partition records, narrowed to the columns the rules need, and two window
    passes: the first keeps running epoch-bump counts and the latest named leader / ISR /
    replicas up to each row; the second adds the bumps since the partition's latest
    PartitionRecord to that record's epochs (up to the row and up to the row before) and takes
    the row before's values (``prev_``) by lag. Topic names and the
    batch's time and provenance are joined afterwards (both broadcast).

    ``seed``: each partition's state after earlier records (:data:`SEED_COLUMNS`, a row of
    this table); it goes first in its partition like a PartitionRecord and is dropped after."""
    # the hash first: the sort's 8-byte prefix then tells partitions apart (the topic ids'
    # first 8 characters do not); a collision only makes the sort compare the ids
    w = Window.partitionBy("key_hash", "topic_id", "partition_id").orderBy("offset")
    cum = w.rowsBetween(_UNBOUNDED, Window.currentRow)
    is_new = F.col("is_new")
    named_leader = F.when(is_new | (F.col("leader") != LEADER_UNCHANGED), F.col("leader"))
    le_bump = F.when(~is_new & (F.col("leader") != LEADER_UNCHANGED), 1).otherwise(0)
    p = records.filter(F.col("record_type").isin(*PARTITION_TYPES)).select(
        "offset",
        "topic_id",
        "partition_id",
        "replicas",
        "isr",
        "leader",
        "leader_epoch",
        "partition_epoch",
        "election",
        "batch_base_offset",
        (F.col("record_type") == "PartitionRecord").alias("is_new"),
        F.lit(False).alias("is_seed"),
    )
    if seed is not None:
        p = p.unionByName(
            seed.select(
                F.lit(-1).cast("bigint").alias("offset"),
                *SEED_COLUMNS,
                F.lit(None).cast("string").alias("election"),
                F.lit(None).cast("bigint").alias("batch_base_offset"),
                F.lit(True).alias("is_new"),
                F.lit(True).alias("is_seed"),
            )
        )
    p = p.select("*", F.xxhash64("topic_id", "partition_id").alias("key_hash"))
    p = p.select(
        "*",
        named_leader.alias("named_leader"),
        F.sum(le_bump).over(cum).alias("le_cum"),
        F.sum(F.when(~is_new, 1).otherwise(0)).over(cum).alias("pe_cum"),
        F.last("replicas", True).over(cum).alias("replicas_now"),
        F.last("isr", True).over(cum).alias("isr_now"),
        F.last(named_leader, True).over(cum).alias("leader_now"),
    )
    state = (
        F.when(F.col("leader_now") == LEADER_NONE, "offline")
        .when(F.size("isr_now") < F.size("replicas_now"), "under-replicated")
        .otherwise("online")
    )
    # a PartitionRecord's epoch minus the bumps counted before it: add the running count
    le_base = F.when(is_new, F.col("leader_epoch") - F.col("le_cum"))
    pe_base = F.when(is_new, F.col("partition_epoch") - F.col("pe_cum"))
    before = w.rowsBetween(_UNBOUNDED, -1)
    p = p.select("*", state.alias("state"))
    p = p.select(
        "*",
        (F.last(le_base, True).over(cum) + F.col("le_cum")).alias("leader_epoch_now"),
        (F.last(pe_base, True).over(cum) + F.col("pe_cum")).alias("partition_epoch_now"),
        (F.last(le_base, True).over(before) + F.lag("le_cum").over(w)).alias("prev_leader_epoch"),
        (F.last(pe_base, True).over(before) + F.lag("pe_cum").over(w)).alias(
            "prev_partition_epoch"
        ),
        F.lag("replicas_now").over(w).alias("prev_replicas"),
        F.lag("isr_now").over(w).alias("prev_isr"),
        F.lag("leader_now").over(w).alias("prev_leader"),
        F.lag("state").over(w).alias("prev_state"),
    )
    if seed is not None:
        p = p.filter(~F.col("is_seed"))
    leader_changed = (
        ~is_new
        & F.col("named_leader").isNotNull()
        & (F.col("prev_leader").isNull() | (F.col("named_leader") != F.col("prev_leader")))
    )
    isr_changed = (
        ~is_new
        & F.col("isr").isNotNull()
        & (F.col("prev_isr").isNull() | (F.col("isr") != F.col("prev_isr")))
    )
    replicas_changed = (
        ~is_new
        & F.col("replicas").isNotNull()
        & (F.col("prev_replicas").isNull() | (F.col("replicas") != F.col("prev_replicas")))
    )
    return (
        p.join(_names(topics_df), "topic_id", "left")
        .join(F.broadcast(provenance(records)), "batch_base_offset", "left")
        .select(
            "offset",
            "ts",
            "topic_name",
            "topic_id",
            "partition_id",
            F.concat_ws(
                ",",
                F.when(is_new, "created"),
                F.when(leader_changed, "leader"),
                F.when(isr_changed, "isr"),
                F.when(replicas_changed, "replicas"),
            ).alias("change"),
            F.col("prev_leader"),
            F.col("leader_now").alias("leader"),
            F.col("prev_isr"),
            F.col("isr_now").alias("isr"),
            F.col("replicas_now").alias("replicas"),
            F.col("leader_epoch_now").alias("leader_epoch"),
            F.col("partition_epoch_now").alias("partition_epoch"),
            "prev_leader_epoch",
            "prev_partition_epoch",
            F.when(is_new, "initial").otherwise(F.col("election")).alias("election"),
            leader_changed.alias("leader_changed"),
            F.col("leader").alias("record_leader"),
            F.when(is_new, "PartitionRecord")
            .otherwise("PartitionChangeRecord")
            .alias("record_type"),
            F.size("isr_now").alias("isr_size"),
            F.size("replicas_now").alias("replica_count"),
            "state",
            "prev_state",
            "reason",
            "api",
            "principal",
            "client_id",
            "batch_base_offset",
        )
    )


def partition_seeds(history: DataFrame, prior: DataFrame | None = None) -> DataFrame:
    """Each partition's last row of ``history`` (:data:`SEED_COLUMNS`, its ``offset`` and
    ``state``) and its counts of leader and ISR events (creation included) for the report;
    ``prior``: the seeds before ``history``, kept for partitions it lacks, counts added.

    The last offset and the counts are a hash aggregation of fixed-width values; the last
    rows are then picked by a broadcast join on (partition, last offset) instead of carrying
    the rows' arrays through the aggregation (which made it sort every row)."""
    cols = ("offset", *SEED_COLUMNS, "state")
    created = F.col("change") == "created"
    rows = history.select(
        *cols,
        (F.col("leader_changed") | created).cast("long").alias("leader_events"),
        (F.col("change").contains("isr") | created).cast("long").alias("isr_events"),
    )
    if prior is not None:
        rows = rows.unionByName(prior.select(*cols, "leader_events", "isr_events"))
    last = (
        rows.groupBy("topic_id", "partition_id")
        .agg(
            F.max("offset").alias("last_offset"),
            F.sum("leader_events").alias("leader_events"),
            F.sum("isr_events").alias("isr_events"),
        )
        .withColumnRenamed("topic_id", "last_topic_id")
        .withColumnRenamed("partition_id", "last_partition_id")
    )
    on = (
        F.col("topic_id").eqNullSafe(F.col("last_topic_id"))
        & F.col("partition_id").eqNullSafe(F.col("last_partition_id"))
        & (F.col("offset") == F.col("last_offset"))
    )
    # a row twice at the same offset (a duplicated batch) is still one seed
    return (
        rows.select(*cols)
        .join(F.broadcast(last), on)
        .select(*cols, "leader_events", "isr_events")
        .dropDuplicates(["topic_id", "partition_id"])
    )


def broker_history(records: DataFrame, seed: DataFrame | None = None) -> DataFrame:
    """Every registration, unregistration, fence, unfence and controlled shutdown with the
    broker epoch, why, and the broker's state afterwards (fenced, unfenced, unregistered).
    ``seed``: ``(broker_id, state)`` after earlier records, carried into the new rows."""
    w = Window.partitionBy("broker_id").orderBy("offset")
    cum = w.rowsBetween(_UNBOUNDED, Window.currentRow)
    t = F.col("record_type")
    fenced = F.col("fenced")
    event = (
        F.when(t == "RegisterBrokerRecord", "registered")
        .when(t == "UnregisterBrokerRecord", "unregistered")
        .otherwise(
            F.concat_ws(
                ",",
                F.when(fenced == 1, "fenced"),
                F.when(fenced == -1, "unfenced"),
                F.when(F.col("in_controlled_shutdown") == 1, "controlled-shutdown"),
            )
        )
    )
    state_code = (
        F.when(t == "UnregisterBrokerRecord", F.lit("unregistered"))
        .when(fenced == 1, F.lit("fenced"))
        .when(fenced == -1, F.lit("unfenced"))
    )
    rows = records.filter(t.isin(*BROKER_TYPES)).select(
        "offset",
        "ts",
        "timestamp_ms",
        "batch_base_offset",
        "broker_id",
        "broker_epoch",
        "incarnation_id",
        "rack",
        "record_type",
        event.alias("event"),
        state_code.alias("state_code"),
        "reason",
        "api",
        "principal",
        "client_id",
    )
    if seed is not None:
        nulls = {c: F.lit(None).cast(rows.schema[c].dataType) for c in rows.columns}
        rows = rows.unionByName(
            seed.select(
                *[
                    F.lit(-1).cast("bigint").alias(c)
                    if c == "offset"
                    else F.col("broker_id").cast(rows.schema[c].dataType).alias(c)
                    if c == "broker_id"
                    else F.col("state").alias(c)
                    if c == "state_code"
                    else nulls[c].alias(c)
                    for c in rows.columns
                ]
            )
        )
    out = (
        rows.withColumn("state", F.last("state_code", True).over(cum))
        .withColumn("prev_state", F.lag("state").over(w))
        .drop("state_code")
    )
    return out if seed is None else out.filter(F.col("offset") >= 0)


def broker_seeds(history: DataFrame) -> DataFrame:
    """Each broker's state after the last row of ``history`` (for :func:`broker_history`)."""
    return history.groupBy("broker_id").agg(F.max_by("state", "offset").alias("state"))


def broker_intervals(history: DataFrame, log_end_ts: Column) -> DataFrame:
    """Fenced / unfenced / unregistered intervals per broker with durations (an interval still
    open at the end of the log ends there, ``open`` = true)."""
    w = Window.partitionBy("broker_id").orderBy("offset")
    starts = history.filter(F.col("prev_state").isNull() | (F.col("state") != F.col("prev_state")))
    return (
        starts.withColumn("end_offset", F.lead("offset").over(w))
        .withColumn("end_ts_raw", F.lead("ts").over(w))
        .select(
            "broker_id",
            "state",
            F.col("offset").alias("start_offset"),
            F.col("ts").alias("start_ts"),
            "end_offset",
            F.coalesce("end_ts_raw", log_end_ts).alias("end_ts"),
            F.col("end_ts_raw").isNull().alias("open"),
            "broker_epoch",
            "reason",
        )
        .withColumn("duration_s", _seconds("start_ts", "end_ts"))
    )


def replication_intervals(
    history: DataFrame, topics_df: DataFrame, log_end_ts: Column, tails: DataFrame | None = None
) -> DataFrame:
    """Under-replicated and offline intervals per partition with durations. An interval ends
    at the next state change, the topic's deletion, or (``open``) the end of the log.
    ``tails``: the intervals an earlier run left without a next state change (``end_offset``
    null); the history's state changes may end them."""
    w = Window.partitionBy("topic_id", "partition_id").orderBy("offset")
    cols = (
        "topic_name",
        "topic_id",
        "partition_id",
        "state",
        "offset",
        "ts",
        "isr",
        "replicas",
        "leader",
        "reason",
    )
    starts = history.filter(
        F.col("prev_state").isNull() | (F.col("state") != F.col("prev_state"))
    ).select(*cols)
    if tails is not None:
        starts = starts.unionByName(
            tails.select(
                *[
                    F.col({"offset": "start_offset", "ts": "start_ts"}.get(c, c)).alias(c)
                    for c in cols
                ]
            )
        )
    removed = F.broadcast(topics_df.select("topic_id", "removed_ts").dropDuplicates(["topic_id"]))
    return (
        starts.withColumn("end_offset", F.lead("offset").over(w))
        .withColumn("next_ts", F.lead("ts").over(w))
        .filter(F.col("state") != "online")
        .join(removed, "topic_id", "left")
        .select(
            "topic_name",
            "topic_id",
            "partition_id",
            "state",
            F.col("offset").alias("start_offset"),
            F.col("ts").alias("start_ts"),
            "end_offset",
            F.coalesce("next_ts", "removed_ts", log_end_ts).alias("end_ts"),
            (F.col("next_ts").isNull() & F.col("removed_ts").isNull()).alias("open"),
            "isr",
            "replicas",
            "leader",
            "reason",
        )
        .withColumn("duration_s", _seconds("start_ts", "end_ts"))
    )


def topic_configs(records: DataFrame) -> DataFrame:
    """Every topic ConfigRecord: offset, topic name, config name and value."""
    return records.filter(
        (F.col("record_type") == "ConfigRecord") & (F.col("resource_type") == RESOURCE_TOPIC)
    ).select("offset", "batch_base_offset", "resource_name", "config_name", "config_value")


def topic_lifecycle(
    records: DataFrame,
    created: DataFrame | None = None,
    configs: DataFrame | None = None,
    after: int | None = None,
) -> DataFrame:
    """Topics created, partitions added, topics deleted, and topic config changes old → new.
    A re-audit passes the new ``records`` with ``created`` / ``configs`` of the whole log
    (:func:`topic_created`, :func:`topic_configs`) and keeps the events after ``after``."""
    t = F.col("record_type")
    created = created if created is not None else topic_created(records)
    configs = configs if configs is not None else topic_configs(records)
    parts = (
        records.filter(t == "PartitionRecord")
        .groupBy("topic_id", "batch_base_offset")
        .agg(F.count("*").alias("partitions"), F.min("offset").alias("offset"))
    )
    names = F.broadcast(created.select("topic_id", F.col("topic_name").alias("name")))
    creations = (
        created.select("topic_id", "topic_name", "batch_base_offset")
        .join(parts, ["topic_id", "batch_base_offset"])
        .select(
            "offset",
            "batch_base_offset",
            "topic_id",
            "topic_name",
            F.lit("created").alias("event"),
            "partitions",
        )
    )
    added = (
        parts.join(
            created.select("topic_id", F.col("batch_base_offset").alias("cb")), "topic_id", "left"
        )
        .filter(F.col("cb").isNull() | (F.col("cb") != F.col("batch_base_offset")))
        .join(names, "topic_id", "left")
        .select(
            "offset",
            "batch_base_offset",
            "topic_id",
            F.col("name").alias("topic_name"),
            F.lit("partitions-added").alias("event"),
            "partitions",
        )
    )
    deleted = (
        records.filter(t == "RemoveTopicRecord")
        .join(names, "topic_id", "left")
        .select(
            "offset",
            "batch_base_offset",
            "topic_id",
            F.col("name").alias("topic_name"),
            F.lit("deleted").alias("event"),
            F.lit(None).cast("bigint").alias("partitions"),
        )
    )
    events = (
        creations.unionByName(added)
        .unionByName(deleted)
        .withColumn("config_name", F.lit(None).cast("string"))
        .withColumn("old_value", F.lit(None).cast("string"))
        .withColumn("new_value", F.lit(None).cast("string"))
    )
    cw = Window.partitionBy("resource_name", "config_name").orderBy("offset")
    changes = configs.select(
        "offset",
        "batch_base_offset",
        F.lit(None).cast("string").alias("topic_id"),
        F.col("resource_name").alias("topic_name"),
        F.lit("config").alias("event"),
        F.lit(None).cast("bigint").alias("partitions"),
        "config_name",
        F.lag("config_value").over(cw).alias("old_value"),
        F.col("config_value").alias("new_value"),
    )
    out = events.unionByName(changes)
    if after is not None:
        out = out.filter(F.col("offset") > after)
    return out.join(F.broadcast(provenance(records)), "batch_base_offset").select(
        "offset",
        "ts",
        "topic_name",
        "topic_id",
        "event",
        "partitions",
        "config_name",
        "old_value",
        "new_value",
        "principal",
        "client_id",
        "api",
        "reason",
    )


def who_changed_what(records: DataFrame, prior: DataFrame | None = None) -> DataFrame:
    """Records per principal, client, API, reason and record type, with first and last time.
    ``prior``: this table for earlier records (a batch is never split between the two)."""
    keys = ("principal", "client_id", "api", "reason", "record_type")
    new = (
        records.filter(F.col("record_type").isNotNull())
        .groupBy(*keys)
        .agg(
            F.count("*").alias("records"),
            F.countDistinct("batch_base_offset").alias("batches"),
            F.min("ts").alias("first_ts"),
            F.max("ts").alias("last_ts"),
        )
    )
    if prior is None:
        return new
    return (
        new.unionByName(prior)
        .groupBy(*keys)
        .agg(
            F.sum("records").alias("records"),
            F.sum("batches").alias("batches"),
            F.min("first_ts").alias("first_ts"),
            F.max("last_ts").alias("last_ts"),
        )
    )


def volume(records: DataFrame) -> DataFrame:
    """Records per batch time and record type (what the report's change-volume chart sums)."""
    return (
        records.filter(F.col("record_type").isNotNull())
        .groupBy("timestamp_ms", "record_type")
        .count()
    )


def _seconds(start: str, end: str) -> Column:
    return (F.unix_micros(F.col(end)) - F.unix_micros(F.col(start))) / 1e6
