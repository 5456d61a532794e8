"""The whole audit: load the record table, derive the tables, run the checks, compare
snapshots, write Parquet + findings JSON + HTML report, print a summary.

:func:`run_audit` is what ``kraft audit`` and ``spark-submit tools/audit/submit.py`` call; tests
call it with their own SparkSession. Exit status: 0 every error-severity rule passed, 1 one failed.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from multiprocessing import get_all_start_methods, get_context
from multiprocessing.context import BaseContext
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from kraft.log.segment import list_segments
from kraft.log.snapshot import list_snapshots
from kraft.snapshotter import image_from_snapshot, image_to_snapshot
from tools.audit import (
    breaks,
    carry,
    checks,
    integrity,
    localtable,
    report,
    reportdata,
    state,
    tables,
    witness,
)
from tools.audit.mirror import Mirror
from tools.audit.session import build_session, local_cores

SAMPLES_PER_RULE = 200
TABLES = (
    "topics",
    "partition_history",
    "broker_history",
    "broker_intervals",
    "replication_intervals",
    "topic_lifecycle",
    "who_changed_what",
)
BATCH_CARRY = ("batch_base_offset", "batch_last_offset", "batch_hash", "term")
#: A small log's audit runs on Spark's interpreted engine: its jobs are many and their rows
#: few, so compiling each stage's generated Java (Janino, then the JVM) cost more CPU than
#: running the rows through the expression trees. Its cached record table is not compressed
#: (a few MB in memory; the per-column encoding statistics cost more than they save).
INTERPRETED = {
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
    "spark.sql.inMemoryColumnarStorage.compressed": "false",
}


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
    witnesses: list[Path] = field(default_factory=list)
    previous: Path | None = None


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
    for d in (opts.log_dir, *opts.witnesses):
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


def run_audit(
    opts: AuditOptions, spark: SparkSession | None = None, progress: Callable[[str], None] = print
) -> AuditResult:
    """Run the audit; raises AuditError on bad input (nothing written)."""
    validate(opts)
    out = opts.out
    out.mkdir(parents=True, exist_ok=True)
    try:
        previous = witness.previous_head(opts.previous, out / "findings.json", opts.log_dir)
    except witness.PreviousError as e:
        raise AuditError(str(e)) from None
    prior, why = _prior_state(opts)
    mirror = Mirror(opts.log_dir, opts.mirror or out / "mirror", opts.to_offset)
    # The mirror's stale segments are decoded, then the log replayed, while the JVM starts and
    # Spark works, in worker processes: as a thread the replay held the GIL for seconds at a
    # time and stalled the driver's calls into the JVM. On a cluster the executors decode.
    cores = local_cores(opts.master)
    sys.stdout.flush()  # (a forked worker flushes what it inherits)
    sys.stderr.flush()
    with ProcessPoolExecutor(cores or 1, mp_context=_worker_context(spark)) as pool:
        if cores:
            mirror.start(pool)
        image = out / "carry" / "image.snapshot" if prior is not None else None
        replaying = pool.submit(_replay, opts, image, _carries(opts))
        scans = _Scans(
            pool.submit(integrity.scan_log, opts.log_dir, opts.to_offset),
            [pool.submit(integrity.scan_log, w) for w in opts.witnesses],
            previous,
        )
        return _run(opts, spark, progress, replaying, prior, why, pool, mirror, scans)


@dataclass
class _Scans:
    """The structure scans running beside Spark (:mod:`tools.audit.integrity`): of the
    audited log, of each witness log, and the head an earlier audit verified."""

    log: Future[Any]
    witnesses: list[Future[Any]]
    previous: dict[str, Any] | None

    def result(
        self, opts: AuditOptions
    ) -> tuple[integrity.Integrity, list[integrity.Finding], list[integrity.Integrity]]:
        """The audited log's scan, the witness findings and the witness logs' scans (never
        raises on a damaged log)."""
        try:
            scan = self.log.result()
        except Exception as e:  # a bug in the scan must not cost the report
            scan = integrity.Integrity(str(opts.log_dir))
            scan.add(
                integrity.Finding(
                    "segment-intact", "error", None, None, None, f"the scan failed: {e!r}"
                )
            )
        others = []
        for path, fut in zip(opts.witnesses, self.witnesses):
            try:
                others.append(fut.result())
            except Exception as e:
                bad = integrity.Integrity(str(path))
                bad.add(
                    integrity.Finding(
                        "witness-agrees", "error", str(path), None, None, f"unreadable: {e!r}"
                    )
                )
                others.append(bad)
        found = witness.compare(scan, others)
        if self.previous is not None:
            found += witness.against_previous(scan, self.previous)
        return scan, found, others


def _worker_context(spark: SparkSession | None) -> BaseContext:
    """How the worker processes start: forked when this process has no Spark session yet (the
    pool forks all its workers at its first task, before the JVM starts), so they begin with
    the decoder's modules imported and end without tearing them down (~2.5 CPU s less per
    audit); spawned when a session runs here (forking a process with the gateway's threads
    and sockets is not safe) or where fork does not exist."""
    if spark is None and "fork" in get_all_start_methods():
        return get_context("fork")
    return get_context("spawn")


def _carries(opts: AuditOptions) -> bool:
    """Whether this run keeps state for a re-audit (only a whole-log run does)."""
    return all(v is None for v in (opts.from_offset, opts.to_offset, opts.from_ms, opts.to_ms))


def _prior_state(opts: AuditOptions) -> tuple[dict[str, Any] | None, str]:
    """The earlier run's state when its segments are unchanged (the rest is checked later)."""
    if not _carries(opts):
        return None, "--from/--to given"
    state, why = carry.load_state(opts.out, opts.log_dir)
    if state is None:
        return None, why
    unchanged, grown = carry.segments_unchanged(state, opts.log_dir)
    if not unchanged:
        return None, "a segment audited before changed"
    state["grown"] = grown
    return state, ""


