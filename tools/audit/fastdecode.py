"""Columnar fast decode of a log segment into the record table: the same rows as the strict
:func:`tools.audit.columns.decode_segment`, without a Python object per record.

A frame whose CRC matches is unpacked with one ``msgpack.unpackb`` and its batch fields are
checked by the project codec (:func:`kraft.records.batch_from_dict` without records). Clean
frames are gathered into chunks of many thousand records; per chunk the records are grouped by
type and every field is checked column-wise against the codec's field kinds (C-level passes:
``set(map(type, column))``), then the Arrow columns are built straight from those lists. If
anything in a chunk does not check (unknown type, wrong key set or order, a value of the wrong
kind), the chunk is decoded again by the strict path, which gives exactly its rows or its
``decode`` problem rows. Damaged frames (torn, CRC mismatch, undecodable batch) always go
through the strict path.
"""
from __future__ import annotations

import gc
from itertools import chain, repeat
from operator import itemgetter
from pathlib import Path
from typing import Any, Callable, Iterator

import msgpack
import numpy as np
import orjson
import pyarrow as pa

from kraft.log.segment import CRC, DECODE, IO, TORN, Frame, iter_frames
from kraft.records import (BOOL, INT, INTS, OPT_INT, OPT_INTS, OPT_STR, RECORD_TYPES, STR, Batch,
                           RecordDecodeError, batch_from_dict, batch_hash, decode_batch)
from tools.audit.columns import (ARROW_SCHEMA, BATCH_COLUMNS, COLUMNS, RENAMES, JSON_ONLY,
                                 Builder, batch_meta)

_NONE = type(None)
# kind -> the value types it accepts unchanged (list kinds: then every element must be an int)
_ACCEPTS: dict[Any, frozenset] = {
    INT: frozenset({int}), STR: frozenset({str}), BOOL: frozenset({bool}),
    OPT_STR: frozenset({str, _NONE}), OPT_INT: frozenset({int, _NONE}),
    INTS: frozenset({list}), OPT_INTS: frozenset({list, _NONE}),
}
_INT_ONLY = frozenset({int})
_TYPES_BY_COLUMN = {name: typ for name, typ, _ in COLUMNS}
_HI = 1 << 62


class _Unchecked(Exception):
    """A chunk the fast path cannot vouch for: decode it strictly."""


def _column_ok(kind: Any, column: list) -> bool:
    if not set(map(type, column)) <= _ACCEPTS[kind]:
        return False
    if kind is INTS:
        return set(map(type, chain.from_iterable(column))) <= _INT_ONLY
    if kind is OPT_INTS:
        return set(map(type, chain.from_iterable(filter(None, column)))) <= _INT_ONLY
    return True


class _Plan:
    """How one record type is checked and fills the typed columns."""

    __slots__ = ("name", "version", "keys", "get", "kinds", "normalise", "columns")

    def __init__(self, cls: type) -> None:
        names = [n for n, _ in cls.FIELDS]
        self.name, self.version = cls.NAME, cls.VERSION
        self.keys = ("type", "version", *names)
        self.get: Callable[[dict], tuple] | None = (itemgetter(*names) if len(names) > 1 else
                                                    (lambda d, n=names[0]: (d[n],)) if names
                                                    else None)
        self.kinds = [k for _, k in cls.FIELDS]
        # kinds the strict codec normalises (lists of maps, keys put in spec order): JSON only
        self.normalise = [(i, n, k) for i, (n, k) in enumerate(cls.FIELDS) if k not in _ACCEPTS]
        renames = RENAMES.get(cls.NAME, {})
        self.columns: dict[str, tuple[int, Callable[[list], list] | None]] = {}
        for i, (n, kind) in enumerate(cls.FIELDS):
            if n in JSON_ONLY:
                continue
            conv = None
            if n == "fenced" and kind is BOOL:
                conv = _fenced_bools
            elif n == "in_controlled_shutdown" and kind is BOOL:
                conv = _bools_to_ints
            self.columns[renames.get(n, n)] = (i, conv)


