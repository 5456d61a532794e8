"""Columnar fast decode of a log segment into the record table: the same rows as the strict
:func:`tools.audit.columns.decode_segment`, without a Python dict or record object per record.

A frame whose CRC matches is decoded by :func:`tools.audit.structs.decode_canonical`: msgspec
structs generated from the codec, accepted only if they re-encode to exactly the frame's bytes.
Accepted frames are gathered into chunks of many thousand records and turned into Arrow columns
a chunk at a time: the batch fields once per frame, the typed columns and ``record_json`` per
record type (one getter pass per column, one msgspec JSON encoding of the whole group). Every other frame (torn, CRC mismatch,
not the canonical encoding of a valid batch) is decoded by the strict path, which gives exactly
its rows or its ``decode`` problem row.
"""

from __future__ import annotations

import ctypes
import gc
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from operator import attrgetter, itemgetter
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from kraft.log.segment import CRC, DECODE, IO, TORN, Frame
from kraft.records import BOOL, INT, RECORD_TYPES, RecordDecodeError, batch_hash, decode_batch
from tools.audit.columns import (
    ARROW_SCHEMA,
    COLUMNS,
    JSON_ONLY,
    NAMES,
    RENAMES,
    Builder,
    batch_meta,
)
from tools.audit.integrity import frames_resync
from tools.audit.structs import RECORD_STRUCTS, decode_canonical

_HI = 1 << 62
_I32_MAX = (1 << 31) - 1
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc mallopt parameters
_retaining = False


def retain_memory() -> None:
    """Make this process keep the memory it frees for its next allocations (Arrow's buffers
    from the C library's malloc, which then keeps blocks up to 32 MiB and 1 GiB of free heap)
    instead of handing it back to the OS: a chunk's columns are ~50 MB, and faulting that much
    fresh memory in again for every chunk cost ~10% of the decode's CPU time (system time)."""
    global _retaining
    if _retaining:
        return
    _retaining = True
    pa.set_memory_pool(pa.system_memory_pool())
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt(_M_MMAP_THRESHOLD, 32 << 20)
        libc.mallopt(_M_TRIM_THRESHOLD, 1 << 30)
    except (OSError, AttributeError):  # not glibc: its defaults
        pass


class _Kind:
    """How the records of one type fill the table: its name and version, the typed columns its
    fields go to (with one getter for all of them), and how its JSON is renamed."""

    __slots__ = ("columns", "get", "json_cut", "json_name", "name", "names", "version")

    def __init__(self, type_id: int) -> None:
        cls = RECORD_TYPES[type_id]
        self.name, self.version = cls.NAME, cls.VERSION
        renames = RENAMES.get(cls.NAME, {})
        # (column, converter of the value list, numpy dtype when never null), in field order
        self.columns: list[tuple[str, Callable[..., Any] | None, Any]] = []
        fields = []
        for n, kind in cls.FIELDS:
            if n in JSON_ONLY:
                continue
            column = renames.get(n, n)
            conv, dtype = None, None
            if n == "fenced" and kind is BOOL:  # RegisterBroker's boolean: 1 fenced / -1 not
                conv = _fenced_bools
            elif n == "in_controlled_shutdown" and kind is BOOL:
                conv = _bools_to_ints
            elif kind is INT:
                dtype = np.int32 if _TYPES[column] == pa.int32() else np.int64
            self.columns.append((column, conv, dtype))
            fields.append(n)
        self.names = frozenset(c[0] for c in self.columns)
        # a tuple of the fields' values (a single value when there is one field)
        self.get: Callable[[Any], Any] | None = attrgetter(*fields) if fields else None
        # msgspec's JSON starts with the tag, {"type":<id>,  -- the table's names the type;
        # the cut includes the newline that precedes each record (see _json_of)
        self.json_cut = len(b'\n{"type":%d,' % type_id)
        self.json_name = '{"type":' + orjson.dumps(cls.NAME).decode() + ","


def _fenced_bools(col: list[Any]) -> list[Any]:
    return list(map({True: 1, False: -1}.__getitem__, col))


def _attrs(key: str, items: Sequence[Any]) -> list[Any]:
    """Attribute ``key`` of every item (one column of a batch's provenance)."""
    return list(map(attrgetter(key), items))


def _bools_to_ints(col: list[Any]) -> list[Any]:
    return list(map(int, col))