@dataclass
class _Replayed:
    """What the audit keeps of the replay: snapshot comparisons, the replay error, the
    ``--state-at`` document and where the image at the log's end was written."""

    comparisons: list[dict[str, Any]]
    error: str | None
    state_doc: dict[str, Any] | None
    image: str | None = None
    offset: int | None = None
    end_state: dict[str, Any] | None = None
    gaps: list[dict[str, Any]] = field(default_factory=list)
    approximate: str | None = None


def _replay(opts: AuditOptions, image: Path | None, keep: bool) -> _Replayed:
    """Replay the log against its snapshots (and to ``--state-at``): pure Python, sequential.
    ``image``: the image an earlier run left at its end (replay from there); ``keep``: write
    the image at the end for the next run."""
    start = image_from_snapshot(image) if image is not None else None
    replayed = state.replay(opts.log_dir, opts.to_offset, opts.to_ms, start=start)
    state_doc = None
    if opts.state_at_offset is not None or opts.state_at_ms is not None:
        at = state.replay(opts.log_dir, opts.state_at_offset, opts.state_at_ms)
        state_doc = {
            **state.summary(at.image),
            "replay_error": at.error,
            "approximate": at.approximate,
            "gaps": [g.as_dict() for g in at.gaps],
            "snapshot": next((c for c in at.comparisons if c["offset"] == at.image.offset), None),
        }
    written = None
    end = state.end_state(replayed.image, approximate=replayed.approximate)
    if keep and replayed.error is None and not replayed.gaps:
        staging = opts.out / ".replayed-image"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        written = str(image_to_snapshot(staging, replayed.image))
    return _Replayed(
        replayed.comparisons,
        replayed.error,
        state_doc,
        written,
        replayed.image.offset,
        end,
        [g.as_dict() for g in replayed.gaps],
        replayed.approximate,
    )


def _meta(records: DataFrame) -> dict[str, Any]:
    row = records.agg(
        F.count(F.when(F.col("problem").isNull(), 1)).alias("records"),
        F.min("offset").alias("first_offset"),
        F.max("offset").alias("last_offset"),
        F.min("timestamp_ms").alias("first_ms"),
        F.max("timestamp_ms").alias("last_ms"),
        F.sum(
            F.when((F.col("index_in_batch") == 0) & F.col("problem").isNull(), 1).otherwise(0)
        ).alias("batches"),
        F.count("problem").alias("problems"),
        F.max_by(
            F.struct("source", "position", "batch_last_offset", "batch_hash", "term"),
            F.struct("source", "position"),
        ).alias("end"),
        F.min_by(F.struct("batch_base_offset", "prev_hash"), F.struct("source", "position")).alias(
            "head"
        ),
    ).first()
    assert row is not None  # an aggregation always returns one row
    meta = row.asDict()
    meta["head"] = None if meta["head"] is None else meta["head"].asDict()
    meta["batches"] = meta["batches"] or 0
    end = meta.pop("end")
    meta["watermark"] = (
        None
        if end is None
        else {
            "source": end["source"],
            "position": end["position"],
            "last_offset": end["batch_last_offset"],
            "last_hash": end["batch_hash"],
            "term": end["term"],
        }
    )
    return meta


META_COLUMNS = (
    "position",
    "offset",
    "timestamp_ms",
    "index_in_batch",
    "problem",
    "batch_base_offset",
    "batch_last_offset",
    "batch_hash",
    "prev_hash",
    "term",
    "record_type",
    "topic_id",
)


def _meta_of_rows(rows: pa.Table) -> dict[str, Any]:
    """:func:`_meta` of rows read on the driver (:data:`META_COLUMNS` and ``source``)."""

    def value(f: Callable[..., Any], col: str) -> Any:
        return f(rows[col]).as_py() if rows.num_rows else None

    order = pc.sort_indices(
        rows, [("source", "ascending", "at_start"), ("position", "ascending", "at_start")]
    )
    first = rows.take(order[:1]).to_pylist()
    last = rows.take(order[-1:]).to_pylist()
    end = last[0] if last else None
    return {
        "records": rows.num_rows - pc.count(rows["problem"]).as_py(),
        "first_offset": value(pc.min, "offset"),
        "last_offset": value(pc.max, "offset"),
        "first_ms": value(pc.min, "timestamp_ms"),
        "last_ms": value(pc.max, "timestamp_ms"),
        "batches": pc.sum(
            pc.and_(pc.equal(rows["index_in_batch"], 0), pc.is_null(rows["problem"]))
        ).as_py()
        or 0,
        "problems": pc.count(rows["problem"]).as_py(),
        "head": {
            "batch_base_offset": first[0]["batch_base_offset"],
            "prev_hash": first[0]["prev_hash"],
        }
        if first
        else None,
        "watermark": None
        if end is None
        else {
            "source": end["source"],
            "position": end["position"],
            "last_offset": end["batch_last_offset"],
            "last_hash": end["batch_hash"],
            "term": end["term"],
        },
    }


