"""A re-audit carries on from the previous run's output: after records are appended to the log
(the newest segment grows, new segments start), ``run_audit`` with the same ``--out`` derives
only the new rows and gives the same tables and findings as a whole-log audit into a fresh
directory; a log whose audited segment was edited is audited whole, and the edit is caught.

The log is written with the controller's own :class:`MetadataLog` (small segments): brokers
register, topics are created with ISR shrinks, expansions and leader changes; the appended part
fences a broker, takes partitions offline, elects unclean leaders (one asked for with
ElectLeaders, one not), re-registers a broker with a used epoch, deletes a topic, creates
another and changes configs — so open intervals close, tails move and findings appear.
"""

from __future__ import annotations

import io
import json
import random
import re
import shutil
import uuid
from contextlib import redirect_stdout
from pathlib import Path

import pytest

pyspark = pytest.importorskip("pyspark")

from bench.audit_bench import append_segment, generate
from kraft.log.metadata_log import MetadataLog
from kraft.log.segment import list_segments, scan_segment
from kraft.records import (
    LEADER_NONE,
    LEADER_UNCHANGED,
    RECOVERY_UNCHANGED,
    ZERO_HASH,
    Batch,
    BrokerRegistrationChangeRecord,
    ConfigRecord,
    PartitionChangeRecord,
    PartitionRecord,
    Provenance,
    RegisterBrokerRecord,
    RemoveTopicRecord,
    TopicRecord,
    batch_hash,
)
from tests.spark_fixture import module_spark
from tools.audit.run import TABLES, AuditOptions, run_audit

pytestmark = pytest.mark.timeout(1200)  # eight audits of small logs on real Spark

FEATURES = ({"name": "metadata.version", "min_version": 1, "max_version": 2},)
BROKERS = list(range(1, 7))


class _Log:
    """Appends chained batches to a metadata log directory (reopened each time)."""

    def __init__(self, directory: Path) -> None:
        self.dir, self.offset, self.prev, self.index, self.ts = (
            directory,
            0,
            ZERO_HASH,
            0,
            1_790_000_000_000,
        )
        self.rnd = random.Random(11)
        self.parts: dict[tuple[str, int], dict] = {}
        self.topics: dict[str, str] = {}

    def write(self, batches: list[tuple[Provenance, tuple]]) -> None:
        with MetadataLog.open(self.dir, segment_bytes=6000, fsync="never") as mlog:
            for prov, records in batches:
                self.index += 1
                self.ts += 50
                batch = Batch(
                    self.offset, 1 + self.index // 40, self.index, self.ts, prov, self.prev, records
                )
                encoded = batch.encode()
                mlog.append_encoded(encoded, batch)
                self.prev, self.offset = batch_hash(encoded), batch.next_offset

    def create(self, name: str, partitions: int) -> tuple[Provenance, tuple]:
        tid = str(uuid.UUID(int=self.rnd.getrandbits(128), version=4))
        self.topics[name] = tid
        recs: list = [TopicRecord(name, tid)]
        for p in range(partitions):
            reps = tuple(self.rnd.sample(BROKERS, 3))
            recs.append(PartitionRecord(p, tid, reps, reps, (), (), reps[0], 0, 0, 0))
            self.parts[(tid, p)] = {"reps": reps, "isr": list(reps), "leader": reps[0]}
        return Provenance("User:alice", "admin", "c", "CreateTopics", "user-request"), tuple(recs)

    def churn(self, n: int, live: list[int]) -> list[tuple[Provenance, tuple]]:
        """``n`` batches of ISR shrinks / expands and clean leader changes among ``live``."""
        out = []
        for _ in range(n):
            kind = self.rnd.choice(("isr-shrink", "isr-expand", "clean"))
            changes = []
            for key in self.rnd.sample(sorted(self.parts), 4):
                s = self.parts[key]
                if kind == "isr-shrink" and len(s["isr"]) > 1:
                    s["isr"].remove(self.rnd.choice([r for r in s["isr"] if r != s["leader"]]))
                    changes.append(
                        PartitionChangeRecord(
                            key[1],
                            key[0],
                            tuple(s["isr"]),
                            LEADER_UNCHANGED,
                            None,
                            None,
                            None,
                            RECOVERY_UNCHANGED,
                            None,
                        )
                    )
                elif kind == "isr-expand" and len(s["isr"]) < 3:
                    add = [r for r in s["reps"] if r not in s["isr"] and r in live]
                    if add:
                        s["isr"].append(add[0])
                        changes.append(
                            PartitionChangeRecord(
                                key[1],
                                key[0],
                                tuple(s["isr"]),
                                LEADER_UNCHANGED,
                                None,
                                None,
                                None,
                                RECOVERY_UNCHANGED,
                                None,
                            )
                        )
                elif kind == "clean":
                    others = [r for r in s["isr"] if r != s["leader"] and r in live]
                    if others:
                        s["leader"] = others[0]
                        changes.append(
                            PartitionChangeRecord(
                                key[1],
                                key[0],
                                None,
                                s["leader"],
                                None,
                                None,
                                None,
                                RECOVERY_UNCHANGED,
                                "clean",
                            )
                        )
            if changes:
                out.append(
                    (Provenance("controller", "", "r", "AlterPartition", kind), tuple(changes))
                )
        return out


