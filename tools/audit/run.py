"""The whole audit: load the record table, derive the tables, run the checks, compare
snapshots, write Parquet + findings JSON + HTML report, print a summary.

:func:`run_audit` is what ``kraft audit`` and ``spark-submit tools/audit/submit.py`` call; tests
call it with their own SparkSession. Exit status: 0 every error-severity rule passed, 1 one failed.
"""
from __future__ import annotations

import json
import shutil
import time
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Callable

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from kraft.log.segment import list_segments
from kraft.log.snapshot import list_snapshots
from tools.audit import checks, report, state, tables
from tools.audit.mirror import load_records
from tools.audit.session import build_session

SAMPLES_PER_RULE = 200


class AuditError(Exception):
    """Bad input to the audit (no such directory, no log, bad range)."""


@dataclass
class AuditOptions:
    """What to audit and where to write. ``from_*``/``to_*`` are inclusive bounds; the state
    before ``from`` is still replayed (tables and findings only show rows from it on)."""

    log_dir: Path
    out: Path
    master: str | None = "local[*]"
    from_offset: int | None = None
    to_offset: int | None = None
    from_ms: int | None = None
    to_ms: int | None = None
    state_at_offset: int | None = None
    state_at_ms: int | None = None
    mirror: Path | None = None


@dataclass
class AuditResult:
    exit_code: int
    findings: dict[str, Any]
    report: Path
    tables: dict[str, Path] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)


class _Steps:
    def __init__(self, progress: Callable[[str], None], total: int) -> None:
        self.progress, self.total, self.n = progress, total, 0
        self.started = self.t = time.monotonic()
        self.timings: dict[str, float] = {}

    def __call__(self, what: str) -> None:
        now = time.monotonic()
        self.n += 1
        self.progress(f"[{self.n}/{self.total}] {what} (at {now - self.started:.1f}s)")
        self.t = now

    def done(self, key: str) -> None:
        self.timings[key] = round(time.monotonic() - self.t, 2)


def validate(opts: AuditOptions) -> None:
    """Refuse bad input before starting Spark."""
    d = opts.log_dir
    if not d.is_dir():
        raise AuditError(f"log directory {d} does not exist")
    if not list_segments(d):
        raise AuditError(f"{d} holds no metadata log segments (*.log files named by offset)")
    if opts.out.exists() and not opts.out.is_dir():
        raise AuditError(f"output {opts.out} exists and is not a directory")
    lo, hi = opts.from_offset, opts.to_offset
    if lo is not None and hi is not None and lo > hi:
        raise AuditError(f"--from offset {lo} is after --to offset {hi}")
    if opts.from_ms is not None and opts.to_ms is not None and opts.from_ms > opts.to_ms:
        raise AuditError("--from time is after --to time")


def run_audit(opts: AuditOptions, spark: SparkSession | None = None,
              progress: Callable[[str], None] = print) -> AuditResult:
    """Run the audit; raises AuditError on bad input (nothing written)."""
    validate(opts)
    out = opts.out
    out.mkdir(parents=True, exist_ok=True)
    # The replay runs while the JVM starts and Spark works, in its own process: as a thread it
    # held the GIL for seconds at a time and stalled the driver's calls into the JVM.
    with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:
        replaying = pool.submit(_replay, opts)
        return _run(opts, spark, progress, replaying)


@dataclass
class _Replayed:
    """What the audit keeps of the replay: snapshot comparisons, the replay error, and the
    ``--state-at`` document."""

    comparisons: list[dict]
    error: str | None
    state_doc: dict | None


def _replay(opts: AuditOptions) -> _Replayed:
    """Replay the log against its snapshots (and to ``--state-at``): pure Python, sequential."""
    replayed = state.replay(opts.log_dir, opts.to_offset, opts.to_ms)
    state_doc = None
    if opts.state_at_offset is not None or opts.state_at_ms is not None:
        at = state.replay(opts.log_dir, opts.state_at_offset, opts.state_at_ms)
        state_doc = {**state.summary(at.image), "replay_error": at.error,
                     "snapshot": next((c for c in at.comparisons
                                       if c["offset"] == at.image.offset), None)}
    return _Replayed(replayed.comparisons, replayed.error, state_doc)


