"""``kraft audit`` on logs from a real 3-controller / 3-broker cluster, with real Spark.

One cluster run (module fixture) produces the history: topic creates and a config change, a
controller failover (the killed controller restarts with small segments and frequent
snapshots, so its log has several segments and snapshots to compare), a broker kill (fence,
elections, ISR shrink), its restart, and a topic deletion. The clean log is audited through
the CLI's main; a tampered copy (edited record bytes, a removed batch, a forged re-chained
unclean election) through run_audit — both in this process on one shared SparkSession (the CLI
in a fresh process runs in `make demo`).
"""

from __future__ import annotations

import io
import json
import shutil
import time
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
from harness import LocalCluster, kraft, kraft_json, poll

pyspark = pytest.importorskip("pyspark")

from kraft.log.segment import encode_frame, iter_frames, list_segments
from kraft.log.snapshot import list_snapshots, read_snapshot_header
from kraft.records import (
    RECOVERY_UNCHANGED,
    Batch,
    PartitionChangeRecord,
    Provenance,
    batch_hash,
    decode_batch,
)
from tests.spark_fixture import module_spark

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]


def _now_ms() -> int:
    return int(time.time() * 1000)


def _describe(cluster: LocalCluster) -> dict:
    return {
        t["name"]: {p["partition"]: p for p in t["partitions"]}
        for t in kraft_json("topics", "describe", "--cluster", str(cluster.dir))["topics"]
    }


def _broker_state(cluster: LocalCluster, broker_id: int) -> str | None:
    desc = kraft_json("cluster", "describe", "--cluster", str(cluster.dir))
    return next((b["state"] for b in desc["brokers"] if b["broker_id"] == broker_id), None)


@pytest.fixture(scope="module")
def history(tmp_path_factory) -> dict:
    """Run the scenario; returns the copied log dir of the restarted controller and facts."""
    base = tmp_path_factory.mktemp("audit")
    cluster = LocalCluster(base / "cluster")
    facts: dict = {}
    c = ["--cluster", str(cluster.dir)]
    try:
        cluster.up(3, 3)
        kraft("topics", "create", "orders", "--partitions", "3", "--replication-factor", "3", *c)
        kraft("topics", "create", "scratch", "--partitions", "1", "--replication-factor", "2", *c)
        kraft("configs", "alter", "--topic", "orders", "--set", "retention.ms=60000", *c)
        kraft("configs", "alter", "--topic", "orders", "--set", "retention.ms=120000", *c)

        # controller failover; the old active controller comes back with small segments and
        # frequent snapshots
        old = cluster.active_controller()
        facts["failover_ms"] = _now_ms()
        cluster.kill(old)
        facts["new_controller"] = poll(
            lambda: (lid := cluster.active_controller()) != old and lid,
            60,
            0.3,
            "a new active controller",
        )
        props = Path(cluster.controller(old)["config"])
        props.write_text(
            props.read_text() + "metadata.log.segment.bytes=2048\n"
            "metadata.log.max.snapshot.interval.ms=500\n"
        )
        cluster.start(old)
        facts["audited_controller"] = old

        # broker kill: fence, elections, ISR shrink; then restart
        victim = _describe(cluster)["orders"][0]["leader"]
        facts["victim"] = victim
        facts["kill_ms"] = _now_ms()
        cluster.kill(victim)
        poll(lambda: _broker_state(cluster, victim) == "fenced", 60, 0.3, "victim fenced")
        moved = poll(
            lambda: (
                (p := _describe(cluster)["orders"][0])["leader"] not in (victim, -1)
                and victim not in p["isr"]
                and p
            ),
            30,
            0.3,
            "orders-0 has a new leader",
        )
        facts["new_leader"] = moved["leader"]
        facts["restart_ms"] = _now_ms()
        cluster.start(victim)
        poll(lambda: _broker_state(cluster, victim) == "unfenced", 60, 0.3, "victim unfenced")

        facts["delete_ms"] = _now_ms()
        kraft("topics", "delete", "scratch", *c)
        log_dir = cluster.log_dir(old)
        status = lambda: kraft_json("quorum", "status", *c)
        poll(
            lambda: len({v["applied_offset"] for v in status()["voters"]}) == 1,
            60,
            0.3,
            "every controller applied everything",
        )
        poll(
            lambda: len(list_snapshots(log_dir)) >= 1 and len(list_segments(log_dir)) >= 3,
            60,
            0.3,
            "snapshots and several segments on the restarted controller",
        )
        facts["end_ms"] = _now_ms()
    finally:
        cluster.down()
    copy = base / "log"
    shutil.copytree(cluster.log_dir(facts["audited_controller"]), copy)
    facts["log_dir"] = copy
    facts["base"] = base
    return facts


spark = module_spark("local[2]", "kraft-audit-cluster-test")


