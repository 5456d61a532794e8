"""Derived tables over the record table (DataFrame code; nothing is collected to the driver).

Every function takes ``records``: the log rows of the record table with a ``ts`` timestamp
column (see :func:`prepare`). Partition epochs follow ``PartitionRegistration.merge``: a
PartitionRecord sets them, every PartitionChangeRecord adds 1 to the partition epoch and, when it
names a leader (not ``LEADER_UNCHANGED``), 1 to the leader epoch.
"""
from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from kraft.records import LEADER_NONE, LEADER_UNCHANGED, RESOURCE_TOPIC

PARTITION_TYPES = ("PartitionRecord", "PartitionChangeRecord")
BROKER_TYPES = ("RegisterBrokerRecord", "UnregisterBrokerRecord", "BrokerRegistrationChangeRecord")
_UNBOUNDED = Window.unboundedPreceding


def prepare(df: DataFrame) -> DataFrame:
    """The log rows (no snapshot rows) with ``ts`` = the batch time as a timestamp."""
    return (df.filter(F.col("source_kind") == "log")
              .withColumn("ts", F.timestamp_millis(F.col("timestamp_ms"))))


def batches(records: DataFrame) -> DataFrame:
    """One row per decoded batch (its first record's row): offsets, term, hashes, provenance."""
    return (records.filter((F.col("index_in_batch") == 0) & F.col("batch_base_offset").isNotNull())
                   .select("batch_base_offset", "batch_last_offset", "term", "timestamp_ms", "ts",
                           "batch_hash", "prev_hash", "crc_ok", "principal", "client_id",
                           "request_id", "api", "reason", "source", "position"))


def topics(records: DataFrame) -> DataFrame:
    """One row per topic id: name, created/removed offset and time, who created it."""
    created = (records.filter(F.col("record_type") == "TopicRecord")
                      .select("topic_id", "topic_name", F.col("offset").alias("created_offset"),
                              F.col("ts").alias("created_ts"),
                              F.col("principal").alias("created_by")))
    removed = (records.filter(F.col("record_type") == "RemoveTopicRecord")
                      .groupBy("topic_id")
                      .agg(F.min("offset").alias("removed_offset"), F.min("ts").alias("removed_ts")))
    return created.join(removed, "topic_id", "left")


def _names(topics_df: DataFrame) -> DataFrame:
    return F.broadcast(topics_df.select("topic_id", "topic_name").dropDuplicates(["topic_id"]))