def _batch_bounds(new_rows: pa.Table, carry_dir: Path) -> checks.Bounds:
    """The lowest and highest batch base offset of the carried batches and the new rows'
    batches (:func:`tables.batches`' rows: a batch's first record), read on the driver."""
    new = new_rows.filter(
        pc.and_(pc.equal(new_rows["index_in_batch"], 0), pc.is_valid(new_rows["batch_base_offset"]))
    )
    carried = localtable.read(carry_dir / "batches", ["batch_base_offset"])
    cols = [new["batch_base_offset"]]
    if carried is not None:
        cols.append(carried["batch_base_offset"])
    nums = [v for c in cols for v in pc.min_max(c).as_py().values() if v is not None]
    return (min(nums), max(nums)) if nums else (None, None)


def _merge_meta(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """The totals of the records audited before and of the new ones."""

    def pick(f: Callable[..., Any], key: str) -> Any:
        vals = [v for v in (old[key], new[key]) if v is not None]
        return f(vals) if vals else None

    return {
        "records": old["records"] + new["records"],
        "batches": old["batches"] + new["batches"],
        "problems": old["problems"] + new["problems"],
        "first_offset": pick(min, "first_offset"),
        "last_offset": pick(max, "last_offset"),
        "first_ms": pick(min, "first_ms"),
        "last_ms": pick(max, "last_ms"),
        "watermark": new["watermark"] or old["watermark"],
    }


def _run(
    opts: AuditOptions,
    spark: SparkSession | None,
    progress: Callable[[str], None],
    replaying: Future[Any],
    prior: dict[str, Any] | None,
    why: str,
    pool: ProcessPoolExecutor,
    mirror: Mirror,
    scans: _Scans,
) -> AuditResult:
    out = opts.out
    steps = _Steps(progress, 7)
    if spark is None:
        steps(
            f"starting Spark ({opts.master or 'spark-submit master'}; its log: {out / 'spark.log'})"
        )
        spark = build_session(
            opts.master, out / "spark.log", short=prior is not None or mirror.small(), source=False
        )  # (the audit reads its mirror, not the source)
        steps.done("spark_start_s")
    else:
        steps("using the running Spark session")
    with _engine(spark, mirror.small()):
        return _audit(opts, spark, steps, progress, replaying, prior, why, pool, mirror, scans)


@contextmanager
def _engine(spark: SparkSession, small: bool) -> Iterator[None]:
    """For a small log, Spark's interpreted engine inside the block (:data:`INTERPRETED`; the
    session's settings are put back after); a big log keeps generated code."""
    if not small:
        yield
        return
    kept = {key: spark.conf.get(key, None) for key in INTERPRETED}
    for key, value in INTERPRETED.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, was in kept.items():
            if was is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, was)


