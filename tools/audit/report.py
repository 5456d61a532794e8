"""The self-contained HTML report: inline SVG charts and tables, no scripts, no external files.

:func:`render` takes the small, already-aggregated ``data`` dict built by :mod:`tools.audit.run`
(nothing here touches Spark) and returns the page.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, cast

PALETTE = (
    "#4e79a7",
    "#f28e2b",
    "#59a14f",
    "#b07aa1",
    "#76b7b2",
    "#edc948",
    "#9c755f",
    "#bab0ac",
    "#ff9da7",
    "#86bcb6",
)
OFFLINE = "#e15759"
BROKER_STATE_COLORS = {"fenced": OFFLINE, "unfenced": "#59a14f", "unregistered": "#bbb"}
WIDTH, LABEL_W, ROW_H = 960, 150, 18

CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px auto;max-width:1000px;color:#222}
h1{font-size:22px}h2{font-size:17px;margin-top:32px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:12px;margin:8px 0}td,th{border:1px solid #ddd;padding:3px 6px;text-align:left}
th{background:#f4f4f4}.pass{color:#2e7d32}.error{color:#c62828;font-weight:600}.warning{color:#b26a00;font-weight:600}
.kv td:first-child{color:#666}.legend span{display:inline-block;margin-right:12px}
.legend i{display:inline-block;width:11px;height:11px;margin-right:4px;vertical-align:-1px}
svg text{font:11px system-ui,sans-serif;fill:#333}
"""


def _e(v: Any) -> str:
    return html.escape("" if v is None else str(v))


def _time(ms: int | None) -> str:
    if ms is None:
        return ""
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _color(key: Any, keys: Sequence[Any] | Mapping[Any, str]) -> str:
    if isinstance(keys, dict):
        return cast(str, keys.get(key, "#999"))
    if key is None or key == -1:
        return OFFLINE
    return PALETTE[list(keys).index(key) % len(PALETTE)] if key in keys else "#999"


class _Scale:
    def __init__(self, t0: int, t1: int, x0: float = LABEL_W, x1: float = WIDTH - 10) -> None:
        self.t0, self.t1, self.x0, self.x1 = t0, max(t1, t0 + 1), x0, x1

    def __call__(self, t: int) -> float:
        return self.x0 + (t - self.t0) * (self.x1 - self.x0) / (self.t1 - self.t0)


def _axis(scale: _Scale, y: float) -> str:
    out = [f'<line x1="{scale.x0}" y1="{y}" x2="{scale.x1}" y2="{y}" stroke="#999"/>']
    for i in range(5):
        t = scale.t0 + (scale.t1 - scale.t0) * i // 4
        x = scale(t)
        out.append(
            f'<line x1="{x:.1f}" y1="{y}" x2="{x:.1f}" y2="{y + 4}" stroke="#999"/>'
            f'<text x="{x:.1f}" y="{y + 15}" text-anchor="middle">{_time(t)[11:]}</text>'
        )
    out.append(f'<text x="{scale.x0 - 6}" y="{y + 15}" text-anchor="end">UTC</text>')
    return "".join(out)


def _legend(items: Iterable[tuple[str, str]]) -> str:
    return (
        '<div class="legend">'
        + "".join(f'<span><i style="background:{c}"></i>{_e(label)}</span>' for label, c in items)
        + "</div>"
    )


def _markers(scale: _Scale, markers: Sequence[dict[str, Any]], top: float, bottom: float) -> str:
    """A dashed vertical line per controller change, labelled with its term and reason."""
    out = []
    for i, m in enumerate(markers):
        x = scale(m["timestamp_ms"])
        label = f"term {m['term']}: {m['reason']}"
        out.append(
            f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{bottom}" stroke="#6a3d9a" '
            f'stroke-dasharray="4 3" stroke-width="1.5"><title>{_e(label)} at '
            f"{_time(m['timestamp_ms'])} UTC (offset {m['offset']})</title></line>"
            f'<text x="{x + 3:.1f}" y="{top + 10 + 11 * (i % 3)}" fill="#6a3d9a">'
            f"{_e(label)}</text>"
        )
    return "".join(out)


