"""The audit's rules: each a name, a severity and a DataFrame of offending offsets.

:data:`RULES` lists them (name → severity, description). :func:`log_findings`,
:func:`history_findings` and :func:`whole_log_findings` each return one DataFrame
``(rule, severity, offset, detail)`` with a row per violation (the three cover every rule but
the snapshot comparison); nothing is collected here. Batch-level rules look at one row per
batch (:func:`tables.batches`).

A re-audit checks only the records after the previous run's watermark: the batch rules then
match the new batches against ``everything`` (every batch of the log), the unclean-election
rule sees every topic config, the leader rule every broker row; :data:`WHOLE_LOG_RULES` are
re-run over their whole (small) input every time, their earlier findings replaced.
"""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from tools.audit.integrity import RULES as STRUCTURE_RULES

ERROR, WARNING = "error", "warning"
UNCLEAN_CONFIG = "unclean.leader.election.enable"

# The log's structure (offsets, CRCs, frames, hash chain, terms, snapshots, indexes) is checked
# without Spark by tools.audit.integrity, which lists its rules first; these are the rest.
RULES: dict[str, tuple[str, str]] = {
    "partition-topic-live": (ERROR, "every partition record refers to a topic created before it"),
    "no-records-after-delete": (ERROR, "no record refers to a topic after its removal"),
    "leader-in-isr": (ERROR, "a partition's leader is in its ISR"),
    "isr-subset-replicas": (ERROR, "a partition's ISR is a subset of its replicas"),
    "epochs-increase": (
        ERROR,
        "leader epochs grow on every leader change, partition epochs on every change",
    ),
    "leader-eligible": (ERROR, "no fenced or unregistered broker is elected leader"),
    "unclean-election": (
        ERROR,
        "unclean elections (error unless requested via ElectLeaders or enabled by the topic's config)",
    ),
    "broker-epoch-unique": (ERROR, "a broker epoch is never reused"),
    "snapshot-matches-log": (
        ERROR,
        "each controller snapshot equals the state rebuilt from the log at its offset",
    ),
}


def _finding(df: DataFrame, rule: str, detail: Column, severity: Column | None = None) -> DataFrame:
    sev = severity if severity is not None else F.lit({**STRUCTURE_RULES, **RULES}[rule][0])
    return df.select(
        F.lit(rule).alias("rule"),
        sev.alias("severity"),
        F.col("offset").cast("bigint").alias("offset"),
        detail.alias("detail"),
    )


WHOLE_LOG_RULES = ("broker-epoch-unique",)


Bounds = tuple[int | None, int | None]


def _with_bound(
    df: DataFrame, everything: DataFrame, agg: Column, name: str, known: Bounds | None, i: int
) -> DataFrame:
    """``df`` with column ``name``: ``agg`` over ``everything``, or ``known[i]`` when the
    bounds are known (one Spark job fewer)."""
    if known is not None:
        return df.withColumn(name, F.lit(known[i]).cast("bigint"))
    return df.crossJoin(F.broadcast(everything.agg(agg.alias(name))))


def offsets_contiguous(
    b: DataFrame, everything: DataFrame | None = None, bounds: Bounds | None = None
) -> DataFrame:
    """Batches not followed by the batch at ``last + 1`` (except the newest), and overlaps.
    ``bounds``: every batch's lowest and highest base offset, when known."""
    everything = b if everything is None else everything
    nxt = everything.select(F.col("batch_base_offset").alias("n_base"))
    gaps = (
        _with_bound(
            b.join(nxt, F.col("batch_last_offset") + 1 == F.col("n_base"), "left_anti"),
            everything,
            F.max("batch_base_offset"),
            "m",
            bounds,
            1,
        )
        .filter(F.col("batch_base_offset") < F.col("m"))
        .withColumn("offset", F.col("batch_last_offset") + 1)
    )
    gap = _finding(
        gaps,
        "offsets-contiguous",
        F.format_string(
            "no batch starts at offset %d (after the batch at %d)",
            F.col("offset"),
            F.col("batch_base_offset"),
        ),
    )
    dups = (
        b.groupBy("batch_base_offset")
        .count()
        .filter(F.col("count") > 1)
        .withColumnRenamed("batch_base_offset", "offset")
    )
    dup = _finding(
        dups,
        "offsets-contiguous",
        F.format_string("%d batches start at offset %d", F.col("count"), F.col("offset")),
    )
    return gap.unionByName(dup)