def _audit(
    opts: AuditOptions,
    spark: SparkSession,
    steps: _Steps,
    progress: Callable[[str], None],
    replaying: Future[Any],
    prior: dict[str, Any] | None,
    why: str,
    pool: ProcessPoolExecutor,
    mirror: Mirror,
    scans: _Scans,
) -> AuditResult:
    out = opts.out
    steps("reading the metadata log")
    raw, mirror_info = mirror.load(spark)
    if opts.to_ms is not None:
        raw = raw.filter(F.col("timestamp_ms").isNull() | (F.col("timestamp_ms") <= opts.to_ms))
    # a big log is not cached: every query reads the Parquet mirror, pruned to the columns it
    # needs; a small one is read once into memory (each query's file listing, Hadoop
    # configuration broadcast and Parquet reader set-up cost more than its rows)
    every = tables.prepare(raw.drop("record_json"))
    cached = mirror.small()
    if cached:
        every = every.persist()
    records = every
    carry_dir = out / "carry"
    if prior is not None:
        records = carry.new_records(every, prior)
        # the new rows are few: their totals and topic ids are read on the driver
        wm = prior["watermark"]
        new_rows = mirror.rows_after(wm["source"], wm["position"], list(META_COLUMNS))
        new_meta = _meta_of_rows(new_rows)
        created = pc.filter(new_rows["topic_id"], pc.equal(new_rows["record_type"], "TopicRecord"))
        reused = carry.reuses_topic_id(set(created.to_pylist()), carry_dir)
        changed = prior["grown"] and carry.grown_changed(spark, every, prior, carry_dir)
        why = carry.continues(prior, changed, new_meta["first_offset"], new_meta["head"], reused)
        if why:
            prior, records = None, every
            replaying = pool.submit(_replay, opts, None, True)  # runs after the first
    meta: dict[str, Any] | None = None
    if prior is not None:
        new_meta.pop("head")
        meta = _merge_meta(prior["meta"], new_meta)
    elif not cached:  # a big log's totals alone first, as before (not measured beside the
        # first tables on a big log); a small one's run beside them
        meta = _meta(records)
        meta.pop("head")
    steps.done("read_s")
    progress(
        f"    re-audit: {new_meta['records']:,} new records after offset "
        f"{prior['watermark']['last_offset']}"
        if prior is not None
        else f"    whole log audited ({why})"
    )
    from_offset = _from_offset(every, opts)

    steps("deriving tables and running checks")
    run_no = prior["run"] + 1 if prior is not None else 0
    # from here on the tables change: a run stopped half-way leaves no state to carry on from
    (out / "carry" / "state.json").unlink(missing_ok=True)
    if prior is None:
        for d in ("tables", "carry", "work"):
            shutil.rmtree(out / d, ignore_errors=True)
    # with --from the tables are derived whole into work/ and their rows from it on copied
    schemas = prior.get("schemas", {}) if prior is not None else {}
    tf = carry.TableFiles(
        spark,
        out / ("tables" if from_offset is None else "work"),
        run_no,
        schemas.get("tables"),
        one_file=cached,
    )
    cf = carry.TableFiles(spark, carry_dir, run_no, schemas.get("carry"), one_file=cached)
    after = prior["watermark"]["last_offset"] if prior is not None else None

    created, removed = tables.topic_created(records), tables.topic_removed(records)
    configs = tables.topic_configs(records)
    if prior is not None:
        created = created.unionByName(cf.read("topic_created"))
        removed = removed.unionByName(cf.read("topic_removed"))
        configs = configs.unionByName(cf.read("topic_configs"))
    topics_df = tables.topics(None, created, removed).persist()
    old_brokers = tf.read("broker_history") if prior is not None else None
    tails = tf.read("replication_intervals", "tail") if prior is not None else None
    old_who = tf.read("who_changed_what") if prior is not None else None
    # one row per batch (the carry's; not cached: read once)
    batches_new = tables.batches(records)
    everything = (
        batches_new.select(*BATCH_CARRY).unionByName(cf.read("batches"))
        if prior is not None
        else None
    )
    newest = list_segments(opts.log_dir)[-1].name
    bounds = _batch_bounds(new_rows, carry_dir) if prior is not None else None

    # first the partition and broker histories (the longest job first) and, side by side, what
    # needs neither: the planning of one overlaps the others' jobs
    first: list[Callable[[], Any]] = [
        lambda: tf.append(
            "partition_history",
            tables.partition_history(
                records, topics_df, cf.read("partitions") if prior is not None else None
            ),
        ),
        lambda: tf.append(
            "broker_history",
            tables.broker_history(
                records, tables.broker_seeds(old_brokers) if old_brokers is not None else None
            ),
        ),
        lambda: tf.replace("topics", topics_df),
        lambda: tf.append(
            "topic_lifecycle", tables.topic_lifecycle(records, created, configs, after)
        ),
        lambda: tf.replace("who_changed_what", tables.who_changed_what(records, old_who)),
    ]
    if from_offset is None:
        first.append(lambda: cf.append("volume", tables.volume(records)))
    if meta is None:  # a small whole-log run's totals: one more job beside the first tables
        first.append(lambda: _meta(records))
    done = _together(*first)
    history = done[0]
    if meta is None:
        meta = done[-1]
        meta.pop("head")
    progress(
        f"    {meta['records']:,} records in {meta['batches']:,} batches; segments decoded "
        f"{len(mirror_info['decoded'])}, from the Parquet mirror {len(mirror_info['reused'])}"
    )
    log_end = F.timestamp_millis(F.lit(meta["last_ms"] or 0))
    brokers = tf.read("broker_history").persist()

    def intervals() -> None:
        rows = tables.replication_intervals(history, topics_df, log_end, tails).persist()
        tf.append("replication_intervals", rows.filter(F.col("end_offset").isNotNull()))
        tf.append("replication_intervals", rows.filter(F.col("end_offset").isNull()), prefix="tail")
        rows.unpersist()

    # then what needs the histories, and the next run's carried inputs
    jobs: list[Callable[[], Any]] = [
        # the rules on the records and on the histories: one job
        lambda: tf.append(
            "findings",
            checks.log_findings(
                records, batches_new, topics_df, newest, everything, bounds
            ).unionByName(checks.history_findings(history, brokers, configs)),
        ),
        intervals,
        lambda: tf.append("findings", checks.whole_log_findings(brokers), prefix="whole"),
        lambda: tf.replace("broker_intervals", tables.broker_intervals(brokers, log_end)),
    ]
    if from_offset is None:
        jobs.append(
            lambda: cf.replace(
                "partitions",
                tables.partition_seeds(
                    history, cf.read("partitions") if prior is not None else None
                ),
            )
        )
    if _carries(opts) and not meta["problems"] and meta["watermark"] is not None:
        jobs += _carry_jobs(cf, records, batches_new)
    _together(*jobs)
    steps.done("tables_s")

    steps("collecting the findings")
    if from_offset is not None:  # the rows from --from on
        for name in (*TABLES, "findings"):
            _since(tf.read(name), from_offset).write.mode("overwrite").parquet(
                str(out / "tables" / name)
            )
        tf = carry.TableFiles(spark, out / "tables", run_no, tf.schemas, one_file=cached)
    table_paths = {name: out / "tables" / name for name in (*TABLES, "findings")}
    scan, found, others = scans.result(opts)
    causes = [r.first for r in scan.regions]
    counts, samples, consequences = _counts_and_samples(tf.read("findings"), causes)
    steps.done("checks_s")

    steps("replaying the log against snapshots")
    try:
        replayed = replaying.result()
    except Exception as e:  # a damaged log must end in findings, not a traceback
        replayed = _Replayed([], f"the replay failed: {e}", None)
    if prior is not None:
        replayed.comparisons = prior["comparisons"] + replayed.comparisons
    state_doc = replayed.state_doc
    snapshot_rows = [
        {
            "rule": "snapshot-matches-log",
            "severity": "error",
            "offset": c["offset"],
            "file": c["snapshot"],
            "position": None,
            "detail": f"{c['snapshot']}: rebuilt from the log {c['rebuilt_checksum'][:16]}…, "
            f"header {c['snapshot_checksum'][:16] or '?'}…, its records "
            f"{(c.get('snapshot_records_checksum') or '?')[:16]}…"
            + (f" ({c['error']})" if c.get("error") else ""),
        }
        for c in replayed.comparisons
        if c["match"] is False  # (None: not compared, the replay before it is approximate)
    ]
    if state_doc is not None:
        (out / "state.json").write_text(json.dumps(state_doc, indent=1))
    steps.done("state_s")

    structure = [{**f.as_dict(), "root_cause": True} for f in scan.findings + found]
    findings = _findings_doc(
        opts, meta, counts, samples, structure + snapshot_rows, replayed, table_paths, out
    )
    _root_causes(findings, scan, consequences, found, snapshot_rows)
    breaks.attach(findings, scan.regions, replayed.gaps, replayed.approximate)
    witness.record(findings, scan, others, scans.previous)
    findings["end_state"] = replayed.end_state
    findings["controller_changes"] = scan.controller_changes()
    findings["damaged_frames"] = scan.damaged_frames
    (out / "findings.json").write_text(json.dumps(findings, indent=1, default=str))

    steps("rendering the report")
    vol, seeds = carry_dir / "volume", carry_dir / "partitions"
    if from_offset is not None:  # the report's inputs from --from on
        vol, seeds = out / "work" / "report-volume", out / "work" / "report-seeds"
        _together(
            lambda: tables.volume(_since(records, from_offset)).write.parquet(str(vol)),
            lambda: tables.partition_seeds(tf.read("partition_history")).write.parquet(str(seeds)),
        )
    data = _report_data(
        vol,
        seeds,
        out / "tables",
        meta,
        findings,
        replayed,
        opts,
        out,
        time.monotonic() - steps.started,
    )
    report_path = out / "report.html"
    report_path.write_text(report.render(data), encoding="utf-8")
    if from_offset is None and not scan.findings:  # what the next run carries on from
        _write_carry(out, opts, meta, replayed, run_no, {"tables": tf.schemas, "carry": cf.schemas})
    steps.done("report_s")
    topics_df.unpersist()
    brokers.unpersist()
    if cached:
        every.unpersist()
    shutil.rmtree(out / "work", ignore_errors=True)
    steps("done")
    _summary(progress, findings, report_path)
    code = 1 if findings["status"] == "failed" else 0
    return AuditResult(code, findings, report_path, table_paths, steps.timings)