def _run(opts: AuditOptions, spark: SparkSession | None, progress: Callable[[str], None],
         replaying: Future) -> AuditResult:
    out = opts.out
    steps = _Steps(progress, 7)
    if spark is None:
        steps(f"starting Spark ({opts.master or 'spark-submit master'}; its log: {out / 'spark.log'})")
        spark = build_session(opts.master, out / "spark.log")
        steps.done("spark_start_s")
    else:
        steps("using the running Spark session")
    steps("reading the metadata log")
    raw, mirror_info = load_records(spark, opts.log_dir, opts.mirror or out / "mirror",
                                    opts.to_offset)
    if opts.to_ms is not None:
        raw = raw.filter(F.col("timestamp_ms").isNull() | (F.col("timestamp_ms") <= opts.to_ms))
    # not cached: every query reads the Parquet mirror, pruned to the columns it needs
    records = tables.prepare(raw.drop("record_json"))
    meta_row = records.agg(
        F.count("*").alias("records"), F.min("offset").alias("first_offset"),
        F.max("offset").alias("last_offset"), F.min("timestamp_ms").alias("first_ms"),
        F.max("timestamp_ms").alias("last_ms"),
        F.sum(F.when(F.col("index_in_batch") == 0, 1).otherwise(0)).alias("batches")).first()
    meta = meta_row.asDict()
    meta["batches"] = meta["batches"] or 0
    steps.done("read_s")
    progress(f"    {meta['records']:,} records in {meta['batches']:,} batches; segments decoded "
             f"{len(mirror_info['decoded'])}, from the Parquet mirror {len(mirror_info['reused'])}")
    from_offset = _from_offset(records, opts)

    steps("deriving tables")
    log_end = F.timestamp_millis(F.lit(meta["last_ms"] or 0))
    topics_df = tables.topics(records).persist()
    # the big table is computed once into Parquet (the table itself when it is written whole)
    # and every later use reads that back, pruned to its columns: cheaper than caching it
    history_path = out / ("tables" if from_offset is None else "work") / "partition_history"
    tables.partition_history(records, topics_df).write.mode("overwrite").parquet(str(history_path))
    history = spark.read.parquet(str(history_path))
    brokers = tables.broker_history(records).persist()
    derived: dict[str, DataFrame] = {
        "topics": topics_df,
        "partition_history": history,
        "broker_history": brokers,
        "broker_intervals": tables.broker_intervals(brokers, log_end),
        "replication_intervals": tables.replication_intervals(history, topics_df, log_end),
        "topic_lifecycle": tables.topic_lifecycle(records),
        "who_changed_what": tables.who_changed_what(records),
    }
    table_paths: dict[str, Path] = {}
    for name, df in derived.items():
        path = out / "tables" / name
        if path != history_path:
            _since(df, from_offset).write.mode("overwrite").parquet(str(path))
            if from_offset is None:  # the report reads the written table, not a recomputation
                derived[name] = spark.read.parquet(str(path))
        table_paths[name] = path
    steps.done("tables_s")

    steps("running checks")
    newest = list_segments(opts.log_dir)[-1].name
    found = _since(checks.all_findings(records, tables.batches(records), topics_df, history,
                                       brokers, newest), from_offset).persist()
    found.write.mode("overwrite").parquet(str(out / "tables" / "findings"))
    table_paths["findings"] = out / "tables" / "findings"
    counts = {(r["rule"], r["severity"]): r["count"]
              for r in found.groupBy("rule", "severity").count().collect()}
    w = Window.partitionBy("rule").orderBy("offset")
    samples = (found.withColumn("n", F.row_number().over(w))
                    .filter(F.col("n") <= SAMPLES_PER_RULE).drop("n").collect())
    steps.done("checks_s")

    steps("replaying the log against snapshots")
    replayed = replaying.result()
    state_doc = replayed.state_doc
    snapshot_rows = [{"rule": "snapshot-matches-log", "severity": "error", "offset": c["offset"],
                      "detail": f"{c['snapshot']}: rebuilt {c['rebuilt_checksum'][:16]}… != "
                                f"snapshot {c['snapshot_checksum'][:16]}…"}
                     for c in replayed.comparisons if not c["match"]]
    if state_doc is not None:
        (out / "state.json").write_text(json.dumps(state_doc, indent=1))
    steps.done("state_s")

    findings = _findings_doc(opts, meta, counts, samples, snapshot_rows, replayed,
                             table_paths, out)
    (out / "findings.json").write_text(json.dumps(findings, indent=1, default=str))

    steps("rendering the report")
    data = _report_data(records, history, derived, meta, findings, replayed, opts, out,
                        time.monotonic() - steps.started)
    report_path = out / "report.html"
    report_path.write_text(report.render(data), encoding="utf-8")
    steps.done("report_s")
    for df in (topics_df, brokers, found):
        df.unpersist()
    shutil.rmtree(out / "work", ignore_errors=True)
    steps("done")
    _summary(progress, findings, report_path)
    code = 1 if findings["status"] == "failed" else 0
    return AuditResult(code, findings, report_path, table_paths, steps.timings)


