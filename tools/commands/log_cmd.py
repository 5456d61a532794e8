"""``kraft log dump`` and ``kraft log diff``: read a metadata log directory, segment or snapshot.

``dump`` prints one line per record and verifies every frame CRC and the hash chain, reporting
each break with its file, byte position and offset (exit 1 if any). With ``--json`` every line is
one JSON object whose ``kind`` is ``record``, ``problem``, ``snapshot``, ``snapshot_record`` or
``summary`` (shapes in docs/design.md, "Log tools"). ``diff`` summarises what changed between two
points (see :mod:`tools.log_history`).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kraft.log.errors import CorruptSnapshotError
from kraft.log.snapshot import read_snapshot
from kraft.records import record_to_json
from tools import output
from tools.commands.common import (
    DEFAULT_TIMEOUT_S,
    ManualFormatter,
    UsageError,
    int_at_least,
    positive_float,
    resolve_bootstrap,
    resolve_credentials,
)
from tools.log_format import record_item, render_item
from tools.log_history import Point, diff, iso_time, parse_point, render
from tools.log_reader import (
    History,
    LogReadError,
    is_snapshot_file,
    resolve_log_dir,
    scan_path,
    snapshot_files,
)

# ------------------------------------------------------------------------------ dump


def dump_items(path: str | Path, from_offset: int = 0) -> Iterator[dict[str, Any]]:
    """The ``--json`` objects of ``kraft log dump PATH``, summary last. Raises LogReadError when
    PATH is not a log at all."""
    p = Path(path)
    if is_snapshot_file(p):
        yield from _dump_snapshot(p, from_offset)
        return
    snapshots = [] if p.is_file() else [s.name for s in snapshot_files(resolve_log_dir(p))]
    files: set[str] = set()
    batches = records = problems = 0
    first = last = None
    for item in scan_path(p):
        files.add(item.path.name)
        entry, problem = item.entry, item.problem
        if problem is not None:
            problems += 1
            yield {
                "kind": "problem",
                "problem": problem.kind,
                "file": str(problem.path),
                "position": problem.position,
                "offset": problem.offset,
                "detail": problem.detail,
                "message": str(problem),
            }
        if entry is None or entry.batch is None:
            continue
        batch = entry.batch
        batches += 1
        records += len(batch.records)
        first = batch.base_offset if first is None else first
        last = batch.last_offset
        damaged = problem is not None and problem.kind == "crc"
        for i, record in enumerate(batch.records):
            if batch.base_offset + i >= from_offset:
                yield record_item(batch, i, record, item.path, entry.position, damaged)
    yield {
        "kind": "summary",
        "files": sorted(files),
        "batches": batches,
        "records": records,
        "first_offset": first,
        "last_offset": last,
        "problems": problems,
        "snapshots": snapshots,
    }


def _dump_snapshot(path: Path, from_index: int) -> Iterator[dict[str, Any]]:
    count = 0
    try:
        header, records = read_snapshot(path)
        yield {
            "kind": "snapshot",
            "file": str(path),
            "end_offset": header.end_offset,
            "term": header.term,
            "raft_index": header.raft_index,
            "timestamp_ms": header.timestamp_ms,
            "time": iso_time(header.timestamp_ms),
            "record_count": header.record_count,
            "image_checksum": header.image_checksum,
            "last_hash": header.last_hash.hex(),
        }
        for i, record in enumerate(records):
            count += 1
            if i >= from_index:
                yield {"kind": "snapshot_record", "index": i, "record": record_to_json(record)}
    except CorruptSnapshotError as e:
        yield {
            "kind": "problem",
            "problem": "snapshot",
            "file": str(path),
            "position": e.position,
            "offset": None,
            "detail": e.reason,
            "message": str(e),
        }
        yield {
            "kind": "summary",
            "files": [path.name],
            "batches": 0,
            "records": count,
            "first_offset": None,
            "last_offset": None,
            "problems": 1,
            "snapshots": [],
        }
        return
    yield {
        "kind": "summary",
        "files": [path.name],
        "batches": 0,
        "records": count,
        "first_offset": None,
        "last_offset": header.end_offset - 1,
        "problems": 0,
        "snapshots": [],
    }


def cmd_dump(args: argparse.Namespace) -> int:
    problems = 0
    try:
        for item in dump_items(args.path, args.from_offset):
            print(json.dumps(item) if args.json else render_item(item))
            if item["kind"] == "summary":
                problems = item["problems"]
    except LogReadError as e:
        raise UsageError(str(e)) from None
    return output.EXIT_ERROR if problems else output.EXIT_OK


# ------------------------------------------------------------------------------ diff


def _point(text: str) -> Point:
    try:
        return parse_point(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_source_options(parser: argparse.ArgumentParser) -> None:
    """PATH (offline) or --cluster/--bootstrap-controller (live), and --timeout."""
    parser.add_argument(
        "path",
        nargs="?",
        metavar="PATH",
        help="offline: a metadata log directory (or a controller's metadata "
        "dir), a segment from offset 0, or a snapshot",
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--cluster", metavar="DIR", help="live: a directory made by 'kraft cluster up'"
    )
    where.add_argument(
        "--bootstrap-controller",
        metavar="HOST:PORT[,HOST:PORT]",
        help="live: controller RPC endpoint(s); the log is pulled with FetchMetadata",
    )
    parser.add_argument(
        "--timeout",
        type=positive_float,
        default=DEFAULT_TIMEOUT_S,
        metavar="S",
        help=f"live: give up reading the log after S seconds (default {DEFAULT_TIMEOUT_S:g})",
    )


def load_history(args: argparse.Namespace) -> History | None:
    """The history named by the source options. Bad arguments raise UsageError; a log that
    cannot be read prints ``Error: ...`` and gives None (exit 1)."""
    if args.path and (args.cluster or args.bootstrap_controller):
        raise UsageError(
            "give either PATH (offline) or --cluster/--bootstrap-controller (live), not both"
        )
    bootstrap = None
    if args.path:
        if not Path(args.path).exists():
            raise UsageError(f"{args.path} does not exist")
    else:
        try:
            bootstrap = resolve_bootstrap(args)
        except UsageError as e:
            raise UsageError(f"give a metadata log PATH, or a live cluster: {e}") from None
    try:
        if bootstrap is None:
            return History.load(args.path)
        return History.from_controllers(bootstrap, args.timeout, resolve_credentials(args))
    except LogReadError as e:
        print(f"Error: {e}", file=sys.stderr)
        return None


def cmd_diff(args: argparse.Namespace) -> int:
    history = load_history(args)
    if history is None:
        return output.EXIT_ERROR
    start = args.from_point or parse_point("-1")
    end = args.to_point or parse_point(str(history.last_offset))
    try:
        result = diff(history, start, end)
    except LogReadError as e:
        raise UsageError(str(e)) from None
    if args.json:
        print(output.to_json(result.to_json()))
    else:
        print(render(result))
    return output.EXIT_OK


# ------------------------------------------------------------------------------ parser


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``kraft log dump`` and ``kraft log diff``."""
    p = sub.add_parser(
        "log",
        help="decode, verify and compare the metadata log",
        formatter_class=ManualFormatter,
        description="Read a metadata log offline: a controller's log directory "
        "(or its metadata dir), one segment file, or a snapshot. "
        "Nothing is written; a running controller's directory can be "
        "read while it appends.",
    )
    lsub = p.add_subparsers(dest="log_command", metavar="COMMAND", required=True)
    d = lsub.add_parser(
        "dump",
        help="one line per record; verify CRCs and the hash chain",
        formatter_class=ManualFormatter,
        description="Decode metadata log segments or a snapshot: one line per record with its "
        "offset, Raft term, time, provenance (principal/client, API, reason) and "
        "fields. Every frame CRC and the batch hash chain are verified; each break is "
        "reported with its file, byte position and offset, and the dump continues "
        "past a damaged frame when its length is intact.",
        epilog="examples:\n  kraft log dump ./c/controller-1/metadata/log\n"
        "  kraft log dump ./c/controller-1/metadata/log/00000000000000000000.log --from-offset 100\n"
        "  kraft log dump ./c/controller-1/metadata/log/00000000000000000042-0000000002.checkpoint\n"
        "  kraft log dump ./c/controller-1/metadata --json | jq 'select(.kind==\"problem\")'\n\n"
        '--json: one object per line, "kind" record | problem | snapshot | '
        "snapshot_record | summary.\n\n"
        "exit status: 0 everything verified, 1 a problem was found, 2 PATH is not a "
        "metadata log.",
    )
    d.add_argument("path", metavar="PATH", help="log directory, segment file or .checkpoint")
    d.add_argument(
        "--from-offset",
        type=int_at_least(0),
        default=0,
        metavar="N",
        help="print records from offset N (snapshots: from record index N); "
        "everything is still verified",
    )
    d.add_argument("--json", action="store_true", help="JSON lines")
    d.set_defaults(handler=cmd_dump)

    f = lsub.add_parser(
        "diff",
        help="what changed between two points, with who and why",
        formatter_class=ManualFormatter,
        description="Summarise what changed in the metadata between two points of its history: "
        "topics created and deleted, partitions whose leader, ISR or replicas "
        "changed (with leader epochs and election type), brokers registered, fenced, "
        "unfenced or shut down, configs changed old -> new, controller failovers. "
        "Each change says who asked (principal and client id) and why (API and "
        "reason). A point is an offset (the state after the batch holding it; -1 = "
        "before the first record), epoch milliseconds (13+ digits) or an ISO-8601 "
        "time (no zone = UTC): the state after the last batch written at or before it. "
        "Reads PATH offline, or pulls the log from a live controller.",
        epilog="examples:\n  kraft log diff ./c/controller-1/metadata --from 120 --to 180\n"
        "  kraft log diff ./c/controller-1/metadata --from 2026-11-22T10:00:00Z "
        "--to 2026-11-22T10:05:00Z\n"
        "  kraft log diff ./c/controller-1/metadata --from 1795000000000 --json\n"
        "  kraft log diff --cluster ./c --from 2026-11-22T10:00:00Z\n\n"
        "--from defaults to the start of the history, --to to its end.",
    )
    add_source_options(f)
    f.add_argument(
        "--from",
        dest="from_point",
        type=_point,
        metavar="OFFSET|TIME",
        help="the starting point (default: the beginning)",
    )
    f.add_argument(
        "--to",
        dest="to_point",
        type=_point,
        metavar="OFFSET|TIME",
        help="the end point (default: the latest record)",
    )
    f.add_argument("--json", action="store_true", help="JSON: from, to, summary, changes[]")
    f.set_defaults(handler=cmd_diff)
