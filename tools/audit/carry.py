"""What an audit leaves in ``OUT/carry`` so that the next audit of the same log carries on
from it (a re-audit), and the Parquet table files both write.

``OUT/carry/state.json`` holds the watermark (the last batch audited: its segment, byte
position, last offset, hash and term), the audited segments' size and mtime, the run number
and the log's totals; next to it small Parquet tables: every batch's offsets, hash and term,
each partition's last state, every TopicRecord, topic removal and topic config, and the
records per batch time and type; ``image.snapshot`` is the replayed image at the watermark;
the tables' schemas. A run carries on (else it audits the whole log) when the state is there
and from the same log (:func:`load_state`), no audited segment changed but for the newest
growing (:func:`segments_unchanged`), and (:func:`continues`) the newest's audited batches kept
their hashes (:func:`grown_changed`), the new records start right after the watermark and
chain to its hash, and no new TopicRecord reuses a known topic id (:func:`reuses_topic_id`).

Tables are directories of Parquet files: a run appends its rows as files named
``r<run>-part-*.parquet``; rows a later run may change (intervals still open) are files with
their own prefix that the next run replaces.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
from pathlib import Path
from typing import Any, overload

from pyspark.sql import DataFrame, DataFrameReader, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from kraft.log.segment import list_segments
from tools.audit import localtable

VERSION = 1


class TableFiles:
    """Parquet tables under ``root`` written as files tagged by run (see module doc)."""

    def __init__(
        self,
        spark: SparkSession,
        root: Path,
        run: int,
        schemas: dict[str, str] | None = None,
        one_file: bool = False,
    ) -> None:
        self.spark, self.root, self.run = spark, root, run
        # a small log's tables are written by one task each: one file, one writer set-up and
        # one copy of the Hadoop configuration per table instead of one per partition (its
        # rows stay in the same order: a coalesce reads the partitions one after the other)
        self.one_file = one_file
        self.staging = root / ".staging"
        self._staged = itertools.count()
        # each table's schema (JSON) as written: reading with it skips Spark's footer-reading
        # job per read (the state keeps them for the next run)
        self.schemas: dict[str, str] = dict(schemas or {})

    def _stage(self, name: str, df: DataFrame) -> Path:
        """Write ``df`` to a staging directory of its own (a table may be written by several
        threads at once); that directory."""
        tmp = self.staging / f"{name}-{next(self._staged)}"
        (df.coalesce(1) if self.one_file else df).write.mode("overwrite").parquet(str(tmp))
        self.schemas[name] = df.schema.json()
        return tmp

    def append(self, name: str, df: DataFrame, prefix: str | None = None) -> DataFrame:
        """Add ``df``'s rows to table ``name``; ``prefix`` (instead of the run's tag): first
        drop the files an earlier run wrote with it. Returns the rows just written."""
        tmp = self._stage(name, df)
        staged = sorted(tmp.glob("part-*.parquet"))
        target = self.root / name
        target.mkdir(parents=True, exist_ok=True)
        tag = prefix or f"r{self.run:05d}"
        if prefix:
            for old in target.glob(f"{prefix}-*.parquet"):
                old.unlink()
        moved = []
        for f in staged:
            dest = target / f"{tag}-{f.name}"
            os.replace(f, dest)
            moved.append(str(dest))
        shutil.rmtree(tmp, ignore_errors=True)
        if not moved:
            return self.spark.createDataFrame([], df.schema)
        return self.spark.read.schema(df.schema).parquet(*moved)

    def _reader(self, name: str) -> DataFrameReader:
        known = self.schemas.get(name)
        return (
            self.spark.read.schema(StructType.fromJson(json.loads(known)))
            if known
            else self.spark.read
        )

    def replace(self, name: str, df: DataFrame) -> DataFrame:
        """Make ``df`` the whole of table ``name``."""
        tmp = self._stage(name, df)
        target = self.root / name
        shutil.rmtree(target, ignore_errors=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, target)
        return self.read(name)

    @overload
    def read(self, name: str) -> DataFrame: ...
    @overload
    def read(self, name: str, prefix: str) -> DataFrame | None: ...
    def read(self, name: str, prefix: str | None = None) -> DataFrame | None:
        """Table ``name`` (only its ``prefix`` files when given)."""
        target = self.root / name
        if prefix is None:
            return self._reader(name).parquet(str(target))
        files = sorted(str(p) for p in target.glob(f"{prefix}-*.parquet"))
        return self._reader(name).parquet(*files) if files else None

    def exists(self, name: str) -> bool:
        return any((self.root / name).glob("*.parquet"))


def stamp(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns]


def load_state(out: Path, log_dir: Path) -> tuple[dict[str, Any] | None, str]:
    """The earlier run's state, or None and why not."""
    path = out / "carry" / "state.json"
    if not path.exists():
        return None, "no earlier audit in this output directory"
    try:
        state = json.loads(path.read_text())
    except ValueError:
        return None, "the earlier audit's state is unreadable"
    if state.get("version") != VERSION:
        return None, "the earlier audit's state is from another version"
    if state.get("log_dir") != str(log_dir.resolve()):
        return None, "the earlier audit was of another log directory"
    if not (out / "carry" / "image.snapshot").exists():
        return None, "the earlier audit kept no image"
    return state, ""


