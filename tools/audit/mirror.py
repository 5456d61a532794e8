"""An incremental Parquet mirror of the log's segments.

Every segment is decoded once and kept as Parquet under
``MIRROR/records/source=<segment file>/part-0.parquet``; ``MIRROR/manifest.json`` records each
mirrored segment's size and mtime. A segment that changed (or vanished) is re-decoded (or
dropped): sealed segments never change, so a re-audit decodes only the newest segment (which
may still be appended to) and any new ones. The audit's queries then all read Parquet, pruned
to the columns each needs. Each stale segment is one task that runs the columnar decoder and
writes its Parquet file with pyarrow (no row conversion in the JVM, no sort by partition), then
renames it into place. In local mode the tasks run in the audit's own worker processes while
the JVM starts (:meth:`Mirror.start`): no Spark job and no Spark Python workers; on a cluster
they are one Spark job, one task per segment.
"""

from __future__ import annotations

import json
import os
import shutil
from concurrent.futures import Executor, Future
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession

from tools.audit.columns import ARROW_SCHEMA, NAMES, SPARK_DDL
from tools.audit.datasource import segment_ranges

#: A log up to this size (~170,000 records of a typical mix) is audited by small jobs only:
#: C1-only compilation costs less CPU than C2's compiles save (docs/performance.md).
SMALL_LOG_BYTES = 32 << 20


def _stamp(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns]


def write_segment(item: tuple[str, str]) -> None:
    """Decode one segment into ``DIR/part-0.parquet`` (without the ``source`` column, which
    the directory name gives). Runs on a Spark worker or in a local worker process."""
    from tools.audit.fastdecode import decode_segment_fast

    segment, directory = item
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / ".part-0.parquet.tmp"
    schema = ARROW_SCHEMA.remove(ARROW_SCHEMA.get_field_index("source"))
    with pq.ParquetWriter(tmp, schema, compression="snappy") as writer:
        for rb in decode_segment_fast(segment):
            writer.write_batch(rb.drop_columns(["source"]))
    os.replace(tmp, out / "part-0.parquet")


class Mirror:
    """The mirror of ``log_dir`` (up to ``to_offset``) under ``root``: made up to date by
    :meth:`start` (local worker processes) or :meth:`load` (a Spark job), read by :meth:`load`.
    Creating it drops the mirrored segments that changed or left the log."""

    def __init__(self, log_dir: Path, root: Path, to_offset: int | None = None) -> None:
        self.log_dir, self.root, self.to_offset = log_dir, root, to_offset
        ranges = segment_ranges(log_dir)
        if to_offset is not None:
            ranges = [r for r in ranges if r[1] <= to_offset]
        root.mkdir(parents=True, exist_ok=True)
        self.manifest_path = root / "manifest.json"
        self.manifest: dict[str, list[int]] = (
            json.loads(self.manifest_path.read_text()) if self.manifest_path.exists() else {}
        )
        self.records_dir = root / "records"
        self.wanted = {p.name: _stamp(p) for p, _, _ in ranges}
        for name in list(self.manifest):
            if name not in self.wanted or self.manifest[name] != self.wanted[name]:
                shutil.rmtree(self.records_dir / f"source={name}", ignore_errors=True)
                del self.manifest[name]
        self.stale = [name for name in self.wanted if name not in self.manifest]
        self._decoding: list[Future[None]] | None = None

    def small(self) -> bool:
        """Whether the audited segments hold at most :data:`SMALL_LOG_BYTES`: then every
        Spark job is small and the session compiles with C1 only
        (:func:`tools.audit.session.build_session`'s ``short``)."""
        return sum(size for size, _ in self.wanted.values()) <= SMALL_LOG_BYTES

    def _items(self) -> list[tuple[str, str]]:
        return [
            (str(self.log_dir / name), str(self.records_dir / f"source={name}"))
            for name in self.stale
        ]

    def start(self, pool: Executor) -> None:
        """Decode the stale segments in ``pool`` (largest first), without Spark."""
        items = sorted(self._items(), key=lambda it: -os.path.getsize(it[0]))
        self._decoding = [pool.submit(write_segment, item) for item in items]

    def rows_after(self, source: str, position: int, columns: list[str]) -> pa.Table:
        """The log rows (``columns`` and ``source``) after byte ``position`` of segment
        ``source``, read on the driver (after :meth:`load`: the mirror is then up to date)."""
        parts = []
        for name in sorted(n for n in self.wanted if n >= source):
            path = self.records_dir / f"source={name}" / "part-0.parquet"
            t = pq.read_table(path, columns=sorted({*columns, "source_kind", "position"}))
            keep = pc.equal(t["source_kind"], "log")
            if name == source:
                keep = pc.and_(keep, pc.greater(t["position"], position))
            t = t.filter(keep)
            parts.append(
                t.select(columns).append_column(
                    "source", pa.array([name] * t.num_rows, pa.string())
                )
            )
        return pa.concat_tables(parts)  # (the watermark's segment is always there)

    def load(self, spark: SparkSession) -> tuple[DataFrame, dict[str, Any]]:
        """The record table from the mirror, after the stale segments are decoded (by
        :meth:`start`'s processes, else in one Spark job). Returns it with
        ``{"decoded": [...], "reused": [...]}``."""
        if self.stale:
            if self._decoding is None:
                items = self._items()
                spark.sparkContext.parallelize(items, len(items)).foreach(write_segment)
            else:
                for done in self._decoding:
                    done.result()
            for name in self.stale:
                self.manifest[name] = self.wanted[name]
            self.manifest_path.write_text(json.dumps(self.manifest, indent=1, sort_keys=True))
        if self.wanted:
            paths = [str(self.records_dir / f"source={name}") for name in self.wanted]
            df = (
                spark.read.schema(SPARK_DDL)
                .option("basePath", str(self.records_dir))
                .parquet(*paths)
                .select(*NAMES)
            )
        else:
            df = spark.createDataFrame([], SPARK_DDL)
        if self.to_offset is not None:
            df = df.filter(df["offset"].isNull() | (df["offset"] <= self.to_offset))
        return df, {
            "decoded": self.stale,
            "reused": [n for n in self.wanted if n not in self.stale],
        }
