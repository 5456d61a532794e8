"""The interleaved commit-path comparison's arithmetic: per-round ratios, their medians and
spread, the quiet rule and the targets (bench/interleave.py)."""

from __future__ import annotations

from typing import Any

import pytest

from bench.interleave import (
    CpuTicks,
    MachineSample,
    goals,
    machine_during,
    other_cores,
    round_ratios,
    summarize,
    wait_quiet,
)


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


def sample(busy: int, steal: int, total: int, others: dict[int, float], at: float) -> MachineSample:
    return MachineSample(CpuTicks(busy, steal, total), others, at)


def test_other_cores_count_processes_alive_at_both_samples() -> None:
    before = sample(0, 0, 0, {10: 5.0, 11: 1.0, 12: 3.0}, at=100.0)
    # 2 s: pid 10 used 0.4 s, 11 nothing, 12 exited (not seen), 13 started (the bench's own
    # detached controllers are such processes)
    after = sample(0, 0, 0, {10: 5.4, 11: 1.0, 13: 9.0}, at=102.0)
    assert other_cores(before, after) == pytest.approx(0.2)
    assert other_cores(before, before) == 0.0


def test_quiet_needs_idle_others_before_and_during_and_no_steal() -> None:
    before = sample(0, 0, 0, {10: 0.0}, at=0.0)
    alone = sample(200, 0, 400, {10: 0.0, 20: 4.0}, at=2.0)
    calm = machine_during(before, alone, load_before=3.0, other_before=0.1)
    # a high load average left by the previous run's processes is recorded, not judged
    assert calm["quiet"] and calm["load_before"] == 3.0 and calm["other_cores"] == 0.0
    assert not machine_during(before, alone, 0.5, other_before=0.9)["quiet"]
    shared = sample(300, 0, 400, {10: 1.0}, at=2.0)  # 0.5 cores of another process during
    assert machine_during(before, shared, 0.5)["other_cores"] == 0.5
    assert not machine_during(before, shared, 0.5)["quiet"]
    stolen = machine_during(before, sample(200, 40, 400, {10: 0.0}, at=2.0), 0.5)
    assert stolen["steal_pct"] == 10.0 and not stolen["quiet"]


def fake_machine(busy_per_window: list[float]) -> tuple[Any, Any]:
    """A sampler whose successive windows show ``busy_per_window`` cores of another process."""
    state = {"cpu": 0.0, "at": 0.0, "i": 0.0}

    def read() -> MachineSample:
        return sample(0, 0, 0, {7: state["cpu"]}, at=state["at"])

    def sleep(s: float) -> None:
        i = int(state["i"])
        state["cpu"] += busy_per_window[min(i, len(busy_per_window) - 1)] * s
        state["at"] += s
        state["i"] = i + 1

    return read, sleep


def test_wait_quiet_returns_at_the_first_quiet_window() -> None:
    sample, sleep = fake_machine([1.5, 0.9, 0.1, 2.0])
    assert wait_quiet(30.0, 0.3, 1.0, sample, sleep) == (0.1, 3.0)


def test_wait_quiet_gives_up_at_its_deadline_with_what_it_saw() -> None:
    sample, sleep = fake_machine([1.2])
    assert wait_quiet(5.0, 0.3, 1.0, sample, sleep) == (1.2, 5.0)
    sample, sleep = fake_machine([1.2])
    assert wait_quiet(0.0, 0.3, 1.0, sample, sleep) == (1.2, 1.0)  # 0: one window, no wait


def test_cpu_ticks_reads_this_machine() -> None:
    a = CpuTicks.read()
    assert a.total > 0 and 0 <= a.busy <= a.total and 0 <= a.steal <= a.total