def interval_chart(
    rows: dict[str, list[tuple[int, int, Any]]],
    t0: int,
    t1: int,
    keys: Sequence[Any] | Mapping[Any, str],
    title: str,
    markers: Sequence[dict[str, Any]] = (),
) -> str:
    """One row per label; each ``(start_ms, end_ms, key)`` is a bar coloured by key;
    ``markers``: controller changes drawn across every row."""
    if not rows:
        return "<p>No data.</p>"
    scale = _Scale(t0, t1)
    top = 36 if markers else 0
    height = len(rows) * ROW_H + 30 + top
    out = [f'<svg width="{WIDTH}" height="{height}" role="img" aria-label="{_e(title)}">']
    out.append(f'<g transform="translate(0,{top})">')
    for i, (label, spans) in enumerate(rows.items()):
        y = i * ROW_H
        out.append(f'<text x="{LABEL_W - 6}" y="{y + 13}" text-anchor="end">{_e(label)}</text>')
        for start, end, key in spans:
            x, x2 = scale(start), scale(max(end, start))
            out.append(
                f'<rect x="{x:.1f}" y="{y + 2}" width="{max(x2 - x, 1.5):.1f}" '
                f'height="{ROW_H - 4}" fill="{_color(key, keys)}">'
                f"<title>{_e(label)}: {_e(key)} {_time(start)} → {_time(end)}</title></rect>"
            )
    out.append(_axis(scale, len(rows) * ROW_H + 4))
    out.append("</g>")
    out.append(_markers(scale, markers, 0, top + len(rows) * ROW_H))
    out.append("</svg>")
    return "".join(out)


def step_chart(series: dict[str, list[tuple[int, int]]], t0: int, t1: int, title: str) -> str:
    """Small multiples: one step line per label of ``(time_ms, value)`` points."""
    if not series:
        return "<p>No data.</p>"
    scale = _Scale(t0, t1)
    band = 34
    vmax = max(max(v for _, v in pts) for pts in series.values()) or 1
    out = [
        f'<svg width="{WIDTH}" height="{len(series) * band + 30}" role="img" '
        f'aria-label="{_e(title)}">'
    ]
    for i, (label, pts) in enumerate(series.items()):
        base = i * band + band - 6
        out.append(
            f'<text x="{LABEL_W - 6}" y="{base - 8}" text-anchor="end">{_e(label)}</text>'
            f'<line x1="{LABEL_W}" y1="{base}" x2="{WIDTH - 10}" y2="{base}" stroke="#eee"/>'
        )
        path, last_y = [], None
        for t, v in pts:
            x, y = scale(t), base - (band - 10) * v / vmax
            path.append(f"M{x:.1f},{y:.1f}" if last_y is None else f"H{x:.1f}V{y:.1f}")
            last_y = y
        if path:
            path.append(f"H{WIDTH - 10}")
            out.append(
                f'<path d="{"".join(path)}" fill="none" stroke="#4e79a7" stroke-width="1.5">'
                f"<title>{_e(label)}: ISR size (max {vmax})</title></path>"
            )
    out.append(_axis(scale, len(series) * band + 4))
    out.append("</svg>")
    return "".join(out)


def stacked_bars(
    buckets: list[tuple[int, dict[str, int]]], keys: Sequence[str], t0: int, t1: int, title: str
) -> str:
    """Counts per time bucket, stacked by key."""
    if not buckets:
        return "<p>No data.</p>"
    scale = _Scale(t0, t1, 50)
    h = 180
    top = max(sum(c.values()) for _, c in buckets) or 1
    width = max((scale.x1 - scale.x0) / max(len(buckets), 1) - 1, 1)
    out = [
        f'<svg width="{WIDTH}" height="{h + 30}" role="img" aria-label="{_e(title)}">',
        f'<text x="44" y="12" text-anchor="end">{top}</text><text x="44" y="{h}" '
        f'text-anchor="end">0</text>',
    ]
    for start, counts in buckets:
        x, y = scale(start), float(h)
        for k in keys:
            n = counts.get(k, 0)
            if n:
                bh = h * n / top
                y -= bh
                out.append(
                    f'<rect x="{x:.1f}" y="{y:.1f}" width="{width:.1f}" height="{bh:.1f}" '
                    f'fill="{_color(k, keys)}"><title>{_e(k)}: {n} at {_time(start)}'
                    f"</title></rect>"
                )
    out.append(_axis(scale, h + 2))
    out.append("</svg>")
    return "".join(out) + _legend((k, _color(k, keys)) for k in keys)


