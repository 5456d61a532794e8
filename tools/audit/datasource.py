"""The ``kraft-metadata`` PySpark data source: ``spark.read.format("kraft-metadata").load(DIR)``.

One input partition per segment file (and per snapshot file when asked), each read by
:mod:`tools.audit.fastdecode` (segments; the same rows as the strict
:mod:`tools.audit.columns`) or :mod:`tools.audit.columns` (snapshots) into Arrow record batches.
Options:

* ``fromOffset`` / ``toOffset``: inclusive bounds; segments wholly outside are not read.
  Filters on ``offset`` (``=``, ``<``, ``<=``, ``>``, ``>=``) tighten the same bounds.
* ``snapshots``: ``exclude`` (default: log only), ``include`` or ``only``.
* ``segments``: comma-separated segment file names to read (default: all).

A schema given to the read (``.schema("offset BIGINT, leader INT")``) picks columns of the
table: only those are decoded and handed to Spark, in that order (names as in the table, case
ignored; same types; nullable). Spark gives a Python data source no column pruning of its own,
and every column of every row costs the JVM a conversion: a narrow read is several times
cheaper than ``.load(DIR).select(...)``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    InputPartition,
    LessThan,
    LessThanOrEqual,
)
from pyspark.sql.types import StructType

from kraft.log.segment import list_segments, parse_segment_name
from kraft.log.snapshot import list_snapshots, parse_snapshot_name
from tools.audit.columns import COLUMNS, NAMES, SPARK_DDL, decode_snapshot
from tools.audit.fastdecode import decode_segment_fast

_SNAPSHOT_MODES = ("exclude", "include", "only")


def segment_ranges(log_dir: str | Path) -> list[tuple[Path, int, int | None]]:
    """``(path, first offset, last offset or None for the newest)`` of every segment, by
    their names: a segment ends where the next one begins."""
    paths = list_segments(log_dir)
    bases = [parse_segment_name(p) or 0 for p in paths]
    return [
        (p, b, bases[i + 1] - 1 if i + 1 < len(bases) else None)
        for i, (p, b) in enumerate(zip(paths, bases))
    ]


def _int_option(options: dict[str, str], key: str) -> int | None:
    raw = options.get(key)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"option {key} must be an integer offset, got {raw!r}") from None


def requested_columns(schema: StructType) -> list[tuple[str, str]] | None:
    """``(table column, name asked for)`` of each field of a read's schema (a ``StructType``),
    in order; None when it is the whole table. Raises ValueError naming every field that is
    not a column of the table, has another type, or is declared NOT NULL."""
    from pyspark.sql.pandas.types import to_arrow_type

    by_lower = {n.lower(): (n, typ, ddl) for n, typ, ddl in COLUMNS}
    picked, problems, seen = [], [], set()
    for f in schema.fields:
        column = by_lower.get(f.name.lower())
        if column is None:
            problems.append(f"{f.name!r} is not a column")
            continue
        name, typ, ddl = column
        if name in seen:
            problems.append(f"{f.name!r} is asked for twice")
        elif not f.nullable:
            problems.append(f"{f.name!r} must be nullable (drop NOT NULL)")
        elif to_arrow_type(f.dataType, timezone="UTC") != typ:
            asked = f.dataType.simpleString().upper()
            problems.append(
                f"{f.name!r} must have nullable elements"
                if asked == ddl
                else f"{f.name!r} is {ddl} in the table, not {asked}"
            )
        seen.add(name)
        picked.append((name, f.name))
    if not schema.fields:
        problems.append("it has no column")
    if problems:
        raise ValueError(
            "kraft-metadata: the schema asked for does not fit the record table: "
            + "; ".join(problems)
            + f". The table: {SPARK_DDL}"
        )
    if tuple(p[1] for p in picked) == NAMES:
        return None
    return picked


class KraftMetadataDataSource(DataSource):
    """Rows of the metadata log (see :data:`tools.audit.columns.COLUMNS`)."""

    @classmethod
    def name(cls) -> str:
        return "kraft-metadata"

    def schema(self) -> str:
        return SPARK_DDL

    def reader(self, schema: StructType) -> KraftMetadataReader:
        return KraftMetadataReader(dict(self.options), requested_columns(schema))


class KraftMetadataReader(DataSourceReader):
    """Plans one partition per file and decodes it. ``columns``: from
    :func:`requested_columns` (None: the whole table)."""

    def __init__(
        self, options: dict[str, str], columns: list[tuple[str, str]] | None = None
    ) -> None:
        path = options.get("path")
        if not path:
            raise ValueError("kraft-metadata needs a log directory: .load(DIR)")
        self.dir = Path(path)
        if not self.dir.is_dir():
            raise ValueError(f"kraft-metadata: {self.dir} is not a directory")
        self.lo = _int_option(options, "fromOffset")
        self.hi = _int_option(options, "toOffset")
        self.snapshots = options.get("snapshots", "exclude")
        if self.snapshots not in _SNAPSHOT_MODES:
            raise ValueError(
                f"option snapshots must be one of {_SNAPSHOT_MODES}, got {self.snapshots!r}"
            )
        names = options.get("segments")
        self.only = {n.strip() for n in names.split(",") if n.strip()} if names else None
        self.columns = [c for c, _ in columns] if columns is not None else None
        asked = [a for _, a in columns] if columns is not None else None
        self.renamed = asked if asked != self.columns else None

    def pushFilters(self, filters: list[Filter]) -> Iterator[Filter]:
        """Use offset comparisons to skip segments; every filter is still handed back for
        Spark to apply to the rows."""
        for f in filters:
            col = getattr(f, "attribute", None)
            value = getattr(f, "value", None)
            if (
                isinstance(col, tuple)
                and len(col) == 1
                and str(col[0]).lower() == "offset"
                and type(value) is int
            ):  # (a schema may spell it Offset)
                if isinstance(f, EqualTo):
                    self._tighten(value, value)
                elif isinstance(f, GreaterThan):
                    self._tighten(value + 1, None)
                elif isinstance(f, GreaterThanOrEqual):
                    self._tighten(value, None)
                elif isinstance(f, LessThan):
                    self._tighten(None, value - 1)
                elif isinstance(f, LessThanOrEqual):
                    self._tighten(None, value)
            yield f

    def _tighten(self, lo: int | None, hi: int | None) -> None:
        if lo is not None:
            self.lo = lo if self.lo is None else max(self.lo, lo)
        if hi is not None:
            self.hi = hi if self.hi is None else min(self.hi, hi)

    def partitions(self) -> Sequence[InputPartition]:
        parts: list[InputPartition] = []
        if self.snapshots != "only":
            for path, first, last in segment_ranges(self.dir):
                if self.only is not None and path.name not in self.only:
                    continue
                if self.hi is not None and first > self.hi:
                    continue
                if self.lo is not None and last is not None and last < self.lo:
                    continue
                parts.append(InputPartition(("log", str(path), self.lo, self.hi)))
        if self.snapshots != "exclude":
            for path in list_snapshots(self.dir):
                last = parse_snapshot_name(path)[0] - 1
                if (self.lo is None or last >= self.lo) and (self.hi is None or last <= self.hi):
                    parts.append(InputPartition(("snapshot", str(path), None, None)))
        return parts or [InputPartition(("none", "", None, None))]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        for rb in self._decode(*partition.value):
            yield rb.rename_columns(self.renamed) if self.renamed else rb

    def _decode(
        self, kind: str, path: str, lo: int | None, hi: int | None
    ) -> Iterator[pa.RecordBatch]:
        if kind == "log":
            yield from decode_segment_fast(path, lo, hi, columns=self.columns)
        elif kind == "snapshot":
            for rb in decode_snapshot(path):
                yield rb if self.columns is None else rb.select(self.columns)