def partition_history(records: DataFrame, topics_df: DataFrame) -> DataFrame:
    """Every partition creation and change with the resulting leader, ISR, replicas, epochs,
    election type and why; ``state`` is online, under-replicated or offline after the change.

    Two window passes over one sort: the first keeps running epoch-bump counts and the latest
    named leader / ISR / replicas up to each row and up to the row before it (the ``prev_``
    values); the second adds the bumps since the partition's latest PartitionRecord to that
    record's epochs."""
    w = Window.partitionBy("topic_id", "partition_id").orderBy("offset")
    cum = w.rowsBetween(_UNBOUNDED, Window.currentRow)
    before = w.rowsBetween(_UNBOUNDED, -1)
    is_new = F.col("record_type") == "PartitionRecord"
    named_leader = F.when(is_new, F.col("leader")).when(F.col("leader") != LEADER_UNCHANGED,
                                                        F.col("leader"))
    le_bump = F.when(~is_new & (F.col("leader") != LEADER_UNCHANGED), 1).otherwise(0)
    p = (records.filter(F.col("record_type").isin(*PARTITION_TYPES))
                .select("offset", "ts", "topic_id", "partition_id", "record_type", "replicas",
                        "isr", "leader", "leader_epoch", "partition_epoch", "election",
                        "principal", "client_id", "api", "reason", "batch_base_offset",
                        is_new.alias("is_new"), named_leader.alias("named_leader"),
                        F.sum(le_bump).over(cum).alias("le_cum"),
                        F.sum(F.when(~is_new, 1).otherwise(0)).over(cum).alias("pe_cum"),
                        F.last("replicas", True).over(cum).alias("replicas_now"),
                        F.last("isr", True).over(cum).alias("isr_now"),
                        F.last(named_leader, True).over(cum).alias("leader_now"),
                        F.last("replicas", True).over(before).alias("prev_replicas"),
                        F.last("isr", True).over(before).alias("prev_isr"),
                        F.last(named_leader, True).over(before).alias("prev_leader")))
    # a PartitionRecord's epoch minus the bumps counted before it: add the running count
    le_base = F.when(F.col("is_new"), F.col("leader_epoch") - F.col("le_cum"))
    pe_base = F.when(F.col("is_new"), F.col("partition_epoch") - F.col("pe_cum"))
    p = p.select("*",
                 (F.last(le_base, True).over(cum) + F.col("le_cum")).alias("leader_epoch_now"),
                 (F.last(pe_base, True).over(cum) + F.col("pe_cum")).alias("partition_epoch_now"),
                 (F.last(le_base, True).over(before) + F.lag("le_cum").over(w))
                 .alias("prev_leader_epoch"),
                 (F.last(pe_base, True).over(before) + F.lag("pe_cum").over(w))
                 .alias("prev_partition_epoch"))
    leader_changed = ~F.col("is_new") & F.col("named_leader").isNotNull() & (
        F.col("prev_leader").isNull() | (F.col("named_leader") != F.col("prev_leader")))
    isr_changed = ~F.col("is_new") & F.col("isr").isNotNull() & (
        F.col("prev_isr").isNull() | (F.col("isr") != F.col("prev_isr")))
    replicas_changed = ~F.col("is_new") & F.col("replicas").isNotNull() & (
        F.col("prev_replicas").isNull() | (F.col("replicas") != F.col("prev_replicas")))
    state = (F.when(F.col("leader_now") == LEADER_NONE, "offline")
              .when(F.size("isr_now") < F.size("replicas_now"), "under-replicated")
              .otherwise("online"))
    return (p.join(_names(topics_df), "topic_id", "left")
             .select("offset", "ts", "topic_name", "topic_id", "partition_id",
                     F.concat_ws(",", F.when(F.col("is_new"), "created"),
                                 F.when(leader_changed, "leader"), F.when(isr_changed, "isr"),
                                 F.when(replicas_changed, "replicas")).alias("change"),
                     F.col("prev_leader"), F.col("leader_now").alias("leader"),
                     F.col("prev_isr"), F.col("isr_now").alias("isr"),
                     F.col("replicas_now").alias("replicas"),
                     F.col("leader_epoch_now").alias("leader_epoch"),
                     F.col("partition_epoch_now").alias("partition_epoch"),
                     "prev_leader_epoch", "prev_partition_epoch",
                     F.when(F.col("is_new"), "initial").otherwise(F.col("election")).alias("election"),
                     leader_changed.alias("leader_changed"),
                     F.col("leader").alias("record_leader"), "record_type",
                     F.size("isr_now").alias("isr_size"), F.size("replicas_now").alias("replica_count"),
                     state.alias("state"), "reason", "api", "principal", "client_id",
                     "batch_base_offset"))


def broker_history(records: DataFrame) -> DataFrame:
    """Every registration, unregistration, fence, unfence and controlled shutdown with the
    broker epoch, why, and the broker's state afterwards (fenced, unfenced, unregistered)."""
    w = Window.partitionBy("broker_id").orderBy("offset")
    cum = w.rowsBetween(_UNBOUNDED, Window.currentRow)
    t = F.col("record_type")
    fenced = F.col("fenced")
    event = (F.when(t == "RegisterBrokerRecord", "registered")
              .when(t == "UnregisterBrokerRecord", "unregistered")
              .otherwise(F.concat_ws(",", F.when(fenced == 1, "fenced"),
                                     F.when(fenced == -1, "unfenced"),
                                     F.when(F.col("in_controlled_shutdown") == 1,
                                            "controlled-shutdown"))))
    state_code = (F.when(t == "UnregisterBrokerRecord", F.lit("unregistered"))
                   .when(fenced == 1, F.lit("fenced")).when(fenced == -1, F.lit("unfenced")))
    return (records.filter(t.isin(*BROKER_TYPES))
                   .select("offset", "ts", "timestamp_ms", "batch_base_offset", "broker_id",
                           "broker_epoch", "incarnation_id", "rack", "record_type", event.alias("event"),
                           state_code.alias("state_code"), "reason", "api", "principal",
                           "client_id")
                   .withColumn("state", F.last("state_code", True).over(cum))
                   .withColumn("prev_state", F.lag("state").over(w))
                   .drop("state_code"))


def broker_intervals(history: DataFrame, log_end_ts: Column) -> DataFrame:
    """Fenced / unfenced / unregistered intervals per broker with durations (an interval still
    open at the end of the log ends there, ``open`` = true)."""
    w = Window.partitionBy("broker_id").orderBy("offset")
    starts = history.filter(F.col("prev_state").isNull() | (F.col("state") != F.col("prev_state")))
    return (starts.withColumn("end_offset", F.lead("offset").over(w))
                  .withColumn("end_ts_raw", F.lead("ts").over(w))
                  .select("broker_id", "state", F.col("offset").alias("start_offset"),
                          F.col("ts").alias("start_ts"), "end_offset",
                          F.coalesce("end_ts_raw", log_end_ts).alias("end_ts"),
                          F.col("end_ts_raw").isNull().alias("open"), "broker_epoch", "reason")
                  .withColumn("duration_s", _seconds("start_ts", "end_ts")))