_TYPES = {name: typ for name, typ, _ in COLUMNS}
_KINDS = [_Kind(type_id) for type_id in RECORD_STRUCTS]
_KIND_INDEX = {struct: i for i, struct in enumerate(RECORD_STRUCTS.values())}
_KIND_NAMES = pa.array([k.name for k in _KINDS], pa.string())
_KIND_VERSIONS = pa.array([k.version for k in _KINDS], pa.int32())
_json_lines = msgspec.json.Encoder().encode_lines
_PROVENANCE = ("principal", "client_id", "request_id", "api", "reason")
#: what _record_columns builds: the records' JSON and their typed columns
_RECORD_COLUMNS = frozenset(["record_json", *(c[0] for k in _KINDS for c in k.columns)])


class _Columns:
    """The columns a read wants, in order (all of :data:`COLUMNS` by default), and their
    schema: the others are never built."""

    def __init__(self, names: Sequence[str] | None) -> None:
        self.names: tuple[str, ...] = tuple(names) if names is not None else NAMES
        unknown = [n for n in self.names if n not in _TYPES]
        if unknown:
            raise ValueError(f"no such column(s) in the record table: {unknown}")
        self.wanted = frozenset(self.names)
        self.whole = self.names == NAMES
        self.schema = (
            ARROW_SCHEMA if self.whole else pa.schema([ARROW_SCHEMA.field(n) for n in self.names])
        )

    def project(self, rb: pa.RecordBatch) -> pa.RecordBatch:
        """A whole-table batch (the strict decoder's) cut to these columns."""
        return rb if self.whole else rb.select(list(self.names))


class _Chunk:
    """Canonical frames waiting to become one Arrow batch."""

    def __init__(self, source: str, columns: _Columns) -> None:
        self.source = source
        self.columns = columns
        self.frames: list[
            tuple[int, bytes, Any, int, int]
        ] = []  # position, hash, batch, first, count
        self.rows = 0

    def add(self, position: int, digest: bytes, batch: Any, first: int, count: int) -> None:
        """A frame whose records ``first .. first + count - 1`` are wanted."""
        if count:
            self.frames.append((position, digest, batch, first, count))
            self.rows += count

    def build(self) -> pa.RecordBatch:
        n = self.rows
        frames = self.frames
        counts = np.fromiter((f[4] for f in frames), np.int64, len(frames))
        firsts = np.fromiter((f[3] for f in frames), np.int64, len(frames))
        bases = np.fromiter((f[2].base_offset for f in frames), np.int64, len(frames))
        starts = np.cumsum(counts) - counts
        index = np.repeat(firsts - starts, counts) + np.arange(n)
        recs: list[Any] = []
        for _, _, b, f, c in frames:
            recs.extend(b.records if c == len(b.records) else b.records[f : f + c])
        kinds = np.fromiter(map(_KIND_INDEX.__getitem__, map(type, recs)), np.int64, n)
        wanted = self.columns.wanted
        cols = self._batch_columns(pa.array(np.repeat(np.arange(len(frames)), counts)), wanted)
        cols["offset"] = pa.array(np.repeat(bases, counts) + index)
        cols["index_in_batch"] = pa.array(index.astype(np.int32))
        kinds_arr = pa.array(kinds)
        cols["record_type"] = _KIND_NAMES.take(kinds_arr)
        cols["record_version"] = _KIND_VERSIONS.take(kinds_arr)
        if not wanted.isdisjoint(_RECORD_COLUMNS):
            cols.update(_record_columns(recs, kinds, wanted))
        return pa.RecordBatch.from_arrays(
            [
                cols[name] if name in cols else _nulls(n, _TYPES[name])
                for name in self.columns.names
            ],
            schema=self.columns.schema,
        )

    def _batch_columns(self, which: pa.Array, wanted: frozenset[str]) -> dict[str, pa.Array]:
        """Batch-level columns (those ``wanted``): one value per frame, repeated for its rows
        by ``take``."""
        n, frames = self.rows, self.frames
        batches = [f[2] for f in frames]
        provenance = list(map(attrgetter("provenance"), batches))
        per: dict[str, Callable[[], list[Any]]] = {
            "position": lambda: [f[0] for f in frames],
            "batch_base_offset": lambda: list(map(attrgetter("base_offset"), batches)),
            "batch_last_offset": lambda: [b.base_offset + len(b.records) - 1 for b in batches],
            "term": lambda: list(map(attrgetter("term"), batches)),
            "raft_index": lambda: list(map(attrgetter("raft_index"), batches)),
            "timestamp_ms": lambda: list(map(attrgetter("timestamp_ms"), batches)),
            **{key: partial(_attrs, key, provenance) for key in _PROVENANCE},
            "batch_hash": lambda: [f[1].hex() for f in frames],
            "prev_hash": lambda: [b.prev_hash.hex() for b in batches],
        }
        out = {k: pa.array(v(), _TYPES[k]).take(which) for k, v in per.items() if k in wanted}
        out["source"] = pa.repeat(pa.scalar(self.source, pa.string()), n)
        out["source_kind"] = pa.repeat(pa.scalar("log", pa.string()), n)
        out["crc_ok"] = pa.repeat(pa.scalar(True), n)
        return out