def segments_unchanged(state: dict[str, Any], log_dir: Path) -> tuple[bool, bool]:
    """(every audited segment is as it was, except that the newest may have grown;
    the newest grew)."""
    names = [p.name for p in list_segments(log_dir)]
    audited = state["segments"]
    newest = state["watermark"]["source"]
    if any(n not in names for n in audited) or any(n < newest and n not in audited for n in names):
        return False, False
    for name, was in audited.items():
        now = stamp(log_dir / name)
        if name == newest:
            if now[0] < was[0]:
                return False, False
        elif now != was:
            return False, False
    return True, stamp(log_dir / newest) != audited[newest]


def new_records(records: DataFrame, state: dict[str, Any]) -> DataFrame:
    """The rows after the watermark, in log order (later segments, or later in its segment)."""
    wm = state["watermark"]
    src, pos = F.col("source"), F.col("position")
    return records.filter((src > wm["source"]) | ((src == wm["source"]) & (pos > wm["position"])))


def grown_changed(
    spark: SparkSession, records: DataFrame, state: dict[str, Any], carry_dir: Path
) -> bool:
    """Whether a batch the earlier run audited in the newest audited segment (which grew) is
    no longer there with the same hash."""
    wm = state["watermark"]
    old = records.filter(
        (F.col("source") == wm["source"])
        & (F.col("position") <= wm["position"])
        & (F.col("index_in_batch") == 0)
    ).select("batch_base_offset", "batch_hash")
    known = (
        _carried(spark, carry_dir, state).read("batches").select("batch_base_offset", "batch_hash")
    )
    return bool(old.join(known, ["batch_base_offset", "batch_hash"], "left_anti").limit(1).count())


def reuses_topic_id(new_ids: set[str | None], carry_dir: Path) -> bool:
    """Whether a new TopicRecord's topic id (``new_ids``) is one the audited records know
    (read on the driver from the carried topics, removals and partitions)."""
    known: set[str] = set()
    for name in ("topic_created", "topic_removed", "partitions"):
        ids = localtable.read(carry_dir / name, ["topic_id"])
        if ids is not None:
            known.update(ids.column(0).to_pylist())
    return bool((new_ids - {None}) & known)


def _carried(spark: SparkSession, carry_dir: Path, state: dict[str, Any]) -> TableFiles:
    return TableFiles(spark, carry_dir, state["run"], state.get("schemas", {}).get("carry"))


def continues(
    state: dict[str, Any], changed: bool, lo: int | None, head: dict[str, Any] | None, reused: bool
) -> str:
    """Why the new records do not carry on from the state ("" when they do). ``changed``:
    :func:`grown_changed`; ``lo``: the new records' lowest offset; ``head``: the first new
    batch's ``batch_base_offset`` and ``prev_hash`` (both None when there are none);
    ``reused``: :func:`reuses_topic_id`."""
    wm = state["watermark"]
    if changed:
        return f"{wm['source']} changed before the audited end"
    if lo is None:
        return ""
    if lo <= wm["last_offset"]:
        return f"the new records start at offset {lo}, not after {wm['last_offset']}"
    if head is None or (head["batch_base_offset"], head["prev_hash"]) != (
        wm["last_offset"] + 1,
        wm["last_hash"],
    ):
        return "the new records do not continue the audited batches' hash chain"
    if reused:
        return "a new TopicRecord reuses a topic id the audited records know"
    return ""


def write_state(out: Path, state: dict[str, Any]) -> None:
    path = out / "carry" / "state.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=1, sort_keys=True))
    os.replace(tmp, path)
