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
import json
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa

from kraft.log.segment import CRC, ChainState, scan_segment
from kraft.log.snapshot import read_snapshot
from kraft.records import Batch, Record, batch_hash, record_to_json

I32, I64, STR, BOOL = pa.int32(), pa.int64(), pa.string(), pa.bool_()
INTS = pa.list_(pa.field("element", pa.int32()))

# (name, arrow type, spark type)
COLUMNS: tuple[tuple[str, pa.DataType, str], ...] = (
    ("source", STR, "STRING"),            # segment or snapshot file name
    ("source_kind", STR, "STRING"),       # "log" or "snapshot"
    ("position", I64, "BIGINT"),          # byte position of the frame in the file
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
    ("batch_hash", STR, "STRING"),        # hex SHA-256 of the batch bytes as found on disk
    ("prev_hash", STR, "STRING"),         # hex, as carried by the batch
    ("crc_ok", BOOL, "BOOLEAN"),
    ("problem", STR, "STRING"),           # null, or "crc" / "decode: ..." / "torn: ..."
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
_RENAMES = {
    "TopicRecord": {"name": "topic_name"},
    "ConfigRecord": {"name": "config_name", "value": "config_value"},
    "FeatureLevelRecord": {"name": "feature_name"},
    "LeaderChangeRecord": {"leader_id": "controller_id", "term": "controller_term"},
}
_SKIP = {"endpoints", "features", "removing_replicas", "adding_replicas"}  # JSON only


class _Builder:
    """Column lists for one Arrow batch."""

    def __init__(self) -> None:
        self.cols: dict[str, list[Any]] = {n: [] for n in NAMES}
        self.rows = 0

    def add(self, meta: dict[str, Any], record: Record | None) -> None:
        cols = self.cols
        values: dict[str, Any] = dict(meta)
        if record is not None:
            values["record_type"] = record.NAME
            values["record_version"] = record.VERSION
            renames = _RENAMES.get(record.NAME, {})
            for name, _ in record.FIELDS:
                if name in _SKIP:
                    continue
                v = getattr(record, name)
                if name == "fenced" and type(v) is bool:
                    v = 1 if v else -1
                elif name == "in_controlled_shutdown" and type(v) is bool:
                    v = int(v)
                elif type(v) is tuple:
                    v = list(v)
                values[renames.get(name, name)] = v
            values["record_json"] = json.dumps(record_to_json(record), separators=(",", ":"))
        for n in NAMES:
            cols[n].append(values.get(n))
        self.rows += 1

    def flush(self) -> pa.RecordBatch:
        batch = pa.RecordBatch.from_arrays(
            [pa.array(self.cols[n], type=t) for n, t, _ in COLUMNS], schema=ARROW_SCHEMA)
        self.cols = {n: [] for n in NAMES}
        self.rows = 0
        return batch


def _batch_meta(source: str, kind: str, position: int, batch: Batch, digest: bytes | None,
                crc_ok: bool, problem: str | None) -> dict[str, Any]:
    p = batch.provenance
    return {"source": source, "source_kind": kind, "position": position,
            "batch_base_offset": batch.base_offset, "batch_last_offset": batch.last_offset,
            "term": batch.term, "raft_index": batch.raft_index, "timestamp_ms": batch.timestamp_ms,
            "principal": p.principal, "client_id": p.client_id, "request_id": p.request_id,
            "api": p.api, "reason": p.reason, "batch_hash": digest.hex() if digest else None,
            "prev_hash": batch.prev_hash.hex(), "crc_ok": crc_ok, "problem": problem}


def decode_segment(path: str | Path, from_offset: int | None = None, to_offset: int | None = None,
                   rows_per_batch: int = 8192) -> Iterator[pa.RecordBatch]:
    """Arrow batches of every record in one segment file with ``from <= offset <= to``.

    Damage never raises: a CRC mismatch marks the (still decoded) rows ``crc_ok=false,
    problem="crc"`` and their ``batch_hash`` is the hash of the bytes as found; an undecodable or
    torn frame gives one row with no record. Chain, offset and term breaks are left to the
    checks (they span segments)."""
    path = Path(path)
    name = path.name
    lo = -1 if from_offset is None else from_offset
    hi = (1 << 62) if to_offset is None else to_offset
    out = _Builder()
    gc_was = gc.isenabled()
    gc.disable()  # building many small objects: the cyclic GC only slows this down
    try:
        # Checked on its own: the ChainState only tells scan_segment where to expect offsets.
        for entry in scan_segment(path, ChainState()):
            batch, prob = entry.batch, entry.problem
            if batch is None:
                kind = prob.kind if prob is not None else "decode"
                detail = f"{kind}: {prob.detail}" if prob is not None else kind
                out.add({"source": name, "source_kind": "log", "position": entry.position,
                         "crc_ok": kind != CRC, "problem": detail,
                         "offset": prob.offset if prob is not None else None}, None)
            else:
                if batch.last_offset < lo or batch.base_offset > hi:
                    continue
                crc_ok = not (prob is not None and prob.kind == CRC)
                digest = entry.digest
                if not crc_ok:  # hash what the edited bytes decode to: the chain breaks here
                    digest = batch_hash(batch.encode())
                meta = _batch_meta(name, "log", entry.position, batch, digest, crc_ok,
                                   None if crc_ok else "crc")
                for i, record in enumerate(batch.records):
                    off = batch.base_offset + i
                    if lo <= off <= hi:
                        meta["offset"] = off
                        meta["index_in_batch"] = i
                        out.add(meta, record)
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
    meta = {"source": path.name, "source_kind": "snapshot", "position": 0,
            "offset": header.end_offset - 1, "batch_base_offset": header.end_offset - 1,
            "batch_last_offset": header.end_offset - 1, "term": header.term,
            "raft_index": header.raft_index, "timestamp_ms": header.timestamp_ms,
            "batch_hash": header.last_hash.hex(), "crc_ok": True}
    out = _Builder()
    for i, record in enumerate(records):
        meta["index_in_batch"] = i
        out.add(meta, record)
        if out.rows >= rows_per_batch:
            yield out.flush()
    if out.rows:
        yield out.flush()

