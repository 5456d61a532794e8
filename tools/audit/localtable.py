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
