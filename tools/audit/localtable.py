"""An audit table directory (Parquet files, as :class:`tools.audit.carry.TableFiles` writes
them) read on the driver with pyarrow: the carried state a re-audit checks and the report's
small reads, without a Spark job."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds


def _dataset(path: Path) -> ds.Dataset | None:
    files = sorted(str(p) for p in path.glob("*.parquet")) if path.is_dir() else []
    return ds.dataset(files, format="parquet") if files else None


def read(
    path: Path, columns: Iterable[str], filter: ds.Expression | None = None
) -> pa.Table | None:
    """Table ``path``'s ``columns`` (rows matching ``filter``); None when it has no files."""
    data = _dataset(path)
    return None if data is None else data.to_table(columns=list(columns), filter=filter)


def batches(path: Path, columns: Iterable[str]) -> Iterator[pa.RecordBatch]:
    """Table ``path``'s ``columns`` a batch at a time, in file order (none when it has no
    files)."""
    data = _dataset(path)
    if data is not None:
        yield from data.to_batches(columns=list(columns), use_threads=False)


def count(path: Path) -> int:
    """Table ``path``'s rows (0 when it has no files)."""
    data = _dataset(path)
    return 0 if data is None else data.count_rows()


def write_csv(path: Path, dest: Path) -> int:
    """Table ``path`` whole as one CSV file ``dest`` (timestamps in ISO-8601 UTC, lists as
    their text), written a batch at a time; the rows written."""
    import pyarrow.compute as pc
    import pyarrow.csv as csv

    data = _dataset(path)
    dest.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    writer = None
    try:
        for batch in data.to_batches(use_threads=False) if data is not None else []:
            cols = []
            for col in batch.columns:
                if pa.types.is_list(col.type) or pa.types.is_struct(col.type):
                    col = pa.array([None if v is None else str(v) for v in col.to_pylist()])
                elif pa.types.is_timestamp(col.type):
                    col = pc.strftime(col, format="%Y-%m-%dT%H:%M:%SZ")
                cols.append(col)
            rb = pa.RecordBatch.from_arrays(cols, names=batch.schema.names)
            if writer is None:
                writer = csv.CSVWriter(str(dest), rb.schema)
            writer.write_batch(rb)
            n += rb.num_rows
    finally:
        if writer is not None:
            writer.close()
    if writer is None:
        dest.write_text("")
    return n
