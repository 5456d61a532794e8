"""The record table: one row per metadata record, decoded with :mod:`kraft.records`.

:data:`COLUMNS` is the single definition of the table (Arrow type and Spark SQL type per
column); :func:`decode_file` turns a segment or snapshot file into Arrow record batches with
exactly that schema. Pure Python + pyarrow: no Spark here, so workers and unit tests share it.

Typed columns are filled for the record types that have the field (else null). Conventions:
``fenced`` is 1 fenced / -1 unfenced / 0 unchanged (RegisterBroker's boolean is mapped to 1/-1);
``leader`` keeps the codec's values (-1 none, -2 unchanged); ``controller_id`` / ``controller_term``
are LeaderChangeRecord's ``leader_id`` / ``term``. Damaged frames give one row with a
``problem`` (``crc``: bytes edited, record decoded anyway; ``decode`` / ``torn``: no record).
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator, Sequence
from operator import attrgetter
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from kraft.log.segment import CRC, ChainState, scan_segment
from kraft.log.snapshot import read_snapshot
from kraft.records import RECORD_TYPES, Batch, Record, batch_hash

I32, I64, STR, BOOL = pa.int32(), pa.int64(), pa.string(), pa.bool_()
INTS = pa.list_(pa.field("element", pa.int32()))

# (name, arrow type, spark type)
COLUMNS: tuple[tuple[str, pa.DataType, str], ...] = (
    ("source", STR, "STRING"),  # segment or snapshot file name
    ("source_kind", STR, "STRING"),  # "log" or "snapshot"
    ("position", I64, "BIGINT"),  # byte position of the frame in the file
    ("offset", I64, "BIGINT"),
    ("batch_base_offset", I64, "BIGINT"),
    ("batch_last_offset", I64, "BIGINT"),
    ("index_in_batch", I32, "INT"),
    ("term", I64, "BIGINT"),
    ("raft_index", I64, "BIGINT"),
    ("timestamp_ms", I64, "BIGINT"),
    ("principal", STR, "STRING"),
    ("client_id", STR, "STRING"),
    ("request_id", STR, "STRING"),
    ("api", STR, "STRING"),
    ("reason", STR, "STRING"),
    ("batch_hash", STR, "STRING"),  # hex SHA-256 of the batch bytes as found on disk
    ("prev_hash", STR, "STRING"),  # hex, as carried by the batch
    ("crc_ok", BOOL, "BOOLEAN"),
    ("problem", STR, "STRING"),  # null, or "crc" / "decode: ..." / "torn: ..."
    ("record_type", STR, "STRING"),
    ("record_version", I32, "INT"),
    ("broker_id", I32, "INT"),
    ("broker_epoch", I64, "BIGINT"),
    ("incarnation_id", STR, "STRING"),
    ("rack", STR, "STRING"),
    ("fenced", I32, "INT"),
    ("in_controlled_shutdown", I32, "INT"),
    ("topic_id", STR, "STRING"),
    ("topic_name", STR, "STRING"),
    ("partition_id", I32, "INT"),
    ("replicas", INTS, "ARRAY<INT>"),
    ("isr", INTS, "ARRAY<INT>"),
    ("leader", I32, "INT"),
    ("leader_epoch", I32, "INT"),
    ("partition_epoch", I32, "INT"),
    ("leader_recovery_state", I32, "INT"),
    ("election", STR, "STRING"),
    ("resource_type", I32, "INT"),
    ("resource_name", STR, "STRING"),
    ("config_name", STR, "STRING"),
    ("config_value", STR, "STRING"),
    ("feature_name", STR, "STRING"),
    ("feature_level", I32, "INT"),
    ("controller_id", I32, "INT"),
    ("controller_term", I64, "BIGINT"),
    ("next_producer_id", I64, "BIGINT"),
    ("record_json", STR, "STRING"),
)
NAMES = tuple(c[0] for c in COLUMNS)
ARROW_SCHEMA = pa.schema([pa.field(n, t) for n, t, _ in COLUMNS])
SPARK_DDL = ", ".join(f"`{n}` {s}" for n, _, s in COLUMNS)

# record field -> column, where the names differ
RENAMES = {
    "TopicRecord": {"name": "topic_name"},
    "ConfigRecord": {"name": "config_name", "value": "config_value"},
    "FeatureLevelRecord": {"name": "feature_name"},
    "LeaderChangeRecord": {"leader_id": "controller_id", "term": "controller_term"},
}
JSON_ONLY = {"endpoints", "features", "removing_replicas", "adding_replicas"}
BATCH_COLUMNS = (
    "source",
    "source_kind",
    "position",
    "batch_base_offset",
    "batch_last_offset",
    "term",
    "raft_index",
    "timestamp_ms",
    "principal",
    "client_id",
    "request_id",
    "api",
    "reason",
    "batch_hash",
    "prev_hash",
    "crc_ok",
    "problem",
)
_ROW_COLUMNS = ("offset", "index_in_batch", "record_type", "record_version", "record_json")


def _fenced(v: Any) -> int:
    return (1 if v else -1) if type(v) is bool else v


class _TypePlan:
    """How one record type fills the table: a C-level getter for all its field values, the
    typed columns it fills (column → (index into the values, converter)), and its JSON keys."""

    __slots__ = ("columns", "get", "head", "names")

    def __init__(self, cls: type[Record]) -> None:
        names = tuple(n for n, _ in cls.FIELDS)
        if not names:
            self.get: Callable[[Record], tuple[Any, ...]] = lambda r: ()
        elif len(names) == 1:
            only = names[0]
            self.get = lambda r: (getattr(r, only),)
        else:
            self.get = attrgetter(*names)
        renames = RENAMES.get(cls.NAME, {})
        self.columns: dict[str, tuple[int, Callable[[Any], Any] | None]] = {}
        for i, name in enumerate(names):
            if name in JSON_ONLY:
                continue
            conv = (
                _fenced if name == "fenced" else int if name == "in_controlled_shutdown" else None
            )
            self.columns[renames.get(name, name)] = (i, conv)
        self.names = names
        self.head = {"type": cls.NAME, "version": cls.VERSION}


_PLANS = {cls: _TypePlan(cls) for cls in RECORD_TYPES.values()}


class Builder:
    """The strict path's columns for one Arrow batch. Batch-level columns are extended once per batch; record
    values are kept per record type (one getter call per record) and scattered into row order
    at :meth:`flush` with Arrow's ``take``."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self.rows = 0
        self.batch_cols: dict[str, list[Any]] = {n: [] for n in BATCH_COLUMNS}
        self.row_cols: dict[str, list[Any]] = {n: [] for n in _ROW_COLUMNS}
        self.by_type: dict[Any, tuple[list[int], list[tuple[Any, ...]]]] = {}

    def add_batch(
        self,
        meta: dict[str, Any],
        first_offset: int,
        records: Sequence[tuple[int, Record]],
        same_offset: bool = False,
    ) -> None:
        """Rows for ``records`` (``(index in batch, record)``) sharing the batch ``meta``; the
        offset is ``first_offset + index`` (or ``first_offset`` for all when ``same_offset``)."""
        k = len(records)
        for n, col in self.batch_cols.items():
            col.extend([meta.get(n)] * k)
        rc = self.row_cols
        offsets, indexes = rc["offset"], rc["index_in_batch"]
        types, versions, jsons = rc["record_type"], rc["record_version"], rc["record_json"]
        by_type = self.by_type
        step = 0 if same_offset else 1
        row = self.rows
        dumps = orjson.dumps
        for i, record in records:
            cls = type(record)
            plan = _PLANS[cls]
            values = plan.get(record)
            group = by_type.get(cls)
            if group is None:
                group = by_type[cls] = ([], [])
            group[0].append(row)
            group[1].append(values)
            offsets.append(first_offset + step * i)
            indexes.append(i)
            types.append(cls.NAME)
            versions.append(cls.VERSION)
            doc = dict(plan.head)
            doc.update(zip(plan.names, values))
            jsons.append(dumps(doc).decode())
            row += 1
        self.rows = row

    def add_problem(self, meta: dict[str, Any]) -> None:
        """A row for a frame that holds no decodable batch."""
        for n, col in self.batch_cols.items():
            col.append(meta.get(n))
        for n, col in self.row_cols.items():
            col.append(meta.get(n))
        group = self.by_type.setdefault(None, ([], []))
        group[0].append(self.rows)
        group[1].append(())
        self.rows += 1

    def flush(self) -> pa.RecordBatch:
        groups = list(self.by_type.items())
        order = pc.sort_indices(pa.array([r for _, (rows, _) in groups for r in rows], pa.int64()))
        arrays = []
        for name, typ, _ in COLUMNS:
            if name in self.batch_cols:
                arrays.append(pa.array(self.batch_cols[name], type=typ))
            elif name in self.row_cols:
                arrays.append(pa.array(self.row_cols[name], type=typ))
            else:
                arrays.append(self._sparse(name, typ, groups).take(order))
        self._reset()
        return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA)

    @staticmethod
    def _sparse(name: str, typ: pa.DataType, groups: list[Any]) -> pa.Array:
        chunks = []
        for cls, (rows, values) in groups:
            spec = _PLANS[cls].columns.get(name) if cls is not None else None
            if spec is None:
                chunks.append(pa.nulls(len(rows), typ))
                continue
            j, conv = spec
            col = [v[j] for v in values]
            if conv is not None:
                col = [conv(v) for v in col]
            chunks.append(pa.array(col, type=typ))
        return pa.concat_arrays(chunks) if len(chunks) != 1 else chunks[0]