def crc_intact(records: DataFrame) -> DataFrame:
    bad = (
        records.filter(F.col("problem") == "crc")
        .groupBy("batch_base_offset", "source", "position")
        .count()
        .withColumnRenamed("batch_base_offset", "offset")
    )
    return _finding(
        bad,
        "crc-intact",
        F.format_string(
            "CRC mismatch in %s at byte %d (batch of %d records)",
            F.col("source"),
            F.col("position"),
            F.col("count"),
        ),
    )


def frames_decodable(records: DataFrame, newest_segment: str | None) -> DataFrame:
    bad = records.filter(F.col("record_type").isNull() & F.col("problem").isNotNull())
    torn_tail = F.col("problem").startswith("torn") & (F.col("source") == F.lit(newest_segment))
    return _finding(
        bad,
        "frames-decodable",
        F.format_string("%s at byte %d: %s", F.col("source"), F.col("position"), F.col("problem")),
        F.when(torn_tail, F.lit(WARNING)).otherwise(F.lit(ERROR)),
    )


def hash_chain(
    b: DataFrame, everything: DataFrame | None = None, bounds: Bounds | None = None
) -> DataFrame:
    """Each batch's prev_hash must be the hash of the batch ending right before it. The oldest
    batch is anchored (all zeros at offset 0; else a snapshot's hash). ``bounds``: as
    :func:`offsets_contiguous`."""
    everything = b if everything is None else everything
    prev = everything.select(
        F.col("batch_hash").alias("p_hash"), F.col("batch_last_offset").alias("p_last")
    )
    j = _with_bound(
        b.join(prev, F.col("prev_hash") == F.col("p_hash"), "left"),
        everything,
        F.min("batch_base_offset"),
        "first",
        bounds,
        0,
    ).filter(F.col("p_hash").isNull() | (F.col("p_last") + 1 != F.col("batch_base_offset")))
    zero = "0" * 64
    anchored = (F.col("batch_base_offset") == F.col("first")) & (
        (F.col("batch_base_offset") > 0) | (F.col("prev_hash") == zero)
    )
    bad = j.filter(~anchored).withColumnRenamed("batch_base_offset", "offset")
    return _finding(
        bad,
        "hash-chain",
        F.when(
            F.col("p_hash").isNull(),
            F.format_string(
                "prev_hash %s… matches no batch in the log", F.substring("prev_hash", 1, 16)
            ),
        ).otherwise(
            F.format_string("prev_hash is the hash of the batch ending at %d", F.col("p_last"))
        ),
    )


def terms_monotonic(b: DataFrame, everything: DataFrame | None = None) -> DataFrame:
    everything = b if everything is None else everything
    prev = everything.select(
        F.col("batch_last_offset").alias("p_last"), F.col("term").alias("p_term")
    )
    bad = (
        b.join(prev, F.col("p_last") + 1 == F.col("batch_base_offset"))
        .filter(F.col("term") < F.col("p_term"))
        .withColumnRenamed("batch_base_offset", "offset")
    )
    return _finding(
        bad,
        "terms-monotonic",
        F.format_string("term %d after term %d", F.col("term"), F.col("p_term")),
    )


