"""Rendering of tables, key/value blocks, JSON and errors for the kraft CLI."""

from __future__ import annotations

import io
import json

import pytest

from kraft.errors import ErrorCode
from tools import output


def test_cell_formats_values() -> None:
    assert output.cell(None) == "-"
    assert output.cell(True) == "yes" and output.cell(False) == "no"
    assert output.cell([1, 2, 3]) == "1,2,3"
    assert output.cell([]) == "-"
    assert output.cell({"a": "1", "b": None}) == "a=1,b=-"
    assert output.cell(b"\x01\xff") == "01ff"
    assert output.cell(7) == "7"


def test_table_aligns_columns_and_right_aligns_numbers() -> None:
    text = output.render_table(
        ("NAME", "PARTITIONS", "REPLICAS"), [("orders", 12, [1, 2]), ("a", 3, [3])]
    )
    lines = text.splitlines()
    assert lines == [
        "NAME    PARTITIONS  REPLICAS",
        "orders          12  1,2",
        "a                3  3",
    ]


def test_table_numeric_column_with_missing_values_stays_numeric() -> None:
    text = output.render_table(("ID", "LAG"), [(1, None), (2, 15)])
    assert text.splitlines() == ["ID  LAG", " 1    -", " 2   15"]


def test_table_mixed_column_is_left_aligned_and_has_no_trailing_spaces() -> None:
    text = output.render_table(("LEADER", "X"), [("none", None), (10, None)])
    assert text.splitlines() == ["LEADER  X", "none    -", "10      -"]
    assert all(line == line.rstrip() for line in text.splitlines())


def test_table_with_no_rows_is_the_header() -> None:
    assert output.render_table(("A", "B"), []) == "A  B"


def test_table_indent() -> None:
    assert output.render_table(("A",), [(1,)], indent="  ").splitlines() == ["  A", "  1"]


def test_table_rejects_ragged_rows() -> None:
    with pytest.raises(ValueError):
        output.render_table(("A", "B"), [(1,)])


def test_render_kv_aligns_values() -> None:
    text = output.render_kv([("Leader", 1), ("High watermark", 42), ("Lag", None)])
    assert text.splitlines() == ["Leader:         1", "High watermark: 42", "Lag:            -"]
    assert output.render_kv([]) == ""


def test_to_json_handles_bytes_int_keys_and_tuples() -> None:
    doc = json.loads(output.to_json({"data": b"\x00\x10", 1: (2, 3), "s": {3, 1}}))
    assert doc == {"data": "0010", "1": [2, 3], "s": [1, 3]}


def test_to_json_refuses_unknown_objects() -> None:
    with pytest.raises(TypeError):
        output.to_json({"x": object()})


def test_error_line_and_object() -> None:
    assert (
        output.error_line(ErrorCode.TOPIC_ALREADY_EXISTS, "topic 'a' exists")
        == "Error: TOPIC_ALREADY_EXISTS: topic 'a' exists"
    )
    assert output.error_line(41, "") == "Error: NOT_CONTROLLER"
    assert output.error_line(9999, "odd") == "Error: UNKNOWN(9999): odd"
    assert output.error_object(ErrorCode.INVALID_CONFIG, "bad") == {
        "error": "INVALID_CONFIG",
        "error_code": 40,
        "message": "bad",
    }


def test_report_error_json_goes_to_stdout_and_line_to_stderr() -> None:
    out, err = io.StringIO(), io.StringIO()
    output.report_error(ErrorCode.REQUEST_TIMED_OUT, "slow", True, out, err)
    assert json.loads(out.getvalue()) == {
        "error": "REQUEST_TIMED_OUT",
        "error_code": 7,
        "message": "slow",
    }
    assert err.getvalue() == "Error: REQUEST_TIMED_OUT: slow\n"
    out, err = io.StringIO(), io.StringIO()
    output.report_error(ErrorCode.REQUEST_TIMED_OUT, "slow", False, out, err)
    assert out.getvalue() == ""


def test_annotate_errors_adds_names_without_touching_input() -> None:
    items = [{"name": "a", "error_code": 0}, {"name": "b", "error_code": 36}, {"name": "c"}]
    annotated = output.annotate_errors(items)
    assert [i.get("error") for i in annotated] == ["NONE", "TOPIC_ALREADY_EXISTS", None]
    assert "error" not in items[1]