def _ctl(api: str, reason: str) -> Provenance:
    return Provenance("controller", "", "r", api, reason)


def _first_part(log: _Log) -> list[tuple[Provenance, tuple]]:
    batches = []
    for b in BROKERS:
        batches.append(
            (
                Provenance(
                    "User:ANONYMOUS",
                    f"broker-{b}",
                    "r",
                    "BrokerRegistration",
                    "broker-registration",
                ),
                (
                    RegisterBrokerRecord(
                        b, str(uuid.UUID(int=b)), 100 + b, (), FEATURES, f"r{b % 3}", True, False
                    ),
                ),
            )
        )
        batches.append(
            (
                _ctl("UnfenceBroker", "broker-unfenced"),
                (BrokerRegistrationChangeRecord(b, 100 + b, -1, 0),),
            )
        )
    for t in range(5):
        batches.append(log.create(f"topic-{t}", 4))
    batches.append(
        (
            Provenance("User:bob", "ops", "c", "IncrementalAlterConfigs", "user-request"),
            (ConfigRecord(2, "topic-1", "retention.ms", "1000"),),
        )
    )
    return batches + log.churn(40, BROKERS)


def _second_part(log: _Log) -> list[tuple[Provenance, tuple]]:
    live = [b for b in BROKERS if b != 2]
    batches = log.churn(10, BROKERS)
    # broker 2 is fenced: its leaderships move, partitions it alone led go offline
    moves = []
    for (tid, p), s in sorted(log.parts.items()):
        if 2 in s["isr"]:
            s["isr"].remove(2)
            if s["leader"] == 2:
                s["leader"] = s["isr"][0] if s["isr"] else LEADER_NONE
                moves.append(
                    PartitionChangeRecord(
                        p,
                        tid,
                        tuple(s["isr"]),
                        s["leader"],
                        None,
                        None,
                        None,
                        RECOVERY_UNCHANGED,
                        "clean",
                    )
                )
            else:
                moves.append(
                    PartitionChangeRecord(
                        p,
                        tid,
                        tuple(s["isr"]),
                        LEADER_UNCHANGED,
                        None,
                        None,
                        None,
                        RECOVERY_UNCHANGED,
                        None,
                    )
                )
    batches.append(
        (
            _ctl("BrokerHeartbeat", "broker-fenced"),
            (BrokerRegistrationChangeRecord(2, 102, 1, 0), *moves),
        )
    )
    batches += log.churn(10, live)
    # two unclean elections: one asked for (a warning), one not (an error)
    (t1, p1), (t2, p2) = sorted(log.parts)[:2]
    for (tid, p), api in (((t1, p1), "ElectLeaders"), ((t2, p2), "AlterPartition")):
        s = log.parts[(tid, p)]
        s["leader"] = (
            next(r for r in s["reps"] if r not in s["isr"] and r in live)
            if any(r not in s["isr"] and r in live for r in s["reps"])
            else s["reps"][0]
        )
        s["isr"] = [s["leader"]]
        batches.append(
            (
                _ctl(api, "unclean"),
                (
                    PartitionChangeRecord(
                        p,
                        tid,
                        (s["leader"],),
                        s["leader"],
                        None,
                        None,
                        None,
                        RECOVERY_UNCHANGED,
                        "unclean",
                    ),
                ),
            )
        )
    # broker 5 re-registers with broker 4's epoch (broker-epoch-unique, a whole-log rule)
    batches.append(
        (
            Provenance(
                "User:ANONYMOUS", "broker-5", "r", "BrokerRegistration", "broker-registration"
            ),
            (
                RegisterBrokerRecord(
                    5, str(uuid.UUID(int=55)), 104, (), FEATURES, "r2", True, False
                ),
            ),
        )
    )
    gone = log.topics["topic-3"]
    batches.append(
        (
            Provenance("User:alice", "admin", "c", "DeleteTopics", "user-request"),
            (RemoveTopicRecord(gone),),
        )
    )
    for key in [k for k in log.parts if k[0] == gone]:
        del log.parts[key]
    batches.append(log.create("topic-new", 3))
    batches.append(
        (
            Provenance("User:bob", "ops", "c", "IncrementalAlterConfigs", "user-request"),
            (
                ConfigRecord(2, "topic-1", "retention.ms", "2000"),
                ConfigRecord(2, "topic-new", "cleanup.policy", "compact"),
            ),
        )
    )
    return batches + log.churn(15, live)


