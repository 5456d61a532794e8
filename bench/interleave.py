"""The commit path of pykraft, etcd and bare PySyncObj measured in interleaved rounds.

A ratio between two systems measured minutes apart mostly measures the machine: etcd's own
32-in-flight figure moved between 2,700 and 4,300 ops/s from one run to the next here. So each
round runs every system once, one after another, the starting system rotating between rounds,
and every cross-system figure is a per-round ratio; the summary gives their median and spread.

Around each system's run the machine is sampled from /proc: the 1-minute load average when it
starts, the share of CPU time stolen by the hypervisor, and the cores used by processes that are
not the bench's own (those alive before and after, less this process and its children), in a
window before the run and during it. Before each run the bench waits (at most
``settle_s``) for a window in which other processes use at most ``QUIET_OTHER_CORES``: the
previous run's processes have exited by then, but the load average still counts them for a
minute or more, so it is recorded, not judged. A run is *quiet* when other processes used at
most ``QUIET_OTHER_CORES`` before and during it and steal was at most ``QUIET_STEAL_PCT``; a
round is quiet when all its runs were. The medians are also given over the quiet rounds alone.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psutil

from bench import controller_bench as cb
from bench.common import logger
from bench.peers import run_peer

log = logger("interleave")

SYSTEMS = ("etcd", "pykraft", "pysyncobj")
QUIET_STEAL_PCT = 2.0
QUIET_OTHER_CORES = 0.3  # CPU of processes other than the bench's own, in cores
SETTLE_WINDOW_S = 1.0  # the window other processes' CPU is measured over before a run
DEFAULT_SETTLE_S = 30.0  # the longest wait for a quiet window before a run

#: name -> (numerator system, mode, field, denominator system, mode, field): > 1 is pykraft ahead
#: for every ratio but ``seq_p50_vs_etcd`` (pykraft's p50 over etcd's: <= 1 is ahead)
RATIOS: dict[str, tuple[str, str, str, str, str, str]] = {
    "inflight_vs_etcd": ("pykraft", "inflight", "ops_s", "etcd", "inflight", "ops_s"),
    "seq_vs_etcd": ("pykraft", "seq", "ops_s", "etcd", "seq", "ops_s"),
    "seq_p50_vs_etcd": ("pykraft", "seq", "p50_ms", "etcd", "seq", "p50_ms"),
    "inflight_vs_pysyncobj": ("pykraft", "inflight", "ops_s", "pysyncobj", "inflight", "ops_s"),
    "seq_vs_pysyncobj": ("pykraft", "seq", "ops_s", "pysyncobj", "seq", "ops_s"),
}

#: the issue's goals on the medians of the per-round ratios: (ratio, "min"|"max", limit, text)
GOALS = (
    ("inflight_vs_etcd", "min", 1.5, "small commands, 32 in flight >= 1.5x etcd"),
    ("seq_p50_vs_etcd", "max", 1.0, "sequential commit p50 <= etcd's"),
    ("seq_vs_etcd", "min", 1.0, "sequential ops/s >= etcd's"),
    ("seq_vs_pysyncobj", "min", 0.7, "sequential ops/s >= 70% of bare PySyncObj"),
    ("inflight_vs_pysyncobj", "min", 0.7, "32 in flight >= 70% of bare PySyncObj"),
)


@dataclass(frozen=True)
class CpuTicks:
    """The machine's CPU time counters (/proc/stat's first line, in ticks)."""

    busy: int
    steal: int
    total: int

    @staticmethod
    def read() -> CpuTicks:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
        user, nice, system, idle, iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
        total = user + nice + system + idle + iowait + irq + softirq + steal
        return CpuTicks(user + nice + system + irq + softirq, steal, total)


def others_cpu() -> dict[int, float]:
    """CPU seconds so far of every process but this one and its descendants, by pid."""
    me = psutil.Process()
    mine = {me.pid} | {c.pid for c in me.children(recursive=True)}
    out: dict[int, float] = {}
    for proc in psutil.process_iter(["cpu_times"]):
        times = proc.info["cpu_times"]
        if proc.pid not in mine and times is not None:
            out[proc.pid] = times.user + times.system
    return out


@dataclass(frozen=True)
class MachineSample:
    """The machine's counters, the other processes' CPU seconds and the monotonic time, read
    together."""

    ticks: CpuTicks
    others: dict[int, float]
    at: float

    @staticmethod
    def read() -> MachineSample:
        return MachineSample(CpuTicks.read(), others_cpu(), time.monotonic())


def other_cores(before: MachineSample, after: MachineSample) -> float:
    """Cores used between two samples by the processes, not the bench's own, alive at both:
    the bench's detached controllers start after ``before`` and are gone by ``after``; another
    tenant's process that starts or ends in between is not seen."""
    wall = after.at - before.at
    if wall <= 0:
        return 0.0
    used = sum(
        max(0.0, after.others[pid] - cpu)
        for pid, cpu in before.others.items()
        if pid in after.others
    )
    return used / wall