def batch_meta(
    source: str,
    kind: str,
    position: int,
    batch: Batch,
    digest: bytes | None,
    crc_ok: bool,
    problem: str | None,
) -> dict[str, Any]:
    p = batch.provenance
    return {
        "source": source,
        "source_kind": kind,
        "position": position,
        "batch_base_offset": batch.base_offset,
        "batch_last_offset": batch.last_offset,
        "term": batch.term,
        "raft_index": batch.raft_index,
        "timestamp_ms": batch.timestamp_ms,
        "principal": p.principal,
        "client_id": p.client_id,
        "request_id": p.request_id,
        "api": p.api,
        "reason": p.reason,
        "batch_hash": digest.hex() if digest else None,
        "prev_hash": batch.prev_hash.hex(),
        "crc_ok": crc_ok,
        "problem": problem,
    }


def decode_segment(
    path: str | Path,
    from_offset: int | None = None,
    to_offset: int | None = None,
    rows_per_batch: int = 8192,
) -> Iterator[pa.RecordBatch]:
    """Arrow batches of every record in one segment file with ``from <= offset <= to``.

    Damage never raises: a CRC mismatch marks the (still decoded) rows ``crc_ok=false,
    problem="crc"`` and their ``batch_hash`` is the hash of the bytes as found; an undecodable or
    torn frame gives one row with no record. Chain, offset and term breaks are left to the
    checks (they span segments)."""
    path = Path(path)
    name = path.name
    lo = -1 if from_offset is None else from_offset
    hi = (1 << 62) if to_offset is None else to_offset
    out = Builder()
    gc_was = gc.isenabled()
    gc.disable()  # building many small objects: the cyclic GC only slows this down
    try:
        # Checked on its own: the ChainState only tells scan_segment where to expect offsets.
        for entry in scan_segment(path, ChainState()):
            batch, prob = entry.batch, entry.problem
            if batch is None:
                kind = prob.kind if prob is not None else "decode"
                detail = f"{kind}: {prob.detail}" if prob is not None else kind
                out.add_problem(
                    {
                        "source": name,
                        "source_kind": "log",
                        "position": entry.position,
                        "crc_ok": kind != CRC,
                        "problem": detail,
                        "offset": prob.offset if prob is not None else None,
                    }
                )
            else:
                if batch.last_offset < lo or batch.base_offset > hi:
                    continue
                crc_ok = not (prob is not None and prob.kind == CRC)
                digest = entry.digest
                if not crc_ok:  # hash what the edited bytes decode to: the chain breaks here
                    digest = batch_hash(batch.encode())
                meta = batch_meta(
                    name, "log", entry.position, batch, digest, crc_ok, None if crc_ok else "crc"
                )
                base = batch.base_offset
                records = list(enumerate(batch.records))
                if base < lo or batch.last_offset > hi:
                    records = [(i, r) for i, r in records if lo <= base + i <= hi]
                out.add_batch(meta, base, records)
            if out.rows >= rows_per_batch:
                yield out.flush()
    finally:
        if gc_was:
            gc.enable()
    if out.rows:
        yield out.flush()


def decode_snapshot(path: str | Path, rows_per_batch: int = 8192) -> Iterator[pa.RecordBatch]:
    """Arrow batches of a snapshot's records. Every row carries the snapshot's last included
    offset (``end_offset - 1``) and term; ``index_in_batch`` is the record's position in it."""
    path = Path(path)
    header, records = read_snapshot(path, strict=False)
    meta: dict[str, Any] = {
        "source": path.name,
        "source_kind": "snapshot",
        "position": 0,
        "offset": header.end_offset - 1,
        "batch_base_offset": header.end_offset - 1,
        "batch_last_offset": header.end_offset - 1,
        "term": header.term,
        "raft_index": header.raft_index,
        "timestamp_ms": header.timestamp_ms,
        "batch_hash": header.last_hash.hex(),
        "crc_ok": True,
    }
    out = Builder()
    chunk: list[tuple[int, Record]] = []
    for i, record in enumerate(records):
        chunk.append((i, record))
        if len(chunk) >= rows_per_batch:
            out.add_batch(meta, meta["offset"], chunk, same_offset=True)
            chunk = []
            yield out.flush()
    if chunk:
        out.add_batch(meta, meta["offset"], chunk, same_offset=True)
    if out.rows:
        yield out.flush()
