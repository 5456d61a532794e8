"""``kraft audit``: replay a metadata log in Spark and check it (see tools/audit)."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from tools.commands.common import ManualFormatter, UsageError

if TYPE_CHECKING:  # imported when used: the audit's modules load Spark's Python side
    from tools.audit.run import AuditOptions

DESCRIPTION = """\
Audit a metadata log directory with Spark: every record as a row (offset, term, time,
provenance: principal, client id, request id, API, reason; hashes; the record's fields),
derived tables (partition history with election type and reason, broker history and fenced
intervals, topic lifecycle with config old -> new values, under-replicated/offline intervals,
who changed what), named checks with severities (offsets, CRCs, hash chain, terms, leader in
ISR, epochs, fenced leaders, unclean elections, broker epochs, deleted topics, snapshots
against the log), and a self-contained HTML report.

Writes OUT/report.html, OUT/findings.json, OUT/tables/<table>/ (Parquet), OUT/spark.log
(Spark's own output) and OUT/mirror/ (Parquet copy of sealed segments, so re-auditing a
grown log only decodes the new segments). Runs on local[*] unless --master says otherwise;
see README "Auditing the metadata log" for spark-submit.

--from/--to take an offset (123) or a UTC time (2026-11-22T10:00:00Z). History before
--from is still replayed; tables and findings show rows from --from on. Segments after --to
are not read."""

EPILOG = """\
examples:
  kraft audit --log-dir ./c/controller-1/metadata/log --out ./audit
  kraft audit --log-dir LOG --out ./audit --from 1000 --to 5000
  kraft audit --log-dir LOG --out ./audit --to 2026-11-22T10:30:00Z --state-at 4200
  kraft audit --log-dir LOG --out ./audit --master spark://host:7077
  kraft audit --log-dir ./c/controller-1/metadata/log --log-dir ./c/controller-2/metadata/log \
      --log-dir ./c/controller-3/metadata/log --out ./audit

A damaged log (torn, truncated, edited or forged segments, snapshots or index files) never
ends in a traceback: each break is a finding (check, file, byte position, offset) and the
report and findings.json are still written. findings.json records the head this audit
verified (offset and hash); the next audit into the same OUT fails if the history up to it
changed. With several --log-dir (one per controller) their chains are compared.

exit status: 0 every error-severity check passed, 1 a check failed (or Spark failed),
2 bad arguments or no log in --log-dir."""


def parse_point(text: str, option: str) -> tuple[str, int]:
    """``("offset", n)`` or ``("time", epoch ms)`` from an offset or an ISO-8601 UTC time."""
    t = text.strip()
    if t.isdigit():
        return "offset", int(t)
    try:
        when = datetime.fromisoformat(t.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise UsageError(
            f"{option} must be an offset (e.g. 1200) or a time "
            f"(e.g. 2026-11-22T10:00:00Z), got {text!r}"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return "time", int(when.timestamp() * 1000)


def build_options(args: argparse.Namespace) -> AuditOptions:
    """The AuditOptions for parsed arguments (UsageError on bad values)."""
    from tools.audit.run import AuditOptions

    dirs = [Path(d) for d in args.log_dir]
    opts = AuditOptions(
        log_dir=dirs[0],
        witnesses=dirs[1:],
        previous=Path(args.previous) if args.previous else None,
        out=Path(args.out),
        master=args.master or None,
        mirror=Path(args.mirror) if args.mirror else None,
    )
    for option, value, offset_attr, ms_attr in (
        ("--from", args.start, "from_offset", "from_ms"),
        ("--to", args.end, "to_offset", "to_ms"),
        ("--state-at", args.state_at, "state_at_offset", "state_at_ms"),
    ):
        if value is not None:
            kind, n = parse_point(value, option)
            setattr(opts, offset_attr if kind == "offset" else ms_attr, n)
    return opts


def cmd_audit(args: argparse.Namespace) -> int:
    try:
        from tools.audit.run import AuditError, run_audit
    except ImportError as e:
        raise UsageError(
            f"kraft audit needs the spark extra: pip install -e '.[spark]' ({e})"
        ) from e
    opts = build_options(args)
    progress = (
        (lambda line: print(line, file=sys.stderr, flush=True))
        if args.json
        else (lambda line: print(line, flush=True))
    )
    try:
        result = run_audit(opts, progress=progress)
    except AuditError as e:
        raise UsageError(str(e)) from None
    if args.json:
        print(json.dumps(result.findings, indent=1, default=str))
    return result.exit_code


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``kraft audit``."""
    p = sub.add_parser(
        "audit",
        help="audit a metadata log with Spark (tables, checks, report)",
        formatter_class=ManualFormatter,
        description=DESCRIPTION,
        epilog=EPILOG,
    )
    p.add_argument(
        "--log-dir",
        required=True,
        action="append",
        metavar="DIR",
        help="a metadata log directory (segments, snapshots), e.g. "
        "CLUSTER/controller-1/metadata/log; give it once per controller: the first is "
        "audited, the others are witnesses its chain must agree with",
    )
    p.add_argument(
        "--previous",
        metavar="FINDINGS",
        help="an earlier audit's findings.json: fail if the history up to the head it "
        "verified changed (default: OUT/findings.json when it audited the same directory)",
    )
    p.add_argument("--out", required=True, metavar="OUT", help="output directory")
    p.add_argument("--from", dest="start", metavar="OFFSET|TIME", help="first offset or time shown")
    p.add_argument("--to", dest="end", metavar="OFFSET|TIME", help="last offset or time read")
    p.add_argument(
        "--state-at",
        metavar="OFFSET|TIME",
        help="also write OUT/state.json: the image rebuilt at this point "
        "(its 'approximate' says so when a gap before it could not be replayed exactly)",
    )
    p.add_argument(
        "--master",
        default="local[*]",
        metavar="URL",
        help="Spark master (default local[*]; '' = whatever spark-submit set)",
    )
    p.add_argument("--mirror", metavar="DIR", help="Parquet mirror directory (default OUT/mirror)")
    p.add_argument(
        "--json",
        action="store_true",
        help="print findings.json on stdout (progress goes to stderr)",
    )
    p.set_defaults(handler=cmd_audit)