_NULLS: dict[pa.DataType, pa.Array] = {}


def _nulls(n: int, typ: pa.DataType) -> pa.Array:
    """An all-null column of ``n`` rows: a slice of one array kept per type."""
    kept = _NULLS.get(typ)
    if kept is None or len(kept) < n:
        kept = _NULLS[typ] = pa.nulls(max(n, 1 << 16), typ)
    return kept.slice(0, n)


def _record_columns(
    recs: list[Any], kinds: np.ndarray, wanted: frozenset[str]
) -> dict[str, pa.Array]:
    """``record_json`` and the typed columns (those ``wanted``), built per record type (one
    getter pass over a group gives all its fields) and put in row order: a chunk of one record
    type needs no reordering; otherwise each column is one ``take`` from its filled groups, with null
    indices for the rows of the other groups."""
    n = len(recs)
    sizes = np.bincount(kinds, minlength=len(_KINDS))
    present = np.flatnonzero(sizes)
    if len(present) == 1:
        kind = _KINDS[int(present[0])]
        return {name: a for name, a in _group_columns(kind, recs, wanted).items() if a is not None}
    order = np.argsort(kinds, kind="stable")
    inverse = np.empty(n, np.int64)
    inverse[order] = np.arange(n)
    starts = np.cumsum(sizes) - sizes  # where each kind's rows begin in the sorted order
    by_column: dict[str, list[tuple[int, pa.Array]]] = {}
    for k in present.tolist():
        lo, hi = int(starts[k]), int(starts[k] + sizes[k])
        rows = order[lo:hi].tolist()
        group = list(itemgetter(*rows)(recs)) if len(rows) > 1 else [recs[rows[0]]]
        for name, array in _group_columns(_KINDS[k], group, wanted).items():
            if array is not None:
                by_column.setdefault(name, []).append((k, array))
    out = {}
    takes: dict[tuple[int, ...], pa.Array] = {}  # filled kinds -> indices (most columns share)
    for name, filled in by_column.items():
        key = tuple(k for k, _ in filled)
        indices = takes.get(key)
        if indices is None:
            indices = takes[key] = _take_indices(filled, kinds, inverse, starts)
        arrays = [a for _, a in filled]
        out[name] = (pa.concat_arrays(arrays) if len(arrays) > 1 else arrays[0]).take(indices)
    return out


def _take_indices(
    filled: list[tuple[int, pa.Array]], kinds: np.ndarray, inverse: np.ndarray, starts: np.ndarray
) -> pa.Array:
    """Each row's index in the concatenation of the ``filled`` groups' arrays (null for the
    rows of other groups): its index in the kind-sorted order, shifted per kind."""
    shift = np.zeros(len(_KINDS), np.int64)
    other = np.ones(len(_KINDS), bool)
    at = 0
    for k, array in filled:
        shift[k] = at - starts[k]
        other[k] = False
        at += len(array)
    return pa.array(inverse + shift[kinds], mask=other[kinds] if at < len(kinds) else None)


def _group_columns(
    kind: _Kind, group: list[Any], wanted: frozenset[str]
) -> dict[str, pa.Array | None]:
    """One group's ``record_json`` and typed columns (those ``wanted``; None: all null), from
    one getter call per record and a transpose."""
    out: dict[str, pa.Array | None] = {}
    if "record_json" in wanted:
        out["record_json"] = _json_of(kind, group)
    if wanted.isdisjoint(kind.names):
        return out
    get = kind.get
    if get is None:
        return out
    values = zip(*map(get, group)) if len(kind.columns) > 1 else [list(map(get, group))]
    for (name, conv, dtype), col in zip(kind.columns, values):
        if name not in wanted:
            continue
        typ = _TYPES[name]
        if dtype is not None:
            out[name] = pa.array(np.fromiter(col, dtype, len(group)), typ)
        elif col.count(None) == len(col):
            out[name] = None
        else:
            out[name] = pa.array(conv(col) if conv else col, typ)
    return out