def _counts_and_samples(
    findings_df: DataFrame, causes: list[int] | None = None
) -> tuple[dict[tuple[str, str], int], list[Any], dict[tuple[str, int], int]]:
    """The findings per (rule, severity) and each rule's first :data:`SAMPLES_PER_RULE` by
    offset, in one job: the samples and one row of each (rule, severity, cause), each row with
    its group's count. ``causes``: the first offsets of the log's damaged or missing stretches
    (sorted); a finding at or after one is its consequence (``cause``: that stretch's index,
    -1 for none). Returns the counts, the samples and ``{(rule, cause): count}`` of the
    consequences."""
    starts = sorted(causes or [])
    cause = F.lit(-1)
    for i, first in enumerate(starts):
        cause = F.when(F.col("offset") >= F.lit(first), F.lit(i)).otherwise(cause)
    by_rule = Window.partitionBy("rule").orderBy("offset")
    by_kind = Window.partitionBy("rule", "severity", "cause")
    rows = (
        findings_df.withColumn("cause", cause)
        .select(
            "*",
            F.row_number().over(by_rule).alias("n"),
            F.count("*").over(by_kind).alias("count"),
            F.row_number().over(by_kind.orderBy("offset")).alias("k"),
        )
        .filter((F.col("n") <= SAMPLES_PER_RULE) | (F.col("k") == 1))
        .collect()
    )
    counts: dict[tuple[str, str], int] = {}
    consequences: dict[tuple[str, int], int] = {}
    for r in rows:
        if r["k"] == 1:
            key = (r["rule"], r["severity"])
            counts[key] = counts.get(key, 0) + r["count"]
            if r["cause"] >= 0:
                ck = (r["rule"], r["cause"])
                consequences[ck] = consequences.get(ck, 0) + r["count"]
    samples = sorted(
        (r for r in rows if r["n"] <= SAMPLES_PER_RULE), key=lambda r: (r["rule"], r["n"])
    )
    return counts, samples, consequences