def _from_offset(records: DataFrame, opts: AuditOptions) -> int | None:
    lo = opts.from_offset
    if opts.from_ms is not None:
        first = (records.filter(F.col("timestamp_ms") >= opts.from_ms)
                        .agg(F.min("offset")).first()[0])
        lo = max(lo or 0, first if first is not None else (1 << 62))
    return lo


def _since(df: DataFrame, from_offset: int | None) -> DataFrame:
    if from_offset is None:
        return df
    col = "offset" if "offset" in df.columns else ("start_offset" if "start_offset" in df.columns
                                                   else None)
    if col is None:
        return df
    return df.filter(F.col(col).isNull() | (F.col(col) >= from_offset))


def _findings_doc(opts: AuditOptions, meta: dict, counts: dict, samples: list, extra: list[dict],
                  replayed: _Replayed, table_paths: dict, out: Path) -> dict:
    by_rule: dict[str, list[dict]] = {}
    for row in samples:
        by_rule.setdefault(row["rule"], []).append(
            {"offset": row["offset"], "severity": row["severity"], "detail": row["detail"]})
    for row in extra:
        by_rule.setdefault(row["rule"], []).append(
            {k: row[k] for k in ("offset", "severity", "detail")})
        counts[(row["rule"], row["severity"])] = counts.get((row["rule"], row["severity"]), 0) + 1
    rules = []
    for rule, (severity, description) in checks.RULES.items():
        errors = counts.get((rule, "error"), 0)
        warnings = counts.get((rule, "warning"), 0)
        rules.append({"rule": rule, "severity": "error" if errors else ("warning" if warnings
                                                                        else severity),
                      "description": description, "count": errors + warnings,
                      "errors": errors, "warnings": warnings,
                      "passed": errors + warnings == 0, "samples": by_rule.get(rule, [])})
    failed = any(r["errors"] for r in rules)
    return {"status": "failed" if failed else "passed", "log_dir": str(opts.log_dir),
            "records": meta["records"], "batches": meta["batches"],
            "first_offset": meta["first_offset"], "last_offset": meta["last_offset"],
            "first_timestamp_ms": meta["first_ms"], "last_timestamp_ms": meta["last_ms"],
            "rules": rules, "snapshots": replayed.comparisons, "replay_error": replayed.error,
            "tables": {k: str(v) for k, v in table_paths.items()},
            "report": str(out / "report.html")}


