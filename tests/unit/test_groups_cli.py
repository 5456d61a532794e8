"""``kraft groups`` argument handling and the payload parsing behind ``describe``."""

from __future__ import annotations

import struct

import pytest

from tools.cli import main
from tools.commands.common import UsageError
from tools.commands.groups import parse_datetime_ms, render_describe
from tools.group_admin import parse_assignment


def assignment(topics: dict[str, list[int]]) -> bytes:
    """A ConsumerProtocolAssignment v0 as clients encode it."""
    out = struct.pack(">hi", 0, len(topics))
    for name, parts in topics.items():
        out += struct.pack(">h", len(name)) + name.encode()
        out += struct.pack(f">i{len(parts)}i", len(parts), *parts)
    return out + struct.pack(">i", -1)  # null user data


def test_parse_assignment():
    assert parse_assignment(assignment({"orders": [0, 3], "pay": []})) == {
        "orders": [0, 3],
        "pay": [],
    }
    assert parse_assignment(b"") == {} and parse_assignment(b"\x00\x00\x00\x00\x00\x05") == {}


def test_parse_datetime_ms():
    assert parse_datetime_ms("1700000000000") == 1_700_000_000_000
    assert parse_datetime_ms("2023-11-14T22:13:20") == 1_700_000_000_000  # naive = UTC
    assert parse_datetime_ms("2023-11-14T23:13:20+01:00") == 1_700_000_000_000
    with pytest.raises(UsageError):
        parse_datetime_ms("yesterday")


def test_usage_errors_exit_2(capsys):
    assert main(["groups", "reset-offsets", "g", "--topic", "t"]) == 2  # no --to-...
    assert (
        main(["groups", "reset-offsets", "g", "--topic", "t", "--to-earliest", "--to-latest"]) == 2
    )
    assert main(["groups", "describe"]) == 2
    assert main(["groups", "list", "--bootstrap-server", "nohost"]) == 2
    assert "HOST:PORT" in capsys.readouterr().err


def test_render_describe_names_a_consumer_protocol_group():
    d = {
        "group": "g",
        "state": "Reconciling",
        "assignor": "uniform",
        "type": "consumer",
        "group_epoch": 4,
        "assignment_epoch": 4,
        "members": [{"member_id": "m"}],
        "partitions": [],
    }
    assert render_describe(d) == (
        "Group g: Reconciling, 1 member(s), assignor uniform "
        "(consumer protocol, group epoch 4, assignment epoch 4)"
    )
    classic = dict(d, type="classic", assignor="range")
    assert render_describe(classic) == "Group g: Reconciling, 1 member(s), assignor range"