def hbars(rows: list[tuple[str, int]], title: str) -> str:
    """Horizontal bars: label → count."""
    if not rows:
        return "<p>No data.</p>"
    top = max(n for _, n in rows) or 1
    lw = 320
    out = [
        f'<svg width="{WIDTH}" height="{len(rows) * ROW_H + 4}" role="img" aria-label="{_e(title)}">'
    ]
    for i, (label, n) in enumerate(rows):
        y = i * ROW_H
        w = (WIDTH - lw - 80) * n / top
        out.append(
            f'<text x="{lw - 6}" y="{y + 13}" text-anchor="end">{_e(label)}</text>'
            f'<rect x="{lw}" y="{y + 2}" width="{max(w, 1):.1f}" height="{ROW_H - 4}" '
            f'fill="{PALETTE[0]}"/><text x="{lw + w + 4:.1f}" y="{y + 13}">{n}</text>'
        )
    out.append("</svg>")
    return "".join(out)


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in r) + "</tr>" for r in rows)
    return (
        "<table><tr>" + "".join(f"<th>{_e(h)}</th>" for h in headers) + "</tr>" + body + "</table>"
    )


def _shown(data: dict[str, Any], name: str) -> str:
    """ "showing N of M" under a cut table, with a link to the whole table as CSV."""
    t = data.get("totals", {}).get(name)
    if not t or t["total"] <= t["shown"]:
        return ""
    return (
        f"<p>Showing {t['shown']:,} of {t['total']:,} rows; the whole table: "
        f"<a href='{_e(t['csv'])}'>{_e(t['csv'])}</a> (CSV, times in UTC).</p>"
    )


def _root_causes(causes: Sequence[dict[str, Any]]) -> list[str]:
    if not causes:
        return []
    rows = []
    for c in causes:
        where = c.get("file") or ""
        if c.get("position") is not None:
            where += f" byte {c['position']}"
        then = ", ".join(f"{rule}: {n}" for rule, n in (c.get("consequences") or {}).items())
        detail = c["detail"] + "".join(
            f"; the replay went on {g['resumed']}" for g in c.get("replay") or ()
        )
        rows.append((c["severity"], c["rule"], where, c.get("offset"), detail, then))
    return [
        "<h2>Root causes</h2><p>Damage, gaps and forgeries found in the log's files, first. "
        "The safety findings after a damaged or missing stretch were checked on a state that "
        "misses its changes: they are counted here as its consequences.</p>",
        table(("severity", "check", "file / position", "offset", "detail", "consequences"), rows),
    ]


def _end_state(end: dict[str, Any] | None) -> list[str]:
    if not end:
        return ["<h2>End state</h2><p>The log could not be replayed to its end.</p>"]
    parts = [
        "<h2>End state</h2>",
        f"<p>At offset {end['offset']} ({_time(end['timestamp_ms'])} UTC): "
        f"{end['offline_count']} offline partition(s), {end['under_replicated_count']} "
        f"under-replicated, fenced brokers: {', '.join(map(str, end['fenced_brokers'])) or 'none'}"
        f" (of {end['brokers']}).</p>",
    ]
    if end.get("approximate"):
        parts.append(f"<p class='error'>Not exact: {_e(end['approximate'])}.</p>")
    for key, title in (("offline", "Offline"), ("under_replicated", "Under-replicated")):
        rows = end[key]
        if rows:
            parts.append(f"<h3>{title} at the end ({end[key + '_count']})</h3>")
            parts.append(
                table(
                    ("partition", "leader", "ISR", "replicas"),
                    [(r["partition"], r["leader"], r["isr"], r["replicas"]) for r in rows],
                )
            )
    return parts