def topic_references(records: DataFrame, topics_df: DataFrame) -> DataFrame:
    """Partition records for unknown / not-yet-created topics, and any topic-id record after
    the topic's removal."""
    t = F.broadcast(topics_df.select("topic_id", "topic_name", "created_offset", "removed_offset"))
    refs = (
        records.filter(F.col("topic_id").isNotNull() & (F.col("record_type") != "TopicRecord"))
        .select("offset", "record_type", F.col("topic_id").alias("tid"))
        .join(t, F.col("tid") == F.col("topic_id"), "left")
    )
    is_part = F.col("record_type").isin("PartitionRecord", "PartitionChangeRecord")
    unknown = refs.filter(
        is_part & (F.col("created_offset").isNull() | (F.col("offset") < F.col("created_offset")))
    )
    late = refs.filter(
        (F.col("record_type") != "RemoveTopicRecord")
        & F.col("removed_offset").isNotNull()
        & (F.col("offset") > F.col("removed_offset"))
    )
    return _finding(
        unknown,
        "partition-topic-live",
        F.format_string(
            "%s for topic id %s, which does not exist here", F.col("record_type"), F.col("tid")
        ),
    ).unionByName(
        _finding(
            late,
            "no-records-after-delete",
            F.format_string(
                "%s for topic %s (%s), removed at offset %d",
                F.col("record_type"),
                F.col("topic_name"),
                F.col("tid"),
                F.col("removed_offset"),
            ),
        )
    )


def partition_rules(history: DataFrame) -> DataFrame:
    """leader ∈ ISR ⊆ replicas and increasing epochs, on the state after each change."""
    not_in_isr = history.filter((F.col("leader") >= 0) & ~F.array_contains("isr", F.col("leader")))
    outside = history.filter(F.size(F.array_except("isr", "replicas")) > 0)
    epochs = history.filter(
        (
            F.col("prev_partition_epoch").isNotNull()
            & (F.col("partition_epoch") <= F.col("prev_partition_epoch"))
        )
        | (
            F.col("leader_changed")
            & F.col("prev_leader_epoch").isNotNull()
            & (F.col("leader_epoch") <= F.col("prev_leader_epoch"))
        )
    )
    where = F.format_string("%s-%d", F.col("topic_name"), F.col("partition_id"))
    return (
        _finding(
            not_in_isr,
            "leader-in-isr",
            F.format_string(
                "%s: leader %d not in ISR %s", where, F.col("leader"), F.col("isr").cast("string")
            ),
        )
        .unionByName(
            _finding(
                outside,
                "isr-subset-replicas",
                F.format_string(
                    "%s: ISR %s not within replicas %s",
                    where,
                    F.col("isr").cast("string"),
                    F.col("replicas").cast("string"),
                ),
            )
        )
        .unionByName(
            _finding(
                epochs,
                "epochs-increase",
                F.format_string(
                    "%s: leader epoch %d→%d, partition epoch %d→%d",
                    where,
                    F.col("prev_leader_epoch"),
                    F.col("leader_epoch"),
                    F.col("prev_partition_epoch"),
                    F.col("partition_epoch"),
                ),
            )
        )
    )


def leader_eligible(history: DataFrame, brokers: DataFrame) -> DataFrame:
    """Each newly named leader must be a registered, unfenced broker at that point: after
    every broker record before it, or in the same batch (a batch is applied atomically)."""
    elected = history.filter(
        (F.col("leader_changed") | (F.col("change") == "created")) & (F.col("leader") >= 0)
    ).select("offset", "topic_name", "partition_id", "leader", "batch_base_offset")
    states = brokers.select(
        "broker_id",
        F.col("offset").alias("b_offset"),
        F.col("batch_base_offset").alias("b_batch"),
        "state",
    )
    j = (
        elected.join(
            states,
            (F.col("leader") == F.col("broker_id"))
            & (
                (F.col("b_offset") < F.col("offset"))
                | (F.col("b_batch") == F.col("batch_base_offset"))
            ),
            "left",
        )
        .groupBy("offset", "topic_name", "partition_id", "leader")
        .agg(F.max_by("state", "b_offset").alias("broker_state"))
    )
    bad = j.filter(F.col("broker_state").isNull() | (F.col("broker_state") != "unfenced"))
    return _finding(
        bad,
        "leader-eligible",
        F.format_string(
            "%s-%d: broker %d elected leader while %s",
            F.col("topic_name"),
            F.col("partition_id"),
            F.col("leader"),
            F.coalesce(F.col("broker_state"), F.lit("never registered")),
        ),
    )


