"""bench.commit_breakdown's in-process parts measure real work: the state machine proposes and
a follower applies every batch, and each Raft frame written by pykraft's PySyncObj patches
reads back."""

from __future__ import annotations

from bench import commit_breakdown as cb


def test_parts_run_the_real_code(tmp_path) -> None:
    sm, raw = cb.state_machine_parts(tmp_path, 30)
    assert len(sm["propose"]) == 30 and len(sm["apply"]) >= 27
    assert raw and all(t > 0 for t in sm["propose"] + sm["apply"])
    frames = cb.raft_frames(raw, 10)
    assert set(frames) == {"append_out", "append_in", "ack_out", "ack_in"}
    assert all(len(v) == 10 for v in frames.values())
    assert len(cb.rpc_frames(10)) == 10


def test_table_lists_every_part_and_process() -> None:
    result = {
        "parts_us_p50": {"disk_sync": 150.0, "propose": 30.0},
        "whole": {
            "sequential_write_p50_us": 2000.0,
            "read_round_trip_p50_us": 200.0,
            "writes": 10,
            "cpu_us_per_write": {"leader": [1000.0, 200.0]},
        },
        "critical_path_us": [{"step": "propose", "us": 30.0}],
        "accounted_us": 30.0,
        "unaccounted_us": 1970.0,
    }
    text = cb.table(result)
    for needle in ("| disk_sync | 150.0 |", "| propose | 30.0 |", "| leader | 1000.0 | 200.0 |"):
        assert needle in text