def render(data: dict[str, Any]) -> str:
    """The whole report page."""
    m = data["meta"]
    t0, t1 = m.get("first_ms") or 0, m.get("last_ms") or 1
    findings = data["findings"]
    failed = [f for f in findings if f["count"]]
    status = (
        "FAILED" if any(f["severity"] == "error" and f["errors"] for f in findings) else "PASSED"
    )
    brokers = data["broker_keys"]
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>kraft audit — {_e(m['log_dir'])}</title><style>{CSS}</style></head><body>",
        f"<h1>Metadata log audit: <span class='{'error' if status == 'FAILED' else 'pass'}'>"
        f"{status}</span></h1>",
        table(
            ("", ""),
            [
                ("log directory", m["log_dir"]),
                ("records", m["records"]),
                ("batches", m["batches"]),
                ("segments", m["segments"]),
                ("offsets", f"{m.get('first_offset')} … {m.get('last_offset')}"),
                ("time", f"{_time(m.get('first_ms'))} … {_time(m.get('last_ms'))} UTC"),
                (
                    "head verified",
                    f"offset {data['head']['offset']}, hash {data['head']['hash'][:16]}…"
                    if data.get("head")
                    else "none",
                ),
                ("generated", m["generated"]),
                ("audit took", f"{m['elapsed_s']:.1f} s"),
            ],
        ),
        *_root_causes(data.get("root_causes", [])),
        *_end_state(data.get("end_state")),
        "<h2>Checks</h2>",
        table(
            (
                "rule",
                "severity",
                "violations",
                "of them consequences",
                "what it checks",
                "first offending offsets",
            ),
            [
                (
                    f["rule"],
                    f["severity"] if f["count"] else "pass",
                    f["count"],
                    f.get("consequences", 0),
                    f["description"],
                    ", ".join(str(s["offset"]) for s in f["samples"][:8]),
                )
                for f in findings
            ],
        ),
    ]
    for f in failed:
        parts.append(
            f"<h3 class='{_e(f['severity'])}'>{_e(f['rule'])}: {f['count']} violation(s)</h3>"
        )
        parts.append(
            table(
                ("severity", "offset", "detail"),
                [(s["severity"], s["offset"], s["detail"]) for s in f["samples"]],
            )
        )
    parts += [
        "<h2>Leadership timeline</h2><p>Leader of each partition over time (up to 30 partitions, "
        "those with the most leader changes; red = no leader; dashed lines: controller "
        "changes, with the new term and the reason).</p>",
        interval_chart(
            data["leadership"],
            t0,
            t1,
            brokers,
            "leadership timeline",
            data.get("controller_changes", []),
        ),
        _legend([(f"broker {b}", _color(b, brokers)) for b in brokers] + [("offline", OFFLINE)]),
        "<h2>Broker states</h2><p>Fenced (red), unfenced (green), unregistered (grey).</p>",
        interval_chart(
            data["broker_states"],
            t0,
            t1,
            BROKER_STATE_COLORS,
            "broker states",
            data.get("controller_changes", []),
        ),
        "<h2>ISR size over time</h2>",
        step_chart(data["isr"], t0, t1, "ISR size"),
        "<h2>Change volume by record type</h2>",
        stacked_bars(data["volume"], data["record_types"], t0, t1, "change volume"),
        "<h2>Changes by principal / API</h2>",
        hbars(data["principals"], "changes by principal"),
        "<h2>Under-replicated and offline intervals</h2>",
        table(
            ("partition", "state", "from (UTC)", "to (UTC)", "seconds", "open", "ISR", "reason"),
            data["replication_intervals"],
        ),
        _shown(data, "replication_intervals"),
        "<h2>Topic lifecycle</h2>",
        table(
            (
                "offset",
                "time (UTC)",
                "topic",
                "event",
                "partitions",
                "config",
                "old",
                "new",
                "principal",
                "reason",
            ),
            data["lifecycle"],
        ),
        _shown(data, "topic_lifecycle"),
        "<h2>Broker history</h2>",
        table(
            ("offset", "time (UTC)", "broker", "epoch", "event", "state", "reason"),
            data["broker_history"],
        ),
        _shown(data, "broker_history"),
        "<h2>Snapshots against the log</h2>",
        table(
            ("snapshot", "offset", "rebuilt checksum", "snapshot checksum", "match"),
            [
                (
                    c["snapshot"],
                    c["offset"],
                    c["rebuilt_checksum"][:16],
                    (c["snapshot_checksum"] or "")[:16] or c.get("error"),
                    c["match"],
                )
                for c in data["snapshots"]
            ],
        )
        if data["snapshots"]
        else "<p>No snapshot in the log directory to compare with.</p>",
        f"<p>Tables (Parquet) in {_e(m['out'])}.</p></body></html>",
    ]
    return "\n".join(parts)