spark = module_spark("local[2]", "kraft-audit-incremental-test")


def _audit(spark, log_dir: Path, out: Path) -> tuple[object, str]:
    text = io.StringIO()
    with redirect_stdout(text):
        result = run_audit(AuditOptions(log_dir, out, master=None), spark=spark)
    return result, text.getvalue()


def _rows(spark, out: Path, name: str) -> list[tuple]:
    df = spark.read.parquet(str(out / "tables" / name))
    return sorted(tuple(map(repr, r)) for r in df.select(*sorted(df.columns)).collect())


def _same_as_whole(spark, out: Path, whole: Path) -> dict:
    """Assert a re-audit's tables and findings equal a whole-log audit's; its findings."""
    for name in (*TABLES, "findings"):
        assert _rows(spark, out, name) == _rows(spark, whole, name), name
    got = json.loads((out / "findings.json").read_text())
    want = json.loads((whole / "findings.json").read_text())
    # a re-audit into the same output checks the head it verified last time (the witness);
    # a whole-log audit into a fresh directory has none: that is the one expected difference
    assert got.pop("previous_head") is not None and want.pop("previous_head") is None
    for doc in (got, want):
        doc.pop("tables"), doc.pop("report")
    assert got == want
    assert _page(out) == _page(whole)
    return got


def _page(out: Path) -> str:
    """The report without what differs between runs: when, how long, where."""
    page = (out / "report.html").read_text().replace(str(out), "OUT")
    page = re.sub(r"<td>generated</td><td>[^<]*", "", page)
    return re.sub(r"<td>audit took</td><td>[^<]*", "", page)


def test_reaudit_equals_a_whole_log_audit(spark, tmp_path):
    log = _Log(tmp_path / "log")
    log.write(_first_part(log))
    first_segments = list_segments(log.dir)
    out = tmp_path / "out"
    first, text = _audit(spark, log.dir, out)
    assert first.exit_code == 0, text
    assert "whole log audited" in text

    log.write(_second_part(log))
    assert list_segments(log.dir)[: len(first_segments)] == first_segments
    assert len(list_segments(log.dir)) > len(first_segments)
    again, text = _audit(spark, log.dir, out)
    assert "re-audit:" in text, text
    whole, whole_text = _audit(spark, log.dir, tmp_path / "whole")
    assert "whole log audited" in whole_text

    got = _same_as_whole(spark, out, tmp_path / "whole")
    rules = {r["rule"]: r for r in got["rules"]}
    assert rules["unclean-election"]["errors"] == 1 and rules["unclean-election"]["warnings"] == 1
    assert rules["broker-epoch-unique"]["errors"] >= 2
    assert again.exit_code == whole.exit_code == 1
    intervals = spark.read.parquet(str(out / "tables" / "replication_intervals"))
    assert intervals.filter("state = 'offline'").count() >= 1

    # nothing new: the third run carries on with no new records and changes nothing
    third, text = _audit(spark, log.dir, out)
    assert "re-audit: 0 new records" in text, text
    for name in (*TABLES, "findings"):
        assert _rows(spark, out, name) == _rows(spark, tmp_path / "whole", name), name