def _fenced_bools(col: list) -> list:
    return list(map({True: 1, False: -1}.__getitem__, col))


def _bools_to_ints(col: list) -> list:
    return list(map(int, col))


_PLANS = {type_id: _Plan(cls) for type_id, cls in RECORD_TYPES.items()}
_TYPED = [(n, t) for n, t, _ in COLUMNS
          if n not in BATCH_COLUMNS and n not in ("offset", "index_in_batch", "record_type",
                                                  "record_version", "record_json")]


def _checked_groups(recs: list) -> tuple[np.ndarray, list[tuple[int, int]],
                                          list[tuple[_Plan, list, list[dict]]]]:
    """Group raw record maps by type and check each group column-wise as the strict codec
    would: ``(order, bounds, groups)`` where ``order`` sorts the records by type (stable),
    ``bounds[i]`` is group i's slice of that order and ``groups[i]`` is ``(plan, field columns,
    record maps)``; map-list fields are normalised as the codec does (columns and maps).
    Raises :class:`_Unchecked` on anything the strict codec might refuse or change."""
    n = len(recs)
    type_ids = list(map(itemgetter("type"), recs))
    if not set(map(type, type_ids)) <= _INT_ONLY:
        raise _Unchecked("record type is not an integer")
    tids = np.fromiter(type_ids, np.int64, n)
    order = np.argsort(tids, kind="stable")
    sorted_ids = tids[order]
    cuts = np.flatnonzero(np.diff(sorted_ids)) + 1
    bounds = list(zip(chain((0,), cuts.tolist()), chain(cuts.tolist(), (n,))))
    holder = np.empty(n, dtype=object)
    holder[:] = recs
    groups: list[tuple[_Plan, list, list[dict]]] = []
    for lo, hi in bounds:
        plan = _PLANS.get(int(sorted_ids[lo]))
        if plan is None:
            raise _Unchecked(f"unknown record type {int(sorted_ids[lo])}")
        ds = holder[order[lo:hi]].tolist()
        if set(map(tuple, ds)) != {plan.keys}:
            raise _Unchecked(f"{plan.name}: fields are not the codec's")
        versions = list(map(itemgetter("version"), ds))
        if set(map(type, versions)) != _INT_ONLY or set(versions) != {plan.version}:
            raise _Unchecked(f"{plan.name}: unsupported version")
        cols: list = list(zip(*map(plan.get, ds))) if plan.get else []
        for kind, col in zip(plan.kinds, cols):
            if kind in _ACCEPTS and not _column_ok(kind, col):
                raise _Unchecked(f"{plan.name}: a value does not check")
        for i, field, kind in plan.normalise:  # strict normalises these (TypeError: refused)
            normal = list(map(kind, cols[i]))
            cols[i] = normal
            list(map(dict.__setitem__, ds, repeat(field), normal))
        groups.append((plan, cols, ds))
    return order, bounds, groups


