"""Port choice for local nodes: outside the kernel's ephemeral range, never handed out twice
while reserved, and bindable when handed out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tools import free_ports


def test_pool_is_below_the_ephemeral_range_else_above_else_none() -> None:
    assert free_ports.pool((32768, 60999)) == range(20000, 32768)
    assert free_ports.pool((1024, 50000)) == range(50001, 65536)
    assert free_ports.pool((1024, 65000)) is None


def test_ephemeral_range_reads_the_kernel_file_or_falls_back(tmp_path: Path) -> None:
    f = tmp_path / "range"
    f.write_text("40000\t50000\n")
    assert free_ports.ephemeral_range(f) == (40000, 50000)
    f.write_text("garbage")
    assert free_ports.ephemeral_range(f) == free_ports.DEFAULT_EPHEMERAL
    assert free_ports.ephemeral_range(tmp_path / "missing") == free_ports.DEFAULT_EPHEMERAL


@pytest.fixture
def reservations(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "ports.json"
    monkeypatch.setattr(free_ports, "reservations_file", lambda: path)
    return path


def test_ports_are_outside_the_ephemeral_range_and_distinct(reservations: Path) -> None:
    low, high = free_ports.ephemeral_range()
    ports = free_ports.pick_free_ports(12)
    assert len(set(ports)) == 12
    assert all(not low <= p <= high for p in ports)


def test_a_reserved_port_is_not_handed_out_again(reservations: Path) -> None:
    first = free_ports.pick_free_ports(20)
    second = free_ports.pick_free_ports(20)
    assert not set(first) & set(second)
    held = json.loads(reservations.read_text())
    assert set(first) | set(second) <= {int(p) for p in held}


def test_expired_and_unreadable_reservations_are_dropped(reservations: Path) -> None:
    reservations.write_text(json.dumps({"12345": 1.0}))  # expired in 1970
    free_ports.pick_free_ports(1)
    assert "12345" not in json.loads(reservations.read_text())
    reservations.write_text("not json")
    assert len(free_ports.pick_free_ports(3)) == 3