def test_an_edited_audited_segment_forces_a_whole_audit(spark, tmp_path):
    log = _Log(tmp_path / "log")
    log.write(_first_part(log))
    out = tmp_path / "out"
    first, text = _audit(spark, log.dir, out)
    assert first.exit_code == 0, text
    log.write(log.churn(5, BROKERS))
    victim = list_segments(log.dir)[1]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF  # flip a byte inside a record
    victim.write_bytes(bytes(data))

    again, text = _audit(spark, log.dir, out)
    assert "whole log audited (a segment audited before changed)" in text, text
    assert again.exit_code == 1
    rules = {r["rule"]: r for r in again.findings["rules"]}
    assert not rules["crc-intact"]["passed"] or not rules["frames-decodable"]["passed"], rules
    assert not (out / "carry" / "state.json").exists()  # damaged: the next run is whole again
    shutil.rmtree(out)


def test_reaudit_of_the_bench_logs_appended_segment(spark, tmp_path):
    """The audit bench's appended segment continues its generated log with the generator's mix
    (ISR and clean leader changes, configs, new and deleted topics, brokers
    fenced, re-registered with a new epoch and unfenced): the log stays clean, and the re-audit
    of it equals a whole-log audit."""
    log_dir, out = tmp_path / "log", tmp_path / "out"
    generate(log_dir, 25_000)
    first, text = _audit(spark, log_dir, out)
    assert first.exit_code == 0, text
    sizes = [p.stat().st_size for p in list_segments(log_dir)]
    added = append_segment(log_dir)
    new = list_segments(log_dir)[-1]
    assert new.stat().st_size >= max(sizes) and len(list_segments(log_dir)) == len(sizes) + 1
    kinds: dict[str, int] = {}
    for entry in scan_segment(new):
        for record in entry.batch.records:
            kinds[type(record).__name__] = kinds.get(type(record).__name__, 0) + 1
    assert sum(kinds.values()) == added
    assert {
        "PartitionChangeRecord",
        "PartitionRecord",
        "TopicRecord",
        "RemoveTopicRecord",
        "ConfigRecord",
        "RegisterBrokerRecord",
        "BrokerRegistrationChangeRecord",
    } <= set(kinds), kinds

    again, text = _audit(spark, log_dir, out)
    assert f"re-audit: {added:,} new records" in text, text
    whole, whole_text = _audit(spark, log_dir, tmp_path / "whole")
    assert again.exit_code == whole.exit_code == 0, (text, whole_text)
    got = _same_as_whole(spark, out, tmp_path / "whole")
    assert got["records"] == first.findings["records"] + added
    history = spark.read.parquet(str(out / "tables" / "broker_history"))
    assert history.filter("event = 'fenced'").count() >= 1


def test_a_from_run_keeps_the_rows_from_its_offset_and_reports_them(spark, tmp_path):
    """``--from``: the tables hold the rows from that offset on and the report's charts are
    made from them (its volume and partition counts are derived for the run, not carried)."""
    log = _Log(tmp_path / "log")
    log.write(_first_part(log))
    log.write(_second_part(log))
    lo = log.offset // 2
    out = tmp_path / "out"
    text = io.StringIO()
    with redirect_stdout(text):
        result = run_audit(AuditOptions(log.dir, out, master=None, from_offset=lo), spark=spark)
    assert "whole log audited (--from/--to given)" in text.getvalue()
    history = spark.read.parquet(str(out / "tables" / "partition_history"))
    assert history.count() and history.filter(history["offset"] < lo).count() == 0
    page = result.report.read_text()
    assert "<svg" in page and "Leadership timeline" in page
    assert not (out / "work").exists() and not (out / "carry" / "state.json").exists()