class _Chunk:
    """Clean frames (CRC ok, batch fields checked) waiting to become one Arrow batch."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.frames: list[tuple[Frame, Batch, int, int]] = []  # frame, batch, first index, count
        self.rows = 0

    def add(self, frame: Frame, batch: Batch, first: int, count: int) -> None:
        """A clean frame whose records ``first .. first + count - 1`` are wanted (count 0: none,
        kept so a strict re-decode of the chunk walks the same frames)."""
        self.frames.append((frame, batch, first, count))
        self.rows += count

    def build(self) -> pa.RecordBatch:
        """The chunk's rows; raises :class:`_Unchecked` if a record does not check."""
        try:
            return self._build()
        except _Unchecked:
            raise
        except Exception as e:  # a wrong shape anywhere: not ours to vouch for
            raise _Unchecked(str(e)) from None

    def _build(self) -> pa.RecordBatch:
        n = self.rows
        frames = [f for f in self.frames if f[3]]
        if not n:
            return pa.RecordBatch.from_pylist([], schema=ARROW_SCHEMA)
        counts = np.fromiter((c for _, _, _, c in frames), np.int64, len(frames))
        firsts = np.fromiter((f for _, _, f, _ in frames), np.int64, len(frames))
        bases = np.fromiter((b.base_offset for _, b, _, _ in frames), np.int64, len(frames))
        which = np.repeat(np.arange(len(frames)), counts)
        starts = np.cumsum(counts) - counts
        index = np.repeat(firsts - starts, counts) + np.arange(n)
        recs: list = list(chain.from_iterable(
            b.records[f:f + c] if (f or c != len(b.records)) else b.records
            for _, b, f, c in frames))
        order, bounds, groups = _checked_groups(recs)
        names_col = np.empty(n, dtype=object)
        versions_col = np.empty(n, dtype=np.int32)
        for (plan, _, ds), (lo, hi) in zip(groups, bounds):
            list(map(dict.__setitem__, ds, repeat("type"), repeat(plan.name)))
            names_col[lo:hi] = plan.name
            versions_col[lo:hi] = plan.version
        inverse = np.empty(n, dtype=np.int64)
        inverse[order] = np.arange(n)
        take = pa.array(inverse)
        blobs = list(map(orjson.dumps, recs))  # row order; "type" now holds the name
        offsets = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(np.fromiter(map(len, blobs), np.int32, n), out=offsets[1:])
        record_json = pa.StringArray.from_buffers(n, pa.py_buffer(offsets),
                                                  pa.py_buffer(b"".join(blobs)))
        batch_cols = self._batch_columns(pa.array(which))
        arrays = []
        for name, typ, _ in COLUMNS:
            if name in batch_cols:
                arrays.append(batch_cols[name])
            elif name == "offset":
                arrays.append(pa.array(np.repeat(bases, counts) + index, typ))
            elif name == "index_in_batch":
                arrays.append(pa.array(index.astype(np.int32), typ))
            elif name == "record_type":
                arrays.append(pa.array(names_col, typ).take(take))
            elif name == "record_version":
                arrays.append(pa.array(versions_col, typ).take(take))
            elif name == "record_json":
                arrays.append(record_json)
            else:
                arrays.append(_typed(name, typ, groups, bounds).take(take))
        return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA)

    def _batch_columns(self, which: pa.Array) -> dict[str, pa.Array]:
        """Batch-level columns: one value per frame, repeated for its rows by ``take``."""
        per: dict[str, list] = {n: [] for n in BATCH_COLUMNS}
        for frame, b, _, count in self.frames:
            if not count:
                continue
            meta = batch_meta(self.source, "log", frame.position, b,
                              batch_hash(frame.payload), True, None)
            for k, col in per.items():
                col.append(meta[k])
        return {k: pa.array(v, _TYPES_BY_COLUMN[k]).take(which) for k, v in per.items()}


def _typed(name: str, typ: pa.DataType, groups: list, bounds: list) -> pa.Array:
    chunks = []
    for (plan, cols, _), (lo, hi) in zip(groups, bounds):
        spec = plan.columns.get(name)
        if spec is None:
            chunks.append(pa.nulls(hi - lo, typ))
            continue
        i, conv = spec
        col = cols[i]
        chunks.append(pa.array(conv(col) if conv is not None else col, typ))
    return pa.concat_arrays(chunks) if len(chunks) != 1 else chunks[0]