def _report_data(records: DataFrame, history: DataFrame, derived: dict[str, DataFrame],
                 meta: dict, findings: dict, replayed: _Replayed, opts: AuditOptions,
                 out: Path, elapsed: float) -> dict:
    """Small aggregates for the charts (each bounded, collected)."""
    t0, t1 = meta["first_ms"] or 0, meta["last_ms"] or 1
    ms = F.unix_millis("ts")
    # leadership timeline: the 30 partitions with the most leader changes
    named = history.filter(F.col("leader_changed") | (F.col("change") == "created"))
    top = (named.groupBy("topic_name", "partition_id").count()
                .orderBy(F.desc("count"), "topic_name", "partition_id").limit(30))
    w = Window.partitionBy("topic_name", "partition_id").orderBy("offset")
    points = (named.join(F.broadcast(top), ["topic_name", "partition_id"])
                   .withColumn("n", F.row_number().over(w)).filter(F.col("n") <= 400)
                   .select("topic_name", "partition_id", ms.alias("t"), "leader").collect())
    removed = {r["topic_name"]: r["removed_ms"] for r in derived["topics"].filter(
        F.col("removed_ts").isNotNull()).select("topic_name", F.unix_millis("removed_ts")
                                                .alias("removed_ms")).collect()}
    leadership: dict[str, list] = {}
    for key in sorted({(p["topic_name"] or "?", p["partition_id"]) for p in points}):
        pts = sorted((p["t"], p["leader"]) for p in points
                     if (p["topic_name"] or "?", p["partition_id"]) == key)
        end = removed.get(key[0]) or t1
        leadership[f"{key[0]}-{key[1]}"] = [
            (t, pts[i + 1][0] if i + 1 < len(pts) else end, leader)
            for i, (t, leader) in enumerate(pts)]
    broker_keys = sorted(r["broker_id"] for r in derived["broker_history"]
                         .select("broker_id").distinct().collect())
    states: dict[str, list] = {}
    for r in (derived["broker_intervals"].select("broker_id", "state", F.unix_millis("start_ts")
                                                 .alias("s"), F.unix_millis("end_ts").alias("e"))
              .orderBy("broker_id", "s").limit(5000).collect()):
        states.setdefault(f"broker {r['broker_id']}", []).append((r["s"], r["e"], r["state"]))
    # ISR size over time: the 12 partitions whose ISR changed most
    isr_rows = history.filter(F.col("change").contains("isr") | (F.col("change") == "created"))
    top_isr = (isr_rows.groupBy("topic_name", "partition_id").count()
                       .orderBy(F.desc("count"), "topic_name", "partition_id").limit(12))
    isr_pts = (isr_rows.join(F.broadcast(top_isr), ["topic_name", "partition_id"])
                       .withColumn("n", F.row_number().over(w)).filter(F.col("n") <= 400)
                       .select("topic_name", "partition_id", ms.alias("t"), "isr_size")
                       .orderBy("offset").collect())
    isr: dict[str, list] = {}
    for r in isr_pts:
        isr.setdefault(f"{r['topic_name']}-{r['partition_id']}", []).append((r["t"], r["isr_size"]))
    nb = 60
    span = max(t1 - t0, 1)
    vol = (records.filter(F.col("record_type").isNotNull())
                  .withColumn("b", F.least(F.floor((F.col("timestamp_ms") - t0) * nb / span),
                                           F.lit(nb - 1)))
                  .groupBy("b", "record_type").count().collect())
    types = sorted({r["record_type"] for r in vol})
    buckets: dict[int, dict[str, int]] = {}
    for r in vol:
        buckets.setdefault(int(r["b"]), {})[r["record_type"]] = r["count"]
    volume = [(t0 + b * span // nb, buckets[b]) for b in sorted(buckets)]
    principals = [(f"{r['principal']} · {r['api']}", r["n"]) for r in
                  derived["who_changed_what"].groupBy("principal", "api")
                  .agg(F.sum("records").alias("n")).orderBy(F.desc("n")).limit(20).collect()]
    ri = [(f"{r['topic_name']}-{r['partition_id']}", r["state"], str(r["start_ts"])[:19],
           str(r["end_ts"])[:19], round(r["duration_s"], 1), r["open"],
           str(list(r["isr"] or [])), r["reason"])
          for r in derived["replication_intervals"].orderBy(F.desc("duration_s")).limit(200).collect()]
    lifecycle = [(r["offset"], str(r["ts"])[:19], r["topic_name"], r["event"], r["partitions"],
                  r["config_name"], r["old_value"], r["new_value"], r["principal"], r["reason"])
                 for r in derived["topic_lifecycle"].orderBy("offset").limit(300).collect()]
    bh = [(r["offset"], str(r["ts"])[:19], r["broker_id"], r["broker_epoch"], r["event"],
           r["state"], r["reason"])
          for r in derived["broker_history"].orderBy("offset").limit(300).collect()]
    meta_out = {**meta, "log_dir": str(opts.log_dir), "out": str(out / "tables"),
                "segments": len(list_segments(opts.log_dir)),
                "snapshots": len(list_snapshots(opts.log_dir)),
                "generated": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
                "elapsed_s": elapsed}
    return {"meta": meta_out, "findings": findings["rules"], "leadership": leadership,
            "broker_keys": broker_keys, "broker_states": states, "isr": isr, "volume": volume,
            "record_types": types, "principals": principals, "replication_intervals": ri,
            "lifecycle": lifecycle, "broker_history": bh, "snapshots": replayed.comparisons}


def _summary(progress: Callable[[str], None], findings: dict, report_path: Path) -> None:
    progress("")
    progress(f"Audit {findings['status'].upper()}: {findings['records']:,} records, offsets "
             f"{findings['first_offset']}..{findings['last_offset']}")
    for r in findings["rules"]:
        if r["count"]:
            offs = ", ".join(str(s["offset"]) for s in r["samples"][:5])
            progress(f"  {r['severity'].upper():7} {r['rule']}: {r['count']} (offsets {offs})")
    passed = sum(1 for r in findings["rules"] if r["passed"])
    progress(f"  {passed} of {len(findings['rules'])} rules passed; "
             f"{len(findings['snapshots'])} snapshot(s) compared")
    progress(f"Report: {report_path}")
    progress(f"Findings: {report_path.parent / 'findings.json'}; tables: "
             f"{report_path.parent / 'tables'}")
