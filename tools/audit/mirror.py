"""An incremental Parquet mirror of the log's segments.

Every segment is decoded once and kept as Parquet under
``MIRROR/records/source=<segment file>/part-0.parquet``; ``MIRROR/manifest.json`` records each
mirrored segment's size and mtime. A segment that changed (or vanished) is re-decoded (or
dropped): sealed segments never change, so a re-audit decodes only the newest segment (which
may still be appended to) and any new ones. The audit's queries then all read Parquet, pruned
to the columns each needs. Stale segments are decoded in one Spark job, one task per segment:
each task runs the columnar decoder and writes its Parquet file with pyarrow (no row
conversion in the JVM, no sort by partition), then renames it into place.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession

from tools.audit.columns import ARROW_SCHEMA, NAMES, SPARK_DDL
from tools.audit.datasource import segment_ranges


def _stamp(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns]


def write_segment(item: tuple[str, str]) -> None:
    """Decode one segment into ``DIR/part-0.parquet`` (without the ``source`` column, which
    the directory name gives). Runs on a Spark worker."""
    import pyarrow.parquet as pq

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


def load_records(spark: SparkSession, log_dir: Path, mirror: Path,
                 to_offset: int | None = None) -> tuple[DataFrame, dict]:
    """The record table of ``log_dir`` (up to ``to_offset``) from the mirror, after decoding
    the segments it lacks. Returns it with ``{"decoded": [...], "reused": [...]}``."""
    ranges = segment_ranges(log_dir)
    if to_offset is not None:
        ranges = [r for r in ranges if r[1] <= to_offset]
    mirror.mkdir(parents=True, exist_ok=True)
    manifest_path = mirror / "manifest.json"
    manifest: dict[str, list[int]] = (json.loads(manifest_path.read_text())
                                      if manifest_path.exists() else {})
    records_dir = mirror / "records"
    wanted = {p.name: _stamp(p) for p, _, _ in ranges}
    for name in list(manifest):
        if name not in wanted or manifest[name] != wanted[name]:
            shutil.rmtree(records_dir / f"source={name}", ignore_errors=True)
            del manifest[name]
    stale = [name for name in wanted if name not in manifest]
    if stale:
        items = [(str(log_dir / name), str(records_dir / f"source={name}")) for name in stale]
        spark.sparkContext.parallelize(items, len(items)).foreach(write_segment)
        for name in stale:
            manifest[name] = wanted[name]
        manifest_path.write_text(json.dumps(manifest, indent=1, sort_keys=True))
    if wanted:
        paths = [str(records_dir / f"source={name}") for name in wanted]
        df = (spark.read.schema(SPARK_DDL).option("basePath", str(records_dir))
                   .parquet(*paths).select(*NAMES))
    else:
        df = spark.createDataFrame([], SPARK_DDL)
    if to_offset is not None:
        df = df.filter(df["offset"].isNull() | (df["offset"] <= to_offset))
    return df, {"decoded": stale, "reused": [n for n in wanted if n not in stale]}