def _strict_frame(out: Builder, source: str, frame: Frame, size: int, expected: int | None,
                  lo: int, hi: int) -> int | None:
    """Rows of one frame exactly as the strict decoder gives them; returns the offset the next
    frame should start at (None: unknown)."""
    if frame.payload is None:
        detail = f"frame at byte {frame.position} runs past the end of the file ({size} bytes)"
        out.add_problem({"source": source, "source_kind": "log", "position": frame.position,
                         "crc_ok": True, "problem": f"{TORN}: {detail}", "offset": expected})
        return expected
    try:
        batch = decode_batch(frame.payload)
    except RecordDecodeError as e:
        batch, err = None, str(e)
    if batch is None:
        detail = (f"{CRC}: frame of {frame.end - frame.position - 8} bytes" if not frame.crc_ok
                  else f"{DECODE}: {err}")
        out.add_problem({"source": source, "source_kind": "log", "position": frame.position,
                         "crc_ok": frame.crc_ok, "problem": detail, "offset": expected})
        return None
    if not (batch.last_offset < lo or batch.base_offset > hi):
        digest = batch.digest if frame.crc_ok else batch_hash(batch.encode())
        meta = batch_meta(source, "log", frame.position, batch, digest, frame.crc_ok,
                          None if frame.crc_ok else "crc")
        base = batch.base_offset
        records = list(enumerate(batch.records))
        if base < lo or batch.last_offset > hi:
            records = [(i, r) for i, r in records if lo <= base + i <= hi]
        out.add_batch(meta, base, records)
    return batch.next_offset


def decode_segment_fast(path: str | Path, from_offset: int | None = None,
                        to_offset: int | None = None,
                        rows_per_batch: int = 65536) -> Iterator[pa.RecordBatch]:
    """Arrow batches of every record in one segment with ``from <= offset <= to``: the same rows
    (and the same problem rows for damaged frames) as :func:`columns.decode_segment`."""
    path = Path(path)
    source = path.name
    lo = -1 if from_offset is None else from_offset
    hi = _HI if to_offset is None else to_offset
    try:
        data = path.read_bytes()
    except OSError as e:
        out = Builder()
        out.add_problem({"source": source, "source_kind": "log", "position": 0, "crc_ok": True,
                         "problem": f"{IO}: {e}", "offset": None})
        yield out.flush()
        return
    size = len(data)
    chunk = _Chunk(source)
    expected: int | None = None
    chunk_expected: int | None = None  # the expected offset when the chunk began
    unpackb = msgpack.unpackb

    def flush() -> Iterator[pa.RecordBatch]:
        nonlocal chunk, expected
        if not chunk.frames:
            return
        try:
            rb = chunk.build()
        except _Unchecked:  # strictly, frame by frame: same rows or the decode problem rows
            out, exp = Builder(), chunk_expected
            for frame, _, _, _ in chunk.frames:
                exp = _strict_frame(out, source, frame, size, exp, lo, hi)
            expected = exp
            rb = out.flush() if out.rows else None
        chunk = _Chunk(source)
        if rb is not None and rb.num_rows:
            yield rb

    gc_was = gc.isenabled()
    gc.disable()  # millions of small containers: the cyclic GC would rescan them all
    try:
        for frame in iter_frames(data):
            batch = None
            if frame.payload is not None and frame.crc_ok:
                try:
                    batch = batch_from_dict(unpackb(frame.payload, raw=False, strict_map_key=False),
                                            check_records=False)
                except Exception:  # msgpack raises several types; the strict path names it
                    batch = None
            if batch is None:
                yield from flush()
                out = Builder()
                expected = _strict_frame(out, source, frame, size, expected, lo, hi)
                if out.rows:
                    yield out.flush()
                chunk_expected = expected
                continue
            if not chunk.frames:
                chunk_expected = expected
            expected = batch.base_offset + len(batch.records)
            first = max(lo - batch.base_offset, 0)
            chunk.add(frame, batch, first, max(min(hi, expected - 1) - batch.base_offset + 1 - first, 0))
            if chunk.rows >= rows_per_batch:
                yield from flush()
        yield from flush()
    finally:
        if gc_was:
            gc.enable()