def _root_causes(
    findings: dict[str, Any],
    scan: integrity.Integrity,
    consequences: dict[tuple[str, int], int],
    found: list[integrity.Finding],
    snapshot_rows: list[dict[str, Any]],
) -> None:
    """Lead with the root causes: every structural finding (damage, gaps, chain breaks,
    snapshots, witnesses), each damaged or missing stretch with the count per rule of the
    safety findings after it (its consequences: the state they were checked on is missing
    that stretch's changes). Marks each rule's consequence count."""
    causes = []
    for i, region in enumerate(scan.regions):
        f = region.finding
        causes.append(
            {
                **f.as_dict(),
                "offsets": [region.first, region.last],
                "consequences": {
                    rule: n for (rule, c), n in sorted(consequences.items()) if c == i
                },
            }
        )
    in_regions = {id(r.finding) for r in scan.regions}
    for f in scan.findings + found:
        if id(f) not in in_regions:
            causes.append({**f.as_dict(), "offsets": None, "consequences": {}})
    for rule in findings["rules"]:
        n = sum(c for (r, _), c in consequences.items() if r == rule["rule"])
        rule["consequences"] = n
        rule["root_causes"] = rule["count"] - n
    for row in snapshot_rows:
        causes.append({**row, "offsets": None, "consequences": {}})
    causes.sort(
        key=lambda c: (c["severity"] != "error", c["offset"] if c["offset"] is not None else -1)
    )
    findings["root_causes"] = causes


def _together(*jobs: Callable[[], Any]) -> list[Any]:
    """Run independent Spark actions side by side (small ones mostly wait on planning and
    scheduling, not on the cores); their results, or raises the first failure."""
    with ThreadPoolExecutor(len(jobs)) as threads:
        return [done.result() for done in [threads.submit(job) for job in jobs]]


def _carry_jobs(
    cf: carry.TableFiles, records: DataFrame, batches_new: DataFrame
) -> list[Callable[[], Any]]:
    """Adding the new records' batches, topics, topic removals and configs to what the next
    run carries (ignored, and dropped by the next run, unless :func:`_write_carry` then
    writes the state)."""
    return [
        lambda: cf.append("batches", batches_new.select(*BATCH_CARRY)),
        lambda: cf.append("topic_created", tables.topic_created(records)),
        lambda: cf.append("topic_removed", tables.topic_removed(records)),
        lambda: cf.append("topic_configs", tables.topic_configs(records)),
    ]


def _write_carry(
    out: Path,
    opts: AuditOptions,
    meta: dict[str, Any],
    replayed: _Replayed,
    run_no: int,
    schemas: dict[str, Any],
) -> None:
    """Keep what the next run needs to carry on from this one (its tables are already
    written, :func:`_carry_jobs`): the image and the state; no state when it could not carry
    on: damaged frames or a replay error, which a whole-log run reports again."""
    carry_dir = out / "carry"
    wm = meta["watermark"]
    if (
        meta["problems"]
        or replayed.error is not None
        or replayed.image is None
        or wm is None
        or replayed.offset != wm["last_offset"]
    ):
        return
    os.replace(replayed.image, carry_dir / "image.snapshot")
    shutil.rmtree(out / ".replayed-image", ignore_errors=True)
    segments = {
        p.name: carry.stamp(p) for p in list_segments(opts.log_dir) if p.name <= wm["source"]
    }
    carry.write_state(
        out,
        {
            "version": carry.VERSION,
            "log_dir": str(opts.log_dir.resolve()),
            "run": run_no,
            "watermark": wm,
            "segments": segments,
            "meta": meta,
            "comparisons": replayed.comparisons,
            "schemas": schemas,
        },
    )


def _from_offset(records: DataFrame, opts: AuditOptions) -> int | None:
    lo = opts.from_offset
    if opts.from_ms is not None:
        row = records.filter(F.col("timestamp_ms") >= opts.from_ms).agg(F.min("offset")).first()
        first = row[0] if row is not None else None
        lo = max(lo or 0, first if first is not None else (1 << 62))
    return lo


def _since(df: DataFrame, from_offset: int | None) -> DataFrame:
    if from_offset is None:
        return df
    col = (
        "offset"
        if "offset" in df.columns
        else ("start_offset" if "start_offset" in df.columns else None)
    )
    if col is None:
        return df
    return df.filter(F.col(col).isNull() | (F.col(col) >= from_offset))