def wait_quiet(
    max_wait_s: float,
    threshold: float = QUIET_OTHER_CORES,
    window_s: float = SETTLE_WINDOW_S,
    sample: Callable[[], MachineSample] = MachineSample.read,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[float, float]:
    """Wait until a ``window_s`` window in which other processes used at most ``threshold``
    cores, for at most ``max_wait_s`` (0: one window, no waiting). Returns the other cores of
    the last window and the seconds waited."""
    first = last = sample()
    while True:
        sleep(window_s)
        now = sample()
        seen = other_cores(last, now)
        if seen <= threshold or now.at - first.at >= max_wait_s:
            return round(seen, 2), round(now.at - first.at, 1)
        last = now


def machine_during(
    before: MachineSample, after: MachineSample, load_before: float, other_before: float = 0.0
) -> dict[str, Any]:
    """What the machine did between two samples: load average at the start, steal and busy
    shares of all CPU time, other processes' cores before (``other_before``) and during, and
    whether that counts as quiet."""
    total = max(after.ticks.total - before.ticks.total, 1)
    steal_pct = 100.0 * (after.ticks.steal - before.ticks.steal) / total
    during = other_cores(before, after)
    return {
        "load_before": round(load_before, 2),
        "steal_pct": round(steal_pct, 2),
        "busy_pct": round(100.0 * (after.ticks.busy - before.ticks.busy) / total, 1),
        "other_cores_before": round(other_before, 2),
        "other_cores": round(during, 2),
        "quiet": steal_pct <= QUIET_STEAL_PCT
        and other_before <= QUIET_OTHER_CORES
        and during <= QUIET_OTHER_CORES,
    }


def measured(
    system: str,
    run: Callable[[], tuple[list[dict[str, Any]], str | None]],
    settle_s: float = DEFAULT_SETTLE_S,
) -> dict[str, Any]:
    """One system's run with the machine sampled around it, after waiting (at most
    ``settle_s``) for other processes to go quiet."""
    other_before, waited = wait_quiet(settle_s)
    load = os.getloadavg()[0]
    before = MachineSample.read()
    rows, note = run()
    after = MachineSample.read()
    return {
        "system": system,
        "rows": rows,
        "note": note,
        "seconds": round(after.at - before.at, 1),
        "settled_s": waited,
        "machine": machine_during(before, after, load, other_before),
    }


def _value(runs: list[dict[str, Any]], system: str, mode: str, key: str) -> float | None:
    for run in runs:
        if run["system"] == system:
            for r in run["rows"]:
                if r.get("mode") == mode and isinstance(r.get(key), int | float) and r[key] > 0:
                    return float(r[key])
    return None


def round_ratios(runs: list[dict[str, Any]]) -> dict[str, float | None]:
    """Each named ratio of one round (None where a side was not measured)."""
    out: dict[str, float | None] = {}
    for name, (a, am, ak, b, bm, bk) in RATIOS.items():
        top, bottom = _value(runs, a, am, ak), _value(runs, b, bm, bk)
        out[name] = round(top / bottom, 3) if top is not None and bottom else None
    return out


def spread(values: list[float]) -> dict[str, Any]:
    """Median, min and max of per-round ratios (None when there are none)."""
    if not values:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {
        "median": round(statistics.median(values), 3),
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


def summarize(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Per ratio: the spread over every round and over the quiet rounds alone."""
    out = {}
    for name in RATIOS:
        every = [r["ratios"][name] for r in rounds if r["ratios"][name] is not None]
        quiet = [r["ratios"][name] for r in rounds if r["quiet"] and r["ratios"][name] is not None]
        out[name] = {"all": spread(every), "quiet": spread(quiet)}
    return out


def goals(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's commit-path targets, judged on the median over all rounds."""
    out = []
    for name, kind, limit, text in GOALS:
        s = summary[name]["all"]
        med = s["median"]
        met = None if med is None else (med >= limit if kind == "min" else med <= limit)
        out.append(
            {
                "target": f"{text} (median of {s['n']} interleaved rounds)",
                "value": med,
                "limit": limit,
                "ratio": med,
                "spread": [s["min"], s["max"]],
                "quiet_median": summary[name]["quiet"]["median"],
                "met": met,
            }
        )
    return out


def _pykraft(phase_s: float) -> tuple[list[dict[str, Any]], str | None]:
    return cb.run(phase_s, 32, 0, 0, phases=("small",)), None


def run(
    rounds: int = 3,
    phase_s: float = 5.0,
    peers_timeout_s: float = 150.0,
    systems: tuple[str, ...] = SYSTEMS,
    settle_s: float = DEFAULT_SETTLE_S,
) -> dict[str, Any]:
    """``rounds`` interleaved rounds of every system's seq + 32-in-flight commit path, each run
    after at most ``settle_s`` of waiting for a quiet machine."""
    runners: dict[str, Callable[[], tuple[list[dict[str, Any]], str | None]]] = {
        "pykraft": lambda: _pykraft(phase_s),
        "etcd": lambda: run_peer("etcd", peers_timeout_s + 150),
        "pysyncobj": lambda: run_peer("pysyncobj", peers_timeout_s),
    }
    done: list[dict[str, Any]] = []
    notes: set[str] = set()
    for k in range(rounds):
        order = systems[k % len(systems) :] + systems[: k % len(systems)]
        log(f"round {k + 1}/{rounds}: {', '.join(order)}")
        runs = [measured(s, runners[s], settle_s) for s in order]
        notes.update(r["note"] for r in runs if r["note"])
        quiet = all(r["machine"]["quiet"] for r in runs)
        ratios = round_ratios(runs)
        done.append(
            {"round": k + 1, "order": list(order), "runs": runs, "quiet": quiet, "ratios": ratios}
        )
        log(f"round {k + 1}: {ratios} (quiet: {quiet})")
    summary = summarize(done)
    return {"rounds": done, "summary": summary, "targets": goals(summary), "notes": sorted(notes)}


def table(doc: dict[str, Any]) -> str:
    """Markdown: each round's figures and machine, then the ratios' medians and spreads."""
    lines = [
        "| round | system | seq ops/s | seq p50 ms | 32 in flight ops/s | load before | steal % "
        "| other cores before / during | quiet |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for rd in doc["rounds"]:
        for run in rd["runs"]:
            s, m = run["system"], run["machine"]
            lines.append(
                f"| {rd['round']} | {s} | {_value([run], s, 'seq', 'ops_s')} "
                f"| {_value([run], s, 'seq', 'p50_ms')} | {_value([run], s, 'inflight', 'ops_s')} "
                f"| {m['load_before']} | {m['steal_pct']} "
                f"| {m.get('other_cores_before')} / {m.get('other_cores')} | {m['quiet']} |"
            )
    lines += ["", "| ratio | median (all) | min–max | rounds | median (quiet) | quiet rounds |"]
    lines += ["| --- | --- | --- | --- | --- | --- |"]
    for name, s in doc["summary"].items():
        a, q = s["all"], s["quiet"]
        lines.append(
            f"| {name} | {a['median']} | {a['min']}–{a['max']} | {a['n']} | {q['median']} "
            f"| {q['n']} |"
        )
    return "\n".join(lines)
