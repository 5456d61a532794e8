"""The partition history's window formulation against a sequential replay of the same rules.

``tables.partition_history`` computes running values with two window passes; here random
per-partition record sequences (re-created partitions, unchanged leaders, missing ISR or
replicas, changes before any PartitionRecord) are replayed one record at a time in plain Python
and every output column that the windows derive must match, row for row.
"""

from __future__ import annotations

import random

import pytest

pytest.importorskip("pyspark")

from kraft.records import LEADER_NONE, LEADER_UNCHANGED
from tests.spark_fixture import module_spark
from tools.audit import tables

DDL = (
    "offset BIGINT, timestamp_ms BIGINT, source_kind STRING, topic_id STRING, "
    "topic_name STRING, partition_id INT, record_type STRING, replicas ARRAY<INT>, "
    "isr ARRAY<INT>, leader INT, leader_epoch INT, partition_epoch INT, election STRING, "
    "principal STRING, client_id STRING, api STRING, reason STRING, "
    "batch_base_offset BIGINT, index_in_batch INT"
)
DERIVED = (
    "change",
    "prev_leader",
    "leader",
    "prev_isr",
    "isr",
    "replicas",
    "leader_epoch",
    "partition_epoch",
    "prev_leader_epoch",
    "prev_partition_epoch",
    "leader_changed",
    "state",
    "prev_state",
)


spark = module_spark("local[1]", "kraft-audit-tables-test")


def _random_log(rnd: random.Random, n: int) -> list[dict]:
    """Partition records over a few partitions of two topics, in log order."""
    rows, offset = [], 0
    keys = [(t, p) for t in ("t-a", "t-b") for p in range(3)]
    for _ in range(n):
        tid, pid = rnd.choice(keys)
        reps = rnd.sample(range(1, 6), rnd.randint(1, 3))
        row = {
            "offset": offset,
            "timestamp_ms": 1000 + offset,
            "source_kind": "log",
            "topic_id": tid,
            "topic_name": None,
            "partition_id": pid,
            "principal": "p",
            "client_id": "c",
            "api": "a",
            "reason": "r",
            "batch_base_offset": offset,
            "index_in_batch": 0,
            "election": None,
        }
        if rnd.random() < 0.12:  # (re-)created
            row.update(
                record_type="PartitionRecord",
                replicas=reps,
                isr=reps[: rnd.randint(1, len(reps))],
                leader=reps[0],
                leader_epoch=rnd.randint(0, 9),
                partition_epoch=rnd.randint(0, 9),
            )
        else:
            leader = rnd.choice([LEADER_UNCHANGED, LEADER_UNCHANGED, LEADER_NONE, *reps])
            row.update(
                record_type="PartitionChangeRecord",
                replicas=reps if rnd.random() < 0.2 else None,
                isr=reps[: rnd.randint(1, len(reps))] if rnd.random() < 0.6 else None,
                leader=leader,
                leader_epoch=None,
                partition_epoch=None,
                election=rnd.choice([None, "clean", "unclean"]),
            )
        rows.append(row)
        offset += 1
    return rows


def _replay(rows: list[dict]) -> dict[int, dict]:
    """The history rules applied one record at a time (``PartitionRegistration.merge``)."""
    out: dict[int, dict] = {}
    state: dict[tuple, dict] = {}
    states: dict[tuple, str] = {}  # each partition's state after its latest row
    for r in rows:
        key = (r["topic_id"], r["partition_id"])
        s = state.setdefault(
            key, {"leader": None, "isr": None, "replicas": None, "le": None, "pe": None}
        )
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
        leader_changed = (
            not new and named is not None and (prev["leader"] is None or named != prev["leader"])
        )
        isr_changed = (
            not new and r["isr"] is not None and (prev["isr"] is None or r["isr"] != prev["isr"])
        )
        reps_changed = (
            not new
            and r["replicas"] is not None
            and (prev["replicas"] is None or r["replicas"] != prev["replicas"])
        )
        change = ",".join(
            w
            for w, on in (
                ("created", new),
                ("leader", leader_changed),
                ("isr", isr_changed),
                ("replicas", reps_changed),
            )
            if on
        )
        if s["leader"] == LEADER_NONE:
            st = "offline"
        elif (
            s["isr"] is not None
            and s["replicas"] is not None
            and len(s["isr"]) < len(s["replicas"])
        ):
            st = "under-replicated"
        else:
            st = "online"
        out[r["offset"]] = {
            "change": change,
            "prev_leader": prev["leader"],
            "leader": s["leader"],
            "prev_isr": prev["isr"],
            "isr": s["isr"],
            "replicas": s["replicas"],
            "leader_epoch": s["le"],
            "partition_epoch": s["pe"],
            "prev_leader_epoch": prev["le"],
            "prev_partition_epoch": prev["pe"],
            "leader_changed": leader_changed,
            "state": st,
            "prev_state": states.get(key),
        }
        states[key] = st
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
        actual = {
            k: (list(got[offset][k]) if isinstance(got[offset][k], list) else got[offset][k])
            for k in DERIVED
        }
        assert actual == expected, f"offset {offset}"