@pytest.fixture(scope="module")
def clean_audit(history, spark) -> dict:
    """``kraft audit`` on the clean log through the CLI's main (in this process, so it shares
    the SparkSession), with --state-at a snapshot's offset."""
    from tools.cli import main

    snap = read_snapshot_header(list_snapshots(history["log_dir"])[0])
    out = history["base"] / "out"
    stdout, stderr = io.StringIO(), io.StringIO()
    with redirect_stdout(stdout), redirect_stderr(stderr):
        code = main(
            [
                "audit",
                "--log-dir",
                str(history["log_dir"]),
                "--out",
                str(out),
                "--master",
                "local[2]",
                "--state-at",
                str(snap.end_offset - 1),
            ]
        )
    return {
        "code": code,
        "stdout": stdout.getvalue(),
        "stderr": stderr.getvalue(),
        "out": out,
        "snapshot": snap,
    }


def _table(spark, audit: dict, name: str):
    return spark.read.parquet(str(audit["out"] / "tables" / name))


def test_clean_log_passes_every_check(clean_audit, history):
    stdout, stderr = clean_audit["stdout"], clean_audit["stderr"]
    assert clean_audit["code"] == 0, stdout + stderr
    assert "Audit PASSED" in stdout and "[1/7]" in stdout and "[7/7] done" in stdout
    assert "WARN" not in stdout + stderr
    findings = json.loads((clean_audit["out"] / "findings.json").read_text())
    assert findings["status"] == "passed"
    assert all(r["passed"] for r in findings["rules"]), [
        r for r in findings["rules"] if not r["passed"]
    ]
    assert findings["first_offset"] == 0
    assert findings["snapshots"] and all(c["match"] for c in findings["snapshots"])
    page = (clean_audit["out"] / "report.html").read_text()
    assert "<svg" in page and "PASSED" in page and "http" not in page.split("</style>")[0]


def test_state_at_offset_equals_the_controllers_snapshot(clean_audit):
    snap = clean_audit["snapshot"]
    doc = json.loads((clean_audit["out"] / "state.json").read_text())
    assert doc["offset"] == snap.end_offset - 1
    assert doc["checksum"] == snap.image_checksum
    assert doc["snapshot"]["match"] is True


def test_tables_show_the_scenario(clean_audit, history, spark):
    from pyspark.sql import functions as F

    victim, window = history["victim"], (history["kill_ms"], history["end_ms"])
    brokers = _table(spark, clean_audit, "broker_history")
    fence = (
        brokers.filter((F.col("broker_id") == victim) & (F.col("event") == "fenced"))
        .orderBy("offset")
        .first()
    )
    assert fence is not None and fence["reason"] == "session-timeout"
    fence_ms = int(fence["ts"].timestamp() * 1000)
    assert window[0] < fence_ms < history["restart_ms"] + 1000
    back = (
        brokers.filter((F.col("broker_id") == victim) & (F.col("offset") > fence["offset"]))
        .orderBy("offset")
        .collect()
    )
    assert [r["event"] for r in back][:2] == ["registered", "unfenced"]
    assert back[0]["broker_epoch"] > fence["broker_epoch"]

    history_t = _table(spark, clean_audit, "partition_history")
    moved = (
        history_t.filter(
            (F.col("topic_name") == "orders")
            & (F.col("partition_id") == 0)
            & (F.col("prev_leader") == victim)
            & F.col("leader_changed")
        )
        .orderBy("offset")
        .first()
    )
    assert moved is not None and moved["election"] == "clean"
    assert moved["reason"] == "session-timeout" and victim not in moved["isr"]
    assert moved["leader_epoch"] == moved["prev_leader_epoch"] + 1

    ur = _table(spark, clean_audit, "replication_intervals")
    shrink = ur.filter(
        (F.col("topic_name") == "orders")
        & (F.col("partition_id") == 0)
        & (F.col("state") == "under-replicated")
    ).collect()
    assert any(
        window[0] < int(r["start_ts"].timestamp() * 1000) < history["end_ms"]
        and r["duration_s"] > 0
        for r in shrink
    )

    life = {
        (r["topic_name"], r["event"]): r
        for r in _table(spark, clean_audit, "topic_lifecycle").collect()
        if r["event"] != "config"
    }
    assert life[("orders", "created")]["partitions"] == 3
    assert history["delete_ms"] - 1000 < int(life[("scratch", "deleted")]["ts"].timestamp() * 1000)
    configs = (
        _table(spark, clean_audit, "topic_lifecycle").filter(F.col("event") == "config").collect()
    )
    assert ("60000", "120000") in {
        (r["old_value"], r["new_value"]) for r in configs if r["config_name"] == "retention.ms"
    }

    records = spark.read.format("kraft-metadata").load(str(history["log_dir"]))
    takeover = records.filter(
        (F.col("record_type") == "LeaderChangeRecord")
        & (F.col("controller_id") == history["new_controller"])
        & (F.col("timestamp_ms") > history["failover_ms"])
    ).collect()
    assert takeover and takeover[0]["reason"] == "controller-activated"
    # a schema picks columns (in its order, names as asked): the whole table's values
    picked = (
        spark.read.format("kraft-metadata")
        .option("snapshots", "include")
        .schema("leader INT, Offset BIGINT, isr ARRAY<INT>, principal STRING, record_json STRING")
        .load(str(history["log_dir"]))
    )
    assert picked.columns == ["leader", "Offset", "isr", "principal", "record_json"]
    whole = (
        spark.read.format("kraft-metadata")
        .option("snapshots", "include")
        .load(str(history["log_dir"]))
        .select("leader", F.col("offset").alias("Offset"), "isr", "principal", "record_json")
    )
    assert picked.count() == whole.count() > 0
    assert picked.exceptAll(whole).count() == 0 and whole.exceptAll(picked).count() == 0
    with pytest.raises(Exception, match="'offset' is BIGINT in the table, not INT"):
        spark.read.format("kraft-metadata").schema("offset INT").load(
            str(history["log_dir"])
        ).count()
    who = _table(spark, clean_audit, "who_changed_what")
    assert (
        who.filter((F.col("client_id") == "kraft-cli") & (F.col("api") == "DeleteTopics")).count()
        == 1
    )