def _findings_doc(
    opts: AuditOptions,
    meta: dict[str, Any],
    counts: dict[tuple[str, str], int],
    samples: list[Any],
    extra: list[dict[str, Any]],
    replayed: _Replayed,
    table_paths: dict[str, Any],
    out: Path,
) -> dict[str, Any]:
    by_rule: dict[str, list[dict[str, Any]]] = {}
    for row in samples:
        by_rule.setdefault(row["rule"], []).append(
            {
                "offset": row["offset"],
                "severity": row["severity"],
                "detail": row["detail"],
                "consequence": row["cause"] >= 0,
            }
        )
    for row in extra:
        by_rule.setdefault(row["rule"], []).append(
            {k: row.get(k) for k in ("offset", "severity", "detail", "file", "position")}
        )
        counts[(row["rule"], row["severity"])] = counts.get((row["rule"], row["severity"]), 0) + 1
    rules = []
    for rule, (severity, description) in {
        **integrity.RULES,
        **checks.RULES,
        **breaks.RULES,
    }.items():
        errors = counts.get((rule, "error"), 0)
        warnings = counts.get((rule, "warning"), 0)
        rules.append(
            {
                "rule": rule,
                "severity": "error" if errors else ("warning" if warnings else severity),
                "description": description,
                "count": errors + warnings,
                "errors": errors,
                "warnings": warnings,
                "passed": errors + warnings == 0,
                "samples": by_rule.get(rule, []),
            }
        )
    failed = any(r["errors"] for r in rules)
    return {
        "status": "failed" if failed else "passed",
        "log_dir": str(opts.log_dir),
        "records": meta["records"],
        "batches": meta["batches"],
        "first_offset": meta["first_offset"],
        "last_offset": meta["last_offset"],
        "first_timestamp_ms": meta["first_ms"],
        "last_timestamp_ms": meta["last_ms"],
        "rules": rules,
        "snapshots": replayed.comparisons,
        "replay_error": replayed.error,
        "tables": {k: str(v) for k, v in table_paths.items()},
        "report": str(out / "report.html"),
    }


