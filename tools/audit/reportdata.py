"""The report's small aggregates, read from the Parquet tables the audit wrote: pyarrow on the
driver, no Spark job (each chart was a Spark query of its own, mostly planning and scheduling).

Values are what Spark's ``collect`` gave, but timestamps are UTC datetimes whatever the
machine's time zone (PySpark's would be local time), times in ms are ``unix_millis``. Where Spark's order had ties (its
``orderBy ... limit`` picked among them by scan order) the rows are ordered by more columns.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from tools.audit import localtable

LEADER_TOP, ISR_TOP, POINTS = 30, 12, 400
BUCKETS = 60


def _first(key: Any) -> tuple[Any, ...]:
    """A sort key putting None first (Spark's ascending order)."""
    return (key is not None, key)


def _micros(col: pa.ChunkedArray) -> list[int | None]:
    values: list[int | None] = (
        pc.cast(col, pa.timestamp("us"), safe=False).cast(pa.int64()).to_pylist()
    )
    return values


def _datetime(us: int | None) -> datetime | None:
    """A timestamp as a UTC datetime (never the machine's local time)."""
    if us is None:
        return None
    return datetime.fromtimestamp(us // 1_000_000, UTC).replace(microsecond=us % 1_000_000)


def _pylist(
    table: pa.Table | None, millis: Iterable[str] = (), times: Iterable[str] = ()
) -> list[dict[str, Any]]:
    """``table``'s rows as dicts; ``millis`` timestamp columns as ms (``unix_millis``),
    ``times`` as datetimes."""
    if table is None:
        return []
    data: dict[str, list[Any]] = {}
    for name in table.column_names:
        col = table.column(name)
        if name in millis:
            data[name] = [None if v is None else v // 1000 for v in _micros(col)]
        elif name in times:
            data[name] = [_datetime(v) for v in _micros(col)]
        else:
            data[name] = col.to_pylist()
    return [dict(zip(data, vals)) for vals in zip(*data.values())]


def rows(
    path: Path,
    columns: Iterable[str],
    filter: ds.Expression | None = None,
    millis: Iterable[str] = (),
    times: Iterable[str] = (),
) -> list[dict[str, Any]]:
    """Table ``path``'s ``columns`` (rows matching ``filter``) as dicts (see :func:`_pylist`)."""
    return _pylist(localtable.read(path, columns, filter), millis, times)


def top_partitions(
    seeds: pa.Table | None, names: dict[str, str | None], events: str, n: int
) -> list[tuple[str, int]]:
    """The ``n`` (topic name, partition) with the most ``events`` (summed over topic ids of
    the same name), most first, then by name and partition; unnamed ones are left out (they
    match no history row by name). ``seeds``: one row per partition (``topic_id``,
    ``partition_id``, the event counts), aggregated by Arrow: no Python object per partition."""
    if seeds is None or seeds.num_rows == 0:
        return []
    ids = pa.array(list(names), pa.string())
    named = pa.array(list(names.values()), pa.string()).take(
        pc.index_in(seeds.column("topic_id"), value_set=ids)
    )
    counts = (
        pa.table(
            {
                "name": named,
                "partition_id": seeds.column("partition_id"),
                "n": pc.fill_null(seeds.column(events), 0),
            }
        )
        .group_by(["name", "partition_id"])
        .aggregate([("n", "sum")])
    )
    order = pc.sort_indices(
        counts,
        sort_keys=[
            ("n_sum", "descending", "at_start"),
            ("name", "ascending", "at_start"),
            ("partition_id", "ascending", "at_start"),
        ],
    )
    ranked = counts.take(order[:n])
    return [
        (name, pid)
        for name, pid in zip(
            ranked.column("name").to_pylist(), ranked.column("partition_id").to_pylist()
        )
        if name is not None
    ]


def charts(
    tables: Path, seeds: pa.Table | None, names: dict[str, str | None]
) -> list[dict[str, Any]]:
    """Each top partition's first :data:`POINTS` history rows by offset: kind ``leader`` (the
    :data:`LEADER_TOP` with most leader changes; creations and leader changes), ``isr`` (the
    :data:`ISR_TOP` with most ISR changes; creations and ISR changes)."""
    tops = {
        "leader": top_partitions(seeds, names, "leader_events", LEADER_TOP),
        "isr": top_partitions(seeds, names, "isr_events", ISR_TOP),
    }
    wanted = sorted({name for keys in tops.values() for name, _ in keys})
    if not wanted:
        return []
    history = rows(
        tables / "partition_history",
        (
            "topic_name",
            "partition_id",
            "offset",
            "ts",
            "leader",
            "isr_size",
            "change",
            "leader_changed",
        ),
        ds.field("topic_name").isin(wanted),
        millis=("ts",),
    )
    history.sort(key=lambda r: _first(r["offset"]))
    out = []
    for kind, keys in tops.items():
        keep = set(keys)
        taken: dict[tuple[Any, ...], int] = {}
        for r in history:
            key = (r["topic_name"], r["partition_id"])
            if key not in keep:
                continue
            created = r["change"] == "created"
            if not (created or (r["leader_changed"] if kind == "leader" else "isr" in r["change"])):
                continue
            taken[key] = taken.get(key, 0) + 1
            if taken[key] <= POINTS:
                out.append(
                    {
                        "kind": kind,
                        "topic_name": key[0],
                        "partition_id": key[1],
                        "offset": r["offset"],
                        "t": r["ts"],
                        "leader": r["leader"],
                        "isr_size": r["isr_size"],
                    }
                )
    return out


def volume(vol: list[dict[str, Any]], t0: int, t1: int) -> list[dict[str, Any]]:
    """Records per (time bucket of :data:`BUCKETS` over ``t0``..``t1``, record type)."""
    span = max(t1 - t0, 1)
    out: dict[tuple[Any, ...], int] = {}
    for r in vol:
        b = min(math.floor(float((r["timestamp_ms"] - t0) * BUCKETS) / float(span)), BUCKETS - 1)
        out[(b, r["record_type"])] = out.get((b, r["record_type"]), 0) + r["count"]
    return [{"b": b, "record_type": t, "count": c} for (b, t), c in out.items()]


def principals(who: list[dict[str, Any]], n: int = 20) -> list[dict[str, Any]]:
    """Records per (principal, API), the ``n`` largest."""
    sums: dict[tuple[Any, ...], int] = {}
    for r in who:
        key = (r["principal"], r["api"])
        sums[key] = sums.get(key, 0) + (r["records"] or 0)
    ranked = sorted(sums.items(), key=lambda kv: (-kv[1], _first(kv[0][0]), _first(kv[0][1])))
    return [{"principal": p, "api": a, "n": c} for (p, a), c in ranked[:n]]


def count(path: Path) -> int:
    """The rows of table ``path``."""
    return localtable.count(path)


def ordered(
    path: Path,
    columns: Iterable[str],
    by: list[tuple[str, str]],
    n: int,
    millis: Iterable[str] = (),
    times: Iterable[str] = (),
) -> list[dict[str, Any]]:
    """The first ``n`` rows of table ``path`` ordered ``by`` (column, "ascending" /
    "descending"; nulls first when ascending, last when descending, as Spark). The table is
    read a batch at a time, keeping the first ``n`` so far: the driver holds ``n`` rows and a
    batch, not the table (the sort is stable, so ties keep the table's order)."""
    keys = [(col, way, "at_end" if way == "descending" else "at_start") for col, way in by]
    kept: pa.Table | None = None
    for batch in localtable.batches(path, columns):
        t = pa.Table.from_batches([batch])
        if kept is not None:
            t = pa.concat_tables([kept, t])
        kept = t.take(pc.sort_indices(t, sort_keys=keys)[:n])
    return _pylist(kept, millis, times)  # (None: no files, no rows)