SEED_DDL = (
    "offset BIGINT, topic_id STRING, partition_id INT, leader INT, isr ARRAY<INT>, "
    "replicas ARRAY<INT>, leader_epoch BIGINT, partition_epoch BIGINT, state STRING, "
    "change STRING, leader_changed BOOLEAN"
)


def _seed_rows(rnd: random.Random, n: int) -> list[dict]:
    """History rows (the columns the seeds read) over a few partitions, offsets shuffled;
    some rows appear twice (a duplicated batch), each partition's last among them."""
    rows = []
    for offset in rnd.sample(range(10 * n), n):
        reps = rnd.sample(range(1, 6), 3)
        change = rnd.choice(["created", "leader", "isr", "leader,isr", "replicas"])
        rows.append(
            {
                "offset": offset,
                "topic_id": rnd.choice(["t-a", "t-b"]),
                "partition_id": rnd.randint(0, 2),
                "leader": reps[0],
                "isr": reps[:2],
                "replicas": reps,
                "leader_epoch": rnd.randint(0, 99),
                "partition_epoch": rnd.randint(0, 99),
                "state": rnd.choice(["online", "offline", "under-replicated"]),
                "change": change,
                "leader_changed": "leader" in change,
            }
        )
    last = {}
    for r in rows:
        key = (r["topic_id"], r["partition_id"])
        if key not in last or r["offset"] > last[key]["offset"]:
            last[key] = r
    return rows + [dict(r) for r in rnd.sample(rows, n // 10)] + [dict(r) for r in last.values()]


def _expected_seeds(rows: list[dict], prior: list[dict]) -> dict[tuple, dict]:
    out: dict[tuple, dict] = {}
    for r in rows:
        key = (r["topic_id"], r["partition_id"])
        created = r["change"] == "created"
        ev = (int(r["leader_changed"] or created), int("isr" in r["change"] or created))
        cur = out.get(key)
        last = r if cur is None or r["offset"] > cur["offset"] else cur
        counts = ev if cur is None else (cur["leader_events"] + ev[0], cur["isr_events"] + ev[1])
        out[key] = {
            **{k: last[k] for k in ("offset", *tables.SEED_COLUMNS, "state")},
            "leader_events": counts[0],
            "isr_events": counts[1],
        }
    for p in prior:
        key = (p["topic_id"], p["partition_id"])
        if key not in out:
            out[key] = dict(p)
        else:
            out[key]["leader_events"] += p["leader_events"]
            out[key]["isr_events"] += p["isr_events"]
    return out


@pytest.mark.parametrize("seed", [1, 2])
def test_partition_seeds_are_each_partitions_last_row_and_event_counts(spark, seed):
    rnd = random.Random(seed)
    rows = _seed_rows(rnd, 120)
    history = spark.createDataFrame(rows, SEED_DDL)
    # the prior seeds: older offsets (negative), one partition the history lacks
    prior = [
        {
            "offset": -5,
            "topic_id": "t-a",
            "partition_id": 0,
            "leader": 1,
            "isr": [1],
            "replicas": [1, 2],
            "leader_epoch": 3,
            "partition_epoch": 4,
            "state": "online",
            "leader_events": 7,
            "isr_events": 2,
        },
        {
            "offset": -9,
            "topic_id": "t-old",
            "partition_id": 5,
            "leader": -1,
            "isr": [],
            "replicas": [3],
            "leader_epoch": 1,
            "partition_epoch": 1,
            "state": "offline",
            "leader_events": 1,
            "isr_events": 4,
        },
    ]
    prior_df = (
        tables.partition_seeds(history)
        .limit(0)
        .unionByName(spark.createDataFrame(prior, tables.partition_seeds(history).schema))
    )
    for given, want in (
        (None, _expected_seeds(rows, [])),
        (prior_df, _expected_seeds(rows, prior)),
    ):
        got = tables.partition_seeds(history, given).collect()
        assert len(got) == len(want)
        for r in got:
            d = {k: (list(v) if isinstance(v, list) else v) for k, v in r.asDict().items()}
            assert d == want[(r["topic_id"], r["partition_id"])]
