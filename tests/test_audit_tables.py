"""The partition history's window formulation against a sequential replay of the same rules.

``tables.partition_history`` computes running values with two window passes; here random
per-partition record sequences (re-created partitions, unchanged leaders, missing ISR or
replicas, changes before any PartitionRecord) are replayed one record at a time in plain Python
and every output column that the windows derive must match, row for row.
"""
from __future__ import annotations

import random
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from tests.spark_fixture import module_spark  # noqa: E402

from kraft.records import LEADER_NONE, LEADER_UNCHANGED  # noqa: E402
from tools.audit import tables  # noqa: E402

DDL = ("offset BIGINT, timestamp_ms BIGINT, source_kind STRING, topic_id STRING, "
       "topic_name STRING, partition_id INT, record_type STRING, replicas ARRAY<INT>, "
       "isr ARRAY<INT>, leader INT, leader_epoch INT, partition_epoch INT, election STRING, "
       "principal STRING, client_id STRING, api STRING, reason STRING, "
       "batch_base_offset BIGINT, index_in_batch INT")
DERIVED = ("change", "prev_leader", "leader", "prev_isr", "isr", "replicas", "leader_epoch",
           "partition_epoch", "prev_leader_epoch", "prev_partition_epoch", "leader_changed",
           "state")


spark = module_spark("local[1]", "kraft-audit-tables-test")


def _random_log(rnd: random.Random, n: int) -> list[dict]:
    """Partition records over a few partitions of two topics, in log order."""
    rows, offset = [], 0
    keys = [(t, p) for t in ("t-a", "t-b") for p in range(3)]
    for _ in range(n):
        tid, pid = rnd.choice(keys)
        reps = rnd.sample(range(1, 6), rnd.randint(1, 3))
        row = {"offset": offset, "timestamp_ms": 1000 + offset, "source_kind": "log",
               "topic_id": tid, "topic_name": None, "partition_id": pid,
               "principal": "p", "client_id": "c", "api": "a", "reason": "r",
               "batch_base_offset": offset, "index_in_batch": 0, "election": None}
        if rnd.random() < 0.12:  # (re-)created
            row.update(record_type="PartitionRecord", replicas=reps,
                       isr=reps[:rnd.randint(1, len(reps))], leader=reps[0],
                       leader_epoch=rnd.randint(0, 9), partition_epoch=rnd.randint(0, 9))
        else:
            leader = rnd.choice([LEADER_UNCHANGED, LEADER_UNCHANGED, LEADER_NONE, *reps])
            row.update(record_type="PartitionChangeRecord",
                       replicas=reps if rnd.random() < 0.2 else None,
                       isr=reps[:rnd.randint(1, len(reps))] if rnd.random() < 0.6 else None,
                       leader=leader, leader_epoch=None, partition_epoch=None,
                       election=rnd.choice([None, "clean", "unclean"]))
        rows.append(row)
        offset += 1
    return rows


def _replay(rows: list[dict]) -> dict[int, dict]:
    """The history rules applied one record at a time (``PartitionRegistration.merge``)."""
    out: dict[int, dict] = {}
    state: dict[tuple, dict] = {}
    for r in rows:
        key = (r["topic_id"], r["partition_id"])
        s = state.setdefault(key, {"leader": None, "isr": None, "replicas": None,
                                   "le": None, "pe": None})
        prev = dict(s)
        new = r["record_type"] == "PartitionRecord"
        named = r["leader"] if new or r["leader"] != LEADER_UNCHANGED else None
        if new:
            s["le"], s["pe"] = r["leader_epoch"], r["partition_epoch"]
        else:
            if s["pe"] is not None:
                s["pe"] += 1
            if s["le"] is not None and r["leader"] != LEADER_UNCHANGED:
                s["le"] += 1
        for col, value in (("leader", named), ("isr", r["isr"]), ("replicas", r["replicas"])):
            if value is not None:
                s[col] = value
        leader_changed = not new and named is not None and (prev["leader"] is None
                                                            or named != prev["leader"])
        isr_changed = not new and r["isr"] is not None and (prev["isr"] is None
                                                            or r["isr"] != prev["isr"])
        reps_changed = not new and r["replicas"] is not None and (
            prev["replicas"] is None or r["replicas"] != prev["replicas"])
        change = ",".join(w for w, on in (("created", new), ("leader", leader_changed),
                                          ("isr", isr_changed), ("replicas", reps_changed)) if on)
        if s["leader"] == LEADER_NONE:
            st = "offline"
        elif s["isr"] is not None and s["replicas"] is not None and len(s["isr"]) < len(s["replicas"]):
            st = "under-replicated"
        else:
            st = "online"
        out[r["offset"]] = {
            "change": change, "prev_leader": prev["leader"], "leader": s["leader"],
            "prev_isr": prev["isr"], "isr": s["isr"], "replicas": s["replicas"],
            "leader_epoch": s["le"], "partition_epoch": s["pe"],
            "prev_leader_epoch": prev["le"], "prev_partition_epoch": prev["pe"],
            "leader_changed": leader_changed, "state": st}
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_partition_history_matches_a_sequential_replay(spark, seed):
    rows = _random_log(random.Random(seed), 400)
    records = tables.prepare(spark.createDataFrame(rows, DDL))
    topics_df = tables.topics(records)
    got = {r["offset"]: r.asDict() for r in tables.partition_history(records, topics_df).collect()}
    want = _replay(rows)
    assert set(got) == set(want)
    for offset, expected in want.items():
        actual = {k: (list(got[offset][k]) if isinstance(got[offset][k], list) else got[offset][k])
                  for k in DERIVED}
        assert actual == expected, f"offset {offset}"