def replication_intervals(history: DataFrame, topics_df: DataFrame, log_end_ts: Column) -> DataFrame:
    """Under-replicated and offline intervals per partition with durations. An interval ends
    at the next state change, the topic's deletion, or (``open``) the end of the log."""
    w = Window.partitionBy("topic_id", "partition_id").orderBy("offset")
    prev = F.lag("state").over(w)
    starts = (history.withColumn("prev_state", prev)
                     .filter(F.col("prev_state").isNull() | (F.col("state") != F.col("prev_state"))))
    removed = F.broadcast(topics_df.select("topic_id", "removed_ts").dropDuplicates(["topic_id"]))
    return (starts.withColumn("end_offset", F.lead("offset").over(w))
                  .withColumn("next_ts", F.lead("ts").over(w))
                  .join(removed, "topic_id", "left")
                  .filter(F.col("state") != "online")
                  .select("topic_name", "topic_id", "partition_id", "state",
                          F.col("offset").alias("start_offset"), F.col("ts").alias("start_ts"),
                          "end_offset",
                          F.coalesce("next_ts", "removed_ts", log_end_ts).alias("end_ts"),
                          (F.col("next_ts").isNull() & F.col("removed_ts").isNull()).alias("open"),
                          "isr", "replicas", "leader", "reason")
                  .withColumn("duration_s", _seconds("start_ts", "end_ts")))


def topic_lifecycle(records: DataFrame) -> DataFrame:
    """Topics created, partitions added, topics deleted, and topic config changes old → new."""
    t = F.col("record_type")
    parts = (records.filter(t == "PartitionRecord")
                    .groupBy("topic_id", "batch_base_offset")
                    .agg(F.count("*").alias("partitions"), F.min("offset").alias("offset")))
    created = (records.filter(t == "TopicRecord")
                      .select("topic_id", "topic_name", "batch_base_offset"))
    names = F.broadcast(created.select("topic_id", F.col("topic_name").alias("name")))
    base = records.select("offset", "ts", "principal", "client_id", "api", "reason")
    creations = (created.join(parts, ["topic_id", "batch_base_offset"], "left")
                        .select("offset", "topic_id", "topic_name", F.lit("created").alias("event"),
                                "partitions"))
    added = (parts.join(created.select("topic_id", F.col("batch_base_offset").alias("cb")),
                        "topic_id", "left")
                  .filter(F.col("cb").isNull() | (F.col("cb") != F.col("batch_base_offset")))
                  .join(names, "topic_id", "left")
                  .select("offset", "topic_id", F.col("name").alias("topic_name"),
                          F.lit("partitions-added").alias("event"), "partitions"))
    deleted = (records.filter(t == "RemoveTopicRecord").join(names, "topic_id", "left")
                      .select("offset", "topic_id", F.col("name").alias("topic_name"),
                              F.lit("deleted").alias("event"),
                              F.lit(None).cast("bigint").alias("partitions")))
    events = (creations.unionByName(added).unionByName(deleted)
                       .withColumn("config_name", F.lit(None).cast("string"))
                       .withColumn("old_value", F.lit(None).cast("string"))
                       .withColumn("new_value", F.lit(None).cast("string")))
    cw = Window.partitionBy("resource_name", "config_name").orderBy("offset")
    configs = (records.filter((t == "ConfigRecord") & (F.col("resource_type") == RESOURCE_TOPIC))
                      .select("offset", F.lit(None).cast("string").alias("topic_id"),
                              F.col("resource_name").alias("topic_name"),
                              F.lit("config").alias("event"),
                              F.lit(None).cast("bigint").alias("partitions"), "config_name",
                              F.lag("config_value").over(cw).alias("old_value"),
                              F.col("config_value").alias("new_value")))
    return (base.join(F.broadcast(events.unionByName(configs)), "offset")
                  .select("offset", "ts", "topic_name", "topic_id", "event", "partitions",
                          "config_name", "old_value", "new_value", "principal", "client_id",
                          "api", "reason"))


def who_changed_what(records: DataFrame) -> DataFrame:
    """Records per principal, client, API, reason and record type, with first and last time."""
    return (records.filter(F.col("record_type").isNotNull())
                   .groupBy("principal", "client_id", "api", "reason", "record_type")
                   .agg(F.count("*").alias("records"),
                        F.countDistinct("batch_base_offset").alias("batches"),
                        F.min("ts").alias("first_ts"), F.max("ts").alias("last_ts")))


def _seconds(start: str, end: str) -> Column:
    return (F.unix_micros(F.col(end)) - F.unix_micros(F.col(start))) / 1e6