def _frames(log_dir: Path) -> list[tuple[Path, int, int, bytes]]:
    out = []
    for path in list_segments(log_dir):
        for fr in iter_frames(path.read_bytes()):
            out.append((path, fr.position, fr.end, bytes(fr.payload)))
    return out


def _tamper(log_dir: Path) -> dict:
    """Edit one record's bytes, remove one batch, append a forged re-chained unclean election."""
    frames = _frames(log_dir)
    # 1. edit: a batch in the first segment whose provenance says "controller"
    path, pos, end, payload = next(f for f in frames[3:] if b"controller" in f[3])
    data = bytearray(path.read_bytes())
    i = pos + 8 + payload.index(b"controller")
    data[i : i + 10] = b"contrOller"
    path.write_bytes(bytes(data))
    edited = decode_batch(payload).base_offset
    # 2. remove: a batch in the middle of a later, sealed segment
    segs = list_segments(log_dir)
    later = [f for f in frames if f[0] == segs[-2]]
    path, pos, end, payload = later[len(later) // 2]
    removed = decode_batch(payload)
    data = path.read_bytes()
    path.write_bytes(data[:pos] + data[end:])
    # 3. forge: an unclean election appended after the last batch, correctly chained
    last_path, _, _, last_payload = _frames(log_dir)[-1]
    last = decode_batch(last_payload)
    topic_id = next(
        json.loads(r["record_json"])["topic_id"]
        for r in _rows_of(frames, "TopicRecord")
        if json.loads(r["record_json"])["name"] == "orders"
    )
    forged = Batch(
        last.next_offset,
        last.term,
        last.raft_index + 1,
        last.timestamp_ms + 1,
        Provenance("User:mallory", "evil", "forged-1", "AlterPartition", "isr-shrink"),
        batch_hash(last_payload),
        (
            PartitionChangeRecord(
                0, topic_id, (999,), 999, None, None, None, RECOVERY_UNCHANGED, "unclean"
            ),
        ),
    )
    with open(last_path, "ab") as f:
        f.write(encode_frame(forged.encode()))
    return {
        "edited": edited,
        "removed": removed.base_offset,
        "after_removed": removed.next_offset,
        "forged": forged.base_offset,
    }


def _rows_of(frames, record_type: str) -> list[dict]:
    from kraft.records import record_to_json

    rows = []
    for _, _, _, payload in frames:
        try:
            batch = decode_batch(payload)
        except Exception:
            continue
        for rec in batch.records:
            if record_type == rec.NAME:
                rows.append({"record_json": json.dumps(record_to_json(rec))})
    return rows


def test_tampering_is_caught_by_the_right_rules(history, spark, tmp_path):
    from tools.audit.run import AuditOptions, run_audit

    log = tmp_path / "log"
    shutil.copytree(history["log_dir"], log)
    t = _tamper(log)
    lines: list[str] = []
    result = run_audit(AuditOptions(log, tmp_path / "out"), spark=spark, progress=lines.append)
    assert result.exit_code == 1
    rules = {r["rule"]: r for r in result.findings["rules"]}

    def offsets(rule: str) -> set[int]:
        return {s["offset"] for s in rules[rule]["samples"] if s["severity"] == "error"}

    assert t["edited"] in offsets("crc-intact")
    assert t["removed"] in offsets("offsets-contiguous")
    # the chain across the gap is the gap's (one root cause), not a second finding
    (cause,) = [c for c in result.findings["root_causes"] if c["rule"] == "offsets-contiguous"]
    assert cause["offsets"][0] == t["removed"]
    assert t["forged"] in offsets("unclean-election")
    assert t["forged"] not in offsets("hash-chain") | offsets("crc-intact")
    assert t["forged"] in offsets("partition-topic-live") | offsets("leader-in-isr") | offsets(
        "isr-subset-replicas"
    ) | offsets("leader-eligible")
    assert any("Audit FAILED" in line for line in lines)