def _json_of(kind: _Kind, group: list[Any]) -> pa.Array:
    """The records' JSON as the strict path writes it (``{"type": name, "version": v, ...}``):
    msgspec writes them as lines (a newline never occurs inside JSON) after a copy of the first,
    so that every record's value can start at the newline before it, without copying the
    lines; that newline and the tag msgspec writes are then replaced by the name."""
    data = _json_lines([group[0], *group])
    newlines = np.flatnonzero(np.frombuffer(data, np.uint8) == 10)
    if len(newlines) != len(group) + 1 or len(data) > _I32_MAX:
        raise RuntimeError(f"{kind.name}: JSON lines do not match the records")
    lines = pa.StringArray.from_buffers(
        len(group), pa.py_buffer(newlines.astype(np.int32)), pa.py_buffer(data)
    )
    return pc.binary_replace_slice(lines, 0, kind.json_cut, kind.json_name)


def _strict_frame(
    out: Builder, source: str, frame: Frame, size: int, expected: int | None, lo: int, hi: int
) -> int | None:
    """Rows of one frame exactly as the strict decoder gives them; returns the offset the next
    frame should start at (None: unknown)."""
    if frame.payload is None:
        detail = f"frame at byte {frame.position} runs past the end of the file ({size} bytes)"
        out.add_problem(
            {
                "source": source,
                "source_kind": "log",
                "position": frame.position,
                "crc_ok": True,
                "problem": f"{TORN}: {detail}",
                "offset": expected,
            }
        )
        return expected
    try:
        batch = decode_batch(frame.payload)
    except RecordDecodeError as e:
        batch, err = None, str(e)
    if batch is None:
        detail = (
            f"{CRC}: frame of {frame.end - frame.position - 8} bytes"
            if not frame.crc_ok
            else f"{DECODE}: {err}"
        )
        out.add_problem(
            {
                "source": source,
                "source_kind": "log",
                "position": frame.position,
                "crc_ok": frame.crc_ok,
                "problem": detail,
                "offset": expected,
            }
        )
        return None
    if not (batch.last_offset < lo or batch.base_offset > hi):
        digest = batch.digest if frame.crc_ok else batch_hash(batch.encode())
        meta = batch_meta(
            source,
            "log",
            frame.position,
            batch,
            digest,
            frame.crc_ok,
            None if frame.crc_ok else "crc",
        )
        base = batch.base_offset
        records = list(enumerate(batch.records))
        if base < lo or batch.last_offset > hi:
            records = [(i, r) for i, r in records if lo <= base + i <= hi]
        out.add_batch(meta, base, records)
    return batch.next_offset


def decode_segment_fast(
    path: str | Path,
    from_offset: int | None = None,
    to_offset: int | None = None,
    rows_per_batch: int = 65536,
    columns: Sequence[str] | None = None,
) -> Iterator[pa.RecordBatch]:
    """Arrow batches of every record in one segment with ``from <= offset <= to``: the same rows
    (and the same problem rows for damaged frames) as :func:`columns.decode_segment`.
    ``columns``: only these columns, in this order (default: the whole table)."""
    want = _Columns(columns)
    retain_memory()
    path = Path(path)
    source = path.name
    lo = -1 if from_offset is None else from_offset
    hi = _HI if to_offset is None else to_offset
    try:
        data = path.read_bytes()
    except OSError as e:
        out = Builder()
        out.add_problem(
            {
                "source": source,
                "source_kind": "log",
                "position": 0,
                "crc_ok": True,
                "problem": f"{IO}: {e}",
                "offset": None,
            }
        )
        yield want.project(out.flush())
        return
    size = len(data)
    chunk = _Chunk(source, want)
    expected: int | None = None
    gc_was = gc.isenabled()
    gc.disable()  # millions of small containers: the cyclic GC would rescan them all
    try:
        for frame in frames_resync(data):
            payload = frame.payload if frame.crc_ok else None
            batch = decode_canonical(payload) if payload is not None else None
            if batch is None or payload is None:
                if chunk.rows:
                    yield chunk.build()
                    chunk = _Chunk(source, want)
                out = Builder()
                expected = _strict_frame(out, source, frame, size, expected, lo, hi)
                if out.rows:
                    yield want.project(out.flush())
                continue
            base = batch.base_offset
            expected = base + len(batch.records)
            first = max(lo - base, 0)
            chunk.add(
                frame.position,
                batch_hash(payload),
                batch,
                first,
                max(min(hi, expected - 1) - base + 1 - first, 0),
            )
            if chunk.rows >= rows_per_batch:
                yield chunk.build()
                chunk = _Chunk(source, want)
        if chunk.rows:
            yield chunk.build()
    finally:
        if gc_was:
            gc.enable()