def unclean_elections(history: DataFrame, configs: DataFrame) -> DataFrame:
    """Every unclean election; a warning when asked for (ElectLeaders) or allowed by the
    topic's ``unclean.leader.election.enable=true`` at the time (``configs``: the topic
    ConfigRecords, :func:`tables.topic_configs`), else an error."""
    unclean = history.filter(F.col("election") == "unclean").select(
        "offset", "topic_name", "partition_id", "leader", "prev_leader", "isr", "api", "principal"
    )
    cfg = configs.filter(F.col("config_name") == UNCLEAN_CONFIG).select(
        F.col("resource_name").alias("c_topic"), F.col("offset").alias("c_offset"), "config_value"
    )
    j = (
        unclean.join(
            cfg,
            (F.col("c_topic") == F.col("topic_name")) & (F.col("c_offset") < F.col("offset")),
            "left",
        )
        .groupBy(
            "offset",
            "topic_name",
            "partition_id",
            "leader",
            "prev_leader",
            "isr",
            "api",
            "principal",
        )
        .agg(F.max_by("config_value", "c_offset").alias("allowed"))
    )
    allowed = (F.col("api") == "ElectLeaders") | (F.col("allowed") == "true")
    return _finding(
        j,
        "unclean-election",
        F.format_string(
            "%s-%d: unclean election of %d (was %s) by %s via %s",
            F.col("topic_name"),
            F.col("partition_id"),
            F.col("leader"),
            F.coalesce(F.col("prev_leader").cast("string"), F.lit("-")),
            F.col("principal"),
            F.col("api"),
        ),
        F.when(allowed, F.lit(WARNING)).otherwise(F.lit(ERROR)),
    )


def broker_epochs(brokers: DataFrame) -> DataFrame:
    """A registration reusing an epoch (any broker) or not above the broker's previous epoch."""
    regs = brokers.filter(F.col("record_type") == "RegisterBrokerRecord")
    reused = regs.join(
        regs.groupBy("broker_epoch").agg(F.count("*").alias("uses")), "broker_epoch"
    ).filter(F.col("uses") > 1)
    w = Window.partitionBy("broker_id").orderBy("offset")
    back = regs.withColumn("prev_epoch", F.lag("broker_epoch").over(w)).filter(
        F.col("broker_epoch") <= F.col("prev_epoch")
    )
    return _finding(
        reused,
        "broker-epoch-unique",
        F.format_string(
            "broker %d registered with epoch %d, used %d times",
            F.col("broker_id"),
            F.col("broker_epoch"),
            F.col("uses"),
        ),
    ).unionByName(
        _finding(
            back,
            "broker-epoch-unique",
            F.format_string(
                "broker %d epoch %d not above its previous %d",
                F.col("broker_id"),
                F.col("broker_epoch"),
                F.col("prev_epoch"),
            ),
        )
    )


def _union(parts: list[Callable[[], DataFrame]]) -> DataFrame:
    out = parts[0]()
    for make in parts[1:]:
        out = out.unionByName(make())
    return out


def log_findings(
    records: DataFrame,
    batches_df: DataFrame,
    topics_df: DataFrame,
    newest_segment: str | None,
    everything: DataFrame | None = None,
    bounds: Bounds | None = None,
) -> DataFrame:
    """The violations of the rules on the records themselves (topic references; the log's
    structure is :mod:`tools.audit.integrity`'s). ``records`` may be the new part of the log
    only; ``topics_df`` covers the whole log. The other arguments are kept for the batch
    rules' callers (:func:`offsets_contiguous`, :func:`hash_chain`, ...)."""
    return _union(
        [
            lambda: topic_references(records, topics_df),
        ]
    )


def history_findings(history: DataFrame, brokers: DataFrame, configs: DataFrame) -> DataFrame:
    """The violations of the rules on the partition history (leader, ISR, epochs, eligible
    and clean elections). ``history`` may be the new rows only; ``brokers`` (the broker
    history) and ``configs`` cover the whole log."""
    return _union(
        [
            lambda: partition_rules(history),
            lambda: leader_eligible(history, brokers),
            lambda: unclean_elections(history, configs),
        ]
    )


def whole_log_findings(brokers: DataFrame) -> DataFrame:
    """The violations of :data:`WHOLE_LOG_RULES` over the whole log's broker history."""
    return broker_epochs(brokers)
