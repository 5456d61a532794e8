"""Text and JSON views of metadata log entries, shared by ``kraft log dump`` and ``kraft shell``.

The JSON objects are the ``--json`` lines of ``kraft log dump``; ``render_item`` is their text.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kraft.records import Batch, Record, record_to_json
from tools import output
from tools.log_history import iso_time


def record_item(
    batch: Batch,
    i: int,
    record: Record,
    path: Path | None = None,
    position: int = -1,
    damaged: bool = False,
) -> dict[str, Any]:
    """The JSON view of record ``i`` of ``batch`` (``kind: record``); ``file`` is None and
    ``position`` -1 for records that did not come from a local file."""
    return {
        "kind": "record",
        "offset": batch.base_offset + i,
        "batch_offset": batch.base_offset,
        "term": batch.term,
        "raft_index": batch.raft_index,
        "timestamp_ms": batch.timestamp_ms,
        "time": iso_time(batch.timestamp_ms),
        "file": str(path) if path is not None else None,
        "position": position,
        "provenance": batch.provenance.to_dict(),
        "record": record_to_json(record),
        "damaged": damaged,
    }


def _fields(record: dict[str, Any]) -> str:
    return " ".join(
        f"{k}={output.cell(v) if isinstance(v, (list, dict)) else v}"
        for k, v in record.items()
        if k not in ("type", "version")
    )


def render_item(item: dict[str, Any]) -> str:
    """The text line of one dump object."""
    kind = item["kind"]
    if kind == "record":
        p = item["provenance"]
        who = p["principal"] + (f"/{p['client_id']}" if p["client_id"] else "")
        mark = " DAMAGED" if item["damaged"] else ""
        return (
            f"offset {item['offset']} term {item['term']} {item['time']} {who} {p['api']} "
            f"({p['reason']}){mark}: {item['record']['type']} {_fields(item['record'])}"
        ).rstrip()
    if kind == "problem":
        return f"PROBLEM: {item['message']}"
    if kind == "snapshot":
        return (
            f"snapshot {Path(item['file']).name}: end offset {item['end_offset']}, term "
            f"{item['term']}, {item['time']}, {item['record_count']} records, image checksum "
            f"{item['image_checksum']}"
        )
    if kind == "snapshot_record":
        return f"#{item['index']} {item['record']['type']} {_fields(item['record'])}".rstrip()
    span = (
        f"offsets {item['first_offset']}..{item['last_offset']}"
        if item["first_offset"] is not None
        else "no batches"
    )
    verdict = (
        "all CRCs and the hash chain verified"
        if not item["problems"]
        else f"{item['problems']} PROBLEM(S)"
    )
    snaps = (
        f"\n-- snapshots here (dump one by its path): {', '.join(item['snapshots'])}"
        if item["snapshots"]
        else ""
    )
    return (
        f"-- {item['records']} records in {item['batches']} batches ({span}) from "
        f"{len(item['files'])} file(s): {verdict}{snaps}"
    )