def _report_data(
    volume_dir: Path,
    seeds_dir: Path,
    tables_dir: Path,
    meta: dict[str, Any],
    findings: dict[str, Any],
    replayed: _Replayed,
    opts: AuditOptions,
    out: Path,
    elapsed: float,
) -> dict[str, Any]:
    """Small aggregates for the charts (each bounded) from the written tables in
    ``tables_dir``, the records per batch time and type (``volume_dir``, :func:`tables.volume`)
    and each partition's last state and event counts (``seeds_dir``,
    :func:`tables.partition_seeds`), read on the driver (:mod:`tools.audit.reportdata`)."""
    t0, t1 = meta["first_ms"] or 0, meta["last_ms"] or 1
    nb = reportdata.BUCKETS
    span = max(t1 - t0, 1)
    topics = reportdata.rows(
        tables_dir / "topics", ("topic_id", "topic_name", "removed_ts"), millis=("removed_ts",)
    )
    names: dict[str, str | None] = {}
    for r in topics:
        names.setdefault(r["topic_id"], r["topic_name"])
    seeds = localtable.read(seeds_dir, ("topic_id", "partition_id", "leader_events", "isr_events"))
    brokers = tables_dir / "broker_history"
    got = {
        "charts": reportdata.charts(tables_dir, seeds, names),
        "removed": sorted(
            (
                {"topic_name": r["topic_name"], "removed_ms": r["removed_ts"]}
                for r in topics
                if r["removed_ts"] is not None
            ),
            key=lambda r: r["removed_ms"],
        ),  # a name removed twice: the last
        "broker_keys": [
            {"broker_id": b}
            for b in {r["broker_id"] for r in reportdata.rows(brokers, ("broker_id",))}
        ],
        "states": [
            {"broker_id": r["broker_id"], "state": r["state"], "s": r["start_ts"], "e": r["end_ts"]}
            for r in reportdata.ordered(
                tables_dir / "broker_intervals",
                ("broker_id", "state", "start_ts", "end_ts", "start_offset"),
                [
                    ("broker_id", "ascending"),
                    ("start_ts", "ascending"),
                    ("start_offset", "ascending"),
                ],
                5000,
                millis=("start_ts", "end_ts"),
            )
        ],
        "volume": reportdata.volume(
            reportdata.rows(volume_dir, ("timestamp_ms", "record_type", "count")), t0, t1
        ),
        "principals": reportdata.principals(
            reportdata.rows(tables_dir / "who_changed_what", ("principal", "api", "records"))
        ),
        "intervals": reportdata.ordered(
            tables_dir / "replication_intervals",
            (
                "topic_name",
                "topic_id",
                "partition_id",
                "state",
                "start_offset",
                "start_ts",
                "end_ts",
                "duration_s",
                "open",
                "isr",
                "reason",
            ),
            [
                ("duration_s", "descending"),
                ("start_offset", "ascending"),
                ("topic_id", "ascending"),
                ("partition_id", "ascending"),
            ],
            200,
            times=("start_ts", "end_ts"),
        ),
        "lifecycle": reportdata.ordered(
            tables_dir / "topic_lifecycle",
            (
                "offset",
                "ts",
                "topic_name",
                "event",
                "partitions",
                "config_name",
                "old_value",
                "new_value",
                "principal",
                "reason",
            ),
            [("offset", "ascending")],
            300,
            times=("ts",),
        ),
        "broker_history": reportdata.ordered(
            brokers,
            ("offset", "ts", "broker_id", "broker_epoch", "event", "state", "reason"),
            [("offset", "ascending")],
            300,
            times=("ts",),
        ),
    }
    points = [r for r in got["charts"] if r["kind"] == "leader"]
    removed = {r["topic_name"]: r["removed_ms"] for r in got["removed"]}
    leadership: dict[str, list[Any]] = {}
    for key in sorted({(p["topic_name"] or "?", p["partition_id"]) for p in points}):
        pts = sorted(
            (p["t"], p["leader"])
            for p in points
            if (p["topic_name"] or "?", p["partition_id"]) == key
        )
        end = removed.get(key[0]) or t1
        leadership[f"{key[0]}-{key[1]}"] = [
            (t, pts[i + 1][0] if i + 1 < len(pts) else end, leader)
            for i, (t, leader) in enumerate(pts)
        ]
    broker_keys = sorted(r["broker_id"] for r in got["broker_keys"])
    states: dict[str, list[Any]] = {}
    for r in got["states"]:
        states.setdefault(f"broker {r['broker_id']}", []).append((r["s"], r["e"], r["state"]))
    isr: dict[str, list[Any]] = {}
    for r in sorted((r for r in got["charts"] if r["kind"] == "isr"), key=lambda r: r["offset"]):
        isr.setdefault(f"{r['topic_name']}-{r['partition_id']}", []).append((r["t"], r["isr_size"]))
    vol = got["volume"]
    types = sorted({r["record_type"] for r in vol})
    buckets: dict[int, dict[str, int]] = {}
    for r in vol:
        buckets.setdefault(int(r["b"]), {})[r["record_type"]] = r["count"]
    volume = [(t0 + b * span // nb, buckets[b]) for b in sorted(buckets)]
    principals = [(f"{r['principal']} · {r['api']}", r["n"]) for r in got["principals"]]
    ri = [
        (
            f"{r['topic_name']}-{r['partition_id']}",
            r["state"],
            str(r["start_ts"])[:19],
            str(r["end_ts"])[:19],
            round(r["duration_s"], 1),
            r["open"],
            str(list(r["isr"] or [])),
            r["reason"],
        )
        for r in got["intervals"]
    ]
    lifecycle = [
        (
            r["offset"],
            str(r["ts"])[:19],
            r["topic_name"],
            r["event"],
            r["partitions"],
            r["config_name"],
            r["old_value"],
            r["new_value"],
            r["principal"],
            r["reason"],
        )
        for r in got["lifecycle"]
    ]
    bh = [
        (
            r["offset"],
            str(r["ts"])[:19],
            r["broker_id"],
            r["broker_epoch"],
            r["event"],
            r["state"],
            r["reason"],
        )
        for r in got["broker_history"]
    ]
    shown = {
        "replication_intervals": (tables_dir / "replication_intervals", len(ri)),
        "topic_lifecycle": (tables_dir / "topic_lifecycle", len(lifecycle)),
        "broker_history": (brokers, len(bh)),
    }
    totals = {}
    for name, (path, n) in shown.items():
        total = localtable.count(path)
        link = None
        if total > n:  # the whole table beside the report
            localtable.write_csv(path, out / "csv" / f"{name}.csv")
            link = f"csv/{name}.csv"
        totals[name] = {"shown": n, "total": total, "csv": link}
    meta_out = {
        **meta,
        "log_dir": str(opts.log_dir),
        "out": str(out / "tables"),
        "segments": len(list_segments(opts.log_dir)),
        "snapshots": len(list_snapshots(opts.log_dir)),
        "generated": datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "elapsed_s": elapsed,
    }
    return {
        "meta": meta_out,
        "findings": findings["rules"],
        "leadership": leadership,
        "broker_keys": broker_keys,
        "broker_states": states,
        "isr": isr,
        "volume": volume,
        "record_types": types,
        "principals": principals,
        "replication_intervals": ri,
        "lifecycle": lifecycle,
        "broker_history": bh,
        "snapshots": replayed.comparisons,
        "totals": totals,
        "root_causes": findings.get("root_causes", []),
        "end_state": findings.get("end_state"),
        "controller_changes": findings.get("controller_changes", []),
        "head": findings.get("head"),
        "witnesses": findings.get("witnesses", []),
    }


def _summary(progress: Callable[[str], None], findings: dict[str, Any], report_path: Path) -> None:
    progress("")
    progress(
        f"Audit {findings['status'].upper()}: {findings['records']:,} records, offsets "
        f"{findings['first_offset']}..{findings['last_offset']}"
    )
    for c in findings.get("root_causes", []):
        where = f"{c.get('file') or ''} byte {c.get('position')}" if c.get("file") else ""
        progress(f"  ROOT    {c['rule']} at offset {c['offset']} {where}: {c['detail']}")
    for r in findings["rules"]:
        if r["count"]:
            offs = ", ".join(str(s["offset"]) for s in r["samples"][:5])
            then = f", {r['consequences']} after damage" if r.get("consequences") else ""
            progress(
                f"  {r['severity'].upper():7} {r['rule']}: {r['count']}{then} (offsets {offs})"
            )
    approximate = (findings.get("replay") or {}).get("approximate")
    if approximate:
        progress(f"  STATE   the end state is {approximate}")
    passed = sum(1 for r in findings["rules"] if r["passed"])
    progress(
        f"  {passed} of {len(findings['rules'])} rules passed; "
        f"{len(findings['snapshots'])} snapshot(s) compared"
    )
    progress(f"Report: {report_path}")
    progress(
        f"Findings: {report_path.parent / 'findings.json'}; tables: {report_path.parent / 'tables'}"
    )
