"""The interleaved commit-path comparison's arithmetic: per-round ratios, their medians and
spread, the quiet rule and the targets (bench/interleave.py)."""

from __future__ import annotations

from typing import Any

from bench.interleave import CpuTicks, goals, machine_during, round_ratios, summarize


def run(system: str, seq: float, p50: float, inflight: float) -> dict[str, Any]:
    return {
        "system": system,
        "rows": [
            {"mode": "seq", "ops_s": seq, "p50_ms": p50},
            {"mode": "inflight", "ops_s": inflight, "p50_ms": 9.0},
        ],
        "note": None,
    }


def a_round(n: int, etcd_inflight: float, ours_inflight: float, quiet: bool) -> dict[str, Any]:
    runs = [
        run("etcd", 900, 1.0, etcd_inflight),
        run("pykraft", 700, 1.3, ours_inflight),
        run("pysyncobj", 1000, 0.9, 4000),
    ]
    return {"round": n, "runs": runs, "quiet": quiet, "ratios": round_ratios(runs)}


def test_round_ratios_are_pykraft_over_the_peer() -> None:
    r = a_round(1, 3000, 4500, True)["ratios"]
    assert r["inflight_vs_etcd"] == 1.5
    assert r["seq_vs_etcd"] == round(700 / 900, 3)
    assert r["seq_p50_vs_etcd"] == 1.3
    assert r["inflight_vs_pysyncobj"] == round(4500 / 4000, 3)


def test_a_missing_peer_gives_no_ratio_not_a_guess() -> None:
    runs = [run("pykraft", 700, 1.3, 4500), {"system": "etcd", "rows": [], "note": "timeout"}]
    r = round_ratios(runs)
    assert r["inflight_vs_etcd"] is None and r["seq_p50_vs_etcd"] is None


def test_medians_and_spread_over_all_and_quiet_rounds() -> None:
    rounds = [
        a_round(1, 3000, 3000, True),  # 1.0
        a_round(2, 2000, 4000, False),  # 2.0 (a loaded round)
        a_round(3, 3000, 4500, True),  # 1.5
    ]
    s = summarize(rounds)["inflight_vs_etcd"]
    assert s["all"] == {"median": 1.5, "min": 1.0, "max": 2.0, "n": 3}
    assert s["quiet"] == {"median": 1.25, "min": 1.0, "max": 1.5, "n": 2}


def test_goals_judge_the_median_in_the_right_direction() -> None:
    rounds = [a_round(i, 3000, 4800, True) for i in (1, 2, 3)]
    by_name = {g["target"].split(" (")[0]: g for g in goals(summarize(rounds))}
    assert by_name["small commands, 32 in flight >= 1.5x etcd"]["met"] is True
    assert by_name["sequential commit p50 <= etcd's"]["met"] is False  # 1.3 ms vs 1.0 ms
    assert by_name["sequential ops/s >= etcd's"]["met"] is False


def test_quiet_needs_a_low_load_and_no_steal() -> None:
    before = CpuTicks(busy=100, steal=0, total=1000)
    assert machine_during(before, CpuTicks(busy=200, steal=0, total=2000), 0.5)["quiet"]
    assert not machine_during(before, CpuTicks(busy=200, steal=0, total=2000), 3.0)["quiet"]
    stolen = machine_during(before, CpuTicks(busy=200, steal=100, total=2000), 0.5)
    assert stolen["steal_pct"] == 10.0 and not stolen["quiet"]


def test_cpu_ticks_reads_this_machine() -> None:
    a = CpuTicks.read()
    assert a.total > 0 and 0 <= a.busy <= a.total and 0 <= a.steal <= a.total
