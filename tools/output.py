"""Rendering for the ``kraft`` CLI: aligned text tables, key/value blocks, JSON and error lines.

Everything here returns strings (or writes to a given stream) so it can be tested without a
terminal. Cells are formatted by :func:`cell`: ``None`` → ``-``, booleans → ``yes``/``no``,
lists → comma-joined. Numeric columns are right-aligned, the rest left-aligned.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TextIO

from kraft.errors import error_name

EXIT_OK = 0
EXIT_ERROR = 1  # a Kafka error (whole request or any item of a batch)
EXIT_USAGE = 2  # bad arguments


def cell(value: Any) -> str:
    """The text shown in a table cell for ``value``."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (list, tuple)):
        return ",".join(cell(v) for v in value) if value else "-"
    if isinstance(value, Mapping):
        return ",".join(f"{k}={cell(v)}" for k, v in value.items()) if value else "-"
    if isinstance(value, bytes):
        return value.hex()
    return str(value)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def render_table(headers: Sequence[str], rows: Iterable[Sequence[Any]], indent: str = "") -> str:
    """An aligned table: a header line then one line per row (no trailing spaces).

    A column is right-aligned when every non-empty value in it is a number.
    """
    raw_rows = [list(r) for r in rows]
    for r in raw_rows:
        if len(r) != len(headers):
            raise ValueError(f"row has {len(r)} cells, expected {len(headers)}: {r!r}")
    text_rows = [[cell(v) for v in r] for r in raw_rows]
    widths = [len(h) for h in headers]
    for r in text_rows:
        widths = [max(w, len(c)) for w, c in zip(widths, r)]
    numeric = [
        any(_is_number(r[i]) for r in raw_rows)
        and all(_is_number(r[i]) or r[i] is None for r in raw_rows)
        for i in range(len(headers))
    ]

    def line(cells: Sequence[str]) -> str:
        parts = [c.rjust(w) if num else c.ljust(w) for c, w, num in zip(cells, widths, numeric)]
        return (indent + "  ".join(parts)).rstrip()

    return "\n".join([line(list(headers))] + [line(r) for r in text_rows])


def render_kv(pairs: Iterable[tuple[str, Any]], indent: str = "") -> str:
    """``key: value`` lines with the values aligned."""
    items = [(k, cell(v)) for k, v in pairs]
    if not items:
        return ""
    width = max(len(k) for k, _ in items) + 1
    return "\n".join(f"{indent}{(k + ':').ljust(width)} {v}".rstrip() for k, v in items)


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def to_json(value: Any) -> str:
    """Pretty JSON for ``--json`` output (bytes as hex, map keys as strings)."""
    return json.dumps(value, indent=2, default=_json_default)


def error_line(code: int, message: str) -> str:
    """``Error: NAME: sentence`` — the human error line printed on stderr."""
    name = error_name(code)
    return f"Error: {name}: {message}" if message else f"Error: {name}"


def error_object(code: int, message: str) -> dict[str, Any]:
    """The ``--json`` error document: ``{"error", "error_code", "message"}``."""
    return {"error": error_name(code), "error_code": int(code), "message": message or ""}


def report_error(
    code: int, message: str, as_json: bool, out: TextIO | None = None, err: TextIO | None = None
) -> None:
    """Print a whole-request error: JSON on stdout when ``as_json``, the error line on stderr."""
    out = out or sys.stdout
    err = err or sys.stderr
    if as_json:
        print(to_json(error_object(code, message)), file=out)
    print(error_line(code, message), file=err)


def annotate_errors(items: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Copies of per-item result maps with an ``error`` name next to each ``error_code``."""
    out = []
    for item in items:
        item = dict(item)
        if "error_code" in item:
            item["error"] = error_name(item["error_code"] or 0)
        out.append(item)
    return out
